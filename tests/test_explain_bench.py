"""``infercost bench explain``'s bookkeeping: every incident kind the schedule has is mapped, and the
comparison window is the same hours a week away that hold no incident."""

from __future__ import annotations

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
