"""The detection benchmark through the real agent path on a small simulated node (2 weeks)."""

from __future__ import annotations

import numpy as np
import pytest

from infercost_bench.detection import (
    DETECTORS,
    OUTAGE_PAGE_MINUTES,
    PHASES,
    SCORED_RULES,
    NodeRun,
    detector_events,
    engine_outages,
    format_worst_table,
    node_grid,
    outage_pages,
    run_node,
    score_detector,
    with_blips,
)
from infercost_sim.workload import MINUTE, simulate_node

pytestmark = pytest.mark.slow  # two simulated weeks through the join, the store, the forest and the rules


@pytest.fixture(scope="module")
def node_run() -> NodeRun:
    return run_node(("core", 3, 0, 2.0, 60.0))


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


def test_the_engine_nvml_and_gpu_rules_run_on_the_daemons_whole_history(node_run: NodeRun) -> None:
    # the store holds the engine scrapes, NVML rounds and GPU dollars as the daemon's does, so the
    # source rules are evaluated (and can false-alarm) like every other
    for rule in ("engine_down", "nvml_down", "gpu_lost"):
        assert rule in node_run.intervals
    paged, n, delays, false = outage_pages([node_run], 7 * 86400.0)
    # every engine outage of 5 minutes or more pages, within minutes; no failed scrape of 1–2
    # minutes (four per graded week) and nothing else pages as an outage
    assert paged == n and all(d <= OUTAGE_PAGE_MINUTES + 2 for d in delays)
    assert false == 0
    assert not node_run.intervals["nvml_down"] and not node_run.intervals["gpu_lost"]


def test_blips_are_short_and_outages_are_the_long_engine_gaps() -> None:
    sim = simulate_node("core", seed=300, weeks=2)
    blipped = with_blips(sim, np.random.default_rng(0))
    new = ~blipped.drivers.engine_up & sim.drivers.engine_up
    runs = np.diff(np.flatnonzero(np.diff(np.concatenate(([0], new.astype(int), [0])))))[::2]
    assert len(runs) == 4 and all(1 <= r <= 2 for r in runs)  # four blips of 1–2 minutes in week 2
    for a, b in engine_outages(blipped):
        assert b - a >= OUTAGE_PAGE_MINUTES * MINUTE
        m = int((a - sim.start) // MINUTE)
        assert not blipped.drivers.engine_up[m]


def test_the_grid_has_one_15s_node_per_model_and_5_minute_history() -> None:
    jobs = node_grid(("core", "azure"), [111, 112, 113], 3, 2.0)
    scrape = [j[4] for j in jobs]
    assert scrape.count(15.0) == 2 and {j[0] for j in jobs if j[4] == 15.0} == {"core", "azure"}
    assert scrape.count(300.0) == 6 and scrape.count(60.0) == 10


def test_an_outage_is_what_the_scrapes_see_of_it() -> None:
    # at 60 s scrapes a gap of 4 minutes is not an outage to page and one of 5 is; at a 5-minute
    # interval a failed minute that a scrape reads is one failed scrape, 5 minutes long (it pages),
    # and one between two scrapes is not seen at all
    from dataclasses import replace

    sim = simulate_node("core", seed=300, weeks=1)
    up = np.ones(sim.minutes, dtype=bool)
    up[100:104] = False  # 4 minutes
    up[200:205] = False  # 5 minutes
    up[299] = False  # the minute the 5-minute scrape at 300 min reads
    up[401] = False  # between two 5-minute scrapes
    agent = np.ones(sim.minutes, dtype=bool)
    gaps = replace(sim, drivers=replace(sim.drivers, engine_up=up, agent_up=agent), tick_seconds=60.0)
    assert engine_outages(gaps) == ((sim.start + 200 * MINUTE, sim.start + 205 * MINUTE),)
    coarse = replace(gaps, tick_seconds=300.0)
    # the 5-minute gap's last minute is read by the scrape at 205 min: one failed scrape too
    assert engine_outages(coarse) == tuple(
        (sim.start + a * MINUTE, sim.start + (a + 5) * MINUTE) for a in (200, 295)
    )
    fine = replace(gaps, tick_seconds=15.0)
    assert engine_outages(fine) == engine_outages(gaps)
