"""Engine outages in the detection benchmark's scoring: an outage of 5 minutes or more is an incident
``engine_down`` must page (an event in it is its page, not a false alarm); anything else that pages
as an outage is a false page (pure scoring, no simulation)."""

from __future__ import annotations

import numpy as np

from infercost_bench.detection import NodeRun, detector_events, outage_pages, outside_outages, score_detector
from infercost_sim.workload import MINUTE, WEEK, Incident

T0 = 1_704_067_200.0
WARMUP = 7 * 86400.0


def _run(
    intervals: dict[str, list[tuple[float, float]]], outages: tuple[tuple[float, float], ...]
) -> NodeRun:
    minutes = int(2 * WEEK // MINUTE)
    step = Incident("step", T0 + 8 * 86400.0, T0 + 8 * 86400.0 + 4 * 3600.0, 1.5, True, realised=1.5)
    return NodeRun(
        "core", 1, "n", T0, minutes, 60.0, (step,), np.zeros(minutes), intervals, {}, 0.0, outages=outages,
    )  # fmt: skip


def test_an_outage_is_paged_and_its_page_is_no_false_alarm() -> None:
    out = (T0 + 9 * 86400.0, T0 + 9 * 86400.0 + 20 * MINUTE)
    blip = T0 + 10 * 86400.0
    run = _run(
        {
            "engine_down": [(out[0] + 5 * MINUTE, out[1] + MINUTE), (blip, blip + 2 * MINUTE)],
            "cost_per_token_regression": [(T0 + 8 * 86400.0 + 600.0, T0 + 8 * 86400.0 + 7200.0)],
        },
        (out,),
    )
    paged, n, delays, false = outage_pages([run], WARMUP)
    assert (paged, n, delays, false) == (1, 1, [5.0], 1)  # the blip's page is a false page
    events = detector_events(run.intervals, ["engine_down", "cost_per_token_regression"])
    assert outside_outages(events, run) == [T0 + 8 * 86400.0 + 600.0, blip]
    score = score_detector("defaults", [(events, run)], WARMUP)
    assert score.detected == 1 and score.false_alarms == 1  # the blip, not the outage's page


def test_an_unpaged_outage_counts_against_engine_down() -> None:
    out = (T0 + 9 * 86400.0, T0 + 9 * 86400.0 + 20 * MINUTE)
    paged, n, _, false = outage_pages([_run({"engine_down": []}, (out,))], WARMUP)
    assert (paged, n, false) == (0, 1, 0)
    # an outage in the warm-up week is not scored
    early = (T0 + 86400.0, T0 + 86400.0 + 20 * MINUTE)
    assert outage_pages([_run({"engine_down": [(early[0] + 300, early[1])]}, (early,))], WARMUP)[:2] == (0, 0)
