"""Weekly cost report: the data. One :class:`WeeklyReport` per week ending at ``end``, built either
from Prometheus' HTTP API (the fleet) or from a node's per-minute :class:`CostWindow` records (the
local store). Both paths fill the same per-(model, version) totals and share :func:`assemble`, so
the two reports of the same traffic agree.

Every $/token figure is a ratio of sums (Σ cost / Σ tokens over the week), never a mean of ratios.
The Prometheus path reads the agents' raw counters with ``increase(…[1w])`` at ``end`` and at
``end offset 1w``: correct on any Prometheus holding two weeks of history, whether or not the
fleet recording rules were deployed all that time, and cheap at one query set per week.
"""

from __future__ import annotations

import json
import logging
import math
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.clock import Clock, SystemClock
from agent.samples import CostWindow

logger = logging.getLogger(__name__)

DAY_SECONDS = 86_400.0
WEEK_SECONDS = 7 * DAY_SECONDS
# Why 1.2×: with an unchanged deployment the weekly ratio of sums of a busy model moves well
# under ±10 % (the load mix is similar week to week); +20 % is a change someone made.
REGRESSION_RATIO = 1.2
# Why 1 M output tokens: below that a few idle hours dominate a version's weekly $/1M, and a
# "regression" is the noise of a barely used version.
MIN_OUTPUT_TOKENS = 1e6
TOP_REGRESSIONS = 5
HTTP_TIMEOUT_S = 30.0  # seconds; a week of raw counters is a heavy-ish query on a big Prometheus

Key = tuple[str, str]  # (model, model_version)


class ReportError(Exception):
    """The report's data source failed (Prometheus unreachable, an API error)."""


@dataclass(frozen=True, slots=True)
class ModelWeek:
    """One model version over the week, with the baseline it is compared with."""

    model: str
    model_version: str
    cost_usd: float  # dollars this week
    output_tokens: float  # tokens this week
    prompt_tokens: float  # tokens this week
    idle_usd: float  # dollars of this version's cost in windows without tokens
    last_usd_per_1m_output: float | None  # dollars per 1M output tokens last week (the baseline)
    baseline: str | None  # "version" (same version last week), "model" (all its versions), None

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
        """This week's $/1M output ÷ the baseline's; None when either is absent."""
        now, before = self.usd_per_1m_output, self.last_usd_per_1m_output
        return now / before if now is not None and before else None


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
    daily_usd: tuple[float, ...] = field(default=())  # dollars per day, oldest first (7 values)

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
    def regressions(self) -> tuple[ModelWeek, ...]:
        """Versions whose $/1M output rose ≥ REGRESSION_RATIO × their baseline, worst first."""
        hits = [
            m
            for m in self.models
            if m.change_ratio is not None
            and m.change_ratio >= REGRESSION_RATIO
            and m.output_tokens >= MIN_OUTPUT_TOKENS
        ]
        hits.sort(key=lambda m: m.change_ratio or 0.0, reverse=True)
        return tuple(hits[:TOP_REGRESSIONS])


@dataclass(slots=True)
class Totals:
    """Running sums of one (model, version) over one week."""

    cost_usd: float = 0.0  # dollars
    output_tokens: float = 0.0  # tokens
    prompt_tokens: float = 0.0  # tokens
    idle_usd: float = 0.0  # dollars


def assemble(
    *,
    start: float,
    end: float,
    source: str,
    this_week: Mapping[Key, Totals],
    last_week: Mapping[Key, Totals],
    idle_usd: float,
    last_idle_usd: float | None,
    idle_by_node: Mapping[str, float],
    utilization: Sequence[UtilRow],
    utilization_by: str,
    daily_usd: Sequence[float],
) -> WeeklyReport:
    """Build the report from per-(model, version) totals of both weeks (pure)."""
    last_by_model: dict[str, Totals] = defaultdict(Totals)
    for (model, _), t in last_week.items():
        agg = last_by_model[model]
        agg.cost_usd += t.cost_usd
        agg.output_tokens += t.output_tokens
    models = []
    for (model, version), t in this_week.items():
        baseline: str | None = None
        last: float | None = None
        own = last_week.get((model, version))
        if own is not None and own.output_tokens > 0:
            baseline, last = "version", own.cost_usd / own.output_tokens * 1e6
        elif last_by_model[model].output_tokens > 0:  # a new version: compare with its model
            agg = last_by_model[model]
            baseline, last = "model", agg.cost_usd / agg.output_tokens * 1e6
        models.append(
            ModelWeek(
                model=model,
                model_version=version,
                cost_usd=t.cost_usd,
                output_tokens=t.output_tokens,
                prompt_tokens=t.prompt_tokens,
                idle_usd=t.idle_usd,
                last_usd_per_1m_output=last,
                baseline=baseline,
            )
        )
    models.sort(key=lambda m: (-m.cost_usd, m.model, m.model_version))
    last_total = sum(t.cost_usd for t in last_week.values()) if last_week else None
    return WeeklyReport(
        start=start,
        end=end,
        source=source,
        total_usd=sum(t.cost_usd for t in this_week.values()),
        last_total_usd=last_total,
        idle_usd=idle_usd,
        last_idle_usd=last_idle_usd,
        models=tuple(models),
        idle_by_node=tuple(
            NodeIdle(n, v) for n, v in sorted(idle_by_node.items(), key=lambda kv: (-kv[1], kv[0]))
        ),
        utilization=tuple(sorted(utilization, key=lambda u: u.group)),
        utilization_by=utilization_by,
        daily_usd=tuple(daily_usd),
    )


# ---------------------------------------------------------------------------------------------
# From the local store: per-minute CostWindow records
# ---------------------------------------------------------------------------------------------


def build_from_windows(windows: Iterable[CostWindow], end: float) -> WeeklyReport:
    """The week ending at ``end`` from cost windows (a window belongs to the week holding its
    end time); windows older than two weeks or after ``end`` are ignored."""
    start, last_start = end - WEEK_SECONDS, end - 2 * WEEK_SECONDS
    this_week: dict[Key, Totals] = defaultdict(Totals)
    last_week: dict[Key, Totals] = defaultdict(Totals)
    idle_this = idle_last = 0.0
    seen_last = False
    idle_by_node: dict[str, float] = defaultdict(float)
    util_sum: dict[str, float] = defaultdict(float)  # Σ util × GPU-seconds
    util_weight: dict[str, float] = defaultdict(float)  # Σ GPU-seconds with a util reading
    engine_cost: dict[str, float] = defaultdict(float)
    daily = [0.0] * 7
    for w in windows:
        u = w.usage
        if not last_start < u.end <= end:
            continue
        key = (u.model, u.model_version)
        current = u.end > start
        totals = (this_week if current else last_week)[key]
        totals.cost_usd += w.cost_usd
        totals.output_tokens += u.generation_tokens
        totals.prompt_tokens += u.prompt_tokens
        totals.idle_usd += w.idle_usd
        if not current:
            idle_last += w.idle_usd
            seen_last = True
            continue
        idle_this += w.idle_usd
        idle_by_node[u.node] += w.idle_usd
        engine_cost[u.engine] += w.gpu_time_usd
        if u.gpu_util_ratio is not None and u.gpu_seconds > 0:
            util_sum[u.engine] += u.gpu_util_ratio * u.gpu_seconds
            util_weight[u.engine] += u.gpu_seconds
        # (start, end] splits into 7 days; a window ending exactly at a day's end belongs to it.
        daily[min(6, max(0, math.ceil((u.end - start) / DAY_SECONDS) - 1))] += w.cost_usd
    util = [
        UtilRow(engine, util_sum[engine] / util_weight[engine] if util_weight[engine] > 0 else None, cost)
        for engine, cost in engine_cost.items()
    ]
    return assemble(
        start=start,
        end=end,
        source="local store",
        this_week=this_week,
        last_week=last_week,
        idle_usd=idle_this,
        last_idle_usd=idle_last if seen_last else None,
        idle_by_node=idle_by_node,
        utilization=util,
        utilization_by="engine",
        daily_usd=daily,
    )


# ---------------------------------------------------------------------------------------------
# From Prometheus' HTTP API (the fleet)
# ---------------------------------------------------------------------------------------------

Fetch = Callable[[str], Any]  # URL → decoded JSON body


def _http_get_json(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as err:
        try:
            detail = json.loads(err.read()).get("error", "")
        except (ValueError, OSError):
            detail = ""
        raise ReportError(f"Prometheus answered HTTP {err.code}: {detail or err.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise ReportError(f"cannot query Prometheus: {err}") from None


class _Prom:
    """The few Prometheus HTTP API calls the report makes."""

    def __init__(self, base_url: str, fetch: Fetch) -> None:
        self.base = base_url.rstrip("/")
        self.fetch = fetch

    def _call(self, path: str, params: Mapping[str, str]) -> list[dict[str, Any]]:
        body = self.fetch(f"{self.base}{path}?{urllib.parse.urlencode(params)}")
        if not isinstance(body, dict) or body.get("status") != "success":
            raise ReportError(f"Prometheus query failed: {body!r:.300}")
        return list(body["data"]["result"])

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        """Instant vector at ``at``."""
        return self._call("/api/v1/query", {"query": expr, "time": f"{at:.3f}"})

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """Range matrix from ``start`` to ``end``."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:.0f}s"}
        return self._call("/api/v1/query_range", params)


def _value(sample: Mapping[str, Any]) -> float | None:
    v = float(sample["value"][1])
    return None if math.isnan(v) or math.isinf(v) else v


def _by_key(result: Sequence[Mapping[str, Any]]) -> dict[Key, float]:
    out: dict[Key, float] = {}
    for s in result:
        v = _value(s)
        if v is not None:
            out[(s["metric"].get("model", ""), s["metric"].get("model_version", "unknown"))] = v
    return out


def _week_totals(prom: _Prom, at: float) -> dict[Key, Totals]:
    by = "sum by (model, model_version) (increase(infercost_{}[1w]))"
    series = {
        "cost_usd": _by_key(prom.query(by.format("cost_usd_total"), at)),
        "output_tokens": _by_key(prom.query(by.format("generation_tokens_total"), at)),
        "prompt_tokens": _by_key(prom.query(by.format("prompt_tokens_total"), at)),
        "idle_usd": _by_key(prom.query(by.format("idle_cost_usd_total"), at)),
    }
    totals: dict[Key, Totals] = defaultdict(Totals)
    for attr, values in series.items():
        for key, v in values.items():
            setattr(totals[key], attr, v)
    return dict(totals)


def _scalar(prom: _Prom, expr: str, at: float) -> float | None:
    result = prom.query(expr, at)
    return _value(result[0]) if result else None


# Attach gpu_model to per-GPU series from infercost_gpu_info (any GPU seen during the week).
GPU_MODEL_JOIN = (
    "* on (node, gpu) group_left (gpu_model)"
    " max by (node, gpu, gpu_model) (max_over_time(infercost_gpu_info[1w]))"
)


def build_from_prometheus(
    url: str, end: float | None = None, clock: Clock | None = None, fetch: Fetch | None = None
) -> WeeklyReport:
    """The fleet's week ending at ``end`` (default: now by ``clock``) from Prometheus' HTTP API at
    ``url`` (e.g. ``http://prometheus:9090``). Raises :class:`ReportError` when it cannot."""
    end = (clock or SystemClock()).now() if end is None else end
    prom = _Prom(url, fetch or _http_get_json)
    start = end - WEEK_SECONDS
    this_week = _week_totals(prom, end)
    last_week = _week_totals(prom, start)
    idle_expr = "sum(increase(infercost_gpu_idle_cost_usd_total[1w]))"
    idle = _scalar(prom, idle_expr, end)
    last_idle = _scalar(prom, idle_expr, start)
    idle_by_node = {
        s["metric"].get("node", ""): v
        for s in prom.query("sum by (node) (increase(infercost_gpu_idle_cost_usd_total[1w]))", end)
        if (v := _value(s)) is not None
    }
    util = {
        s["metric"].get("gpu_model", ""): _value(s)
        for s in prom.query(
            f"avg by (gpu_model) (avg_over_time(infercost_gpu_utilization_ratio[1w]) {GPU_MODEL_JOIN})", end
        )
    }
    gpu_cost = {
        s["metric"].get("gpu_model", ""): _value(s) or 0.0
        for s in prom.query(
            f"sum by (gpu_model) (increase(infercost_gpu_cost_usd_total[1w]) {GPU_MODEL_JOIN})", end
        )
    }
    daily_result = prom.query_range(
        "sum(increase(infercost_cost_usd_total[1d]))", start + DAY_SECONDS, end, DAY_SECONDS
    )
    daily = [0.0] * 7
    if daily_result:
        for ts, v in daily_result[0]["values"]:
            i = round((float(ts) - start) / DAY_SECONDS) - 1
            if 0 <= i < 7 and not math.isnan(float(v)):
                daily[i] = float(v)
    logger.info("weekly report from %s: %d model versions", url, len(this_week))
    return assemble(
        start=start,
        end=end,
        source=f"Prometheus {url}",
        this_week=this_week,
        last_week=last_week,
        idle_usd=idle or 0.0,
        last_idle_usd=last_idle,
        idle_by_node=idle_by_node,
        utilization=[
            UtilRow(g, util.get(g), gpu_cost.get(g, 0.0)) for g in sorted(set(util) | set(gpu_cost))
        ],
        utilization_by="gpu_model",
        daily_usd=daily,
    )
