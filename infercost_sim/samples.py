"""Simulated engine state → the samples the real sources produce (offline, no HTTP, no sleeping).

:func:`ticks` turns a :class:`~infercost_sim.workload.SimulatedNode` into, per agent tick, what the
vLLM adapter reads from a page (:class:`~agent.samples.ModelSignals`: cumulative counters split
over the engine's data-parallel ranks as vLLM's ``engine`` label splits them, cumulative TTFT and
inter-token histograms with vLLM's buckets, the KV cache's size as ``cache_config_info`` gives it)
and what the NVML sampler reads (:class:`~agent.samples.NvmlRound`: utilisation, DRAM bandwidth,
power and the energy counter per GPU, with the fake NVML library's power model). The benchmark
feeds them to the real :class:`~agent.cost.window.WindowJoiner`, so the cost, the efficiency and
every other signal the detectors see are computed by the daemon's own code.
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
from infercost_sim.engine import ITL_BUCKETS, TTFT_BUCKETS, lognormal_bin_probabilities
from infercost_sim.workload import MINUTE, SimulatedNode

ENGINE = "vllm-0"  # the simulated engine's name on every node
TTFT_SIGMA = 0.7  # log-normal shape of TTFT within a minute: prompt lengths vary a lot
ITL_SIGMA = 0.2  # log-normal shape of inter-token latency: step times vary ±20 %


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


def ticks(sim: SimulatedNode) -> Iterator[Tick]:
    """The agent's readings, one per tick (ticks while the agent was down are skipped).

    Every per-minute figure is turned into Python floats once, up front (``tolist``), so a tick
    only builds its sample objects: rendering stays a small part of a node-run (the detection
    benchmark prints its CPU per phase)."""
    tr = sim.trace
    drv = sim.drivers
    p = sim.physics
    model = p.model.name
    ranks = p.replicas
    cum = {
        name: np.cumsum(getattr(tr, name)).tolist()
        for name in ("prompt_tokens", "generation_tokens", "preemptions", "decode_seconds", "prefill_seconds")
    }
    ttft = _cumulative_hist(TTFT_BUCKETS, tr.finished, tr.ttft_median, TTFT_SIGMA)
    ttft_sum = np.cumsum(tr.finished * tr.ttft_median * np.exp(TTFT_SIGMA**2 / 2)).tolist()
    itl_n = np.maximum(tr.generation_tokens - tr.finished, 0.0)
    itl = _cumulative_hist(ITL_BUCKETS, itl_n, tr.itl_median, ITL_SIGMA)
    itl_sum = np.cumsum(itl_n * tr.itl_median * np.exp(ITL_SIGMA**2 / 2)).tolist()
    # per minute: the buckets' cumulative counts (over the buckets) and the count
    ttft_buckets, ttft_count = np.cumsum(ttft, axis=1).tolist(), ttft.sum(axis=1).tolist()
    itl_buckets, itl_count = np.cumsum(itl, axis=1).tolist(), itl.sum(axis=1).tolist()
    ttft_le = (*TTFT_BUCKETS, float("inf"))
    itl_le = (*ITL_BUCKETS, float("inf"))
    util, dram_bw = tr.util.tolist(), tr.dram_bw.tolist()
    running, waiting, kv_usage = tr.running.tolist(), tr.waiting.tolist(), tr.kv_usage.tolist()
    kv_capacity = tr.kv_capacity_tokens.tolist()
    agent_up, engine_up = drv.agent_up.tolist(), drv.engine_up.tolist()
    prof = _profile(p.gpu.name)
    uuids = [f"GPU-sim-{g}" for g in range(p.replicas)]
    rank_series = [f"vllm:generation_tokens_total,engine={r}" for r in range(ranks)]
    energy = 0.0  # joules per GPU (all the node's GPUs do the same)
    per_tick = max(1, round(sim.tick_seconds / MINUTE))
    for m in range(per_tick - 1, sim.minutes, per_tick):
        t = sim.start + (m + 1) * MINUTE
        u, bw = util[m], dram_bw[m]
        watts = model_power_watts(prof, GpuLoad(u, bw, 0.0))
        energy += watts * MINUTE * per_tick
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
            gen = cum["generation_tokens"][m]
            signals = ModelSignals(
                model=model,
                prompt_tokens_total=cum["prompt_tokens"][m],
                generation_tokens_total=gen,
                requests_running=running[m],
                requests_waiting=waiting[m],
                kv_cache_usage_ratio=kv_usage[m],
                preemptions_total=cum["preemptions"][m],
                ttft_seconds=Histogram(
                    tuple(zip(ttft_le, ttft_buckets[m], strict=True)), ttft_sum[m], ttft_count[m]
                ),
                itl_seconds=Histogram(
                    tuple(zip(itl_le, itl_buckets[m], strict=True)), itl_sum[m], itl_count[m]
                ),
                prefill_seconds_total=cum["prefill_seconds"][m],
                decode_seconds_total=cum["decode_seconds"][m],
                kv_capacity_tokens=kv_capacity[m],
                counter_parts={"generation_tokens_total": {name: gen / ranks for name in rank_series}},
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
