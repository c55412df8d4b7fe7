"""Why a cost alert's cost per token moved: the factor split (:mod:`agent.cost.explain`) of the
alert's minutes against what it is compared with, at like load, as one line for the alert.

- An alert that follows a **deploy** compares the new version's minutes since the deploy with the
  previous version's in the baseline window before it.
- Any other cost alert compares its series' minutes over the rule's ``over`` with the rule's
  baseline window before them (every version of the model, as the cost rules' baselines do).

**Like load** (also what ``infercost explain --version`` uses): minutes are put in load bands of
requests running :data:`BAND_RATIO` wide (tokens per second where the gauge is absent), only bands
both sides have count, and the reference side's minutes in each band are weighted to the other side's
output tokens in it, so neither side is credited with the larger batches of busier hours.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from agent.cost.explain import ExplainError, Split, factors_of, one_line, split, with_chain
from agent.detect.evaluator import Finding
from agent.detect.rules import Rule
from agent.records import MINUTE, DeployInfo, MinuteRecord, add_sums, load_band, mean_of

logger = logging.getLogger(__name__)

# The bands of the shipped cost-per-token rule's like-load comparison (rules/agent/default.yaml:
# requests running, 1.5× wide), so the split compares what the alert's deploy comparison compares.
BAND_RATIO = 1.5
# Why 1 token/s: a minute below it is an idle minute, whose dollars per token say nothing of the
# model (the cost rules ignore them the same way: min_tokens_per_second 1).
MIN_TOKENS_PER_SECOND = 1.0
# Why 7 days: the cost rules' baseline window; a rule without a baseline compares with that week.
DEFAULT_BASELINE_SECONDS = 7 * 86400.0
# Why 16: deploys whose previous week's minutes are kept (a week of one series is ~10,000 small
# records); more than 16 deploys with alerts pending at once is a fleet-wide rollout, read again.
BEFORE_CACHE_ENTRIES = 16
# The signals whose alerts are cost alerts (dollars per token): they carry the split.
COST_SIGNALS = ("usd_per_1m_output_tokens", "usd_per_1m_tokens", "usd_per_1m_output_tokens_decode")


@dataclass(frozen=True, slots=True)
class Bucket:
    """One minute (store) or hour (Prometheus) of one series as the model sums."""

    at: float  # epoch seconds, start
    version: str
    sums: Mapping[str, float]


def bucket_of(r: MinuteRecord) -> Bucket:
    """A model minute record as a bucket, with the minute's factor chain as sums
    (:func:`agent.cost.explain.chain_sums`: a longer window's factors are ratios of those)."""
    return Bucket(r.minute, r.label("model_version"), with_chain(r.sums))


def total(buckets: Iterable[Bucket]) -> dict[str, float]:
    """The buckets' sums added."""
    out: dict[str, float] = {}
    for b in buckets:
        add_sums(out, b.sums)
    return out


def band_of(sums: Mapping[str, float]) -> tuple[str, int] | None:
    """A bucket's load band: requests running, else output tokens per second (None: idle)."""
    secs = sums.get("seconds", 0.0)
    tps = sums.get("generation_tokens", 0.0) / secs if secs > 0 else 0.0
    if tps < MIN_TOKENS_PER_SECOND:
        return None
    running = mean_of(sums, "running")
    if running is not None and running > 0:
        band = load_band(running, BAND_RATIO)
        return None if band is None else ("running", band)
    band = load_band(tps, BAND_RATIO)
    return None if band is None else ("tps", band)


@dataclass(frozen=True, slots=True)
class LikeLoad:
    """Two sides' sums at like load."""

    before: dict[str, float]  # the reference side, weighted to the other's load mix
    after: dict[str, float]
    matched_share: float  # 0–1: share of the other side's output tokens in bands the reference has


def like_load(after: Sequence[Bucket], before: Sequence[Bucket]) -> LikeLoad:
    """``after`` and ``before`` summed over the load bands both have, ``before``'s buckets in each band
    weighted by the ratio of the two sides' output tokens in it (see the module docstring)."""
    by_a: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
    by_b: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
    for buckets, into in ((after, by_a), (before, by_b)):
        for b in buckets:
            band = band_of(b.sums)
            if band is not None:
                add_sums(into[band], b.sums)
    out_a: dict[str, float] = {}
    out_b: dict[str, float] = {}
    matched = everything = 0.0
    for band, sa in by_a.items():
        tokens = sa.get("generation_tokens", 0.0)
        everything += tokens
        sb = by_b.get(band)
        if sb is None or sb.get("generation_tokens", 0.0) <= 0:
            continue
        matched += tokens
        add_sums(out_a, sa)
        add_sums(out_b, sb, tokens / sb["generation_tokens"])
    return LikeLoad(out_b, out_a, matched / everything if everything > 0 else 0.0)


def split_like_load(after: Sequence[Bucket], before: Sequence[Bucket]) -> Split | None:
    """The factor split of ``after`` against ``before`` at like load (None: no band in common or no
    cost per token on a side)."""
    like = like_load(after, before)
    if not like.after:
        return None
    try:
        return split(factors_of(like.before), factors_of(like.after))
    except ExplainError:
        return None


# (kind, labels, start, end) → the model minute records of the series ``labels`` selects
Series = Callable[[Mapping[str, str], float, float], Sequence[MinuteRecord]]


class AlertExplainer:
    """The ``explain_lookup`` hook of :class:`agent.detect.alerts.AlertManager`: (rule, finding,
    deploy) → the split of a cost alert in one line, or None (not a cost rule, or no comparison)."""

    def __init__(self, series: Series) -> None:
        self._series = series
        # the previous version's minutes before a deploy, per (series, start, end): every alert after
        # one deploy compares with the same week, read once
        self._before: dict[tuple[object, ...], list[Bucket]] = {}

    def _before_deploy(self, labels: Mapping[str, str], start: float, end: float) -> list[Bucket]:
        key = (tuple(sorted(labels.items())), start, end)
        if key not in self._before:
            if len(self._before) >= BEFORE_CACHE_ENTRIES:
                self._before.pop(next(iter(self._before)))
            self._before[key] = [bucket_of(r) for r in self._series(labels, start, end)]
        return self._before[key]

    def split(self, rule: Rule, f: Finding, deploy: DeployInfo | None) -> Split | None:
        """The alert's split (see the module docstring)."""
        if rule.signal not in COST_SIGNALS or rule.kind != "model":
            return None
        labels = dict(f.labels)
        window = rule.baseline.window if rule.baseline is not None else DEFAULT_BASELINE_SECONDS
        key = {k: labels[k] for k in ("node", "engine", "model") if labels.get(k)}
        if deploy is not None and deploy.kind == "model":
            key = {**key, "node": deploy.node, "engine": deploy.engine, "model": deploy.model}
            old, new = (
                {**key, "model_version": deploy.from_version},
                {**key, "model_version": deploy.to_version},
            )
            before = self._before_deploy(old, deploy.at - window, deploy.at)
            after = [bucket_of(r) for r in self._series(new, deploy.at, f.at)]
        else:
            start = f.at - max(rule.over, MINUTE)
            before = [bucket_of(r) for r in self._series(key, start - window, start)]
            after = [bucket_of(r) for r in self._series(key, start, f.at)]
        return split_like_load(after, before)

    def __call__(self, rule: Rule, f: Finding, deploy: DeployInfo | None) -> str | None:
        s = self.split(rule, f, deploy)
        if s is None:
            return None
        return one_line(s, note=None if deploy is None else f"deploy {deploy.to_version}")
