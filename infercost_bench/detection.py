"""``infercost bench detection``: detectors graded on their worst case, through the real agent path.

For each traffic model (:mod:`infercost_sim.workload`'s core and :mod:`infercost_sim.azure`'s independent
one), each seed and each of three nodes (physics randomised per node; node 2 read at 5-minute ticks,
node 1 of each model's first seed scraped every 15 s, the rest every 60 s), weeks of simulated engine
state are rendered into the samples the vLLM adapter and the NVML sampler produce
(:mod:`infercost_sim.samples`: requests drawn per rank, gauges one instant at each scrape) and
run, offline and in process (no HTTP, no sleeping), through
the daemon's own :class:`~agent.cost.window.WindowJoiner`, :class:`~agent.store.Store`, isolation
forest (refitted daily and once a new version has settled, scores written to the store) and
detection :class:`~agent.detect.pipeline.Pipeline` (rules, alert lifecycle, deploy attribution); the
store also holds the engine scrapes, NVML rounds and GPU dollars, so the source rules (``engine_down``,
``nvml_down``, ``gpu_lost``) run and are scored with the rest: an engine outage of ≥ 5 minutes is an
incident ``engine_down`` must page (an event in it is its page, not a false alarm), and each graded
week has failed scrapes of 1–2 minutes that must not page.
One pipeline evaluates every rule; detectors are sets of rules:

- ``literal``: the source documents' rule taken literally, "$/1M output tokens > 1.5 × its
  7-day mean for 15 minutes" (no load awareness);
- ``defaults``: the shipped default rule set (``rules/agent/*.yaml``) without the forest rule;
- ``forest``: the isolation forest alone, through the shipped rule over ``anomaly_score``;
- ``combined``: the default rules plus that forest rule.

Scoring counts alert *events*, not rows: the firing intervals of a detector's rules on a node are
merged (as Alertmanager grouping by node would page once), and each merged interval is one event.
An event that starts within a regression (or ``grace`` after its end) detects it; any other event
is a false alarm. Recall targets count regressions by their **realised** change in cost per token
(actual ÷ healthy counterfactual over the incident's busier-than-median minutes), not their nominal
factor. Delay runs from the first minute the realised cost per token is 1.2× up (≥ 10 % up for
regressions that never reach 1.2×; see :func:`onset`; the delay from 10 % up is printed too); dollars before
detection are the regression's excess cost from its start to its detection (all of it if missed).
The first week (baselines filling) is not scored. The table gives, per detector and per rule, the
worst and the median over (traffic model, seed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import multiprocessing
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from agent.clock import ManualClock
from agent.cost.invariants import counters_read_at, violations
from agent.cost.window import WindowJoiner
from agent.detect.deploys import record_deploy
from agent.detect.forest import ForestDetector
from agent.detect.pipeline import Pipeline
from agent.detect.rules import RuleSet, load_default_rules, parse_rules
from agent.records import window_from_record
from agent.samples import CostWindow, EngineScrape, NvmlRound
from agent.store import GpuCostSpan, Store, gpu_cost_spans
from infercost_sim.samples import ENGINE, engine_config, price_book_of, ticks
from infercost_sim.workload import (
    DAY,
    HOUR,
    MINUTE,
    TARGET_FACTOR,
    WEEK,
    Incident,
    SimulatedNode,
    simulate_node,
)

logger = logging.getLogger(__name__)

DETECTORS = ("literal", "defaults", "forest", "combined")
GRACE_SECONDS = 1800.0  # an alert up to 30 min after a regression ended still counts as its detection
# The default grid: 5 seeds per traffic model × 3 nodes × DEFAULT_WEEKS. Why 2 weeks: the run must
# take ≤ 5 minutes on the 2-core machine (2 workers), and its cost grows with the node-weeks (each
# week after the first costs more: the forest then trains on a full week), so a third week does not
# fit; the run prints its CPU seconds per phase. The first week fills the baselines, so each node
# is graded on one week. ``--quick`` (CI: one seed per model) runs QUICK_WEEKS, the default's 2:
# the three nodes of a seed place the week's incident groups in three orders (``schedule``'s
# rotation), so one graded week per node already has every incident kind, the price-book change
# included, on one of them; a third and fourth week doubled CI's run for the same kinds. The pooled
# figures the targets are about (≥ 15 evaluated node-weeks) are the default run's, not CI's.
DEFAULT_WEEKS = 2
# The seeds, named here once (elsewhere the code says "the tuning seeds", "the seen seeds"):
# - the tuning seeds, 1–5, 11–13, 21–25, 31–35, 41–45, 51–55 and 61–65: the rules' and the forest's
#   defaults, and the constants whose comments say "chosen on the tuning seeds", were chosen on them;
# - the seen seeds, 91–95 and 101–105: read for the causes of their false alarms (and the forest's
#   GROUP_GATE chosen on them), so no longer a fair test either;
# - the held-out seeds, 111–115 (HELD_OUT_SEED on): never used to choose a default, so the default
#   run (the figures ``--write-results`` puts in benchmarks/RESULTS.md) grades on cases nothing
#   was fitted to;
# - the quick seed, 7 (QUICK_SEED): ``--quick``'s, the same every CI run so its table can be compared
#   run to run.
HELD_OUT_SEED = 111
# An engine outage this long is an incident to page (engine_down must fire); a failed scrape of a
# minute or two is not. Why 5 minutes: past a GC pause or an exporter restart (seconds to a minute
# or two), and the longest gap the source documents call an outage to act on.
OUTAGE_PAGE_MINUTES = 5
BLIPS_PER_WEEK = 4  # engine scrape failures of 1–2 minutes per graded week (each must not page)
FINE_SCRAPE_SECONDS = 15.0  # the scrape interval of one node per traffic model (vLLM docs' example: 5–15 s)
QUICK_WEEKS = DEFAULT_WEEKS
QUICK_SEED = 7
# Rules scored on their own in the table (the cost and efficiency rules; the others guard health).
SCORED_RULES = (
    "cost_per_token_regression",
    "price_increase",
    "roofline_efficiency_drop",
    "cost_anomaly",
    "ttft_p99_high",
    "kv_cache_saturated",
    "gpu_underutilised",
    "cost_per_token_ceiling",
)


class NodeTruth(Protocol):
    """What scoring needs of a simulated node (its start, length, incidents and excess dollars)."""

    @property
    def start(self) -> float: ...  # seconds since the epoch
    @property
    def minutes(self) -> int: ...
    @property
    def incidents(self) -> tuple[Incident, ...]: ...
    @property
    def excess_usd_per_minute(self) -> np.ndarray: ...


LITERAL_RULE: Mapping[str, Any] = {
    "id": "literal_1_5x_7d_mean",
    "signal": "usd_per_1m_output_tokens",
    "over": "1m",
    "op": ">",
    "baseline": {"window": "7d", "stat": "mean", "across_versions": True, "min_minutes": 60},
    "factor": 1.5,
    "for": "15m",
    "keep_firing_for": "0s",
    "severity": "warning",
    "summary": "literal 1.5 × 7-day mean",
}

FOREST_ID = "cost_anomaly"  # the shipped rule over the forest's scores (its why: rules/agent/default.yaml)


@dataclass(frozen=True, slots=True)
class DetectorScore:
    """How one detector did over a set of nodes."""

    detector: str
    regressions: int  # labelled regressions scored
    detected: int
    regressions_target: int  # regressions of ≥ TARGET_FACTOR
    detected_target: int
    delays_minutes: tuple[float, ...]  # per detected regression, minutes from its onset (see onset())
    false_alarms: int  # events matching no regression
    node_weeks: float  # evaluated node-weeks
    usd_before_detection: float  # dollars of excess cost before detection (all regressions)
    false_alarms_by_cause: Mapping[str, int] = field(default_factory=dict)
    missed: tuple[str, ...] = ()  # "kind ×factor" of each missed regression
    # per detected regression, minutes from the first minute its cost per token was 10 % up
    delays_from_visible_minutes: tuple[float, ...] = ()
    # per detected regression realised ≥ TARGET_FACTOR (the recall target's), minutes from its onset
    delays_target_minutes: tuple[float, ...] = ()

    @property
    def recall(self) -> float | None:
        """Share of regressions detected (None when there were none)."""
        return self.detected / self.regressions if self.regressions else None

    @property
    def recall_target(self) -> float | None:
        """Share of regressions of ≥ 1.2× detected."""
        return self.detected_target / self.regressions_target if self.regressions_target else None

    @property
    def median_delay_minutes(self) -> float | None:
        """Median detection delay in minutes."""
        return float(np.median(self.delays_minutes)) if self.delays_minutes else None

    @property
    def median_delay_from_visible_minutes(self) -> float | None:
        """Median detection delay in minutes, clocked from the first minute 10 % up."""
        ds = self.delays_from_visible_minutes
        return float(np.median(ds)) if ds else None

    @property
    def median_delay_target_minutes(self) -> float | None:
        """Median detection delay in minutes of the regressions realised ≥ 1.2× (those the recall
        target counts; the table's delay counts every detected regression, smaller ones included)."""
        ds = self.delays_target_minutes
        return float(np.median(ds)) if ds else None

    @property
    def p90_delay_minutes(self) -> float | None:
        """90th-percentile detection delay in minutes."""
        return float(np.quantile(self.delays_minutes, 0.9)) if self.delays_minutes else None

    @property
    def false_alarms_per_node_week(self) -> float | None:
        """False alarm events per node-week."""
        return self.false_alarms / self.node_weeks if self.node_weeks > 0 else None


# ---------------------------------------------------------------------------------------------
# Scoring (pure)
# ---------------------------------------------------------------------------------------------


def merge_intervals(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Merge overlapping or touching (start, end) intervals; the result is sorted."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


@dataclass(frozen=True, slots=True)
class NodeOutcome:
    """One detector on one node: matched detections and false alarms."""

    detections: Mapping[int, float]  # regression index → first event time (epoch seconds)
    false_alarms: tuple[float, ...]  # event times (epoch seconds)


def match_events(
    events: Sequence[float], incidents: Sequence[Incident], grace: float = GRACE_SECONDS
) -> NodeOutcome:
    """Match alert event start times to regressions: the first event in [start, end + grace] of a
    regression detects it; events outside every regression are false alarms (events inside a
    benign incident are false alarms too)."""
    detections: dict[int, float] = {}
    false_alarms: list[float] = []
    for t in sorted(events):
        hit = False
        for i, inc in enumerate(incidents):
            if inc.regression and inc.start <= t <= inc.end + grace:
                hit = True
                detections.setdefault(i, t)
        if not hit:
            false_alarms.append(t)
    return NodeOutcome(detections, tuple(false_alarms))


def excess_before(
    excess_per_minute: np.ndarray, sim_start: float, inc: Incident, detected_at: float | None
) -> float:
    """Dollars of excess cost from the regression's start to its detection (or its end if missed)."""
    a = int((inc.start - sim_start) // MINUTE)
    stop = inc.end if detected_at is None else min(detected_at, inc.end)
    b = int((stop - sim_start) // MINUTE)
    return float(np.clip(excess_per_minute[a:b], 0.0, None).sum()) if b > a else 0.0


def false_alarm_cause(t: float, incidents: Sequence[Incident], grace: float = GRACE_SECONDS) -> str:
    """Which benign event a false alarm falls in (or 'normal traffic')."""
    for inc in incidents:
        if not inc.regression and inc.start <= t <= inc.end + grace:
            return inc.kind
    return "normal traffic"


def outside_outages(events: Sequence[float], sim: object, grace: float = GRACE_SECONDS) -> list[float]:
    """The events that do not start in an engine outage to page (``sim.outages``, or up to ``grace``
    after one): those are the outage's page, neither a false alarm nor a regression's detection."""
    outages = getattr(sim, "outages", ())
    return [e for e in events if not any(a <= e <= b + grace for a, b in outages)]


def outage_pages(runs: Sequence[NodeRun], warmup: float) -> tuple[int, int, list[float], int]:
    """(outages paged by ``engine_down``, outages, minutes from each outage's start to its page,
    ``engine_down`` events outside every outage: false pages, failed scrapes of a minute or two
    among them)."""
    paged = n = false = 0
    delays: list[float] = []
    for r in runs:
        t0 = r.start + warmup
        starts = [a for a, _ in merge_intervals(r.intervals.get("engine_down", ())) if a >= t0]
        for a, b in r.outages:
            if a < t0:
                continue
            n += 1
            hit = [e for e in starts if a <= e <= b + GRACE_SECONDS]
            if hit:
                paged += 1
                delays.append((hit[0] - a) / MINUTE)
        false += sum(1 for e in starts if not any(a <= e <= b + GRACE_SECONDS for a, b in r.outages))
    return paged, n, delays, false


def onset(inc: Incident) -> float:
    """When a regression's detection clock starts (epoch seconds): the first minute its cost per
    token is TARGET_FACTOR up when it ever is (a step: its deploy; a drift over days: the minute it
    has grown to the size the targets are about), else the first minute it is 10 % up.

    Why not always 10 % up: a drift takes hours to grow from 1.1× to 1.2×, and no detector here is
    meant to alert much below 1.2× (the cost rule's factor sits there so that the everyday wander
    does not page); clocked from 1.1×, a drift's delay measures its slope, not the detector. Both
    clocks are printed."""
    if inc.realised >= TARGET_FACTOR - 1e-9 and inc.at_target is not None:
        return inc.at_target
    return inc.visible


def score_detector(
    detector: str,
    per_node: Sequence[tuple[Sequence[float], NodeTruth]],
    eval_start_offset: float,
) -> DetectorScore:
    """Score one detector's events (epoch seconds, one list per node) against each node's truth.

    Events before ``sim.start + eval_start_offset`` (the warm-up) are ignored.
    """
    regressions = detected = reg_t = det_t = false_alarms = 0
    delays: list[float] = []
    early: list[float] = []
    big_delays: list[float] = []
    usd = 0.0
    weeks = 0.0
    causes: dict[str, int] = {}
    missed: list[str] = []
    for events, sim in per_node:
        t0 = sim.start + eval_start_offset
        weeks += (sim.minutes * MINUTE - eval_start_offset) / WEEK
        incs = sim.incidents
        outcome = match_events(outside_outages([e for e in events if e >= t0], sim), incs)
        for i, inc in enumerate(incs):
            if not inc.regression or inc.start < t0:
                continue
            regressions += 1
            big = inc.realised >= TARGET_FACTOR - 1e-9
            reg_t += big
            at = outcome.detections.get(i)
            if at is not None:
                detected += 1
                det_t += big
                delays.append(max(0.0, at - onset(inc)) / MINUTE)
                early.append(max(0.0, at - inc.visible) / MINUTE)
                if big:
                    big_delays.append(delays[-1])
            else:
                missed.append(f"{inc.kind} ×{inc.realised:.2g}")
            usd += excess_before(sim.excess_usd_per_minute, sim.start, inc, at)
        false_alarms += len(outcome.false_alarms)
        for t in outcome.false_alarms:
            cause = false_alarm_cause(t, incs)
            causes[cause] = causes.get(cause, 0) + 1
    return DetectorScore(
        detector=detector,
        regressions=regressions,
        detected=detected,
        regressions_target=reg_t,
        detected_target=det_t,
        delays_minutes=tuple(delays),
        false_alarms=false_alarms,
        node_weeks=weeks,
        usd_before_detection=usd,
        false_alarms_by_cause=causes,
        missed=tuple(missed),
        delays_from_visible_minutes=tuple(early),
        delays_target_minutes=tuple(big_delays),
    )


# ---------------------------------------------------------------------------------------------
# Running the detectors
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeRun:
    """One simulated node run through the real path: its truth and every rule's firing intervals."""

    generator: str
    seed: int
    node: str
    start: float  # seconds since the epoch
    minutes: int
    tick_seconds: float
    incidents: tuple[Incident, ...]
    excess_usd_per_minute: np.ndarray
    intervals: Mapping[str, list[tuple[float, float]]]  # rule id → firing (start, end), epoch seconds
    annotations: Mapping[str, list[tuple[float, str]]]  # rule id → (fired at, price change named) per alert
    seconds: float  # wall-clock seconds the run took
    cpu_seconds: Mapping[str, float] = field(default_factory=dict)  # CPU seconds per phase (PHASES)
    max_efficiency: float = float("nan")  # the highest decode efficiency of any window (physically ≤ 1)
    efficiency_windows: int = 0  # windows with a decode efficiency
    invariant_ticks: int = 0  # ticks checked against the physical laws (agent.cost.invariants)
    invariant_violations: int = 0  # laws broken, summed over those ticks
    invariant_examples: tuple[str, ...] = ()  # the first few broken laws, as the checker words them
    outages: tuple[tuple[float, float], ...] = ()  # engine outages to page: (start, end) epoch seconds


def bench_rules() -> RuleSet:
    """The shipped default rules plus the literal rule (one pipeline evaluates them all)."""
    shipped = load_default_rules()
    literal = parse_rules({"rules": [dict(LITERAL_RULE)]}, "bench")
    return RuleSet((*shipped.rules, *literal), dict(shipped.sources))


class TrainingWindows:
    """The forest's training windows as read back from the store (what the daemon's fit process
    reads: ``store.records`` of the trailing ``training_seconds``, as windows), each minute read once.

    A model minute's record no longer changes once the windows up to ``now`` are written: the window
    join writes a minute's window once, windows of later ticks start at or after ``now``, and the
    anomaly score written back is not a training input. So the fit of each day reads only the
    minutes since the previous fit instead of the whole week again: the same windows in the same
    order (a test compares it with a full read)."""

    def __init__(self, store: Store, training_seconds: float) -> None:
        self.store = store
        self.training_seconds = training_seconds  # seconds
        self._held: deque[tuple[float, CostWindow]] = deque()  # (minute, window) in the store's order
        self._read_until = -math.inf  # epoch seconds: minutes before this were read already

    def at(self, now: float) -> list[CostWindow]:
        """The windows of minutes in [now − training_seconds, now), oldest first (``now`` never
        earlier than a previous call's)."""
        since = now - self.training_seconds
        for r in self.store.records(max(since, self._read_until), now, kinds=("model",)):
            self._held.append((r.minute, window_from_record(r)))
        self._read_until = max(self._read_until, now)
        while self._held and self._held[0][0] < since:
            self._held.popleft()
        return [w for _, w in self._held]


IN_MEMORY = Path(":memory:")  # SQLite's in-memory database, for the store
INVARIANT_EXAMPLES = 3  # broken laws a node-run keeps word for word (the count keeps the rest)

# The phases of a node-run whose CPU time the benchmark reports (where the time goes).
PHASES = ("simulate", "render", "join", "store", "forest_score", "forest_fit", "rules")


class _PhaseClock:
    """CPU seconds (this process) spent per phase; ``with clock("join"): ...`` adds to a phase."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self._phase = ""
        self._t0 = 0.0

    def __call__(self, phase: str) -> _PhaseClock:
        self._phase = phase
        return self

    def __enter__(self) -> None:
        self._t0 = time.process_time()

    def __exit__(self, *exc: object) -> None:
        self.seconds[self._phase] += time.process_time() - self._t0


async def _run_through_agent(
    sim: SimulatedNode, forest_seed: int, phases: _PhaseClock | None = None
) -> NodeRun:
    """Feed the node's samples through the real window join, store, forest and detection pipeline.

    The store is the daemon's SQLite schema and code on an in-memory database (``:memory:``): the
    same statements, without a file's journal writes. Alert events are counted, not delivered."""
    t0 = time.perf_counter()
    ph = phases or _PhaseClock()
    clock = ManualClock(sim.start)
    store = Store(IN_MEMORY, retention_days=60.0, clock=clock, deploys=record_deploy)
    rules = bench_rules()
    pipeline = Pipeline(store, clock, rules)  # the events are counted here, not delivered
    # The literal rule is the benchmark's yardstick, not a shipped rule: its alerts are counted,
    # never read, so their factor split (a week of minutes read back per alert) is not worked out.
    explain = pipeline.alerts.explain_lookup
    if explain is not None:
        pipeline.alerts.explain_lookup = lambda rule, f, deploy: (
            None if rule.id == LITERAL_RULE["id"] else explain(rule, f, deploy)
        )
    joiner = WindowJoiner(sim.node, [engine_config(sim).cost_spec()], price_book_of(sim).table())
    forest = ForestDetector(None, seed=forest_seed)
    intervals: dict[str, list[tuple[float, float]]] = {r.id: [] for r in rules}
    notes: dict[str, list[tuple[float, str]]] = {r.id: [] for r in rules}
    open_since: dict[str, tuple[str, float]] = {}
    pending: list[CostWindow] = []
    rounds: list[NvmlRound] = []  # the NVML rounds, engine scrapes and GPU dollars since the last flush
    scrapes: list[EngineScrape] = []
    gpu_spans: list[GpuCostSpan] = []
    last_fit = sim.start
    versions_seen: dict[str, float] = {}
    next_step = sim.start + HOUR
    training = TrainingWindows(store, forest.training_seconds)

    async def flush(now: float) -> None:
        nonlocal pending, last_fit
        with ph("store"):  # the daemon's whole history: the engine/NVML/GPU rules read these
            store.write_nvml_rounds(sim.node, rounds)
            store.write_engine_scrapes(sim.node, scrapes)
            store.write_gpu_spans(sim.node, gpu_spans)
        rounds.clear()
        scrapes.clear()
        gpu_spans.clear()
        if pending:
            with ph("store"):
                store.write_windows(pending)
            with ph("forest_score"):
                scores = forest.score_many(pending)
                for w, s in zip(pending, scores, strict=True):
                    if s is not None:
                        u = w.usage
                        store.write_anomaly_score(u.node, u.engine, u.model, u.model_version, u.start, s)
            for w in pending:
                versions_seen.setdefault(w.usage.model_version, w.usage.start)
            pending = []
        settle = [v + forest.version_settle_seconds for v in versions_seen.values()]
        if now - last_fit >= forest.refit_seconds or any(last_fit < s <= now for s in settle):
            with ph("forest_fit"):
                forest.fit(training.at(now), now)
            last_fit = now
        clock.advance(max(0.0, now - clock.now()))
        with ph("rules"):
            events = pipeline.step(now)
        for ev in events:
            key = ev.alert.dedup_key
            if ev.kind == "firing":
                open_since[key] = (ev.alert.rule_id, ev.at)
                notes[ev.alert.rule_id].append((ev.at, ev.alert.annotations.get("price_change", "")))
            elif ev.kind == "resolved" and key in open_since:
                rule_id, since = open_since.pop(key)
                intervals[rule_id].append((since, ev.at))

    readings = ticks(sim)
    top_efficiency, with_efficiency = float("nan"), 0
    read_at: dict[tuple[str, str], float] = {}  # (engine, model) → when its counter last counted
    checked = broken = 0
    examples: list[str] = []
    while True:
        with ph("render"):
            tick = next(readings, None)
        if tick is None:
            break
        with ph("join"):
            joiner.add_round(tick.nvml)
            result = joiner.close_tick(tick.t, {ENGINE: tick.scrape}, {ENGINE: tick.version})
            made = result.windows
            pending.extend(made)
            rounds.append(tick.nvml)
            scrapes.append(replace(tick.scrape, models=()))  # what history keeps of a scrape
            gpu_spans.extend(gpu_cost_spans(result))
        bad = violations(result, joiner.engines, joiner.prices, read_at)
        read_at = counters_read_at(read_at, result, {ENGINE: tick.scrape})
        checked, broken = checked + 1, broken + len(bad)
        examples.extend(bad[: max(0, INVARIANT_EXAMPLES - len(examples))])
        for w in made:
            if w.roofline_ratio is not None:
                with_efficiency += 1
                if not w.roofline_ratio <= top_efficiency:  # NaN until the first
                    top_efficiency = w.roofline_ratio
        if tick.t >= next_step:
            await flush(tick.t)
            next_step = tick.t + HOUR
    end = sim.start + sim.minutes * MINUTE
    await flush(end)
    for rule_id, since in open_since.values():
        intervals[rule_id].append((since, end))
    store.close()
    return NodeRun(
        sim.generator, -1, sim.node, sim.start, sim.minutes, sim.tick_seconds, sim.incidents,
        sim.excess_usd_per_minute, intervals, notes, time.perf_counter() - t0, dict(ph.seconds),
        top_efficiency, with_efficiency, checked, broken, tuple(examples),
    )  # fmt: skip


def run_node(job: tuple[str, int, int, float, float]) -> NodeRun:
    """One (generator, seed, node index, weeks, scrape seconds) job: simulate, run through the agent,
    return the outcome.

    The grid (:func:`node_grid`) reads most nodes at 60 s scrapes, one node per traffic model at 15 s
    and node 2 of every seed at 5-minute ticks (history imported at coarse steps). The three
    nodes of a seed place the incident groups in three orders (``schedule``'s rotation), so each
    case lands in the graded week of one of them, and which node has it turns with the seed.
    Besides the schedule's scrape gaps, each graded week has :data:`BLIPS_PER_WEEK` failed scrapes of
    1–2 minutes (a GC pause, an exporter restart): benign, they must not page."""
    generator, seed, index, weeks, scrape_s = job
    phases = _PhaseClock()
    with phases("simulate"):
        sim = simulate_node(
            generator, seed=seed * 100 + index, weeks=weeks, node=f"{generator}-{seed}-{index}",
            tick_seconds=scrape_s, rotation=(seed + index) % 3,
        )  # fmt: skip
        sim = with_blips(sim, np.random.default_rng([seed, index, 5]))
    out = asyncio.run(_run_through_agent(sim, seed, phases))
    return replace(out, seed=seed, outages=engine_outages(sim))


def node_grid(
    generators: Sequence[str], seeds: Sequence[int], nodes: int, weeks: float, fine: bool = True
) -> list[tuple[str, int, int, float, float]]:
    """The jobs: (generator, seed, node index, weeks, scrape seconds). Node 2 of every seed is
    history at 5-minute steps; with ``fine``, node 1 of each model's first seed is scraped every
    15 s (four times the ticks: ``--quick`` leaves it out to stay in CI's time); the rest every 60 s
    (the agent's default)."""
    out = []
    for g in generators:
        for s in seeds:
            for n in range(nodes):
                one = fine and n == 1 and s == seeds[0]
                scrape = 300.0 if n == 2 else (FINE_SCRAPE_SECONDS if one else MINUTE)
                out.append((g, s, n, weeks, scrape))
    return out


def with_blips(sim: SimulatedNode, rng: np.random.Generator) -> SimulatedNode:
    """The node with :data:`BLIPS_PER_WEEK` engine scrape failures of 1–2 minutes per graded week,
    each at least an hour from any incident (so they are scored as what they are)."""
    up = sim.drivers.engine_up.copy()
    busy = [
        (int((i.start - sim.start) // MINUTE) - 60, int((i.end - sim.start) // MINUTE) + 60)
        for i in sim.incidents
    ]
    first = int(7 * DAY // MINUTE)
    weeks = max(0, (sim.minutes - first) // int(WEEK // MINUTE))
    placed = 0
    for _ in range(200 * max(1, weeks)):
        if placed >= BLIPS_PER_WEEK * weeks:
            break
        a = int(rng.integers(first, sim.minutes - 3))
        b = a + int(rng.integers(1, 3))
        if all(b <= lo or a >= hi for lo, hi in busy):
            up[a:b] = False
            busy.append((a - 60, b + 60))
            placed += 1
    return replace(sim, drivers=replace(sim.drivers, engine_up=up))


def engine_outages(sim: SimulatedNode) -> tuple[tuple[float, float], ...]:
    """(start, end) epoch seconds of each engine outage of ≥ OUTAGE_PAGE_MINUTES while the agent ran:
    incidents to page (``engine_down``).

    An outage is what the agent can see of one: a run of failed scrapes, each standing for the
    scrape interval before it (a scrape at ``t`` that fails covers (t − interval, t]), so a run of
    n failed scrapes is n × interval long. At 60 s or 15 s scrapes that is the engine's own down
    minutes; at a 5-minute interval one failed scrape is already 5 minutes with no measurement (10
    between answered scrapes), whatever the engine did inside them: a failed scrape of a minute
    that a scrape lands in is an outage to page there (the agent cannot tell it from a longer one),
    one between two scrapes is not seen at all."""
    period = float(sim.tick_seconds)
    n_ticks = int(sim.minutes * MINUTE // period)
    times = np.arange(1, n_ticks + 1) * period  # seconds from the start: each scrape's moment
    minute_of = ((times - 1e-6) // MINUTE).astype(int)  # the minute each scrape reads (samples.ticks)
    ran = sim.drivers.agent_up[minute_of]
    failed = (~sim.drivers.engine_up[minute_of] & ran).tolist()
    out: list[tuple[float, float]] = []
    k = 0
    while k < n_ticks:
        if failed[k]:
            e = k
            while e < n_ticks and failed[e]:
                e += 1
            if (e - k) * period >= OUTAGE_PAGE_MINUTES * MINUTE:
                out.append((sim.start + times[k] - period, sim.start + times[e - 1]))
            k = e
        else:
            k += 1
    return tuple(out)


def detector_events(
    intervals: Mapping[str, list[tuple[float, float]]], rule_ids: Iterable[str]
) -> list[float]:
    """Alert events of a detector made of ``rule_ids``: merged firing intervals' start times."""
    merged = merge_intervals(iv for r in rule_ids for iv in intervals.get(r, ()))
    return [a for a, _ in merged]


def _fmt(v: float | None, spec: str, unit: str = "") -> str:
    return "n/a" if v is None else f"{v:{spec}}{unit}"


def format_table(scores: Sequence[DetectorScore]) -> list[str]:
    """The side-by-side table, one line per detector."""
    lines = [
        f"{'detector':<10} {'recall':>7} {'recall≥1.2×':>12} {'delay p50':>10} {'delay p90':>10} "
        f"{'false/node-wk':>14} {'$ before det.':>14}"
    ]
    for s in scores:
        rt = None if s.recall_target is None else 100 * s.recall_target
        r = None if s.recall is None else 100 * s.recall
        lines.append(
            f"{s.detector:<10} {_fmt(r, '6.1f', '%'):>7} {_fmt(rt, '11.1f', '%'):>12} "
            f"{_fmt(s.median_delay_minutes, '7.0f', ' m'):>10} {_fmt(s.p90_delay_minutes, '7.0f', ' m'):>10} "
            f"{_fmt(s.false_alarms_per_node_week, '14.2f'):>14} {s.usd_before_detection:>14.2f}"
        )
    return lines


REALISED_BINS: tuple[tuple[float, float], ...] = ((0.0, 1.1), (1.1, 1.2), (1.2, 1.5), (1.5, math.inf))


def _detector_rules(rules: RuleSet) -> dict[str, list[str]]:
    """Rule ids per detector. Only paging rules (severity warning or above) make a detector: an
    ``info`` finding (an under-used GPU, an idle-cost budget) is a report, not a regression alert."""
    paging = [r.id for r in rules if r.severity != "info"]
    defaults = [r for r in paging if r not in (LITERAL_RULE["id"], FOREST_ID)]
    return {
        "literal": [str(LITERAL_RULE["id"])],
        "defaults": defaults,
        "forest": [FOREST_ID],
        "combined": [*defaults, FOREST_ID],
    }


def _binned_recall(
    runs: Sequence[NodeRun], rule_ids: Sequence[str], warmup: float
) -> list[tuple[str, int, int]]:
    """(bin label, detected, regressions) by realised cost-per-token change, over all runs."""
    out = []
    for lo, hi in REALISED_BINS:
        det = n = 0
        for r in runs:
            t0 = r.start + warmup
            events = [e for e in detector_events(r.intervals, rule_ids) if e >= t0]
            outcome = match_events(events, r.incidents)
            for i, inc in enumerate(r.incidents):
                if inc.regression and inc.start >= t0 and lo <= inc.realised < hi:
                    n += 1
                    det += i in outcome.detections
        label = f"{lo:.1f}–{hi:.1f}×" if math.isfinite(hi) else f"≥ {lo:.1f}×"
        out.append((label, det, n))
    return out


def false_alarm_breakdown(
    runs: Sequence[NodeRun], rule_ids: Sequence[str], warmup: float
) -> dict[tuple[str, str, str], int]:
    """(traffic model, rule, cause) → false alarm events of the detector made of ``rule_ids``.

    A detector's event is a merged firing interval; the rule that raised it is the one whose own
    firing interval starts first in it (ties: every rule starting then, joined with "+")."""
    out: dict[tuple[str, str, str], int] = {}
    for r in runs:
        t0 = r.start + warmup
        events = outside_outages([e for e in detector_events(r.intervals, rule_ids) if e >= t0], r)
        for t in match_events(events, r.incidents).false_alarms:
            who = "+".join(
                sorted(rid for rid in rule_ids if any(a == t for a, _ in r.intervals.get(rid, ())))
            )
            key = (r.generator, who or "?", false_alarm_cause(t, r.incidents))
            out[key] = out.get(key, 0) + 1
    return out


def _price_named(runs: Sequence[NodeRun], warmup: float) -> tuple[int, int]:
    """(price regressions whose cost or price alert names the price change, price regressions)."""
    named = n = 0
    for r in runs:
        for inc in r.incidents:
            if inc.kind != "price_up" or inc.start < r.start + warmup:
                continue
            n += 1
            texts = [
                text
                for rule_id in ("price_increase", "cost_per_token_regression", FOREST_ID)
                for at, text in r.annotations.get(rule_id, ())
                if inc.start <= at <= inc.end + GRACE_SECONDS
            ]
            named += any("price book" in t for t in texts)
    return named, n


def _summary(
    values: Sequence[float | None], worst: Callable[[Sequence[float]], float]
) -> tuple[float | None, float | None]:
    xs = [v for v in values if v is not None]
    if not xs:
        return None, None
    return worst(xs), float(np.median(xs))


def format_worst_table(
    groups: Mapping[tuple[str, int], Mapping[str, DetectorScore]], names: Sequence[str]
) -> list[str]:
    """Worst and median over (generator, seed) groups, one line per detector or rule."""
    head = (
        f"{'detector / rule':<28} {'recall≥1.2× worst/med':>22} {'p50 delay worst/med':>20} "
        f"{'p90 delay worst/med':>20} {'false/node-wk worst/med':>24} {'$ before det. worst/med':>24}"
    )
    lines = [head]
    for name in names:
        scores = [g[name] for g in groups.values()]
        rt = _summary([None if s.recall_target is None else 100 * s.recall_target for s in scores], min)
        p50 = _summary([s.median_delay_minutes for s in scores], max)
        p90 = _summary([s.p90_delay_minutes for s in scores], max)
        fa = _summary([s.false_alarms_per_node_week for s in scores], max)
        usd = _summary([s.usd_before_detection for s in scores], max)

        def pair(v: tuple[float | None, float | None], spec: str, unit: str = "") -> str:
            return f"{_fmt(v[0], spec, unit)} / {_fmt(v[1], spec, unit)}"

        lines.append(
            f"{name:<28} {pair(rt, '.0f', ' %'):>22} {pair(p50, '.0f', ' m'):>20} "
            f"{pair(p90, '.0f', ' m'):>20} {pair(fa, '.2f'):>24} {pair(usd, '.0f'):>24}"
        )
    return lines


def pooled_targets(
    runs: Sequence[NodeRun], generators: Sequence[str], detectors: Mapping[str, list[str]], warmup: float
) -> dict[str, Any]:
    """The issue's targets as it states them: per traffic model, every seed's nodes pooled (recall
    and delays over all its regressions, false alarms over all its node-weeks), the worst model
    judged. The table above is stricter (the worst single seed, three node-weeks)."""
    figures: dict[str, dict[str, float | None]] = {}
    for gen in generators:
        mine = [r for r in runs if r.generator == gen]
        comb = score_detector(
            "combined", [(detector_events(r.intervals, detectors["combined"]), r) for r in mine], warmup
        )
        forest = score_detector(
            "forest", [(detector_events(r.intervals, detectors["forest"]), r) for r in mine], warmup
        )
        figures[gen] = {
            "recall_target": comb.recall_target,
            "median_delay_target_minutes": comb.median_delay_target_minutes,
            "false_alarms_per_node_week": comb.false_alarms_per_node_week,
            "forest_recall_target": forest.recall_target,
            "node_weeks": comb.node_weeks,
            "regressions_target": comb.regressions_target,
        }

    def worst(key: str, pick: Callable[[Sequence[float]], float]) -> float | None:
        xs = [v for f in figures.values() if (v := f[key]) is not None]
        return pick(xs) if xs else None

    def verdict(v: float | None, ok: Callable[[float], bool]) -> str:
        return "n/a" if v is None else ("met" if ok(v) else "MISSED")

    def pct(v: float | None) -> str:
        return "n/a" if v is None else f"{100 * v:.0f} %"

    lines = [
        "pooled per traffic model (the issue's targets: each model's seeds together, the worst model judged):"
    ]
    for gen, f in figures.items():
        lines.append(
            f"  {gen}: {f['node_weeks']:.0f} node-weeks, {f['regressions_target']:.0f} regressions ≥ 1.2×: "
            f"recall {pct(f['recall_target'])}, "
            f"p50 delay {_fmt(f['median_delay_target_minutes'], '.0f', ' m')}, "
            f"false alarms {_fmt(f['false_alarms_per_node_week'], '.2f')} per node-week, "
            f"forest alone {pct(f['forest_recall_target'])}"
        )
    rec, dly = worst("recall_target", min), worst("median_delay_target_minutes", max)
    fa, fo = worst("false_alarms_per_node_week", max), worst("forest_recall_target", min)
    lines.append(
        f"  worst model: recall {pct(rec)} (≥ 95 %: {verdict(rec, lambda v: v >= 0.95)}), p50 delay "
        f"{_fmt(dly, '.0f', ' m')} (≤ 15 m: {verdict(dly, lambda v: v <= 15)}), false alarms "
        f"{_fmt(fa, '.2f')} per node-week (≤ 0.5: {verdict(fa, lambda v: v <= 0.5)}), forest alone "
        f"{pct(fo)} (≥ 90 %: {verdict(fo, lambda v: v >= 0.9)})"
    )
    return {"figures": figures, "lines": lines}


@contextlib.contextmanager
def _one_blas_thread_each() -> Iterator[None]:
    """Worker processes started inside get one BLAS/OpenMP thread each (the variables are read
    when numpy loads). Why: the workers already share the machine's cores; OpenBLAS's own threads
    only spin waiting for work (the forest's least-squares fits are too small for threads to pay),
    and the results are the same."""
    names = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
    saved = {n: os.environ.get(n) for n in names}
    os.environ.update(dict.fromkeys(names, "1"))
    try:
        yield
    finally:
        for n, v in saved.items():
            if v is None:
                os.environ.pop(n, None)
            else:
                os.environ[n] = v


def run(
    seeds: int = 5,
    first_seed: int = 1,
    weeks: float = DEFAULT_WEEKS,
    nodes: int = 3,
    generators: Sequence[str] = ("core", "azure"),
    workers: int = 2,
    print_fn: Callable[[str], None] = print,
    progress: bool = True,
    fine_scrape: bool = True,
) -> dict[str, Any]:
    """Simulate ``nodes`` nodes × ``weeks`` per (generator, seed), run each through the real agent
    path, and print the worst-case and median table per detector and per rule.

    Returns the figures as a dict (worst and median per detector, binned recall, seconds).
    """
    t0 = time.perf_counter()
    warmup = 7 * DAY
    jobs = node_grid(generators, list(range(first_seed, first_seed + seeds)), nodes, weeks, fine_scrape)
    # the 15 s nodes first, the 5-minute ones (about half the work) last: both workers stay busy to
    # the end instead of one finishing a long run alone
    jobs.sort(key=lambda j: j[4])
    runs: list[NodeRun] = []
    columns = (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with (
        Progress(*columns, disable=not progress, transient=True) as bar,
        _one_blas_thread_each(),
        multiprocessing.get_context("spawn").Pool(max(1, workers)) as pool,
    ):
        task = bar.add_task("simulated node-runs", total=len(jobs))
        for r in pool.imap_unordered(run_node, jobs):
            runs.append(r)
            bar.advance(task)
    runs.sort(key=lambda r: (r.generator, r.seed, r.node))
    rule_ids = list(runs[0].intervals) if runs else []
    detectors = _detector_rules(bench_rules())
    names = [*DETECTORS, *[r for r in rule_ids if r in SCORED_RULES]]
    groups: dict[tuple[str, int], dict[str, DetectorScore]] = {}
    for r in runs:
        groups.setdefault((r.generator, r.seed), {})
    for key in groups:
        mine = [r for r in runs if (r.generator, r.seed) == key]
        for name in names:
            ids = detectors.get(name, [name])
            groups[key][name] = score_detector(
                name, [(detector_events(r.intervals, ids), r) for r in mine], warmup
            )
    seconds = time.perf_counter() - t0
    cpu = {p: sum(r.cpu_seconds.get(p, 0.0) for r in runs) for p in PHASES}  # CPU seconds per phase
    n_reg = sum(1 for r in runs for i in r.incidents if i.regression and i.start >= r.start + warmup)
    node_weeks = sum((r.minutes * MINUTE - warmup) / WEEK for r in runs)
    print_fn(
        f"infercost bench detection: {len(generators)} traffic models ({', '.join(generators)}) "
        f"× {seeds} seed(s) × {nodes} node(s) × {weeks:g} weeks through the real window join, store, "
        "forest and pipeline; "
        f"{n_reg} labelled regressions, {node_weeks:.1f} evaluated node-weeks (first week = warm-up); "
        "node 2 of each seed read at 5-minute ticks"
        + (f", node 1 of each model's first seed every {FINE_SCRAPE_SECONDS:.0f} s" if fine_scrape else "")
        + ", the rest every 60 s"
    )
    print_fn(
        "worst / median over (traffic model, seed); recall counts regressions whose realised cost per "
        "token rose ≥ 1.2×"
    )
    for line in format_worst_table(groups, names):
        print_fn(line)
    print_fn("recall by realised change in cost per token (all runs):")
    binned = {d: _binned_recall(runs, detectors[d], warmup) for d in ("defaults", "forest", "combined")}
    for d, rows in binned.items():
        print_fn(f"  {d:<9} " + "  ".join(f"{label}: {det}/{n}" for label, det, n in rows))
    paged, n_out, out_delays, false_pages = outage_pages(runs, warmup)
    print_fn(
        f"engine outages ≥ {OUTAGE_PAGE_MINUTES} min paged by engine_down: {paged}/{n_out} (delay p50 "
        f"{_fmt(float(np.median(out_delays)) if out_delays else None, '.0f', ' m')}); engine_down outside "
        f"every outage (failed scrapes of 1–2 min among them, {BLIPS_PER_WEEK} per node-week): {false_pages}"
    )
    named, n_price = _price_named(runs, warmup)
    print_fn(f"price-book regressions whose cost or price alert names the price change: {named}/{n_price}")
    for gen in generators:
        mine = [r for r in runs if r.generator == gen]
        tops = [r.max_efficiency for r in mine if r.efficiency_windows]
        present = sum(r.efficiency_windows for r in mine)
        print_fn(
            f"  {gen}: decode efficiency (physically ≤ 1) present in {present} windows, "
            f"highest {max(tops, default=float('nan')):.3f}"
        )
        first = next((x for r in mine for x in r.invariant_examples), None)
        print_fn(
            f"  {gen}: invariants: {sum(r.invariant_violations for r in mine)} violations over "
            f"{sum(r.invariant_ticks for r in mine)} ticks" + (f"; first: {first}" if first else "")
        )
    causes: dict[str, int] = {}
    missed: dict[str, int] = {}
    for g in groups.values():
        s = g["combined"]
        for k, v in s.false_alarms_by_cause.items():
            causes[k] = causes.get(k, 0) + v
        for m in s.missed:
            missed[m] = missed.get(m, 0) + 1
    fmt = lambda d: ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "none"  # noqa: E731
    print_fn(f"combined: false alarms by cause: {fmt(causes)}; missed: {fmt(missed)}")
    breakdown = false_alarm_breakdown(runs, detectors["combined"], warmup)
    for gen in generators:
        per_rule: dict[str, dict[str, int]] = {}
        for (model, rule_id, cause), v in breakdown.items():
            if model == gen:
                per_rule.setdefault(rule_id, {})[cause] = v
        fa_rows = "; ".join(f"{rid}: {fmt(c)}" for rid, c in sorted(per_rule.items())) or "none"
        print_fn(f"  {gen}: false alarms (combined) by the rule that raised them, by cause: {fa_rows}")
    early = _summary([g["combined"].median_delay_from_visible_minutes for g in groups.values()], max)
    worst_early, median_early = _fmt(early[0], ".0f", " m"), _fmt(early[1], ".0f", " m")
    print_fn(
        "combined: p50 delay clocked from the first minute 10 % up instead (drifts then count the hours "
        f"they take to grow to 1.2×): worst {worst_early} / median {median_early}"
    )
    big = _summary([g["combined"].median_delay_target_minutes for g in groups.values()], max)
    print_fn(
        "combined: p50 delay of the regressions realised ≥ 1.2× only (those the recall target counts; "
        f"the table counts every detected one): worst {_fmt(big[0], '.0f', ' m')} / median "
        f"{_fmt(big[1], '.0f', ' m')}"
    )
    pooled = pooled_targets(runs, generators, detectors, warmup)
    for line in pooled["lines"]:
        print_fn(line)
    print_fn(
        "targets on the worst case (combined, every paging rule including engine_down, nvml_down and "
        "gpu_lost): recall ≥ 95 % for realised ≥ 1.2×, median delay ≤ 15 m, ≤ 0.5 false alarms per "
        "node-week; forest alone ≥ 90 %; every engine outage ≥ 5 min paged, no failed scrape < 3 min; "
        f"the default run ≤ 10 min, --quick ≤ 3 min. Ran in {seconds:.0f} s "
        f"({sum(r.seconds for r in runs):.0f} s of node-runs on {workers} worker(s); "
        f"{sum(cpu.values()):.0f} CPU s: " + ", ".join(f"{k} {v:.0f}" for k, v in cpu.items()) + ")"
    )
    return {
        "seconds": seconds,
        "pooled": pooled["figures"],
        "cpu_seconds": cpu,
        "incidents": n_reg,
        "node_weeks": node_weeks,
        "price_named": [named, n_price],
        "outages_paged": [paged, n_out],
        "engine_down_false_pages": false_pages,
        "false_alarms_by_rule": {"/".join(k): v for k, v in sorted(breakdown.items())},
        "binned": {d: [list(x) for x in rows] for d, rows in binned.items()},
        "detectors": {
            name: {
                "recall_target": [g[name].recall_target for g in groups.values()],
                "median_delay_minutes": [g[name].median_delay_minutes for g in groups.values()],
                "median_delay_from_visible_minutes": [
                    g[name].median_delay_from_visible_minutes for g in groups.values()
                ],
                "median_delay_target_minutes": [g[name].median_delay_target_minutes for g in groups.values()],
                "false_alarms_per_node_week": [g[name].false_alarms_per_node_week for g in groups.values()],
            }
            for name in names
        },
    }
