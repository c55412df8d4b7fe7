"""The window join: NVML rounds + engine scrapes + prices → priced usage windows, one tick at a time.

Pure and deterministic: it holds the previous cumulative readings (so counter resets are handled
once, here) but reads no clock and does no I/O — the supervisor passes in the tick's time, the
scrapes, the NVML rounds and each model's deployed version.

Attribution, per tick of Δt seconds:
- each GPU costs price × Δt / 3600 (+ energy where the book prices power); a GPU listed by several
  engines is split by the share policy (``equal`` by default, or ``tokens``); a GPU no engine lists is
  node idle cost;
- an engine's cost is split among the models it serves by their share of tokens (equally when no
  model produced any); a CPU-only engine is priced per hour from the book's ``engines`` section;
- a model with no tokens in the tick has its whole cost reported as idle cost;
- while an engine is down its GPUs still cost money: the cost goes, as idle, to the models it served
  before; tokens counted while it was down appear in the tick it comes back (counter deltas).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from agent.config import EngineConfig
from agent.cost.efficiency import DecodeObservation, ModelFigures, decode_efficiency
from agent.cost.model import (
    bandwidth_of,
    energy_cost,
    energy_from_counter,
    gpu_time_cost,
    mig_slice_fraction,
    split_shares,
    usd_per_million,
)
from agent.cost.quantiles import counter_delta, histogram_delta, quantile
from agent.samples import CostWindow, EngineScrape, GpuSample, Histogram, ModelSignals, NvmlRound, UsageWindow
from agent.sources.prices import PriceBook

logger = logging.getLogger(__name__)

P99 = 0.99


@dataclass(frozen=True, slots=True)
class GpuTick:
    """What one GPU did and cost over one tick."""

    sample: GpuSample  # the last reading in the tick
    seconds: float  # seconds covered
    usd_per_hour: float | None  # price, None when the book does not price this GPU
    cost_usd: float  # dollars (time + energy)
    idle_usd: float  # dollars of that not used to make tokens
    energy_joules: float | None  # joules used in the tick
    util_ratio: float | None  # mean utilisation 0–1
    bw_ratio: float | None  # mean DRAM bandwidth 0–1 (GPM), else memory-busy ratio
    power_watts: float | None  # mean watts


@dataclass(frozen=True, slots=True)
class TickResult:
    """Everything one tick produced."""

    start: float  # epoch seconds
    end: float  # epoch seconds
    windows: tuple[CostWindow, ...] = ()
    gpus: tuple[GpuTick, ...] = ()


@dataclass(slots=True)
class _GpuAcc:
    samples: list[GpuSample] = field(default_factory=list)


@dataclass(slots=True)
class _ModelPrev:
    signals: ModelSignals


def _delta(prev: ModelSignals | None, cur: ModelSignals | None, name: str) -> float | None:
    """A counter's increase over the tick, reset-safe per series.

    When the engine sums the counter over several series (data-parallel ranks, model versions),
    each series' delta is taken on its own, so one rank restarting is not read as a reset of the
    sum (which would count every other rank's total again); a series new since the last scrape
    started from zero and counts in full."""
    if prev is None or cur is None:
        return None
    before, now = prev.counter_parts.get(name), cur.counter_parts.get(name)
    if before and now:
        return sum(counter_delta(before.get(k, 0.0), v) or 0.0 for k, v in now.items())
    return counter_delta(getattr(prev, name), getattr(cur, name))


def _hist_delta(prev: Histogram | None, cur: Histogram | None) -> Histogram | None:
    """The observations of one tick (None without two readings of the same layout)."""
    return None if cur is None else histogram_delta(prev, cur)


def _p99(h: Histogram | None) -> float | None:
    return None if h is None else quantile(h, P99)


def _mean(values: Iterable[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return sum(xs) / len(xs) if xs else None


class WindowJoiner:
    """Turns a stream of samples into priced windows. Feed NVML rounds with :meth:`add_round`, then
    close each tick with :meth:`close_tick`."""

    def __init__(
        self, node: str, engines: Sequence[EngineConfig], book: PriceBook, share_policy: str = "equal"
    ):
        self.node = node
        self.engines = tuple(engines)
        self.book = book
        self.share_policy = share_policy
        self._last_tick: float | None = None
        self._acc: dict[str, _GpuAcc] = {}
        self._last_energy: dict[str, tuple[float, float | None]] = {}  # uuid → (joules, tick it closed)
        self._prev: dict[tuple[str, str], ModelSignals] = {}  # (engine, model) → last signals
        self._known_models: dict[str, tuple[str, ...]] = {}  # engine → models seen
        self._unpriced_logged: set[str] = set()

    # ------------------------------------------------------------------ inputs
    def add_round(self, rnd: NvmlRound) -> None:
        """Accumulate one NVML round into the current tick."""
        if not rnd.up:
            return
        for g in rnd.gpus:
            self._acc.setdefault(g.uuid, _GpuAcc()).samples.append(g)

    # ------------------------------------------------------------------ helpers
    def _engine_gpus(self, eng: EngineConfig, gpus: Mapping[str, GpuSample]) -> list[str]:
        """The UUIDs of the engine's GPUs seen this tick; a whole GPU in MIG mode means its instances."""
        mig_parents = {s.mig_parent_uuid for s in gpus.values() if s.mig_parent_uuid}
        out: list[str] = []
        for ref in eng.gpus:
            for uuid, s in gpus.items():
                whole = isinstance(ref, int) and s.index == ref and s.mig_parent_uuid is None
                if whole and uuid in mig_parents:
                    out.extend(u for u, m in gpus.items() if m.mig_parent_uuid == uuid)
                elif (isinstance(ref, str) and ref == uuid) or whole:
                    out.append(uuid)
        return out

    def _model_deltas(
        self, eng: EngineConfig, scrape: EngineScrape | None
    ) -> dict[str, tuple[ModelSignals | None, ModelSignals | None]]:
        """(previous, current) signals per model of an engine; current None when the engine is down."""
        out: dict[str, tuple[ModelSignals | None, ModelSignals | None]] = {}
        if scrape is not None and scrape.up:
            for m in scrape.models:
                out[m.model] = (self._prev.get((eng.name, m.model)), m)
        else:
            for name in self._known_models.get(eng.name, ()):
                out[name] = (self._prev.get((eng.name, name)), None)
        return out

    # ------------------------------------------------------------------ the tick
    def close_tick(
        self,
        now: float,
        scrapes: Mapping[str, EngineScrape],
        versions: Mapping[str, str] | None = None,
    ) -> TickResult:
        """Close the tick ending at ``now`` (epoch seconds) and price it.

        ``scrapes``: the latest scrape per engine name taken during this tick (missing = not scraped).
        ``versions``: engine → deployed version from deployment metadata (a version file),
        overriding the engine config.
        The first call only sets the baselines and returns no windows.
        """
        versions = versions or {}
        start = self._last_tick
        last: dict[str, GpuSample] = {u: a.samples[-1] for u, a in self._acc.items() if a.samples}
        if start is None or now <= start:
            self._last_tick = now
            self._remember(scrapes, last)
            self._acc = {}
            return TickResult(start=now, end=now)
        dt = now - start

        # ---- per GPU: time + energy cost
        gpu_cost: dict[str, float] = {}
        gpu_info: dict[str, tuple[float | None, float | None, float | None, float | None, float | None]] = {}
        power = self.book.power
        mig_parents = {s.mig_parent_uuid for s in last.values() if s.mig_parent_uuid}
        for uuid, acc in self._acc.items():
            if uuid in mig_parents:
                continue  # a GPU in MIG mode is paid through its instances
            s = acc.samples[-1]
            price = self.book.gpu_usd_per_hour(s.name, self.node, now)
            if price is not None and s.mig_parent_uuid:
                price *= mig_slice_fraction(s.name)
            if price is None and uuid not in self._unpriced_logged:
                self._unpriced_logged.add(uuid)
                logger.warning(
                    "GPU %s (%s) has no price in %s: its cost counts as 0",
                    uuid,
                    s.name,
                    self.book.source_path,
                )
            mean_power = _mean(x.power_watts for x in acc.samples)
            prev_energy = self._last_energy.get(uuid)
            # the counter only spans this tick if its previous reading closed the previous tick;
            # after a gap (GPU or NVML down) fall back to mean power × Δt instead of charging the gap
            prev_j = prev_energy[0] if prev_energy is not None and prev_energy[1] == start else None
            joules = energy_from_counter(prev_j, s.energy_joules, mean_power, dt)
            cost = gpu_time_cost(price or 0.0, dt)
            if power is not None and joules is not None:
                cost += energy_cost(joules, power.usd_per_kwh, power.pue)
            gpu_cost[uuid] = cost
            bw = _mean(x.dram_bw_ratio for x in acc.samples)
            if bw is None:
                bw = _mean(x.util_memory_ratio for x in acc.samples)
            gpu_info[uuid] = (price, joules, _mean(x.util_gpu_ratio for x in acc.samples), bw, mean_power)

        # ---- per engine: which GPUs, which models, how many tokens
        eng_gpus = {e.name: self._engine_gpus(e, last) for e in self.engines}
        eng_models = {e.name: self._model_deltas(e, scrapes.get(e.name)) for e in self.engines}
        model_tokens: dict[tuple[str, str], tuple[float, float]] = {}
        for e in self.engines:
            for model, (prev, cur) in eng_models[e.name].items():
                p = _delta(prev, cur, "prompt_tokens_total")
                g = _delta(prev, cur, "generation_tokens_total")
                model_tokens[(e.name, model)] = (p or 0.0, g or 0.0)
        eng_tokens = {
            e.name: sum(p + g for (en, _), (p, g) in model_tokens.items() if en == e.name)
            for e in self.engines
        }

        users: dict[str, list[str]] = {}
        for e in self.engines:
            for u in eng_gpus[e.name]:
                users.setdefault(u, []).append(e.name)
        shares = {u: split_shares(us, self.share_policy, eng_tokens) for u, us in users.items()}

        # ---- price each model
        windows: list[CostWindow] = []
        gpu_used_usd: dict[str, float] = {u: 0.0 for u in gpu_cost}
        for e in self.engines:
            models = eng_models[e.name]
            if not models:
                continue
            tok = {m: sum(model_tokens[(e.name, m)]) for m in models}
            mshare = split_shares(list(models), "tokens", tok)
            eng_gpu_list = eng_gpus[e.name]
            cpu_price = self.book.engine_usd_per_hour(e.name)
            # the cost is known only if every GPU the engine lists was read and priced (NVML down or a
            # GPU missing from the book = unknown, reported as an absent ratio, never as $0), or the
            # engine has an hourly price of its own
            priced = (
                len(eng_gpu_list) >= len(e.gpus)
                and all(gpu_info[u][0] is not None for u in eng_gpu_list)
                and (bool(eng_gpu_list) or cpu_price is not None)
            )
            for model, (prev, cur) in models.items():
                ms = mshare[model]
                p_tok, g_tok = model_tokens[(e.name, model)]
                ttft = _hist_delta(prev.ttft_seconds if prev else None, cur.ttft_seconds if cur else None)
                itl = _hist_delta(prev.itl_seconds if prev else None, cur.itl_seconds if cur else None)
                time_usd = energy_usd = gpu_seconds = 0.0
                joules_sum: float | None = None
                power_sum: float | None = None
                for u in eng_gpu_list:
                    f = shares[u][e.name] * ms
                    price, joules, _util, _bw, watts = gpu_info[u]
                    t_usd = gpu_time_cost(price or 0.0, dt) * f
                    time_usd += t_usd
                    e_usd = (gpu_cost[u] - gpu_time_cost(price or 0.0, dt)) * f
                    energy_usd += e_usd
                    gpu_seconds += dt * f
                    if joules is not None:
                        joules_sum = (joules_sum or 0.0) + joules * f
                    if watts is not None:
                        power_sum = (power_sum or 0.0) + watts * f
                    if p_tok + g_tok > 0:
                        gpu_used_usd[u] += t_usd + e_usd
                if cpu_price is not None:
                    time_usd += gpu_time_cost(cpu_price, dt) * ms
                usage = UsageWindow(
                    node=self.node,
                    engine=e.name,
                    model=model,
                    model_version=versions.get(e.name) or e.version_of(model),
                    start=start,
                    end=now,
                    prompt_tokens=p_tok,
                    generation_tokens=g_tok,
                    gpu_seconds=gpu_seconds,
                    energy_joules=joules_sum,
                    gpu_util_ratio=_mean(gpu_info[u][2] for u in eng_gpu_list),
                    mem_bw_ratio=_mean(gpu_info[u][3] for u in eng_gpu_list),
                    power_watts=power_sum,
                    requests_running=cur.requests_running if cur else None,
                    kv_cache_usage_ratio=cur.kv_cache_usage_ratio if cur else None,
                    preemptions=_delta(prev, cur, "preemptions_total"),
                    ttft_p99_seconds=_p99(ttft),
                    itl_p99_seconds=_p99(itl),
                    ttft_delta=ttft,
                    itl_delta=itl,
                    prefill_seconds=_delta(prev, cur, "prefill_seconds_total"),
                    decode_seconds=_delta(prev, cur, "decode_seconds_total"),
                )
                sc = scrapes.get(e.name)
                roof = _efficiency(
                    usage, cur, sc.kind if sc is not None else e.kind, e, [last[u] for u in eng_gpu_list]
                )
                windows.append(self._price(usage, time_usd, energy_usd, priced, roof))

        gpus: list[GpuTick] = []
        for u, cost in gpu_cost.items():
            price, joules, util, bw, watts = gpu_info[u]
            gpus.append(
                GpuTick(
                    sample=last[u],
                    seconds=dt,
                    usd_per_hour=price,
                    cost_usd=cost,
                    idle_usd=max(0.0, cost - gpu_used_usd.get(u, 0.0)),
                    energy_joules=joules,
                    util_ratio=util,
                    bw_ratio=bw,
                    power_watts=watts,
                )
            )

        self._last_tick = now
        self._remember(scrapes, last)
        self._acc = {}
        return TickResult(start=start, end=now, windows=tuple(windows), gpus=tuple(gpus))

    # ------------------------------------------------------------------ internals
    def _remember(self, scrapes: Mapping[str, EngineScrape], last: Mapping[str, GpuSample]) -> None:
        for name, sc in scrapes.items():
            if sc.up:
                if sc.models:
                    self._known_models[name] = tuple(m.model for m in sc.models)
                for m in sc.models:
                    self._prev[(name, m.model)] = m
        for uuid, s in last.items():
            if s.energy_joules is not None:
                self._last_energy[uuid] = (s.energy_joules, self._last_tick)

    def _price(
        self,
        usage: UsageWindow,
        time_usd: float,
        energy_usd: float,
        priced: bool = True,
        roofline: float | None = None,
    ) -> CostWindow:
        cost = time_usd + energy_usd
        tokens = usage.prompt_tokens + usage.generation_tokens
        return CostWindow(
            usage=usage,
            gpu_time_usd=time_usd,
            energy_usd=energy_usd,
            usd_per_1m_output=usd_per_million(cost, usage.generation_tokens) if priced else None,
            usd_per_1m_total=usd_per_million(cost, tokens) if priced else None,
            idle_usd=cost if tokens <= 0 else 0.0,
            priced=priced,
            roofline_ratio=roofline,
        )


def _efficiency(
    usage: UsageWindow, cur: ModelSignals | None, kind: str, eng: EngineConfig, gpus: Sequence[GpuSample]
) -> float | None:
    """Decode efficiency of one model window (:mod:`agent.cost.efficiency`); None when unknown."""
    if cur is None:
        return None
    ranks = len(cur.counter_parts.get("generation_tokens_total", {})) or 1
    obs = DecodeObservation(
        engine_kind=kind,
        generation_tokens=usage.generation_tokens,
        decode_seconds=usage.decode_seconds,
        requests_running=usage.requests_running,
        kv_cache_usage_ratio=usage.kv_cache_usage_ratio,
        kv_capacity_tokens=cur.kv_capacity_tokens,
        replicas=ranks,
        bandwidth_bytes_per_s=sum(bandwidth_of(g.name) or 0.0 for g in gpus),
    )
    figures = ModelFigures(eng.weights_bytes, eng.kv_bytes_per_token, eng.kv_capacity_tokens)
    return decode_efficiency(obs, figures)
