"""The isolation forest in the daemon: fit from the store, score every completed minute.

Each minute (before the rules run, so rules can use ``anomaly_score``) the scorer reads the last
complete minute of every model version from the store, refits a series' forest when the
detector asks for it (no forest yet, daily, or once a new version has settled) from the trailing
training window, scores the minute, and writes the score back into the store.
Fitting runs in a worker thread; a series without enough history is retried at most hourly.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from agent.clock import Clock
from agent.detect.forest import ForestDetector
from agent.detect.rules import MINUTE, window_from_record
from agent.samples import CostWindow
from agent.store import Store

logger = logging.getLogger(__name__)

RETRY_FIT_SECONDS = 3600.0  # why hourly: a series short of history gains only 60 minutes an hour

ScoreKey = tuple[str, str, str]  # (engine, model, model_version)


class AnomalyScorer:
    """Keeps one ForestDetector fitted from the store and scores the newest minute."""

    def __init__(self, store: Store, state_dir: Path, clock: Clock) -> None:
        self.store = store
        self.clock = clock
        self.forest = ForestDetector(state_dir)
        if self.forest.load():
            logger.info("isolation forest loaded from %s", state_dir)
        self._tried: dict[tuple[str, str], float] = {}

    def _history(self, engine: str, model: str, now: float) -> list[CostWindow]:
        recs = self.store.records(
            now - self.forest.training_seconds,
            now,
            kinds=("model",),
            match={"engine": engine, "model": model},
        )
        return [window_from_record(r) for r in recs]

    def _last_change(self, engine: str, model: str) -> float | None:
        changes = [d.at for d in self.store.deploys() if d.engine == engine and d.model == model]
        return max(changes) if changes else None

    async def step(self, now: float) -> dict[ScoreKey, float | None]:
        """Score the last complete minute before ``now``; returns the scores by series."""
        minute = now // MINUTE * MINUTE - MINUTE
        recs = self.store.records(minute, minute + MINUTE, kinds=("model",))
        out: dict[ScoreKey, float | None] = {}
        for r in recs:
            w = window_from_record(r)
            u = w.usage
            series = (u.engine, u.model)
            if self.forest.needs_refit(u.engine, u.model, now, self._last_change(*series)) and (
                now - self._tried.get(series, -1e18) >= RETRY_FIT_SECONDS
            ):
                self._tried[series] = now
                history = self._history(u.engine, u.model, now)
                fitted = await asyncio.to_thread(self.forest.fit, history, now)
                if fitted:
                    logger.info(
                        "isolation forest fitted for %s/%s on %d minutes", u.engine, u.model, len(history)
                    )
                    await asyncio.to_thread(self.forest.save)
            score = self.forest.score(w)
            out[(u.engine, u.model, u.model_version)] = score
            if score is not None:
                self.store.write_anomaly_score(u.node, u.engine, u.model, u.model_version, minute, score)
        return out
