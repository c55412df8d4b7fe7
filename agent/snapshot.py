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
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from agent.catalog import COST_LABELS_MARK, MetricSpec
from agent.config import EngineConfig, cost_label_name
from agent.cost.latency import accumulate
from agent.cost.model import usd_per_million
from agent.cost.quantiles import quantile
from agent.cost.window import TickResult
from agent.samples import CostWindow, EngineScrape, GpuSample, Histogram, NvmlRound

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
    prompt_tokens_total: float = 0.0  # tokens
    generation_tokens_total: float = 0.0  # tokens
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
                    prompt_tokens_total=_add(prev.prompt_tokens_total, u.prompt_tokens),
                    generation_tokens_total=_add(prev.generation_tokens_total, u.generation_tokens),
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
        p = sum(w.usage.prompt_tokens for w in recent)
        g = sum(w.usage.generation_tokens for w in recent)
        idle = sum(w.idle_usd for w in recent)
        weights = [(w, w.usage.duration) for w in recent]
        priced = all(w.priced for w in recent)  # an unread or unpriced GPU: the ratio is unknown
        last = recent[-1].usage
        prices = _phase_prices(recent)
        return replace(
            state,
            prompt_tokens_per_second=p / secs if secs > 0 else None,
            generation_tokens_per_second=g / secs if secs > 0 else None,
            usd_per_1m_output_tokens=usd_per_million(cost, g) if priced else None,
            usd_per_1m_tokens=usd_per_million(cost, p + g) if priced else None,
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
    return _SERIES[spec.source](spec, snap)


def label_names(spec: MetricSpec, snap: Snapshot) -> tuple[str, ...]:
    """The label names of a catalogue row on this snapshot: its own, with a cost-labels mark
    replaced by the node's cost labels as exported (``label_team``, …; fixed per config)."""
    if COST_LABELS_MARK not in spec.labels:
        return spec.labels
    at = spec.labels.index(COST_LABELS_MARK)
    names = tuple(cost_label_name(k) for k in snap.cost_label_keys)
    return (*spec.labels[:at], *names, *spec.labels[at + 1 :])


def _node_series(spec: MetricSpec, snap: Snapshot) -> Series:
    yield (snap.node,), getattr(snap, spec.field)


def _build_series(spec: MetricSpec, snap: Snapshot) -> Series:
    yield (snap.node, snap.version, snap.python_version), 1.0


def _gpu_series(spec: MetricSpec, snap: Snapshot) -> Series:
    node = snap.node
    for g in snap.gpus:
        s = g.sample
        if spec.field == "pod_info":
            holder = snap.gpu_pods.get(s.uuid)
            if holder is not None:
                yield (node, g.gpu, *holder), 1.0
        elif spec.field == "info":
            yield (node, g.gpu, s.uuid, s.name, s.mig_parent_uuid or ""), 1.0
        elif spec.field == "up":
            yield (node, g.gpu), s.up
        else:  # the GPU's own figures first, then the reading's
            yield (node, g.gpu), getattr(g, spec.field) if hasattr(g, spec.field) else getattr(s, spec.field)


def _engine_series(spec: MetricSpec, snap: Snapshot) -> Series:
    if spec.field == "cost_info":  # one per engine: join its labels onto any engine's series
        for i in snap.engine_info:
            leader = "true" if i.group_leader else "false"
            values = tuple(i.labels.get(k, "") for k in snap.cost_label_keys)
            yield (snap.node, i.engine, i.namespace, i.pod, i.role, i.group, leader, *values), 1.0
        return
    for e in snap.engines:
        labels = (snap.node, e.engine, e.kind) if "kind" in spec.labels else (snap.node, e.engine)
        yield labels, getattr(e, spec.field)


def _model_series(spec: MetricSpec, snap: Snapshot) -> Series:
    for m in snap.models:
        key = (snap.node, m.engine, m.model, m.model_version)
        if spec.field in _MODEL_INFO:
            extra = getattr(m, _MODEL_INFO[spec.field])
            if extra is not None:
                yield (*key, extra), 1.0
        elif "bound" in spec.labels:  # one series per bound (agent.cost.bound)
            for bound, v in (getattr(m, spec.field) or {}).items():
                yield (*key, bound), v
        else:
            yield key, getattr(m, spec.field)


# info rows of a model version: the catalogue field → the attribute its extra label comes from
_MODEL_INFO = {"gpu_info": "gpu_model", "class_info": "priority_class"}


def _deploy_series(spec: MetricSpec, snap: Snapshot) -> Series:
    for (engine, model, version), at in sorted(snap.deploys.items()):
        yield (snap.node, engine, model, version), at


def _alert_series(spec: MetricSpec, snap: Snapshot) -> Series:
    for (rule, severity), n in snap.alerts_firing.items():
        yield (snap.node, rule, severity), n


def _budget_series(spec: MetricSpec, snap: Snapshot) -> Series:
    for scope, name, usd in snap.budgets:
        yield (snap.node, scope, name), usd


def _outbox_series(spec: MetricSpec, snap: Snapshot) -> Series:
    for sink, n in snap.outbox_pending.items():
        yield (snap.node, sink), n


_SERIES: Mapping[str, Callable[[MetricSpec, Snapshot], Series]] = {
    "node": _node_series,
    "build": _build_series,
    "gpu": _gpu_series,
    "engine": _engine_series,
    "model": _model_series,
    "deploy": _deploy_series,
    "alert": _alert_series,
    "outbox": _outbox_series,
    "budget": _budget_series,
}
