"""benchmarks/RESULTS.md is written by the benchmarks: each run replaces its own section, nothing else."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.cli import main
from infercost_bench import results


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    """``main`` configures the root logger (as the command does); later tests get it back as it was."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def _run(key: str, output: str) -> results.Run:
    return results.Run(
        key=key,
        command=f"infercost bench {key}",
        started=dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC),
        seconds=12.0,
        machine="Linux x86_64, 2 CPUs",
        output=output,
    )


def test_a_run_replaces_its_own_section_and_keeps_the_others(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    results.write(path, _run("soak", "soak figures v1"))
    results.write(path, _run("detection", "detection figures v1"))
    results.write(path, _run("detection (quick)", "quick figures"))
    results.write(path, _run("detection", "detection figures v2"))
    text = path.read_text()
    assert "detection figures v2" in text
    assert "detection figures v1" not in text
    assert "quick figures" in text and "soak figures v1" in text
    assert text.count("<!-- BEGIN detection -->") == 1
    # sections in the fixed order: detection, its quick run, then soak
    assert text.index("## detection\n") < text.index("## detection (quick)") < text.index("## soak")
    assert text.startswith(results.HEADER)


def test_text_outside_the_markers_is_not_kept_but_every_section_is(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    results.write(path, _run("parse", "parse v1"))
    path.write_text(path.read_text() + "\nhand-written figure: 42\n")
    results.write(path, _run("bound", "bound v1"))
    text = path.read_text()
    assert "hand-written figure" not in text
    assert "parse v1" in text and "bound v1" in text


def test_section_keys_keep_quick_and_other_options_apart() -> None:
    assert results.section_key("detection", [], quick=False) == "detection"
    assert results.section_key("detection", [], quick=True) == "detection (quick)"
    assert results.section_key("detection", ["--seed", "91"], quick=False) == "detection --seed 91"


def test_printed_text_loses_colours_and_overwritten_progress() -> None:
    assert results.clean("\x1b[1mbold\x1b[0m\nstep 1\rstep 2\n\n") == "bold\nstep 2"


def test_the_cli_writes_what_the_benchmark_printed(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "bench" / "RESULTS.md"
    assert main(["bench", "bound", "--write-results", "--results", str(path), "--log-level", "error"]) == 0
    printed = capsys.readouterr().out
    text = path.read_text()
    table = printed.split("wrote section")[0].strip()
    assert table and results.clean(table) in text  # the section holds what the run printed
    assert "`infercost bench bound` · " in text
    assert "<!-- BEGIN bound -->" in text and "<!-- END bound -->" in text
    # a second run replaces the section instead of adding one
    assert main(["bench", "bound", "--write-results", "--results", str(path)]) == 0
    assert path.read_text().count("<!-- BEGIN bound -->") == 1


def test_without_the_flag_nothing_is_written(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    assert main(["bench", "bound", "--results", str(path)]) == 0
    assert not path.exists()
