"""The isolation forest in the daemon: scored in process with numpy, fitted in a short-lived process.

Each minute (before the rules run, so rules can use ``anomaly_score``) the scorer reads the last
complete minute of every model version from the store, scores it with the fitted trees as numpy
arrays (:mod:`agent.detect.trees`; no scikit-learn in the daemon) and writes the score back into
the store.

When a series needs a (re)fit (no forest yet, daily, or once a new version has settled), the
daemon starts ``python -m agent.detect.scoring STORE STATE_DIR NOW``: a process that imports
scikit-learn, fits the series that are due from the store's trailing training window, writes the
fitted arrays to ``state_dir`` and exits (about 1 minute a day; scikit-learn and SciPy alone take
about 130 MB, which the daemon never holds). The daemon reloads the arrays when it has exited;
until then it scores with the previous forest. A failing fit is retried after
:data:`RETRY_FIT_SECONDS`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from pathlib import Path

from agent.detect.forest import ForestDetector
from agent.records import MINUTE, window_from_record
from agent.samples import CostWindow
from agent.store import Store

logger = logging.getLogger(__name__)

RETRY_FIT_SECONDS = 3600.0  # why hourly: a series short of history gains only 60 minutes an hour
FIT_TIMEOUT_SECONDS = 600.0  # a daily refit of every series takes seconds; this is a hang

ScoreKey = tuple[str, str, str]  # (engine, model, model_version)
SeriesKey = tuple[str, str]  # (engine, model)


class ForestScoring:
    """One ForestDetector over the store: which series are due for a fit, fitting them, and
    scoring the newest minute."""

    def __init__(self, store: Store, state_dir: Path) -> None:
        self.store = store
        self.state_dir = state_dir
        self.forest = ForestDetector(state_dir)
        if self.forest.load():
            logger.info("isolation forest loaded from %s", state_dir)
        self._tried: dict[SeriesKey, float] = {}

    def reload(self) -> bool:
        """Read the arrays a fitting process wrote (True when loaded)."""
        return self.forest.load()

    def _history(self, engine: str, model: str, now: float) -> list[CostWindow]:
        recs = self.store.records(
            now - self.forest.training_seconds,
            now,
            kinds=("model",),
            match={"engine": engine, "model": model},
        )
        return [window_from_record(r) for r in recs]

    def _last_minute(self, now: float) -> tuple[float, list[CostWindow]]:
        minute = now // MINUTE * MINUTE - MINUTE
        return minute, [
            window_from_record(r) for r in self.store.records(minute, minute + MINUTE, kinds=("model",))
        ]

    def due(self, now: float) -> list[SeriesKey]:
        """Series of the last complete minute that need a (re)fit and were not tried within the hour."""
        last_change: dict[SeriesKey, float] = {}  # latest deploy per series, read once
        for d in self.store.deploys():
            last_change[(d.engine, d.model)] = max(d.at, last_change.get((d.engine, d.model), d.at))
        out: list[SeriesKey] = []
        for w in self._last_minute(now)[1]:
            series = (w.usage.engine, w.usage.model)
            if series in out or now - self._tried.get(series, -1e18) < RETRY_FIT_SECONDS:
                continue
            if self.forest.needs_refit(*series, now, last_change.get(series)):
                out.append(series)
        return out

    def fit(self, series: list[SeriesKey], now: float) -> list[SeriesKey]:
        """Fit these series from the store's training window (scikit-learn) and save; returns the fitted."""
        fitted: list[SeriesKey] = []
        for engine, model in series:
            self._tried[(engine, model)] = now
            history = self._history(engine, model, now)
            if self.forest.fit(history, now):
                logger.info("isolation forest fitted for %s/%s on %d minutes", engine, model, len(history))
                fitted.append((engine, model))
        if fitted:
            self.forest.save()
        return fitted

    def mark_tried(self, series: list[SeriesKey], now: float) -> None:
        """Remember that a fit of these series was started at ``now`` (retried only after an hour)."""
        for s in series:
            self._tried[s] = now

    def score(self, now: float) -> dict[ScoreKey, float | None]:
        """Score the last complete minute before ``now`` and write the scores to the store."""
        minute, windows = self._last_minute(now)
        out: dict[ScoreKey, float | None] = {}
        for w, score in zip(windows, self.forest.score_many(windows), strict=True):
            u = w.usage
            out[(u.engine, u.model, u.model_version)] = score
            if score is not None:
                self.store.write_anomaly_score(u.node, u.engine, u.model, u.model_version, minute, score)
        return out

    def step(self, now: float) -> dict[ScoreKey, float | None]:
        """Fit what is due in this process, then score (tests and benchmarks; the daemon fits apart)."""
        due = self.due(now)
        if due:
            self.fit(due, now)
        return self.score(now)


class AnomalyScorer:
    """The daemon's side: numpy scoring in process, fits in a short-lived process."""

    def __init__(self, store_path: Path, state_dir: Path, store: Store | None = None) -> None:
        """``store``: a connection to ``store_path`` used on the event loop too, shared (left open
        by :meth:`close`: its owner closes it); None opens one of its own. Why share: each SQLite
        connection holds its own page cache and schema."""
        self.store_path = store_path
        self.state_dir = state_dir
        self._own_store = store is None
        self._store = Store(store_path) if store is None else store
        self._scoring = ForestScoring(self._store, state_dir)
        self._proc: asyncio.subprocess.Process | None = None
        self._started_at = 0.0  # event-loop time the fitting process started

    @property
    def pid(self) -> int | None:
        """The fitting process' id, while one runs."""
        return self._proc.pid if self._proc is not None and self._proc.returncode is None else None

    async def _collect(self) -> None:
        """Reload the forest once a fitting process has exited; kill one that hangs."""
        proc = self._proc
        if proc is None:
            return
        if proc.returncode is None:
            if asyncio.get_running_loop().time() - self._started_at < FIT_TIMEOUT_SECONDS:
                return
            logger.warning("isolation-forest fit hung for %.0f s; killed", FIT_TIMEOUT_SECONDS)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        self._proc = None
        if proc.returncode == 0:
            self._scoring.reload()
        else:
            logger.warning(
                "isolation-forest fit exited with %s; scores use the previous forest", proc.returncode
            )

    async def wait_fit(self) -> None:
        """Wait for a running fit to finish and load its result (tests, shutdown)."""
        if self._proc is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._proc.wait(), FIT_TIMEOUT_SECONDS)
        await self._collect()

    async def step(self, now: float) -> dict[ScoreKey, float | None]:
        """Scores of the last complete minute (absent for series with no forest yet); starts a fit
        in its own process when one is due."""
        await self._collect()
        if self._proc is None:
            due = self._scoring.due(now)
            if due:
                self._scoring.mark_tried(due, now)
                self._proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "agent.detect.scoring", str(self.store_path), str(self.state_dir),
                    repr(now), stdin=asyncio.subprocess.DEVNULL,
                )  # fmt: skip
                self._started_at = asyncio.get_running_loop().time()
                logger.info("isolation-forest fit started (pid %d) for %s", self._proc.pid, due)
        return self._scoring.score(now)

    async def close(self) -> None:
        """Stop a running fit (it is redone later) and close the store connection if it is its own."""
        proc = self._proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        self._proc = None
        if self._own_store:
            self._store.close()


def fit_main(store_path: Path, state_dir: Path, now: float) -> int:
    """The fitting process: fit every series due at ``now``, write the arrays, exit."""
    store = Store(store_path)
    try:
        scoring = ForestScoring(store, state_dir)
        scoring.fit(scoring.due(now), now)
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(fit_main(Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])))
