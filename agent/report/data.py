"""Weekly cost report: the data. One :class:`WeeklyReport` per week ending at ``end``, built from
hourly per-series sums (:class:`HourRow`, one per (node, engine, model, model_version) and hour over
the two weeks before ``end``), whichever path they come from:

- the local store: one SQL ``GROUP BY`` over the minute rollups (:func:`build_from_store`), so a
  35-day history is never loaded into Python;
- Prometheus' HTTP API: ``increase(…[1h])`` range queries at a 1-hour step (:func:`build_from_prometheus`,
  in :mod:`agent.report.prom`);
- cost windows in memory (:func:`build_from_windows`, tests and tools).

All paths share :func:`assemble`, so the reports of the same traffic agree. The factor waterfall's
rows also carry their minutes' factor chain (:func:`agent.cost.explain.chain_sums`, added minute by
minute: :func:`store_chains`), as ``infercost explain`` reads the same minutes; a Prometheus hour is
its own one window, as that command's Prometheus path reads it. Every $/token figure is
a ratio of sums (Σ cost / Σ tokens), never a mean of ratios; where the dollars went
(:class:`WhereDollarsWent`) and where GPU time went (:class:`WhereGpuTimeWent`, by bound) are
ratios of sums over only the hours that had the figure.

**Like load.** Cost per token falls as batches fill, so two weeks (or two versions) are compared
hour by hour *in the same load band* (requests running when the engine reports it, as the alert
rules do; else output tokens/s), bands :data:`BAND_RATIO` wide on a log scale. A version's like-load
change is Σ its cost ÷ Σ (its tokens × the baseline's $/token in the same band) over the bands both
have. Its baseline is, in order: the same version last week; the version it replaced on the same
engine (what a deploy changed); the model's other versions.
"""

from __future__ import annotations

import bisect
import dataclasses
import datetime as dt
import itertools
import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from agent.cost.bound import BOUNDS
from agent.cost.explain import chain_sums
from agent.records import (
    BOUND_SUMS,
    MINUTE,
    SPLIT_SUMS,
    DeployEvent,
    add_sums,
    mean_of,
    model_sums,
    tokens_counted,
)
from agent.report.budget import BudgetLine
from agent.report.waterfall import Waterfall, week_over_week
from agent.samples import CostWindow

if TYPE_CHECKING:
    from agent.store import Store

logger = logging.getLogger(__name__)

HOUR_SECONDS = 3600.0
DAY_SECONDS = 86_400.0
WEEK_SECONDS = 7 * DAY_SECONDS
# Why 1.2×: with an unchanged deployment the weekly ratio of sums of a busy model moves well
# under ±10 % (the load mix is similar week to week); +20 % is a change someone made.
REGRESSION_RATIO = 1.2
# Why 1 M output tokens: below that a few idle hours dominate a version's weekly $/1M, and a
# "regression" is the noise of a barely used version.
MIN_OUTPUT_TOKENS = 1e6
TOP_REGRESSIONS = 5
TOP_SAVINGS = 8
# Why 2.0: the same band width as the shipped cost rule's like_load (rules/agent/default.yaml),
# so the report and the alert compare the same minutes.
BAND_RATIO = 2.0
# Why a quarter: a like-load figure resting on a sliver of the week's tokens is noise; below it
# the report shows the plain week-over-week change and says it is not at like load.
MIN_LIKE_SHARE = 0.25
# Why $5 a week: below that an opportunity is not worth a person's time to act on.
MIN_SAVING_USD = 5.0
# Why 0.5 and 0.85: continuous batching runs GPUs at 85–95 % busy (DESIGN.md); under half at
# steady traffic means more GPUs than the traffic needs. The saving sizes them to 85 %.
LOW_UTIL_RATIO = 0.5
TARGET_UTIL_RATIO = 0.85
# Why 10 %: a cheaper version must beat the others by more than the week-to-week noise.
CHEAPER_BY_RATIO = 0.9

Key = tuple[str, str]  # (model, model_version)
SeriesKey = tuple[str, str, str, str]  # (node, engine, model, model_version)
LoadKey = tuple[str, int]  # (signal, band)


class ReportError(Exception):
    """The report's data source failed (store unreadable, Prometheus unreachable, an API error)."""


@dataclass(frozen=True, slots=True)
class HourRow:
    """Sums of one (node, engine, model, model_version) over one hour of the two weeks."""

    node: str
    engine: str
    model: str
    model_version: str
    hour: float  # epoch seconds, start of the hour bucket (buckets are aligned to the report's end)
    seconds: float  # seconds of data in the hour
    prompt_tokens: float  # tokens
    output_tokens: float  # tokens
    cost_usd: float  # dollars
    idle_usd: float  # dollars of cost in minutes without tokens
    gpu_seconds: float  # GPU-seconds attributed
    idle_gpu_seconds: float | None = None  # GPU-seconds in minutes without tokens (None: unknown)
    gpu_util_ratio: float | None = None  # 0–1, time-weighted mean
    requests_running: float | None = None  # mean requests in flight
    roofline_ratio: float | None = None  # observed decode tok/s ÷ bandwidth ceiling, mean
    prefill_share: float | None = None  # 0–1, mean prefill share of the steps' time (agent.cost.explain)
    prefill_floor: float | None = None  # 0–1, mean part of it the decode efficiency took out
    split: DollarSplit | None = None  # where the hour's dollars went (None: not known at all)
    bound: BoundSplit | None = None  # where the hour's GPU time went (None: not known at all)
    tokenless_seconds: float = 0.0  # seconds of it whose engine counts no tokens (tokens absent)
    # its minutes' factor chain (agent.cost.explain.chain_sums, "chain."-prefixed, added minute by
    # minute); None: not read per minute (a Prometheus hour), the hour is then its own one window
    chain: Mapping[str, float] | None = None

    @property
    def series(self) -> SeriesKey:
        """(node, engine, model, model_version)."""
        return (self.node, self.engine, self.model, self.model_version)

    @property
    def load(self) -> LoadKey | None:
        """The hour's load band: requests running when known, else output tokens/s (None: no load)."""
        if self.requests_running is not None and self.requests_running > 0:
            return ("running", _band(self.requests_running))
        if self.seconds > 0 and self.output_tokens > 0:
            return ("tps", _band(self.output_tokens / self.seconds))
        return None


def _band(v: float) -> int:
    return math.floor(math.log(v) / math.log(BAND_RATIO))


@dataclass(frozen=True, slots=True)
class DollarSplit:
    """Where a series' dollars went over some hours, as additive sums (the store's
    :data:`agent.store.SPLIT_SUMS`; see :func:`agent.records.split_sums`). Each figure is paired
    with the dollars and tokens it covers, so a ratio is taken over only the hours that had it."""

    prompt_usd: float = 0.0  # dollars of prefill time (phase-time share)
    split_usd: float = 0.0  # dollars of the windows with a prompt/output split
    split_prompt_tokens: float = 0.0  # prompt tokens of those windows
    split_generation_tokens: float = 0.0  # output tokens of those windows
    usage_usd: float = 0.0  # usage basis: dollars weighted by GPU busy time
    usage_alloc_usd: float = 0.0  # allocation dollars of the windows with a usage figure
    cache_saved_usd: float = 0.0  # what prefix-cache hits would have cost
    floor_usd: float = 0.0  # the output tokens priced at the cost floor (running batch)
    floor_cost_usd: float = 0.0  # what those windows actually cost
    floor_tokens: float = 0.0  # their output tokens
    floor_max_usd: float = 0.0  # the same at the largest batch the KV cache holds
    floor_max_cost_usd: float = 0.0  # dollars
    floor_max_tokens: float = 0.0  # tokens

    def __add__(self, other: DollarSplit) -> DollarSplit:
        return DollarSplit(*(a + b for a, b in zip(_fields(self), _fields(other), strict=True)))


def _fields(d: DollarSplit) -> tuple[float, ...]:
    return tuple(getattr(d, f.name) for f in dataclasses.fields(d))


# the fields are the store's columns, in the same order (one list: agent.records.SPLIT_SUMS)
assert tuple(f.name for f in dataclasses.fields(DollarSplit)) == SPLIT_SUMS


def split_from_sums(sums: Mapping[str, float]) -> DollarSplit:
    """A :class:`DollarSplit` from sums named as :func:`agent.records.split_sums` names them."""
    return DollarSplit(*(float(sums.get(name, 0.0)) for name in SPLIT_SUMS))


def _per_1m(usd: float, tokens: float) -> float | None:
    return usd / tokens * 1e6 if tokens > 0 else None


@dataclass(frozen=True, slots=True)
class WhereDollarsWent:
    """One model version's (or the week's) dollars split four ways, from a :class:`DollarSplit`.

    - **prompt, output and idle**: ``prompt_usd + output_usd + idle_usd == cost_usd``: idle is the
      dollars of windows without tokens (the one "idle" of :mod:`agent.cost`, never part of output);
      windows with tokens but without phase times count wholly as output; the $ per 1M prompt and
      decode figures are over the windows with a split only (None without any);
    - **allocation − usage** (``waste_usd``): paid while no kernel ran, over windows with a usage
      figure (None without any);
    - **cost floor**: $ per 1M output at the bandwidth roofline (running batch; at the largest
      batch the KV cache holds), and the most the hardware could save: what those tokens cost
      less the floor's price of them.
    """

    cost_usd: float  # dollars (allocation basis, the report's figure)
    prompt_usd: float  # dollars of prefill time
    output_usd: float  # dollars of windows with tokens, less their prefill: cost − prompt − idle
    idle_usd: float  # dollars of windows without tokens
    usd_per_1m_prompt: float | None  # dollars per 1M prompt tokens (windows with a split)
    usd_per_1m_output_decode: float | None  # dollars of decode time per 1M output tokens (same windows)
    split_share: float | None  # 0–1: share of the dollars with a split (None: no dollars)
    usage_usd: float | None  # usage basis; None where no window had a usage figure
    waste_usd: float | None  # allocation − usage over the windows with a usage figure
    cache_saved_usd: float  # dollars
    floor_usd_per_1m: float | None  # dollars per 1M output at the roofline, running batch
    floor_max_batch_usd_per_1m: float | None  # at the largest batch the KV cache holds
    floor_saving_usd: float | None  # actual − floor for the same tokens (running batch)
    floor_max_batch_saving_usd: float | None  # actual − floor at the largest batch

    @staticmethod
    def of(cost_usd: float, d: DollarSplit, idle_usd: float) -> WhereDollarsWent:
        """The figures of ``d`` for a total of ``cost_usd`` dollars, ``idle_usd`` of them idle."""
        return WhereDollarsWent(
            cost_usd=cost_usd,
            prompt_usd=d.prompt_usd,
            output_usd=cost_usd - d.prompt_usd - idle_usd,
            idle_usd=idle_usd,
            usd_per_1m_prompt=_per_1m(d.prompt_usd, d.split_prompt_tokens) if d.split_usd > 0 else None,
            usd_per_1m_output_decode=(
                _per_1m(d.split_usd - d.prompt_usd, d.split_generation_tokens) if d.split_usd > 0 else None
            ),
            split_share=d.split_usd / cost_usd if cost_usd > 0 else None,
            usage_usd=d.usage_usd if d.usage_alloc_usd > 0 else None,
            waste_usd=d.usage_alloc_usd - d.usage_usd if d.usage_alloc_usd > 0 else None,
            cache_saved_usd=d.cache_saved_usd,
            floor_usd_per_1m=_per_1m(d.floor_usd, d.floor_tokens),
            floor_max_batch_usd_per_1m=_per_1m(d.floor_max_usd, d.floor_max_tokens),
            floor_saving_usd=d.floor_cost_usd - d.floor_usd if d.floor_tokens > 0 else None,
            floor_max_batch_saving_usd=(
                d.floor_max_cost_usd - d.floor_max_usd if d.floor_max_tokens > 0 else None
            ),
        )


@dataclass(frozen=True, slots=True)
class BoundSplit:
    """Where a series' GPU time went over some hours, as additive sums (the store's
    :data:`agent.records.BOUND_SUMS`, see :func:`agent.records.bound_sums`): GPU-seconds and GPU
    dollars by bound. Hours without a split add 0 to every field, so each set of four sums to
    what the split covers."""

    compute_seconds: float = 0.0  # GPU-seconds
    memory_seconds: float = 0.0  # GPU-seconds
    communication_seconds: float = 0.0  # GPU-seconds
    idle_seconds: float = 0.0  # GPU-seconds
    compute_usd: float = 0.0  # dollars
    memory_usd: float = 0.0  # dollars
    communication_usd: float = 0.0  # dollars
    idle_usd: float = 0.0  # dollars

    def __add__(self, other: BoundSplit) -> BoundSplit:
        return BoundSplit(*(a + b for a, b in zip(_bfields(self), _bfields(other), strict=True)))

    def seconds(self) -> dict[str, float]:
        """bound → GPU-seconds."""
        return {b: float(getattr(self, f"{b}_seconds")) for b in BOUNDS}

    def usd(self) -> dict[str, float]:
        """bound → dollars."""
        return {b: float(getattr(self, f"{b}_usd")) for b in BOUNDS}


def _bfields(d: BoundSplit) -> tuple[float, ...]:
    return tuple(getattr(d, f.name) for f in dataclasses.fields(d))


# the fields are the store's columns without the "bound_" prefix, in the same order
assert tuple(f"bound_{f.name}" for f in dataclasses.fields(BoundSplit)) == BOUND_SUMS


def bound_from_sums(sums: Mapping[str, float]) -> BoundSplit:
    """A :class:`BoundSplit` from sums named as :func:`agent.records.bound_sums` names them."""
    return BoundSplit(*(float(sums.get(name, 0.0)) for name in BOUND_SUMS))


def _shares(parts: Mapping[str, float]) -> dict[str, float] | None:
    total = sum(parts.values())
    return {k: v / total for k, v in parts.items()} if total > 0 else None


@dataclass(frozen=True, slots=True)
class WhereGpuTimeWent:
    """One model version's (or the week's) GPU time and dollars by bound (compute, memory,
    communication, idle; :mod:`agent.cost.bound`), from a :class:`BoundSplit`.

    Shares are over the part that had a split (NVML GPM measured every GPU of the window), so each
    set sums to 1; ``usd_coverage`` says how much of the dollars that part is. Without any split
    the shares are None (unknown, not zero)."""

    cost_usd: float  # all dollars of the version (or week)
    gpu_seconds: float  # all GPU-seconds
    covered_usd: float  # dollars with a split (Σ of the four bound dollars)
    covered_gpu_seconds: float  # GPU-seconds with a split
    usd_coverage: float | None  # 0–1: covered_usd ÷ cost_usd (None: no dollars)
    gpu_time_coverage: float | None  # 0–1: covered GPU-seconds ÷ GPU-seconds (None: no GPU time)
    usd: dict[str, float] | None  # bound → dollars (None: no split)
    time_share: dict[str, float] | None  # bound → 0–1 of the covered GPU-seconds
    usd_share: dict[str, float] | None  # bound → 0–1 of the covered dollars

    @staticmethod
    def of(cost_usd: float, gpu_seconds: float, b: BoundSplit) -> WhereGpuTimeWent:
        """The figures of ``b`` for a total of ``cost_usd`` dollars and ``gpu_seconds``."""
        secs, usd = b.seconds(), b.usd()
        covered_s, covered_usd = sum(secs.values()), sum(usd.values())
        known = covered_s > 0
        return WhereGpuTimeWent(
            cost_usd=cost_usd,
            gpu_seconds=gpu_seconds,
            covered_usd=covered_usd,
            covered_gpu_seconds=covered_s,
            usd_coverage=min(1.0, covered_usd / cost_usd) if cost_usd > 0 else None,
            gpu_time_coverage=min(1.0, covered_s / gpu_seconds) if gpu_seconds > 0 else None,
            usd=usd if known else None,
            time_share=_shares(secs),
            usd_share=_shares(usd),
        )


@dataclass(frozen=True, slots=True)
class VersionTrend:
    """One model version hour by hour over the week: what its chart draws. Absent = None."""

    usd_per_1m_output: tuple[float | None, ...]  # 168 hourly values, None without tokens
    baseline_low: tuple[float | None, ...]  # 168: the baseline's 25th percentile in the hour's band
    baseline_high: tuple[float | None, ...]  # 168: the baseline's 75th percentile in that band
    daily_usd: tuple[float | None, ...]  # per calendar day of the week (7, or 8 with partial ends)
    daily_idle_usd: tuple[float | None, ...]  # idle dollars per calendar day


@dataclass(frozen=True, slots=True)
class ModelWeek:
    """One model version over the week, with the baselines it is compared with."""

    model: str
    model_version: str
    cost_usd: float  # dollars this week
    output_tokens: float  # tokens this week
    prompt_tokens: float  # tokens this week
    idle_usd: float  # dollars of this version's cost in windows without tokens
    last_usd_per_1m_output: float | None  # dollars per 1M output tokens last week (the plain baseline)
    baseline: str | None  # plain baseline: "version" (same version last week), "model", None
    like_change_ratio: float | None = None  # this week ÷ like-load baseline; None when not comparable
    like_baseline: str | None = None  # "version", "replaced" (same engine's previous version), "model"
    like_share: float = 0.0  # 0–1: share of this week's output tokens in bands the baseline has
    excess_usd: float | None = None  # dollars above the baseline's cost for the same tokens at like load
    idle_gpu_hours: float | None = None  # GPU-hours without tokens (None: unknown)
    gpu_util_ratio: float | None = None  # 0–1, mean over the week
    roofline_ratio: float | None = None  # 0–1, mean decode efficiency (None: unknown)
    trend: VersionTrend | None = None
    split: DollarSplit = field(default_factory=DollarSplit)  # where this week's dollars went
    gpu_seconds: float = 0.0  # GPU-seconds attributed this week
    bound: BoundSplit = field(default_factory=BoundSplit)  # where this week's GPU time went
    # False: its engine counted no tokens all week (a plain Triton): the token figures are absent
    # (shown as such), not 0 — output_tokens and prompt_tokens hold 0 only for the sums
    tokens_counted: bool = True

    @property
    def dollars(self) -> WhereDollarsWent:
        """This week's dollars: prompt vs output, allocation − usage, cost floor."""
        return WhereDollarsWent.of(self.cost_usd, self.split, self.idle_usd)

    @property
    def gpu_time(self) -> WhereGpuTimeWent:
        """This week's GPU time and dollars by bound (compute, memory, communication, idle)."""
        return WhereGpuTimeWent.of(self.cost_usd, self.gpu_seconds, self.bound)

    @property
    def usd_per_1m_output(self) -> float | None:
        """Dollars per 1M output tokens this week; None without output tokens."""
        return self.cost_usd / self.output_tokens * 1e6 if self.output_tokens > 0 else None

    @property
    def usd_per_1m_total(self) -> float | None:
        """Dollars per 1M tokens (prompt + output) this week; None without tokens."""
        tokens = self.output_tokens + self.prompt_tokens
        return self.cost_usd / tokens * 1e6 if tokens > 0 else None

    @property
    def change_ratio(self) -> float | None:
        """This week's $/1M output ÷ the plain baseline's; None when either is absent."""
        now, before = self.usd_per_1m_output, self.last_usd_per_1m_output
        return now / before if now is not None and before else None

    @property
    def effective_change_ratio(self) -> float | None:
        """The like-load change where there is one, else the plain one."""
        return self.like_change_ratio if self.like_change_ratio is not None else self.change_ratio

    @property
    def regression_ratio(self) -> float | None:
        """The change that can make this version a regression: at like load against itself last
        week or the build it replaced; the plain change where no like-load comparison exists. A
        like-load gap to the model's *other* deployments (another engine, GPU count or precision)
        is a savings opportunity, not a regression: nobody changed anything."""
        if self.like_change_ratio is not None:
            return self.like_change_ratio if self.like_baseline in ("version", "replaced") else None
        return self.change_ratio

    @property
    def cost_floor_usd_per_1m(self) -> float | None:
        """$/1M output at the bandwidth ceiling for the running batch: the agent's per-window floor
        (:mod:`agent.cost.floor`) where it was known; else this week's $/1M × decode efficiency
        (the same ratio seen from the other side); None when neither is known."""
        if (floor := self.dollars.floor_usd_per_1m) is not None:
            return floor
        p, r = self.usd_per_1m_output, self.roofline_ratio
        return p * min(1.0, r) if p is not None and r is not None and r > 0 else None


@dataclass(frozen=True, slots=True)
class Saving:
    """One savings opportunity, in dollars per week."""

    kind: str  # "idle" | "low_utilization" | "cheaper_version"
    subject: str  # what to act on, e.g. "node-a/e1 llama-70b 2024-07"
    usd_per_week: float  # dollars a week it would save
    detail: str  # how the figure was made, for the reader


@dataclass(frozen=True, slots=True)
class NodeIdle:
    """Idle GPU cost of one node over the week."""

    node: str
    idle_usd: float  # dollars of GPU time that produced no tokens


@dataclass(frozen=True, slots=True)
class UtilRow:
    """GPU utilisation of one group (a GPU model from Prometheus, an engine from the store)."""

    group: str
    gpu_util_ratio: float | None  # 0–1, mean over the week
    cost_usd: float  # dollars of GPU time of the group


@dataclass(frozen=True, slots=True)
class GroupRow:
    """The week's dollars and tokens of one group (a namespace, a team, …; agent.report.groups)."""

    group: str
    cost_usd: float  # dollars (the allocation basis; idle as the report's idle policy puts it)
    idle_usd: float  # dollars of it that made no tokens
    prompt_tokens: float  # tokens
    output_tokens: float  # tokens

    @property
    def usd_per_1m_output(self) -> float | None:
        """All the group's dollars over its output tokens, per million; None without tokens."""
        return _per_1m(self.cost_usd, self.output_tokens)


def calendar_days(start: float, end: float, tz: str = "UTC") -> tuple[float, ...]:
    """The local midnights (epoch seconds, in the IANA zone ``tz``) of every calendar day that
    [start, end) touches, oldest first: the report's days are calendar days, not rolling 24 hours
    (a week that does not end at midnight has a partial first and last day)."""
    import zoneinfo

    zone = zoneinfo.ZoneInfo(tz)
    day = dt.datetime.fromtimestamp(start, zone).date()
    out: list[float] = []
    while True:
        midnight = dt.datetime.combine(day, dt.time(), zone).timestamp()
        if midnight >= end and out:
            return tuple(out)
        out.append(midnight)
        day += dt.timedelta(days=1)


def day_of(t: float, days: Sequence[float]) -> int:
    """The index in ``days`` (local midnights, from :func:`calendar_days`) of the day holding ``t``."""
    return max(0, bisect.bisect_right(days, t) - 1)


@dataclass(frozen=True, slots=True)
class WeeklyReport:
    """The week ending at ``end`` compared with the week before."""

    start: float  # seconds since the epoch (end − 7 days)
    end: float  # seconds since the epoch
    source: str  # where the data came from, for the reader
    total_usd: float  # dollars attributed to models this week
    last_total_usd: float | None  # dollars last week (None when there is no history)
    idle_usd: float  # dollars of GPU time that produced no tokens this week
    last_idle_usd: float | None  # dollars last week
    models: tuple[ModelWeek, ...]  # by cost, highest first
    idle_by_node: tuple[NodeIdle, ...]  # by idle cost, highest first
    utilization: tuple[UtilRow, ...]
    utilization_by: str  # what UtilRow.group is: "gpu_model" or "engine"
    daily_usd: tuple[float | None, ...] = field(default=())  # dollars per day, oldest first; None: no data
    daily_idle_usd: tuple[float | None, ...] = field(default=())  # idle dollars per day
    savings: tuple[Saving, ...] = ()  # biggest first
    deploys: tuple[DeployEvent, ...] = ()  # deploys during the week, oldest first
    budgets: tuple[BudgetLine, ...] = ()  # the fleet's monthly budgets at ``end`` (agent.report.budget)
    # the calendar days of daily_usd: epoch seconds of each one's local midnight in ``timezone``
    day_starts: tuple[float, ...] = ()
    timezone: str = "UTC"
    group_by: str = ""  # the property costs are grouped by (namespace, team, …; report --group-by)
    groups: tuple[GroupRow, ...] = ()  # by dollars, largest first
    waterfalls: tuple[Waterfall, ...] = ()  # week over week by factor (agent.report.waterfall)

    @property
    def output_tokens(self) -> float:
        """Output tokens this week, all models."""
        return sum(m.output_tokens for m in self.models)

    @property
    def usd_per_1m_output(self) -> float | None:
        """Fleet dollars per 1M output tokens this week (ratio of sums); None without tokens."""
        cost = sum(m.cost_usd for m in self.models)
        tokens = self.output_tokens
        return cost / tokens * 1e6 if tokens > 0 else None

    @property
    def dollars(self) -> WhereDollarsWent:
        """The week's model dollars split (all versions): prompt vs output, waste, cost floor."""
        total = DollarSplit()
        for m in self.models:
            total = total + m.split
        return WhereDollarsWent.of(
            sum(m.cost_usd for m in self.models), total, sum(m.idle_usd for m in self.models)
        )

    @property
    def gpu_time(self) -> WhereGpuTimeWent:
        """The week's GPU time and dollars by bound, all versions (shares over the covered part)."""
        total = BoundSplit()
        for m in self.models:
            total = total + m.bound
        return WhereGpuTimeWent.of(
            sum(m.cost_usd for m in self.models), sum(m.gpu_seconds for m in self.models), total
        )

    @property
    def regressions(self) -> tuple[ModelWeek, ...]:
        """Versions whose $/1M output rose ≥ REGRESSION_RATIO × their baseline (at like load where
        comparable, see :attr:`ModelWeek.regression_ratio`), biggest excess in dollars first."""
        hits = [
            m
            for m in self.models
            if (r := m.regression_ratio) is not None
            and r >= REGRESSION_RATIO
            and m.output_tokens >= MIN_OUTPUT_TOKENS
        ]
        hits.sort(key=lambda m: (-(m.excess_usd or 0.0), -(m.regression_ratio or 0.0)))
        return tuple(hits[:TOP_REGRESSIONS])


# ---------------------------------------------------------------------------------------------
# Assembly (pure)
# ---------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Sums:
    cost_usd: float = 0.0  # dollars
    output_tokens: float = 0.0  # tokens
    prompt_tokens: float = 0.0  # tokens
    idle_usd: float = 0.0  # dollars
    idle_gpu_seconds: float | None = None  # GPU-seconds
    util_s: float = 0.0  # Σ util × seconds
    util_w: float = 0.0  # seconds with a util reading
    roof_s: float = 0.0  # Σ roofline × seconds
    roof_w: float = 0.0  # seconds with a roofline reading
    split: DollarSplit = field(default_factory=DollarSplit)
    gpu_seconds: float = 0.0  # GPU-seconds
    bound: BoundSplit = field(default_factory=BoundSplit)
    seconds: float = 0.0  # seconds of data
    tokenless_seconds: float = 0.0  # seconds of it without token counters

    def add(self, r: HourRow) -> None:
        self.seconds += r.seconds
        self.tokenless_seconds += r.tokenless_seconds
        if r.split is not None:
            self.split = self.split + r.split
        if r.bound is not None:
            self.bound = self.bound + r.bound
        self.gpu_seconds += r.gpu_seconds
        self.cost_usd += r.cost_usd
        self.output_tokens += r.output_tokens
        self.prompt_tokens += r.prompt_tokens
        self.idle_usd += r.idle_usd
        if r.idle_gpu_seconds is not None:
            self.idle_gpu_seconds = (self.idle_gpu_seconds or 0.0) + r.idle_gpu_seconds
        if r.gpu_util_ratio is not None and r.seconds > 0:
            self.util_s += r.gpu_util_ratio * r.seconds
            self.util_w += r.seconds
        if r.roofline_ratio is not None and r.seconds > 0:
            self.roof_s += r.roofline_ratio * r.seconds
            self.roof_w += r.seconds


def _quantile(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class _Like:
    ratio: float | None  # this ÷ baseline at like load
    share: float  # 0–1, share of output tokens in matched bands
    excess_usd: float  # dollars above the baseline's cost of the same tokens


def _band_prices(rows: Iterable[HourRow]) -> dict[LoadKey, tuple[float, float]]:
    """(Σ cost, Σ output tokens) per load band."""
    out: dict[LoadKey, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for r in rows:
        if (k := r.load) is not None and r.output_tokens > 0:
            acc = out[k]
            acc[0] += r.cost_usd
            acc[1] += r.output_tokens
    return {k: (v[0], v[1]) for k, v in out.items()}


def like_load(this: Sequence[HourRow], baseline: Sequence[HourRow]) -> _Like:
    """Compare ``this`` with ``baseline`` band by band (see the module docstring)."""
    base = _band_prices(baseline)
    cost = expected = matched = total = 0.0
    for k, (c, t) in _band_prices(this).items():
        total += t
        b = base.get(k)
        if b is None or b[1] <= 0:
            continue
        cost += c
        expected += t * b[0] / b[1]
        matched += t
    share = matched / total if total > 0 else 0.0
    if expected <= 0 or share < MIN_LIKE_SHARE:
        return _Like(None, share, 0.0)
    return _Like(cost / expected, share, cost - expected)


def _trend(
    this: Sequence[HourRow], baseline: Sequence[HourRow], start: float, days: Sequence[float]
) -> VersionTrend:
    hourly: list[list[float]] = [[0.0, 0.0] for _ in range(168)]  # cost, output tokens
    seen_hour = [False] * 168
    daily: list[float | None] = [None] * len(days)
    daily_idle: list[float | None] = [None] * len(days)
    loads: list[LoadKey | None] = [None] * 168
    by_hour: dict[int, list[HourRow]] = defaultdict(list)
    for r in this:
        i = int((r.hour - start) // HOUR_SECONDS)
        if not 0 <= i < 168:
            continue
        by_hour[i].append(r)
        hourly[i][0] += r.cost_usd
        hourly[i][1] += r.output_tokens
        seen_hour[i] = True
        d = day_of(r.hour, days)
        daily[d] = (daily[d] or 0.0) + r.cost_usd
        daily_idle[d] = (daily_idle[d] or 0.0) + r.idle_usd
    for i, rows in by_hour.items():
        # the hour's band: that of its busiest series (one version is usually on one engine)
        busiest = max(rows, key=lambda r: r.output_tokens)
        loads[i] = busiest.load
    per_band: dict[LoadKey, list[float]] = defaultdict(list)
    for r in baseline:
        if (k := r.load) is not None and r.output_tokens > 0:
            per_band[k].append(r.cost_usd / r.output_tokens * 1e6)
    lows: list[float | None] = []
    highs: list[float | None] = []
    for i in range(168):
        vals = per_band.get(loads[i]) if loads[i] is not None else None  # type: ignore[arg-type]
        lows.append(_quantile(vals, 0.25) if vals else None)
        highs.append(_quantile(vals, 0.75) if vals else None)
    return VersionTrend(
        usd_per_1m_output=tuple(
            c / t * 1e6 if seen_hour[i] and t > 0 else None for i, (c, t) in enumerate(hourly)
        ),
        baseline_low=tuple(lows),
        baseline_high=tuple(highs),
        daily_usd=tuple(daily),
        daily_idle_usd=tuple(daily_idle),
    )


def _subject(model: str, version: str) -> str:
    return f"{model} {version}"


def _model_week(
    model: str,
    version: str,
    rs: list[HourRow],
    last_rows: Mapping[Key, list[HourRow]],
    last_by_model: Mapping[str, _Sums],
    by_engine_model: Mapping[tuple[str, str, str], list[HourRow]],
    by_model: Mapping[str, list[HourRow]],
    start: float,
    days: Sequence[float],
) -> ModelWeek:
    """One model version's week: its sums, the week before (its own, else the model's) and the
    like-load comparison against the first baseline that has one."""
    t = _Sums()
    for r in rs:
        t.add(r)
    own_last = _Sums()
    for r in last_rows.get((model, version), []):
        own_last.add(r)
    baseline: str | None = None
    last: float | None = None
    if own_last.output_tokens > 0:
        baseline, last = "version", own_last.cost_usd / own_last.output_tokens * 1e6
    elif last_by_model[model].output_tokens > 0:
        agg = last_by_model[model]
        baseline, last = "model", agg.cost_usd / agg.output_tokens * 1e6
    # like-load baselines, in order of preference
    candidates: list[tuple[str, list[HourRow]]] = [("version", last_rows.get((model, version), []))]
    engines = {(r.node, r.engine, r.model) for r in rs}
    replaced = [r for e in sorted(engines) for r in by_engine_model[e] if r.model_version != version]
    candidates.append(("replaced", replaced))
    candidates.append(("model", [r for r in by_model[model] if r.model_version != version]))
    like, like_kind, like_rows = _Like(None, 0.0, 0.0), None, candidates[0][1]
    for kind, base_rows in candidates:
        if not base_rows:
            continue
        got = like_load(rs, base_rows)
        if got.ratio is not None:
            like, like_kind, like_rows = got, kind, base_rows
            break
    if like_kind is None:  # no like-load baseline: chart against the first that has data
        like_rows = next((b for _, b in candidates if b), [])
    excess = like.excess_usd if like.ratio is not None else None
    if excess is None and last is not None:
        excess = t.cost_usd - t.output_tokens * last / 1e6
    return ModelWeek(
        model=model,
        model_version=version,
        cost_usd=t.cost_usd,
        output_tokens=t.output_tokens,
        prompt_tokens=t.prompt_tokens,
        idle_usd=t.idle_usd,
        last_usd_per_1m_output=last,
        baseline=baseline,
        like_change_ratio=like.ratio,
        like_baseline=like_kind,
        like_share=like.share,
        excess_usd=excess,
        idle_gpu_hours=None if t.idle_gpu_seconds is None else t.idle_gpu_seconds / HOUR_SECONDS,
        gpu_util_ratio=t.util_s / t.util_w if t.util_w > 0 else None,
        roofline_ratio=t.roof_s / t.roof_w if t.roof_w > 0 else None,
        trend=_trend(rs, like_rows, start, days),
        split=t.split,
        gpu_seconds=t.gpu_seconds,
        bound=t.bound,
        tokens_counted=tokens_counted(t.tokenless_seconds, t.seconds),
    )


def assemble(
    rows: Iterable[HourRow],
    *,
    end: float,
    source: str,
    deploys: Sequence[DeployEvent] = (),
    idle_usd: float | None = None,
    last_idle_usd: float | None = None,
    idle_by_node: Mapping[str, float] | None = None,
    utilization: Sequence[UtilRow] | None = None,
    utilization_by: str = "engine",
    unused_gpus: Mapping[tuple[str, str], float] | None = None,
    tz: str = "UTC",
) -> WeeklyReport:
    """Build the report from the hourly rows of the two weeks before ``end`` (pure).

    ``idle_usd``/``idle_by_node``/``utilization`` override what the model rows give (Prometheus
    has per-GPU idle cost, which includes GPUs no engine uses). ``unused_gpus``: dollars this week
    of GPUs no engine used, per (node, GPU model), where the store keeps them. ``tz``: the IANA
    zone whose calendar days the daily figures are."""
    start, last_start = end - WEEK_SECONDS, end - 2 * WEEK_SECONDS
    days = calendar_days(start, end, tz)
    this_rows: dict[Key, list[HourRow]] = defaultdict(list)
    last_rows: dict[Key, list[HourRow]] = defaultdict(list)
    by_engine_model: dict[tuple[str, str, str], list[HourRow]] = defaultdict(list)
    by_model: dict[str, list[HourRow]] = defaultdict(list)
    for r in rows:
        if not last_start <= r.hour < end:
            continue
        key = (r.model, r.model_version)
        (this_rows if r.hour >= start else last_rows)[key].append(r)
        by_engine_model[(r.node, r.engine, r.model)].append(r)
        by_model[r.model].append(r)

    last_by_model: dict[str, _Sums] = defaultdict(_Sums)
    for (model, _), rs in last_rows.items():
        for r in rs:
            last_by_model[model].add(r)
    models = [
        _model_week(model, version, rs, last_rows, last_by_model, by_engine_model, by_model, start, days)
        for (model, version), rs in this_rows.items()
    ]
    models.sort(key=lambda m: (-m.cost_usd, m.model, m.model_version))

    all_this = [r for rs in this_rows.values() for r in rs]
    daily: list[float | None] = [None] * len(days)
    daily_idle: list[float | None] = [None] * len(days)
    node_idle: dict[str, float] = defaultdict(float)
    eng: dict[str, _Sums] = defaultdict(_Sums)
    for r in all_this:
        d = day_of(r.hour, days)
        daily[d] = (daily[d] or 0.0) + r.cost_usd
        daily_idle[d] = (daily_idle[d] or 0.0) + r.idle_usd
        node_idle[r.node] += r.idle_usd
        eng[r.engine].add(r)
    if utilization is None:
        utilization = [
            UtilRow(e, s.util_s / s.util_w if s.util_w > 0 else None, s.cost_usd) for e, s in eng.items()
        ]
    last_total = sum(r.cost_usd for rs in last_rows.values() for r in rs) if last_rows else None
    last_idle = sum(r.idle_usd for rs in last_rows.values() for r in rs) if last_rows else None
    return WeeklyReport(
        start=start,
        end=end,
        source=source,
        total_usd=sum(r.cost_usd for r in all_this),
        last_total_usd=last_total,
        idle_usd=sum(r.idle_usd for r in all_this) if idle_usd is None else idle_usd,
        last_idle_usd=last_idle if idle_usd is None else last_idle_usd,
        models=tuple(models),
        idle_by_node=tuple(
            NodeIdle(n, v)
            for n, v in sorted(
                (node_idle if idle_by_node is None else idle_by_node).items(), key=lambda kv: (-kv[1], kv[0])
            )
        ),
        utilization=tuple(sorted(utilization, key=lambda u: u.group)),
        utilization_by=utilization_by,
        daily_usd=tuple(daily),
        daily_idle_usd=tuple(daily_idle),
        savings=tuple(find_savings(all_this, models, unused_gpus or {})),
        deploys=tuple(d for d in deploys if start <= d.at < end),
        day_starts=days,
        timezone=tz,
        waterfalls=week_over_week(this_rows, last_rows),
    )


def _cheaper_versions(this_week: Sequence[HourRow], models: Sequence[ModelWeek]) -> list[Saving]:
    """A cheaper version of the same model, compared at like load this week."""
    out: list[Saving] = []
    by_version: dict[Key, list[HourRow]] = defaultdict(list)
    for r in this_week:
        by_version[(r.model, r.model_version)].append(r)
    for m in models:
        if m.output_tokens < MIN_OUTPUT_TOKENS:
            continue
        best: tuple[float, str, _Like] | None = None
        for (model, version), rows in by_version.items():
            if model != m.model or version == m.model_version:
                continue
            like = like_load(by_version[(m.model, m.model_version)], rows)
            if like.ratio is None or like.ratio * CHEAPER_BY_RATIO < 1.0:
                continue  # not at least 10 % dearer than that version at like load
            if best is None or like.excess_usd > best[0]:
                best = (like.excess_usd, version, like)
        if best is not None and best[0] >= MIN_SAVING_USD:
            excess, version, like = best
            out.append(
                Saving(
                    "cheaper_version",
                    _subject(m.model, m.model_version),
                    excess,
                    f"version {version} served the same load "
                    f"{(1 - 1 / (like.ratio or 1.0)) * 100:.0f} % cheaper "
                    f"per token (like load, {like.share * 100:.0f} % of tokens compared)",
                )
            )
    return out


def find_savings(
    this_week: Sequence[HourRow],
    models: Sequence[ModelWeek],
    unused_gpus: Mapping[tuple[str, str], float] | None = None,
) -> list[Saving]:
    """Savings opportunities in dollars a week, biggest first (only those the data supports)."""
    out: list[Saving] = []
    for (node, gpu_model), usd in sorted((unused_gpus or {}).items()):
        if usd >= MIN_SAVING_USD:
            what = f"{gpu_model} GPUs" if gpu_model else "GPUs"
            out.append(
                Saving("unused_gpus", node, usd, f"{what} no engine used: release or schedule work on them")
            )
    by_series: dict[SeriesKey, list[HourRow]] = defaultdict(list)
    for r in this_week:
        by_series[r.series].append(r)
    for (node, engine, model, version), rs in sorted(by_series.items()):
        subject = f"{node}/{engine} {_subject(model, version)}"
        idle = sum(r.idle_usd for r in rs)
        idle_gpu_s = [r.idle_gpu_seconds for r in rs if r.idle_gpu_seconds is not None]
        if idle >= MIN_SAVING_USD:
            hours = f"{sum(idle_gpu_s) / HOUR_SECONDS:,.1f} GPU-hours" if idle_gpu_s else "GPU time"
            out.append(Saving("idle", subject, idle, f"{hours} produced no tokens: scale down when idle"))
        # steady hours: the load band did not change from the hour before (no ramp)
        ordered = sorted(rs, key=lambda r: r.hour)
        steady = [
            b
            for a, b in itertools.pairwise(ordered)
            if b.hour - a.hour == HOUR_SECONDS and b.load is not None and a.load == b.load
        ]
        util_s = sum(r.gpu_util_ratio * r.seconds for r in steady if r.gpu_util_ratio is not None)
        util_w = sum(r.seconds for r in steady if r.gpu_util_ratio is not None)
        if util_w > 0:
            util = util_s / util_w
            cost = sum(r.cost_usd for r in steady if r.gpu_util_ratio is not None)
            save = cost * (1.0 - util / TARGET_UTIL_RATIO)
            if util < LOW_UTIL_RATIO and save >= MIN_SAVING_USD:
                out.append(
                    Saving(
                        "low_utilization",
                        subject,
                        save,
                        f"GPUs {util * 100:.0f} % busy over {len(steady)} steady hours "
                        f"(${cost:,.2f}); sized to {TARGET_UTIL_RATIO * 100:.0f} % busy",
                    )
                )
    out.extend(_cheaper_versions(this_week, models))
    out.sort(key=lambda s: (-s.usd_per_week, s.kind, s.subject))
    return out[:TOP_SAVINGS]


# ---------------------------------------------------------------------------------------------
# From cost windows in memory, and from the local store (SQL)
# ---------------------------------------------------------------------------------------------


# The sums an hour row is built from (store names, as agent.records.model_sums names them).
HOUR_SUMS = (
    "seconds",
    "prompt_tokens",
    "generation_tokens",
    "cost_usd",
    "idle_usd",
    "gpu_seconds",
    "gpu_util.s",
    "gpu_util.w",
    "running.s",
    "running.w",
    "roofline.s",
    "roofline.w",
    "prefill_share.s",
    "prefill_share.w",
    "prefill_floor.s",
    "prefill_floor.w",
    *SPLIT_SUMS,
    *BOUND_SUMS,
    "tokenless_seconds",
)
IDLE_GPU_SECONDS = "idle_gpu_seconds"  # GPU-seconds of the minutes without tokens (as the store's)


def hour_row(
    key: SeriesKey, hour: float, s: Mapping[str, float], chain: Mapping[str, float] | None = None
) -> HourRow:
    """One hour of one series from its sums, by name (the store's or :func:`rows_from_windows`'),
    and its minutes' factor chain where it was read (:func:`store_chains`)."""
    node, engine, model, version = key
    return HourRow(
        node,
        engine,
        model,
        version or "unknown",
        hour=hour,
        seconds=s.get("seconds", 0.0),
        prompt_tokens=s.get("prompt_tokens", 0.0),
        output_tokens=s.get("generation_tokens", 0.0),
        cost_usd=s.get("cost_usd", 0.0),
        idle_usd=s.get("idle_usd", 0.0),
        gpu_seconds=s.get("gpu_seconds", 0.0),
        idle_gpu_seconds=s.get(IDLE_GPU_SECONDS),
        gpu_util_ratio=mean_of(s, "gpu_util"),
        requests_running=mean_of(s, "running"),
        roofline_ratio=mean_of(s, "roofline"),
        prefill_share=mean_of(s, "prefill_share"),
        prefill_floor=mean_of(s, "prefill_floor"),
        split=split_from_sums(s),
        bound=bound_from_sums(s),
        tokenless_seconds=s.get("tokenless_seconds", 0.0),
        chain=chain,
    )


def rows_from_windows(windows: Iterable[CostWindow], end: float) -> list[HourRow]:
    """Hourly rows of the two weeks before ``end`` from cost windows (a window belongs to the
    hour bucket holding its start, as a store row belongs to its minute, and its minute's factor
    chain is read from the windows starting in that minute, as the store would hold them)."""
    first = end - 2 * WEEK_SECONDS
    acc: dict[tuple[SeriesKey, int], dict[str, float]] = {}
    minutes: dict[tuple[SeriesKey, float], dict[str, float]] = {}
    for w in windows:
        u = w.usage
        if not first <= u.start < end:
            continue
        key = (u.node, u.engine, u.model, u.model_version)
        i = int((u.start - first) // HOUR_SECONDS)
        sums = acc.setdefault((key, i), {IDLE_GPU_SECONDS: 0.0})
        ms = model_sums(w)
        add_sums(sums, ms)
        add_sums(minutes.setdefault((key, u.start // MINUTE * MINUTE), {}), ms)
        if u.generation_tokens + u.prompt_tokens <= 0:
            sums[IDLE_GPU_SECONDS] += u.gpu_seconds
    chains: dict[tuple[SeriesKey, int], dict[str, float]] = defaultdict(dict)
    for (key, minute), ms in minutes.items():
        add_sums(chains[(key, int((minute - first) // HOUR_SECONDS))], chain_sums(ms))
    return [hour_row(key, first + i * HOUR_SECONDS, s, chains[(key, i)]) for (key, i), s in acc.items()]


def build_from_windows(windows: Iterable[CostWindow], end: float) -> WeeklyReport:
    """The week ending at ``end`` from cost windows (windows older than two weeks or starting at
    or after ``end`` are ignored)."""
    return assemble(rows_from_windows(windows, end), end=end, source="local store")


def rows_from_store_sums(
    sums: Iterable[tuple[SeriesKey, float, Mapping[str, float]]],
    chains: Mapping[tuple[SeriesKey, float], Mapping[str, float]] | None = None,
) -> list[HourRow]:
    """HourRows from :meth:`agent.store.Store.hourly_model_sums` buckets (sums by name), with their
    minutes' factor chains where given (:func:`store_chains`; a bucket without one had no minute
    with the chain)."""
    if chains is None:
        return [hour_row(key, hour, s) for key, hour, s in sums]
    return [hour_row(key, hour, s, chains.get((key, hour), {})) for key, hour, s in sums]


# Why an hour: the factor chain is read minute by minute (a minute's chain sums are not sums of its
# columns, so no SQL sum gives an hour's), and an hour of minute records of a few dozen series is a
# few MB in Python at once, where the two weeks would be gigabytes.
CHAIN_READ_SECONDS = HOUR_SECONDS


def store_chains(
    store: Store, start: float, end: float, bucket_seconds: float = HOUR_SECONDS
) -> dict[tuple[SeriesKey, float], dict[str, float]]:
    """The factor chain's sums (:func:`agent.cost.explain.chain_sums`) of every model minute in
    [start, end), added per series and bucket as :meth:`agent.store.Store.hourly_model_sums`
    buckets them: a window's factors are ratios of its minutes' chain sums, so the report's
    waterfall reads what ``infercost explain --state-dir`` reads of the same minutes."""
    out: dict[tuple[SeriesKey, float], dict[str, float]] = defaultdict(dict)
    t = start
    while t < end:
        hi = min(end, t + CHAIN_READ_SECONDS)
        for r in store.records(t, hi, ("model",)):
            chain = chain_sums(r.sums)
            if chain:
                key = (r.label("node"), r.label("engine"), r.label("model"), r.label("model_version"))
                # the bucket as the SQL computes it (truncated, from start)
                add_sums(out[(key, start + int((r.minute - start) / bucket_seconds) * bucket_seconds)], chain)
        t = hi
    return dict(out)


def build_from_store(path: Path, end: float, tz: str = "UTC") -> WeeklyReport:
    """The week ending at ``end`` from the store file at ``path`` (aggregated in SQL)."""
    import sqlite3

    from agent.store import Store, StoreError  # sqlite only when this path is taken

    if not path.exists():
        raise ReportError(f"{path}: no store here; fix: pass the agent's state directory (--state-dir)")
    try:
        store = Store(path)
    except (StoreError, sqlite3.Error) as err:
        raise ReportError(f"{path}: cannot open the store: {err}") from None
    try:
        sums = store.hourly_model_sums(end - 2 * WEEK_SECONDS, end, HOUR_SECONDS, HOUR_SUMS)
        chains = store_chains(store, end - 2 * WEEK_SECONDS, end, HOUR_SECONDS)
        deploys = store.deploys(end - WEEK_SECONDS)
        # per-GPU idle (GPUs no engine uses included), as the Prometheus path reads it; an older
        # store without GPU dollars falls back to the model rows
        idle_by_node = store.gpu_idle_by_node(end - WEEK_SECONDS, end)
        unused = store.gpu_unallocated_by_node(end - WEEK_SECONDS, end)
        last_idle = store.gpu_idle_by_node(end - 2 * WEEK_SECONDS, end - WEEK_SECONDS)
    except sqlite3.Error as err:
        raise ReportError(f"{path}: cannot read the store: {err}") from None
    finally:
        store.close()
    return assemble(
        rows_from_store_sums(sums, chains),
        end=end,
        source="local store",
        deploys=deploys,
        idle_usd=sum(idle_by_node.values()) if idle_by_node else None,
        last_idle_usd=sum(last_idle.values()) if last_idle else None,
        idle_by_node=idle_by_node or None,
        unused_gpus=unused,
        tz=tz,
    )
