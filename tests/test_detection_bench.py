"""The detection benchmark through the real agent path on a small simulated node (2 weeks)."""

from __future__ import annotations

import numpy as np
import pytest

from infercost_bench.detection import (
    DETECTORS,
    PHASES,
    SCORED_RULES,
    NodeRun,
    detector_events,
    format_worst_table,
    run_node,
    score_detector,
)

pytestmark = pytest.mark.slow  # two simulated weeks through the join, the store, the forest and the rules


@pytest.fixture(scope="module")
def node_run() -> NodeRun:
    return run_node(("core", 3, 0, 2.0))


def test_every_rule_is_evaluated_by_the_real_pipeline(node_run: NodeRun) -> None:
    assert set(SCORED_RULES) <= set(node_run.intervals)
    assert "literal_1_5x_7d_mean" in node_run.intervals
    # the literal "1.5 × 7-day mean" rule pages on the week's troughs: it fires, the others are judged
    assert node_run.intervals["literal_1_5x_7d_mean"]
    assert node_run.incidents and any(i.regression for i in node_run.incidents)


def test_scores_and_the_worst_case_table(node_run: NodeRun) -> None:
    warmup = 7 * 86400.0
    scores = {
        d: score_detector(d, [(detector_events(node_run.intervals, [d]), node_run)], warmup)
        for d in ("cost_per_token_regression", "literal_1_5x_7d_mean")
    }
    regressions = [i for i in node_run.incidents if i.regression and i.start >= node_run.start + warmup]
    assert scores["literal_1_5x_7d_mean"].regressions == len(regressions)
    assert scores["literal_1_5x_7d_mean"].node_weeks == pytest.approx(1.0)
    lines = format_worst_table({("core", 3): scores}, list(scores))
    assert lines[0].startswith("detector / rule") and len(lines) == 3
    assert all(d in DETECTORS for d in ("literal", "defaults", "forest", "combined"))


def test_excess_dollars_are_never_negative(node_run: NodeRun) -> None:
    assert all(i.excess_usd >= 0 for i in node_run.incidents)
    assert np.isfinite(node_run.excess_usd_per_minute).all()


def test_cpu_seconds_are_reported_per_phase(node_run: NodeRun) -> None:
    assert tuple(node_run.cpu_seconds) == PHASES
    assert all(v >= 0.0 for v in node_run.cpu_seconds.values())
    # two weeks of 1-minute ticks: every phase ran (the forest fitted and scored, the rules stepped)
    assert all(node_run.cpu_seconds[p] > 0.0 for p in PHASES)
