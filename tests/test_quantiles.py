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
        (HIST, 0.0, 0.0),  # q = 0: the first bucket's lower edge
        (h((0.5, 3), (INF, 4)), 0.5, 0.5 * 2 / 3),  # two buckets: rank 2 of 3 in (0, 0.5]
        (h((0.1, 0), (0.5, 1), (INF, 1)), 0.5, 0.3),  # one observation: rank 0.5 in (0.1, 0.5]
        (h((-1.0, 0), (0.0, 0), (INF, 0)), 0.5, None),  # no observations, even with a bound ≤ 0
        (h((0.0, 0), (1.0, 10), (INF, 10)), 0.0, 0.0),  # q = 0 on an empty first bucket at 0
        (h((-1.0, 5), (1.0, 10), (INF, 10)), 0.2, -1.0),  # a rank in the first bucket, bound < 0
        # a rank exactly at a bucket's edge stays in that bucket (Prometheus: count ≥ rank),
        # even when the next bucket is empty: rank 60 → 0.5, not 1.0
        (h((0.1, 10), (0.5, 60), (1.0, 60), (INF, 100)), 0.6, 0.5),
        # five buckets, a rank in +Inf: the highest finite bound (2.0), not the third bound
        (h((0.1, 1), (0.5, 2), (1.0, 3), (2.0, 4), (INF, 10)), 0.9, 2.0),
        # five buckets, interpolated in the fourth: rank 7 of 10 in (1.0, 2.0] holding 3..8
        (h((0.1, 1), (0.5, 2), (1.0, 3), (2.0, 8), (INF, 10)), 0.7, 1.0 + 1.0 * 4 / 5),
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
    with pytest.raises(ValueError, match=r"within \[0, 1\], got 1.5"):
        quantile(HIST, 1.5)
    with pytest.raises(ValueError, match=r"got -0\.1"):
        quantile(HIST, -0.1)


def test_a_quiet_tick_is_no_reset() -> None:
    prev = h((0.1, 2), (1.0, 5), (INF, 6), total=3.0)
    assert histogram_delta(prev, prev) == h((0.1, 0), (1.0, 0), (INF, 0), total=0.0)
    # the count went up while one bucket stayed: no reset either
    cur = h((0.1, 2), (1.0, 6), (INF, 7), total=3.5)
    assert histogram_delta(prev, cur) == h((0.1, 0), (1.0, 1), (INF, 1), total=0.5)
