"""The ledger: cumulative counters and current gauges built from each tick, and the immutable
snapshot that exporters (Prometheus, OTLP) and the demo view read at their own pace.

Gauges such as $ per 1M tokens are computed over a trailing window of ticks as a ratio of sums,
so a quiet 5-second tick does not make the gauge flicker.
"""

from __future__ import annotations

import logging
import math
import platform
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agent.catalog import COST_LABELS_MARK, MetricSpec
from agent.config import EngineConfig, cost_label_name
from agent.cost.latency import accumulate
from agent.cost.model import usd_per_million
from agent.cost.quantiles import quantile
from agent.cost.window import TickResult
from agent.measures import BASE_LABELS, MEASURES
from agent.records import model_sums
from agent.samples import CostWindow, EngineScrape, GpuSample, Histogram, NvmlRound, UsageWindow

logger = logging.getLogger(__name__)

ModelKey = tuple[str, str, str]  # (engine, model, model_version)


@dataclass(frozen=True, slots=True)
class GpuState:
    """One GPU's latest reading and its cumulative cost."""

    sample: GpuSample
    usd_per_hour: float | None = None  # dollars per GPU-hour, None when unpriced
    # dollars since the agent started, over the ticks the book priced; None (absent, never 0) until
    # the first: an unpriced GPU's cost is unknown, not free
    cost_usd_total: float | None = None
    idle_cost_usd_total: float | None = None  # dollars of GPU time that made no tokens (as above)

    @property
    def gpu(self) -> str:
        """The `gpu` label: NVML index, or the MIG UUID for a MIG instance."""
        return self.sample.uuid if self.sample.mig_parent_uuid else str(self.sample.index)


@dataclass(frozen=True, slots=True)
class EngineState:
    """One engine endpoint's health."""

    engine: str
    kind: str
    up: bool
    scrape_duration_seconds: float  # seconds
    error: str | None = None
    invalid_series: int = 0  # series refused in the last scrape (non-finite, negative, out of range)
    dropped_series: int = 0  # series of models beyond max_models, folded into model="other"
    # dollars of its share of the GPUs it holds since the agent started, models or not (a multi-node
    # engine's worker pods count no tokens); None (absent) until a tick priced all of them
    gpu_cost_usd_total: float | None = None


@dataclass(frozen=True, slots=True)
class EngineCostInfo:
    """Who pays for one engine: its pod, role, multi-node group and cost labels (the labels of
    ``infercost_engine_cost_info``)."""

    engine: str
    namespace: str = ""  # the pod's namespace; "" for a static engine
    pod: str = ""
    role: str = "both"  # prefill / decode / both
    group: str = ""  # multi-node group; "" for none
    group_leader: bool = True
    labels: Mapping[str, str] = field(default_factory=dict)  # cost label key (team) → value

    @staticmethod
    def of(e: EngineConfig) -> EngineCostInfo:
        """The cost identity of a configured or discovered engine."""
        return EngineCostInfo(e.name, e.namespace, e.pod, e.role, e.group, e.group_leader, dict(e.labels))

    def as_json(self) -> dict[str, Any]:
        """This identity as the history keeps it (agent.sinks.costlabels)."""
        return {
            "namespace": self.namespace,
            "pod": self.pod,
            "role": self.role,
            "group": self.group,
            "group_leader": self.group_leader,
            "labels": dict(sorted(self.labels.items())),
        }


@dataclass(frozen=True, slots=True)
class ModelState:
    """One (engine, model, model_version): cumulative counters and gauges over the trailing window."""

    engine: str
    model: str
    model_version: str
    # tokens since the agent started; None (absent, never 0) for an engine that counts no tokens
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None  # tokens (as above)
    # dollars over the windows whose every GPU was priced; None (absent, never 0) until the first
    cost_usd_total: float | None = None
    energy_cost_usd_total: float | None = None  # dollars (as above)
    idle_cost_usd_total: float | None = None  # dollars (as above)
    gpu_seconds_total: float = 0.0  # GPU-seconds
    energy_joules_total: float = 0.0  # joules
    prompt_tokens_per_second: float | None = None  # tokens/s over the trailing window
    generation_tokens_per_second: float | None = None  # tokens/s
    usd_per_1m_output_tokens: float | None = None  # dollars per 1M output tokens
    usd_per_1m_tokens: float | None = None  # dollars per 1M prompt + output tokens
    cost_usd_per_hour: float | None = None  # dollars per hour
    gpu_utilization_ratio: float | None = None  # 0–1
    memory_bandwidth_ratio: float | None = None  # 0–1
    power_watts: float | None = None  # watts
    roofline_efficiency_ratio: float | None = None  # 0–1+
    kv_cache_usage_ratio: float | None = None  # 0–1
    requests_running: float | None = None  # requests
    ttft_p99_seconds: float | None = None  # seconds
    itl_p99_seconds: float | None = None  # seconds
    idle_cost_usd_per_hour: float | None = None  # dollars per hour idle over the trailing window
    prompt_cost_usd_total: float | None = None  # dollars of prefill time; None: the engine has no phase times
    usage_cost_usd_total: float | None = None  # dollars weighted by GPU busy time; None: utilisation unknown
    prefix_cache_saved_usd_total: float | None = None  # dollars the cached prompt tokens would have cost
    usd_per_1m_prompt_tokens: float | None = None  # dollars of prefill per 1M prompt tokens (trailing)
    usd_per_1m_output_tokens_decode: float | None = None  # dollars of decode per 1M output tokens (trailing)
    preemptions_total: float = 0.0  # requests preempted (KV cache full), counter
    requests_waiting: float | None = None  # requests queued (last value)
    ttft_p50_seconds: float | None = None  # seconds, trailing window
    ttft_p95_seconds: float | None = None  # seconds
    itl_p50_seconds: float | None = None  # seconds
    itl_p95_seconds: float | None = None  # seconds
    e2e_p50_seconds: float | None = None  # seconds, end-to-end request latency
    e2e_p95_seconds: float | None = None  # seconds
    e2e_p99_seconds: float | None = None  # seconds
    gpu_model: str | None = None  # the GPUs it runs on, as NVML names them (None: a CPU engine)
    throttled_gpu_seconds_total: float | None = None  # GPU-seconds its GPUs spent throttled
    priority_class: str | None = None  # traffic class from the engine config
    usd_per_1m_output_tokens_floor: float | None = None  # at the roofline, running batch (trailing)
    usd_per_1m_output_tokens_floor_max_batch: float | None = None  # at the largest batch the KV holds
    anomaly_score: float | None = None  # > 1 means anomalous
    # the engines' latency histograms re-based (agent.cost.latency): cumulative since the agent
    # started, never decreasing, the engine's own le bounds; seconds
    ttft_histogram: Histogram | None = None
    itl_histogram: Histogram | None = None
    e2e_histogram: Histogram | None = None
    # where GPU time went (agent.cost.bound): bound → GPU-seconds / GPU dollars since the agent
    # started; None until a window of this model version had every GPU measured by GPM
    bound_gpu_seconds_total: Mapping[str, float] | None = None
    bound_cost_usd_total: Mapping[str, float] | None = None
    # values of the table's model rows without a field, derived from their aggregation over the
    # windows' sums (see _DERIVED): a counter since start, a mean or ratio over the trailing window
    derived: Mapping[str, float | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything the exporters publish, at one instant."""

    node: str
    version: str
    timestamp: float  # epoch seconds of the last tick
    nvml_up: bool | None = None  # None: no NVML backend configured
    driver_version: str | None = None  # the NVIDIA driver NVML last reported; None: unknown
    gpus: tuple[GpuState, ...] = ()
    engines: tuple[EngineState, ...] = ()
    models: tuple[ModelState, ...] = ()
    alerts_firing: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (rule, severity) → count
    outbox_pending: Mapping[str, int] = field(default_factory=dict)  # sink → undelivered messages
    store_up: bool | None = None  # None: no history store configured; False: writes failing
    store_files_recovered_total: int = 0  # damaged SQLite files moved aside and recreated
    kube_engines_over_cap: int | None = None  # engine pods beyond kubernetes.max_engines; None: no discovery
    store_dropped_seconds_total: float = 0.0  # seconds of history (whole minutes) dropped: store failing
    config_reload_success: bool | None = None  # the last load of the price book and rules worked
    # (engine, model, version) → epoch seconds when it replaced another version
    deploys: Mapping[ModelKey, float] = field(default_factory=dict)
    # GPU or MIG UUID → (namespace, pod) holding it per the kubelet, for pods that are not scraped
    gpu_pods: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    python_version: str = platform.python_version()
    budgets: tuple[tuple[str, str, float], ...] = ()  # (scope, name, dollars per month) from config
    engine_info: tuple[EngineCostInfo, ...] = ()  # per engine, expired with it
    cost_label_keys: tuple[str, ...] = ()  # the node's cost label keys (config), sorted


def _merged_p99(deltas: list[Histogram | None], q: float = 0.99) -> float | None:
    """A quantile (p99 unless ``q`` says) of the trailing window's observations: bucket deltas
    summed (same layout only) first."""
    merged: Histogram | None = None
    for h in deltas:
        if h is None:
            continue
        if merged is None or [le for le, _ in merged.buckets] != [le for le, _ in h.buckets]:
            merged = h  # the first, or a new bucket layout: start again from it
        else:
            merged = Histogram(
                tuple((le, a + b) for (le, a), (_, b) in zip(merged.buckets, h.buckets, strict=True)),
                merged.sum + h.sum,
                merged.count + h.count,
            )
    return None if merged is None else quantile(merged, q)


def _add(total: float, delta: float | None) -> float:
    """A counter's new total: monotonic by construction (a negative, NaN or infinite delta adds 0)."""
    if delta is None or not math.isfinite(delta) or delta <= 0:
        return total
    nxt = total + delta
    return nxt if math.isfinite(nxt) else total


def _add_opt(total: float | None, delta: float | None) -> float | None:
    """A counter that stays absent until its first known value (then as :func:`_add`)."""
    if delta is None:
        return total
    return _add(0.0 if total is None else total, delta)


def _counted(tokens: float, u: UsageWindow) -> float | None:
    """A window's tokens, None where its engine counts none (absent, not 0)."""
    return tokens if u.tokens_counted else None


def _add_priced(total: float | None, delta: float | None, priced: bool) -> float | None:
    """A dollar counter: absent until the first priced delta; an unpriced delta is unknown and adds
    nothing (its dollars are not 0, they are not known)."""
    return _add_opt(total, delta) if priced else total


def _phase_prices(recent: deque[CostWindow]) -> tuple[float | None, float | None]:
    """($ per 1M prompt tokens, $ per 1M output tokens of decode) over the windows with a split."""
    split = [w for w in recent if w.prompt_usd is not None and w.priced]
    if not split:
        return None, None
    prompt = usd_per_million(
        sum(w.prompt_usd or 0.0 for w in split), sum(w.usage.prompt_tokens for w in split)
    )
    output = usd_per_million(sum(w.output_usd for w in split), sum(w.usage.generation_tokens for w in split))
    return prompt, output


def _add_bounds(
    total: Mapping[str, float] | None, delta: Mapping[str, float] | None
) -> Mapping[str, float] | None:
    """Per-bound counters: each bound as :func:`_add`; absent until the first measured window."""
    if delta is None:
        return total
    base = total or {}
    return {b: _add(base.get(b, 0.0), delta.get(b)) for b in {**base, **delta}}


# The table's exported model rows without a field: the ledger derives them from their aggregation
# over the windows' stored sums (agent.records.model_sums), the same formula as their rule signal —
# a counter's sum since the agent started; a mean or a ratio of sums over the trailing window.
_DERIVED: tuple[tuple[str, str, tuple[str, ...], Callable[[Sequence[float]], float | None]], ...] = tuple(
    (m.name, m.aggregation, m.formula.inputs, m.formula.function())
    for m in MEASURES
    if m.source == "model" and m.exported and not m.field and m.formula is not None
)


def _derive_counters(prev: Mapping[str, float | None], w: CostWindow) -> dict[str, float | None]:
    sums = model_sums(w)
    out = dict(prev)
    for name, agg, inputs, fn in _DERIVED:
        if agg == "sum":
            total = out.get(name)
            out[name] = _add(0.0 if total is None else total, fn([sums.get(n, 0.0) for n in inputs]))
    return out


def _derive_gauges(prev: Mapping[str, float | None], recent: deque[CostWindow]) -> dict[str, float | None]:
    out = {k: v for k, v in prev.items() if any(n == k and a == "sum" for n, a, _, _ in _DERIVED)}
    totals: dict[str, float] = {}
    for w in recent:
        for k, v in model_sums(w).items():
            totals[k] = totals.get(k, 0.0) + v
    for name, agg, inputs, fn in _DERIVED:
        if agg != "sum":
            out[name] = fn([totals.get(n, 0.0) for n in inputs]) if recent else None
    return out


def _wmean(pairs: list[tuple[float | None, float]]) -> float | None:
    num = den = 0.0
    for v, w in pairs:
        if v is not None and w > 0:
            num += v * w
            den += w
    return num / den if den > 0 else None


# Why an hour: a model version replaced by a deploy, an engine whose pod is gone or a model name a
# hostile page invented once stops moving; an hour keeps it on /metrics through the dashboards'
# before/after views and the fleet rules' 1-hour rates, then lets it go (its history stays in the
# store). Without it such series live as long as the process.
SERIES_EXPIRE_SECONDS = 3600.0
# Why 4,096: engines × their max_models (the per-scrape cap) on a busy node is a few hundred; this
# bounds what a stream of new names can hold inside the hour above.
MAX_MODEL_SERIES = 4096


class Ledger:
    """Accumulates ticks into counters and trailing gauges; hands out immutable snapshots.

    A model version or engine not seen for ``expire_after_seconds`` leaves the ledger (and so
    ``/metrics`` and OTLP); beyond :data:`MAX_MODEL_SERIES` model versions the least recently
    seen go first. Either is counted in ``expired_series``."""

    def __init__(
        self,
        node: str,
        version: str,
        trailing_seconds: float = 60.0,
        expire_after_seconds: float = SERIES_EXPIRE_SECONDS,
        max_model_series: int = MAX_MODEL_SERIES,
    ) -> None:
        self.node = node
        self.version = version
        self.trailing_seconds = trailing_seconds
        self.expire_after_seconds = expire_after_seconds
        self.max_model_series = max_model_series
        self.expired_series = 0  # model versions and engines expired since start
        self._model_seen: dict[ModelKey, float] = {}  # epoch seconds of each version's last window
        self._engine_seen: dict[str, float] = {}  # epoch seconds of each engine's last scrape
        self._gpus: dict[str, GpuState] = {}
        self._engines: dict[str, EngineState] = {}
        self._models: dict[ModelKey, ModelState] = {}
        self._recent: dict[ModelKey, deque[CostWindow]] = {}
        self._nvml_up: bool | None = None
        self._driver_version: str | None = None
        self._timestamp = 0.0
        self._alerts: Mapping[tuple[str, str], int] = {}
        self._outbox: Mapping[str, int] = {}
        self._scores: dict[ModelKey, float] = {}
        self._alert_keys: dict[tuple[str, str], None] = {}  # every (rule, severity) known: exported as 0
        self._deploys: dict[ModelKey, float] = {}
        self._engine_gpu_cost: dict[str, float] = {}  # engine → dollars of its GPUs since start
        self._engine_info: dict[str, EngineCostInfo] = {}
        self._cost_label_keys: tuple[str, ...] = ()

    def observe_engines(self, engines: Iterable[EngineConfig], cost_label_keys: tuple[str, ...]) -> None:
        """Record who pays for each engine scraped now; an engine that leaves keeps its last identity
        until it expires (its counters stay on /metrics that long and must still join)."""
        self._cost_label_keys = cost_label_keys
        for e in engines:
            self._engine_info[e.name] = EngineCostInfo.of(e)

    def observe_nvml(self, rnd: NvmlRound | None) -> None:
        """Record the latest NVML round (None: no backend)."""
        if rnd is None:
            self._nvml_up = None
            return
        self._nvml_up = rnd.up
        self._driver_version = rnd.driver_version or self._driver_version
        if not rnd.up:  # the library is gone: no GPU reading is current any more
            for uuid, st in self._gpus.items():
                s0 = st.sample
                down = GpuSample(
                    s0.index, s0.uuid, s0.name, rnd.timestamp, up=False, mig_parent_uuid=s0.mig_parent_uuid
                )
                self._gpus[uuid] = replace(st, sample=down)
            return
        for g in rnd.gpus:
            prev = self._gpus.get(g.uuid)
            self._gpus[g.uuid] = replace(prev, sample=g) if prev else GpuState(sample=g)

    def observe_scrape(self, sc: EngineScrape) -> None:
        """Record an engine's latest scrape health."""
        self._engine_seen[sc.engine] = sc.timestamp
        self._engines[sc.engine] = EngineState(
            sc.engine,
            sc.kind,
            sc.up,
            sc.duration_seconds,
            sc.error,
            invalid_series=len(sc.invalid_series),
            dropped_series=sc.dropped_series,
        )

    def declare_alert_rules(self, keys: Iterable[tuple[str, str]]) -> None:
        """Name the loaded rules as (rule id, severity): each is exported, at 0 while not firing, so
        "alerts firing" reads 0 rather than "no data" on a quiet node."""
        for k in keys:
            self._alert_keys.setdefault(k, None)
        self._alerts = {k: self._alerts.get(k, 0) for k in self._alert_keys} | dict(self._alerts)

    def set_alerts(self, firing: Mapping[tuple[str, str], int], outbox: Mapping[str, int]) -> None:
        """Record alert counts and undelivered notifications; a rule seen once stays exported (at 0)."""
        for k in firing:
            self._alert_keys.setdefault(k, None)
        self._alerts = {k: int(firing.get(k, 0)) for k in self._alert_keys}
        self._outbox = dict(outbox)

    def set_anomaly_score(self, key: ModelKey, score: float | None) -> None:
        """Record the latest anomaly score of a model version."""
        if score is None:
            self._scores.pop(key, None)
        else:
            self._scores[key] = score

    def apply(self, tick: TickResult) -> None:
        """Add one tick's windows and GPU costs."""
        self._timestamp = tick.end
        for gt in tick.gpus:
            gprev = self._gpus.get(gt.sample.uuid) or GpuState(sample=gt.sample)
            priced_gpu = gt.usd_per_hour is not None
            self._gpus[gt.sample.uuid] = replace(
                gprev,
                sample=gt.sample,
                usd_per_hour=gt.usd_per_hour,
                cost_usd_total=_add_priced(gprev.cost_usd_total, gt.cost_usd, priced_gpu),
                idle_cost_usd_total=_add_priced(gprev.idle_cost_usd_total, gt.idle_usd, priced_gpu),
            )
        for engine, usd in tick.engine_gpu_usd.items():
            self._engine_gpu_cost[engine] = self._engine_gpu_cost.get(engine, 0.0) + usd
        for w in tick.windows:
            u = w.usage
            key = (u.engine, u.model, u.model_version)
            recent = self._recent.setdefault(key, deque())
            recent.append(w)
            while recent and recent[0].usage.end <= tick.end - self.trailing_seconds:
                recent.popleft()
            prev = self._models.get(key)
            if prev is None:
                if any(k[:2] == key[:2] for k in self._models):  # a new version of a served model
                    self._deploys[key] = u.end
                prev = ModelState(u.engine, u.model, u.model_version)
            self._models[key] = self._gauges(
                replace(
                    prev,
                    prompt_tokens_total=_add_opt(prev.prompt_tokens_total, _counted(u.prompt_tokens, u)),
                    generation_tokens_total=_add_opt(
                        prev.generation_tokens_total, _counted(u.generation_tokens, u)
                    ),
                    cost_usd_total=_add_priced(prev.cost_usd_total, w.cost_usd, w.priced),
                    energy_cost_usd_total=_add_priced(prev.energy_cost_usd_total, w.energy_usd, w.priced),
                    idle_cost_usd_total=_add_priced(prev.idle_cost_usd_total, w.idle_usd, w.priced),
                    gpu_seconds_total=_add(prev.gpu_seconds_total, u.gpu_seconds),
                    energy_joules_total=_add(prev.energy_joules_total, u.energy_joules),
                    preemptions_total=_add(prev.preemptions_total, u.preemptions),
                    throttled_gpu_seconds_total=_add_opt(
                        prev.throttled_gpu_seconds_total, u.throttled_gpu_seconds
                    ),
                    prompt_cost_usd_total=_add_priced(prev.prompt_cost_usd_total, w.prompt_usd, w.priced),
                    usage_cost_usd_total=_add_priced(prev.usage_cost_usd_total, w.usage_usd, w.priced),
                    prefix_cache_saved_usd_total=_add_priced(
                        prev.prefix_cache_saved_usd_total, w.prefix_cache_saved_usd, w.priced
                    ),
                    ttft_histogram=accumulate(prev.ttft_histogram, u.ttft_delta),
                    itl_histogram=accumulate(prev.itl_histogram, u.itl_delta),
                    e2e_histogram=accumulate(prev.e2e_histogram, u.e2e_delta),
                    bound_gpu_seconds_total=_add_bounds(prev.bound_gpu_seconds_total, w.bound_gpu_seconds),
                    bound_cost_usd_total=_add_bounds(prev.bound_cost_usd_total, w.bound_usd),
                    derived=_derive_counters(prev.derived, w) if _DERIVED else prev.derived,
                ),
                recent,
            )
        # a model version that produced no window this tick (replaced by a new version) keeps its
        # counters but loses its gauges once its trailing window is empty
        for key, recent in self._recent.items():
            while recent and recent[0].usage.end <= tick.end - self.trailing_seconds:
                recent.popleft()
            if not recent and key in self._models:
                self._models[key] = self._gauges(self._models[key], recent)
        for w in tick.windows:
            u = w.usage
            self._model_seen[(u.engine, u.model, u.model_version)] = u.end
        self._expire(tick.end)

    def _expire(self, now: float) -> None:
        """Forget model versions and engines not seen for ``expire_after_seconds``, and the least
        recently seen model versions beyond ``max_model_series``."""
        cutoff = now - self.expire_after_seconds
        old = [k for k, t in self._model_seen.items() if t < cutoff]
        extra = len(self._model_seen) - len(old) - self.max_model_series
        if extra > 0:
            live = sorted((t, k) for k, t in self._model_seen.items() if t >= cutoff)
            old += [k for _, k in live[:extra]]
        for key in old:
            self._model_seen.pop(key, None)
            self._models.pop(key, None)
            self._recent.pop(key, None)
            self._scores.pop(key, None)
            self._deploys.pop(key, None)
        gone = [e for e, t in self._engine_seen.items() if t < cutoff]
        for engine in gone:
            del self._engine_seen[engine]
            self._engines.pop(engine, None)
            self._engine_gpu_cost.pop(engine, None)
            self._engine_info.pop(engine, None)
        if old or gone:
            self.expired_series += len(old) + len(gone)
            logger.info(
                "%d model version(s) and %d engine(s) not seen for %.0f s left /metrics (history keeps them)",
                len(old),
                len(gone),
                self.expire_after_seconds,
            )

    @staticmethod
    def _gauges(state: ModelState, recent: deque[CostWindow]) -> ModelState:
        if not recent:
            return replace(
                state,
                derived=_derive_gauges(state.derived, recent) if _DERIVED else state.derived,
                prompt_tokens_per_second=None,
                generation_tokens_per_second=None,
                usd_per_1m_output_tokens=None,
                usd_per_1m_tokens=None,
                cost_usd_per_hour=None,
                idle_cost_usd_per_hour=None,
                gpu_utilization_ratio=None,
                memory_bandwidth_ratio=None,
                power_watts=None,
                roofline_efficiency_ratio=None,
                kv_cache_usage_ratio=None,
                requests_running=None,
                ttft_p99_seconds=None,
                itl_p99_seconds=None,
                usd_per_1m_prompt_tokens=None,
                usd_per_1m_output_tokens_decode=None,
                requests_waiting=None,
                ttft_p50_seconds=None,
                ttft_p95_seconds=None,
                itl_p50_seconds=None,
                itl_p95_seconds=None,
                e2e_p50_seconds=None,
                e2e_p95_seconds=None,
                e2e_p99_seconds=None,
                usd_per_1m_output_tokens_floor=None,
                usd_per_1m_output_tokens_floor_max_batch=None,
            )
        secs = sum(w.usage.duration for w in recent)
        cost = sum(w.cost_usd for w in recent)
        # token figures over the windows whose engine counts tokens: none, and they are absent
        counted = [w for w in recent if w.usage.tokens_counted]
        token_secs = sum(w.usage.duration for w in counted)
        token_cost = sum(w.cost_usd for w in counted)
        p = sum(w.usage.prompt_tokens for w in counted)
        g = sum(w.usage.generation_tokens for w in counted)
        idle = sum(w.idle_usd for w in recent)
        weights = [(w, w.usage.duration) for w in recent]
        priced = all(w.priced for w in recent)  # an unread or unpriced GPU: the ratio is unknown
        last = recent[-1].usage
        prices = _phase_prices(recent)
        return replace(
            state,
            prompt_tokens_per_second=p / token_secs if token_secs > 0 else None,
            generation_tokens_per_second=g / token_secs if token_secs > 0 else None,
            usd_per_1m_output_tokens=usd_per_million(token_cost, g) if priced else None,
            usd_per_1m_tokens=usd_per_million(token_cost, p + g) if priced else None,
            cost_usd_per_hour=cost / secs * 3600 if secs > 0 else None,
            idle_cost_usd_per_hour=idle / secs * 3600 if secs > 0 else None,
            gpu_utilization_ratio=_wmean([(w.usage.gpu_util_ratio, d) for w, d in weights]),
            memory_bandwidth_ratio=_wmean([(w.usage.mem_bw_ratio, d) for w, d in weights]),
            power_watts=_wmean([(w.usage.power_watts, d) for w, d in weights]),
            roofline_efficiency_ratio=_wmean([(w.roofline_ratio, d) for w, d in weights]),
            kv_cache_usage_ratio=last.kv_cache_usage_ratio,
            requests_running=last.requests_running,
            ttft_p99_seconds=_merged_p99([w.usage.ttft_delta for w in recent]),
            itl_p99_seconds=_merged_p99([w.usage.itl_delta for w in recent]),
            usd_per_1m_prompt_tokens=prices[0],
            usd_per_1m_output_tokens_decode=prices[1],
            requests_waiting=last.requests_waiting,
            gpu_model=last.gpu_model,
            priority_class=last.priority_class,
            usd_per_1m_output_tokens_floor=_wmean([(w.floor_usd_per_1m_output, d) for w, d in weights]),
            usd_per_1m_output_tokens_floor_max_batch=_wmean(
                [(w.floor_usd_per_1m_output_max_batch, d) for w, d in weights]
            ),
            ttft_p50_seconds=_merged_p99([w.usage.ttft_delta for w in recent], 0.5),
            ttft_p95_seconds=_merged_p99([w.usage.ttft_delta for w in recent], 0.95),
            itl_p50_seconds=_merged_p99([w.usage.itl_delta for w in recent], 0.5),
            itl_p95_seconds=_merged_p99([w.usage.itl_delta for w in recent], 0.95),
            e2e_p50_seconds=_merged_p99([w.usage.e2e_delta for w in recent], 0.5),
            e2e_p95_seconds=_merged_p99([w.usage.e2e_delta for w in recent], 0.95),
            e2e_p99_seconds=_merged_p99([w.usage.e2e_delta for w in recent]),
            derived=_derive_gauges(state.derived, recent) if _DERIVED else state.derived,
        )

    def snapshot(self, store_up: bool | None = None) -> Snapshot:
        """An immutable view of the current state (``store_up``: the history store's health)."""
        models = tuple(replace(m, anomaly_score=self._scores.get(k)) for k, m in sorted(self._models.items()))
        return Snapshot(
            node=self.node,
            version=self.version,
            timestamp=self._timestamp,
            nvml_up=self._nvml_up,
            driver_version=self._driver_version,
            gpus=tuple(sorted(self._gpus.values(), key=lambda s: (s.sample.index, s.sample.uuid))),
            engines=tuple(
                replace(e, gpu_cost_usd_total=self._engine_gpu_cost.get(e.engine))
                for e in sorted(self._engines.values(), key=lambda e: e.engine)
            ),
            models=models,
            alerts_firing=dict(self._alerts),
            outbox_pending=dict(self._outbox),
            store_up=store_up,
            deploys=dict(self._deploys),
            engine_info=tuple(i for e, i in sorted(self._engine_info.items()) if e in self._engines),
            cost_label_keys=self._cost_label_keys,
        )


Series = Iterator[tuple[tuple[str, ...], Any]]


def series(spec: MetricSpec, snap: Snapshot) -> Series:
    """(label values, value) pairs of one catalogue row over a snapshot."""
    return _series(spec, snap)


def label_names(spec: MetricSpec, snap: Snapshot) -> tuple[str, ...]:
    """The label names of a catalogue row on this snapshot: its own, with a cost-labels mark
    replaced by the node's cost labels as exported (``label_team``, …; fixed per config)."""
    if COST_LABELS_MARK not in spec.labels:
        return spec.labels
    at = spec.labels.index(COST_LABELS_MARK)
    names = tuple(cost_label_name(k) for k in snap.cost_label_keys)
    return (*spec.labels[:at], *names, *spec.labels[at + 1 :])


# ---- the sources: what each catalogue source iterates, how each label reads on an item, and the
# value a field names. No row is special-cased: an info row (field "info") is 1 for every item whose
# labels all have a value (a label whose adapter returns None skips the item), a row with one label
# no adapter provides takes that label from the keys of its mapping value (one series per bound),
# and a row without a field reads the value the ledger derived from its aggregation.
INFO = "info"  # the table's field of an info row: value 1, the identity in its labels

Label = Callable[[Any, Any], Any]  # (snapshot, item) → the label's value(s); None: no series


@dataclass(frozen=True, slots=True)
class _Source:
    items: Callable[[Snapshot], Iterable[Any]]
    labels: Mapping[str, Label]
    value: Callable[[Any, str], Any] = getattr  # (item, field) → the value
    base: Callable[[Any, Any], tuple[str, ...]] | None = None  # the source's own labels at once


def _node(snap: Snapshot, _: Any) -> str:
    return snap.node


def _engine_info(snap: Snapshot, e: EngineState) -> EngineCostInfo | None:
    for i in snap.engine_info:
        if i.engine == e.engine:
            return i
    return None


def _info_label(read: Callable[[EngineCostInfo], str]) -> Label:
    def label(snap: Snapshot, e: EngineState) -> str | None:
        i = _engine_info(snap, e)
        return None if i is None else read(i)

    return label


def _cost_labels(snap: Snapshot, e: EngineState) -> tuple[str, ...] | None:
    i = _engine_info(snap, e)
    return None if i is None else tuple(i.labels.get(k, "") for k in snap.cost_label_keys)


def _gpu_value(g: GpuState, name: str) -> Any:
    """The GPU's own figures first, then its reading's."""
    return getattr(g, name) if hasattr(g, name) else getattr(g.sample, name)


def _pod(i: int) -> Label:
    def label(snap: Snapshot, g: GpuState) -> str | None:
        holder = snap.gpu_pods.get(g.sample.uuid)
        return None if holder is None else holder[i]

    return label


def _key(i: int) -> Label:
    """Label i of a (key, value) item whose key is a tuple of labels (or one label)."""
    return lambda _snap, item: item[0][i] if isinstance(item[0], tuple) else item[0]


def _second(item: Any, _field: str) -> Any:
    return item[1]


_SOURCES: Mapping[str, _Source] = {
    "node": _Source(lambda s: (s,), {"node": _node}),
    "build": _Source(
        lambda s: (s,),
        {"node": _node, "version": lambda s, _: s.version, "python_version": lambda s, _: s.python_version},
    ),
    "gpu": _Source(
        lambda s: s.gpus,
        {
            "node": _node,
            "gpu": lambda _, g: g.gpu,
            "uuid": lambda _, g: g.sample.uuid,
            "gpu_model": lambda _, g: g.sample.name,
            "mig_parent": lambda _, g: g.sample.mig_parent_uuid or "",
            "namespace": _pod(0),
            "pod": _pod(1),
        },
        _gpu_value,
        lambda s, g: (s.node, g.gpu),
    ),
    "engine": _Source(
        lambda s: s.engines,
        {
            "node": _node,
            "engine": lambda _, e: e.engine,
            "kind": lambda _, e: e.kind,
            "engine_namespace": _info_label(lambda i: i.namespace),
            "engine_pod": _info_label(lambda i: i.pod),
            "engine_role": _info_label(lambda i: i.role),
            "engine_group": _info_label(lambda i: i.group),
            "engine_group_leader": _info_label(lambda i: "true" if i.group_leader else "false"),
            COST_LABELS_MARK: _cost_labels,
        },
        base=lambda s, e: (s.node, e.engine),
    ),
    "model": _Source(
        lambda s: s.models,
        {
            "node": _node,
            "engine": lambda _, m: m.engine,
            "model": lambda _, m: m.model,
            "model_version": lambda _, m: m.model_version,
            "gpu_model": lambda _, m: m.gpu_model,
            "priority_class": lambda _, m: m.priority_class,
        },
        base=lambda s, m: (s.node, m.engine, m.model, m.model_version),
    ),
    "deploy": _Source(
        lambda s: sorted(s.deploys.items()),
        {"node": _node, "engine": _key(0), "model": _key(1), "model_version": _key(2)},
        _second,
    ),
    "alert": _Source(
        lambda s: s.alerts_firing.items(), {"node": _node, "rule": _key(0), "severity": _key(1)}, _second
    ),
    "outbox": _Source(lambda s: s.outbox_pending.items(), {"node": _node, "sink": _key(0)}, _second),
    "budget": _Source(
        lambda s: ((b[:2], b[2]) for b in s.budgets),
        {"node": _node, "scope": _key(0), "name": _key(1)},
        _second,
    ),
}


def _series(spec: MetricSpec, snap: Snapshot) -> Series:
    src = _SOURCES[spec.source]
    getters = [src.labels.get(name) for name in spec.labels]
    if spec.field and spec.field != INFO and spec.labels == BASE_LABELS[spec.source] and src.base:
        # the common row: the source's own labels and a plain field (the same rule, fewer steps)
        read, name, base = src.value, spec.field, src.base
        for item in src.items(snap):
            yield base(snap, item), read(item, name)
        return
    for item in src.items(snap):
        labels: list[str] = []
        open_at: int | None = None  # the label filled from the value's keys
        for get in getters:
            if get is None:
                open_at = len(labels)
                labels.append("")
                continue
            v = get(snap, item)
            if v is None:
                break
            if isinstance(v, tuple):
                labels.extend(v)
            else:
                labels.append(v)
        else:
            if spec.field == INFO:
                yield tuple(labels), 1.0
                continue
            value = src.value(item, spec.field) if spec.field else _derived(item, spec.name)
            if open_at is None:
                yield tuple(labels), value
                continue
            for key, v in (value or {}).items():
                labels[open_at] = key
                yield tuple(labels), v


def _derived(item: Any, name: str) -> Any:
    derived = getattr(item, "derived", None)
    return None if derived is None else derived.get(name)


def check_sources(specs: Iterable[MetricSpec]) -> list[str]:
    """What no source adapter can give: a row's source unknown, or more than one label without an
    adapter (one may take the keys of a mapping value)."""
    problems = []
    for spec in specs:
        src = _SOURCES.get(spec.source)
        if src is None:
            problems.append(f"{spec.name}: no source {spec.source!r} in agent.snapshot")
            continue
        unknown = [name for name in spec.labels if name not in src.labels]
        if len(unknown) > 1:
            problems.append(f"{spec.name}: labels {unknown} have no adapter in agent.snapshot")
    return problems
