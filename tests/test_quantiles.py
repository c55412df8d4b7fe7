"""Counter and histogram deltas (Prometheus increase() semantics) and histogram_quantile."""

from __future__ import annotations

import itertools
import math

import pytest

from agent.cost.quantiles import counter_delta, histogram_delta, quantile
from agent.samples import Histogram

INF = math.inf


@pytest.mark.parametrize(
    ("prev", "cur", "expected"),
    [
        (None, 10.0, None),  # no baseline yet
        (10.0, None, None),  # series vanished
        (10.0, 25.0, 15.0),
        (10.0, 10.0, 0.0),
        (1000.0, 40.0, 40.0),  # reset: everything since the restart
        (5.0, 0.0, 0.0),  # reset to zero
        (math.nan, 3.0, None),
    ],
)
def test_counter_delta(prev: float | None, cur: float | None, expected: float | None) -> None:
    assert counter_delta(prev, cur) == expected


def h(*buckets: tuple[float, float], total: float = 0.0) -> Histogram:
    return Histogram(buckets=tuple(buckets), sum=total, count=buckets[-1][1])


def test_histogram_delta_subtracts_bucket_by_bucket() -> None:
    prev = h((0.1, 2), (1.0, 5), (INF, 6), total=3.0)
    cur = h((0.1, 4), (1.0, 9), (INF, 12), total=7.5)
    assert histogram_delta(prev, cur) == h((0.1, 2), (1.0, 4), (INF, 6), total=4.5)


def test_histogram_delta_reset_gives_cur_layout_change_gives_none() -> None:
    prev = h((0.1, 20), (1.0, 50), (INF, 60), total=30.0)
    after_restart = h((0.1, 1), (1.0, 2), (INF, 2), total=0.7)
    assert histogram_delta(prev, after_restart) == after_restart
    torn = h((0.1, 19), (1.0, 55), (INF, 61), total=31.0)  # one bucket went down: a reset
    assert histogram_delta(prev, torn) == torn
    other_layout = h((0.5, 1), (INF, 2), total=0.7)
    assert histogram_delta(prev, other_layout) is None
    assert histogram_delta(None, prev) is None


def test_deltas_never_negative_over_a_restart_sequence() -> None:
    readings = [0.0, 10.0, 25.0, 3.0, 8.0, 8.0, 0.0, 4.0]
    deltas = [counter_delta(a, b) for a, b in itertools.pairwise(readings)]
    assert deltas == [10.0, 15.0, 3.0, 5.0, 0.0, 0.0, 4.0]


# Hand-computed with Prometheus' bucketQuantile: rank = q × count, linear inside the bucket.
HIST = h((0.1, 10), (0.5, 60), (1.0, 90), (INF, 100))


@pytest.mark.parametrize(
    ("hist", "q", "expected"),
    [
        (HIST, 0.5, 0.1 + 0.4 * (50 - 10) / 50),  # rank 50 in (0.1, 0.5]: 0.42
        (HIST, 0.05, 0.05),  # first bucket starts at 0: 0.1 × 5/10
        (HIST, 0.9, 1.0),  # rank 90 lands exactly on the 1.0 bound
        (HIST, 0.99, 1.0),  # rank in +Inf bucket → highest finite bound
        (HIST, 1.0, 1.0),
        (h((-1.0, 5), (0.0, 10), (INF, 10)), 0.2, -1.0),  # first bound ≤ 0 is returned as is
        (h((0.1, 0), (INF, 0)), 0.5, None),  # no observations
        (Histogram(buckets=((0.1, 3), (1.0, 5)), sum=1, count=5), 0.5, None),  # no +Inf bucket
        (Histogram(buckets=((INF, 5),), sum=1, count=5), 0.5, None),  # fewer than two buckets
        (h((1.0, 4), (0.5, 2), (INF, 4)), 0.5, 0.5),  # unsorted input is sorted: rank 2 → 0.5
        # a torn read (1.0 bucket below 0.5's) is raised to 4 first: rank 5 in (1, 2] → 1 + 1 × 1/2
        (h((0.5, 4), (1.0, 2), (2.0, 6), (INF, 8)), 0.625, 1.5),
    ],
)
def test_quantile_matches_prometheus_histogram_quantile(
    hist: Histogram, q: float, expected: float | None
) -> None:
    got = quantile(hist, q)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


def test_quantile_rejects_q_outside_unit_interval() -> None:
    with pytest.raises(ValueError):
        quantile(HIST, 1.5)
