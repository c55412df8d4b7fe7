"""The daemon side of detection: store → rules → alert lifecycle → alert events.

``build_pipeline(cfg, store, clock, queue)`` wires it; the supervisor then calls, at every window
boundary (after the tick wrote its windows), ``pipeline.step(now)`` in a worker thread (it is
synchronous: SQLite reads and pure evaluation). Delivery is not its job: the events of each minute
go to ``queue`` (the daemon's :class:`agent.sinks.delivery.Delivery`, whose outbox is durable), and
``step`` returns them.

``step(now)`` evaluates every *complete* minute not evaluated yet (the minute [m, m + 60) is
complete once ``now >= m + 60``), in order: the records of that minute from the store go through
the rule evaluator (in-memory trailing windows and baselines) and the alert manager; firing and
resolved events are handed to ``queue`` *before* the alert state is saved, so a crash between
the two re-sends (harmless, keys are stable) rather than loses.

Restarts: the first ``step`` rebuilds the evaluator's windows and baselines by replaying the
store's history (as far back as the longest rule needs), restores the alert state saved in the
store, and catches up at most :data:`MAX_CATCH_UP_MINUTES` minutes with the lifecycle (older
minutes are replayed silently, so a long outage does not page about the past).
"""

from __future__ import annotations

import ctypes
import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from agent.clock import Clock
from agent.config import Config
from agent.detect.alerts import AlertManager
from agent.detect.baselines import baseline_of
from agent.detect.deploys import DeployTracker, PriceTracker
from agent.detect.evaluator import Finding, RuleEvaluator
from agent.detect.explain import AlertExplainer
from agent.detect.rules import Rule, RuleSet, load_default_rules, load_rules
from agent.records import MINUTE, SIGNALS, Alert, AlertEvent, DeployEvent, MinuteRecord, load_band
from agent.store import Store

logger = logging.getLogger(__name__)

# Why 15: a restart or a short stall should still page for what happened meanwhile; after a
# longer outage the minutes are replayed only to rebuild baselines.
MAX_CATCH_UP_MINUTES = 15
LAST_MINUTE_KEY = "pipeline.last_evaluated_minute"
# Why 1 h: a start-up replay reads the store in slices this long, so its peak memory is an hour of
# records rather than the week a baseline looks back. The freed records of a slice leave the
# allocator's pages partly used, so the slice also sets how much the daemon keeps after the replay:
# 6 h slices left ~35 MB more resident than 1 h slices on the 35-day, 24-series bench store.
REPLAY_CHUNK_SECONDS = 3600.0
BEFORE_CACHE_ENTRIES = 256  # previous versions' figures kept (deploy × signal × load band; a float each)


def release_freed_memory() -> bool:
    """Hand the C allocator's free pages back to the OS (glibc's ``malloc_trim``); False where
    there is no such call (musl, macOS). The replay frees a week of records slice by slice, and
    glibc keeps freed pages in the middle of its heap resident until asked (~3 MB on the bench
    store)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim(0)
    return True


class EventQueue(Protocol):
    """Where the pipeline hands each minute's alert events, durably, before it saves the alert
    state (:class:`agent.sinks.delivery.Delivery`)."""

    def enqueue(self, events: Iterable[AlertEvent]) -> int:
        """Keep the events that are to be delivered (firing, resolved); returns how many rows."""
        ...


class Pipeline:
    """Rules and the alert lifecycle over the store (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        rules: RuleSet,
        queue: EventQueue | None = None,
        external_url: str | None = None,
        runbook_base: str | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.rules = rules
        self.queue = queue  # None: the events are only returned (and logged)
        self.evaluator = RuleEvaluator(rules)
        self.deploys = DeployTracker(compare=self._compare)
        self.prices = PriceTracker()
        # the previous version's figure before a deploy, per (deploy, signal, load band): that week
        # is history by then, and every alert pending after the deploy compares with it (re-reading
        # a week from the store for each was most of the rules' time after a deploy)
        self._before: dict[tuple[Any, ...], float | None] = {}
        explain = AlertExplainer(lambda labels, start, end: store.series("model", labels, start, end))
        self.alerts = AlertManager(
            rules,
            external_url,
            self.deploys.lookup,
            self._price_change,
            runbook_base=runbook_base,
            explain_lookup=explain,
        )
        self._last: float | None = None  # start of the last evaluated minute (epoch seconds)
        self._deploys_seen = 0
        self._started = False

    def replace_rules(self, rules: RuleSet) -> None:
        """Take a reloaded rule set: a new evaluator, warmed from history at the next step as at
        start-up; alerts in flight keep their state (those of a removed rule resolve). Call only
        between two steps."""
        self.rules = rules
        self.evaluator = RuleEvaluator(rules)
        self.prices = PriceTracker()  # the replay observes history again from its start
        self.alerts._rules = {r.id: r for r in rules}
        self._started = False

    # -- start-up ---------------------------------------------------------------------------------

    def _lookback(self) -> float:
        """Seconds of history the rules need (longest baseline window or `over`)."""
        need = MINUTE
        for r in self.rules:
            need = max(need, r.over + (r.baseline.window if r.baseline is not None else 0.0))
        return need

    def _replay(self, start: float, end: float) -> int:
        """Feed minutes [start, end) to the evaluator only (baselines and windows), a few hours of
        records at a time so a week of history never sits in memory at once. Returns how many of
        those minutes held data."""
        if end <= start:
            return 0
        found = 0
        m = start
        while m < end:
            chunk_end = min(end, m + REPLAY_CHUNK_SECONDS)
            by_minute: dict[float, list[MinuteRecord]] = defaultdict(list)
            for r in self.store.records(m, chunk_end):
                by_minute[r.minute].append(r)
            found += len(by_minute)
            while m < chunk_end:
                recs = by_minute.pop(m, ())
                self.prices.observe(recs)
                self.evaluator.warm(m + MINUTE, recs)
                m += MINUTE
        self._last = end - MINUTE
        return found

    def _start(self, target: float) -> None:
        self.alerts.restore(self.store.load_alert_state())
        self._sync_deploys()
        saved = self.store.get_meta(LAST_MINUTE_KEY)
        span = self.store.span()
        start = target - self._lookback()
        if span is not None:
            start = max(start, span[0])
        start = start // MINUTE * MINUTE
        live_from = target - MAX_CATCH_UP_MINUTES * MINUTE
        if saved is not None:
            live_from = max(live_from, float(saved) + MINUTE)
        found = self._replay(start, live_from)  # nothing when the rules need no history before live_from
        release_freed_memory()
        self._last = live_from - MINUTE
        self._started = True  # only now: a start that failed half-way is tried again next step
        logger.info(
            "detection warmed up from %d minutes of history found (of %.0f looked back); %d alerts restored",
            found,
            max(0.0, live_from - start) / MINUTE,
            len(self.alerts.active()),
        )

    def _sync_deploys(self) -> None:
        events = self.store.deploys()
        if len(events) > self._deploys_seen:
            self.deploys.seed(events[self._deploys_seen :])
            self._deploys_seen = len(events)

    # -- deploy comparison ------------------------------------------------------------------------

    def _price_change(self, rule: Rule, f: Finding) -> str | None:
        """A price change of the finding's series in the day before it, for cost rules only."""
        if not rule.signal.startswith(("usd_", "cost_", "anomaly")):
            return None
        change = self.prices.lookup(rule, f)
        return None if change is None else change.describe()

    def _compare(self, e: DeployEvent, rule: Rule, f: Finding) -> tuple[float | None, float | None]:
        """The rule's signal for the previous and the new version, at the finding's load band."""
        if rule.kind != "model":
            return None, None
        b = rule.baseline
        band_ratio = b.like_load.band_ratio if b and b.like_load and b.like_load.band_ratio else None
        by_running = b is not None and b.like_load is not None and b.like_load.signal == "requests_running"
        band_signal = "requests_running" if by_running else "generation_tokens_per_second"
        band_of = (f.band_load if by_running else f.tokens_per_second) if band_ratio is not None else None
        window = b.window if b is not None else 7 * 86400.0
        labels = dict(f.labels)
        key = {"node": e.node, "engine": e.engine, "model": e.model or labels.get("model", "")}
        # an engine deploy keeps the model version: compare that version before and after it
        before, after = (e.from_version, e.to_version)
        if e.kind == "engine":
            before = after = labels.get("model_version", "")
        kind = SIGNALS[rule.signal].kind
        ratio = band_ratio or 2.0

        def figure(version: str, start: float, end: float) -> float | None:
            """The signal of one version over [start, end) at the finding's load band."""
            records = self.store.series(kind, {**key, "model_version": version}, start, end)
            found = baseline_of(
                records,
                rule.signal,
                end,
                end - start,
                band_of=band_of,
                band_ratio=ratio,
                band_signal=band_signal,
            )
            return found.value

        band = load_band(band_of, ratio) if band_of is not None else None
        memo = (tuple(sorted(key.items())), before, e.at, window, rule.signal, band, ratio, band_signal)
        if memo not in self._before:
            if len(self._before) >= BEFORE_CACHE_ENTRIES:
                self._before.pop(next(iter(self._before)))
            self._before[memo] = figure(before, e.at - window, e.at)
        return self._before[memo], figure(after, f.at - max(MINUTE, f.at - e.at), f.at)

    # -- the loop's entry points ------------------------------------------------------------------

    def step(self, now: float) -> list[AlertEvent]:
        """Evaluate every complete minute up to ``now`` (epoch seconds); returns the events."""
        target = now // MINUTE * MINUTE  # minutes starting before this are complete
        if not self._started:
            self._start(target)
        assert self._last is not None
        events: list[AlertEvent] = []
        m = self._last + MINUTE
        if m >= target:
            return events
        self._sync_deploys()
        by_minute: dict[float, list[MinuteRecord]] = defaultdict(list)
        for r in self.store.records(m, target):
            by_minute[r.minute].append(r)
        while m < target:  # minute by minute, each one committed before the next is evaluated
            self.prices.observe(by_minute.get(m, ()))
            findings = self.evaluator.step(m + MINUTE, by_minute.get(m, ()))
            minute_events = self.alerts.step(findings, m + MINUTE)
            for e in minute_events:
                if e.kind != "pending":
                    logger.info("alert %s %s %s", e.kind, e.alert.rule_id, dict(e.alert.labels))
            if minute_events:
                if self.queue is not None:
                    self.queue.enqueue(minute_events)  # durable first ...
                self.store.save_alert_state(self.alerts.snapshot())  # ... then the state
            self._last = m
            self.store.set_meta(LAST_MINUTE_KEY, repr(self._last))
            events.extend(minute_events)
            m += MINUTE
        return events

    def firing(self) -> list[Alert]:
        """Firing alerts (for infercost_alerts_firing)."""
        return self.alerts.firing()

    def firing_counts(self) -> Mapping[tuple[str, str], int]:
        """Firing alerts per (rule, severity)."""
        out: dict[tuple[str, str], int] = defaultdict(int)
        for a in self.alerts.firing():
            out[(a.rule_id, a.severity)] += 1
        return dict(out)


def build_pipeline(
    cfg: Config,
    store: Store,
    clock: Clock,
    queue: EventQueue | None = None,
    rules: RuleSet | None = None,
) -> Pipeline:
    """Wire the pipeline from the config: rules (``alerts.rules_dirs`` or the bundled set) over
    ``store``, its events to ``queue``. Raises RuleError for bad rule files."""
    if rules is None:
        rules = load_rules(cfg.alerts.rules_dirs) if cfg.alerts.rules_dirs else load_default_rules()
    return Pipeline(store, clock, rules, queue, cfg.alerts.external_url, cfg.alerts.runbook_base)
