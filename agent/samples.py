"""Typed values that flow along the data path (sources → window join → cost → store → detectors).

Every numeric field carries its unit. ``None`` means "not exposed / not supported": absent,
never zero. These are the contracts between modules; they hold no behaviour beyond trivial
helpers and import nothing from the rest of the agent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# ---------------------------------------------------------------------------------------------
# NVML source
# ---------------------------------------------------------------------------------------------


# NVML clock event reasons (nvmlClocksEventReason*, the former "throttle reasons"): the bits that
# mean the clocks were held below what the load asked for. GPU idle, application clock settings,
# sync boost and display clocks are not throttling.
CLOCKS_POWER = 0x4 | 0x80  # SwPowerCap, HwPowerBrakeSlowdown
CLOCKS_THERMAL = 0x20 | 0x40  # SwThermalSlowdown, HwThermalSlowdown
CLOCKS_HW_SLOWDOWN = 0x8  # HwSlowdown
CLOCKS_THROTTLED = CLOCKS_POWER | CLOCKS_THERMAL | CLOCKS_HW_SLOWDOWN


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One NVML reading of one GPU (or MIG instance) at one instant."""

    index: int  # NVML device index; for a MIG instance, the parent's index
    uuid: str  # "GPU-…" or "MIG-…"
    name: str  # as NVML reports it, e.g. "NVIDIA H100 80GB HBM3"
    timestamp: float  # seconds since the epoch (injected clock)
    up: bool = True  # False when the GPU is lost / unreadable; all readings below are then None
    mig_parent_uuid: str | None = None  # set for MIG instances
    util_gpu_ratio: float | None = None  # 0–1, time a kernel was running (nvmlDeviceGetUtilizationRates.gpu)
    util_memory_ratio: float | None = None  # 0–1, time memory was busy (.memory; not bandwidth)
    dram_bw_ratio: float | None = None  # 0–1, GPM DRAM bandwidth utilisation (Hopper+)
    sm_active_ratio: float | None = None  # 0–1, GPM SM utilisation (Hopper+)
    power_watts: float | None = None  # watts
    energy_joules: float | None = None  # joules, cumulative counter since driver load
    memory_used_bytes: float | None = None  # bytes
    memory_total_bytes: float | None = None  # bytes
    sm_clock_hz: float | None = None  # hertz
    mem_clock_hz: float | None = None  # hertz
    temperature_celsius: float | None = None  # degrees Celsius
    error: str | None = None  # why up is False
    clock_event_reasons: int | None = None  # NVML clock event ("throttle") reasons bitmask
    tensor_active_ratio: float | None = None  # 0–1, GPM tensor-core activity (ANY_TENSOR_UTIL, Hopper+)
    sm_occupancy_ratio: float | None = None  # 0–1, GPM resident warps of the maximum (SM_OCCUPANCY)
    pcie_rx_bytes_per_s: float | None = None  # bytes/s, GPM PCIe receive throughput (whole GPUs only)
    pcie_tx_bytes_per_s: float | None = None  # bytes/s, GPM PCIe transmit throughput
    nvlink_rx_bytes_per_s: float | None = None  # bytes/s, GPM NVLink receive throughput, all links
    nvlink_tx_bytes_per_s: float | None = None  # bytes/s, GPM NVLink transmit throughput, all links

    def _reason(self, mask: int) -> float | None:
        return None if self.clock_event_reasons is None else float(bool(self.clock_event_reasons & mask))

    @property
    def power_capped(self) -> float | None:
        """1 when clocks are held down by the power cap or power brake, 0 when not, None unknown."""
        return self._reason(CLOCKS_POWER)

    @property
    def thermal_throttled(self) -> float | None:
        """1 when clocks are held down by temperature (software or hardware), 0 when not."""
        return self._reason(CLOCKS_THERMAL)

    @property
    def hw_slowdown(self) -> float | None:
        """1 when the hardware slowdown signal (power brake, thermal, supply) is active, 0 when not."""
        return self._reason(CLOCKS_HW_SLOWDOWN)

    @property
    def throttled(self) -> float | None:
        """1 when any of the above holds the clocks down (a cost cause: fewer tokens per dollar)."""
        return self._reason(CLOCKS_THROTTLED)


@dataclass(frozen=True, slots=True)
class NvmlRound:
    """One batched NVML round over every device on the node."""

    timestamp: float  # seconds since the epoch
    up: bool  # False when the library / driver is unavailable (then gpus is empty)
    gpus: tuple[GpuSample, ...] = ()
    driver_version: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class GpuLoad:
    """What a simulated engine makes a fake GPU do (the fake NVML backend reads this)."""

    util_gpu_ratio: float  # 0–1
    dram_bw_ratio: float  # 0–1
    memory_used_bytes: float  # bytes
    tensor_active_ratio: float | None = None  # 0–1; None: the fake's model (see agent.sources.nvml.fake)
    pcie_rx_bytes_per_s: float = 0.0  # bytes/s
    pcie_tx_bytes_per_s: float = 0.0  # bytes/s
    nvlink_rx_bytes_per_s: float = 0.0  # bytes/s
    nvlink_tx_bytes_per_s: float = 0.0  # bytes/s


# ---------------------------------------------------------------------------------------------
# Engine source
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Histogram:
    """A cumulative Prometheus histogram as scraped: buckets in ``le`` order, +Inf last."""

    buckets: tuple[tuple[float, float], ...]  # (upper bound `le` in the metric's unit, cumulative count)
    sum: float  # in the metric's unit
    count: float  # observations


@dataclass(frozen=True, slots=True)
class ModelSignals:
    """The common signals of one served model in one scrape (cumulative values as read)."""

    model: str  # served model name (engine label, or from config for engines without one)
    prompt_tokens_total: float | None = None  # tokens, counter
    generation_tokens_total: float | None = None  # tokens, counter
    requests_running: float | None = None  # gauge
    requests_waiting: float | None = None  # gauge
    kv_cache_usage_ratio: float | None = None  # 0–1
    preemptions_total: float | None = None  # counter
    requests_finished_total: Mapping[str, float] = field(default_factory=dict)  # by finish reason
    ttft_seconds: Histogram | None = None  # time to first token
    itl_seconds: Histogram | None = None  # inter-token latency
    e2e_seconds: Histogram | None = None  # end-to-end request latency
    prefill_seconds_total: float | None = None  # seconds, counter (sum of prefill time)
    decode_seconds_total: float | None = None  # seconds, counter (sum of decode time)
    cached_prompt_tokens_total: float | None = None  # tokens served from the prefix cache, counter
    # the engine's own request-time counters (Triton's ``*_duration_us``): seconds summed over the
    # requests they cover, and how many requests that is
    queue_seconds_total: float | None = None  # seconds requests waited in the engine's queue, counter
    compute_seconds_total: float | None = None  # seconds of compute (input, infer, output), counter
    timed_requests_total: float | None = None  # requests those two counters cover, counter
    kv_capacity_tokens: float | None = None  # tokens one replica's KV cache holds, as the engine reports it
    # signal → series (name and other labels) → value, for counters summed over several series
    # (data-parallel ranks, model versions): lets the window join take deltas per series
    counter_parts: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    # signal → series → its own histogram, for histograms summed over several series (DP ranks):
    # lets the window join take deltas per series (agent.cost.latency.histogram_increase)
    histogram_parts: Mapping[str, Mapping[str, Histogram]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EngineScrape:
    """One scrape of one engine endpoint, already mapped onto the common signals."""

    engine: str  # configured engine name (unique per node)
    kind: str  # vllm | sglang | tgi | triton | trtllm | llamacpp
    timestamp: float  # seconds since the epoch, when the scrape completed
    up: bool
    duration_seconds: float  # seconds the scrape took
    models: tuple[ModelSignals, ...] = ()
    error: str | None = None  # why up is False
    size_bytes: int = 0  # bytes of the page
    # series refused at the adapter boundary (non-finite, negative or huge counters, broken
    # histograms): their signal is absent for this scrape; one short description each
    invalid_series: tuple[str, ...] = ()
    dropped_series: int = 0  # series of models beyond the engine's max_models, folded into "other"


# ---------------------------------------------------------------------------------------------
# Window join and cost
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UsageWindow:
    """What one (engine, model, model_version) did over one interval: deltas, never cumulatives."""

    node: str
    engine: str
    model: str
    model_version: str  # "unknown" when no deployment metadata says
    start: float  # seconds since the epoch
    end: float  # seconds since the epoch
    prompt_tokens: float  # tokens in the interval (≥ 0, counter resets handled)
    generation_tokens: float  # tokens in the interval (≥ 0)
    gpu_seconds: float  # GPU-seconds attributed to this model (share of each GPU × Δt)
    energy_joules: float | None  # joules attributed (None when no GPU reports energy or power)
    gpu_util_ratio: float | None = None  # 0–1, mean over the engine's GPUs
    mem_bw_ratio: float | None = None  # 0–1, GPM DRAM bandwidth when available, else NVML .memory
    power_watts: float | None = None  # watts attributed (mean)
    requests_running: float | None = None  # mean of the gauge
    kv_cache_usage_ratio: float | None = None  # 0–1, last value
    preemptions: float | None = None  # count in the interval
    ttft_p99_seconds: float | None = None  # seconds
    itl_p99_seconds: float | None = None  # seconds
    prefill_seconds: float | None = None  # seconds (sum over requests, for the time split)
    decode_seconds: float | None = None  # seconds
    cached_prompt_tokens: float | None = None  # prompt tokens served from the prefix cache (not computed)
    ttft_delta: Histogram | None = None  # the interval's TTFT observations (bucket deltas), seconds
    itl_delta: Histogram | None = None  # the interval's inter-token latencies (bucket deltas), seconds
    e2e_delta: Histogram | None = None  # the interval's end-to-end request latencies (bucket deltas), seconds
    requests_waiting: float | None = None  # requests queued, last value of the gauge
    gpu_model: str | None = None  # NVML name of the engine's GPUs (sorted, ", "-joined when mixed)
    throttled_gpu_seconds: float | None = None  # GPU-seconds with clocks held down (power cap, heat)
    priority_class: str | None = None  # traffic class from the engine config (realtime, batch ...)
    # False: the engine exposes no token counter for this model (a plain Triton, a CPU Python
    # model): its tokens are absent, not 0 — prompt_tokens and generation_tokens hold 0 only so the
    # cost arithmetic stays total, and every reader (snapshot, store, report) shows them as absent
    tokens_counted: bool = True
    queue_seconds: float | None = None  # seconds requests waited in the engine's queue (summed)
    compute_seconds: float | None = None  # seconds of the engine's compute for requests (summed)
    timed_requests: float | None = None  # requests those two cover (Triton: successful requests)

    @property
    def duration(self) -> float:
        """Seconds the window covers."""
        return self.end - self.start

    @property
    def tokenless_seconds(self) -> float:
        """Seconds of the window without token counters (the whole window, or 0)."""
        return 0.0 if self.tokens_counted else self.duration


@dataclass(frozen=True, slots=True)
class CostWindow:
    """A usage window priced: the record the store keeps and the detectors read."""

    usage: UsageWindow
    gpu_time_usd: float  # dollars for GPU (or node / CPU) time
    energy_usd: float  # dollars for energy (0 when the book does not price power)
    usd_per_1m_output: float | None  # None when the window produced no output tokens
    usd_per_1m_total: float | None  # None when the window processed no tokens
    idle_usd: float  # the whole cost when no tokens were produced, else 0
    roofline_ratio: float | None = None  # observed decode tok/s ÷ bandwidth ceiling (0–1+)
    priced: bool = True  # False: a GPU was unread or unpriced, so the cost is incomplete (ratios absent)
    estimated: bool = False  # a GPU was not read this tick: charged from its last reading (time, power)
    prompt_usd: float | None = None  # dollars of prefill time (phase-time share); None: no phase times
    usage_usd: float | None = None  # dollars weighted by measured GPU busy time (usage basis)
    prefix_cache_saved_usd: float | None = None  # what the cached prompt tokens would have cost
    floor_usd_per_1m_output: float | None = None  # $/1M output tokens at the roofline, running batch
    floor_usd_per_1m_output_max_batch: float | None = None  # at the largest batch the KV cache holds
    # where GPU time went (agent.cost.bound): bound (compute, memory, communication, idle) → GPU-seconds
    # and → GPU dollars; None where GPM does not measure every GPU of the window (absent, not guessed)
    bound_gpu_seconds: Mapping[str, float] | None = None
    bound_usd: Mapping[str, float] | None = None
    # the prefill share of the engine's step time and the floor of it the decode efficiency took out
    # (0–1 of the window's seconds per replica; agent.cost.explain.prefill_shares); None: not read
    prefill_share_ratio: float | None = None
    prefill_share_floor_ratio: float | None = None

    @property
    def output_usd(self) -> float:
        """Dollars of decode time: the cost less the prompt share (all of it without a split)."""
        return self.cost_usd - (self.prompt_usd or 0.0)

    @property
    def cost_usd(self) -> float:
        """Total dollars of the window."""
        return self.gpu_time_usd + self.energy_usd
