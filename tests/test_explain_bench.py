"""``infercost bench explain``'s bookkeeping: every incident kind the schedule has is mapped, the
comparison window is the same hours a week away that hold no incident, and the rendered counters the
factors read agree with each other as an engine's do."""

from __future__ import annotations

import pytest

from agent.cost.explain import FACTORS
from infercost_bench.explain import IMPLIED, comparison_shift
from infercost_sim.workload import BENIGN_KINDS, REGRESSION_KINDS, WEEK, Incident


def test_every_kind_of_the_schedule_is_mapped_to_factors_the_split_has() -> None:
    assert set(IMPLIED) >= {*REGRESSION_KINDS, *BENIGN_KINDS}
    for kind, factors in IMPLIED.items():
        assert factors is None or set(factors) <= set(FACTORS), kind
    assert IMPLIED["scrape_gap"] is None and IMPLIED["benign_deploy"] is None


def _inc(kind: str, start: float, hours: float) -> Incident:
    return Incident(kind, start, start + hours * 3600, 1.5, True)


def test_the_week_before_unless_it_holds_an_incident_then_the_week_after() -> None:
    t0 = 0.0
    step = _inc("step", 8 * 86400, 4)
    assert comparison_shift(step, [step], t0, 3 * WEEK) == -WEEK
    other = _inc("drift", 8 * 86400 - WEEK + 3600, 24)  # overlaps the week before
    assert comparison_shift(step, [step, other], t0, 3 * WEEK) == WEEK
    assert comparison_shift(step, [step, other], t0, 2 * WEEK) is None  # no week after in the span


def test_the_rendered_inter_token_latency_adds_up_to_the_decode_time_and_e2e_counts_the_finished() -> None:
    """A request's inter-token intervals add up to its decode time (first to last token), so the
    rendered histogram's sum is the decode request-seconds less the first-token step each finished
    request's prefill time holds; vLLM observes the e2e latency with the phase times, so its count
    is the finished requests' at every scrape."""
    import numpy as np

    from infercost_sim.samples import ticks
    from infercost_sim.workload import simulate_node

    sim = simulate_node("core", seed=3, weeks=1 / 7, warmup_days=0, tick_seconds=300.0)
    tr = sim.trace
    seen = 0
    for tick in ticks(sim):
        if not tick.scrape.up:
            continue
        (sig,) = tick.scrape.models
        assert sig.e2e_seconds is not None and sig.itl_seconds is not None
        assert sig.e2e_seconds.count == sig.requests_finished_total["stop"]
        whole = int((tick.t - sim.start) // 60)  # the histograms hold the minutes before the scrape
        held = tr.decode_seconds[:whole] - tr.finished[:whole] * tr.itl_median[:whole]
        assert sig.itl_seconds.sum == pytest.approx(float(np.maximum(held, 0.0).sum()), rel=1e-9)
        seen += 1
    assert seen > 200


def test_a_missed_incident_is_diagnosed_from_its_own_terms() -> None:
    """A miss prints the terms that carried the change, what the prompts' factors carried together,
    the minutes without every factor, and why the kind's physics moves more than its implied factor."""
    from infercost_bench.explain import Row, diagnosis

    row = Row(
        "core", 7, "core-7-0", "prefill_morning", 0.0, 0.5, 0.15, "batch", ("mix",), 0.47, 0.0,
        (0.001, 0.004), (("batch", 0.50), ("mix", 0.47), ("model", 0.34), ("idle", -0.20), ("closure", 0.0)),
        (1.0, 0.9),
    )  # fmt: skip
    line = diagnosis(row)
    assert line.startswith("terms batch +50%, mix +47%, model +34%, idle -20%")
    assert "mix + model and context 81%" in line and "idle + batch (sequences running) 30%" in line
    assert "every factor read in 100%/90% of the tokens" in line
    assert "each step reads their KV" in line
    shrink = diagnosis(Row(
        "core", 7, "n", "kv_shrink", 0.0, 0.3, 0.1, "step_efficiency", ("batch",), 0.5, 0.0, (None, None),
        (("step_efficiency", 0.85), ("batch", 0.54)),
    ))  # fmt: skip
    assert "iteration_tokens_total" in shrink and "mix + model" not in shrink
