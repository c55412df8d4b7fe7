"""The efficiency benchmark's scoring (infercost_bench/efficiency.py), on hand-made windows."""

from __future__ import annotations

import numpy as np
import pytest

from infercost_bench.efficiency import SCRAPE_S, TARGET_ERROR, _azure_readings, _Point, score
from infercost_sim.workload import DAY, MINUTE, WEEK, simulate_node


def test_a_row_scores_busy_windows_and_counts_impossible_truths_apart() -> None:
    points = [
        _Point(0.8, 0.72, 0.76, 0.1),  # error 10 % joined, 5 % full
        _Point(0.8, None, 0.84, 0.2),  # joined absent; full +5 %
        _Point(0.5, 0.45, None, 0.3),  # joined −10 %; full absent
        _Point(1.05, 0.99, 0.99, 0.4),  # truth above 1: not scored
        _Point(None, 0.98, 0.2, 0.0),  # not busy: not scored, but its figure counts for the highest
    ]
    joined = score("m", 5, points, "join")
    assert (joined.busy, joined.impossible_truth) == (3, 1)
    assert joined.present == pytest.approx(2 / 3)
    assert joined.median_error == pytest.approx(0.1)
    assert joined.median_bias == pytest.approx(-0.1)
    assert joined.highest == pytest.approx(0.99)
    assert joined.prefill_floor is None
    full = score("m", 5, points, "+prefill")
    assert full.median_error == pytest.approx(0.05)
    assert full.median_bias == pytest.approx(0.0)
    assert full.prefill_floor == pytest.approx(0.2)  # median over the three scored windows
    assert not full.met()  # present in 2 of 3 busy windows


def test_a_row_meets_its_targets_only_with_all_three() -> None:
    good = [_Point(0.8, 0.8 * (1 - TARGET_ERROR / 2), None, 0.0)] * 10
    assert score("m", 60, good, "join").met()
    assert not score("m", 60, [*good, _Point(0.8, 1.01, None, 0.0)], "join").met()  # a figure above 1
    assert not score("m", 60, [_Point(0.8, 0.6, None, 0.0)] * 10, "join").met()  # 25 % off
    assert not score("m", 60, [], "join").met()  # nothing busy: nothing shown


def test_the_azure_scrapes_count_first_tokens_when_made_and_finishes_when_they_finish() -> None:
    """vLLM observes TTFT at the step that makes the first token and the phase times (with the e2e
    count) when a request finishes: the Azure model's scrapes count each minute's first tokens as
    the requests its law prefilled, while its finishes are the drawn population's, which after a
    saturated minute drains the batch that minute admitted."""
    sim = simulate_node("azure", seed=7, weeks=DAY / WEEK, node="azure-7")
    ends = [r.signals for r in _azure_readings(sim)[int(MINUTE // SCRAPE_S) - 1 :: int(MINUTE // SCRAPE_S)]]
    first = np.diff([0.0, *(s.ttft_seconds.count for s in ends if s.ttft_seconds is not None)])
    done = np.diff([0.0, *(s.e2e_seconds.count for s in ends if s.e2e_seconds is not None)])
    assert len(first) == len(done) == sim.minutes
    assert first == pytest.approx(sim.trace.finished)
    running = sim.trace.running
    drained = np.flatnonzero((running[:-1] > 2.0 * running[1:]) & (running[1:] >= sim.physics.replicas)) + 1
    assert len(drained) > 0
    # the minutes after a fall of the batch by half or more finish more requests than they begin
    assert float(np.median(done[drained] / first[drained])) > 1.1
