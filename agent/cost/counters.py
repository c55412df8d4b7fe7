"""A counter summed over several series, differenced series by series (pure).

An engine may export one counter as several series that the adapter sums: one per data-parallel
rank (vLLM ``engine=0,1``), per model version (Triton), per metric name (llama.cpp cached and
uncached prompt tokens). Differencing the *sum* goes wrong whenever one series restarts, appears
or vanishes for a scrape: the sum drops and is read as a reset, so every other series' whole
history is counted again. So the window join keeps the last value of every series it has seen,
including series that are missing from the latest scrape, and:

- a series seen before is differenced against its own last value (reset-safe: a series that went
  down counts its new value, as Prometheus ``increase()`` does);
- a series never seen before counts in full (it started from zero since the last scrape);
- a series missing from this scrape adds nothing, and its last value is kept, so when it comes
  back only what it made meanwhile counts.

The engine adapters name every series of a counter, a lone one too, so each is differenced against
itself. A reading without names (a source that only gives the sum) is matched to the remembered
series it continues (the one with the largest value not above it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from agent.cost.quantiles import counter_delta


@dataclass(frozen=True, slots=True)
class CounterMemory:
    """What the join remembers of one counter: the last value of each series it has seen."""

    series: Mapping[str, float] = field(default_factory=dict)  # named series → last value
    anonymous: float | None = None  # last value of an unnamed reading that matched no named series
    current: str | None = None  # the named series the last unnamed reading continued


def _closest_below(series: Mapping[str, float], value: float) -> str | None:
    """The series whose last value is the largest one not above ``value`` (None if none is)."""
    best: str | None = None
    for k, v in series.items():
        if v <= value and (best is None or v > series[best]):
            best = k
    return best


def _closest_above(parts: Mapping[str, float], value: float) -> str | None:
    """The series in ``parts`` whose value is the smallest one not below ``value`` (None if none is)."""
    best: str | None = None
    for k, v in parts.items():
        if v >= value and (best is None or v < parts[best]):
            best = k
    return best


def counter_increase(
    memory: CounterMemory | None, total: float | None, parts: Mapping[str, float] | None
) -> tuple[float | None, CounterMemory | None]:
    """(what the counter added since the last reading, the memory to keep).

    ``total`` is the summed value as scraped (None or NaN: the counter is not exposed this time);
    ``parts`` its series by name when there are several. The increase is None without a previous
    reading (the first scrape sets the baseline) and never negative.
    """
    if total is None or math.isnan(total):
        return None, memory
    if parts:
        if memory is None:
            return None, CounterMemory(dict(parts))
        known = dict(memory.series)
        if memory.anonymous is not None:
            # the previous reading was one unnamed series: it continues one of these
            k = _closest_above(parts, memory.anonymous)
            if k is not None:
                known[k] = memory.anonymous
        added = sum(counter_delta(known.get(k, 0.0), v) or 0.0 for k, v in parts.items())
        known.update(parts)
        return added, CounterMemory(known)
    if memory is None:
        return None, CounterMemory(anonymous=total)
    if memory.current is not None and memory.current in memory.series:
        prev = memory.series[memory.current]
        return counter_delta(prev, total), CounterMemory(
            {**memory.series, memory.current: total}, current=memory.current
        )
    if memory.anonymous is not None:
        return counter_delta(memory.anonymous, total), CounterMemory(memory.series, anonymous=total)
    k = _closest_below(memory.series, total)
    if k is None:  # every remembered series is above it: the one left restarted
        return total, CounterMemory(memory.series, anonymous=total)
    return total - memory.series[k], CounterMemory({**memory.series, k: total}, current=k)
