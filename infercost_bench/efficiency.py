"""Benchmark: the decode efficiency the agent computes (:mod:`agent.cost.efficiency`) against the
simulators' own step and roofline, on both traffic models, at 5, 15 and 60 s scrapes.

The truth of a window is what the simulator knows and the agent cannot see: its roofline step (the
weights plus the batch's KV cache read once at the GPUs' *peak* bandwidth) over its *pure decode*
step (the step its physics gives the batch, prefill excluded), token-weighted over the window:
``Σ tokens × roofline step ÷ Σ tokens × pure decode step``. A window is busy when the simulator ran
at least one sequence per replica on average over it; presence is the share of busy windows with a
figure, error the median of ``|figure − truth| ÷ truth`` over the busy windows that have one.

- **core**: the simulation core (:class:`infercost_sim.engine.SimEngine`, the demo node's four engines),
  stepped one second at a time in ten-minute segments every three hours of a day (between segments it
  advances in coarse ticks); every 5 s its page is written by the simulated server's own collector
  and read by the vLLM adapter, as the daemon reads it; its gauges are the engine's state at that
  instant (running requests and KV cache at the end of its last one-second tick). Truth per second:
  ``Deployment.step_seconds`` at the tick's mean batch, the roofline from ``step_bytes``.
- **azure**: the Azure-trace model (:mod:`infercost_sim.azure`; ten-minute segments every hour of one
  day of three nodes). Its state is per minute (a steady state each minute); its requests are drawn
  per rank (:func:`infercost_sim.samples.draw_readings`, as the detection benchmark's scrapes read
  them), so a scrape reads the gauges as one instant of them, the counters as far as they went, and
  the inter-token histogram grown by the share of the minute gone by (with the prefix-cache hits the
  model counts), not through page text. Truth per scrape: the minute's ITL median less the prefill
  share its counters record (``prefill seconds ÷ (60 × replicas)``), against the roofline at the
  minute's batch per replica (the one its law ran at, whose step that is: the drawn instant the
  gauges read is not) and the minute's context. A vLLM e2e histogram's count (requests finished,
  observed with their phase times) is read with the counters, and a TTFT count (first tokens,
  observed as they are made: the minute's served requests, the ones its law prefilled, grown like
  the inter-token counts). The two differ after a burst: the batch a saturated minute admitted
  drains in the next, whose finished requests then carry prefills of the minute before.
  Its law is bounded by the memory at the real context and its prefill by the GPU's tensor cores (so
  its truth stays ≤ 1; windows above 1 would be counted apart, not scored); a line per node gives
  its prefill rate against the GPU's peak.

Both simulators write their ITL sums as the mean of a log-normal around the step, a little above it,
so even an exact estimator reads slightly low against them.

Both go through the real window join (:class:`agent.cost.window.WindowJoiner`); "join" is the figure
the join computes as wired, "+prefill" the same estimator called directly with the window's inputs
(prefilled tokens, the GPUs' peak FLOPS, the model's FLOPs per token, prefill seconds, finished
requests and first tokens: a check that the join passes them all), with the median prefill share
it took out. It prints one line per model and interval and the targets; nothing asserts on them.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

from agent.cost.efficiency import (
    DecodeObservation,
    ModelFigures,
    decode_efficiency,
    measured_step_seconds,
    prefill_share,
)
from agent.cost.inputs import EngineSpec
from agent.cost.model import bandwidth_of
from agent.cost.window import WindowJoiner
from agent.hardware import H100_SXM, gpu_spec
from agent.samples import CostWindow, EngineScrape, GpuSample, Histogram, ModelSignals, NvmlRound
from agent.sources.engines.registry import ADAPTERS
from agent.sources.prices import parse_price_book
from infercost_sim.engine import ITL_BUCKETS, SimEngine
from infercost_sim.node import DEFAULT_ENGINES, build_engine, engine_config
from infercost_sim.samples import ITL_SIGMA, _cumulative_hist, draw_readings
from infercost_sim.samples import engine_config as node_engine_config
from infercost_sim.server import VllmCollector
from infercost_sim.workload import DAY, DEFAULT_START, MINUTE, WEEK, SimulatedNode, simulate_node

INTERVALS = (5, 15, 60)  # seconds between scrapes
SCRAPE_S = INTERVALS[0]  # the finest scrape: the others read every 3rd and 12th page
TARGET_ERROR = 0.10  # median relative error of the figure against the truth
TARGET_PRESENCE = 0.90  # share of busy windows with a figure
SEGMENT_S = 600  # seconds of one-second stepping per segment: ten 60 s windows
SEGMENT_EVERY_S = 10800  # seconds between segment starts: eight segments span the day's load
QUICK_SEGMENT_EVERY_S = 21600  # four segments per engine in a quick run
AZURE_SEGMENT_EVERY_S = 3600  # the Azure model's segments: one an hour (its joins are cheap per scrape)
AZURE_SEEDS = (7, 8, 9)  # three nodes: GPU, KV size, mix and law drawn per node
QUICK_AZURE_SEEDS = (7,)
CORE_SEED = 7
FIGURES = ("join", "+prefill")  # the figure as the join computes it; the estimator called directly
USD_PER_GPU_HOUR = 2.0  # any price: the efficiency does not depend on it


@dataclass(slots=True)
class _Truth:
    """Token-weighted sums of the simulator's own steps over a span."""

    tokens: float = 0.0  # tokens generated
    roof: float = 0.0  # Σ tokens × roofline step (seconds)
    pure: float = 0.0  # Σ tokens × pure decode step (seconds)
    batch_s: float = 0.0  # Σ seconds × sequences running per replica
    seconds: float = 0.0  # seconds covered

    def add(self, other: _Truth) -> None:
        self.tokens += other.tokens
        self.roof += other.roof
        self.pure += other.pure
        self.batch_s += other.batch_s
        self.seconds += other.seconds

    def busy(self) -> bool:
        """At least one sequence per replica on average, and tokens to time."""
        return self.tokens > 0 and self.seconds > 0 and self.batch_s / self.seconds >= 1.0

    def efficiency(self) -> float:
        return self.roof / self.pure


@dataclass(frozen=True, slots=True)
class _Reading:
    """One scrape as the agent reads it, and the truth since the previous finest scrape."""

    t: float  # seconds since the epoch
    signals: ModelSignals
    truth: _Truth


@dataclass(frozen=True, slots=True)
class _Point:
    """One window: the truth and the two figures."""

    truth: float | None  # None: not busy
    joined: float | None  # as the window join computes it
    full: float | None  # with the inputs the join does not pass yet
    floor: float  # the prefill share of the window's seconds the estimator takes out


@dataclass(frozen=True, slots=True)
class Row:
    """One traffic model at one scrape interval."""

    model: str
    interval_s: int
    figure: str  # "join" | "+prefill"
    busy: int  # busy windows scored
    present: float  # share of busy windows with a figure
    median_error: float | None  # median |figure − truth| ÷ truth
    median_bias: float | None  # median (figure − truth) ÷ truth
    worst_error: float | None  # 95th percentile of the error
    highest: float | None  # the highest figure seen in any window
    impossible_truth: int  # busy windows whose truth exceeds 1 (not scored)
    prefill_floor: float | None = None  # median prefill share taken out (the "+prefill" figure)

    def met(self) -> bool:
        return (
            self.median_error is not None
            and self.median_error <= TARGET_ERROR
            and self.present >= TARGET_PRESENCE
            and (self.highest or 0.0) <= 1.0
        )


# ------------------------------------------------------------------------------------ the core


def _round(t: float, indexes: Sequence[int | str], name: str, e: float) -> NvmlRound:
    """One NVML round of the engine's GPUs at ``t`` (``e``: joules so far; the efficiency reads none)."""
    gpus = tuple(
        GpuSample(int(g), f"GPU-sim-{g}", name, t, util_gpu_ratio=0.9, power_watts=500.0, energy_joules=e)
        for g in indexes
    )
    return NvmlRound(t, True, gpus)


def _core_readings(engine: SimEngine, segment_every: float) -> Iterator[list[_Reading]]:
    """Per segment, the engine's page read every :data:`SCRAPE_S` seconds with the truth between."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(VllmCollector(engine))
    adapter = ADAPTERS["vllm"]
    dep = engine.deployment
    peak_bw = dep.tp * dep.gpu.hbm_bandwidth_bytes_per_s
    for seg in np.arange(0.0, DAY, segment_every):
        t = engine.created + float(seg)
        engine.advance_to(t)
        out: list[_Reading] = []
        truth = _Truth()
        for second in range(1, SEGMENT_S + 1):
            r0, g0 = engine.running, engine.generation_tokens_total
            engine.advance_to(t + second)
            tokens = engine.generation_tokens_total - g0
            batch = max(1.0, (r0 + engine.running) / 2.0)
            ctx = engine.mean_context_tokens
            pure = dep.step_seconds(batch, ctx, engine.throughput_factor)
            roof = dep.step_bytes(batch, ctx) / peak_bw
            truth.add(_Truth(tokens, tokens * roof, tokens * pure, (r0 + engine.running) / 2.0, 1.0))
            if second % SCRAPE_S == 0:
                reading = adapter.read(generate_latest(registry).decode(), None, False, 64)
                out.append(_Reading(t + second, reading.models[0], truth))
                truth = _Truth()
        yield out


def _core(segment_every: float) -> dict[int, list[_Point]]:
    """Every window of the demo node's engines, per scrape interval."""
    points: dict[int, list[_Point]] = {i: [] for i in INTERVALS}
    start = DEFAULT_START + 3 * DAY  # a Thursday
    for n, spec in enumerate(DEFAULT_ENGINES):
        engine = build_engine(spec, H100_SXM, start, CORE_SEED + n)
        cost = engine_config(spec, engine, "http://sim.invalid/metrics").cost_spec()
        flops = engine.deployment.model.flops_per_token
        for segment in _core_readings(engine, segment_every):
            for interval in INTERVALS:
                points[interval].extend(_windows(segment, interval, cost, H100_SXM.name, flops))
    return points


# ------------------------------------------------------------------------------------ the azure model


def _azure_readings(sim: SimulatedNode) -> list[_Reading]:
    """The node's signals every :data:`SCRAPE_S` seconds (see the module docstring): the requests
    drawn per rank (:func:`infercost_sim.samples.draw_readings`), gauges one instant at the scrape."""
    tr, drv, p = sim.trace, sim.drivers, sim.physics
    ranks = p.replicas
    rd = draw_readings(sim, SCRAPE_S)
    itl_n = np.maximum(tr.generation_tokens - tr.finished, 0.0)
    itl_cum = _cumulative_hist(ITL_BUCKETS, itl_n, tr.itl_median, ITL_SIGMA)  # minutes × buckets
    itl_minute = np.diff(np.vstack([np.zeros(itl_cum.shape[1]), itl_cum]), axis=0)
    itl_sum = itl_n * tr.itl_median * np.exp(ITL_SIGMA**2 / 2)
    # vLLM observes a request's TTFT when its first token is made (the step that ends its prefill):
    # the minute's first tokens are the requests its law prefilled, grown like the inter-token counts
    ttft_sum = tr.finished * tr.ttft_median
    ttft_before = np.concatenate(([0.0], np.cumsum(tr.finished)))
    ttft_sum_before = np.concatenate(([0.0], np.cumsum(ttft_sum)))
    le = (*ITL_BUCKETS, float("inf"))
    rank_series = [f"vllm:generation_tokens_total,engine={r}" for r in range(ranks)]
    bandwidth = p.gpu.hbm_bandwidth_bytes_per_s
    out: list[_Reading] = []
    per_minute = int(MINUTE // SCRAPE_S)
    hist_before = np.zeros(itl_cum.shape[1])
    itl_before = 0.0
    gen_ranks = rd.generation.tolist()
    gen_prev = 0.0
    for m in range(sim.minutes):
        ctx = float(drv.prompt_tokens[m]) + float(drv.output_tokens[m]) / 2.0
        share = float(tr.prefill_seconds[m]) / (MINUTE * ranks)
        pure = float(tr.itl_median[m]) * (1.0 - share)
        for j in range(1, per_minute + 1):
            k = m * per_minute + j - 1
            q = j / per_minute
            buckets = np.cumsum(hist_before + q * itl_minute[m]).tolist()
            parts = gen_ranks[k]
            gen = float(sum(parts))
            prompt = float(rd.prompt[k])
            # the batch the minute's law ran at (its step is that batch's): a drawn instant above it
            # with the minute's step would be a roofline no step of the law meets (a truth above 1)
            b = float(tr.running[m]) / ranks
            roof = (p.model.weight_bytes + max(1.0, b) * ctx * p.model.kv_bytes_per_token) / bandwidth
            signals = ModelSignals(
                model=p.model.name,
                prompt_tokens_total=prompt,
                generation_tokens_total=gen,
                requests_running=float(rd.running[k].sum()),
                requests_waiting=float(rd.waiting[k]),
                kv_cache_usage_ratio=float(rd.kv_usage[k]),
                itl_seconds=Histogram(
                    tuple(zip(le, buckets, strict=True)), itl_before + q * float(itl_sum[m]), buckets[-1]
                ),
                ttft_seconds=Histogram(
                    ((float("inf"), float(ttft_before[m] + q * tr.finished[m])),),
                    float(ttft_sum_before[m] + q * ttft_sum[m]),
                    float(ttft_before[m] + q * tr.finished[m]),
                ),
                # vLLM observes a request's e2e, prefill and decode times together, when it finishes
                e2e_seconds=Histogram(
                    ((float("inf"), float(rd.finished[k])),),
                    float(rd.prefill_seconds[k] + rd.decode_seconds[k]),
                    float(rd.finished[k]),
                ),
                prefill_seconds_total=float(rd.prefill_seconds[k]),
                decode_seconds_total=float(rd.decode_seconds[k]),
                cached_prompt_tokens_total=float(round(prompt * p.prefix_cache_hit_ratio)),
                kv_capacity_tokens=float(tr.kv_capacity_tokens[m]),
                counter_parts={"generation_tokens_total": dict(zip(rank_series, parts, strict=True))},
            )
            step_tokens = gen - gen_prev
            gen_prev = gen
            truth = _Truth(step_tokens, step_tokens * roof, step_tokens * pure, b * SCRAPE_S, SCRAPE_S)
            out.append(_Reading(sim.start + m * MINUTE + j * SCRAPE_S, signals, truth))
        hist_before = hist_before + itl_minute[m]
        itl_before += float(itl_sum[m])
    return out


def _azure(seeds: Sequence[int], segment_every_minutes: int) -> tuple[dict[int, list[_Point]], list[str]]:
    """The windows of ten-minute segments of one day of each Azure-trace node, per scrape interval,
    and a line per node: its GPU and the prompt tokens/s its law prefills at against what the GPU's
    peak FLOPS allow."""
    points: dict[int, list[_Point]] = {i: [] for i in INTERVALS}
    notes: list[str] = []
    for seed in seeds:
        sim = simulate_node("azure", seed=seed, weeks=DAY / WEEK, node=f"azure-{seed}")
        p, tr = sim.physics, sim.trace
        cost = node_engine_config(sim).cost_spec()
        readings = _azure_readings(sim)
        per_minute = int(MINUTE // SCRAPE_S)
        node: list[_Point] = []  # this node's windows at the longest interval
        for first in range(0, sim.minutes, segment_every_minutes):
            segment = readings[first * per_minute : (first + SEGMENT_S // int(MINUTE)) * per_minute]
            for interval in INTERVALS:
                got = _windows(segment, interval, cost, p.gpu.name, p.model.flops_per_token)
                points[interval].extend(got)
                node.extend(got if interval == INTERVALS[-1] else [])
        busy = tr.running / p.replicas >= 1.0
        uncached = tr.prompt_tokens * (1.0 - p.prefix_cache_hit_ratio)
        rate = float(uncached[busy].sum() / tr.prefill_seconds[busy].sum()) if busy.any() else 0.0
        share = float(np.median(tr.prefill_seconds[busy] / (MINUTE * p.replicas))) if busy.any() else 0.0
        notes.append(
            f"azure node seed {seed}: {p.gpu.name}, prefill at {rate:,.0f} prompt tokens/s per replica "
            f"(the GPU's peak FLOPS allow {p.gpu.peak_flops / p.model.flops_per_token:,.0f}), "
            f"median prefill share of busy minutes {share:.0%}; "
            + ", ".join(
                f"{r.figure} at {r.interval_s} s: median error {_pct(r.median_error)}, "
                f"bias {_pct(r.median_bias)}, present {r.present:.0%}"
                for r in (score("azure", INTERVALS[-1], node, figure) for figure in FIGURES)
            )
        )
    return points, notes


# ------------------------------------------------------------------------------------ the join


def _windows(
    readings: Sequence[_Reading], interval: int, cost: EngineSpec, gpu: str, flops: float
) -> list[_Point]:
    """The readings every ``interval`` seconds through a fresh window join, each window with its truth."""
    every = interval // SCRAPE_S
    book = parse_price_book(
        {"gpus": [{"match": gpu, "usd_per_hour": USD_PER_GPU_HOUR, "effective_from": "2000-01-01"}]}, "bench"
    )
    joiner = WindowJoiner("bench", [cost], book.table())
    out: list[_Point] = []
    truth = _Truth()
    first = True
    for n, r in enumerate(readings, start=1):
        truth.add(r.truth)
        if n % every:
            continue
        joiner.add_round(_round(r.t, cost.gpus, gpu, r.t * 500.0))
        scrape = EngineScrape(cost.name, "vllm", r.t, True, 0.01, (r.signals,))
        windows = joiner.close_tick(r.t, {cost.name: scrape}).windows
        if not first:
            w = windows[0]
            out.append(
                _Point(
                    truth.efficiency() if truth.busy() else None,
                    w.roofline_ratio,
                    *_full(w, r.signals, cost, gpu, len(cost.gpus), flops),
                )
            )
        first = False
        truth = _Truth()
    return out


def _full(
    w: CostWindow, cur: ModelSignals, cost: EngineSpec, gpu: str, gpus: int, flops: float
) -> tuple[float | None, float]:
    """The estimator called directly with the window's inputs (prefilled tokens, peak FLOPS, FLOPs per
    token, prefill seconds, finished requests and first tokens: a check that the join passes them
    all), and the
    prefill share it took out."""
    u = w.usage
    spec = gpu_spec(gpu)
    prefilled = None if u.cached_prompt_tokens is None else u.prompt_tokens - u.cached_prompt_tokens
    obs = DecodeObservation(
        engine_kind="vllm",
        generation_tokens=u.generation_tokens,
        decode_seconds=u.decode_seconds,
        requests_running=cur.requests_running,
        kv_cache_usage_ratio=u.kv_cache_usage_ratio,
        kv_capacity_tokens=cur.kv_capacity_tokens,
        replicas=len(cur.counter_parts.get("generation_tokens_total", {})) or 1,
        bandwidth_bytes_per_s=(bandwidth_of(gpu) or 0.0) * gpus,
        window_seconds=u.duration,
        itl_seconds=u.itl_delta.sum if u.itl_delta is not None else None,
        itl_count=u.itl_delta.count if u.itl_delta is not None else None,
        prefill_tokens=prefilled,
        peak_flops_per_s=(spec.peak_flops if spec else 0.0) * gpus,
        prefill_seconds=u.prefill_seconds,
        finished_requests=u.e2e_delta.count if u.e2e_delta is not None else None,
        first_tokens=u.ttft_delta.count if u.ttft_delta is not None else None,
    )
    figures = ModelFigures(cost.weights_bytes, cost.kv_bytes_per_token, cost.kv_capacity_tokens, flops)
    step = measured_step_seconds(obs, "request", obs.replicas)
    return decode_efficiency(obs, figures), prefill_share(obs, figures, step)


# ------------------------------------------------------------------------------------ scoring


def score(model: str, interval: int, points: Sequence[_Point], figure: str) -> Row:
    """One row of the table from the windows of one model and interval."""
    busy = [p for p in points if p.truth is not None]
    impossible = [p for p in busy if p.truth is not None and p.truth > 1.0]
    scored = [p for p in busy if p.truth is not None and p.truth <= 1.0]
    pick = (lambda p: p.joined) if figure == "join" else (lambda p: p.full)
    pairs = [(v, p.truth) for p in scored if (v := pick(p)) is not None and p.truth is not None]
    errors = [abs(v - t) / t for v, t in pairs]
    bias = [(v - t) / t for v, t in pairs]
    seen = [v for p in points if (v := pick(p)) is not None]
    return Row(
        model,
        interval,
        figure,
        len(scored),
        len(pairs) / len(scored) if scored else 0.0,
        statistics.median(errors) if errors else None,
        statistics.median(bias) if bias else None,
        float(np.quantile(errors, 0.95)) if errors else None,
        max(seen) if seen else None,
        len(impossible),
        statistics.median(p.floor for p in scored) if scored and figure != "join" else None,
    )


def _pct(x: float | None) -> str:
    return "absent" if x is None else f"{x:+.1%}" if x < 0 else f"{x:.1%}"


def run(quick: bool = False) -> list[Row]:
    """Print and return the table (see the module docstring)."""
    t0 = time.perf_counter()
    azure, notes = _azure(
        QUICK_AZURE_SEEDS if quick else AZURE_SEEDS,
        (QUICK_SEGMENT_EVERY_S if quick else AZURE_SEGMENT_EVERY_S) // int(MINUTE),
    )
    models = {"core": _core(QUICK_SEGMENT_EVERY_S if quick else SEGMENT_EVERY_S), "azure": azure}
    rows = [
        score(model, interval, points[interval], figure)
        for model, points in models.items()
        for interval in INTERVALS
        for figure in FIGURES
    ]
    print(
        f"decode efficiency against the simulators' truth (targets: median error ≤ {TARGET_ERROR:.0%}, "
        f"present in ≥ {TARGET_PRESENCE:.0%} of busy windows, every figure ≤ 1)"
    )
    print(
        f"{'model':<6} {'scrape':>6} {'figure':<9} {'busy':>6} {'present':>8} {'median err':>11} "
        f"{'median bias':>12} {'p95 err':>8} {'highest':>8} {'truth>1':>8} {'prefill':>9}  target"
    )
    for r in rows:
        floor = "" if r.prefill_floor is None else f"{r.prefill_floor:.1%}"
        print(
            f"{r.model:<6} {r.interval_s:>5}s {r.figure:<9} {r.busy:>6} {r.present:>8.1%} "
            f"{_pct(r.median_error):>11} {_pct(r.median_bias):>12} {_pct(r.worst_error):>8} "
            f"{'absent' if r.highest is None else f'{r.highest:.3f}':>8} {r.impossible_truth:>8} {floor:>9}  "
            f"{'met' if r.met() else 'MISSED'}"
        )
    for model in models:
        for figure in FIGURES:
            mine = [r for r in rows if r.model == model and r.figure == figure]
            worst = max(mine, key=lambda r: r.median_error if r.median_error is not None else math.inf)
            least = min(mine, key=lambda r: r.present)
            high = max((r.highest for r in mine if r.highest is not None), default=None)
            high_ok = "met" if (high or 0.0) <= 1.0 else "MISSED"
            print(
                f"worst {model} {figure}: median error {_pct(worst.median_error)} ({worst.interval_s} s "
                f"scrapes, {'met' if (worst.median_error or math.inf) <= TARGET_ERROR else 'MISSED'}), "
                f"presence {least.present:.1%} ({least.interval_s} s, "
                f"{'met' if least.present >= TARGET_PRESENCE else 'MISSED'}), highest figure "
                f"{'absent' if high is None else f'{high:.3f}'} ({high_ok})"
            )
    for note in notes:
        print(note)
    print(f"({time.perf_counter() - t0:.0f} s)")
    return rows
