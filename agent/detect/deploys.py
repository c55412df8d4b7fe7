"""Deploy attribution (pure): a model's version changing is a deploy; alerts that begin soon after
one name it and compare the new version with the previous one at like load.

:class:`DeployTracker` watches the model records minute by minute (or is seeded from the store's
deploy table) and answers :meth:`DeployTracker.lookup`, which is the ``deploy_lookup`` hook of
:class:`agent.detect.alerts.AlertManager`. The like-load comparison itself needs history, so it is
a callable the caller supplies (the pipeline answers it from the store).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from agent.detect.rules import Finding, Rule
from agent.records import DeployEvent, DeployInfo, MinuteRecord

logger = logging.getLogger(__name__)

# Why 2 hours: a version that regresses cost shows it within its first hour of traffic; an alert
# starting later is more likely load or infrastructure than the deploy.
DEFAULT_ATTRIBUTION_SECONDS = 2 * 3600.0


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
            if prev is not None and prev[0] != version and r.minute >= prev[1]:
                e = DeployEvent(node, engine, model, prev[0], version, r.minute)
                self._deploys.setdefault(key, []).append(e)
                out.append(e)
                logger.info("deploy of %s on %s/%s: %s -> %s", model, node, engine, prev[0], version)
            if prev is None or r.minute >= prev[1]:
                self._current[key] = (version, r.minute)
        return out

    def deploys(self) -> list[DeployEvent]:
        """Every deploy seen, oldest first."""
        return sorted((e for es in self._deploys.values() for e in es), key=lambda e: e.at)

    def lookup(self, rule: Rule, finding: Finding) -> DeployInfo | None:
        """The deploy an alert beginning with ``finding`` follows, if one happened within the window."""
        labels = dict(finding.labels)
        key = (labels.get("node", ""), labels.get("engine", ""), labels.get("model", ""))
        version = labels.get("model_version")
        for e in reversed(self._deploys.get(key, [])):
            if e.at > finding.at:
                continue
            if finding.at - e.at > self.window:
                return None
            if version is not None and version != e.to_version:
                return None
            prev_v, new_v = self._compare(e, rule, finding) if self._compare else (None, None)
            return DeployInfo(e.node, e.engine, e.model, e.from_version, e.to_version, e.at, prev_v, new_v)
        return None
