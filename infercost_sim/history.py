"""A week (or any span) of simulated history for the demo node, priced by the real window join.

The demo's rules compare cost per token with a 7-day baseline, so the demo needs a week of
history when it starts. This replays the same engine physics as :class:`~infercost_sim.node.SimNode`
offline, minute by minute, turns each engine's state into the signals a vLLM scrape would give
and each GPU's load into an NVML reading, and prices them with :class:`WindowJoiner` — the same
code path as the live daemon, without HTTP.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from agent.cost.window import WindowJoiner
from agent.samples import CostWindow, EngineScrape, GpuLoad, GpuSample, Histogram, ModelSignals, NvmlRound
from agent.sources.nvml.fake import PROFILES, model_power_watts
from agent.sources.prices import PriceBook
from infercost_sim.engine import H100_SXM, KV_BLOCK_TOKENS, EngineState
from infercost_sim.node import DEFAULT_ENGINES, EngineSpec, build_engine, engine_config

MINUTE = 60.0
# The engines' finest step offline: a tenth of the steps of the live 1 s one. Why the figures barely
# move: the running set relaxes towards its target by an exact exponential step (infercost_sim.engine),
# so a coarser step stays stable, and a minute's window still spans six of them.
HISTORY_TICK_SECONDS = 10.0


def _hist(state: EngineState, name: str) -> Histogram | None:
    buckets = state.histograms.get(name)
    if not buckets:
        return None
    return Histogram(
        tuple((float(le), float(c)) for le, c in buckets), state.histogram_sums[name], float(buckets[-1][1])
    )


def signals_of(state: EngineState) -> ModelSignals:
    """What the vLLM adapter reads from this engine's page, without rendering the page."""
    return ModelSignals(
        model=state.model_name,
        prompt_tokens_total=float(state.prompt_tokens_total),
        generation_tokens_total=float(state.generation_tokens_total),
        requests_running=float(state.requests_running),
        requests_waiting=float(state.requests_waiting),
        kv_cache_usage_ratio=state.kv_cache_usage_ratio,
        preemptions_total=float(state.preemptions_total),
        requests_finished_total={k: float(v) for k, v in state.finished_total.items()},
        ttft_seconds=_hist(state, "time_to_first_token_seconds"),
        itl_seconds=_hist(state, "inter_token_latency_seconds"),
        e2e_seconds=_hist(state, "e2e_request_latency_seconds"),
        prefill_seconds_total=state.histogram_sums["request_prefill_time_seconds"],
        decode_seconds_total=state.histogram_sums["request_decode_time_seconds"],
        kv_capacity_tokens=float(state.num_gpu_blocks * KV_BLOCK_TOKENS),
    )


def simulated_history(
    node: str,
    book: PriceBook,
    start: float,
    end: float,
    specs: Sequence[EngineSpec] = DEFAULT_ENGINES,
    seed: int = 0,
    step: float = MINUTE,
) -> Iterator[tuple[CostWindow, ...]]:
    """Priced windows of every engine, one tuple per ``step`` seconds over [start, end)."""
    engines = {
        spec.name: build_engine(spec, H100_SXM, start, seed * 1000 + i, tick_seconds=HISTORY_TICK_SECONDS)
        for i, spec in enumerate(specs)
    }
    configs = [engine_config(spec, engines[spec.name], "http://sim.invalid/metrics") for spec in specs]
    gpu_of = {g: spec.name for spec in specs for g in spec.gpus}
    joiner = WindowJoiner(node, [c.cost_spec() for c in configs], book.table())
    energy = {g: 0.0 for g in range(8)}
    t = start
    while t < end:
        gpus: list[GpuSample] = []
        scrapes: dict[str, EngineScrape] = {}
        for name, eng in engines.items():
            eng.advance_to(t)
            scrapes[name] = EngineScrape(name, "vllm", t, True, 0.0, (signals_of(eng.state()),))
        for g in range(8):
            load = engines[gpu_of[g]].gpu_load() if g in gpu_of else GpuLoad(0.0, 0.0, 0.0)  # idle GPU
            util, bw = load.util_gpu_ratio, load.dram_bw_ratio
            watts = model_power_watts(PROFILES["H100-SXM"], load)  # the fake NVML's power model
            energy[g] += watts * step
            gpus.append(
                GpuSample(
                    g, f"GPU-sim-{g}", "NVIDIA H100 80GB HBM3", t, util_gpu_ratio=util, dram_bw_ratio=bw,
                    power_watts=watts, energy_joules=energy[g],
                )
            )  # fmt: skip
        joiner.add_round(NvmlRound(t, True, tuple(gpus)))
        tick = joiner.close_tick(t, scrapes)
        if tick.windows:
            yield tick.windows
        t += step


def backfill(store: object, node: str, book: PriceBook, start: float, end: float, seed: int = 0) -> int:
    """Write simulated history into a Store (``agent.store.Store``); returns windows written."""
    batch: list[CostWindow] = []
    written = 0
    for windows in simulated_history(node, book, start, end, seed=seed):
        batch.extend(windows)
        if len(batch) >= 4000:
            written += store.write_windows(batch)  # type: ignore[attr-defined]
            batch = []
    if batch:
        written += store.write_windows(batch)  # type: ignore[attr-defined]
    return written
