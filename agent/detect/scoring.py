"""The isolation forest in the daemon: fit from the store, score every completed minute.

Each minute (before the rules run, so rules can use ``anomaly_score``) the scorer reads the last
complete minute of every model version from the store, refits a series' forest when the
detector asks for it (no forest yet, daily, or once a new version has settled) from the trailing
training window, scores the minute, and writes the score back into the store.

The forest lives in a worker process (``python -m agent.detect.scoring``): scikit-learn and SciPy
alone take about 130 MB of memory, more than the whole daemon is allowed, and a fit takes seconds
of CPU that must not stall the event loop. The daemon talks to it over a pipe, one JSON line per
minute; the worker opens the same SQLite store (WAL: one writer at a time, readers never block).
A worker that dies is restarted at the next minute with backoff; meanwhile scores are absent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from pathlib import Path
from typing import Any

from agent.records import MINUTE, window_from_record
from agent.samples import CostWindow
from agent.store import Store

logger = logging.getLogger(__name__)

RETRY_FIT_SECONDS = 3600.0  # why hourly: a series short of history gains only 60 minutes an hour
WORKER_TIMEOUT_SECONDS = 120.0  # a daily refit of every series takes seconds; this is a hang
RESTART_BACKOFF_SECONDS = 60.0  # real seconds between restarts of a worker that keeps dying

ScoreKey = tuple[str, str, str]  # (engine, model, model_version)


class ForestScoring:
    """Keeps one ForestDetector fitted from the store and scores the newest minute (in-process;
    the worker runs this)."""

    def __init__(self, store: Store, state_dir: Path) -> None:
        from agent.detect.forest import ForestDetector  # scikit-learn: only in the worker

        self.store = store
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

    def step(self, now: float) -> dict[ScoreKey, float | None]:
        """Score the last complete minute before ``now``; returns the scores by series."""
        minute = now // MINUTE * MINUTE - MINUTE
        out: dict[ScoreKey, float | None] = {}
        last_change: dict[tuple[str, str], float] = {}  # (engine, model) → latest deploy, read once
        for d in self.store.deploys():
            last_change[(d.engine, d.model)] = max(d.at, last_change.get((d.engine, d.model), d.at))
        for r in self.store.records(minute, minute + MINUTE, kinds=("model",)):
            w = window_from_record(r)
            u = w.usage
            series = (u.engine, u.model)
            if self.forest.needs_refit(u.engine, u.model, now, last_change.get(series)) and (
                now - self._tried.get(series, -1e18) >= RETRY_FIT_SECONDS
            ):
                self._tried[series] = now
                history = self._history(u.engine, u.model, now)
                if self.forest.fit(history, now):
                    logger.info(
                        "isolation forest fitted for %s/%s on %d minutes", u.engine, u.model, len(history)
                    )
                    self.forest.save()
            score = self.forest.score(w)
            out[(u.engine, u.model, u.model_version)] = score
            if score is not None:
                self.store.write_anomaly_score(u.node, u.engine, u.model, u.model_version, minute, score)
        return out


class AnomalyScorer:
    """The daemon's side: a worker process running :class:`ForestScoring`, one request a minute."""

    def __init__(self, store_path: Path, state_dir: Path) -> None:
        self.store_path = store_path
        self.state_dir = state_dir
        self._proc: asyncio.subprocess.Process | None = None
        self._next_start = 0.0  # event-loop time before which no restart is tried

    @property
    def pid(self) -> int | None:
        """The worker's process id, while it runs."""
        return self._proc.pid if self._proc is not None and self._proc.returncode is None else None

    async def _ensure(self) -> asyncio.subprocess.Process | None:
        if self._proc is not None and self._proc.returncode is None:
            return self._proc
        loop = asyncio.get_running_loop()
        if loop.time() < self._next_start:
            return None
        self._next_start = loop.time() + RESTART_BACKOFF_SECONDS
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "agent.detect.scoring",
            str(self.store_path),
            str(self.state_dir),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        logger.info("isolation-forest worker started (pid %d)", self._proc.pid)
        return self._proc

    async def step(self, now: float) -> dict[ScoreKey, float | None]:
        """Scores of the last complete minute; empty when the worker is unavailable."""
        proc = await self._ensure()
        if proc is None or proc.stdin is None or proc.stdout is None:
            return {}
        try:
            proc.stdin.write(json.dumps({"now": now}).encode() + b"\n")
            await proc.stdin.drain()
            line = await asyncio.wait_for(proc.stdout.readline(), WORKER_TIMEOUT_SECONDS)
            reply: dict[str, Any] = json.loads(line)
        except (OSError, TimeoutError, ValueError) as err:
            logger.warning(
                "isolation-forest worker failed (%s); anomaly scores are absent until it restarts", err
            )
            await self._kill()
            return {}
        return {(e, m, v): s for e, m, v, s in reply.get("scores", [])}

    async def _kill(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            self._proc.kill()
            with contextlib.suppress(ProcessLookupError):
                await self._proc.wait()
        self._proc = None

    async def close(self) -> None:
        """Stop the worker (it exits when its stdin closes)."""
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            await self._kill()


def worker_main(store_path: Path, state_dir: Path, stdin: Any = sys.stdin, stdout: Any = sys.stdout) -> int:
    """The worker: one JSON request per line in, one JSON reply per line out, until EOF."""
    store = Store(store_path)
    scoring = ForestScoring(store, state_dir)
    try:
        for line in stdin:
            reply: dict[str, Any]
            try:
                now = float(json.loads(line)["now"])
                scores = scoring.step(now)
                reply = {"scores": [[e, m, v, s] for (e, m, v), s in scores.items()]}
            except Exception as err:  # one bad minute must not kill the worker
                logger.exception("isolation-forest step failed")
                reply = {"scores": [], "error": str(err)}
            stdout.write(json.dumps(reply) + "\n")
            stdout.flush()
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(worker_main(Path(sys.argv[1]), Path(sys.argv[2])))
