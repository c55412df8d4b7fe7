"""The README and docs/: short, linked, generated where they can be, and free of measured figures.

Measured figures live in benchmarks/RESULTS.md, which the benchmarks write (`--write-results`); a
figure typed into the README or a docs page goes stale the day it is written. Stated limits and
targets ("≤ 100 MB") are not measurements and may stand anywhere.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GENERATED = {ROOT / "docs" / "metrics.md"}
PAGES = sorted({README, *(ROOT / "docs").rglob("*.md")} - GENERATED)
README_MAX_LINES = 200  # a newcomer reads it in five minutes; the rest is one link away in docs/

_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
# A measurement: a number with a unit of time, memory or CPU, a rate of alarms, or a percentage on a
# line about what the benchmarks grade. A number after a comparison or "target" is a stated limit.
_LIMIT = r"(?<![\d.,])(?<![≤≥<>~])(?<![≤≥<>~] )(?<!at most )(?<!under )(?<!target )(?<!target: )"
_NUMBER = _LIMIT + r"\b\d[\d,]*(?:\.\d+)?"
_MEASURED = (
    re.compile(_NUMBER + r"\s?(?:ms|µs|us|CPU-s|MB)\b"),
    re.compile(_NUMBER + r"\s?s wall\b"),
    re.compile(_NUMBER + r"\s+(?:false alarms? )?per node-week", re.IGNORECASE),
)
_GRADED = re.compile(r"recall|false alarm|\bCPU\b|\bRSS\b|overhead", re.IGNORECASE)
_PERCENT = re.compile(_NUMBER + r"\s?%")
_ISSUE = re.compile(r"\b[Ii]ssues? #?\d+|\(#\d+\)")


def _prose(path: Path) -> list[tuple[int, str]]:
    """The page's lines outside fenced code blocks, with their numbers."""
    text = path.read_text(encoding="utf-8")
    blanked = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return list(enumerate(blanked.split("\n"), start=1))


def _measured(line: str) -> bool:
    if any(p.search(line) for p in _MEASURED):
        return True
    return bool(_GRADED.search(line) and _PERCENT.search(line))


def test_the_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (≤ {README_MAX_LINES}): move detail to docs/"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_and_picture_of_a_page_exists(page: Path) -> None:
    missing = []
    for target in _LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a URL or an anchor of the same page
        path, _, anchor = target.partition("#")
        file = page.parent / path
        exists = not path or file.exists()
        if not exists or (anchor and file.suffix == ".md" and anchor not in _anchors(file)):
            missing.append(target)
    assert not missing, f"{page.relative_to(ROOT)} links to missing files or headings: {missing}"


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces → '-'."""
    out = set()
    for line in _FENCE.sub("", page.read_text(encoding="utf-8")).split("\n"):
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def test_the_readme_shows_the_demo_and_the_report() -> None:
    pictures = [t for t in _LINK.findall(README.read_text(encoding="utf-8")) if t.endswith(".png")]
    assert any("demo" in p for p in pictures) and any("report" in p for p in pictures), pictures


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_holds_a_measured_figure(page: Path) -> None:
    found = [f"{n}: {line.strip()}" for n, line in _prose(page) if _measured(line)]
    assert not found, (
        f"{page.relative_to(ROOT)} states measured figures; link benchmarks/RESULTS.md instead:\n"
        + "\n".join(found)
    )


@pytest.mark.parametrize(
    ("line", "measured"),
    [
        ("the daemon takes 0.20 CPU-s per minute", True),
        ("whole agent 121 MB steady", True),
        ("recall 83 % on the held-out seeds", True),
        ("1.00 false alarms per node-week", True),
        ("parse + map of a page in 0.32 ms", True),
        ("the whole agent stays ≤ 100 MB", False),
        ("target: ≤ 0.5 false alarms per node-week", False),
        ("`/metrics` never blocked > 200 ms by discovery", False),
        ("KV cache per token = 327,680 bytes", False),
        ("cost per token rises about 70 % after the deploy", False),
    ],
)
def test_the_figure_rule_tells_a_measurement_from_a_limit(line: str, measured: bool) -> None:
    assert _measured(line) is measured


def test_no_issue_numbers_in_the_tree() -> None:
    """Issue numbers of a tracker that is not in the repository mean nothing to a reader of the code."""
    dirs = (
        "agent",
        "infercost_sim",
        "infercost_bench",
        "tests",
        "scripts",
        "rules",
        "deploy",
        "dashboards",
        "docs",
    )
    roots = [ROOT / d for d in dirs]
    files = [ROOT / "pyproject.toml", README, ROOT / "CHANGELOG.md"]
    for root in roots:
        files += [p for p in root.rglob("*") if p.suffix in {".py", ".md", ".yaml", ".yml", ".toml", ".json"}]
    found = []
    for path in files:
        if not path.is_file() or "node_modules" in path.parts:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").split("\n"), 1):
            if _ISSUE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not found, "\n".join(found)


def test_the_metrics_page_is_generated_from_the_catalogue() -> None:
    spec = importlib.util.spec_from_file_location("metrics_doc", ROOT / "scripts" / "metrics_doc.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    page = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    assert page == module.render(), "docs/metrics.md is stale: run python scripts/metrics_doc.py"
    from agent.catalog import CATALOG

    assert all(f"`{s.full_name}`" in page for s in CATALOG)
