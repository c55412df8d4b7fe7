"""The report benchmark runs end to end on a small store and both methods agree (figures are
printed, not asserted: only the totals, which are hand-computed, are)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infercost_bench.report import run


@pytest.mark.slow
def test_bench_report_small_store(tmp_path: Path) -> None:
    lines: list[str] = []
    figures = run(series=2, days=15, store=tmp_path / "history.sqlite", print_fn=lines.append)
    # 2 series at $2/h over the last week: 2 × 2 × 168 = $672, by either method
    assert figures["sql"]["total_usd"] == pytest.approx(672.0)
    assert figures["records"]["total_usd"] == pytest.approx(672.0)
    assert figures["sql"]["peak_rss_mb"] > 0 and figures["sql"]["seconds"] > 0
    assert any(line.startswith("sql vs baseline:") for line in lines)
