"""Trailing baselines, computed incrementally over 1-minute records (pure: no clock, no I/O).

A baseline answers "what is this signal normally?" over a trailing window (7 days, 1 day, ...),
optionally only over minutes *like* the current one: the same load band, a minimum load, or the
same hour of the week. Two statistics:

- ``mean``: the signal's own formula applied to the *sums* of its inputs over the baseline minutes,
  i.e. a ratio of sums (Σcost / Σtokens for $/1M tokens), never a mean of per-minute ratios;
- ``median`` / ``pNN``: a quantile of the per-minute values.

:class:`TrailingBaseline` keeps one bucket per (baseline key, bucket id): a deque of the minutes
in the window, running sums, and (for quantiles) a sorted list. Adding a minute and reading the
baseline are O(1) amortised (O(log n) + memmove for quantiles), so the rule evaluator can step
through weeks of simulated minutes in seconds. Expiry is lazy: a bucket drops its old minutes
when it is next touched.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Bucket:
    entries: deque[tuple[float, tuple[float, ...], float]] = field(default_factory=deque)
    sums: list[float] = field(default_factory=list)
    ordered: list[float] = field(default_factory=list)


class TrailingBaseline:
    """A trailing window of per-minute inputs per bucket, with mean (ratio of sums) and quantiles.

    ``fn`` turns a vector of summed inputs into the signal (None when undefined); ``window`` is in
    seconds; ``quantiles`` says whether sorted per-minute values are kept. ``lag`` (seconds) holds
    each minute back before it joins: a baseline must not learn the regression it is there to
    catch while the rule's ``for`` is still running.
    """

    def __init__(
        self,
        window: float,
        fn: Callable[[Sequence[float]], float | None],
        n_inputs: int,
        quantiles: bool,
        lag: float = 0.0,
    ) -> None:
        self.window = window  # seconds
        self.lag = lag  # seconds
        self._fn = fn
        self._n = n_inputs
        self._quantiles = quantiles
        self._buckets: dict[Hashable, _Bucket] = {}
        self._pending: deque[tuple[Hashable, float, tuple[float, ...], float]] = deque()

    def _promote(self, now: float) -> None:
        pending = self._pending
        while pending and pending[0][1] < now - self.lag:
            self._join(*pending.popleft())

    def _expire(self, b: _Bucket, now: float) -> None:
        horizon = now - self.window
        entries = b.entries
        while entries and entries[0][0] < horizon:
            _, inputs, value = entries.popleft()
            sums = b.sums
            for i, v in enumerate(inputs):
                sums[i] -= v
            if self._quantiles:
                del b.ordered[bisect.bisect_left(b.ordered, value)]
        if not entries:
            b.sums = [0.0] * self._n  # reset accumulated float drift

    def add(self, bucket: Hashable, minute: float, inputs: tuple[float, ...], value: float) -> None:
        """Add one minute (start time ``minute``, epoch seconds) whose signal value is ``value``;
        it counts once it is older than ``lag``."""
        if self.lag <= 0:
            self._join(bucket, minute, inputs, value)
            return
        self._pending.append((bucket, minute, inputs, value))
        self._promote(minute)

    def _join(self, bucket: Hashable, minute: float, inputs: tuple[float, ...], value: float) -> None:
        b = self._buckets.get(bucket)
        if b is None:
            b = _Bucket(sums=[0.0] * self._n)
            self._buckets[bucket] = b
        self._expire(b, minute)
        b.entries.append((minute, inputs, value))
        sums = b.sums
        for i, v in enumerate(inputs):
            sums[i] += v
        if self._quantiles:
            bisect.insort(b.ordered, value)

    def count(self, bucket: Hashable, now: float) -> int:
        """Minutes in the bucket's window ending at ``now``."""
        self._promote(now)
        b = self._buckets.get(bucket)
        if b is None:
            return 0
        self._expire(b, now)
        return len(b.entries)

    def mean(self, bucket: Hashable, now: float) -> tuple[float | None, int]:
        """(signal over the summed inputs, minutes) for the window ending at ``now``."""
        self._promote(now)
        b = self._buckets.get(bucket)
        if b is None:
            return None, 0
        self._expire(b, now)
        if not b.entries:
            return None, 0
        return self._fn(b.sums), len(b.entries)

    def quantile(self, bucket: Hashable, now: float, q: float) -> tuple[float | None, int]:
        """(q-quantile of the per-minute values, minutes), linear interpolation; q in 0–1."""
        self._promote(now)
        b = self._buckets.get(bucket)
        if b is None:
            return None, 0
        self._expire(b, now)
        vals = b.ordered
        n = len(vals)
        if n == 0:
            return None, 0
        pos = q * (n - 1)
        lo = int(pos)
        hi = min(lo + 1, n - 1)
        return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo), n
