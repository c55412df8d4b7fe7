"""Trailing baselines, computed incrementally over 1-minute records (pure: no clock, no I/O).

A baseline answers "what is this signal normally?" over a trailing window (7 days, 1 day, ...),
optionally only over minutes *like* the current one: the same load band, a minimum load, or the
same hour of the week. Two statistics:

- ``mean``: the signal's own formula applied to the *sums* of its inputs over the baseline minutes,
  i.e. a ratio of sums (Σcost / Σtokens for $/1M tokens), never a mean of per-minute ratios;
- ``median`` / ``pNN``: a quantile of the per-minute values.

:class:`TrailingBaseline` keeps one bucket per (baseline key, bucket id): the minutes in the
window as columns of C numbers (``array``: a week of minutes of dozens of series fits in a few
MB) with the inputs' running sums (mean) or the values sorted (quantiles). Adding a minute and reading the
baseline are O(1) amortised (O(log n) + memmove for quantiles), so the rule evaluator can step
through weeks of simulated minutes in seconds. Expiry is lazy: a bucket drops its old minutes
when it is next touched.

:func:`baseline_of` is the same arithmetic over a batch of records (the deploy comparison reads
the store and asks it): one implementation of every baseline, over records; the store only
persists them.
"""

from __future__ import annotations

import bisect
from array import array
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from agent.records import MINUTE, SIGNALS, MinuteRecord, hour_of_week, load_band, mean_of

WEEK = 7 * 86400.0  # seconds: the default baseline window


def interpolate(ordered: Sequence[float], q: float) -> float | None:
    """The q-quantile (0–1) of already sorted values, linear between ranks; None when empty."""
    n = len(ordered)
    if n == 0:
        return None
    pos = q * (n - 1)
    lo = int(pos)
    hi = min(lo + 1, n - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def stat_quantile(stat: str) -> float | None:
    """The quantile (0–1) a statistic names: None for ``mean``, 0.5 for ``median``, 0.9 for ``p90``."""
    if stat == "mean":
        return None
    if stat == "median":
        return 0.5
    return float(stat.removeprefix("p")) / 100.0


class _Bucket:
    """One bucket's minutes, oldest first, in flat columns of C numbers (``array``).

    A week of minutes of a few dozen series is hundreds of thousands of rows per rule: as Python
    tuples of floats a row cost ~250 bytes, as columns 8 bytes a number. A row holds what the
    statistic needs: the inputs (a mean is a ratio of their sums) or the value (a quantile). The
    minutes themselves are kept as runs of consecutive minutes (first minute, length): a series
    stays in one load band for many minutes in a row, so a run stands for dozens of rows."""

    __slots__ = ("head", "held", "lengths", "ordered", "rows", "starts", "sums")
    sums: list[float]  # running sums of the inputs held (mean); set whenever the bucket is empty

    def __init__(self) -> None:
        self.starts = array("d")  # epoch seconds: the first minute of each run, in arrival order
        # minutes in each run, the first run's first `head` expired (doubles: whole numbers are exact)
        self.lengths = array("d")
        self.head = 0  # minutes of the first run that have expired
        self.held = 0  # minutes held (rows)
        self.rows = array("d")  # per minute, in arrival order: its inputs (mean) or its value (quantile)
        self.ordered = array("d")  # the values held, sorted (quantile)

    def push(self, minute: float) -> None:
        """One more minute: it extends the last run when it is that run's next minute."""
        lengths = self.lengths
        if self.starts and minute == self.starts[-1] + MINUTE * lengths[-1]:
            lengths[-1] += 1
        else:
            self.starts.append(minute)
            lengths.append(1)
        self.held += 1

    def drop_before(self, horizon: float) -> int:
        """Forget the oldest minutes while they start before ``horizon``; returns how many."""
        starts, lengths = self.starts, self.lengths
        k = 0
        while starts and starts[0] + MINUTE * self.head < horizon:
            k += 1
            self.head += 1
            if self.head == lengths[0]:
                del starts[0]
                del lengths[0]
                self.head = 0
        self.held -= k
        return k


class TrailingBaseline:
    """A trailing window of per-minute inputs per bucket, with a mean (ratio of sums) or quantiles.

    ``fn`` turns a vector of summed inputs into the signal (None when undefined); ``window`` is in
    seconds; ``quantiles`` says which statistic it keeps: the per-minute values, sorted, for
    :meth:`quantile`, or else the inputs' running sums for :meth:`mean`. ``lag`` (seconds) holds
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
        k = b.drop_before(now - self.window)
        rows = b.rows
        if self._quantiles:
            ordered = b.ordered
            for value in rows[:k]:
                del ordered[bisect.bisect_left(ordered, value)]
            del rows[:k]
        else:
            n = self._n
            for i, v in enumerate(rows[: k * n]):
                b.sums[i % n] -= v
            del rows[: k * n]
        if not b.held:
            b.sums = [0.0] * self._n  # a new bucket's sums, or an emptied one's without float drift

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
            b = _Bucket()  # its sums start at zero: expiring an empty bucket sets them
            self._buckets[bucket] = b
        self._expire(b, minute)
        b.push(minute)
        if self._quantiles:
            b.rows.append(value)
            bisect.insort(b.ordered, value)
        else:
            b.rows.extend(inputs)
            sums = b.sums
            for i, v in enumerate(inputs):
                sums[i] += v

    def count(self, bucket: Hashable, now: float) -> int:
        """Minutes in the bucket's window ending at ``now``."""
        self._promote(now)
        b = self._buckets.get(bucket)
        if b is None:
            return 0
        self._expire(b, now)
        return b.held

    def oldest(self, bucket: Hashable, now: float) -> float | None:
        """The start of the oldest minute in the bucket's window ending at ``now`` (None: empty)."""
        self._promote(now)
        b = self._buckets.get(bucket)
        if b is None:
            return None
        self._expire(b, now)
        return b.starts[0] + MINUTE * b.head if b.held else None

    def mean(self, bucket: Hashable, now: float) -> tuple[float | None, int]:
        """(signal over the summed inputs, minutes) for the window ending at ``now``; a baseline
        built for quantiles keeps no sums and raises TypeError."""
        if self._quantiles:
            raise TypeError("this baseline keeps per-minute values for quantile(), not sums for mean()")
        self._promote(now)
        b = self._buckets.get(bucket)
        if b is None:
            return None, 0
        self._expire(b, now)
        if not b.held:
            return None, 0
        return self._fn(b.sums), b.held

    def quantile(self, bucket: Hashable, now: float, q: float) -> tuple[float | None, int]:
        """(q-quantile of the per-minute values, minutes), linear interpolation; q in 0–1; a
        baseline built for means keeps no values and raises TypeError."""
        if not self._quantiles:
            raise TypeError("this baseline keeps sums for mean(), not per-minute values for quantile()")
        self._promote(now)
        b = self._buckets.get(bucket)
        if b is None:
            return None, 0
        self._expire(b, now)
        return interpolate(b.ordered, q), len(b.ordered)


# What "load" is for like-load bands: generation tokens/s, or requests in flight (a gauge).
_LOADS: dict[str, Callable[[Mapping[str, float], float], float | None]] = {
    "generation_tokens_per_second": lambda _sums, tps: tps,
    "requests_running": lambda sums, _tps: mean_of(sums, "running"),
}


@dataclass(frozen=True, slots=True)
class Baseline:
    """A baseline value and how many minutes it came from."""

    value: float | None  # in the signal's unit; None when no comparable minute exists
    minutes: int


def baseline_of(
    records: Iterable[MinuteRecord],
    signal: str,
    end: float,
    window: float = WEEK,
    stat: str = "mean",
    min_tokens_per_second: float | None = None,
    band_of: float | None = None,
    band_ratio: float = 2.0,
    same_hour_of_week_as: float | None = None,
    band_signal: str = "generation_tokens_per_second",
) -> Baseline:
    """A trailing baseline of ``signal`` over the records' minutes in [end - window, end).

    ``stat``: ``mean`` (ratio of sums over the comparable minutes), ``median`` or ``pNN``
    (quantile of per-minute values). Comparable minutes: at least ``min_tokens_per_second``
    (generation tokens/s); in the same load band as ``band_of`` (bands ``band_ratio`` wide) of
    ``band_signal`` (tokens/s, or ``requests_running``: requests in flight); in the same hour of
    the week as ``same_hour_of_week_as``. Records of several series (e.g. every version of a
    model) are summed per minute first; records of another kind than the signal's are ignored.
    """
    sig = SIGNALS[signal]
    if band_signal not in _LOADS:
        raise ValueError(f"unknown band signal {band_signal!r}: use one of {sorted(_LOADS)}")
    per_minute: dict[float, dict[str, float]] = {}
    for r in records:
        if r.kind != sig.kind or not end - window <= r.minute < end:
            continue
        acc = per_minute.setdefault(r.minute, {})
        for k, v in r.sums.items():
            acc[k] = acc.get(k, 0.0) + v
    want_band = load_band(band_of, band_ratio) if band_of is not None else None
    want_how = hour_of_week(same_hour_of_week_as) if same_hour_of_week_as is not None else None
    q = stat_quantile(stat)
    acc_baseline = TrailingBaseline(window, sig.fn, len(sig.inputs), q is not None)
    for minute in sorted(per_minute):
        sums = per_minute[minute]
        vec = tuple(sums.get(n, 0.0) for n in sig.inputs)
        value = sig.fn(vec)
        if value is None:
            continue
        secs = sums.get("seconds", 0.0)
        tps = sums.get("generation_tokens", 0.0) / secs if secs > 0 else 0.0
        if min_tokens_per_second is not None and tps < min_tokens_per_second:
            continue
        if band_of is not None:
            load = _LOADS[band_signal](sums, tps)
            if load is None or load_band(load, band_ratio) != want_band:
                continue
        if want_how is not None and hour_of_week(minute) != want_how:
            continue
        acc_baseline.add(None, minute, vec, value)
    value, minutes = acc_baseline.mean(None, end) if q is None else acc_baseline.quantile(None, end, q)
    return Baseline(value, minutes)
