"""Weeks of simulated per-minute history for one node, with labelled injected regressions.

The output is a sequence of :class:`~agent.samples.CostWindow` (exactly what the daemon stores and
what the detectors read) plus the ground truth: which intervals are regressions that must be
detected, which are benign events that must not alert, and the dollars each regression costs.

Physics (see DESIGN.md "Cost model"): each replica is one GPU serving an 8B fp16 model. Decode is
memory-bandwidth bound, so one step reads the weights plus every running sequence's KV cache::

    step(b) = e_gpu · (W + b·c·kv) / B_eff + e_host · h

and decode throughput is ``b / step(b)`` on the time left after prefill. Tokens per second per GPU
grow with the batch ``b`` until the KV cache (or ``max_num_seqs``) is full. A concurrency autoscaler
(running + waiting requests per replica, like KEDA on vLLM's gauges) keeps ``b`` near a target
between a floor and the node's GPU count; new replicas load weights for a few minutes before they
serve (scale-up transients). At night and at weekends the floor holds more GPUs than the traffic
needs, so the cost per token naturally rises several times: exactly what a literal
"1.5 × 7-day mean" rule mistakes for a regression.

Regressions act on the physics, not on the cost directly, so every signal moves consistently:

- ``step``: a deploy whose kernels are slower (``e_gpu``) → bigger batches for the same traffic →
  more replicas → cost per token × factor at load; ITL up.
- ``drift``: the same slowdown ramping from 1 to the factor over 1–7 days (fragmentation, a leak).
- ``peak_collapse``: a deploy that shrinks the KV cache; harmless until the peak, where the cache
  fills, requests are preempted and recomputed, throughput falls and p99 latency explodes.
- ``util_drop``: a deploy whose scheduler is host-bound (``e_host``): the GPU idles between steps,
  utilisation falls at constant traffic, and the autoscaler pays for more GPUs.
- ``intermittent``: the kernel slowdown switching on and off in episodes of 20–60 minutes.

Benign events (labelled, must not alert): troughs (always present), traffic bursts that force
scale-ups, a change of prompt/output mix (RAG-like long prompts), scrape gaps (zero-token windows
followed by one catching-up window, or windows missing altogether) and deploys that do not regress.

Everything is deterministic given the seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from agent.samples import CostWindow, UsageWindow

# ---------------------------------------------------------------------------------------------
# Physical constants of the simulated node (one replica = one H100 serving an 8B fp16 model)
# ---------------------------------------------------------------------------------------------

GPU_PRICE_USD_PER_HOUR = 2.5  # dollars per GPU-hour, an on-demand H100 order of magnitude
WEIGHTS_BYTES = 16e9  # bytes, 8B parameters in fp16
KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # bytes, Llama-3-8B-like GQA: 2·layers·kv_heads·head_dim·2
HBM_BYTES_PER_SECOND = 3.35e12  # bytes/s, H100 SXM peak
BW_EFFICIENCY = 0.8  # fraction of peak bandwidth a good decode kernel reaches
HOST_GAP_SECONDS = 0.004  # seconds of scheduler/host work per step that the GPU waits for
PREFILL_TOKENS_PER_SECOND = 30000.0  # tokens/s per GPU, compute-bound (2·8e9 FLOP/token at ~50 % MFU)
GPU_MEMORY_BYTES = 80e9  # bytes
KV_CAPACITY_TOKENS = (GPU_MEMORY_BYTES * 0.9 - WEIGHTS_BYTES) / KV_BYTES_PER_TOKEN  # tokens per replica
MAX_NUM_SEQS = 256  # sequences, the engine's batch cap
TARGET_CONCURRENCY = 64  # requests per replica the autoscaler aims at (keeps ITL acceptable)
MIN_REPLICAS = 2  # why 2: the usual HA floor; it is what makes troughs expensive per token
MAX_REPLICAS = 8  # GPUs on the node
WARMUP_MINUTES = 4  # minutes a new replica loads weights (costs, serves nothing)
SCALE_DOWN_COOLDOWN_MINUTES = 10  # minutes the autoscaler waits before removing replicas
IDLE_POWER_WATTS = 90.0  # watts, an allocated but idle H100
MAX_POWER_WATTS = 700.0  # watts, H100 SXM TDP
PREEMPT_THRASH = 0.45  # fraction of decode work lost to preemption/recompute when the KV cache is full

PROMPT_TOKENS_MEAN = 1000.0  # tokens per request
OUTPUT_TOKENS_MEAN = 250.0  # tokens per request
# Why 8 % and a few hours: real request mixes wander (tenants, time of day) without being an
# incident; a detector must tell that everyday wander from a regression.
MIX_WANDER = 0.08  # standard deviation of log prompt and log output length, stationary
MIX_WANDER_MINUTES = 180.0  # minutes, correlation time of that wander
# A benign mix change (RAG-like): longer prompts, shorter answers. Why these figures: $/1M output
# tokens rises ≈ 1.6× while the GPU work per request stays within the node's peak capacity, so it
# is a change of *what* is served, not of how efficiently (a heavier mix that overloads the node
# at peak is a capacity incident, which the KV-cache and TTFT rules rightly page on).
MIX_CHANGE_PROMPT = 1.3  # × prompt length
MIX_CHANGE_OUTPUT = 0.5  # × output length
NOMINAL_CONTEXT_TOKENS = PROMPT_TOKENS_MEAN + OUTPUT_TOKENS_MEAN / 2  # tokens, mean context of a decode step
ROOFLINE_NOISE = 0.03  # log-normal sd of the roofline efficiency estimate, per minute
PEAK_REQUESTS_PER_SECOND = 110.0  # requests/s at a weekday peak: the node runs flat out (8 replicas, b ≈ 85)

MINUTE = 60.0  # seconds
HOUR = 3600.0  # seconds
DAY = 86400.0  # seconds
WEEK = 7 * DAY  # seconds
# Monday 2024-01-01 00:00 UTC: the simulation starts on a Monday midnight so hour-of-week is easy to read.
DEFAULT_START = 1704067200.0  # seconds since the epoch

REGRESSION_KINDS = ("step", "drift", "peak_collapse", "util_drop", "intermittent")
BENIGN_KINDS = ("burst", "mix_change", "scrape_gap", "benign_deploy")


@dataclass(frozen=True, slots=True)
class Incident:
    """One labelled interval of the simulated history."""

    kind: str  # one of REGRESSION_KINDS (must be detected) or BENIGN_KINDS (must not alert)
    start: float  # seconds since the epoch, when it was injected
    end: float  # seconds since the epoch, when it stopped (rollback, fix, end of the event)
    factor: float  # nominal cost-per-token multiplier at load (1.0 for benign events)
    regression: bool  # True: a detector should alert; False: an alert here is a false alarm
    visible: float = 0.0  # seconds since the epoch, first minute the cost per token is ≥ 10 % up
    excess_usd: float = 0.0  # dollars, extra cost over the healthy counterfactual during the incident
    note: str = ""


@dataclass(frozen=True, slots=True)
class SimulatedHistory:
    """A node's simulated per-minute history and its ground truth."""

    node: str
    engine: str
    model: str
    start: float  # seconds since the epoch
    minutes: int  # simulated minutes (windows may be fewer: scrape gaps drop some)
    windows: tuple[CostWindow, ...]
    incidents: tuple[Incident, ...]  # regressions and benign events, by start time
    excess_usd_per_minute: np.ndarray = field(repr=False)  # dollars, actual − healthy cost, per minute

    @property
    def regressions(self) -> tuple[Incident, ...]:
        """The incidents a detector must catch."""
        return tuple(i for i in self.incidents if i.regression)

    @property
    def benign(self) -> tuple[Incident, ...]:
        """The labelled events a detector must not alert on."""
        return tuple(i for i in self.incidents if not i.regression)


@dataclass
class _Drivers:
    """Per-minute inputs of the physics (arrays of length ``minutes``)."""

    rps: np.ndarray  # requests/s offered
    prompt_tokens: np.ndarray  # tokens per request
    output_tokens: np.ndarray  # tokens per request
    e_gpu: np.ndarray  # kernel slowdown multiplier (1 = healthy)
    e_host: np.ndarray  # host-overhead multiplier (1 = healthy)
    kv_factor: np.ndarray  # fraction of the healthy KV capacity available
    version: list[str]  # deployed model version


@dataclass
class _Physics:
    """Per-minute outputs of the physics."""

    replicas: np.ndarray  # allocated GPUs
    prompt_tokens: np.ndarray  # tokens served in the minute
    generation_tokens: np.ndarray  # tokens served in the minute
    util: np.ndarray  # 0–1, NVML .gpu mean over allocated GPUs
    bw: np.ndarray  # 0–1, DRAM bandwidth mean over allocated GPUs
    power: np.ndarray  # watts, sum over allocated GPUs
    running: np.ndarray  # requests running (sum over replicas)
    kv: np.ndarray  # 0–1, KV cache usage (mean over ready replicas)
    preemptions: np.ndarray  # count in the minute
    ttft_p99: np.ndarray  # seconds
    itl_p99: np.ndarray  # seconds
    roofline: np.ndarray  # observed decode tok/s ÷ bandwidth ceiling


def _step_seconds(b: float, ctx: float, e_gpu: float, e_host: float) -> tuple[float, float]:
    """(step time, GPU-busy part of it) in seconds for a batch of ``b`` at mean context ``ctx``."""
    gpu = e_gpu * (WEIGHTS_BYTES + b * ctx * KV_BYTES_PER_TOKEN) / (HBM_BYTES_PER_SECOND * BW_EFFICIENCY)
    return gpu + e_host * HOST_GAP_SECONDS, gpu


def _replica_load(d: float, ratio: float, ctx: float, e_gpu: float, e_host: float, b_max: float) -> tuple:
    """Solve one replica's batch for a decode demand ``d`` (tokens/s).

    Returns (batch, served decode tokens/s, prefill time fraction, saturated?).
    """
    a = e_gpu * WEIGHTS_BYTES / (HBM_BYTES_PER_SECOND * BW_EFFICIENCY) + e_host * HOST_GAP_SECONDS
    k = e_gpu * ctx * KV_BYTES_PER_TOKEN / (HBM_BYTES_PER_SECOND * BW_EFFICIENCY)
    f = d * ratio / PREFILL_TOKENS_PER_SECOND
    denom = (1.0 - f) - d * k
    if denom > 0:
        b = d * a / denom
        if b <= b_max:
            return b, d, f, False
    # Saturated: the batch is capped; throughput d solves d = b_max·(1 − d·r/PR) / step(b_max).
    step = a + b_max * k
    d_sat = (b_max / step) / (1.0 + b_max * ratio / (PREFILL_TOKENS_PER_SECOND * step))
    return b_max, d_sat, d_sat * ratio / PREFILL_TOKENS_PER_SECOND, True


def _simulate(drv: _Drivers, rng_noise: np.ndarray) -> _Physics:
    """Run the autoscaled engine minute by minute over the drivers."""
    n = len(drv.rps)
    out = _Physics(*(np.zeros(n) for _ in range(12)))
    allocated = MIN_REPLICAS
    ready_at: list[int] = []  # minute each warming replica becomes ready
    ready = MIN_REPLICAS
    below_since: int | None = None
    backlog = 0.0  # requests queued from previous minutes
    for t in range(n):
        ready += sum(1 for m in ready_at if m == t)
        ready_at = [m for m in ready_at if m > t]
        p_len, o_len = drv.prompt_tokens[t], drv.output_tokens[t]
        ratio = p_len / o_len
        ctx = p_len + o_len / 2.0
        b_max = min(MAX_NUM_SEQS, KV_CAPACITY_TOKENS * drv.kv_factor[t] / ctx)
        offered_rps = drv.rps[t] + backlog / MINUTE
        d = offered_rps * o_len / ready
        b, d_served, f, saturated = _replica_load(d, ratio, ctx, drv.e_gpu[t], drv.e_host[t], b_max)
        kv_full = b * ctx / (KV_CAPACITY_TOKENS * drv.kv_factor[t])
        if saturated and b_max < MAX_NUM_SEQS:
            d_served *= 1.0 - PREEMPT_THRASH  # KV-bound: preempted sequences are recomputed
        served_rps = d_served * ready / o_len
        backlog = min(max(0.0, (offered_rps - served_rps) * MINUTE), 600.0 * drv.rps[t])  # clients give up
        waiting = backlog / max(1.0, ready)
        step, gpu_part = _step_seconds(b, ctx, drv.e_gpu[t], drv.e_host[t])
        occupancy = min(1.0, b)
        util_ready = min(0.99, f + (1 - f) * occupancy * gpu_part / step)
        bytes_per_s = (WEIGHTS_BYTES + b * ctx * KV_BYTES_PER_TOKEN) / step * occupancy * (1 - f)
        bw_ready = min(0.95, bytes_per_s / HBM_BYTES_PER_SECOND + 0.3 * f)
        warming = allocated - ready
        out.replicas[t] = allocated
        out.util[t] = (util_ready * ready + 0.02 * warming) / allocated
        out.bw[t] = (bw_ready * ready + 0.05 * warming) / allocated
        busy = 0.6 * util_ready + 0.4 * bw_ready
        out.power[t] = ready * (IDLE_POWER_WATTS + (MAX_POWER_WATTS - IDLE_POWER_WATTS) * busy) + warming * (
            IDLE_POWER_WATTS + 60.0
        )
        out.generation_tokens[t] = served_rps * o_len * MINUTE
        out.prompt_tokens[t] = served_rps * p_len * MINUTE
        out.running[t] = b * ready
        out.kv[t] = min(1.0, kv_full)
        out.preemptions[t] = served_rps * MINUTE * 0.3 if saturated and b_max < MAX_NUM_SEQS else 0.0
        queue_wait = waiting / max(served_rps / max(1, ready), 1e-3)
        out.ttft_p99[t] = 1.5 * (p_len / PREFILL_TOKENS_PER_SECOND + step) / max(0.05, 1 - f) + queue_wait
        out.itl_p99[t] = 1.4 * step * (1 + f)
        # The ceiling at the batch but at the *nominal* context: the daemon knows the model's
        # weights and KV bytes per token, not each request's length, so a longer mix lowers it too.
        ceiling = b * HBM_BYTES_PER_SECOND / (WEIGHTS_BYTES + b * NOMINAL_CONTEXT_TOKENS * KV_BYTES_PER_TOKEN)
        out.roofline[t] = (d_served / max(1e-9, 1 - f)) / max(ceiling, 1e-9) if b > 0 else 0.0
        # Autoscaler: the fewest replicas whose running + waiting per replica stays at or under the
        # target (a well-tuned concurrency HPA); up at once, down one at a time after a cooldown.
        demand = offered_rps * o_len
        desired = MAX_REPLICAS
        for r in range(MIN_REPLICAS, MAX_REPLICAS + 1):
            b_r, _, _, sat = _replica_load(demand / r, ratio, ctx, drv.e_gpu[t], drv.e_host[t], MAX_NUM_SEQS)
            if not sat and b_r + backlog / r <= TARGET_CONCURRENCY:
                desired = r
                break
        if desired > allocated:
            ready_at.extend([t + WARMUP_MINUTES] * (desired - allocated))
            allocated = desired
            below_since = None
        elif desired < allocated and not ready_at:
            below_since = t if below_since is None else below_since
            if t - below_since >= SCALE_DOWN_COOLDOWN_MINUTES:
                allocated -= 1
                ready -= 1
                below_since = None
        else:
            below_since = None
    noise = rng_noise
    for arr in (out.util, out.bw):
        arr *= 1.0 + 0.02 * noise[0]
        np.clip(arr, 0.0, 1.0, out=arr)
    out.ttft_p99 *= np.exp(0.08 * noise[1])
    out.itl_p99 *= np.exp(0.05 * noise[2])
    out.power *= 1.0 + 0.01 * noise[3]
    # Why 3 %: the daemon derives roofline efficiency from a sampled running-requests gauge and an
    # estimated context length, so it is no cleaner than the utilisation gauges.
    out.roofline *= np.exp(ROOFLINE_NOISE * noise[4])
    return out


def _traffic(rng: np.random.Generator, minutes: int, start: float) -> np.ndarray:
    """Offered requests/s per minute: daily and weekly cycles, slow day-to-day level, AR(1) noise."""
    t = start + MINUTE * np.arange(minutes)
    hour = ((t - DEFAULT_START) % DAY) / HOUR
    weekday = (((t - DEFAULT_START) // DAY) % 7).astype(int)
    daily = 0.12 + 0.88 * ((1 - np.cos(2 * np.pi * (hour - 4.0) / 24.0)) / 2.0) ** 1.6  # trough 04:00
    weekly = np.where(weekday >= 5, 0.45, 1.0)
    days = minutes // 1440 + 2
    day_level = np.repeat(rng.normal(0.95, 0.04, days), 1440)[:minutes]
    ar = np.zeros(minutes)
    eps = rng.normal(0.0, 0.025, minutes)
    for i in range(1, minutes):
        ar[i] = 0.95 * ar[i - 1] + eps[i]
    return PEAK_REQUESTS_PER_SECOND * daily * weekly * day_level * np.exp(ar)


def _wander(rng: np.random.Generator, minutes: int) -> np.ndarray:
    """A multiplier around 1 wandering slowly (AR(1) in log space, sd MIX_WANDER)."""
    phi = math.exp(-1.0 / MIX_WANDER_MINUTES)
    eps = rng.normal(0.0, MIX_WANDER * math.sqrt(1.0 - phi * phi), minutes)
    x = np.zeros(minutes)
    x[0] = rng.normal(0.0, MIX_WANDER)
    for i in range(1, minutes):
        x[i] = phi * x[i - 1] + eps[i]
    return np.exp(x)


def _weekday_hour(rng: np.random.Generator, day_lo: int, day_hi: int, h_lo: float, h_hi: float) -> int:
    """Minute offset of a random weekday time between hours ``h_lo`` and ``h_hi``."""
    while True:
        day = int(rng.integers(day_lo, day_hi))
        if day % 7 < 5:
            return day * 1440 + int(rng.uniform(h_lo, h_hi) * 60)


def _schedule(rng: np.random.Generator, minutes: int, warmup_days: int) -> list[tuple[str, int, int, float]]:
    """Non-overlapping (kind, start minute, end minute, factor) after the warm-up days."""
    days = minutes // 1440
    factors = [1.1, 1.2, 1.3, 1.5, 2.0]
    plan: list[tuple[str, int, int, float]] = []
    busy: list[tuple[int, int]] = []

    def free(a: int, b: int) -> bool:
        return all(b + 360 <= s or a >= e + 360 for s, e in busy) and b < minutes

    def place(
        kind: str, dur_lo: int, dur_hi: int, factor: float, weekday: bool, h: tuple[float, float]
    ) -> None:
        if minutes - dur_hi - 1 <= warmup_days * 1440:
            return  # no room after the warm-up
        for _ in range(500):
            if weekday:
                a = _weekday_hour(rng, warmup_days, days, *h)
            else:
                a = int(rng.integers(warmup_days * 1440, minutes - dur_hi - 1))
            b = a + int(rng.integers(dur_lo, dur_hi + 1))
            if free(a, b):
                plan.append((kind, a, b, factor))
                busy.append((a, b))
                return

    weeks = math.ceil(max(0, days - warmup_days) / 7)  # one set of incidents per simulated week
    for _ in range(weeks):
        # Long events first so they find room.
        drift_minutes = int(rng.integers(1440, 4 * 1440))
        place("drift", 1440, drift_minutes, float(rng.choice([1.3, 1.5, 2.0])), False, (0, 24))
        place("mix_change", 1440, 2 * 1440, 1.0, True, (9, 12))
        place("peak_collapse", 1440, 2 * 1440, 1.0 / (1.0 - PREEMPT_THRASH), True, (6, 9))
        for _ in range(2):
            place("step", 240, 480, float(rng.choice(factors)), True, (9, 17))
        place("util_drop", 180, 360, float(rng.choice(factors[1:])), True, (9, 16))
        place("intermittent", 720, 1440, float(rng.choice([1.3, 1.5, 2.0])), True, (8, 10))
        place("benign_deploy", 60, 60, 1.0, True, (9, 17))
        place("benign_deploy", 60, 60, 1.0, False, (0, 24))
        for _ in range(3):
            place("burst", 15, 40, 1.0, False, (0, 24))
        for _ in range(3):
            place("scrape_gap", 3, 30, 1.0, False, (0, 24))
    plan.sort(key=lambda p: p[1])
    return plan


def _e_for_factor(factor: float, host: bool) -> float:
    """Slowdown multiplier (kernel or host part) that makes a target-sized step ``factor`` × longer."""
    ctx = PROMPT_TOKENS_MEAN + OUTPUT_TOKENS_MEAN / 2
    step, gpu = _step_seconds(TARGET_CONCURRENCY, ctx, 1.0, 1.0)
    if host:
        return (factor * step - gpu) / HOST_GAP_SECONDS
    return (factor * step - HOST_GAP_SECONDS) / gpu


def simulate_node(
    seed: int = 7,
    weeks: int = 4,
    node: str = "sim-node-0",
    engine: str = "vllm-0",
    model: str = "llama-3-8b",
    start: float = DEFAULT_START,
    warmup_days: int = 7,
) -> SimulatedHistory:
    """Simulate ``weeks`` of 1-minute windows for one node with injected, labelled incidents.

    Incidents start after ``warmup_days`` (the detectors' baselines need a week of history).
    Deterministic for a given seed.
    """
    rng = np.random.default_rng(seed)
    minutes = int(weeks * WEEK / MINUTE)
    rps = _traffic(rng, minutes, start)
    plan = _schedule(rng, minutes, warmup_days)

    ones = np.ones(minutes)
    mix_rng = np.random.default_rng([seed, 1])  # its own stream: the schedule does not depend on it
    prompt = PROMPT_TOKENS_MEAN * _wander(mix_rng, minutes)
    output = OUTPUT_TOKENS_MEAN * _wander(mix_rng, minutes)
    e_gpu, e_host, kv_factor = ones.copy(), ones.copy(), ones.copy()
    versions = ["v1"] * minutes
    version_no = 1
    gaps: list[tuple[int, int, bool]] = []

    def deploy(at: int) -> None:
        nonlocal version_no
        version_no += 1
        for i in range(at, minutes):
            versions[i] = f"v{version_no}"

    for kind, a, b, factor in plan:
        if kind == "step":
            deploy(a)
            e_gpu[a:b] = _e_for_factor(factor, host=False)
            deploy(b)  # the rollback / fix is another deploy
        elif kind == "drift":
            ramp_end = a + int((b - a) * 0.8)
            e_end = _e_for_factor(factor, host=False)
            e_gpu[a:ramp_end] = np.linspace(1.0, e_end, ramp_end - a)
            e_gpu[ramp_end:b] = e_end
        elif kind == "peak_collapse":
            deploy(a)
            kv_factor[a:b] = 0.18  # why: caps the batch at ≈ 69, above the target 64, below the peak's ≈ 85
            deploy(b)
        elif kind == "util_drop":
            deploy(a)
            e_host[a:b] = _e_for_factor(factor, host=True)
            deploy(b)
        elif kind == "intermittent":
            e = _e_for_factor(factor, host=False)
            t = a
            while t < b:
                on = int(rng.integers(20, 61))
                e_gpu[t : min(b, t + on)] = e
                t += on + int(rng.integers(60, 240))
        elif kind == "burst":
            rps[a:b] *= rng.uniform(1.8, 2.5)
        elif kind == "mix_change":
            prompt[a:b] *= MIX_CHANGE_PROMPT
            output[a:b] *= MIX_CHANGE_OUTPUT
        elif kind == "scrape_gap":
            gaps.append((a, b, bool(rng.integers(0, 2))))
        elif kind == "benign_deploy":
            deploy(a)

    noise = rng.normal(0.0, 1.0, (5, minutes))
    actual = _simulate(_Drivers(rps, prompt, output, e_gpu, e_host, kv_factor, versions), noise)
    healthy = _simulate(_Drivers(rps, prompt, output, ones, ones, ones, versions), noise)
    # Per-minute token jitter (Poisson-like) on top of the fluid model.
    jitter = np.exp(rng.normal(0.0, 0.01, minutes))
    price = GPU_PRICE_USD_PER_HOUR / HOUR
    cost_a = actual.replicas * MINUTE * price
    cost_h = healthy.replicas * MINUTE * price
    gen_a = actual.generation_tokens * jitter
    gen_h = healthy.generation_tokens * jitter
    # Excess: what the served tokens would have cost at the healthy cost per token.
    excess = cost_a - gen_a * np.divide(cost_h, gen_h, out=np.zeros(minutes), where=gen_h > 0)

    incidents: list[Incident] = []
    for kind, a, b, factor in plan:
        regression = kind in REGRESSION_KINDS
        visible = a
        if regression:
            ratio = (cost_a[a:b] / np.maximum(gen_a[a:b], 1.0)) / (cost_h[a:b] / np.maximum(gen_h[a:b], 1.0))
            hits = np.nonzero(ratio >= 1.1)[0]
            visible = a + int(hits[0]) if len(hits) else a
        incidents.append(
            Incident(
                kind=kind,
                start=start + a * MINUTE,
                end=start + b * MINUTE,
                factor=factor,
                regression=regression,
                visible=start + visible * MINUTE,
                excess_usd=float(np.clip(excess[a:b], 0.0, None).sum()) if regression else 0.0,
            )
        )

    windows = _windows(node, engine, model, start, minutes, versions, actual, gen_a, jitter, gaps)
    return SimulatedHistory(
        node=node,
        engine=engine,
        model=model,
        start=start,
        minutes=minutes,
        windows=tuple(windows),
        incidents=tuple(incidents),
        excess_usd_per_minute=excess,
    )


def _windows(
    node: str,
    engine: str,
    model: str,
    start: float,
    minutes: int,
    versions: list[str],
    ph: _Physics,
    gen: np.ndarray,
    jitter: np.ndarray,
    gaps: list[tuple[int, int, bool]],
) -> list[CostWindow]:
    """Turn the physics into priced windows, applying scrape gaps as the daemon would see them."""
    in_gap = np.zeros(minutes, dtype=int)  # 0 none, 1 zero-token window, 2 missing window
    for a, b, missing in gaps:
        in_gap[a:b] = 2 if missing else 1
    price = GPU_PRICE_USD_PER_HOUR / HOUR
    out: list[CostWindow] = []
    carry_p = carry_g = 0.0
    gap_open: int | None = None  # first minute of a span with no windows
    for t in range(minutes):
        prompt = float(ph.prompt_tokens[t] * jitter[t]) + carry_p
        generation = float(gen[t]) + carry_g
        if in_gap[t] == 2:  # the agent was down: the next window spans the gap
            carry_p, carry_g = prompt, generation
            gap_open = t if gap_open is None else gap_open
            continue
        engine_up = in_gap[t] == 0
        if not engine_up:  # scrape failed: no token deltas this minute; they arrive with the next scrape
            carry_p, carry_g = prompt, generation
            prompt = generation = 0.0
        else:
            carry_p = carry_g = 0.0
        w0 = t if gap_open is None else gap_open
        gap_open = None
        duration = (t + 1 - w0) * MINUTE
        gpu_seconds = float(ph.replicas[w0 : t + 1].sum()) * MINUTE
        energy = float(ph.power[w0 : t + 1].sum()) * MINUTE
        usage = UsageWindow(
            node=node,
            engine=engine,
            model=model,
            model_version=versions[t],
            start=start + w0 * MINUTE,
            end=start + w0 * MINUTE + duration,
            prompt_tokens=prompt,
            generation_tokens=generation,
            gpu_seconds=gpu_seconds,
            energy_joules=energy,
            gpu_util_ratio=float(ph.util[t]),
            mem_bw_ratio=float(ph.bw[t]),
            power_watts=float(ph.power[t]),
            requests_running=float(ph.running[t]) if engine_up else None,
            kv_cache_usage_ratio=float(ph.kv[t]) if engine_up else None,
            preemptions=float(ph.preemptions[t]) if engine_up else None,
            ttft_p99_seconds=float(ph.ttft_p99[t]) if engine_up else None,
            itl_p99_seconds=float(ph.itl_p99[t]) if engine_up else None,
        )
        cost = gpu_seconds * price
        out.append(
            CostWindow(
                usage=usage,
                gpu_time_usd=cost,
                energy_usd=0.0,
                usd_per_1m_output=cost / generation * 1e6 if generation > 0 else None,
                usd_per_1m_total=cost / (generation + prompt) * 1e6 if generation + prompt > 0 else None,
                idle_usd=cost if generation + prompt <= 0 else 0.0,
                roofline_ratio=float(ph.roofline[t]) if engine_up else None,
            )
        )
    return out
