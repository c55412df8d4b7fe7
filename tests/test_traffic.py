"""The simulated node history: physics of troughs, labelled incidents, scrape gaps, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from agent.samples import CostWindow
from agent.sim.traffic import (
    BENIGN_KINDS,
    DAY,
    GPU_PRICE_USD_PER_HOUR,
    HOUR,
    REGRESSION_KINDS,
    SimulatedHistory,
    simulate_node,
)


@pytest.fixture(scope="module")
def sim() -> SimulatedHistory:
    return simulate_node(seed=3, weeks=3)


def test_windows_are_priced_consistently(sim: SimulatedHistory) -> None:
    for w in sim.windows[::97]:
        u = w.usage
        assert w.gpu_time_usd == pytest.approx(u.gpu_seconds / 3600.0 * GPU_PRICE_USD_PER_HOUR)
        if u.generation_tokens > 0:
            assert w.usd_per_1m_output == pytest.approx(w.cost_usd / u.generation_tokens * 1e6)
            assert w.idle_usd == 0.0
        else:
            assert w.usd_per_1m_output is None and w.idle_usd == pytest.approx(w.cost_usd)
        assert 0.0 <= (u.gpu_util_ratio or 0.0) <= 1.0 and 0.0 <= (u.kv_cache_usage_ratio or 0.0) <= 1.0
        assert u.end > u.start and u.model == "llama-3-8b"


def test_troughs_raise_cost_per_token(sim: SimulatedHistory) -> None:
    def median_at(day: int, hour: int) -> float:
        t = sim.start + day * DAY + hour * HOUR
        vals = [
            w.usd_per_1m_output for w in sim.windows if t <= w.usage.start < t + HOUR and w.usd_per_1m_output
        ]
        return float(np.median(vals))

    weekday_peak = median_at(2, 14)
    weekday_night = median_at(2, 4)
    sunday_night = median_at(6, 4)
    assert weekday_night > 1.5 * weekday_peak  # the literal 1.5 × mean rule fires on this
    assert sunday_night > weekday_night


def test_incidents_are_labelled_after_the_warm_up(sim: SimulatedHistory) -> None:
    kinds = {i.kind for i in sim.incidents}
    assert set(REGRESSION_KINDS) <= kinds
    assert (
        {"burst", "mix_change", "scrape_gap", "benign_deploy"}
        <= kinds
        <= set(REGRESSION_KINDS) | set(BENIGN_KINDS)
    )
    for inc in sim.incidents:
        assert inc.start >= sim.start + 7 * DAY and inc.end > inc.start
        assert inc.regression == (inc.kind in REGRESSION_KINDS)
        if inc.regression:
            assert 1.1 <= inc.factor <= 2.0
            assert inc.start <= inc.visible <= inc.end
            assert inc.excess_usd > 0.0
        else:
            assert inc.factor == 1.0 and inc.excess_usd == 0.0


def test_step_regression_raises_cost_over_the_counterfactual(sim: SimulatedHistory) -> None:
    step = next(i for i in sim.regressions if i.kind == "step")
    a = int((step.start - sim.start) // 60)
    b = int((step.end - sim.start) // 60)
    assert sim.excess_usd_per_minute[a:b].sum() > 0.0
    # Outside incidents the actual and healthy runs are the same node.
    assert np.allclose(sim.excess_usd_per_minute[: int(7 * DAY // 60)], 0.0)


def test_deploys_change_the_model_version(sim: SimulatedHistory) -> None:
    step = next(i for i in sim.regressions if i.kind == "step")
    before = max((w for w in sim.windows if w.usage.end <= step.start), key=lambda w: w.usage.end)
    during = min((w for w in sim.windows if w.usage.start >= step.start), key=lambda w: w.usage.start)
    assert before.usage.model_version != during.usage.model_version


def test_scrape_gaps_leave_no_cost_per_token_but_keep_the_tokens(sim: SimulatedHistory) -> None:
    zero = [w for w in sim.windows if w.usage.generation_tokens == 0]
    long = [w for w in sim.windows if w.usage.duration > 60]
    assert zero or long
    for w in zero:
        assert w.usd_per_1m_output is None and w.usage.ttft_p99_seconds is None
    for w in long:  # the agent was down: one window spans the gap with the tokens accumulated
        assert w.usage.gpu_seconds >= w.usage.duration * 2 - 1e-6  # at least the 2-replica floor
        assert w.usd_per_1m_output is not None


def test_deterministic_with_a_seed() -> None:
    a = simulate_node(seed=21, weeks=1)
    b = simulate_node(seed=21, weeks=1)
    c = simulate_node(seed=22, weeks=1)
    assert a.windows == b.windows
    assert a.windows != c.windows


def _span(sim: SimulatedHistory, a: float, b: float) -> list[CostWindow]:
    return [w for w in sim.windows if a <= w.usage.start < b and w.usage.generation_tokens > 0]


def test_mix_change_costs_more_per_output_token_without_overloading_the_node(sim: SimulatedHistory) -> None:
    mix = next(i for i in sim.incidents if i.kind == "mix_change")
    during = _span(sim, mix.start, mix.end)
    week_before = _span(sim, mix.start - 7 * DAY, mix.end - 7 * DAY)  # same hours of the week
    ratio = np.median([w.usage.prompt_tokens / w.usage.generation_tokens for w in during])
    ratio_before = np.median([w.usage.prompt_tokens / w.usage.generation_tokens for w in week_before])
    assert ratio / ratio_before == pytest.approx(1.3 / 0.5, rel=0.15)

    def per_1m(ws: list[CostWindow]) -> float:
        return sum(w.cost_usd for w in ws) / sum(w.usage.generation_tokens for w in ws) * 1e6

    assert per_1m(during) > 1.3 * per_1m(week_before)
    # A change of what is served, not a capacity incident: no preemptions, KV cache never full.
    assert all((w.usage.preemptions or 0.0) == 0.0 for w in during)
    assert max(w.usage.kv_cache_usage_ratio or 0.0 for w in during) < 0.95


def test_the_request_mix_wanders_outside_incidents(sim: SimulatedHistory) -> None:
    calm = _span(sim, sim.start, sim.start + 7 * DAY)  # the warm-up week has no incidents
    log_ratio = np.log([w.usage.prompt_tokens / w.usage.generation_tokens for w in calm])
    assert np.exp(np.median(log_ratio)) == pytest.approx(4.0, rel=0.1)
    assert 0.05 < np.std(log_ratio) < 0.2  # everyday wander: ≈ √2 × 8 %
