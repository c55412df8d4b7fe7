"""Where GPU time goes, in history (schema 6). Each model minute keeps its GPU-seconds and
GPU dollars by bound (compute, memory, communication, idle: :mod:`agent.cost.bound`); a minute
without a split (GPM unsupported) keeps 0 in all eight and reads back as absent, not as zero.

One minute of llama v1 on one $3/h GPU costs $0.05 for 60 GPU-seconds. GPM said: SMs busy 90 %,
of the busy time tensor cores 50 %, DRAM 30 %, links 10 % of their peaks, so busy 0.9 is split
0.9 × 5/9 = 0.5 compute, 0.9 × 3/9 = 0.3 memory, 0.9 × 1/9 = 0.1 communication, idle 0.1:
GPU-seconds 30 / 18 / 6 / 6, dollars 0.025 / 0.015 / 0.005 / 0.005.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from oldstore import old_store

from agent.clock import ManualClock
from agent.cost.bound import BOUNDS
from agent.detect.evaluator import RuleEvaluator
from agent.detect.rules import load_rules
from agent.records import BOUND_SUMS, SIGNALS, MinuteRecord, bound_sums, model_sums, window_from_record
from agent.samples import CostWindow, UsageWindow
from agent.store import MIGRATIONS, SCHEMA_VERSION, Store

T0 = 1699833600.0  # Monday 00:00 UTC
SECONDS = {"compute": 30.0, "memory": 18.0, "communication": 6.0, "idle": 6.0}  # GPU-seconds
USD = {"compute": 0.025, "memory": 0.015, "communication": 0.005, "idle": 0.005}  # dollars


def window(start: float, bound: bool = True) -> CostWindow:
    u = UsageWindow(
        "n1", "e1", "llama", "v1", start, start + 60.0,
        prompt_tokens=12_000, generation_tokens=6_000, gpu_seconds=60.0, energy_joules=None,
    )  # fmt: skip
    return CostWindow(
        u,
        gpu_time_usd=0.05,
        energy_usd=0.0,
        usd_per_1m_output=0.05 / 6_000 * 1e6,
        usd_per_1m_total=0.05 / 18_000 * 1e6,
        idle_usd=0.0,
        bound_gpu_seconds=SECONDS if bound else None,
        bound_usd=USD if bound else None,
    )


def half(start: float) -> CostWindow:
    """A 30 s window: half the minute's GPU-seconds, dollars and bound split."""
    w = window(start)
    return dataclasses.replace(
        w,
        usage=dataclasses.replace(w.usage, end=start + 30.0, gpu_seconds=30.0),
        gpu_time_usd=0.025,
        bound_gpu_seconds={b: v / 2 for b, v in SECONDS.items()},
        bound_usd={b: v / 2 for b, v in USD.items()},
    )


def test_bound_sums_of_one_window_by_hand() -> None:
    s = bound_sums(window(T0))
    assert list(s) == list(BOUND_SUMS)
    assert [s[f"bound_{b}_seconds"] for b in BOUNDS] == [30.0, 18.0, 6.0, 6.0]
    assert [s[f"bound_{b}_usd"] for b in BOUNDS] == [0.025, 0.015, 0.005, 0.005]
    # the dollars the split covers are its own sum: the window's $0.05
    assert sum(s[f"bound_{b}_usd"] for b in BOUNDS) == pytest.approx(0.05)
    # without GPM: nothing covered (no zero pretending to be a measured "0 s memory-bound")
    assert set(bound_sums(window(T0, bound=False)).values()) == {0.0}


def test_store_keeps_the_bound_split_and_reads_it_back(tmp_path: Path) -> None:
    st = Store(tmp_path / "h.sqlite", 35, ManualClock(T0 + 3600))
    # minute 0: two 30 s halves with a split (they add up); minute 1: none
    halves = [
        half(T0),
        half(T0 + 30.0),
        window(T0 + 60.0, bound=False),
    ]
    assert st.write_windows(halves) == 3
    assert st.write_windows(halves) == 0  # idempotent: not re-counted
    a, b = st.records(T0, T0 + 120, ("model",))
    assert a.sums["bound_compute_seconds"] == pytest.approx(30.0)
    assert a.sums["bound_memory_usd"] == pytest.approx(0.015)
    w = window_from_record(a)
    assert w.bound_gpu_seconds == pytest.approx(SECONDS) and w.bound_usd == pytest.approx(USD)
    assert all(b.sums[c] == 0.0 for c in BOUND_SUMS)
    w2 = window_from_record(b)  # the minute without: absent, not zero
    assert w2.bound_gpu_seconds is None and w2.bound_usd is None
    # the hourly SQL sums the report reads, by name
    ((_, _, sums),) = st.hourly_model_sums(T0, T0 + 3600)
    assert sums["cost_usd"] == pytest.approx(0.10)  # the cost of both minutes
    assert [sums[c] for c in BOUND_SUMS] == pytest.approx((30.0, 18.0, 6.0, 6.0, 0.025, 0.015, 0.005, 0.005))
    st.close()


def test_a_schema_5_store_is_migrated_and_keeps_its_minutes(tmp_path: Path) -> None:
    p = old_store(
        tmp_path / "h.sqlite",
        5,
        "INSERT INTO model_minutes (node, engine, model, model_version, minute, covered_until, seconds, "
        "generation_tokens, cost_usd, prompt_usd, split_usd) "
        "VALUES ('n1', 'e1', 'llama', 'v1', ?, ?, 60, 6000, 0.05, 0.0125, 0.05)",
        (int(T0), T0 + 60),
    )
    st = Store(p, 35, ManualClock(T0 + 3600))
    assert st.schema_version() == SCHEMA_VERSION == len(MIGRATIONS)
    (r,) = st.records(T0, T0 + 60, ("model",))
    # the old row is kept whole, its schema-5 split included, and has no bound split (absent)
    assert r.sums["cost_usd"] == pytest.approx(0.05) and r.sums["prompt_usd"] == pytest.approx(0.0125)
    assert all(r.sums[c] == 0.0 for c in BOUND_SUMS)
    assert window_from_record(r).bound_usd is None
    # a later window in the same minute is added to the old row; a new minute takes the columns
    st.write_windows([window(T0 + 60), window(T0 + 120, bound=True)])
    (r0,) = st.records(T0, T0 + 60, ("model",))
    assert r0.sums["cost_usd"] == pytest.approx(0.05)  # the window of T0 + 60 is another minute
    recs = st.records(T0 + 60, T0 + 180, ("model",))
    assert [x.sums["bound_idle_seconds"] for x in recs] == pytest.approx([6.0, 6.0])
    st.close()


LABELS = (("node", "n1"), ("engine", "e1"), ("model", "llama"), ("model_version", "v1"))


def _rec(minute: float, bound: bool) -> MinuteRecord:
    return MinuteRecord("model", LABELS, minute, model_sums(window(minute, bound)))


@pytest.mark.parametrize(
    ("signal", "expected"),
    [
        # 3 minutes with a split and 2 without: shares over the 3 ($0.15 of bound dollars) only
        ("compute_bound_cost_ratio", 3 * 0.025 / 0.15),
        ("memory_bound_cost_ratio", 3 * 0.015 / 0.15),
        ("communication_bound_cost_ratio", 3 * 0.005 / 0.15),
        ("idle_bound_cost_ratio", 3 * 0.005 / 0.15),
        # $0.15 of the 5 minutes' $0.25 had a split
        ("bound_cost_coverage_ratio", 0.15 / 0.25),
    ],
)
def test_bound_signals_over_five_minutes_by_hand(signal: str, expected: float) -> None:
    sig = SIGNALS[signal]
    recs = [_rec(T0 + i * 60, bound=i < 3) for i in range(5)]
    assert sig.fn([sum(r.sums.get(k, 0.0) for r in recs) for k in sig.inputs]) == pytest.approx(expected)


def test_bound_shares_are_absent_without_a_split() -> None:
    recs = [_rec(T0 + i * 60, bound=False) for i in range(5)]
    for b in BOUNDS:
        sig = SIGNALS[f"{b}_bound_cost_ratio"]
        assert sig.fn([sum(r.sums.get(k, 0.0) for r in recs) for k in sig.inputs]) is None
    sig = SIGNALS["bound_cost_coverage_ratio"]
    assert sig.fn([sum(r.sums.get(k, 0.0) for r in recs) for k in sig.inputs]) == 0.0


def test_a_rule_on_the_idle_bound_share_fires(tmp_path: Path) -> None:
    """A version whose GPUs sat idle for 40 % of the dollars with a split (above a 25 % ceiling)
    fires after its `for`; at 10 % idle (the window of this file) it stays quiet."""
    p = tmp_path / "r.yaml"
    p.write_text(
        yaml.safe_dump(
            {
                "rules": [
                    {
                        "id": "idle_bound_share",
                        "signal": "idle_bound_cost_ratio",
                        "over": "15m",
                        "op": ">",
                        "threshold": 0.25,
                        "for": "10m",
                        "severity": "warning",
                        "summary": "{model} {model_version}: {value} of the GPU dollars idle",
                    }
                ]
            }
        )
    )
    idle = {"compute": 0.015, "memory": 0.01, "communication": 0.005, "idle": 0.02}  # 0.02 / 0.05 = 40 %

    def run(usd: dict[str, float]) -> list[str]:
        ev = RuleEvaluator(load_rules([p]))
        fired: list[str] = []
        for i in range(40):
            t = T0 + i * 60
            w = dataclasses.replace(window(t), bound_usd=usd)
            fired += [f.rule_id for f in ev.step(t + 60, [MinuteRecord("model", LABELS, t, model_sums(w))])]
        return fired

    assert "idle_bound_share" in run(idle)
    assert run(USD) == []
