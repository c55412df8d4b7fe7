"""Pure physics of a simulated LLM inference engine: decode bound by memory bandwidth, a fluid
queue driven by a daily traffic curve, and the counters and histograms vLLM would report.

No I/O and no clock reads: every method that moves time takes the time as an argument, so the
same engine runs under the real clock, an accelerated one, or a test's manual one.

The model (DESIGN.md "Cost model", reference figures):

- One decode step of a batch of ``b`` sequences of mean context ``c`` moves
  ``W + b·c·kv_bytes_per_token`` bytes (the weights once, every sequence's KV cache once), split
  over ``tp`` GPUs, and does ``2·params·b`` FLOPs. Its time is the larger of the two divided by
  what the GPUs achieve: ``max(bytes / (tp·B·eff_bw), flops / (tp·F·eff_compute))`` (plus the
  tensor-parallel all-reduces). Each step yields ``b`` tokens. At ``b = 1`` this is the roofline
  ceiling ``B / W``: 70B fp16 on one H100 ≈ 24 tok/s, on one A100 ≈ 14 tok/s.
- Prefill is compute bound: ``2·params`` FLOPs per uncached prompt token.
- Concurrency follows Little's law: in steady state the number of running requests is
  ``R = λ · S(R)`` where ``S`` is a request's time in the engine (prefill + output × step time),
  capped by ``max_num_seqs`` and by the KV cache. Above that the excess waits (and gives up after
  the client's patience); the running set relaxes towards its target with the time constant
  ``S`` (an exact exponential step, so coarse ticks stay stable on an accelerated clock).
- The gauges (requests running and waiting, KV cache in use) are one instant of drawn requests: an
  M/M/∞ population per queue whose arrival rate and mean lifetime are the fluid's (Little's law),
  advanced by its exact step, so a scrape reads what a real engine shows at that moment (a few
  sequences at night: ±50 %), and consecutive scrapes are correlated over the requests' lifetimes.
- Latencies of completed requests are sampled (queue wait from Little's law on the queue,
  prefill, per-step time with jitter) into vLLM's real histogram buckets.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agent.hardware import H100_SXM as H100_SXM
from agent.hardware import H200 as H200
from agent.hardware import GpuSpec
from agent.samples import GpuLoad

GIB = 1024 * 1024 * 1024  # bytes

# ---------------------------------------------------------------------------------------------
# Hardware and model shapes
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The shape of a decoder-only transformer, enough to size weights, KV cache and FLOPs."""

    name: str  # served model name (vLLM's model_name label)
    params: float  # parameters
    bytes_per_param: float  # bytes per weight (2 = fp16/bf16, 1 = fp8)
    layers: int
    kv_heads: int  # key/value heads (GQA)
    head_dim: int
    kv_bytes_per_element: float = 2.0  # bytes per KV-cache element (2 = fp16, 1 = fp8)
    max_model_len: int = 32768  # tokens

    @property
    def weight_bytes(self) -> float:
        """Bytes of weights read by every decode step."""
        return self.params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        """Bytes of KV cache per token: 2 (K and V) × layers × kv_heads × head_dim × element size."""
        return 2.0 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes_per_element

    @property
    def flops_per_token(self) -> float:
        """FLOPs of one token through the dense weights (multiply and add)."""
        return 2.0 * self.params


LLAMA_70B = ModelShape("meta-llama/Llama-3.1-70B-Instruct", 70.6e9, 2.0, 80, 8, 128, max_model_len=131072)
LLAMA_70B_FP8 = ModelShape(
    "meta-llama/Llama-3.1-70B-Instruct",
    70.6e9,
    1.0,
    80,
    8,
    128,
    kv_bytes_per_element=1.0,
    max_model_len=131072,
)
LLAMA_8B = ModelShape("meta-llama/Llama-3.1-8B-Instruct", 8.03e9, 2.0, 32, 8, 128, max_model_len=131072)
MISTRAL_7B = ModelShape("mistralai/Mistral-7B-Instruct-v0.3", 7.25e9, 2.0, 32, 8, 128)
QWEN_14B = ModelShape("Qwen/Qwen2.5-14B-Instruct", 14.8e9, 2.0, 48, 8, 128)


@dataclass(frozen=True, slots=True)
class Deployment:
    """A model served on ``tp`` GPUs of one kind: the step-time physics of one engine."""

    model: ModelShape
    gpu: GpuSpec
    tp: int = 1  # tensor-parallel degree (GPUs used)
    max_num_seqs: int = 256  # vLLM's default cap on the running batch
    gpu_memory_utilization: float = 0.9  # vLLM's default: fraction of HBM it pre-allocates
    # Why 0.85: decode GEMV kernels reach about 80–90 % of peak HBM bandwidth on Hopper/Ampere.
    bandwidth_efficiency: float = 0.85
    # Why 0.5: prefill and large-batch GEMMs reach about half the dense tensor-core peak (MFU).
    compute_efficiency: float = 0.5
    activation_reserve_bytes: float = 2.0 * GIB  # per GPU: activations, CUDA graphs, workspace
    cuda_context_bytes: float = 0.5 * GIB  # per GPU: outside vLLM's budget, still seen by NVML
    allreduce_seconds: float = 8e-6  # seconds per all-reduce; two per layer when tp > 1 (NVLink latency)

    @property
    def weights_per_gpu_bytes(self) -> float:
        """Bytes of weights held by each GPU."""
        return self.model.weight_bytes / self.tp

    @property
    def kv_pool_bytes(self) -> float:
        """Bytes of KV cache over all ``tp`` GPUs (what vLLM pre-allocates; 0 when the model does not fit)."""
        budget = self.gpu.memory_bytes * self.gpu_memory_utilization
        per_gpu = budget - self.weights_per_gpu_bytes - self.activation_reserve_bytes
        return max(0.0, per_gpu) * self.tp

    @property
    def kv_capacity_tokens(self) -> float:
        """Tokens the KV cache holds."""
        return self.kv_pool_bytes / self.model.kv_bytes_per_token

    @property
    def memory_used_per_gpu_bytes(self) -> float:
        """Bytes NVML reports used on each GPU: vLLM pre-allocates its whole budget at start-up."""
        used = self.weights_per_gpu_bytes + self.activation_reserve_bytes + self.kv_pool_bytes / self.tp
        return min(self.gpu.memory_bytes, used + self.cuda_context_bytes)

    def fits(self) -> bool:
        """Whether the weights leave room for a KV cache on these GPUs."""
        return self.kv_pool_bytes > 0

    def step_bytes(self, batch: float, context: float) -> float:
        """Bytes moved by one decode step over all GPUs (weights + every sequence's KV cache)."""
        return self.model.weight_bytes + batch * context * self.model.kv_bytes_per_token

    def step_terms(self, context: float) -> tuple[float, float, float, float]:
        """``(a, b, d, c)`` in seconds with ``step(batch) = max(a + b·batch, d·batch) + c`` at full speed:
        weights read, KV read per sequence, FLOPs per sequence, and the tensor-parallel sync."""
        bandwidth = self.tp * self.gpu.hbm_bandwidth_bytes_per_s * self.bandwidth_efficiency
        compute = self.tp * self.gpu.peak_flops * self.compute_efficiency
        sync_s = 2 * self.model.layers * self.allreduce_seconds if self.tp > 1 else 0.0
        return (
            self.model.weight_bytes / bandwidth,
            context * self.model.kv_bytes_per_token / bandwidth,
            self.model.flops_per_token / compute,
            sync_s,
        )

    def step_seconds(self, batch: float, context: float, throughput_factor: float = 1.0) -> float:
        """Seconds of one decode step of ``batch`` sequences of mean ``context`` tokens.

        ``throughput_factor`` < 1 models a slower build (e.g. 0.65: a fused kernel no longer used).
        """
        a, b, d, c = self.step_terms(context)
        return (max(a + b * batch, d * batch) + c) / throughput_factor

    def running_for(
        self,
        rate_rps: float,
        output_tokens: float,
        context: float,
        prefill_share: float = 0.0,
        throughput_factor: float = 1.0,
        host_gap_seconds: float = 0.0,
    ) -> float:
        """Sequences running when ``rate_rps`` requests/s of ``output_tokens`` each arrive (continuous
        batching in steady state): Little's law ``R = λ · S(R)`` with ``S(R) = output × step(R) / (1 − f)``,
        ``f`` the share of time spent prefilling; ``inf`` when no finite batch keeps up.

        ``step(R) = (max(a + b·R, d·R) + c) / throughput_factor + host_gap`` is the larger of two affine
        maps of R, so the fixed point is the larger of theirs (each exists when its slope is below 1);
        below one running sequence the step is the single-stream step.
        """
        a, b, d, c = self.step_terms(context)
        c += host_gap_seconds * throughput_factor
        k = rate_rps * output_tokens / ((1.0 - prefill_share) * throughput_factor)
        single = k * (max(a + b, d) + c)
        if single <= 1.0:
            return single
        best = 0.0
        for slope, intercept in ((b, a + c), (d, c)):
            if k * slope >= 1.0:
                return math.inf
            best = max(best, k * intercept / (1.0 - k * slope))
        return best

    def decode_tokens_per_second(self, batch: float, context: float, throughput_factor: float = 1.0) -> float:
        """Tokens per second of a batch that is always full (``batch`` tokens per step)."""
        return batch / self.step_seconds(batch, context, throughput_factor)

    def roofline_tokens_per_second(self) -> float:
        """Single-stream ceiling: peak bandwidth of the GPUs ÷ weight bytes (DESIGN.md's roofline)."""
        return self.tp * self.gpu.hbm_bandwidth_bytes_per_s / self.model.weight_bytes

    def prefill_seconds(self, tokens: float, throughput_factor: float = 1.0) -> float:
        """Seconds of GPU time to prefill ``tokens`` prompt tokens (compute bound)."""
        compute = self.tp * self.gpu.peak_flops * self.compute_efficiency
        return self.model.flops_per_token * tokens / compute / throughput_factor


# ---------------------------------------------------------------------------------------------
# Traffic
# ---------------------------------------------------------------------------------------------

_EPOCH_WEEKDAY = 3  # 1970-01-01 was a Thursday (Monday = 0)


@dataclass(frozen=True, slots=True)
class Traffic:
    """Requests arriving at one engine: a daily curve with a weekend dip, slow noise, and
    log-normal prompt and output lengths."""

    peak_rps: float  # requests/s at the daily peak on a weekday
    trough_ratio: float = 0.2  # fraction of the peak at the nightly trough
    trough_hour: float = 4.0  # local hour of the trough (the peak is 12 h later)
    utc_offset_hours: float = 0.0  # hours; local time = UTC + this
    weekend_ratio: float = 0.7  # Saturday and Sunday traffic relative to weekdays
    noise_sigma: float = 0.12  # standard deviation of the slow log-noise on the rate
    noise_correlation_s: float = 900.0  # seconds; time constant of that noise
    prompt_mean_tokens: float = 1000.0  # tokens
    prompt_sigma: float = 0.9  # log-normal shape of prompt lengths
    output_mean_tokens: float = 300.0  # tokens
    output_sigma: float = 0.8  # log-normal shape of output lengths
    max_output_tokens: int = 1024  # tokens; a request reaching it finishes with reason "length"
    prefix_cache_hit_ratio: float = 0.3  # fraction of prompt tokens found in vLLM's prefix cache
    patience_s: float = 300.0  # seconds a waiting client waits before it aborts
    # Behind a least-loaded router of a larger fleet, an engine receives work in proportion to
    # how fast it drains it: the arrival rate is scaled by the build's throughput factor.
    capacity_routed: bool = False

    def rate(self, t: float) -> float:
        """Mean arrival rate at ``t`` (epoch seconds), requests/s, without noise."""
        local = t + self.utc_offset_hours * 3600.0
        hour = (local / 3600.0) % 24.0
        daily = self.trough_ratio + (1.0 - self.trough_ratio) * 0.5 * (
            1.0 - math.cos(2.0 * math.pi * (hour - self.trough_hour) / 24.0)
        )
        weekday = (int(local // 86400.0) + _EPOCH_WEEKDAY) % 7
        return self.peak_rps * daily * (self.weekend_ratio if weekday >= 5 else 1.0)


# ---------------------------------------------------------------------------------------------
# Histograms with vLLM's buckets
# ---------------------------------------------------------------------------------------------

REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
)  # fmt: skip
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
ITERATION_TOKENS_BUCKETS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
                            16384.0)  # fmt: skip
PARAMS_N_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0)
NUM_PREEMPTIONS_BUCKETS = (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0)


def request_tokens_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's ``build_1_2_5_buckets``: 1, 2, 5, 10, 20, 50, … up to ``max_model_len``."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_model_len:
                return tuple(out)
            out.append(float(value))
        exponent += 1


class Hist:
    """A cumulative histogram kept as per-bucket counts (the last bucket is +Inf) and a sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = np.asarray(bounds, dtype=np.float64)  # upper bounds in the metric's unit
        self.counts = np.zeros(len(bounds) + 1, dtype=np.int64)  # observations per bucket, +Inf last
        self.total = 0.0  # sum of observations, in the metric's unit

    def observe(self, values: np.ndarray) -> None:
        """Record many observations at once."""
        if values.size == 0:
            return
        idx = np.searchsorted(self.bounds, values, side="left")  # le is inclusive
        self.counts += np.bincount(idx, minlength=self.counts.size)
        self.total += float(values.sum())

    def observe_counts(self, counts: np.ndarray, total: float) -> None:
        """Record pre-binned observations (``counts`` per bucket, +Inf last) whose sum is ``total``."""
        self.counts += counts
        self.total += total

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, cumulative count) pairs, +Inf last, as the exposition writes them."""
        cum = np.cumsum(self.counts)
        return [(float(b), int(c)) for b, c in zip(self.bounds, cum[:-1], strict=True)] + [
            (math.inf, int(cum[-1]))
        ]


_Z_GRID = np.linspace(-8.0, 8.0, 4001)
_PHI_GRID = np.array([0.5 * (1.0 + math.erf(z / math.sqrt(2.0))) for z in _Z_GRID])  # standard normal CDF


def lognormal_bin_probabilities(bounds: np.ndarray, medians: np.ndarray, sigma: float) -> np.ndarray:
    """Probability of each bucket (``bounds`` plus +Inf) for log-normals of ``medians`` and ``sigma``.

    One row per median: shape ``(len(medians), len(bounds) + 1)``, rows summing to 1.
    """
    z = (np.log(bounds)[None, :] - np.log(np.maximum(medians, 1e-12))[:, None]) / sigma
    cdf = np.interp(z, _Z_GRID, _PHI_GRID)
    ones = np.ones((cdf.shape[0], 1))
    probs = np.clip(np.diff(np.concatenate((0.0 * ones, cdf, ones), axis=1), axis=1), 0.0, None)
    return probs / probs.sum(axis=1, keepdims=True)


# ---------------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------------

FINISH_REASONS = ("stop", "length", "abort", "error")

KV_BLOCK_TOKENS = 16  # tokens per KV-cache block (vLLM's default block_size)
_POOL_SIZE = 8192  # requests pre-drawn per engine; lengths are drawn from this pool (cheap, exact mean)
_BASE_TICK_S = 1.0  # seconds; the finest step of the simulation
_MAX_TICKS_PER_ADVANCE = 240  # bounds CPU per scrape on an accelerated clock (ticks grow instead)
_MIN_ADVANCE_S = 0.2  # seconds; shorter advances are deferred (NVML reads every second)
_BUSY_OVERHEAD = 0.95  # why: host-side scheduling/sampling leaves ~5 % gaps between steps under load
_PREFILL_BW_RATIO = 0.25  # why: prefill is compute bound; its kernels read the weights once per chunk
_PREEMPTIONS_PER_COMPLETION_AT_KV_LIMIT = 0.05  # why: illustrative order of vLLM recompute preemptions
_STEP_JITTER_SIGMA = 0.08  # log-normal shape of per-step time around the model's step time
_QUEUE_EPS = 1.0  # requests; a fluid queue below one request counts as empty
_MAX_PENDING = 4096  # ticks of unread histogram records kept before they are binned anyway
_MAX_PREFILL_SHARE = 0.95  # why: beyond this prefill alone would starve decode; treat as saturated


@dataclass(frozen=True, slots=True)
class EngineState:
    """A consistent copy of an engine's cumulative counters and current gauges (for rendering)."""

    t: float  # seconds since the epoch the state is at
    created: float  # seconds since the epoch the engine started (the ``_created`` series)
    model_name: str
    version: str
    prompt_tokens_total: int  # tokens
    generation_tokens_total: int  # tokens
    preemptions_total: int
    prefix_cache_queries_total: int  # tokens
    prefix_cache_hits_total: int  # tokens
    finished_total: dict[str, int]  # requests by finish reason
    requests_running: int
    requests_waiting: int
    kv_cache_usage_ratio: float  # 0–1
    histograms: dict[str, list[tuple[float, int]]]  # name → cumulative (le, count), +Inf last
    histogram_sums: dict[str, float]  # name → sum in the metric's unit
    num_gpu_blocks: int  # KV blocks of 16 tokens


class SimEngine:
    """One simulated vLLM engine: advances lazily to a given time, thread-safe.

    Time is always passed in (``advance_to``); the engine never reads a clock.
    """

    def __init__(
        self,
        deployment: Deployment,
        traffic: Traffic,
        *,
        start: float,
        version: str = "unknown",
        throughput_factor: float = 1.0,
        seed: int = 0,
        tick_seconds: float = _BASE_TICK_S,  # finest step; coarser is faster (offline history)
    ) -> None:
        if not deployment.fits():
            raise ValueError(
                f"{deployment.model.name} ({deployment.model.weight_bytes / 1e9:.0f} GB of weights) does not "
                f"fit on {deployment.tp} × {deployment.gpu.name}; raise tp"
            )
        if throughput_factor <= 0:
            raise ValueError("throughput_factor must be > 0")
        self.deployment = deployment
        self.traffic = traffic
        self.version = version
        self.throughput_factor = throughput_factor
        self.created = start
        self.t = start  # seconds since the epoch the state is at
        self._lock = threading.Lock()
        # Two streams: the dynamics, and the sampling of histograms (done when the state is read),
        # so that how often the engine is observed never changes what it does.
        self._rng = np.random.default_rng([seed, 0])
        self._tick_s = tick_seconds
        self._hist_rng = np.random.default_rng([seed, 1])
        self._gauge_rng = np.random.default_rng([seed, 2])  # the drawn requests the gauges read
        self._present: dict[str, int] = {}  # requests of each drawn population (running, waiting)
        self._pending_requests: list[
            tuple[int, float, float, float]
        ] = []  # (n, wait s, step s, prefill s/token)
        self._pending_itl: list[tuple[int, float]] = []  # (tokens, median inter-token seconds)
        self._pending_iter: list[tuple[int, float]] = []  # (steps, median tokens per step)
        model = deployment.model
        prompt = self._lognormal(traffic.prompt_mean_tokens, traffic.prompt_sigma, _POOL_SIZE)
        output = self._lognormal(traffic.output_mean_tokens, traffic.output_sigma, _POOL_SIZE)
        self._pool_prompt = np.clip(np.round(prompt), 1, model.max_model_len - traffic.max_output_tokens)
        self._pool_output = np.clip(np.round(output), 1, traffic.max_output_tokens)
        self.mean_prompt_tokens = float(self._pool_prompt.mean())  # tokens
        self.mean_output_tokens = float(self._pool_output.mean())  # tokens
        self.mean_context_tokens = self.mean_prompt_tokens + self.mean_output_tokens / 2.0  # tokens
        # fluid state
        self.running = 0.0  # requests in the running batch (fluid)
        self.waiting = 0.0  # requests queued (fluid)
        self._noise = 0.0  # log-noise on the arrival rate
        self._carry = {"done": 0.0, "abort": 0.0, "gen": 0.0, "prompt": 0.0, "preempt": 0.0}
        # last-tick observables
        self.util_gpu_ratio = 0.0  # 0–1
        self.dram_bw_ratio = 0.0  # 0–1
        self.kv_cache_usage_ratio = 0.0  # 0–1
        self._running_gauge = 0
        self._waiting_gauge = 0
        # cumulative counters
        self.prompt_tokens_total = 0  # tokens
        self.generation_tokens_total = 0  # tokens
        self.preemptions_total = 0
        self.prefix_queries_total = 0  # tokens
        self.prefix_hits_total = 0  # tokens
        self.finished_total = dict.fromkeys(FINISH_REASONS, 0)
        latency = REQUEST_LATENCY_BUCKETS
        req_tokens = request_tokens_buckets(model.max_model_len)
        self.hists: dict[str, Hist] = {
            "iteration_tokens_total": Hist(ITERATION_TOKENS_BUCKETS),
            "time_to_first_token_seconds": Hist(TTFT_BUCKETS),
            "inter_token_latency_seconds": Hist(ITL_BUCKETS),
            "request_time_per_output_token_seconds": Hist(ITL_BUCKETS),
            "e2e_request_latency_seconds": Hist(latency),
            "request_queue_time_seconds": Hist(latency),
            "request_inference_time_seconds": Hist(latency),
            "request_prefill_time_seconds": Hist(latency),
            "request_decode_time_seconds": Hist(latency),
            "request_prompt_tokens": Hist(req_tokens),
            "request_generation_tokens": Hist(req_tokens),
            "request_max_num_generation_tokens": Hist(req_tokens),
            "request_params_n": Hist(PARAMS_N_BUCKETS),
            "request_params_max_tokens": Hist(req_tokens),
            "request_prefill_kv_computed_tokens": Hist(req_tokens),
            "request_num_preemptions": Hist(NUM_PREEMPTIONS_BUCKETS),
        }

    # -- public -------------------------------------------------------------------------------

    @property
    def model_name(self) -> str:
        """The served model name."""
        return self.deployment.model.name

    def advance_to(self, t: float) -> None:
        """Simulate up to ``t`` (epoch seconds); earlier or very close times are a no-op."""
        with self._lock:
            elapsed = t - self.t
            if elapsed < _MIN_ADVANCE_S:
                return
            ticks = min(_MAX_TICKS_PER_ADVANCE, max(1, math.ceil(elapsed / self._tick_s)))
            dt = elapsed / ticks
            for _ in range(ticks):
                self._tick(dt)
            if len(self._pending_iter) + len(self._pending_requests) > _MAX_PENDING:
                self._flush()

    def set_version(self, version: str, throughput_factor: float) -> None:
        """Switch to another build from the current state on (call ``advance_to`` first)."""
        if throughput_factor <= 0:
            raise ValueError("throughput_factor must be > 0")
        with self._lock:
            self.version = version
            self.throughput_factor = throughput_factor

    def gpu_load(self) -> GpuLoad:
        """What each of this engine's GPUs is doing now (the same on every tensor-parallel rank)."""
        with self._lock:
            return GpuLoad(
                util_gpu_ratio=self.util_gpu_ratio,
                dram_bw_ratio=self.dram_bw_ratio,
                memory_used_bytes=self.deployment.memory_used_per_gpu_bytes,
            )

    def state(self) -> EngineState:
        """A consistent copy of the counters, gauges and histograms."""
        with self._lock:
            self._flush()
            return EngineState(
                t=self.t,
                created=self.created,
                model_name=self.model_name,
                version=self.version,
                prompt_tokens_total=self.prompt_tokens_total,
                generation_tokens_total=self.generation_tokens_total,
                preemptions_total=self.preemptions_total,
                prefix_cache_queries_total=self.prefix_queries_total,
                prefix_cache_hits_total=self.prefix_hits_total,
                finished_total=dict(self.finished_total),
                requests_running=self._running_gauge,
                requests_waiting=self._waiting_gauge,
                kv_cache_usage_ratio=self.kv_cache_usage_ratio,
                histograms={name: h.cumulative() for name, h in self.hists.items()},
                histogram_sums={name: h.total for name, h in self.hists.items()},
                num_gpu_blocks=int(self.deployment.kv_capacity_tokens // KV_BLOCK_TOKENS),
            )

    def capacity_rps(self) -> float:
        """Requests/s this engine completes when saturated, at the current build.

        Each request costs the GPUs its prefill plus its share of the decode steps of a full batch:
        ``1 / (T_prefill + output · step(R_cap) / R_cap)``.
        """
        r_cap = self._r_cap()
        return 1.0 / (self._prefill_gpu_seconds() + self.mean_output_tokens * self._step(r_cap) / r_cap)

    # -- physics ------------------------------------------------------------------------------

    def _lognormal(self, mean: float, sigma: float, n: int) -> np.ndarray:
        mu = math.log(mean) - sigma * sigma / 2.0  # so that the mean is ``mean``
        return self._rng.lognormal(mu, sigma, n)

    def _r_cap(self) -> float:
        dep = self.deployment
        return min(float(dep.max_num_seqs), dep.kv_capacity_tokens / self.mean_context_tokens)

    def _step(self, running: float) -> float:
        return self.deployment.step_seconds(
            max(1.0, running), self.mean_context_tokens, self.throughput_factor
        )

    def _prefill_gpu_seconds(self) -> float:
        """GPU seconds to prefill a mean request's uncached prompt."""
        uncached = self.mean_prompt_tokens * (1.0 - self.traffic.prefix_cache_hit_ratio)
        return self.deployment.prefill_seconds(uncached, self.throughput_factor)

    def _service_seconds(self, running: float, prefill_share: float) -> float:
        """A request's decode time at ``running`` concurrency while ``prefill_share`` of GPU time prefills."""
        return self.mean_output_tokens * self._step(running) / (1.0 - prefill_share)

    def _target_running(self, lam: float, prefill_share: float) -> float:
        """Little's law fixed point for this engine's traffic (see :meth:`Deployment.running_for`)."""
        return self.deployment.running_for(
            lam, self.mean_output_tokens, self.mean_context_tokens, prefill_share, self.throughput_factor
        )

    def _take(self, key: str, amount: float) -> int:
        """Integer part of ``amount`` plus what earlier ticks left over (keeps counters integral)."""
        total = self._carry[key] + amount
        whole = math.floor(total)
        self._carry[key] = total - whole
        return int(whole)

    def _instant(self, name: str, rate: float, lifetime: float, dt: float) -> int:
        """Advance the drawn population ``name`` by ``dt`` seconds (arrivals/s ``rate``, mean
        lifetime ``lifetime`` s; the exact M/M/∞ step of :mod:`infercost_sim.population`) and read it."""
        n = self._present.get(name, 0)
        if lifetime <= 0 or rate <= 0:
            stay = math.exp(-dt / lifetime) if lifetime > 0 else 0.0
            n = int(self._gauge_rng.binomial(n, stay))
        else:
            stay = math.exp(-dt / lifetime)
            arrived = int(self._gauge_rng.poisson(rate * dt))
            still = lifetime * (1.0 - stay) / dt
            n = int(self._gauge_rng.binomial(n, stay)) + int(
                self._gauge_rng.binomial(arrived, min(1.0, still))
            )
        self._present[name] = n
        return n

    def _stochastic_round(self, x: float) -> int:
        whole = math.floor(x)
        return int(whole + (1 if self._rng.random() < x - whole else 0))

    def _tick(self, dt: float) -> None:
        tr = self.traffic
        dep = self.deployment
        rng = self._rng
        t_mid = self.t + dt / 2.0
        # slow multiplicative noise on the arrival rate (an exact AR(1) step of an OU process)
        decay = math.exp(-dt / tr.noise_correlation_s)
        self._noise = self._noise * decay + tr.noise_sigma * math.sqrt(1.0 - decay * decay) * rng.normal()
        lam = tr.rate(t_mid) * math.exp(self._noise - tr.noise_sigma**2 / 2.0)  # requests/s
        if tr.capacity_routed:
            lam *= self.throughput_factor
        arrivals = float(rng.poisson(lam * dt))

        r0, w0 = self.running, self.waiting
        r_cap = self._r_cap()
        prefill_gpu_s = self._prefill_gpu_seconds()
        prefill_share = lam * prefill_gpu_s  # fraction of GPU time spent prefilling
        saturated = w0 >= _QUEUE_EPS or prefill_share >= _MAX_PREFILL_SHARE
        r_star = r_cap if saturated else self._target_running(lam, prefill_share)
        backlog = w0 + arrivals
        aborts = 0.0
        if not saturated and r_star < r_cap:
            s = self._service_seconds(r_star, prefill_share)
            r1 = r_star + (r0 - r_star) * math.exp(-dt / s)
            admitted = backlog
            done = r0 + admitted - r1
            if done < 0.0:
                done, r1 = 0.0, r0 + admitted
            w1 = 0.0
        else:
            prefill_share = self.capacity_rps() * prefill_gpu_s
            s = self._service_seconds(r_cap, prefill_share)
            r1 = r_cap + (r0 - r_cap) * math.exp(-dt / s)
            r_avg = (r0 + r1) / 2.0
            done = r_avg / self._service_seconds(r_avg, prefill_share) * dt
            admitted = done + r1 - r0
            if admitted > backlog:
                admitted = backlog
                r1 = max(0.0, r0 + admitted - done)
                done = r0 + admitted - r1
            w1 = backlog - admitted
            aborts = w1 * (1.0 - math.exp(-dt / tr.patience_s))
            w1 -= aborts
        self.running, self.waiting = r1, w1
        r_avg = (r0 + r1) / 2.0
        w_avg = (w0 + w1) / 2.0
        step_s = self._step(r_avg) / (1.0 - prefill_share)  # seconds; chunked prefill lengthens steps

        # counters
        gen = r_avg * self.mean_output_tokens / self._service_seconds(r_avg, prefill_share) * dt
        n_gen = self._take("gen", gen)
        n_prompt = self._take("prompt", admitted * self.mean_prompt_tokens)
        n_hits = int(n_prompt * tr.prefix_cache_hit_ratio)
        n_done = self._take("done", done)
        n_abort = self._take("abort", aborts)
        kv_bound = r_cap < dep.max_num_seqs and r_avg > 0.97 * r_cap
        n_preempt = self._take("preempt", done * _PREEMPTIONS_PER_COMPLETION_AT_KV_LIMIT) if kv_bound else 0
        self.generation_tokens_total += n_gen
        self.prompt_tokens_total += n_prompt
        self.prefix_queries_total += n_prompt
        self.prefix_hits_total += n_hits
        self.preemptions_total += n_preempt
        self.finished_total["abort"] += n_abort

        # gauges and GPU load
        # the dynamics' stream draws what it drew when the gauges were rounded means (two uniforms), so
        # that the engine's traffic and counters are the same draw whatever the gauges read
        self._rng.random(2)
        # the gauges: one instant of the drawn requests (an M/M/∞ population with the fluid's mean:
        # lifetime the request's time in the engine, arrivals Little's law's), not the fluid mean
        life = self._service_seconds(r_avg, prefill_share)  # seconds a request decodes
        self._running_gauge = min(dep.max_num_seqs, self._instant("running", r_avg / life, life, dt))
        wait_s = w_avg / lam if lam > 0 and w_avg >= _QUEUE_EPS else 0.0  # seconds a request waits
        self._waiting_gauge = self._instant("waiting", lam, wait_s, dt)
        # a full batch with a queue behind it stays full: a freed slot is refilled from the queue at
        # the next step (the scheduler admits waiting requests first)
        free = max(0, math.floor(r_cap) - self._running_gauge)
        moved = min(free, self._waiting_gauge)
        if moved:
            self._running_gauge += moved
            self._waiting_gauge -= moved
            self._present["running"] = self._present.get("running", 0) + moved
            self._present["waiting"] = self._present.get("waiting", 0) - moved
        kv_used = self._running_gauge * self.mean_context_tokens * dep.model.kv_bytes_per_token
        self.kv_cache_usage_ratio = min(1.0, kv_used / dep.kv_pool_bytes)
        busy = 1.0 - math.exp(-r_avg)  # P(at least one request in the engine), Poisson occupancy
        self.util_gpu_ratio = min(1.0, busy * _BUSY_OVERHEAD)
        decode_bw = dep.step_bytes(max(1.0, r_avg), self.mean_context_tokens) / self._step(r_avg)
        decode_ratio = decode_bw / (dep.tp * dep.gpu.hbm_bandwidth_bytes_per_s)
        self.dram_bw_ratio = min(
            1.0,
            self.util_gpu_ratio * ((1.0 - prefill_share) * decode_ratio + prefill_share * _PREFILL_BW_RATIO),
        )

        # histograms: recorded now, binned when the state is read
        n_steps = self._stochastic_round(busy * dt / step_s)
        if n_steps > 0:
            self._pending_iter.append((n_steps, max(1.0, (n_gen + n_prompt - n_hits) / n_steps)))
        n_itl = n_gen - n_done
        if n_itl > 0:
            self._pending_itl.append((n_itl, step_s))
        if n_done > 0:
            mean_wait = w_avg * dt / admitted if w_avg >= _QUEUE_EPS and admitted > 0 else 0.0
            per_token = self.deployment.prefill_seconds(1.0, self.throughput_factor)
            self._pending_requests.append((n_done, mean_wait, step_s, per_token))
        self.t += dt

    def _flush(self) -> None:
        """Bin everything recorded since the last read into the histograms (and finish reasons)."""
        for name, pending, sigma in (
            ("inter_token_latency_seconds", self._pending_itl, 0.15),  # why: step times vary ~±15 %
            ("iteration_tokens_total", self._pending_iter, 0.3),  # why: prefill chunks come and go
        ):
            if pending:
                ns = np.array([p[0] for p in pending], dtype=np.int64)
                medians = np.array([p[1] for p in pending])
                hist = self.hists[name]
                probs = lognormal_bin_probabilities(hist.bounds, medians, sigma)
                counts = self._hist_rng.multinomial(ns, probs)
                hist.observe_counts(counts.sum(axis=0), float((ns * medians).sum()) * math.exp(sigma**2 / 2))
                pending.clear()
        if self._pending_requests:
            self._observe_requests(self._pending_requests)
            self._pending_requests.clear()

    def _observe_requests(self, pending: list[tuple[int, float, float, float]]) -> None:
        """Sample the latencies and lengths of completed requests into the per-request histograms."""
        rng = self._hist_rng
        tr = self.traffic
        counts = np.array([p[0] for p in pending], dtype=np.int64)
        n = int(counts.sum())
        wait = np.repeat(np.array([p[1] for p in pending]), counts)
        step_s = np.repeat(np.array([p[2] for p in pending]), counts)
        per_token = np.repeat(np.array([p[3] for p in pending]), counts)
        idx = rng.integers(0, _POOL_SIZE, n)
        prompt = self._pool_prompt[idx]
        output = self._pool_output[idx]
        uncached = np.maximum(1.0, np.round(prompt * (1.0 - tr.prefix_cache_hit_ratio)))
        queue = rng.exponential(1.0, n) * wait
        step = step_s * rng.lognormal(0.0, _STEP_JITTER_SIGMA, n)
        prefill = step + per_token * uncached
        decode = (output - 1.0) * step
        ttft = queue + prefill
        h = self.hists
        h["time_to_first_token_seconds"].observe(ttft)
        h["e2e_request_latency_seconds"].observe(ttft + decode)
        h["request_queue_time_seconds"].observe(queue)
        h["request_inference_time_seconds"].observe(prefill + decode)
        h["request_prefill_time_seconds"].observe(prefill)
        h["request_decode_time_seconds"].observe(decode)
        multi = output > 1
        h["request_time_per_output_token_seconds"].observe(decode[multi] / (output[multi] - 1.0))
        h["request_prompt_tokens"].observe(prompt)
        h["request_generation_tokens"].observe(output)
        max_tokens = np.full(n, float(tr.max_output_tokens))
        h["request_max_num_generation_tokens"].observe(max_tokens)
        h["request_params_max_tokens"].observe(max_tokens)
        h["request_params_n"].observe(np.ones(n))
        h["request_prefill_kv_computed_tokens"].observe(uncached)
        h["request_num_preemptions"].observe(np.zeros(n))
        length = int(np.count_nonzero(output >= tr.max_output_tokens))
        self.finished_total["length"] += length
        self.finished_total["stop"] += n - length
