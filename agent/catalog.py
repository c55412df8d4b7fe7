"""Every series infercost exports: name, type, unit, help and labels — the contract.

Exporters (Prometheus, OTLP), the README's metric list and the tests all read this table; nothing
else declares a metric. ``source`` names the snapshot collection a row reads and ``field`` the
attribute on each of its items; a ``None`` value means "absent", and the series is not emitted.
Label cardinality per node is bounded: gpus (≤ 8, or MIG instances), engines and their models
(a handful), rules (tens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["gauge", "counter"]
Source = Literal["node", "build", "gpu", "engine", "model", "deploy", "alert", "outbox"]

NAMESPACE = "infercost"
NODE_LABELS = ("node",)
GPU_LABELS = ("node", "gpu")
ENGINE_LABELS = ("node", "engine")
MODEL_LABELS = ("node", "engine", "model", "model_version")


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One exported series family."""

    name: str  # Prometheus name without the namespace; counters end in _total
    kind: Kind
    unit: str  # UCUM unit for OTLP ("1", "s", "W", "J", "By", "USD", "{token}")
    help: str
    source: Source
    field: str  # attribute read on each item of the source
    labels: tuple[str, ...]
    otel_name: str | None = None  # the OTel semantic-convention name, where one exists

    @property
    def full_name(self) -> str:
        """The exported Prometheus name."""
        return f"{NAMESPACE}_{self.name}"


def _m(
    name: str,
    kind: Kind,
    unit: str,
    help_: str,
    source: Source,
    field: str,
    labels: tuple[str, ...],
    otel: str | None = None,
) -> MetricSpec:
    return MetricSpec(name, kind, unit, help_, source, field, labels, otel)


CATALOG: tuple[MetricSpec, ...] = (
    # ---- node
    _m(
        "build_info",
        "gauge",
        "1",
        "Agent build (value 1): version and Python version.",
        "build",
        "info",
        ("node", "version", "python_version"),
    ),
    _m(
        "nvml_up",
        "gauge",
        "1",
        "1 when the NVML library answers, 0 when it does not.",
        "node",
        "nvml_up",
        NODE_LABELS,
    ),
    _m(
        "store_up",
        "gauge",
        "1",
        "1 when the history store (SQLite) accepts writes, 0 while it fails (history paused, metrics go on).",
        "node",
        "store_up",
        NODE_LABELS,
    ),
    _m(
        "store_files_recovered_total",
        "counter",
        "1",
        "Damaged SQLite files (history, outbox) moved aside and started anew.",
        "node",
        "store_files_recovered_total",
        NODE_LABELS,
    ),
    # ---- GPUs
    _m(
        "gpu_up",
        "gauge",
        "1",
        "1 when the GPU answered in the last NVML round, 0 when it is lost.",
        "gpu",
        "up",
        GPU_LABELS,
    ),
    _m(
        "gpu_info",
        "gauge",
        "1",
        "GPU identity (value 1): UUID, model name as NVML reports it, MIG parent.",
        "gpu",
        "info",
        (*GPU_LABELS, "uuid", "gpu_model", "mig_parent"),
    ),
    _m(
        "gpu_pod_info",
        "gauge",
        "1",
        "The pod holding this GPU per the kubelet when it is not a scraped engine (value 1): the GPU's "
        "cost is that pod's.",
        "gpu",
        "pod_info",
        (*GPU_LABELS, "namespace", "pod"),
    ),
    _m(
        "gpu_utilization_ratio",
        "gauge",
        "1",
        "Fraction of time a kernel was running (NVML utilization.gpu).",
        "gpu",
        "util_gpu_ratio",
        GPU_LABELS,
        "hw.gpu.utilization",
    ),
    _m(
        "gpu_memory_busy_ratio",
        "gauge",
        "1",
        "Fraction of time device memory was read or written (NVML utilization.memory; not bandwidth).",
        "gpu",
        "util_memory_ratio",
        GPU_LABELS,
        "hw.gpu.memory.utilization",
    ),
    _m(
        "gpu_dram_bandwidth_ratio",
        "gauge",
        "1",
        "DRAM bandwidth used as a fraction of peak (NVML GPM, Hopper+).",
        "gpu",
        "dram_bw_ratio",
        GPU_LABELS,
    ),
    _m(
        "gpu_sm_active_ratio",
        "gauge",
        "1",
        "SM utilisation from NVML GPM (Hopper+).",
        "gpu",
        "sm_active_ratio",
        GPU_LABELS,
    ),
    _m("gpu_power_watts", "gauge", "W", "GPU power draw.", "gpu", "power_watts", GPU_LABELS, "hw.power"),
    _m(
        "gpu_energy_joules_total",
        "counter",
        "J",
        "GPU energy since the driver loaded (NVML total energy).",
        "gpu",
        "energy_joules",
        GPU_LABELS,
        "hw.energy",
    ),
    _m(
        "gpu_memory_used_bytes",
        "gauge",
        "By",
        "GPU memory in use.",
        "gpu",
        "memory_used_bytes",
        GPU_LABELS,
        "hw.gpu.memory.usage",
    ),
    _m(
        "gpu_memory_total_bytes",
        "gauge",
        "By",
        "GPU memory capacity.",
        "gpu",
        "memory_total_bytes",
        GPU_LABELS,
        "hw.gpu.memory.limit",
    ),
    _m("gpu_sm_clock_hertz", "gauge", "Hz", "SM clock.", "gpu", "sm_clock_hz", GPU_LABELS),
    _m("gpu_memory_clock_hertz", "gauge", "Hz", "Memory clock.", "gpu", "mem_clock_hz", GPU_LABELS),
    _m(
        "gpu_temperature_celsius",
        "gauge",
        "Cel",
        "GPU core temperature.",
        "gpu",
        "temperature_celsius",
        GPU_LABELS,
    ),
    _m(
        "gpu_price_usd_per_hour",
        "gauge",
        "USD/h",
        "Price of one hour of this GPU from the price book.",
        "gpu",
        "usd_per_hour",
        GPU_LABELS,
    ),
    _m(
        "gpu_cost_usd_total",
        "counter",
        "USD",
        "Dollars this GPU has cost (time + priced energy).",
        "gpu",
        "cost_usd_total",
        GPU_LABELS,
    ),
    _m(
        "gpu_idle_cost_usd_total",
        "counter",
        "USD",
        "Dollars of this GPU's cost that made no tokens (no engine uses it, or its engines were idle).",
        "gpu",
        "idle_cost_usd_total",
        GPU_LABELS,
    ),
    # ---- engines
    _m(
        "engine_up",
        "gauge",
        "1",
        "1 when the engine's /metrics was scraped and understood, else 0.",
        "engine",
        "up",
        (*ENGINE_LABELS, "kind"),
    ),
    _m(
        "engine_scrape_duration_seconds",
        "gauge",
        "s",
        "How long the last scrape of the engine took.",
        "engine",
        "scrape_duration_seconds",
        ENGINE_LABELS,
    ),
    _m(
        "engine_invalid_series",
        "gauge",
        "{series}",
        "Series the last scrape refused (NaN, ±Inf, negative or out-of-range values, broken histograms).",
        "engine",
        "invalid_series",
        ENGINE_LABELS,
    ),
    _m(
        "engine_dropped_series",
        "gauge",
        "{series}",
        'Series of models beyond the engine\'s max_models in the last scrape, summed into model="other".',
        "engine",
        "dropped_series",
        ENGINE_LABELS,
    ),
    # ---- models × versions
    _m(
        "prompt_tokens_total",
        "counter",
        "{token}",
        "Prompt (prefill) tokens processed.",
        "model",
        "prompt_tokens_total",
        MODEL_LABELS,
        "gen_ai.server.token.usage.input",
    ),
    _m(
        "generation_tokens_total",
        "counter",
        "{token}",
        "Output (generated) tokens.",
        "model",
        "generation_tokens_total",
        MODEL_LABELS,
        "gen_ai.server.token.usage.output",
    ),
    _m(
        "cost_usd_total",
        "counter",
        "USD",
        "Dollars attributed to this model version (GPU time + priced energy).",
        "model",
        "cost_usd_total",
        MODEL_LABELS,
    ),
    _m(
        "energy_cost_usd_total",
        "counter",
        "USD",
        "Part of cost_usd_total that is priced energy (× PUE).",
        "model",
        "energy_cost_usd_total",
        MODEL_LABELS,
    ),
    _m(
        "idle_cost_usd_total",
        "counter",
        "USD",
        "Dollars attributed while the model produced no tokens.",
        "model",
        "idle_cost_usd_total",
        MODEL_LABELS,
    ),
    _m(
        "prompt_cost_usd_total",
        "counter",
        "USD",
        "Part of cost_usd_total spent on prompts, by prefill vs decode request time (absent without).",
        "model",
        "prompt_cost_usd_total",
        MODEL_LABELS,
    ),
    _m(
        "usage_cost_usd_total",
        "counter",
        "USD",
        "Usage basis: dollars weighted by GPU busy time (cost_usd_total minus this was paid while idle).",
        "model",
        "usage_cost_usd_total",
        MODEL_LABELS,
    ),
    _m(
        "prefix_cache_saved_usd_total",
        "counter",
        "USD",
        "What the prompt tokens served from the prefix cache would have cost to compute.",
        "model",
        "prefix_cache_saved_usd_total",
        MODEL_LABELS,
    ),
    _m(
        "usd_per_1m_prompt_tokens",
        "gauge",
        "USD",
        "Dollars of prefill time per million prompt tokens over the trailing window.",
        "model",
        "usd_per_1m_prompt_tokens",
        MODEL_LABELS,
    ),
    _m(
        "usd_per_1m_output_tokens_decode",
        "gauge",
        "USD",
        "Dollars of decode time per million output tokens over the trailing window (the output share only).",
        "model",
        "usd_per_1m_output_tokens_decode",
        MODEL_LABELS,
    ),
    _m(
        "gpu_seconds_total",
        "counter",
        "s",
        "GPU-seconds attributed to this model version.",
        "model",
        "gpu_seconds_total",
        MODEL_LABELS,
    ),
    _m(
        "energy_joules_total",
        "counter",
        "J",
        "GPU energy attributed to this model version.",
        "model",
        "energy_joules_total",
        MODEL_LABELS,
    ),
    _m(
        "prompt_tokens_per_second",
        "gauge",
        "{token}/s",
        "Prompt tokens per second over the trailing window.",
        "model",
        "prompt_tokens_per_second",
        MODEL_LABELS,
    ),
    _m(
        "generation_tokens_per_second",
        "gauge",
        "{token}/s",
        "Output tokens per second over the trailing window.",
        "model",
        "generation_tokens_per_second",
        MODEL_LABELS,
    ),
    _m(
        "usd_per_1m_output_tokens",
        "gauge",
        "USD",
        "Dollars per million output tokens over the trailing window (ratio of sums; absent when no tokens).",
        "model",
        "usd_per_1m_output_tokens",
        MODEL_LABELS,
    ),
    _m(
        "usd_per_1m_tokens",
        "gauge",
        "USD",
        "Dollars per million prompt + output tokens over the trailing window (absent when no tokens).",
        "model",
        "usd_per_1m_tokens",
        MODEL_LABELS,
    ),
    _m(
        "model_gpu_utilization_ratio",
        "gauge",
        "1",
        "Mean utilisation of the GPUs serving this model.",
        "model",
        "gpu_utilization_ratio",
        MODEL_LABELS,
    ),
    _m(
        "model_memory_bandwidth_ratio",
        "gauge",
        "1",
        "Mean DRAM bandwidth ratio (GPM) — else memory-busy ratio — of the GPUs serving this model.",
        "model",
        "memory_bandwidth_ratio",
        MODEL_LABELS,
    ),
    _m(
        "model_power_watts",
        "gauge",
        "W",
        "GPU power attributed to this model version.",
        "model",
        "power_watts",
        MODEL_LABELS,
    ),
    _m(
        "roofline_efficiency_ratio",
        "gauge",
        "1",
        "Observed decode tokens/s over the memory-bandwidth ceiling (needs the engine's weights_bytes).",
        "model",
        "roofline_efficiency_ratio",
        MODEL_LABELS,
    ),
    _m(
        "kv_cache_usage_ratio",
        "gauge",
        "1",
        "KV-cache usage reported by the engine.",
        "model",
        "kv_cache_usage_ratio",
        MODEL_LABELS,
    ),
    _m(
        "requests_running",
        "gauge",
        "{request}",
        "Requests in the running batch.",
        "model",
        "requests_running",
        MODEL_LABELS,
    ),
    _m(
        "ttft_p99_seconds",
        "gauge",
        "s",
        "99th percentile time to first token over the trailing window (bucket deltas summed).",
        "model",
        "ttft_p99_seconds",
        MODEL_LABELS,
    ),
    _m(
        "itl_p99_seconds",
        "gauge",
        "s",
        "99th percentile inter-token latency over the trailing window (bucket deltas summed).",
        "model",
        "itl_p99_seconds",
        MODEL_LABELS,
    ),
    _m(
        "anomaly_score",
        "gauge",
        "1",
        "Isolation-forest anomaly score, normalised: above 1 is anomalous.",
        "model",
        "anomaly_score",
        MODEL_LABELS,
    ),
    _m(
        "deploy_timestamp_seconds",
        "gauge",
        "s",
        "When the agent saw this model version replace another on the engine (epoch seconds; "
        "absent for versions already serving when the agent started).",
        "deploy",
        "deployed_at",
        MODEL_LABELS,
    ),
    # ---- alerts
    _m(
        "alerts_firing",
        "gauge",
        "{alert}",
        "Alerts currently firing, by rule and severity (0 for every loaded rule that is not firing).",
        "alert",
        "count",
        ("node", "rule", "severity"),
    ),
    _m(
        "outbox_pending",
        "gauge",
        "{message}",
        "Notifications not yet delivered, by sink.",
        "outbox",
        "count",
        ("node", "sink"),
    ),
)
