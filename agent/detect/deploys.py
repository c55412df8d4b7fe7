"""Deploys (pure): a model's version changing is a deploy, and so is a new build of the engine
serving it (an engine upgrade, recorded from the pod's image); alerts that begin soon after one
name it and compare the new version with the previous one at like load.

:func:`deploy_of` is the decision, for the store's writes (:func:`record_deploy` is the
:data:`agent.store.DeployRule` the daemon's store is built with: the store keeps the versions seen
and writes the deploy rows it is handed) and for :meth:`DeployTracker.observe` alike.

:class:`DeployTracker` watches the model records minute by minute (or is seeded from the store's
deploy table) and answers :meth:`DeployTracker.lookup`, which is the ``deploy_lookup`` hook of
:class:`agent.detect.alerts.AlertManager`. The like-load comparison itself needs history, so it is
a callable the caller supplies (the pipeline answers it from the store).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from agent.detect.evaluator import Finding
from agent.detect.rules import Rule
from agent.records import SIGNALS, DeployEvent, DeployInfo, MinuteRecord, iso
from agent.store import VersionSeen

_GPU_HOUR_PRICE = SIGNALS["usd_per_gpu_hour"]  # the same figure the price_increase rule reads

logger = logging.getLogger(__name__)

# Why 2 hours: a version that regresses cost shows it within its first hour of traffic; an alert
# starting later is more likely load or infrastructure than the deploy.
DEFAULT_ATTRIBUTION_SECONDS = 2 * 3600.0


def deploy_of(last: VersionSeen | None, now: VersionSeen) -> DeployEvent | None:
    """The deploy a series showing ``now`` reveals after showing ``last``: a version other than the
    last one, in that minute or a later one (a window written late, of an earlier minute, is not a
    deploy back). The first version a series shows is none. Model "" is the engine's own build."""
    if last is None or now.version == last.version or now.minute < last.minute:
        return None
    kind = "engine" if now.model == "" else "model"
    return DeployEvent(now.node, now.engine, now.model, last.version, now.version, now.minute, kind=kind)


def record_deploy(last: VersionSeen | None, now: VersionSeen) -> DeployEvent | None:
    """:func:`deploy_of`, logged: the deploy rule of the daemon's store."""
    e = deploy_of(last, now)
    if e is not None:
        what = e.model if e.kind == "model" else "engine build"
        logger.info(
            "deploy recorded: %s on %s/%s %s -> %s", what, e.node, e.engine, e.from_version, e.to_version
        )
    return e


# (deploy, rule, finding) → (previous version's value, new version's value) at like load.
Compare = Callable[[DeployEvent, Rule, Finding], tuple[float | None, float | None]]


class DeployTracker:
    """Remembers the current version per (node, engine, model) and the deploys seen."""

    def __init__(self, window: float = DEFAULT_ATTRIBUTION_SECONDS, compare: Compare | None = None) -> None:
        self.window = window  # seconds after a deploy during which a new alert is attributed to it
        self._compare = compare
        self._current: dict[tuple[str, str, str], tuple[str, float]] = {}  # -> (version, last seen minute)
        self._deploys: dict[tuple[str, str, str], list[DeployEvent]] = {}

    def seed(
        self, events: Iterable[DeployEvent], current: Iterable[tuple[str, str, str, str, float]] = ()
    ) -> None:
        """Load known deploys and current versions ((node, engine, model, version, minute)) from the store."""
        for e in events:
            self._deploys.setdefault((e.node, e.engine, e.model), []).append(e)
        for node, engine, model, version, minute in current:
            self._current[(node, engine, model)] = (version, minute)

    def observe(self, records: Iterable[MinuteRecord]) -> list[DeployEvent]:
        """Note the versions in one minute's model records; return the deploys they reveal."""
        out: list[DeployEvent] = []
        for r in records:
            if r.kind != "model":
                continue
            node, engine, model, version = (v for _, v in r.labels)
            key = (node, engine, model)
            prev = self._current.get(key)
            last = None if prev is None else VersionSeen(node, engine, model, *prev)
            e = deploy_of(last, VersionSeen(node, engine, model, version, r.minute))
            if e is not None:
                self._deploys.setdefault(key, []).append(e)
                out.append(e)
                logger.info("deploy of %s on %s/%s: %s -> %s", model, node, engine, e.from_version, version)
            if prev is None or r.minute >= prev[1]:
                self._current[key] = (version, r.minute)
        return out

    def deploys(self) -> list[DeployEvent]:
        """Every deploy seen, oldest first."""
        return sorted((e for es in self._deploys.values() for e in es), key=lambda e: e.at)

    def lookup(self, rule: Rule, finding: Finding) -> DeployInfo | None:
        """The deploy an alert beginning with ``finding`` follows, if one happened within the window.

        Model deploys of the series' (node, engine, model) and engine deploys (a new image of the
        engine, ``kind`` "engine") are both candidates; the latest one before the finding wins, a
        model deploy on a tie. A deploy back to a version deployed before is named a rollback."""
        labels = dict(finding.labels)
        node, engine = labels.get("node", ""), labels.get("engine", "")
        key = (node, engine, labels.get("model", ""))
        version = labels.get("model_version")
        model_events = self._deploys.get(key, [])
        engine_events = self._deploys.get((node, engine, ""), []) if key[2] else []
        candidates = [e for e in (*model_events, *engine_events) if e.at <= finding.at]
        if not candidates:
            return None
        e = max(candidates, key=lambda d: (d.at, d.kind == "model"))
        if finding.at - e.at > self.window:
            return None
        if e.kind != "engine" and version is not None and version != e.to_version:
            return None
        history = model_events if e.kind != "engine" else engine_events
        rollback = any(d.from_version == e.to_version and d.at < e.at for d in history) or any(
            d is not e and d.to_version == e.to_version and d.at < e.at for d in history
        )
        prev_v, new_v = self._compare(e, rule, finding) if self._compare else (None, None)
        return DeployInfo(
            e.node,
            e.engine,
            e.model if e.kind != "engine" else key[2],
            e.from_version,
            e.to_version,
            e.at,
            prev_v,
            new_v,
            kind=e.kind,
            rollback=rollback,
            model_version=version if e.kind == "engine" else None,
        )


# Why 0.5 %: a price book change moves the dollars per GPU-second by whole percent at least, while
# rounding of per-minute sums stays far under 0.1 %.
PRICE_CHANGE_RATIO = 0.005
# Why a day: books change at midnight (effective dates), and the cost rule fires when the node is
# busy enough to compare like with like, often the next business hours.
PRICE_ATTRIBUTION_SECONDS = 86400.0


@dataclass(frozen=True, slots=True)
class PriceChange:
    """The price a series pays per GPU-hour changed (a price-book entry took effect)."""

    node: str
    engine: str
    model: str
    from_usd_per_gpu_hour: float  # dollars per GPU-hour before
    to_usd_per_gpu_hour: float  # dollars per GPU-hour after
    at: float  # epoch seconds: start of the first minute at the new price

    def describe(self) -> str:
        """One line for annotations."""
        change = (self.to_usd_per_gpu_hour / self.from_usd_per_gpu_hour - 1.0) * 100.0
        return (
            f"price of its GPUs ${self.from_usd_per_gpu_hour:.4g} → ${self.to_usd_per_gpu_hour:.4g} "
            "per GPU-hour "
            f"({change:+.1f} %) from {iso(self.at)} (price book)"
        )


class PriceTracker:
    """Watches each model series' dollars per GPU-second (from its minute records) and remembers
    when it changed, so a cost alert can name a price change instead of blaming efficiency."""

    def __init__(self, window: float = PRICE_ATTRIBUTION_SECONDS) -> None:
        self.window = window  # seconds after a change during which an alert names it
        self._rate: dict[tuple[str, str, str], float] = {}  # series → last $/GPU-hour
        self._changes: dict[tuple[str, str, str], list[PriceChange]] = {}

    def observe(self, records: Iterable[MinuteRecord]) -> list[PriceChange]:
        """Feed one minute's records; returns the price changes they reveal."""
        out: list[PriceChange] = []
        for r in records:
            if r.kind != "model":
                continue
            rate = _GPU_HOUR_PRICE.fn([r.sums.get(n, 0.0) for n in _GPU_HOUR_PRICE.inputs])
            if rate is None or rate <= 0:
                continue
            key = (r.label("node"), r.label("engine"), r.label("model"))
            prev = self._rate.get(key)
            self._rate[key] = rate
            if prev is not None and abs(rate / prev - 1.0) > PRICE_CHANGE_RATIO:
                change = PriceChange(*key, prev, rate, r.minute)
                self._changes.setdefault(key, []).append(change)
                out.append(change)
        return out

    def lookup(self, rule: Rule, finding: Finding) -> PriceChange | None:
        """The latest price change of the finding's series within the window before it, if any."""
        labels = dict(finding.labels)
        key = (labels.get("node", ""), labels.get("engine", ""), labels.get("model", ""))
        recent = [c for c in self._changes.get(key, ()) if 0 <= finding.at - c.at <= self.window]
        return recent[-1] if recent else None
