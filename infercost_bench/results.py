"""``benchmarks/RESULTS.md``: the one place measured figures live, written by the benchmarks themselves.

A benchmark run with ``--write-results`` replaces its own section — and only its own — with what it
printed, under a line naming the command, the date, the commit, the machine and the run time. Each
section sits between two HTML comments that carry its key, so a run finds and replaces it without
parsing the Markdown around it. The key is the benchmark's name plus every option that changes its
figures (``detection (quick)``, ``detection --seed 91``): a quick run in CI or a run with other seeds
never overwrites the full run's section. Nothing here measures: it records what a run printed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import os
import platform
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

RELATIVE_PATH = Path("benchmarks/RESULTS.md")
# the order sections take in a new file; a benchmark not listed goes after them
ORDER = ("detection", "efficiency", "overhead", "startup", "parse", "exposition", "report", "soak", "bound")
HEADER = """# Benchmark results

Written by the benchmarks, not by hand: `infercost bench <name> --write-results` replaces its own
section (quick runs and runs with other options have sections of their own). Each section names the
command, when and where it ran, and shows what the run printed. The README and `docs/` link here
and hold no measured figure of their own.
"""
_BEGIN = "<!-- BEGIN {key} -->"
_END = "<!-- END {key} -->"
_SECTION = re.compile(r"<!-- BEGIN (?P<key>.+?) -->\n.*?<!-- END (?P=key) -->\n", re.DOTALL)
# terminal control sequences (colours, cursor moves) and carriage-return progress lines
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


@dataclass(frozen=True, slots=True)
class Run:
    """One benchmark run, as RESULTS.md records it."""

    key: str  # the section's key, e.g. "detection (quick)"
    command: str  # the command line, e.g. "infercost bench detection --quick"
    started: dt.datetime  # UTC
    seconds: float  # wall seconds the run took
    machine: str  # the machine and its load when the run started
    output: str  # what it printed, control sequences removed


def default_path() -> Path:
    """``benchmarks/RESULTS.md`` of the source checkout the agent runs from, else of the current
    directory (an installed wheel has no checkout)."""
    root = Path(__file__).resolve().parents[1]
    if (root / "pyproject.toml").is_file() and (root / "agent").is_dir():
        return root / RELATIVE_PATH
    return RELATIVE_PATH


def section_key(name: str, options: Sequence[str], quick: bool) -> str:
    """The key of a run's section: the name, ``(quick)`` for a quick run, then the other options."""
    key = f"{name} (quick)" if quick else name
    return " ".join([key, *options])


def clean(text: str) -> str:
    """Printed text as a file shows it: no terminal control sequences, progress lines overwritten."""
    lines = []
    for line in _ANSI.sub("", text).split("\n"):
        lines.append(line.rsplit("\r", 1)[-1].rstrip())
    return "\n".join(lines).strip("\n")


def machine() -> str:
    """The machine in one line: OS, architecture, CPUs, memory, Python."""
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        memory = f", {mem:.0f} GiB"
    except (ValueError, OSError, AttributeError):
        memory = ""
    try:
        load = f", load average {os.getloadavg()[0]:.1f} at start"
    except OSError:
        load = ""
    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs{memory}, "
        f"Python {platform.python_version()}{load}"
    )


def commit(cwd: Path) -> str:
    """The commit the run measured (short hash, ``+ changes`` when the tree differs), or ``unknown``."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            # the results file itself does not make the measured tree dirty
            [
                "git",
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ":(top)",
                ":(top,exclude)benchmarks/RESULTS.md",
            ],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + (" + uncommitted changes" if dirty.stdout.strip() else "")


def render(run: Run, revision: str) -> str:
    """A run's section, its markers included."""
    when = run.started.strftime("%Y-%m-%d %H:%M UTC")
    took = f"{run.seconds:.0f} s" if run.seconds >= 10 else f"{run.seconds:.1f} s"
    return (
        f"{_BEGIN.format(key=run.key)}\n"
        f"## {run.key}\n\n"
        f"`{run.command}` · {when} · commit {revision} · {took}\n\n"
        f"{run.machine}\n\n"
        f"```text\n{run.output}\n```\n"
        f"{_END.format(key=run.key)}\n"
    )


def _rank(key: str) -> tuple[int, str]:
    name = key.split(" ", 1)[0]
    return (ORDER.index(name) if name in ORDER else len(ORDER), key)


def merge(existing: str, key: str, section: str) -> str:
    """The file with ``key``'s section replaced by ``section`` (or added in its place); others kept."""
    sections = {m.group("key"): m.group(0) for m in _SECTION.finditer(existing)}
    sections[key] = section
    body = "\n".join(sections[k] for k in sorted(sections, key=_rank))
    return f"{HEADER}\n{body}"


def write(path: Path, run: Run) -> None:
    """Replace ``run``'s section of the results file at ``path`` (created when missing), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    existing = path.read_text(encoding="utf-8") if path.exists() else ""
    text = merge(existing, run.key, render(run, commit(Path(__file__).resolve().parent)))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


class _Tee(io.TextIOBase):
    """Writes through to the real stream and keeps a copy."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.copy = io.StringIO()

    def write(self, s: str) -> int:
        self.copy.write(s)
        return self._stream.write(s)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return False  # plain text for the copy: no colours, no live redraws


@contextlib.contextmanager
def recorded() -> Iterator[_Tee]:
    """Everything printed inside the block still reaches stdout; ``.copy`` holds it afterwards."""
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        yield tee
