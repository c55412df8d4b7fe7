"""Per-GPU dollars in history, so node idle (unused GPUs) is never lost.

A node of three H100s at $3.60/h; one engine uses GPU 0 and makes tokens every minute, GPUs 1 and
2 serve nothing. Over a day, idle = 2 GPUs × 24 h × $3.60 = $172.80. The idle-cost rule, the local
weekly report and the exported counters (what the Prometheus report sums) must all say so.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from oldstore import old_store

from agent.clock import ManualClock
from agent.cost.inputs import EngineSpec, GpuRate, PriceTable
from agent.cost.window import WindowJoiner
from agent.detect.evaluator import RuleEvaluator
from agent.detect.rules import load_default_rules
from agent.records import MINUTE
from agent.report.data import build_from_store
from agent.samples import EngineScrape, GpuSample, ModelSignals, NvmlRound
from agent.snapshot import Ledger
from agent.store import Store

T0 = 1699833600.0  # Monday 00:00 UTC
DAY = 86400.0
IDLE_PER_DAY = 2 * 24 * 3.6  # $172.80
STEP = 600.0  # seconds per tick (each tick's dollars land in the minute it starts in)


def _day(tmp_path: Path) -> tuple[Store, Ledger]:
    st = Store(tmp_path / "h.sqlite", 35, ManualClock(T0 + DAY))
    led = Ledger("n1", "test")
    j = WindowJoiner(
        "n1", (EngineSpec("a", gpus=(0,), model_version="v1"),), PriceTable(gpus=(GpuRate("H100", 3.6),))
    )
    for k in range(int(DAY / STEP) + 1):
        t = T0 + k * STEP
        j.add_round(
            NvmlRound(t, True, tuple(GpuSample(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", t) for i in range(3)))
        )
        page = ModelSignals("m", prompt_tokens_total=0.0, generation_tokens_total=6000.0 * k)
        tick = j.close_tick(t, {"a": EngineScrape("a", "vllm", t, True, 0.01, (page,))})
        assert tick.unexplained_usd() == pytest.approx(0.0, abs=1e-12)
        led.apply(tick)
        st.write_windows(list(tick.windows))
        st.write_gpu_costs("n1", tick)
        st.write_gpu_costs("n1", tick)  # written twice (a retry): counted once
    return st, led


def test_gpu_dollars_in_history_and_the_rule_report_and_counters_agree(tmp_path: Path) -> None:
    st, led = _day(tmp_path)
    recs = st.records(T0, T0 + DAY)
    gpu_idle_day: dict[str, float] = {}
    for r in recs:
        if r.kind == "gpu":
            gpu_idle_day[r.label("gpu")] = gpu_idle_day.get(r.label("gpu"), 0.0) + r.sums["idle_usd"]
    assert gpu_idle_day == pytest.approx({"0": 0.0, "1": 86.4, "2": 86.4})  # $3.60 × 24 h each
    assert sum(r.sums["cost_usd"] for r in recs if r.kind == "gpu") == pytest.approx(3 * 86.4)
    # the model rows alone see no idle at all: that is what the history missed
    assert sum(r.sums.get("idle_usd", 0.0) for r in recs if r.kind == "model") == 0.0

    # the rule: per-GPU idle summed per node over 24 h, above its $100 budget
    ev = RuleEvaluator(load_default_rules())
    by_minute: dict[float, list] = {}
    for r in recs:
        by_minute.setdefault(r.minute, []).append(r)
    fired = []
    for m in sorted(by_minute):
        fired += [f for f in ev.step(m + MINUTE, by_minute[m]) if f.rule_id == "idle_cost_budget"]
    assert fired and fired[-1].labels == (("node", "n1"),)
    assert fired[-1].value == pytest.approx(IDLE_PER_DAY)

    # the local weekly report
    st.close()
    report = build_from_store(tmp_path / "h.sqlite", T0 + 7 * DAY)
    assert report.idle_usd == pytest.approx(IDLE_PER_DAY)
    assert [(n.node, n.idle_usd) for n in report.idle_by_node] == [("n1", pytest.approx(IDLE_PER_DAY))]

    # the exported per-GPU idle counters, which the Prometheus report sums with increase()
    snap = led.snapshot()
    assert sum(g.idle_cost_usd_total for g in snap.gpus) == pytest.approx(IDLE_PER_DAY)


def test_an_old_store_is_migrated_to_hold_gpu_dollars(tmp_path: Path) -> None:
    from agent.store import MIGRATIONS

    p = old_store(
        tmp_path / "h.sqlite",
        3,
        "INSERT INTO gpu_minutes (node, gpu, minute, covered_until, up_s, up_w) "
        "VALUES ('n1', '0', ?, ?, 1, 1)",
        (int(T0), T0 + 1),
    )
    st = Store(p, 35, ManualClock(T0))
    assert st.schema_version() == len(MIGRATIONS)
    (r,) = st.records(T0, T0 + 60, ("gpu",))
    assert r.sums["up.s"] == 1 and r.sums["idle_usd"] == 0.0 and r.sums["cost_usd"] == 0.0
    st.close()
