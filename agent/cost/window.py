"""The window join: NVML rounds + engine scrapes + prices → priced usage windows, one tick at a time.

Deterministic and free of I/O: it holds the previous cumulative readings (so counter resets are
handled once, here) but reads no clock — the supervisor passes in the tick's time, the scrapes,
the NVML rounds and each model's deployed version. Each tick runs the pure steps of the cost
layer in order:

1. :func:`agent.cost.pricing.price_gpus` — what each GPU (or MIG instance) cost;
2. per engine and model, the counters' increases (:func:`agent.cost.counters.counter_increase`:
   resets told from glitches, increases beyond what the engine's hardware can produce refused and
   listed in :attr:`TickResult.refused_counters`) and the histograms' deltas;
3. :func:`agent.cost.attribution.attribute` — GPUs → engines → models, used and idle dollars, and
   where each model's GPU time went (:func:`agent.cost.bound.bound_shares` per GPU, from GPM);
4. :func:`agent.cost.efficiency.decode_efficiency` — decode efficiency of each window.

While an engine is down its GPUs still cost money: the cost goes, as idle, to the models it
served before; tokens counted while it was down appear in the tick it comes back (counter deltas).
Each tick says so: :attr:`TickResult.down_since` names the engines not read in it (since when),
:attr:`TickResult.gap_since` those read again after an outage, whose windows' tokens were made
since then (the history spreads them over the outage, not into one tick).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from agent.cost.attribution import ModelCharge, ModelTokens, attribute, engine_gpus
from agent.cost.bound import GpmActivity, bound_shares
from agent.cost.counters import (
    CREATED,
    STARTED,
    CounterMemory,
    counter_increase,
    generation_ceiling,
    prompt_ceiling,
)
from agent.cost.efficiency import DecodeObservation, ModelFigures, decode_efficiency_parts, mean_decode_batch
from agent.cost.explain import prefill_shares
from agent.cost.floor import CostFloor, cost_floor
from agent.cost.inputs import EngineSpec, PriceTable
from agent.cost.latency import HistogramMemory, histogram_increase
from agent.cost.model import bandwidth_of, peak_flops_of, usd_per_million
from agent.cost.pricing import GpuCharge, GpuReading, price_gpus
from agent.cost.quantiles import quantile
from agent.cost.split import prefix_cache_saved, prompt_cost
from agent.hardware import gpu_spec
from agent.samples import CostWindow, EngineScrape, GpuSample, Histogram, ModelSignals, NvmlRound, UsageWindow

logger = logging.getLogger(__name__)

P99 = 0.99
# The counters differenced per series (see agent.cost.counters).
COUNTERS = (
    "prompt_tokens_total",
    "generation_tokens_total",
    "preemptions_total",
    "prefill_seconds_total",
    "decode_seconds_total",
    "cached_prompt_tokens_total",
    "queue_seconds_total",
    "compute_seconds_total",
    "timed_requests_total",
)
# The token counters: a model that has never had one read is an engine that counts no tokens (its
# windows' tokens are absent, not 0).
TOKEN_COUNTERS = ("prompt_tokens_total", "generation_tokens_total")
# The counters bounded by what the engine's hardware can produce (agent.cost.counters): generated
# tokens by its GPUs' bandwidth or compute, prompt tokens (prefix-cache hits cost no compute) by its
# network; the time and event counters are not bounded.
GENERATION_BOUNDED = ("generation_tokens_total",)
PROMPT_BOUNDED = ("prompt_tokens_total", "cached_prompt_tokens_total")
# The counters whose reset says the model's process restarted: the bounded ones, whose fall is read
# as a reset only when the new value is no more than the hardware could count since the last scrape
# (an unbounded time or event counter falling says less: its fall is read as a reset whatever it is)
RESTART_SIGNS = GENERATION_BOUNDED + PROMPT_BOUNDED
# The latency histograms, differenced per series (see agent.cost.latency.histogram_increase).
HISTOGRAMS = ("ttft_seconds", "itl_seconds", "e2e_seconds")


@dataclass(frozen=True, slots=True)
class GpuTick:
    """What one GPU did and cost over one tick."""

    sample: GpuSample  # the last reading in the tick (a down copy of the last one when not read)
    seconds: float  # seconds covered
    usd_per_hour: float | None  # price (a MIG instance: its share), None when the book does not price it
    cost_usd: float  # dollars (time + energy)
    idle_usd: float  # dollars of that not used to make tokens (unallocated included)
    energy_joules: float | None  # joules used in the tick
    util_ratio: float | None  # mean utilisation 0–1
    bw_ratio: float | None  # mean DRAM bandwidth 0–1 (GPM), else memory-busy ratio
    power_watts: float | None  # mean watts
    unallocated_usd: float = 0.0  # dollars held by no engine (an unlisted GPU, uncreated MIG slices)
    estimated: bool = False  # not read this tick: charged from its last reading


@dataclass(frozen=True, slots=True)
class TickResult:
    """Everything one tick produced."""

    start: float  # epoch seconds
    end: float  # epoch seconds
    windows: tuple[CostWindow, ...] = ()
    gpus: tuple[GpuTick, ...] = ()
    engine_usd: float = 0.0  # dollars of engines' own hourly prices (CPU-only engines) in the windows
    # counter series whose reading was refused this tick: "engine/model/counter/series (why)"
    refused_counters: tuple[str, ...] = ()
    # engine → epoch seconds since when it has not been read (down this tick; its models idle)
    down_since: Mapping[str, float] = field(default_factory=dict)
    # engine → epoch seconds its outage began, for engines read again this tick: their windows'
    # token deltas were made over [since, end), not over the tick alone
    gap_since: Mapping[str, float] = field(default_factory=dict)
    # engine → dollars of its share of its GPUs, models or not (attribution.Attribution.engine_gpu_usd)
    engine_gpu_usd: Mapping[str, float] = field(default_factory=dict)

    def unexplained_usd(self) -> float:
        """Conservation check, ≈ 0: Σ GPU cost − (Σ model cost − engines' own + Σ unallocated).

        Every GPU dollar is either charged to a model (busy or idle) or held by no engine."""
        gpu = sum(g.cost_usd for g in self.gpus)
        models = sum(w.cost_usd for w in self.windows) - self.engine_usd
        return gpu - models - sum(g.unallocated_usd for g in self.gpus)


@dataclass(frozen=True, slots=True)
class _ModelStep:
    """One model's reading, counter increases and histogram deltas for one tick."""

    cur: ModelSignals | None  # None: the engine is down
    increases: Mapping[str, float | None]  # counter name → increase (None: unknown)
    observed: Mapping[str, Histogram | None] = field(default_factory=dict)  # histogram → its delta

    def inc(self, name: str) -> float | None:
        return self.increases.get(name)


def _p99(h: Histogram | None) -> float | None:
    return None if h is None else quantile(h, P99)


def _mean(values: Iterable[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return sum(xs) / len(xs) if xs else None


# Why an hour: the default of limits.series_ttl_seconds (its reason is there, in agent/config.py).
SERIES_TTL_SECONDS = 3600.0


class WindowJoiner:
    """Turns a stream of samples into priced windows. Feed NVML rounds with :meth:`add_round`, then
    close each tick with :meth:`close_tick`.

    What it remembers per (engine, model) — counters' and histograms' last readings — is forgotten
    once its engine, up, has not listed the model for ``series_ttl_seconds`` (a model that comes
    back after that starts from a new baseline, as after a restart), and so is an engine no longer
    listed."""

    def __init__(
        self,
        node: str,
        engines: Sequence[EngineSpec],
        prices: PriceTable,
        share_policy: str = "equal",
        series_ttl_seconds: float = SERIES_TTL_SECONDS,
    ):
        self.node = node
        self.engines = tuple(engines)
        self.prices = prices
        self.share_policy = share_policy
        self.series_ttl_seconds = series_ttl_seconds  # seconds a model unseen is remembered
        self.expired_models = 0  # (engine, model) pairs forgotten since start
        self._model_seen: dict[tuple[str, str], float] = {}  # (engine, model) → last tick it was read
        self._last_tick: float | None = None
        self._acc: dict[str, list[GpuSample]] = {}
        self._seen: dict[str, GpuSample] = {}  # uuid → last reading that was up
        self._power: dict[str, float] = {}  # uuid → last known mean power, watts
        self._last_energy: dict[str, tuple[float, float | None]] = {}  # uuid → (joules, tick it closed)
        self._counters: dict[tuple[str, str, str], CounterMemory] = {}  # (engine, model, counter)
        self._histograms: dict[tuple[str, str, str], HistogramMemory] = {}  # (engine, model, histogram)
        self._known_models: dict[str, tuple[str, ...]] = {}  # engine → models seen
        self._unpriced_logged: set[str] = set()
        # (engine, model, counter, series, why) of every refusal logged
        self._refused_logged: set[tuple[str, str, str, str, str]] = set()
        self._refused: list[str] = []  # this tick's refused counter series
        self._down_since: dict[str, float] = {}  # engine → start of the first tick it was not read in

    # ------------------------------------------------------------------ inputs
    def add_round(self, rnd: NvmlRound) -> None:
        """Accumulate one NVML round into the current tick."""
        if not rnd.up:
            return
        for g in rnd.gpus:
            self._acc.setdefault(g.uuid, []).append(g)

    # ------------------------------------------------------------------ steps
    def _readings(self, start: float, now: float) -> dict[str, GpuReading]:
        """This tick's reading of every GPU read now or before (a GPU not read now is still paid)."""
        out: dict[str, GpuReading] = {}
        for uuid in {**self._seen, **self._acc}:
            samples = self._acc.get(uuid, [])
            up = [s for s in samples if s.up]
            if not up:  # not read this tick: its down reading, else a down copy of the last one
                sample = samples[-1] if samples else None
                if sample is None:
                    last = self._seen[uuid]
                    sample = GpuSample(
                        last.index, uuid, last.name, now, up=False, mig_parent_uuid=last.mig_parent_uuid
                    )
                out[uuid] = GpuReading(sample, False, self._power.get(uuid), None)
                continue
            prev = self._last_energy.get(uuid)
            # the counter only spans this tick if its previous reading closed the previous tick;
            # after a gap (GPU or NVML down) fall back to mean power × Δt instead of charging the gap
            prev_j = prev[0] if prev is not None and prev[1] == start else None
            bw = _mean(x.dram_bw_ratio for x in up)
            out[uuid] = GpuReading(
                sample=samples[-1],
                seen=True,
                mean_power_watts=_mean(x.power_watts for x in up),
                prev_energy_joules=prev_j,
                util_ratio=_mean(x.util_gpu_ratio for x in up),
                bw_ratio=bw if bw is not None else _mean(x.util_memory_ratio for x in up),
                throttled_ratio=_mean(x.throttled for x in up),
            )
        return out

    def _model_steps(
        self,
        eng: EngineSpec,
        scrape: EngineScrape | None,
        now: float,
        ceilings: Mapping[str, float] | None = None,
    ) -> dict[str, _ModelStep]:
        """Per model of an engine: its signals, counter increases (at most ``ceilings`` per second,
        by counter) and histogram deltas."""
        out: dict[str, _ModelStep] = {}
        ceilings = ceilings or {}
        if scrape is not None and scrape.up:
            for m in scrape.models:
                read_as = {n: self._counter(eng.name, m, n, now, ceilings.get(n), False) for n in COUNTERS}
                # one process' counters restart together: a token counter read as a restart (a fall
                # within the bound, a new _created or start time) restarts the model's others, which
                # may already have counted past their old values (1 → restart → 2 is 2, not 1)
                if any((mem := read_as[n][1]) is not None and mem.reset for n in RESTART_SIGNS):
                    read_as = {
                        n: r
                        if r[1] is None or r[1].reset
                        else self._counter(eng.name, m, n, now, ceilings.get(n), True)
                        for n, r in read_as.items()
                    }
                inc: dict[str, float | None] = {}
                for name, (inc[name], mem) in read_as.items():
                    if mem is not None:
                        key = (eng.name, m.model, name)
                        self._counters[key] = mem
                        self._note_refused(key, mem.refused)
                seen: dict[str, Histogram | None] = {}
                for name in HISTOGRAMS:
                    key = (eng.name, m.model, name)
                    seen[name], hmem = histogram_increase(
                        self._histograms.get(key), getattr(m, name), m.histogram_parts.get(name)
                    )
                    if hmem is not None:
                        self._histograms[key] = hmem
                out[m.model] = _ModelStep(m, inc, seen)
        else:
            for name in self._known_models.get(eng.name, ()):  # an engine never up has none
                out[name] = _ModelStep(None, {})
        return out

    def _counter(
        self, engine: str, m: ModelSignals, name: str, now: float, ceiling: float | None, restarted: bool
    ) -> tuple[float | None, CounterMemory | None]:
        """One counter of one model read against its memory (:func:`counter_increase`); the memory is
        not kept here."""
        return counter_increase(
            self._counters.get((engine, m.model, name)),
            getattr(m, name),
            m.counter_parts.get(name),
            now,
            ceiling,
            m.counter_parts.get(name + CREATED),
            next(iter(m.counter_parts.get(STARTED, {}).values()), None),
            restarted,
        )

    def _note_refused(self, key: tuple[str, str, str], refused: Mapping[str, str]) -> None:
        """Flag this tick's refused counter series; one log line per series and reason, ever."""
        for series, why in refused.items():
            self._refused.append(f"{'/'.join(key)}/{series or key[2]} ({why})")
            once = (*key, series, why)
            if once not in self._refused_logged:
                self._refused_logged.add(once)
                logger.warning(
                    "engine %s, model %s: counter %s series %s refused (%s): it counts nothing until it "
                    "reads as a counter again",
                    key[0],
                    key[1],
                    key[2],
                    series or key[2],
                    why,
                )

    def _log_unpriced(self, charges: Mapping[str, GpuCharge]) -> None:
        for uuid, c in charges.items():
            if not c.priced and uuid not in self._unpriced_logged:
                self._unpriced_logged.add(uuid)
                logger.warning(
                    "GPU %s (%s) has no price in %s: its cost is unknown (ratios absent)",
                    uuid,
                    c.reading.sample.name,
                    self.prices.source,
                )

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
        self._refused = []
        if start is None or now <= start:
            for e in self.engines:
                self._model_steps(e, scrapes.get(e.name), now)  # the counters' first readings
            self._remember(now, scrapes)
            return TickResult(start=now, end=now)
        dt = now - start

        readings = self._readings(start, now)
        charges = price_gpus(readings, self.prices, self.node, start, now)
        self._log_unpriced(charges)

        samples = {u: r.sample for u, r in readings.items()}
        held = {e.name: engine_gpus(e, samples) for e in self.engines}
        steps = {
            e.name: self._model_steps(
                e, scrapes.get(e.name), now, _ceilings(e, [samples[u].name for u in held[e.name]])
            )
            for e in self.engines
        }
        tokens = {
            name: [
                ModelTokens(m, st.inc("prompt_tokens_total") or 0.0, st.inc("generation_tokens_total") or 0.0)
                for m, st in models.items()
            ]
            for name, models in steps.items()
        }
        bounds = {u: _bound_of(self._acc.get(u, [])) if r.seen else None for u, r in readings.items()}
        att = attribute(self.engines, held, tokens, charges, self.prices, self.share_policy, dt, bounds)

        specs = {e.name: e for e in self.engines}
        kinds = {name: sc.kind for name, sc in scrapes.items()}
        windows = [
            self._window(
                specs[mc.engine], mc, steps[mc.engine][mc.model], charges, versions, kinds, start, now
            )
            for mc in att.models
        ]
        gpus = [
            GpuTick(
                sample=c.reading.sample,
                seconds=dt,
                usd_per_hour=c.usd_per_hour,
                cost_usd=c.cost_usd,
                idle_usd=max(0.0, c.cost_usd - att.used_usd[u]),
                energy_joules=c.energy_joules,
                util_ratio=c.reading.util_ratio,
                bw_ratio=c.reading.bw_ratio,
                power_watts=c.reading.mean_power_watts if c.reading.seen else None,
                unallocated_usd=max(0.0, c.cost_usd - att.allocated_usd[u]),
                estimated=c.estimated,
            )
            for u, c in charges.items()
        ]
        read = {e.name: _is_up(scrapes.get(e.name)) for e in self.engines}
        self._down_since, back = outages(read, self._known_models, self._down_since, start)
        self._remember(now, scrapes)
        return TickResult(
            start,
            now,
            tuple(windows),
            tuple(gpus),
            att.engine_usd,
            tuple(self._refused),
            down_since=dict(self._down_since),
            gap_since=back,
            engine_gpu_usd=att.engine_gpu_usd,
        )

    def _window(
        self,
        spec: EngineSpec,
        mc: ModelCharge,
        st: _ModelStep,
        charges: Mapping[str, GpuCharge],
        versions: Mapping[str, str],
        kinds: Mapping[str, str],
        start: float,
        now: float,
    ) -> CostWindow:
        cur = st.cur
        p_tok = st.inc("prompt_tokens_total") or 0.0
        g_tok = st.inc("generation_tokens_total") or 0.0
        ttft, itl, e2e = (st.observed.get(name) for name in HISTOGRAMS)
        sc_kind = kinds.get(spec.name) or spec.kind
        decode_s = st.inc("decode_seconds_total")
        queue_s, compute_s = st.inc("queue_seconds_total"), st.inc("compute_seconds_total")
        usage = UsageWindow(
            node=self.node,
            engine=spec.name,
            model=mc.model,
            model_version=versions.get(spec.name) or spec.version_of(mc.model),
            start=start,
            end=now,
            prompt_tokens=p_tok,
            generation_tokens=g_tok,
            gpu_seconds=mc.gpu_seconds,
            energy_joules=mc.energy_joules,
            gpu_util_ratio=_mean(charges[u].reading.util_ratio for u in mc.gpus),
            mem_bw_ratio=_mean(charges[u].reading.bw_ratio for u in mc.gpus),
            power_watts=mc.power_watts,
            requests_running=_running(cur, sc_kind, decode_s, now - start),
            kv_cache_usage_ratio=cur.kv_cache_usage_ratio if cur else None,
            preemptions=st.inc("preemptions_total"),
            ttft_p99_seconds=_p99(ttft),
            itl_p99_seconds=_p99(itl),
            ttft_delta=ttft,
            itl_delta=itl,
            e2e_delta=e2e,
            requests_waiting=cur.requests_waiting if cur else None,
            gpu_model=", ".join(sorted({charges[u].reading.sample.name for u in mc.gpus})) or None,
            throttled_gpu_seconds=mc.throttled_gpu_seconds,
            priority_class=spec.class_of(mc.model),
            prefill_seconds=st.inc("prefill_seconds_total"),
            decode_seconds=decode_s,
            cached_prompt_tokens=st.inc("cached_prompt_tokens_total"),
            # a token counter read once (now, or before an outage) is remembered until the model
            # expires: only a model whose engine never exposed one has its tokens absent
            tokens_counted=any((spec.name, mc.model, n) in self._counters for n in TOKEN_COUNTERS),
            queue_seconds=queue_s,
            compute_seconds=compute_s,
            # the requests those cover only where both were read: a page (or a tick, one counter
            # refused) without one would make its mean 0 seconds instead of absent
            timed_requests=st.inc("timed_requests_total")
            if queue_s is not None and compute_s is not None
            else None,
        )
        cost = mc.cost_usd
        tokens = p_tok + g_tok
        prompt_usd = prompt_cost(cost, usage.prefill_seconds, usage.decode_seconds) if tokens > 0 else None
        names = [charges[u].reading.sample.name for u in mc.gpus]
        roof, prefill = _efficiency(usage, cur, sc_kind, spec, names)
        floor = _floor(usage, cur, spec, names, cost, sc_kind)
        return CostWindow(
            usage=usage,
            gpu_time_usd=mc.time_usd,
            energy_usd=mc.energy_usd,
            usd_per_1m_output=usd_per_million(cost, g_tok) if mc.priced else None,
            usd_per_1m_total=usd_per_million(cost, tokens) if mc.priced else None,
            idle_usd=cost if tokens <= 0 else 0.0,
            priced=mc.priced,
            roofline_ratio=roof,
            estimated=mc.estimated,
            prompt_usd=prompt_usd,
            usage_usd=mc.usage_usd,
            prefix_cache_saved_usd=prefix_cache_saved(prompt_usd, p_tok, usage.cached_prompt_tokens),
            floor_usd_per_1m_output=floor.usd_per_1m_at_batch if floor and mc.priced else None,
            floor_usd_per_1m_output_max_batch=floor.usd_per_1m_at_max_batch if floor and mc.priced else None,
            bound_gpu_seconds=mc.bound_gpu_seconds,
            bound_usd=mc.bound_usd,
            prefill_share_ratio=prefill[0] if prefill else None,
            prefill_share_floor_ratio=prefill[1] if prefill else None,
        )

    # ------------------------------------------------------------------ internals
    def _remember(self, now: float, scrapes: Mapping[str, EngineScrape]) -> None:
        """Keep what the next tick needs: the models each engine served, each GPU's last good reading,
        mean power and energy counter; then start a new tick."""
        self._last_tick = now
        for name, sc in scrapes.items():
            if sc.up and sc.models:
                self._known_models[name] = tuple(m.model for m in sc.models)
                for m in sc.models:
                    self._model_seen[(name, m.model)] = now
        self._expire(now)
        for uuid, samples in self._acc.items():
            up = [s for s in samples if s.up]
            if not up:
                continue
            self._seen[uuid] = up[-1]
            watts = _mean(s.power_watts for s in up)
            if watts is not None:
                self._power[uuid] = watts
            if samples[-1].energy_joules is not None:
                self._last_energy[uuid] = (samples[-1].energy_joules, now)
        self._acc = {}

    def _expire(self, now: float) -> None:
        """Forget the models not read for ``series_ttl_seconds`` and the engines no longer listed (a
        down engine's models stay: its outage's windows still carry them)."""
        listed = {e.name for e in self.engines}
        cutoff = now - self.series_ttl_seconds
        old = {
            k
            for k, t in self._model_seen.items()
            if k[0] not in listed or (t < cutoff and k[0] not in self._down_since)
        }
        gone = [e for e in self._known_models if e not in listed]
        if not old and not gone:
            return
        for key in old:
            del self._model_seen[key]
        self.expired_models += len(old)
        self._counters = {k: v for k, v in self._counters.items() if k[:2] not in old}
        self._histograms = {k: v for k, v in self._histograms.items() if k[:2] not in old}
        self._refused_logged = {k for k in self._refused_logged if k[:2] not in old}
        for engine in gone:
            del self._known_models[engine]
            self._down_since.pop(engine, None)
        for engine, models in list(self._known_models.items()):
            kept = tuple(m for m in models if (engine, m) not in old)
            if kept != models:
                self._known_models[engine] = kept

    @property
    def remembered_models(self) -> int:
        """(engine, model) pairs whose counters are remembered (for tests and the bench)."""
        return len({k[:2] for k in self._counters} | {k[:2] for k in self._histograms})


def _is_up(scrape: EngineScrape | None) -> bool:
    return scrape is not None and scrape.up


def outages(
    read: Mapping[str, bool],
    known: Mapping[str, tuple[str, ...]],
    down_since: Mapping[str, float],
    start: float,
) -> tuple[dict[str, float], dict[str, float]]:
    """(engines down after this tick → since when, engines back this tick → since when they were
    down). ``read``: engine → read this tick; ``known``: engines with models seen (only those have
    windows to idle); ``start``: the tick's start (epoch seconds)."""
    down: dict[str, float] = {}
    back: dict[str, float] = {}
    for name, up in read.items():
        if up:
            if name in down_since:
                back[name] = down_since[name]
        elif name in known:
            down[name] = down_since.get(name, start)
    return down, back


def _ceilings(spec: EngineSpec, gpu_names: Sequence[str]) -> dict[str, float]:
    """The most each bounded counter of an engine can grow per second on its hardware (GPUs held,
    or configured when unread)."""
    gen = generation_ceiling(gpu_names, spec.weights_bytes, len(spec.gpus))
    prompt = prompt_ceiling(gpu_names, len(spec.gpus))
    return {**dict.fromkeys(GENERATION_BOUNDED, gen), **dict.fromkeys(PROMPT_BOUNDED, prompt)}


def _bound_of(samples: Sequence[GpuSample]) -> dict[str, float] | None:
    """Where one GPU's time went this tick (:mod:`agent.cost.bound`), from the means of its GPM
    readings; None for a MIG instance (links are per board), a GPU not in the hardware table, or
    one whose GPM did not answer."""
    up = [s for s in samples if s.up]
    if not up or up[-1].mig_parent_uuid is not None:
        return None
    spec = gpu_spec(up[-1].name)
    if spec is None:
        return None
    gpm = GpmActivity(
        sm_active_ratio=_mean(s.sm_active_ratio for s in up),
        tensor_active_ratio=_mean(s.tensor_active_ratio for s in up),
        dram_bw_ratio=_mean(s.dram_bw_ratio for s in up),
        pcie_rx_bytes_per_s=_mean(s.pcie_rx_bytes_per_s for s in up),
        pcie_tx_bytes_per_s=_mean(s.pcie_tx_bytes_per_s for s in up),
        nvlink_rx_bytes_per_s=_mean(s.nvlink_rx_bytes_per_s for s in up),
        nvlink_tx_bytes_per_s=_mean(s.nvlink_tx_bytes_per_s for s in up),
    )
    return bound_shares(gpm, spec.pcie_bytes_per_s, spec.nvlink_bytes_per_s)


def _running(
    cur: ModelSignals | None, kind: str, decode_seconds: float | None, seconds: float
) -> float | None:
    """Requests running over the window: the gauge as read, or over a coarse window (history at
    5-minute steps) the mean batch from the engine's decode request-seconds, where it has them
    (:func:`agent.cost.efficiency.mean_decode_batch`): one instant of a bursty 5 minutes put a
    minute in the wrong load band of the like-for-like rules."""
    if cur is None:
        return None
    batch = mean_decode_batch(kind, decode_seconds, seconds)
    return cur.requests_running if batch is None else batch


def _efficiency(
    usage: UsageWindow, cur: ModelSignals | None, kind: str, spec: EngineSpec, gpu_names: Sequence[str]
) -> tuple[float | None, tuple[float, float] | None]:
    """Decode efficiency of one model window (:mod:`agent.cost.efficiency`) and, where it is known,
    the prefill shares its step had (:func:`agent.cost.explain.prefill_shares`); None when unknown."""
    if cur is None:
        return None, None
    ranks = len(cur.counter_parts.get("generation_tokens_total", {})) or 1
    obs = DecodeObservation(
        engine_kind=kind,
        generation_tokens=usage.generation_tokens,
        decode_seconds=usage.decode_seconds,
        requests_running=cur.requests_running,
        kv_cache_usage_ratio=usage.kv_cache_usage_ratio,
        kv_capacity_tokens=cur.kv_capacity_tokens,
        replicas=ranks,
        bandwidth_bytes_per_s=_all_known(bandwidth_of(n) for n in gpu_names) or 0.0,
        window_seconds=usage.duration,
        itl_seconds=usage.itl_delta.sum if usage.itl_delta is not None else None,
        itl_count=usage.itl_delta.count if usage.itl_delta is not None else None,
        prefill_tokens=(
            None
            if usage.cached_prompt_tokens is None
            else max(0.0, usage.prompt_tokens - usage.cached_prompt_tokens)
        ),
        peak_flops_per_s=_all_known(peak_flops_of(n) for n in gpu_names) or 0.0,
        prefill_seconds=usage.prefill_seconds,
        finished_requests=usage.e2e_delta.count if usage.e2e_delta is not None else None,
        first_tokens=usage.ttft_delta.count if usage.ttft_delta is not None else None,
    )
    figures = ModelFigures(
        spec.weights_bytes, spec.kv_bytes_per_token, spec.kv_capacity_tokens, spec.flops_per_token
    )
    parts = decode_efficiency_parts(obs, figures)  # once a tick: the efficiency and its prefill share
    if parts is None:
        return None, None
    return parts[0], prefill_shares(obs, figures, usage.prefill_seconds, parts)


def _all_known(values: Iterable[float | None]) -> float | None:
    """The sum of per-GPU figures, or None when any GPU's is unknown (a partial sum would be a
    ceiling below the hardware's, and a floor or efficiency read against it would be wrong)."""
    total = 0.0
    for v in values:
        if v is None:
            return None
        total += v
    return total


def _floor(
    usage: UsageWindow,
    cur: ModelSignals | None,
    spec: EngineSpec,
    gpu_names: Sequence[str],
    cost: float,
    kind: str = "",
) -> CostFloor | None:
    """The cost floor of one window (:mod:`agent.cost.floor`): the model's dollars per second over
    the ceiling of its engine's GPUs at the running batch, the batch and resident KV the decode
    efficiency reads (``kind``: the engine kind, whose decode time says whether it has a
    counter-derived batch); None without the model's weights."""
    if cur is None or not spec.weights_bytes:  # (a tick always has a duration > 0)
        return None
    bandwidth = _all_known(bandwidth_of(n) for n in gpu_names)
    if bandwidth is None:  # a GPU the table does not know: its ceiling is unknown, not 0 bytes/s
        return None
    ranks = len(cur.counter_parts.get("generation_tokens_total", {})) or 1
    capacity = cur.kv_capacity_tokens or spec.kv_capacity_tokens
    kv = usage.kv_cache_usage_ratio
    resident = kv * capacity if kv is not None and capacity else 0.0
    # the batch and the resident KV the decode efficiency reads (agent.cost.efficiency): sequences
    # from the window's inter-token intervals (else its decode request-seconds), context per sequence
    # from the gauges' instant; so the floor's roofline step is the efficiency's, and the explain
    # chain's product (floor ÷ efficiency) is the step as run per sequence, not that step times the
    # ratio of one instant's KV to the window's
    itl = usage.itl_delta.sum if usage.itl_delta is not None else None
    batch = mean_decode_batch(kind, usage.decode_seconds, usage.duration, itl)
    if batch is not None and cur.requests_running and capacity:
        resident = min(capacity, resident * batch / cur.requests_running)
    return cost_floor(
        cost / usage.duration,
        spec.weights_bytes,
        bandwidth,
        replicas=ranks,
        running=batch if batch is not None else usage.requests_running,
        resident_kv_tokens=resident,
        kv_bytes_per_token=spec.kv_bytes_per_token,
        kv_capacity_tokens=capacity,
        generated_per_second=usage.generation_tokens / usage.duration,
    )
