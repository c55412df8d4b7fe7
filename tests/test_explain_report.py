"""The weekly report's week-over-week factor waterfall (agent.report.waterfall): a version whose
GPUs cost 1.5× this week shows the whole change as price; one whose steps got slower, as step
efficiency; both through the store (real SQLite, aggregated in SQL) and the Markdown."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from agent.clock import ManualClock
from agent.report.data import build_from_store
from agent.report.render import render_markdown
from agent.report.waterfall import TOTAL
from agent.samples import CostWindow, UsageWindow
from agent.store import Store

HOUR = 3600.0
WEEK = 7 * 86400.0
END = 1700438400.0  # a Monday 00:00 UTC
STEP = 600.0  # seconds per window


def windows(model: str, usd_per_hour: float, price_ratio: float, step_ratio: float) -> list[CostWindow]:
    """Two weeks of one version: 16 sequences per step of 60 ms of decode, the GPU 80 % busy, prefill
    20 % of the steps' time; this week the price and the step are multiplied as given."""
    out = []
    for i in range(int(2 * WEEK / STEP)):
        start = END - 2 * WEEK + i * STEP
        this = start >= END - WEEK
        price = usd_per_hour * (price_ratio if this else 1.0)
        step = 0.06 * (step_ratio if this else 1.0)
        running = 16 * 0.8  # sequences running over the window (steps run while the GPU is busy)
        gen = running * 0.8 / step * STEP  # a token per sequence per step of step ÷ (1 − 0.2)
        cost = price * STEP / HOUR
        u = UsageWindow(
            "n1", "e1", model, "v1", start, start + STEP, prompt_tokens=gen * 4, generation_tokens=gen,
            gpu_seconds=STEP, energy_joules=None, requests_running=running,
            prefill_seconds=0.2, decode_seconds=0.8,
        )  # fmt: skip
        roofline = 0.05 / (step / 0.8)  # a 50 ms roofline step; the step as run, no floor taken out
        floor = cost / STEP * 0.05 / running * 1e6  # $/1M at the roofline, this batch
        out.append(
            CostWindow(
                u,
                cost,
                0.0,
                cost / gen * 1e6,
                cost / (5 * gen) * 1e6,
                0.0,
                roofline_ratio=roofline,
                prompt_usd=cost * 0.2,
                usage_usd=cost * 0.8,
                floor_usd_per_1m_output=floor,
                prefill_share_ratio=0.2,
                prefill_share_floor_ratio=0.0,
            )
        )
    return out


def test_week_over_week_by_factor(tmp_path: Path) -> None:
    p = tmp_path / "history.sqlite"
    st = Store(p, 35, ManualClock(END))
    st.write_windows(windows("pricey", 2.0, 1.5, 1.0) + windows("slower", 3.0, 1.0, 1.25))
    st.close()
    rep = build_from_store(p, end=END)
    by = {w.model: w for w in rep.waterfalls}
    assert set(by) == {"pricey", "slower", TOTAL}
    pricey, slower = by["pricey"].split, by["slower"].split
    assert pricey.after_usd_per_1m == pytest.approx(1.5 * pricey.before_usd_per_1m)
    assert pricey.terms[0].name == "price" and pricey.terms[0].share == pytest.approx(1.0, abs=1e-9)
    assert slower.terms[0].name == "step_efficiency" and slower.terms[0].share == pytest.approx(1.0, abs=1e-9)
    for w in rep.waterfalls:
        s = w.split
        assert math.fsum(t.usd_per_1m for t in s.terms) == pytest.approx(s.total_usd_per_1m, rel=1e-9)
        assert s.closure_gap_before == pytest.approx(0.0, abs=1e-9)  # every series agrees here
    md = render_markdown(rep)
    assert "## Why $ per 1M output tokens changed (week over week, by factor)" in md
    section = md.split("## Why $ per 1M output tokens changed (week over week, by factor)", 1)[1]
    row = next(line for line in section.splitlines() if line.startswith("| pricey | v1 |"))
    assert "price +$" in row and "+0.0 %" in row
