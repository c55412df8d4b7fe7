"""Weeks of one simulated node, minute by minute, with labelled incidents: the benchmark's input.

Two traffic models produce the same thing, a :class:`NodeTrace` (per-minute engine state: tokens,
requests in flight, KV cache, preemptions, decode and prefill seconds, latency medians, GPU load),
which :mod:`infercost_sim.samples` renders into the samples the real adapters and NVML sampler produce,
for the real window join, store and detection pipeline:

- ``core``: the simulation core's physics (:class:`infercost_sim.engine.Deployment`: step time of a
  bandwidth-bound decode with the KV cache read every step, compute-bound prefill, continuous
  batching by Little's law, the KV cache capping the batch and preempting beyond it) on an
  8-replica data-parallel engine behind a fleet router, with a daily cosine and weekend dip;
- ``azure`` (:mod:`infercost_sim.azure`): a deliberately different generator: arrivals resampled from
  the real burstiness of the Azure LLM trace, its real request sizes, office-hours and lunch-dip
  shapes, and its own saturating throughput law.

Economics (both models): the node's eight GPUs are paid for whether busy or not (a per-node agent
pays for its node). A fleet router sends the node work in proportion to how fast it drains it
(least-loaded routing), and the fleet's autoscaler, with a warm-up delay, keeps the per-node
concurrency near a target during the day; below the fleet's minimum size (nights, weekends) the
node is under-used and its cost per token rises several times, as in production. A slower build
on this node therefore makes fewer tokens for the same dollars: its cost per token rises at load.

Incidents (the same schedule for both models; :data:`REGRESSION_KINDS` must alert,
:data:`BENIGN_KINDS` must not): see :func:`schedule`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from agent.hardware import GPUS, H100_SXM, GpuSpec
from infercost_sim.engine import LLAMA_8B, Deployment, ModelShape

MINUTE = 60.0  # seconds
HOUR = 3600.0  # seconds
DAY = 86400.0  # seconds
WEEK = 7 * DAY  # seconds
DEFAULT_START = 1704067200.0  # seconds since the epoch: Monday 2024-01-01 00:00 UTC

REGRESSION_KINDS = ("step", "drift", "kv_shrink", "host_bound", "intermittent", "price_up")
BENIGN_KINDS = (
    "flash_crowd",
    "long_prompts",
    "prefill_morning",
    "late_autoscaler",
    "scrape_gap",
    "benign_deploy",
    "price_down",
)


VISIBLE_FACTOR = 1.1  # a regression is visible from the first minute its cost per token is 10 % up
TARGET_FACTOR = 1.2  # the size of regression the detection targets are about (realised ≥ 1.2×)


@dataclass(frozen=True, slots=True)
class Incident:
    """One labelled interval of the simulated history."""

    kind: str  # one of REGRESSION_KINDS (must be detected) or BENIGN_KINDS (must not alert)
    start: float  # seconds since the epoch
    end: float  # seconds since the epoch
    factor: float  # nominal cost-per-token multiplier at load (1.0 for benign events)
    regression: bool  # True: a detector should alert; False: an alert here is a false alarm
    visible: float = 0.0  # seconds since the epoch, first minute the realised cost per token is ≥ 10 % up
    realised: float = 1.0  # realised cost-per-token ratio (actual ÷ healthy) over the incident's busy minutes
    excess_usd: float = 0.0  # dollars, extra cost over the healthy counterfactual during the incident
    # seconds since the epoch, first minute it is TARGET_FACTOR (20 %) up; None when no minute is
    at_target: float | None = None


@dataclass(frozen=True, slots=True)
class NodePhysics:
    """The per-node physical parameters, randomised per node (see :func:`random_physics`)."""

    gpu: GpuSpec
    model: ModelShape
    replicas: int  # data-parallel replicas, one GPU each
    max_num_seqs: int  # the engine's batch cap per replica
    gpu_memory_utilization: float  # fraction of HBM the engine pre-allocates (sets the KV size)
    bandwidth_efficiency: float  # fraction of peak bandwidth the decode kernels reach
    host_gap_seconds: float  # seconds of host work per step the GPU waits for
    usd_per_gpu_hour: float  # price
    target_concurrency: float  # sequences per replica the fleet autoscaler aims at
    autoscaler_delay_minutes: int  # minutes from demand to a new node serving
    prefix_cache_hit_ratio: float  # fraction of prompt tokens served from the prefix cache
    prompt_mean_tokens: float  # tokens per request
    output_mean_tokens: float  # tokens per request

    def deployment(self) -> Deployment:
        """One replica's physics (the simulation core's step-time law)."""
        return Deployment(
            self.model,
            self.gpu,
            tp=1,
            max_num_seqs=self.max_num_seqs,
            gpu_memory_utilization=self.gpu_memory_utilization,
            bandwidth_efficiency=self.bandwidth_efficiency,
        )


def random_physics(rng: np.random.Generator) -> NodePhysics:
    """Physics drawn per node: GPU, KV size, batch cap, efficiency, price, autoscaler, mix.

    The autoscaler's target concurrency is kept at or under half of what the KV cache holds at a
    2,000-token context (an operator sizes it so a healthy node does not preempt at its peak)."""
    gpu = [H100_SXM, GPUS["H200"], GPUS["A100-SXM4-80GB"]][int(rng.integers(0, 3))]
    physics = NodePhysics(
        gpu=gpu,
        model=LLAMA_8B,
        replicas=8,
        max_num_seqs=int(rng.choice([128, 256, 256, 512])),
        gpu_memory_utilization=float(rng.uniform(0.6, 0.92)),
        bandwidth_efficiency=float(rng.uniform(0.7, 0.9)),
        host_gap_seconds=float(rng.uniform(0.002, 0.006)),
        usd_per_gpu_hour=float(rng.uniform(1.5, 4.0)),
        target_concurrency=float(rng.uniform(32, 96)),
        autoscaler_delay_minutes=int(rng.integers(3, 12)),
        prefix_cache_hit_ratio=float(rng.uniform(0.0, 0.5)),
        prompt_mean_tokens=float(rng.uniform(600, 1600)),
        output_mean_tokens=float(rng.uniform(150, 400)),
    )
    fits = 0.5 * physics.deployment().kv_capacity_tokens / 2000.0
    return replace(
        physics, target_concurrency=min(physics.target_concurrency, fits, 0.5 * physics.max_num_seqs)
    )


@dataclass
class Drivers:
    """Per-minute inputs (arrays of length ``minutes``) of a traffic model's physics."""

    demand: np.ndarray  # fleet demand in units of "nodes at target concurrency" (≥ 0)
    burst: np.ndarray  # multiplier on this node's arrivals before the autoscaler catches up (1 = none)
    prompt_tokens: np.ndarray  # tokens per request
    output_tokens: np.ndarray  # tokens per request
    slowdown: np.ndarray  # kernel step-time multiplier (1 = healthy)
    host: np.ndarray  # host-gap multiplier (1 = healthy)
    kv_factor: np.ndarray  # fraction of the healthy KV cache the build leaves
    price: np.ndarray  # $ per GPU-hour
    base_price: np.ndarray  # $ per GPU-hour without the incidents' price changes
    autoscaler_delay: np.ndarray  # minutes, per minute (a late autoscaler raises it for a while)
    version: list[str]  # deployed model version
    engine_up: np.ndarray  # bool: the engine's /metrics answered
    agent_up: np.ndarray  # bool: the agent ran (False: no window at all for that minute)

    def copy_healthy(self) -> Drivers:
        """The counterfactual: the same traffic, every regression undone (prices as the book was)."""
        ones = np.ones_like(self.demand)
        return Drivers(
            self.demand,
            self.burst,
            self.prompt_tokens,
            self.output_tokens,
            ones,
            ones,
            ones,
            self.base_price,
            self.base_price,
            self.autoscaler_delay,
            self.version,
            self.engine_up,
            self.agent_up,
        )


@dataclass
class NodeTrace:
    """Per-minute engine state of one node (sums over its replicas; arrays of length ``minutes``)."""

    prompt_tokens: np.ndarray  # tokens processed in the minute
    generation_tokens: np.ndarray  # tokens generated in the minute
    running: np.ndarray  # sequences running (all replicas)
    waiting: np.ndarray  # requests queued
    kv_usage: np.ndarray  # 0–1, mean over replicas
    kv_capacity_tokens: np.ndarray  # tokens per replica's KV cache, as the engine reports it
    preemptions: np.ndarray  # count in the minute
    decode_seconds: np.ndarray  # request-seconds of decode in the minute
    prefill_seconds: np.ndarray  # request-seconds of prefill in the minute
    finished: np.ndarray  # requests finished in the minute
    ttft_median: np.ndarray  # seconds, median time to first token
    # seconds, a sequence's time per token as the steps run (the step that made a first token; the
    # rendered inter-token latency's mean is the decode seconds per interval, infercost_sim.samples)
    itl_median: np.ndarray
    util: np.ndarray  # 0–1, NVML .gpu per GPU
    dram_bw: np.ndarray  # 0–1, GPM DRAM bandwidth per GPU
    price: np.ndarray  # $ per GPU-hour in effect

    def record_served(
        self,
        t: int,
        served: float,
        prompt_len: float,
        output_len: float,
        running_per_replica: float,
        replicas: int,
        waiting: float,
        ctx: float,
        kv_capacity: float,
        kv_bound: bool,
        prefill_s: float,
    ) -> None:
        """Minute ``t``'s engine counters from what the node served (requests/s over all replicas):
        the bookkeeping both traffic models share, whatever law decided ``served``."""
        self.generation_tokens[t] = served * output_len * MINUTE
        self.prompt_tokens[t] = served * prompt_len * MINUTE
        self.running[t] = running_per_replica * replicas
        self.waiting[t] = waiting
        self.kv_usage[t] = min(1.0, running_per_replica * ctx / kv_capacity)
        self.kv_capacity_tokens[t] = kv_capacity
        self.preemptions[t] = served * MINUTE * PREEMPTIONS_PER_REQUEST if kv_bound else 0.0
        self.decode_seconds[t] = running_per_replica * replicas * MINUTE
        self.prefill_seconds[t] = served * MINUTE * prefill_s
        self.finished[t] = served * MINUTE


@dataclass(frozen=True, slots=True)
class SimulatedNode:
    """A node's simulated minutes, its ground truth and how to render it."""

    node: str
    generator: str  # "core" | "azure"
    physics: NodePhysics
    start: float  # seconds since the epoch
    minutes: int
    tick_seconds: float  # the agent's tick (60; 300 for history at 5-minute steps)
    drivers: Drivers = field(repr=False)
    trace: NodeTrace = field(repr=False)
    incidents: tuple[Incident, ...]
    excess_usd_per_minute: np.ndarray = field(repr=False)  # dollars, actual − healthy, per minute

    @property
    def regressions(self) -> tuple[Incident, ...]:
        """The incidents a detector must catch."""
        return tuple(i for i in self.incidents if i.regression)


# ---------------------------------------------------------------------------------------------
# Incident schedule (shared by both traffic models)
# ---------------------------------------------------------------------------------------------

Plan = list[tuple[str, int, int, float]]  # (kind, start minute, end minute, factor)


def _weekday_minute(rng: np.random.Generator, day_lo: int, day_hi: int, h_lo: float, h_hi: float) -> int:
    while True:
        day = int(rng.integers(day_lo, day_hi))
        if day % 7 < 5:
            return day * 1440 + int(rng.uniform(h_lo, h_hi) * 60)


def schedule(rng: np.random.Generator, minutes: int, warmup_days: int, rotation: int = 0) -> Plan:
    """Non-overlapping incidents after the warm-up: one set per simulated week.

    Regressions: ``step`` (a deploy with slower kernels, 1.1–2×, 4–8 h, rolled back), ``drift``
    (the slowdown ramping over 1–4 days), ``kv_shrink`` (a deploy that leaves less memory to the
    KV cache: harmless off-peak, preemptions and lost throughput at the peak), ``host_bound`` (the
    scheduler waits on the host: utilisation falls at constant traffic), ``intermittent`` (the
    slowdown on and off in 20–60 minute episodes), ``price_up`` (the price book's new
    effective-dated price: cost up, efficiency unchanged).
    Benign: ``flash_crowd`` (2–3× arrivals for 15–40 minutes before the fleet scales: the KV cache
    fills), ``long_prompts`` (a shift to long-prompt, short-output traffic for a day),
    ``prefill_morning`` (prompts ×2.5 from 07:00 to 10:00), ``late_autoscaler`` (warm-up ×4 for a
    day), ``scrape_gap`` (the engine or the agent down 3–30 minutes), ``benign_deploy`` (a new
    version that is no slower), ``price_down``.

    A week's set does not fit in one week (the day-long cases, each at its hour of a weekday, with
    6 hours between incidents): the set is three groups placed in turn, and ``rotation`` says which
    group goes first. The benchmark gives the three nodes of a seed three rotations, so that a
    2-week run (one graded week) has every case on one of its nodes: with one fixed order the
    first ones (drifts, steps, long prompts) take the week, and a 2-week run would hardly ever
    have a price-book change, an intermittent slowdown or a flash crowd.
    """
    days = minutes // 1440
    factors = [1.1, 1.2, 1.3, 1.5, 2.0]
    plan: Plan = []
    busy: list[tuple[int, int]] = []

    def free(a: int, b: int) -> bool:
        return all(b + 360 <= s or a >= e + 360 for s, e in busy) and b < minutes

    def place(kind: str, dur: tuple[int, int], factor: float, hours: tuple[float, float] | None) -> None:
        if minutes - dur[1] - 1 <= warmup_days * 1440:
            return
        for _ in range(500):
            if hours is not None:
                a = _weekday_minute(rng, warmup_days, days, *hours)
            else:
                a = int(rng.integers(warmup_days * 1440, minutes - dur[1] - 1))
            b = a + int(rng.integers(dur[0], dur[1] + 1))
            if free(a, b):
                plan.append((kind, a, b, factor))
                busy.append((a, b))
                return

    def factor(choices: Sequence[float]) -> float:
        return float(rng.choice(choices))

    kv_factor = round(1.0 / (1.0 - PREEMPT_THRASH), 2)
    midnight = (0.0, 0.001)  # a price book is dated: its changes take effect at midnight
    weeks = math.ceil(max(0, days - warmup_days) / 7)
    for _ in range(weeks):
        groups: list[list[tuple[str, tuple[int, int], float, tuple[float, float] | None]]] = [
            [
                ("drift", (1440, 4 * 1440), factor([1.3, 1.5, 2.0]), None),
                ("step", (240, 480), factor(factors), (9, 16)),
                ("flash_crowd", (15, 40), 1.0, (10, 17)),
                ("benign_deploy", (60, 60), 1.0, (9, 17)),
                ("scrape_gap", (3, 30), 1.0, None),
            ],
            [
                ("kv_shrink", (720, 1440), kv_factor, (6, 9)),
                ("host_bound", (180, 360), factor(factors[1:]), (9, 16)),
                ("price_up", (1440, 1440), factor([1.25, 1.5]), midnight),  # a day's surcharge
                ("prefill_morning", (180, 180), 1.0, (7, 7.01)),
                ("price_down", (1440, 1440), 1.0, midnight),
                ("flash_crowd", (15, 40), 1.0, (10, 17)),
                ("scrape_gap", (3, 30), 1.0, None),
            ],
            [
                ("long_prompts", (1440, 1440), 1.0, (9, 12)),
                ("late_autoscaler", (1440, 1440), 1.0, (0, 6)),
                ("intermittent", (720, 1440), factor([1.3, 1.5, 2.0]), (8, 10)),
                ("step", (240, 480), factor(factors), (9, 16)),
                ("flash_crowd", (15, 40), 1.0, (10, 17)),
                ("scrape_gap", (3, 30), 1.0, None),
            ],
        ]
        for g in range(len(groups)):
            for item in groups[(rotation + g) % len(groups)]:
                place(*item)
    plan.sort(key=lambda p: p[1])
    return plan


def apply_plan(plan: Plan, drv: Drivers, physics: NodePhysics, rng: np.random.Generator) -> None:
    """Write the incidents into the drivers (versions change at deploys and their rollbacks)."""
    minutes = len(drv.demand)
    n_version = [1]

    def deploy(at: int) -> None:
        n_version[0] += 1
        for i in range(at, minutes):
            drv.version[i] = f"v{n_version[0]}"

    for kind, a, b, factor in plan:
        if kind == "step":
            deploy(a)
            drv.slowdown[a:b] = factor
            deploy(b)
        elif kind == "drift":
            ramp = a + int((b - a) * 0.8)
            drv.slowdown[a:ramp] = np.linspace(1.0, factor, ramp - a)
            drv.slowdown[ramp:b] = factor
        elif kind == "kv_shrink":
            deploy(a)
            # the build leaves room for 80 % of the peak's sequences: harmless until the peak
            ctx = physics.prompt_mean_tokens + physics.output_mean_tokens / 2.0
            need = physics.target_concurrency * ctx / physics.deployment().kv_capacity_tokens
            drv.kv_factor[a:b] = min(0.5, 0.8 * need)
            deploy(b)
        elif kind == "host_bound":
            deploy(a)
            drv.host[a:b] = factor
            deploy(b)
        elif kind == "intermittent":
            t = a
            while t < b:
                on = int(rng.integers(20, 61))
                drv.slowdown[t : min(b, t + on)] = factor
                t += on + int(rng.integers(60, 240))
        elif kind == "price_up":  # a day's surcharge (spot price spike, a mis-set contract)
            drv.price[a:b] *= factor
        elif kind == "price_down":  # the book's new, lower price from then on (part of the healthy world)
            drv.price[a:] *= 0.8
            drv.base_price[a:] *= 0.8
        elif kind == "flash_crowd":
            drv.burst[a:b] *= rng.uniform(2.0, 3.0)
        elif kind == "long_prompts":
            drv.prompt_tokens[a:b] *= 3.0
            drv.output_tokens[a:b] *= 0.5
        elif kind == "prefill_morning":
            drv.prompt_tokens[a:b] *= 2.5
        elif kind == "late_autoscaler":
            drv.autoscaler_delay[a:b] *= 4
        elif kind == "scrape_gap":
            if rng.integers(0, 2):
                drv.engine_up[a:b] = False
            else:
                drv.agent_up[a:b] = False
        elif kind == "benign_deploy":
            deploy(a)


def wander(rng: np.random.Generator, minutes: int, sigma: float, corr_minutes: float) -> np.ndarray:
    """A multiplier around 1 wandering slowly (AR(1) in log space with sd ``sigma``)."""
    phi = math.exp(-1.0 / corr_minutes)
    eps = rng.normal(0.0, sigma * math.sqrt(1.0 - phi * phi), minutes)
    x = np.empty(minutes)
    x[0] = rng.normal(0.0, sigma)
    for i in range(1, minutes):
        x[i] = phi * x[i - 1] + eps[i]
    return np.exp(x)


def fleet_share(demand: np.ndarray, delay: np.ndarray, min_nodes: float) -> np.ndarray:
    """This node's share of the fleet's demand, in "nodes at target" (1 = at its target concurrency).

    The fleet autoscaler sizes the fleet to the demand (never under ``min_nodes``) but a new node
    serves only ``delay`` minutes after the demand asked for it; scale-down is immediate (a node
    drains). Until the fleet catches up, every node carries more than its target.
    """
    n = len(demand)
    nodes = np.empty(n)
    current = max(min_nodes, float(demand[0]))
    pending: list[tuple[int, float]] = []  # (minute ready, target size)
    for t in range(n):
        want = max(min_nodes, math.ceil(float(demand[t])))
        while pending and pending[0][0] <= t:
            current = max(current, pending.pop(0)[1])
        if want > current and not any(p[1] >= want for p in pending):
            pending.append((t + int(delay[t]), want))
        elif want < current:
            current = float(want)
            pending = [p for p in pending if p[1] > current]
        nodes[t] = current
    return demand / nodes


# ---------------------------------------------------------------------------------------------
# Realised change and excess dollars
# ---------------------------------------------------------------------------------------------


def cost_per_minute(trace: NodeTrace, physics: NodePhysics) -> np.ndarray:
    """Dollars per minute of the node (all GPUs, busy or not)."""
    return trace.price * physics.replicas / 60.0


def label_incidents(
    plan: Plan, start: float, actual: NodeTrace, healthy: NodeTrace, physics: NodePhysics
) -> tuple[tuple[Incident, ...], np.ndarray]:
    """Incidents with their realised cost-per-token change, first visible minute and excess dollars."""
    cost_a = cost_per_minute(actual, physics)
    cost_h = cost_per_minute(healthy, physics)
    gen_a = np.maximum(actual.generation_tokens, 1.0)
    gen_h = np.maximum(healthy.generation_tokens, 1.0)
    excess = cost_a - actual.generation_tokens * cost_h / gen_h
    ratio = (cost_a / gen_a) / (cost_h / gen_h)
    out: list[Incident] = []
    for kind, a, b, factor in plan:
        regression = kind in REGRESSION_KINDS
        visible, realised, usd, at_target = a, 1.0, 0.0, None
        if regression:
            seg = ratio[a:b]
            busy = healthy.generation_tokens[a:b] >= np.quantile(healthy.generation_tokens, 0.5)
            # realised: the cost per token ratio over the incident's busier-than-median minutes
            sel = busy if busy.any() else np.ones_like(busy)
            realised = float(cost_a[a:b][sel].sum() / gen_a[a:b][sel].sum()) / float(
                cost_h[a:b][sel].sum() / gen_h[a:b][sel].sum()
            )
            hits = np.nonzero(seg >= VISIBLE_FACTOR)[0]
            visible = a + int(hits[0]) if len(hits) else a
            big = np.nonzero(seg >= TARGET_FACTOR)[0]
            at_target = start + (a + int(big[0])) * MINUTE if len(big) else None
            usd = float(np.clip(excess[a:b], 0.0, None).sum())
        out.append(
            Incident(
                kind, start + a * MINUTE, start + b * MINUTE, factor, regression,
                start + visible * MINUTE, realised, usd, at_target,
            )
        )  # fmt: skip
    return tuple(out), excess


Generator = Callable[[Drivers, NodePhysics, np.random.Generator], NodeTrace]


# ---------------------------------------------------------------------------------------------
# The core traffic model and its physics
# ---------------------------------------------------------------------------------------------

FLEET_MIN_NODES = 4.0  # the fleet's floor: why it makes nights expensive per token on this node
PREEMPT_THRASH = 0.35  # fraction of decode work lost to recomputation when the KV cache is the limit
PREEMPTIONS_PER_REQUEST = 0.3  # preemptions per finished request while KV-bound
UNROUTED_QUEUE = 0.2  # share of the excess a saturated node keeps queued (the router sends the rest away)


def core_traffic(
    rng: np.random.Generator, minutes: int, start: float, physics: NodePhysics
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fleet demand (in nodes at target), prompt and output lengths: a daily cosine with its trough
    at 04:00 UTC, weekends at 45 %, day-to-day level and AR(1) noise, lengths wandering ±8 %."""
    t = start + MINUTE * np.arange(minutes)
    hour = ((t - DEFAULT_START) % DAY) / HOUR
    weekday = (((t - DEFAULT_START) // DAY) % 7).astype(int)
    daily = 0.12 + 0.88 * ((1 - np.cos(2 * np.pi * (hour - 4.0) / 24.0)) / 2.0) ** 1.6
    weekly = np.where(weekday >= 5, 0.45, 1.0)
    level = np.repeat(rng.normal(1.0, 0.05, minutes // 1440 + 2), 1440)[:minutes]
    noise = wander(rng, minutes, 0.05, 20.0)
    demand = 12.0 * daily * weekly * level * noise
    prompt = physics.prompt_mean_tokens * wander(rng, minutes, 0.08, 180.0)
    output = physics.output_mean_tokens * wander(rng, minutes, 0.08, 180.0)
    return demand, prompt, output


def _zeros_trace(n: int) -> NodeTrace:
    return NodeTrace(*(np.zeros(n) for _ in range(15)))


def core_law(drv: Drivers, physics: NodePhysics, rng: np.random.Generator) -> NodeTrace:
    """The simulation core's physics, minute by minute (see the module docstring)."""
    n = len(drv.demand)
    out = _zeros_trace(n)
    dep = physics.deployment()
    replicas = physics.replicas
    b_target = physics.target_concurrency
    share = fleet_share(drv.demand * drv.burst, drv.autoscaler_delay, FLEET_MIN_NODES)
    healthy_cap = dep.kv_capacity_tokens
    bw = physics.gpu.hbm_bandwidth_bytes_per_s
    for t in range(n):
        p_len, o_len = float(drv.prompt_tokens[t]), float(drv.output_tokens[t])
        ctx = p_len + o_len / 2.0
        tf = 1.0 / float(drv.slowdown[t])
        host = physics.host_gap_seconds * float(drv.host[t])
        host0 = physics.host_gap_seconds

        def step(b: float, tf: float = tf, host: float = host, ctx: float = ctx) -> float:
            return dep.step_seconds(max(1.0, b), ctx, tf) + host

        uncached = p_len * (1.0 - physics.prefix_cache_hit_ratio)
        prefill_s = dep.prefill_seconds(uncached, tf)  # GPU seconds per request
        # The router sends work in proportion to how fast the node drains it: at share 1 a healthy
        # replica runs b_target sequences, λ_r·(O·step + b·prefill) = b (Little's law with the
        # prefill share); a slower build gets proportionally less.
        healthy_work = o_len * (dep.step_seconds(b_target, ctx) + host0) + b_target * dep.prefill_seconds(
            uncached
        )
        actual_work = o_len * step(b_target) + b_target * prefill_s
        lam = share[t] * replicas * b_target / healthy_work * (healthy_work / actual_work)
        lam_r = lam / replicas  # requests/s per replica
        f = min(0.9, lam_r * prefill_s)  # share of GPU time prefilling
        cap = healthy_cap * float(drv.kv_factor[t])
        b_max = min(float(physics.max_num_seqs), cap / ctx)
        # continuous batching in steady state: the core's Little's-law solver
        b = dep.running_for(lam_r, o_len, ctx, f, tf, host)
        kv_bound = False
        if b > b_max or lam_r * prefill_s >= 0.9:  # the batch or the prefill work is the limit
            kv_bound = b > b_max and b_max < physics.max_num_seqs
            b = min(b, b_max)
            # saturated: only admitted requests are prefilled, so the prefill share follows them:
            # served = x·(1 − f) and f = served·prefill  →  f = x·p / (1 + x·p)
            x = b / step(b) / o_len * (1.0 - (PREEMPT_THRASH if kv_bound else 0.0))
            f = x * prefill_s / (1.0 + x * prefill_s)
            served_r = x * (1.0 - f)
            waiting = (
                max(0.0, lam_r - served_r)
                * replicas
                * MINUTE
                * (1.0 if drv.burst[t] > 1.0 else UNROUTED_QUEUE)
            )
        else:
            served_r = lam_r
            waiting = 0.0
        st = step(b) / (1.0 - f)  # seconds per token of a sequence (chunked prefill stretches steps)
        served = served_r * replicas
        out.record_served(t, served, p_len, o_len, b, replicas, waiting, ctx, cap, kv_bound, prefill_s)
        wait_s = waiting / max(served, 1e-3)
        out.ttft_median[t] = wait_s + 1.5 * prefill_s + st
        out.itl_median[t] = st
        occupancy = 1.0 - math.exp(-b)
        gpu_part = (step(b) - host) / step(b)
        out.util[t] = min(0.99, f + (1.0 - f) * occupancy * gpu_part)
        bytes_per_s = dep.step_bytes(max(1.0, b), ctx) / step(b)
        out.dram_bw[t] = min(0.95, (1.0 - f) * occupancy * bytes_per_s / bw + 0.3 * f)
        out.price[t] = drv.price[t]
    return out


TrafficFn = Callable[
    [np.random.Generator, int, float, NodePhysics], tuple[np.ndarray, np.ndarray, np.ndarray]
]
GENERATORS: dict[str, tuple[TrafficFn, Generator]] = {"core": (core_traffic, core_law)}
# Each traffic model's random stream, fixed: a node's draw must not depend on which models happen to
# be imported (an index in the sorted registry would change as soon as another model registered).
# The values keep the draws the benchmark's cases were made with (both models registered).
GENERATOR_STREAMS: dict[str, int] = {"azure": 0, "core": 1}


def simulate_node(
    generator: str = "core",
    seed: int = 7,
    weeks: float = 4,
    node: str = "sim-node-0",
    start: float = DEFAULT_START,
    warmup_days: int = 7,
    tick_seconds: float = MINUTE,
    rotation: int = 0,
) -> SimulatedNode:
    """Simulate ``weeks`` of one node with a generator's traffic and physics and labelled incidents
    (after ``warmup_days``: the detectors' baselines need history; ``rotation``: which of the
    incident groups goes first, see :func:`schedule`). Deterministic per seed."""
    if generator not in GENERATORS:
        from infercost_sim import azure  # registers itself

        del azure
    traffic, law = GENERATORS[generator]
    rng = np.random.default_rng([seed, GENERATOR_STREAMS[generator]])
    physics = random_physics(rng)
    minutes = int(weeks * WEEK / MINUTE)
    demand, prompt, output = traffic(rng, minutes, start, physics)
    ones = np.ones(minutes)
    price = ones * physics.usd_per_gpu_hour
    drv = Drivers(
        demand=demand, burst=ones.copy(), prompt_tokens=prompt, output_tokens=output, slowdown=ones.copy(),
        host=ones.copy(), kv_factor=ones.copy(), price=price.copy(), base_price=price.copy(),
        autoscaler_delay=ones * physics.autoscaler_delay_minutes, version=["v1"] * minutes,
        engine_up=np.ones(minutes, dtype=bool), agent_up=np.ones(minutes, dtype=bool),
    )  # fmt: skip
    plan = schedule(rng, minutes, warmup_days, rotation)
    apply_plan(plan, drv, physics, rng)
    actual = law(drv, physics, np.random.default_rng([seed, 1]))
    healthy = law(drv.copy_healthy(), physics, np.random.default_rng([seed, 1]))
    incidents, excess = label_incidents(plan, start, actual, healthy, physics)
    return SimulatedNode(
        node, generator, physics, start, minutes, tick_seconds, drv, actual, incidents, excess
    )
