"""Simulated engine state → the samples the real sources produce (offline, no HTTP, no sleeping).

:func:`ticks` turns a :class:`~infercost_sim.workload.SimulatedNode` into, per agent tick, what the
vLLM adapter reads from a page (:class:`~agent.samples.ModelSignals`: cumulative counters split over
the engine's data-parallel ranks as vLLM's ``engine`` label splits them, cumulative TTFT,
inter-token and end-to-end latency histograms with vLLM's buckets, the KV cache's size as
``cache_config_info`` gives it) and what the NVML sampler reads (:class:`~agent.samples.NvmlRound`:
utilisation, DRAM bandwidth, power and the energy counter per GPU, with the fake NVML library's
power model). The benchmark feeds them to the real :class:`~agent.cost.window.WindowJoiner`, so the
cost, the efficiency and every other signal the detectors see are computed by the daemon's own code.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np

from agent.config import EngineConfig
from agent.cost.window import WindowJoiner
from agent.samples import CostWindow, EngineScrape, GpuLoad, GpuSample, Histogram, ModelSignals, NvmlRound
from agent.sources.nvml.fake import PROFILES, DeviceProfile, model_power_watts
from agent.sources.prices import PriceBook, parse_price_book
from infercost_sim import population
from infercost_sim.engine import (
    ITL_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TTFT_BUCKETS,
    lognormal_bin_probabilities,
)
from infercost_sim.workload import MINUTE, SimulatedNode

ENGINE = "vllm-0"  # the simulated engine's name on every node
TTFT_SIGMA = 0.7  # log-normal shape of TTFT within a minute: prompt lengths vary a lot
ITL_SIGMA = 0.2  # log-normal shape of inter-token latency: step times vary ±20 %
E2E_SIGMA = 0.8  # log-normal shape of request latency within a minute: output lengths vary a lot


@dataclass(frozen=True, slots=True)
class Tick:
    """What the agent would have read at one tick."""

    t: float  # seconds since the epoch
    minute: int  # index of the simulated minute the tick closes
    nvml: NvmlRound
    scrape: EngineScrape
    version: str


def engine_config(sim: SimulatedNode) -> EngineConfig:
    """The agent's config of the simulated engine: all the node's GPUs, the model's shape."""
    p = sim.physics
    dep = p.deployment()
    return EngineConfig(
        name=ENGINE, kind="vllm", url="http://sim.invalid/metrics", gpus=tuple(range(p.replicas)),
        weights_bytes=p.model.weight_bytes, kv_bytes_per_token=p.model.kv_bytes_per_token,
        kv_capacity_tokens=dep.kv_capacity_tokens, model_version="v1",
        flops_per_token=p.model.flops_per_token,
    )  # fmt: skip


def _profile(gpu_name: str) -> DeviceProfile:
    for prof in PROFILES.values():
        if prof.name == gpu_name:
            return prof
    return PROFILES["H100-SXM"]


def _cumulative_hist(
    bounds: tuple[float, ...], n: np.ndarray, median: np.ndarray, sigma: float
) -> np.ndarray:
    """Cumulative per-bucket counts (minutes × buckets+1) of ``n`` observations a minute."""
    probs = lognormal_bin_probabilities(np.asarray(bounds), np.maximum(median, 1e-6), sigma)
    return np.cumsum(probs * n[:, None], axis=0)


# seconds; the drawn population's step (a scrape's instant is read at a step's end, so a step divides
# every scrape interval read: 15 s, 60 s, 300 s). Why 15 s and not finer: it is the occupancy
# integral's step (tokens between two scrapes), and requests live seconds to minutes, so a finer step
# changes the counters little and costs the benchmark CPU in proportion.
FINE_STEP_S = 15.0


@dataclass(frozen=True, slots=True)
class _Readings:
    """Per fine step (rows): the drawn population's instants and cumulative counters."""

    running: np.ndarray  # requests running at the step's end, per rank (int)
    waiting: np.ndarray  # requests waiting at the step's end, summed over ranks (int)
    kv_usage: np.ndarray  # 0–1, KV cache in use at the step's end, mean over ranks
    generation: np.ndarray  # tokens, cumulative, per rank
    prompt: np.ndarray  # tokens, cumulative
    decode_seconds: np.ndarray  # request-seconds, cumulative, added as requests finish
    prefill_seconds: np.ndarray  # request-seconds, cumulative, added as requests finish
    finished: np.ndarray  # requests, cumulative
    preemptions: np.ndarray  # cumulative
    e2e_buckets: np.ndarray  # requests per latency bucket (+Inf last), cumulative, as requests finish
    e2e_sum: np.ndarray  # seconds of request latency, cumulative, as requests finish


def _per_request(total: np.ndarray, requests: np.ndarray) -> np.ndarray:
    """``total / requests`` where requests were served, else 0 (no request: no lifetime, no size)."""
    return np.divide(total, requests, out=np.zeros_like(total, dtype=np.float64), where=requests > 0)


def draw_readings(sim: SimulatedNode, step: float = FINE_STEP_S) -> _Readings:
    """The node's requests drawn per rank (:mod:`infercost_sim.population`) from its minutes: the
    served rate and the lifetime (running ÷ served, Little's law) of each minute, the minute's
    request sizes; counters and instants read off that one population."""
    tr, p = sim.trace, sim.physics
    ranks = p.replicas
    per_minute = round(MINUTE / step)
    rng = np.random.default_rng([int(p.usd_per_gpu_hour * 1e6), 7])
    m = np.repeat(np.arange(sim.minutes), per_minute)
    served = tr.finished / MINUTE  # requests/s over the node
    life = _per_request(tr.decode_seconds, tr.finished)  # seconds a request decodes
    wait = _per_request(tr.waiting * MINUTE, tr.finished)  # seconds a request waits
    rate = np.repeat((served / ranks)[m, None], 2 * ranks, axis=1)  # requests/s per rank
    lives = np.hstack((np.repeat(life[m, None], ranks, axis=1), np.repeat(wait[m, None], ranks, axis=1)))
    both = population.draw(rate, lives, step, rng)  # ranks running, then ranks waiting
    run = population.Population(
        step, *(getattr(both, f)[:, :ranks] for f in ("present", "arrived", "finished", "lifetime_seconds",
                                                        "occupancy_seconds"))
    )  # fmt: skip
    queue_present = both.present[:, ranks:]
    tokens_per_seq_s = _per_request(tr.generation_tokens, tr.decode_seconds)[m]  # tokens per request-second
    kv_per_seq = _per_request(tr.kv_usage * ranks, tr.running)[m]  # KV share of one rank per sequence
    prompt_len = _per_request(tr.prompt_tokens, tr.finished)[m]  # tokens per request
    # vLLM's phase times (V1: prefill = scheduled → first token, decode = first → last token): the
    # step that made the first token (the minute's step as run) is prefill time, not decode time
    first_step = tr.itl_median[m]  # seconds
    prefill_s = _per_request(tr.prefill_seconds, tr.finished)[m] + first_step  # seconds per request
    preempt = rng.poisson(np.maximum(tr.preemptions, 0.0)[m] / per_minute)
    # vLLM observes a request's end-to-end latency in the same call as its phase times, so the e2e
    # histogram's count moves with the phase-time counters (the efficiency reads the finished
    # requests those hold from it): queue wait, prefill and the decode lifetime, log-normal per minute
    done = run.finished.sum(axis=1)
    latency = wait[m] + prefill_s + life[m]  # seconds
    e2e_probs = lognormal_bin_probabilities(
        np.asarray(REQUEST_LATENCY_BUCKETS),
        np.maximum(latency, 1e-6) * np.exp(-(E2E_SIGMA**2) / 2),
        E2E_SIGMA,
    )
    return _Readings(
        running=run.present,
        waiting=queue_present.sum(axis=1),
        kv_usage=np.minimum(1.0, run.present * kv_per_seq[:, None]).mean(axis=1),
        generation=np.cumsum(np.round(run.occupancy_seconds * tokens_per_seq_s[:, None]), axis=0),
        prompt=np.cumsum(run.arrived.sum(axis=1) * np.round(prompt_len)),
        decode_seconds=np.cumsum(
            np.maximum(0.0, run.lifetime_seconds.sum(axis=1) - run.finished.sum(axis=1) * first_step)
        ),
        prefill_seconds=np.cumsum(run.finished.sum(axis=1) * prefill_s),
        finished=np.cumsum(run.finished.sum(axis=1)),
        preemptions=np.cumsum(preempt),
        e2e_buckets=np.cumsum(e2e_probs * done[:, None], axis=0),
        e2e_sum=np.cumsum(done * latency),
    )


def ticks(sim: SimulatedNode) -> Iterator[Tick]:
    """The agent's readings, one per scrape of ``sim.tick_seconds`` (ticks while the agent was down
    are skipped): gauges the drawn population's instant at the scrape, counters as far as it went
    (:func:`draw_readings`); histograms as of the last whole minute (they move as requests finish).

    Every figure read is turned into Python floats once, up front (``tolist``), so a tick only
    builds its sample objects: rendering stays a small part of a node-run (the detection benchmark
    prints its CPU per phase)."""
    tr = sim.trace
    drv = sim.drivers
    p = sim.physics
    model = p.model.name
    ranks = p.replicas
    period = float(sim.tick_seconds)
    step = FINE_STEP_S if period % FINE_STEP_S == 0 else period  # e.g. 5 s scrapes: their own step
    rd = draw_readings(sim, step)
    n_ticks = int(sim.minutes * MINUTE // period)
    at = (np.arange(1, n_ticks + 1) * round(period / step)) - 1  # the fine step each scrape closes
    minute_of = (((np.arange(1, n_ticks + 1) * period) - 1e-6) // MINUTE).astype(int).tolist()
    running = rd.running[at].sum(axis=1).tolist()
    waiting, kv_usage = rd.waiting[at].tolist(), rd.kv_usage[at].tolist()
    gen_ranks = rd.generation[at].tolist()
    prompt, decode_s, prefill_s = (
        rd.prompt[at].tolist(),
        rd.decode_seconds[at].tolist(),
        rd.prefill_seconds[at].tolist(),
    )
    finished, preempt = rd.finished[at].tolist(), rd.preemptions[at].tolist()
    e2e_buckets, e2e_sum = np.cumsum(rd.e2e_buckets[at], axis=1).tolist(), rd.e2e_sum[at].tolist()
    e2e_le = (*REQUEST_LATENCY_BUCKETS, float("inf"))
    hit = p.prefix_cache_hit_ratio
    ttft = _cumulative_hist(TTFT_BUCKETS, tr.finished, tr.ttft_median, TTFT_SIGMA)
    ttft_sum = np.cumsum(tr.finished * tr.ttft_median * np.exp(TTFT_SIGMA**2 / 2)).tolist()
    # a request's inter-token intervals add up to its decode time (first to last token), so a
    # minute's intervals have the mean its decode request-seconds give per interval: the step as
    # run where every running sequence gains a token per step, longer where the KV cache thrashes
    # (a preempted sequence's stall is one long interval). The law's per-token time is that mean;
    # the log-normal's median sits below it by exp(σ²/2)
    itl_n = np.maximum(tr.generation_tokens - tr.finished, 0.0)
    itl_mean = np.where(
        itl_n > 0,
        _per_request(np.maximum(tr.decode_seconds - tr.finished * tr.itl_median, 0.0), itl_n),
        tr.itl_median,
    )
    itl = _cumulative_hist(ITL_BUCKETS, itl_n, itl_mean * np.exp(-(ITL_SIGMA**2) / 2), ITL_SIGMA)
    itl_sum = np.cumsum(itl_n * itl_mean).tolist()
    # per minute: the buckets' cumulative counts (over the buckets) and the count
    ttft_buckets, ttft_count = np.cumsum(ttft, axis=1).tolist(), ttft.sum(axis=1).tolist()
    itl_buckets, itl_count = np.cumsum(itl, axis=1).tolist(), itl.sum(axis=1).tolist()
    zero_ttft, zero_itl = [0.0] * (len(TTFT_BUCKETS) + 1), [0.0] * (len(ITL_BUCKETS) + 1)
    ttft_le = (*TTFT_BUCKETS, float("inf"))
    itl_le = (*ITL_BUCKETS, float("inf"))
    util, dram_bw = tr.util.tolist(), tr.dram_bw.tolist()
    kv_capacity = tr.kv_capacity_tokens.tolist()
    agent_up, engine_up = drv.agent_up.tolist(), drv.engine_up.tolist()
    prof = _profile(p.gpu.name)
    uuids = [f"GPU-sim-{g}" for g in range(p.replicas)]
    rank_series = [f"vllm:generation_tokens_total,engine={r}" for r in range(ranks)]
    energy = 0.0  # joules per GPU (all the node's GPUs do the same)
    for k in range(n_ticks):
        m = minute_of[k]
        t = sim.start + (k + 1) * period
        whole = int(((k + 1) * period) // MINUTE) - 1  # the last whole minute the histograms include
        u, bw = util[m], dram_bw[m]
        watts = model_power_watts(prof, GpuLoad(u, bw, 0.0))
        energy += watts * period
        if not agent_up[m]:
            continue
        gpus = tuple(
            GpuSample(
                g, uuids[g], p.gpu.name, t, util_gpu_ratio=u, dram_bw_ratio=bw, power_watts=watts,
                energy_joules=energy,
            )
            for g in range(p.replicas)
        )  # fmt: skip
        if engine_up[m]:
            parts = gen_ranks[k]
            hists = (
                (ttft_buckets[whole], ttft_sum[whole], ttft_count[whole], itl_buckets[whole], itl_sum[whole],
                 itl_count[whole])
                if whole >= 0
                else (zero_ttft, 0.0, 0.0, zero_itl, 0.0, 0.0)
            )  # fmt: skip
            signals = ModelSignals(
                model=model,
                prompt_tokens_total=prompt[k],
                generation_tokens_total=sum(parts),
                requests_running=running[k],
                requests_waiting=waiting[k],
                kv_cache_usage_ratio=kv_usage[k],
                preemptions_total=preempt[k],
                requests_finished_total={"stop": finished[k]},
                ttft_seconds=Histogram(tuple(zip(ttft_le, hists[0], strict=True)), hists[1], hists[2]),
                itl_seconds=Histogram(tuple(zip(itl_le, hists[3], strict=True)), hists[4], hists[5]),
                e2e_seconds=Histogram(
                    tuple(zip(e2e_le, e2e_buckets[k], strict=True)), e2e_sum[k], finished[k]
                ),
                prefill_seconds_total=prefill_s[k],
                decode_seconds_total=decode_s[k],
                cached_prompt_tokens_total=float(round(prompt[k] * hit)),
                kv_capacity_tokens=kv_capacity[m],
                counter_parts={"generation_tokens_total": dict(zip(rank_series, parts, strict=True))},
            )
            scrape = EngineScrape(ENGINE, "vllm", t, True, 0.01, (signals,))
        else:
            scrape = EngineScrape(ENGINE, "vllm", t, False, 2.0, error="connection refused")
        yield Tick(t, m, NvmlRound(t, True, gpus), scrape, drv.version[m])


def price_book_of(sim: SimulatedNode) -> PriceBook:
    """The node's price book: one effective-dated entry per price change (they happen at midnight)."""
    entries: list[dict[str, Any]] = []
    prev: float | None = None
    for m in range(0, sim.minutes, 1440):
        v = round(float(sim.drivers.price[m]), 6)
        if v != prev:
            day = datetime.fromtimestamp(sim.start + m * MINUTE, UTC).date().isoformat()
            entries.append({"match": sim.physics.gpu.name, "usd_per_hour": v, "effective_from": day})
            prev = v
    return parse_price_book({"gpus": entries}, f"simulated book of {sim.node}")


def priced_windows(sim: SimulatedNode) -> list[CostWindow]:
    """Every priced window of the node, through the real window join (no store, no detectors)."""
    joiner = WindowJoiner(sim.node, [engine_config(sim).cost_spec()], price_book_of(sim).table())
    out: list[CostWindow] = []
    for tick in ticks(sim):
        joiner.add_round(tick.nvml)
        out.extend(joiner.close_tick(tick.t, {ENGINE: tick.scrape}, {ENGINE: tick.version}).windows)
    return out
