"""Engine latency histograms re-based under infercost's labels: cumulative and never decreasing (pure).

The engines' TTFT, inter-token and end-to-end histograms carry the engine's own labels and start
again from zero when the engine restarts. The agent re-exports them per (node, engine, model,
model_version) as its own cumulative histograms, so a fleet can aggregate them with
``histogram_quantile(0.99, sum by (model, model_version, le) (rate(infercost_ttft_seconds_bucket[5m])))``.

Each tick the window join hands over what a histogram observed in the window
(:func:`agent.cost.quantiles.histogram_delta`: bucket differences; after an engine restart, what
the engine counted since it started). :func:`accumulate` adds that to the running total:

- a restart is read for the *whole* histogram, never bucket by bucket: if each bucket were
  differenced on its own (a counter reset per bucket), a bucket that went down would count its new
  value while a higher one that did not would count only its difference, and the total could end
  up with a lower bucket above a higher one — not a histogram any more. Reading the reset once
  keeps every bucket, ``_sum`` and ``_count`` monotonic in time *and* cumulative in ``le``;
- the engine's own ``le`` bounds are kept (never re-bucketed); a window whose bounds differ from
  the total's (the engine came back with another layout) carries the total over to the new
  bounds: a bound in both layouts continues where it was, a new bound starts from the total of the
  largest old bound below it (observations known to be at or below it), ``_sum`` and ``_count``
  continue. So no series ever goes down; a bound the engine dropped is no longer exported;
- a window that is not a histogram (a NaN or negative count or sum, buckets that decrease in
  ``le``, no ``+Inf`` bucket) adds nothing: that histogram is absent for the window, as the engine
  adapter already makes a hostile scrape absent. A total that would overflow to infinity stops.

``count`` of the result is its ``+Inf`` bucket (the Prometheus exposition's ``_count``).

What a window observed comes from :func:`histogram_increase`, the histogram counterpart of
:func:`agent.cost.counters.counter_increase`: an engine that splits a histogram over several
series (vLLM data-parallel ``engine`` ranks) has each series differenced against its own last
reading, and every series is remembered, so one rank restarting, or missing from a scrape and
coming back, is not read as a restart of the sum (which would count the other ranks' whole history
again). A series new since the last reading counts in full; a histogram missing from a scrape (the
engine refused it as hostile) adds nothing and keeps its last reading, so the next window counts
what happened meanwhile.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from agent.cost.quantiles import histogram_delta
from agent.samples import Histogram


def is_histogram(h: Histogram) -> bool:
    """True when ``h`` is one window's valid observations: finite non-negative counts and sum,
    counts non-decreasing in strictly increasing ``le`` bounds that are not negative (a latency),
    the last bound ``+Inf``."""
    if not h.buckets or h.buckets[-1][0] != math.inf:
        return False
    if not (0.0 <= h.sum < math.inf and 0.0 <= h.count < math.inf):
        return False
    if not h.buckets[0][0] >= 0.0:
        return False
    last_le = -math.inf
    last_count = 0.0
    for le, c in h.buckets:
        if not le > last_le or not last_count <= c < math.inf:  # also False for NaN
            return False
        last_le, last_count = le, c
    return True


def carry_over(total: Histogram, bounds: tuple[float, ...]) -> Histogram:
    """``total`` on other ``le`` bounds: each bound gets the total's count at the largest old bound
    not above it (0 below the first), ``+Inf`` the whole count; ``sum`` and ``count`` unchanged."""
    old = total.buckets
    out: list[tuple[float, float]] = []
    i = 0
    below = 0.0
    for le in bounds:
        while i < len(old) and old[i][0] <= le:
            below = old[i][1]
            i += 1
        out.append((le, below))
    return Histogram(buckets=tuple(out), sum=total.sum, count=total.count)


def accumulate(total: Histogram | None, delta: Histogram | None) -> Histogram | None:
    """The re-based cumulative histogram after one window's observations ``delta`` (see the
    module docstring); ``total`` unchanged when the window has none or they are not a histogram."""
    if delta is None or not is_histogram(delta):
        return total
    if total is None:
        return Histogram(buckets=delta.buckets, sum=delta.sum, count=delta.buckets[-1][1])
    bounds = tuple(le for le, _ in delta.buckets)
    if tuple(le for le, _ in total.buckets) != bounds:
        total = carry_over(total, bounds)
    buckets = tuple((le, a + b) for (le, a), (_, b) in zip(total.buckets, delta.buckets, strict=True))
    new_sum = total.sum + delta.sum
    if buckets[-1][1] == math.inf or new_sum == math.inf:
        return total
    return Histogram(buckets=buckets, sum=new_sum, count=buckets[-1][1])


@dataclass(frozen=True, slots=True)
class HistogramMemory:
    """What the window join remembers of one histogram: the last reading of each named series it
    has seen, and the last reading of the histogram as summed."""

    series: Mapping[str, Histogram] = field(default_factory=dict)  # series name → last reading
    total: Histogram | None = None  # the last reading when the engine names no series


def _summed(deltas: list[Histogram]) -> Histogram | None:
    """Bucket-by-bucket sum of deltas that share the first one's bounds (None without any)."""
    if not deltas:
        return None
    first = deltas[0]
    bounds = [le for le, _ in first.buckets]
    counts = [c for _, c in first.buckets]
    total_sum, total_count = first.sum, first.count
    for d in deltas[1:]:
        if [le for le, _ in d.buckets] != bounds:
            continue  # a series with other bounds cannot be added bucket by bucket
        counts = [a + b for a, (_, b) in zip(counts, d.buckets, strict=True)]
        total_sum += d.sum
        total_count += d.count
    return Histogram(tuple(zip(bounds, counts, strict=True)), total_sum, total_count)


def histogram_increase(
    memory: HistogramMemory | None, cur: Histogram | None, parts: Mapping[str, Histogram] | None
) -> tuple[Histogram | None, HistogramMemory | None]:
    """(what the histogram observed since the last reading, the memory to keep).

    ``cur`` is the histogram as summed by the adapter (None: not on this scrape), ``parts`` its
    series by name when the engine splits it. The observations are None without a previous
    reading (the first scrape sets the baseline); otherwise as :func:`histogram_delta`, series by
    series when named (see the module docstring)."""
    if cur is None:
        return None, memory
    if parts:
        if memory is None or not memory.series:
            return None, HistogramMemory(dict(parts))
        known = memory.series
        deltas: list[Histogram] = []
        for name, h in parts.items():
            prev = known.get(name)
            d = h if prev is None else histogram_delta(prev, h)
            if d is not None:
                deltas.append(d)
        return _summed(deltas), HistogramMemory({**known, **parts})
    if memory is None or memory.total is None:
        return None, HistogramMemory(memory.series if memory else {}, cur)
    return histogram_delta(memory.total, cur), HistogramMemory(memory.series, cur)
