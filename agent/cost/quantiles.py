"""Counter and histogram arithmetic between two scrapes, and histogram quantiles (pure).

Engines export cumulative counters and histograms; a restart sets them back to zero. These
functions turn two cumulative readings into what happened in between, with Prometheus'
``increase()`` semantics for resets, and estimate quantiles the way ``histogram_quantile()`` does,
so the agent's numbers agree with a team's PromQL over the same series.
"""

from __future__ import annotations

import math

from agent.samples import Histogram


def counter_delta(prev: float | None, cur: float | None) -> float | None:
    """What a cumulative counter added between two readings; never negative.

    - either reading absent (``None`` or NaN) → ``None``: no baseline yet, or the engine stopped
      exposing the series;
    - ``cur < prev`` → a reset (the engine restarted): ``cur``, everything counted since the
      restart (Prometheus ``increase()``; what was added between ``prev`` and the restart is lost);
    - otherwise ``cur - prev``.
    """
    if prev is None or cur is None or math.isnan(prev) or math.isnan(cur):
        return None
    if cur < prev:
        return cur
    return cur - prev


def _is_reset(prev: Histogram, cur: Histogram) -> bool:
    if cur.count < prev.count:
        return True
    return any(c < p for (_, c), (_, p) in zip(cur.buckets, prev.buckets, strict=True))


def histogram_delta(prev: Histogram | None, cur: Histogram) -> Histogram | None:
    """The observations ``cur`` added since ``prev`` (both cumulative, same series).

    - ``prev`` is ``None`` → ``None``: no baseline yet (like :func:`counter_delta`);
    - the bucket layout changed (other ``le`` bounds: the engine restarted with other buckets)
      → ``None``: the two cannot be subtracted, and ``cur`` alone holds history from before the
      window, so it is not a delta either;
    - a reset (the count or any bucket went down) → ``cur``, everything since the restart;
    - otherwise bucket-by-bucket, sum and count differences.
    """
    if prev is None:
        return None
    if tuple(le for le, _ in prev.buckets) != tuple(le for le, _ in cur.buckets):
        return None
    if _is_reset(prev, cur):
        return cur
    return Histogram(
        buckets=tuple((le, c - p) for (le, c), (_, p) in zip(cur.buckets, prev.buckets, strict=True)),
        sum=cur.sum - prev.sum,
        count=cur.count - prev.count,
    )


def quantile(h: Histogram, q: float) -> float | None:
    """The ``q``-quantile (0 ≤ q ≤ 1) of a histogram, as Prometheus ``histogram_quantile`` does.

    Linear interpolation inside the bucket holding the rank, the first bucket starting at 0 (or
    at its bound when that is ≤ 0); a rank in the +Inf bucket gives the highest finite bound.
    ``None`` where Prometheus gives NaN: no +Inf bucket, fewer than two buckets, no observations.
    Buckets are sorted by bound, and a non-monotonic count (a torn read) is raised to the one
    before it, as Prometheus does.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be within [0, 1], got {q}")
    buckets = sorted(h.buckets)
    if len(buckets) < 2 or not math.isinf(buckets[-1][0]):
        return None
    bounds = [le for le, _ in buckets]
    counts: list[float] = []
    for _, c in buckets:
        counts.append(max(c, counts[-1]) if counts else c)
    observations = counts[-1]
    if observations <= 0:
        return None
    rank = q * observations
    b = next((i for i in range(len(buckets) - 1) if counts[i] >= rank), len(buckets) - 1)
    if b == len(buckets) - 1:
        return bounds[-2]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start = 0.0
    end = bounds[b]
    count = counts[b]
    if b > 0:
        start = bounds[b - 1]
        count -= counts[b - 1]
        rank -= counts[b - 1]
    if count == 0:  # q = 0 on an empty first bucket: Prometheus computes 0/0 (NaN)
        return None
    return start + (end - start) * (rank / count)
