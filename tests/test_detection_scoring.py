"""The detection benchmark's scoring on small hand-made cases (not the full benchmark run)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from infercost_bench.detection import (
    excess_before,
    false_alarm_cause,
    match_events,
    merge_intervals,
    score_detector,
)
from infercost_sim.workload import MINUTE, WEEK, Incident

T0 = 1_704_067_200.0  # a Monday 00:00 UTC


def _inc(
    kind: str, start_min: int, end_min: int, factor: float = 1.5, visible_min: int | None = None
) -> Incident:
    regression = kind not in ("flash_crowd", "long_prompts", "scrape_gap", "benign_deploy")
    return Incident(
        kind=kind,
        start=T0 + start_min * MINUTE,
        end=T0 + end_min * MINUTE,
        factor=factor if regression else 1.0,
        regression=regression,
        visible=T0 + (start_min if visible_min is None else visible_min) * MINUTE,
        realised=factor if regression else 1.0,
    )


@dataclass(frozen=True)
class Truth:
    start: float
    minutes: int
    incidents: tuple[Incident, ...]
    excess_usd_per_minute: np.ndarray


def _sim(incidents: tuple[Incident, ...], minutes: int, excess: np.ndarray | None = None) -> Truth:
    return Truth(T0, minutes, incidents, np.zeros(minutes) if excess is None else excess)


@pytest.mark.parametrize(
    ("intervals", "merged"),
    [
        ([], []),
        ([(5, 6), (1, 2)], [(1, 2), (5, 6)]),
        ([(1, 3), (2, 5), (5, 7), (9, 10)], [(1, 7), (9, 10)]),
        ([(1, 10), (2, 3)], [(1, 10)]),
    ],
)
def test_merge_intervals(intervals: list[tuple[float, float]], merged: list[tuple[float, float]]) -> None:
    assert merge_intervals(intervals) == merged


def test_match_events_first_event_detects_and_others_are_false_alarms() -> None:
    incs = (_inc("step", 100, 200), _inc("flash_crowd", 300, 320), _inc("drift", 1000, 2000))
    events = [T0 + 50 * MINUTE, T0 + 110 * MINUTE, T0 + 150 * MINUTE, T0 + 305 * MINUTE, T0 + 2020 * MINUTE]
    out = match_events(events, incs, grace=30 * MINUTE)
    # The step is detected by its first event; the drift by one within the 30-minute grace.
    assert out.detections == {0: T0 + 110 * MINUTE, 2: T0 + 2020 * MINUTE}
    # Before any incident, and inside a benign burst: false alarms. The second event in the step is neither.
    assert out.false_alarms == (T0 + 50 * MINUTE, T0 + 305 * MINUTE)
    assert false_alarm_cause(T0 + 305 * MINUTE, incs) == "flash_crowd"
    assert false_alarm_cause(T0 + 50 * MINUTE, incs) == "normal traffic"


def test_excess_before_detection_counts_only_until_detection() -> None:
    excess = np.zeros(100)
    excess[10:20] = 2.0  # dollars per minute
    inc = _inc("step", 10, 20)
    assert excess_before(excess, T0, inc, T0 + 13 * MINUTE) == pytest.approx(6.0)
    assert excess_before(excess, T0, inc, None) == pytest.approx(20.0)  # missed: the whole excess
    assert excess_before(excess, T0, inc, T0 + 5 * MINUTE) == 0.0  # detected before it started


def test_score_detector_recall_delays_and_false_alarm_rate() -> None:
    minutes = int(2 * WEEK / MINUTE)
    warmup = WEEK
    w = int(WEEK / MINUTE)
    incs = (
        _inc("step", w + 100, w + 400, factor=1.5),  # detected 10 min after it became visible
        _inc("drift", w + 1000, w + 3000, factor=1.3, visible_min=w + 1500),  # detected 30 min after visible
        _inc("util_drop", w + 5000, w + 5200, factor=1.1),  # missed, below the 1.2× target
        _inc("intermittent", w + 6000, w + 6400, factor=2.0),  # missed
        _inc("step", 100, 200, factor=2.0),  # in the warm-up: not scored
    )
    excess = np.zeros(minutes)
    excess[w + 100 : w + 400] = 1.0
    events = [
        T0 + 50 * MINUTE,  # warm-up: ignored
        T0 + (w + 110) * MINUTE,
        T0 + (w + 1530) * MINUTE,
        T0 + (w + 8000) * MINUTE,  # false alarm
    ]
    s = score_detector("x", [(events, _sim(incs, minutes, excess))], warmup)
    assert (s.regressions, s.detected) == (4, 2)
    assert (s.regressions_target, s.detected_target) == (3, 2)
    assert s.recall == pytest.approx(0.5)
    assert s.recall_target == pytest.approx(2 / 3)
    assert sorted(s.delays_minutes) == [10.0, 30.0]
    assert s.median_delay_minutes == pytest.approx(20.0)
    assert s.false_alarms == 1
    assert s.node_weeks == pytest.approx(1.0)
    assert s.false_alarms_per_node_week == pytest.approx(1.0)
    assert s.usd_before_detection == pytest.approx(10.0)  # 10 minutes × $1 before the step was caught
    assert set(s.missed) == {"util_drop ×1.1", "intermittent ×2"}


def test_detection_before_visible_onset_counts_as_zero_delay() -> None:
    minutes = int(2 * WEEK / MINUTE)
    w = int(WEEK / MINUTE)
    incs = (_inc("drift", w + 100, w + 3000, factor=2.0, visible_min=w + 900),)
    s = score_detector("x", [([T0 + (w + 500) * MINUTE], _sim(incs, minutes))], WEEK)
    assert s.delays_minutes == (0.0,)


def test_false_alarm_breakdown_names_the_rule_that_raised_each_false_alarm() -> None:
    from infercost_bench.detection import NodeRun, false_alarm_breakdown

    incs = (_inc("step", 100, 200), _inc("long_prompts", 300, 400))
    m = MINUTE
    intervals = {
        # starts the merged event at 310 (in the long-prompt day) and one at 500 (normal traffic)
        "roofline_efficiency_drop": [(T0 + 310 * m, T0 + 330 * m), (T0 + 500 * m, T0 + 510 * m)],
        # joins the 310 event later (not its raiser), detects the step at 120, and ties at 500
        "cost_anomaly": [
            (T0 + 320 * m, T0 + 340 * m),
            (T0 + 120 * m, T0 + 130 * m),
            (T0 + 500 * m, T0 + 505 * m),
        ],
        # alone at 700: normal traffic; before the warm-up end (minute 50): not counted
        "ttft_p99_high": [(T0 + 700 * m, T0 + 720 * m), (T0 + 10 * m, T0 + 20 * m)],
    }
    run = NodeRun("azure", 1, "n", T0, 1000, m, incs, np.zeros(1000), intervals, {}, 0.0)
    out = false_alarm_breakdown([run], list(intervals), warmup=50 * m)
    assert out == {
        ("azure", "roofline_efficiency_drop", "long_prompts"): 1,
        ("azure", "cost_anomaly+roofline_efficiency_drop", "normal traffic"): 1,
        ("azure", "ttft_p99_high", "normal traffic"): 1,
    }


def test_a_drift_is_clocked_from_the_minute_it_is_1_2x_up_and_a_small_step_from_10_percent() -> None:
    from dataclasses import replace

    minutes = int(2 * WEEK / MINUTE)
    w = int(WEEK / MINUTE)
    drift = replace(
        _inc("drift", w + 1000, w + 4000, factor=1.5, visible_min=w + 1500),
        at_target=T0 + (w + 1700) * MINUTE,
    )
    small = _inc("step", w + 5000, w + 5300, factor=1.1, visible_min=w + 5000)  # never 1.2× up
    # a drift that reached 1.2× in one minute but 1.15× over its busy minutes: clocked from 10 % up
    mild = replace(
        _inc("drift", w + 6000, w + 8000, factor=1.15, visible_min=w + 6500),
        at_target=T0 + (w + 7000) * MINUTE,
    )
    events = [T0 + (w + 1730) * MINUTE, T0 + (w + 5012) * MINUTE, T0 + (w + 7100) * MINUTE]
    s = score_detector("x", [(events, _sim((drift, small, mild), minutes))], WEEK)
    assert s.delays_minutes == (30.0, 12.0, 600.0)
    assert s.delays_from_visible_minutes == (230.0, 12.0, 600.0)
    assert s.median_delay_minutes == 30.0 and s.median_delay_from_visible_minutes == 230.0
    # the recall target's population (realised ≥ 1.2×): the drift only
    assert s.delays_target_minutes == (30.0,) and s.median_delay_target_minutes == 30.0


def test_the_issues_targets_pool_each_models_seeds_and_judge_the_worst_model() -> None:
    """Per traffic model its seeds' nodes pooled (the issue's targets); the worst model judged."""
    from infercost_bench.detection import NodeRun, pooled_targets

    m = MINUTE
    minutes = int(2 * WEEK / MINUTE)
    w = int(WEEK / MINUTE)
    step = _inc("step", w + 100, w + 400, factor=1.5)

    def run(gen: str, seed: int, fired: list[tuple[float, float]]) -> NodeRun:
        return NodeRun(
            gen, seed, f"{gen}-{seed}", T0, minutes, m, (step,), np.zeros(minutes), {"r": fired}, {}, 0.0
        )

    hit = [(T0 + (w + 110) * m, T0 + (w + 130) * m)]
    false = [(T0 + (w + 2000) * m, T0 + (w + 2010) * m), (T0 + (w + 3000) * m, T0 + (w + 3010) * m)]
    runs = [
        run("core", 1, hit),
        run("core", 2, hit),
        run("azure", 1, hit + false),  # 2 false alarms in one node-week
        run("azure", 2, []),  # the step missed
    ]
    out = pooled_targets(runs, ["core", "azure"], {"combined": ["r"], "forest": []}, WEEK)
    core, azure = out["figures"]["core"], out["figures"]["azure"]
    assert core["recall_target"] == 1.0 and core["false_alarms_per_node_week"] == 0.0
    assert azure["recall_target"] == 0.5 and azure["false_alarms_per_node_week"] == 1.0  # 2 over 2 weeks
    assert azure["median_delay_target_minutes"] == 10.0 and azure["forest_recall_target"] == 0.0
    worst = out["lines"][-1]
    assert (
        "recall 50 % (≥ 95 %: MISSED)" in worst and "false alarms 1.00 per node-week (≤ 0.5: MISSED)" in worst
    )
    assert "p50 delay 10 m (≤ 15 m: met)" in worst
