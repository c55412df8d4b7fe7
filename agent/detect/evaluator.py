"""The rule evaluator: pure and incremental, minute by minute over 1-minute records.

``RuleEvaluator(rules).step(now, records)`` returns the :class:`Finding` of every series whose
condition holds for the minute ending at ``now``; it keeps each rule's trailing window per series
and its baselines in memory (see :mod:`agent.detect.rules` for the schema and the loader, and
:mod:`agent.detect.alerts` for the lifecycle that turns findings into alerts). Evaluating one
minute costs O(rules × series): weeks of minutes evaluate in seconds.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.detect.baselines import TrailingBaseline
from agent.detect.rules import OPS, Rule, RuleSet
from agent.records import MINUTE, SIGNALS, Labels, MinuteRecord, hour_of_week, load_band
from agent.safe_regex import compile_safe

logger = logging.getLogger(__name__)

# With ``like_load.per_minute``, a window is judged only when the minutes that have a baseline
# hold at least this share of its weight (the signal's denominator: tokens, seconds). Why a half:
# the verdict is on the covered minutes alone, so they must carry at least as much of the window's
# traffic as the minutes (a new band, a new mix) that nothing is compared with.
PER_MINUTE_COVER = 0.5


def _toward(a: float, b: float, t: float) -> float:
    """``a`` moved geometrically towards ``b`` by ``t`` (0: a, 1: b; negative: away from b)."""
    return a * math.exp(t * math.log(b / a))


@dataclass(frozen=True, slots=True)
class Finding:
    """A rule's condition holds for one series at one minute."""

    rule_id: str
    labels: Labels  # the series (the rule's group labels)
    at: float  # epoch seconds: end of the evaluated minute
    value: float  # the signal over the rule's window, in the signal's unit
    threshold: float  # what it was compared with (absolute, or factor × baseline)
    baseline: float | None = None  # the baseline itself (None for absolute rules)
    baseline_minutes: int = 0  # minutes the baseline was computed from
    tokens_per_second: float | None = None  # generation load of the window (model rules)
    band_load: float | None = None  # the load the baseline band was chosen by (tokens/s or requests)


class _Window:
    __slots__ = ("entries", "marks", "sums")

    def __init__(self, n: int) -> None:
        self.entries: deque[tuple[float, tuple[float, ...]]] = deque()
        # per entry, its baseline bucket and band load (per-minute rules; None otherwise)
        self.marks: deque[tuple[tuple[Any, ...] | None, float | None] | None] = deque()
        self.sums = [0.0] * n


class _CompiledRule:
    """One rule with its input indexes, windows per series and baseline accumulator."""

    def __init__(self, rule: Rule) -> None:
        self.rule = rule
        self.kind = rule.kind
        self.group = rule.group_labels()
        sig = SIGNALS[rule.signal]
        names: list[str] = []

        def idx(sig_inputs: Sequence[str]) -> tuple[int, ...]:
            out = []
            for n in sig_inputs:
                if n not in names:
                    names.append(n)
                out.append(names.index(n))
            return tuple(out)

        self.sig_fn = sig.fn
        self.sig_idx = idx(sig.inputs)
        self.guards = [
            (SIGNALS[g.signal].fn, idx(SIGNALS[g.signal].inputs), OPS[g.op], g.value) for g in rule.where
        ]
        self.load_idx = idx(("generation_tokens", "seconds")) if self.kind == "model" else ()
        like = rule.baseline.like_load if rule.baseline is not None else None
        self.band_idx = (
            idx(("running.s", "running.w"))
            if like is not None and like.signal == "requests_running"
            else self.load_idx
        )
        mix = rule.baseline.like_mix if rule.baseline is not None else None
        self.mix_idx = idx(("prompt_tokens", "generation_tokens")) if mix is not None else ()
        self.names = tuple(names)
        self.n = len(names)
        self.cmp = OPS[rule.op]
        self.windows: dict[Labels, _Window] = {}
        # _base's answers for one series (its baseline key) and minute
        self._memo: dict[tuple[Any, ...], tuple[float | None, int]] = {}
        self._memo_at = -1.0
        self._memo_bk: Labels | None = None
        self.per_minute = like is not None and like.per_minute
        self.match = [(lbl, compile_safe(rx)) for lbl, rx in rule.match.items()]
        b = rule.baseline
        self.baseline: TrailingBaseline | None = None
        if b is not None:
            lag = b.exclude_recent if b.exclude_recent is not None else rule.over + rule.for_
            self.baseline = TrailingBaseline(b.window, sig.fn, len(sig.inputs), b.quantile is not None, lag)

    def _load(self, v: Sequence[float]) -> float | None:
        if not self.load_idx:
            return None
        g, s = v[self.load_idx[0]], v[self.load_idx[1]]
        return g / s if s > 0 else None

    def _band_load(self, v: Sequence[float]) -> float | None:
        if not self.band_idx:
            return None
        num, den = v[self.band_idx[0]], v[self.band_idx[1]]
        return num / den if den > 0 else None

    def _bucket(self, v: Sequence[float], minute: float) -> tuple[Any, ...] | None:
        b = self.rule.baseline
        assert b is not None
        band: int | None = None
        if b.like_load is not None:
            tps = self._load(v)
            if tps is None:
                return None
            if b.like_load.min_tokens_per_second is not None and tps < b.like_load.min_tokens_per_second:
                return None
            if b.like_load.band_ratio is not None:
                load = self._band_load(v)
                if load is None:
                    return None
                band = load_band(load, b.like_load.band_ratio)
                if band is None:
                    return None
        how = hour_of_week(minute) if b.same_hour_of_week else None
        mix_band: int | None = None
        if b.like_mix is not None:
            prompt, generation = v[self.mix_idx[0]], v[self.mix_idx[1]]
            if generation <= 0:
                return None
            # No prompt counter (TGI): every minute shares the "unknown mix" band.
            mix_band = load_band(prompt / generation, b.like_mix.band_ratio) if prompt > 0 else None
        return (band, how, mix_band)

    def _baseline_key(self, key: Labels) -> Labels:
        b = self.rule.baseline
        if b is not None and b.across_versions:
            return tuple(kv for kv in key if kv[0] != "model_version")
        return key

    def step(self, now: float, records: Sequence[MinuteRecord]) -> list[Finding]:
        """Findings of the minute ending at ``now``: this minute's sums join each series' window,
        every window with data is evaluated, then the minute joins the baselines."""
        minute = now - MINUTE
        current = self._current(records)
        buckets = self._push(current, minute)
        findings = self._evaluate_all(now)
        self._learn(current, buckets, minute)
        return findings

    def _current(self, records: Sequence[MinuteRecord]) -> dict[Labels, list[float]]:
        """This minute's vectors per series (grouped when the rule says so)."""
        rule = self.rule
        current: dict[Labels, list[float]] = {}
        names = self.names
        group = self.group
        for rec in records:
            if rec.kind != self.kind:
                continue
            if self.match and not all(rx.fullmatch(rec.label(lbl)) for lbl, rx in self.match):
                continue
            key = rec.labels if rule.group_by is None else tuple((g, rec.label(g)) for g in group)
            vec = current.get(key)
            if vec is None:
                vec = [0.0] * self.n
                current[key] = vec
            s = rec.sums
            for i, n in enumerate(names):
                vec[i] += s.get(n, 0.0)
        return current

    def _push(
        self, current: Mapping[Labels, list[float]], minute: float
    ) -> dict[Labels, tuple[Any, ...] | None]:
        """Push this minute into the windows; a per-minute rule notes each minute's bucket once,
        here (returned by series)."""
        buckets: dict[Labels, tuple[Any, ...] | None] = {}
        for key, vec in current.items():
            w = self.windows.get(key)
            if w is None:
                w = _Window(self.n)
                self.windows[key] = w
            tv = tuple(vec)
            mark = None
            if self.per_minute:  # before the entry: a minute whose bucket fails joins neither
                buckets[key] = self._bucket(tv, minute)
                mark = (buckets[key], self._band_load(tv))
            w.entries.append((minute, tv))
            w.marks.append(mark)
            for i, v in enumerate(tv):
                w.sums[i] += v
        return buckets

    def _evaluate_all(self, now: float) -> list[Finding]:
        """Evaluate every series with data in its window (minutes past the window dropped first)."""
        horizon = now - self.rule.over
        findings: list[Finding] = []
        for key in list(self.windows):
            w = self.windows[key]
            while w.entries and w.entries[0][0] < horizon:
                _, old = w.entries.popleft()
                w.marks.popleft()
                for i, v in enumerate(old):
                    w.sums[i] -= v
            if not w.entries:
                del self.windows[key]
                continue
            f = self._evaluate(key, w, now)
            if f is not None:
                findings.append(f)
        return findings

    def _learn(
        self,
        current: Mapping[Labels, list[float]],
        buckets: Mapping[Labels, tuple[Any, ...] | None],
        minute: float,
    ) -> None:
        """This minute joins the baselines (after evaluation: a minute is never its own baseline)."""
        if self.baseline is None:
            return
        for key, vec in current.items():
            value = self.sig_fn([vec[i] for i in self.sig_idx])
            if value is None:
                continue
            bucket = buckets[key] if self.per_minute else self._bucket(vec, minute)
            if bucket is None:
                continue
            inputs = tuple(vec[i] for i in self.sig_idx)
            self.baseline.add((self._baseline_key(key), bucket), minute, inputs, value)

    def _base(self, bk: Labels, bucket: tuple[Any, ...], now: float) -> tuple[float | None, int]:
        """The baseline (mean or quantile) of one bucket of the series ``bk`` (its baseline key)
        and the minutes it holds (none while its oldest minute is younger than the rule's
        ``min_age``); read once per bucket, series and minute."""
        assert self.baseline is not None and self.rule.baseline is not None
        if now != self._memo_at or bk != self._memo_bk:
            self._memo.clear()
            self._memo_at, self._memo_bk = now, bk
        hit = self._memo.get(bucket)
        if hit is not None:
            return hit
        bkey = (bk, bucket)
        spec = self.rule.baseline
        out: tuple[float | None, int]
        if spec.min_age > 0 and (
            (oldest := self.baseline.oldest(bkey, now)) is None or oldest > now - spec.min_age
        ):
            out = (None, 0)
        elif spec.quantile is None:
            out = self.baseline.mean(bkey, now)
        else:
            out = self.baseline.quantile(bkey, now, spec.quantile)
        self._memo[bucket] = out
        return out

    def _between_bands(
        self, bk: Labels, bucket: tuple[Any, ...], load: float | None, base: float, now: float
    ) -> float:
        """The baseline at the window's load: the band's figure moved towards the nearer
        neighbour band's, geometrically, by the load's distance from the band's centre (at a
        band's edge, half-way to its neighbour's). Where that neighbour has too little history (the
        quietest night of the week, below any before it), the slope from the band on the other
        side carries on; the band's own figure when neither has one."""
        spec = self.rule.baseline
        assert spec is not None and spec.like_load is not None and spec.like_load.band_ratio is not None
        band, how, mix = bucket
        if load is None or band is None or load <= 0 or base <= 0:
            return base
        offset = math.log(load) / math.log(spec.like_load.band_ratio) - band - 0.5  # −0.5 … 0.5
        step = 1 if offset > 0 else -1
        w = abs(offset)
        for side, sign in ((band + step, 1.0), (band - step, -1.0)):
            other, n = self._base(bk, (side, how, mix), now)
            if other is not None and n >= spec.min_minutes and other > 0:
                return _toward(base, other, sign * w)
        return base

    def _across_band(
        self, bk: Labels, bucket: tuple[Any, ...], load: float | None, below: float, now: float
    ) -> float:
        """The baseline at the window's load when its own band is too thin to have one: between
        the bands below (``below``) and above, geometrically, by where the load sits between their
        centres; ``below`` alone when the band above has too little history too. Why not the band
        below alone: where the signal falls with load (decode efficiency under a saturating
        throughput law) the band below's figure is the higher one, so a bursty node whose windows
        hop into a thin band at the top of its range would read the band's slope as an efficiency
        drop."""
        spec = self.rule.baseline
        assert spec is not None and spec.like_load is not None and spec.like_load.band_ratio is not None
        band, how, mix = bucket
        above, n = self._base(bk, (band + 1, how, mix), now)
        if above is None or n < spec.min_minutes or above <= 0 or below <= 0 or not load or load <= 0:
            return below
        # the band below's centre is at band − 0.5, the band above's at band + 1.5 (log units)
        t = (math.log(load) / math.log(spec.like_load.band_ratio) - band + 0.5) / 2.0
        return _toward(below, above, min(1.0, max(0.0, t)))

    def _baseline_at(
        self, bk: Labels, bucket: tuple[Any, ...], load: float | None, now: float
    ) -> tuple[float | None, int]:
        """What a window (or one minute of it) in ``bucket`` at ``load`` is compared with, and the
        minutes that came from: its band's figure, or the fallback's; None with too little history."""
        spec = self.rule.baseline
        assert spec is not None
        like = spec.like_load
        base, n = self._base(bk, bucket, now)
        own = base is not None and n >= spec.min_minutes
        if not own and like is not None and like.fallback == "lower":
            band, how, mix = bucket
            if band is not None:
                base, n = self._base(bk, (band - 1, how, mix), now)
                if like.between_bands and base is not None and n >= spec.min_minutes:
                    base = self._across_band(bk, bucket, load, base, now)
        if base is None or n < spec.min_minutes:
            return None, n
        if own and like is not None and like.between_bands and like.band_ratio is not None:
            base = self._between_bands(bk, bucket, load, base, now)
        return base, n

    def _expected(
        self, bk: Labels, window: _Window, now: float
    ) -> tuple[list[float], float, int, float | None] | None:
        """Per-minute expectations (``like_load.per_minute``): each minute of the window is read
        against its own bucket's baseline at its own load; returns the sums of the minutes that
        have one, their expected value (the mean of those baselines weighted by each minute's
        share of the signal's denominator), the fewest baseline minutes any of them rested on,
        and the load of the band that holds most of their weight (for the deploy comparison).
        None unless those minutes hold at least :data:`PER_MINUTE_COVER` of the window's weight."""
        den = self.sig_idx[-1]
        covered = [0.0] * self.n
        total = weight = expected = 0.0
        fewest = -1
        bands: dict[Any, list[float]] = {}  # band → [weight, weight × load]
        for (_, vec), mark in zip(window.entries, window.marks, strict=True):
            wt = vec[den]
            if wt <= 0:
                continue
            total += wt
            if mark is None or mark[0] is None:
                continue
            base, n = self._baseline_at(bk, mark[0], mark[1], now)
            if base is None:
                continue
            weight += wt
            expected += wt * base
            fewest = n if fewest < 0 else min(fewest, n)
            for i, v in enumerate(vec):
                covered[i] += v
            if mark[1] is not None:
                acc = bands.setdefault(mark[0][0], [0.0, 0.0])
                acc[0] += wt
                acc[1] += wt * mark[1]
        if weight <= 0 or weight < PER_MINUTE_COVER * total:
            return None
        heaviest = max(bands.values(), key=lambda a: a[0], default=None)
        load = heaviest[1] / heaviest[0] if heaviest is not None else None
        return covered, expected / weight, fewest, load

    def _evaluate(self, key: Labels, window: _Window, now: float) -> Finding | None:
        rule = self.rule
        sums = window.sums
        value = self.sig_fn([sums[i] for i in self.sig_idx])
        if value is None:
            return None
        for fn, gidx, cmp, limit in self.guards:
            gv = fn([sums[i] for i in gidx])
            if gv is None or not cmp(gv, limit):
                return None
        tps = self._load(sums)
        if rule.threshold is not None:
            return (
                Finding(rule.id, key, now, value, rule.threshold, tokens_per_second=tps)
                if self.cmp(value, rule.threshold)
                else None
            )
        assert self.baseline is not None and rule.baseline is not None and rule.factor is not None
        like = rule.baseline.like_load
        base: float | None
        band_load = self._band_load(sums)
        if like is not None and like.per_minute:
            # the window's own traffic floor, as without per_minute (each minute has its own too)
            floor = like.min_tokens_per_second
            if floor is not None and (tps is None or tps < floor):
                return None
            got = self._expected(self._baseline_key(key), window, now)
            if got is None:
                return None
            covered, base, n, band_load = got
            value = self.sig_fn([covered[i] for i in self.sig_idx])
            if value is None:
                return None
        else:
            bucket = self._bucket(sums, now - MINUTE)
            if bucket is None:
                return None
            base, n = self._baseline_at(self._baseline_key(key), bucket, self._band_load(sums), now)
            if base is None:
                return None
        limit = rule.factor * base
        if not self.cmp(value, limit):
            return None
        return Finding(rule.id, key, now, value, limit, base, n, tps, band_load)


class RuleEvaluator:
    """Steps a rule set minute by minute over 1-minute records, keeping trailing windows and
    baselines in memory. Feed every minute in ascending order; a minute with no records is fine."""

    def __init__(self, rules: RuleSet | Sequence[Rule]) -> None:
        self.rules = tuple(rules)
        self._compiled = [_CompiledRule(r) for r in self.rules]

    def step(self, now: float, records: Iterable[MinuteRecord]) -> list[Finding]:
        """Evaluate the minute ending at ``now`` (epoch seconds) given that minute's records."""
        recs = list(records)
        out: list[Finding] = []
        for c in self._compiled:
            out.extend(c.step(now, recs))
        return out

    def warm(self, now: float, records: Iterable[MinuteRecord]) -> None:
        """Feed history without caring about findings (start-up: rebuild baselines from the store)."""
        self.step(now, records)
