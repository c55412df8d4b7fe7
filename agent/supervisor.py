"""The daemon: one asyncio TaskGroup of isolated loops, shut down cleanly on a stop event.

Loops (each catches and logs its own failures, so one failing loop never stops the others):
- NVML: one batched round every ``intervals.nvml_seconds``, off the event loop;
- tick: scrape every engine concurrently every ``intervals.scrape_seconds``, join with the NVML
  rounds since the last tick, price, update the ledger and publish the snapshot (what /metrics
  serves) — *then* write the windows to the store. The store is behind a :class:`HistoryGuard`: a
  failing disk (full, read-only, I/O errors) degrades history only (``infercost_store_up`` 0, one
  log line per state change, retries with backoff); the snapshot and /metrics never wait for it;
- detect: once a tick has written a window boundary's data, score and evaluate rules up to the tick's
  time and run the alert lifecycle, in a worker thread with its own SQLite connection (so the
  start-up replay of a week of history never blocks /metrics);
- delivery: the outbox to Slack / PagerDuty / webhook;
- exporters: Prometheus endpoint (always), OTLP push (when configured).

Time: intervals and backoff come from the clock's monotonic face; when the clock is a
:class:`~agent.clock.SteadyClock`, each tick first checks for a wall-clock step (logged; a forward
step restarts the cost interval so the gap is not charged).

Build an :class:`Agent` with :func:`agent.app.build_agent` (the one composition root).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import sqlite3
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import aiohttp

from agent import __version__
from agent.clock import Clock, SteadyClock
from agent.config import Config, ConfigError, EngineConfig
from agent.cost.window import TickResult, WindowJoiner
from agent.samples import CostWindow, EngineScrape, NvmlRound
from agent.sinks.prometheus import PrometheusServer
from agent.sinks.webconfig import load_web_config
from agent.snapshot import Ledger, Snapshot
from agent.sources.discovery import VersionReader
from agent.sources.engines.scraper import EngineScraper
from agent.sources.nvml.backend import NvmlBackend
from agent.sources.nvml.sampler import NvmlSampler
from agent.sources.prices import PriceBook

if TYPE_CHECKING:
    from agent.detect.pipeline import Pipeline
    from agent.detect.scoring import AnomalyScorer
    from agent.sources.kube.source import KubeEngines as EngineSource
    from agent.store import Store

logger = logging.getLogger(__name__)

# Why 5: a tick may legitimately take a scrape timeout plus an NVML round longer than its interval
# once or twice (a slow engine, a GC pause); five missed intervals in a row is a stuck loop.
STUCK_AFTER_INTERVALS = 5
# NVML rounds kept for the next tick's history write; why 600: ten minutes of 1 s rounds covers any
# sane scrape interval, and a store that stays down for longer must not grow the daemon's memory.
MAX_BUFFERED_ROUNDS = 600
# Scrapes in flight at once. A scrape's timeout starts when it holds a slot, so an engine waiting
# behind slow ones loses none of its own. Why 32: below aiohttp's pool of 100 connections (beyond it
# the wait for a connection would run inside the timeout); a MIG node's 56 engines all hanging still
# end within two timeouts, inside the default interval; and at most 32 pages are held at once.
MAX_CONCURRENT_SCRAPES = 32
# Why 1 s .. 5 min: a full disk or a remounted volume is fixed by a person in minutes; retrying
# faster only floods the log, slower leaves history paused long after the fix.
HISTORY_RETRY_MIN_SECONDS = 1.0
HISTORY_RETRY_MAX_SECONDS = 300.0


class StartupError(Exception):
    """A problem at start-up that the operator fixes (busy port, state dir held by another agent);
    the message says what and how. ``cli.py`` turns it into exit code 2."""


@dataclass
class Hooks:
    """Optional parts wired in by :func:`agent.app.build_agent` (optional so the core runs alone)."""

    on_tick: list[Callable[[TickResult, Snapshot], None]] = field(default_factory=list)
    store: Store | None = None  # the tick's connection (writes)
    pipeline: Pipeline | None = None  # runs in a worker thread over its own store connection
    scorer: AnomalyScorer | None = None
    closers: list[Callable[[], None]] = field(default_factory=list)  # run last at shutdown (e.g. the lock)
    history_note: str | None = None  # why history is off or degraded, for /healthz
    nvml_expected: bool = False  # nvml.backend auto/real but no backend: export nvml_up 0
    recovered_files: int = 0  # damaged SQLite files moved aside at start
    engine_source: EngineSource | None = None  # engines that come and go (Kubernetes discovery)
    # more loops, run in the daemon's task group until stop (the weekly report)
    tasks: list[Callable[[asyncio.Event], Coroutine[Any, Any, None]]] = field(default_factory=list)


class HistoryGuard:
    """Calls into the store that may fail without stopping anything (see the module docstring).

    ``up`` is False from the first failure until a retry succeeds; while down, writes are skipped
    until the backoff (monotonic seconds, doubling from 1 s to 5 min) expires."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self.up = True
        self.error: str | None = None
        self.failures = 0  # writes failed or skipped since the store went down
        self._delay = HISTORY_RETRY_MIN_SECONDS
        self._retry_at = 0.0  # monotonic seconds

    def call(self, what: str, fn: Callable[[], Any]) -> bool:
        """Run ``fn`` unless backing off; True when it ran and succeeded."""
        if not self.up and self._clock.monotonic() < self._retry_at:
            self.failures += 1
            return False
        try:
            fn()
        except (sqlite3.Error, OSError) as err:
            self.failures += 1
            self.error = f"{type(err).__name__}: {err}"
            if self.up:
                self.up = False
                from agent.store import is_corrupt

                hint = (
                    " (the file is damaged: it is moved aside at the next start)" if is_corrupt(err) else ""
                )
                logger.error(
                    "history store failed while %s (%s)%s; metrics carry on, history is paused and "
                    "retried with backoff",
                    what,
                    self.error,
                    hint,
                )
            else:
                self._delay = min(HISTORY_RETRY_MAX_SECONDS, self._delay * 2)
            self._retry_at = self._clock.monotonic() + self._delay
            return False
        if not self.up:
            logger.warning("history store works again (%d writes were lost while it failed)", self.failures)
            self.up = True
            self.error = None
            self.failures = 0
            self._delay = HISTORY_RETRY_MIN_SECONDS
        return True


async def _bounded(slots: asyncio.Semaphore, scraper: EngineScraper) -> EngineScrape:
    """One scrape once a slot is free (its timeout runs from then)."""
    async with slots:
        return await scraper.scrape()


def _finite(w: CostWindow) -> bool:
    u = w.usage
    values = (u.prompt_tokens, u.generation_tokens, u.gpu_seconds, w.cost_usd, w.idle_usd, w.energy_usd)
    return all(math.isfinite(v) for v in values)


class Agent:
    """The per-node daemon."""

    def __init__(
        self,
        cfg: Config,
        clock: Clock,
        book: PriceBook,
        backend: NvmlBackend | None,
        engines: Sequence[EngineConfig] | None = None,
        hooks: Hooks | None = None,
    ) -> None:
        self.cfg = cfg
        self.clock = clock
        self.book = book
        self.engines = tuple(cfg.engines if engines is None else engines)
        self.hooks = hooks or Hooks()
        self.ledger = Ledger(cfg.node, __version__, trailing_seconds=cfg.intervals.window_seconds)
        self.joiner = self._new_joiner()
        self.backend = backend
        self.sampler = NvmlSampler(backend, clock) if backend is not None else None
        self.versions = VersionReader(self.engines)
        self.prometheus: PrometheusServer | None = None
        self.history = HistoryGuard(clock)
        self.started = asyncio.Event()
        self._ticks = 0
        self._nvml_rounds: list[NvmlRound] = []  # sampled since the last tick, not yet in history
        self._last_tick_mono: float | None = None  # monotonic seconds of the last completed tick
        self._detected_slot = -1
        self._detect_task: asyncio.Task[None] | None = None
        self._detect_error: str | None = None
        self._dropped_windows = 0  # windows with a non-finite number, kept out of the store
        if self.hooks.nvml_expected and backend is None:
            self.ledger.observe_nvml(NvmlRound(timestamp=clock.now(), up=False, error="no NVML driver"))
        if self.hooks.pipeline is not None:  # every loaded rule exported, at 0 until it fires
            self.ledger.declare_alert_rules((r.id, r.severity) for r in self.hooks.pipeline.rules)
        self._snapshot = self._publish()

    def _new_joiner(self) -> WindowJoiner:
        return WindowJoiner(
            self.cfg.node,
            [e.cost_spec() for e in self.engines],
            self.book.table(),
            self.cfg.prices.share_policy,
        )

    # ------------------------------------------------------------------ public
    def snapshot(self) -> Snapshot:
        """The latest snapshot (what /metrics serves)."""
        return self._snapshot

    def health(self) -> dict[str, Any]:
        """Each component's state (the /healthz body); ``ok`` False only when the tick loop is stuck
        (no tick for :data:`STUCK_AFTER_INTERVALS` scrape intervals) or has not ticked yet."""
        mono = self.clock.monotonic()
        limit = STUCK_AFTER_INTERVALS * self.cfg.intervals.scrape_seconds
        age = None if self._last_tick_mono is None else mono - self._last_tick_mono
        if age is None:
            status = "starting"
        elif age > limit:
            status = "stuck"
        else:
            status = "ok"
        snap = self._snapshot
        nvml = "absent" if snap.nvml_up is None else ("up" if snap.nvml_up else "down")
        if self.hooks.store is None:
            history: dict[str, Any] = {"state": "off", "detail": self.hooks.history_note or "not configured"}
        elif not self.history.up:
            history = {"state": "down", "detail": self.history.error}
        elif self.hooks.history_note:
            history = {"state": "degraded", "detail": self.hooks.history_note}
        else:
            history = {"state": "ok"}
        detection: dict[str, Any] = {"state": "off"}
        if self.hooks.pipeline is not None:
            detection = (
                {"state": "failing", "detail": self._detect_error} if self._detect_error else {"state": "ok"}
            )
        return {
            "status": status,
            "ok": status == "ok",
            "node": self.cfg.node,
            "version": __version__,
            "components": {
                "tick": {
                    "state": status,
                    "ticks": self._ticks,
                    "last_tick_age_seconds": None if age is None else round(age, 3),
                    "stuck_after_seconds": limit,
                },
                "nvml": {"state": nvml},
                "engines": {
                    e.engine: {"state": "up" if e.up else "down", "error": e.error} for e in snap.engines
                },
                "history": history,
                "detection": detection,
            },
        }

    async def run(self, stop: asyncio.Event) -> None:
        """Run every loop until ``stop`` is set, then shut down cleanly.

        Raises :class:`StartupError` when the Prometheus port cannot be bound."""
        try:
            await self._run(stop)
        finally:
            for close in reversed(self.hooks.closers):
                try:
                    close()
                except Exception:
                    logger.exception("shutdown step failed")

    async def _run(self, stop: asyncio.Event) -> None:
        exp = self.cfg.exporters
        if exp.prometheus.enabled:
            try:
                web_cfg = load_web_config(exp.prometheus.web_config_file)
            except ConfigError:
                await self._close_parts()
                raise
            self.prometheus = PrometheusServer(
                self.snapshot, self.health, exp.prometheus.host, exp.prometheus.port, web_config=web_cfg
            )
            try:
                await self.prometheus.start()
            except OSError as err:
                await self._close_parts()
                raise StartupError(
                    f"cannot listen on {exp.prometheus.host}:{exp.prometheus.port}: {err.strerror or err}; "
                    "fix: stop what uses that port or set exporters.prometheus.port to a free one"
                ) from None
        if self.sampler is not None:
            await self.sampler.start()
        elif not self.hooks.nvml_expected:
            logger.info("no NVML backend: GPU series are absent, engines are still scraped")
        otlp = None
        if exp.otlp.endpoint_in(os.environ) is not None:  # config or OTEL_EXPORTER_OTLP_*
            from agent.sinks.otlp import otlp_exporter  # the OTel SDK (~3 MB) only when exporting

            otlp = otlp_exporter(self.snapshot, exp.otlp, self.cfg.node)
        self.started.set()
        timeout = aiohttp.ClientTimeout(total=None)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                scrapers = [EngineScraper(e, session, self.clock) for e in self.engines]
                async with asyncio.TaskGroup() as tg:
                    if self.sampler is not None:
                        tg.create_task(
                            self._every(stop, self.cfg.intervals.nvml_seconds, self._nvml_once, "nvml")
                        )
                    tg.create_task(
                        self._every(
                            stop, self.cfg.intervals.scrape_seconds, lambda: self._tick_once(scrapers), "tick"
                        )
                    )
                    if self.hooks.pipeline is not None:
                        tg.create_task(self.hooks.pipeline.run_delivery(stop))
                    if self.hooks.engine_source is not None:
                        self._session = session
                        tg.create_task(self.hooks.engine_source.run(stop))
                    for task in self.hooks.tasks:
                        tg.create_task(task(stop))
        finally:
            if self._detect_task is not None and not self._detect_task.done():
                await asyncio.wait({self._detect_task}, timeout=30)
            if otlp is not None:
                await asyncio.to_thread(otlp.shutdown)
            await self._close_parts()
            logger.info("agent stopped")

    async def _close_parts(self) -> None:
        if self.prometheus is not None:
            await self.prometheus.stop()
        if self.sampler is not None:
            await self.sampler.close()
        if self.hooks.scorer is not None:
            await self.hooks.scorer.close()
        if self.hooks.pipeline is not None:
            await self.hooks.pipeline.close()
            with contextlib.suppress(sqlite3.Error):
                self.hooks.pipeline.store.close()
        if self.hooks.store is not None:
            with contextlib.suppress(sqlite3.Error, OSError):
                self.hooks.store.close()

    # ------------------------------------------------------------------ loops
    async def _every(
        self, stop: asyncio.Event, interval: float, body: Callable[[], Awaitable[None]], name: str
    ) -> None:
        """Run ``body`` every ``interval`` seconds of the monotonic clock until stop (aligned to
        multiples of ``interval`` of the agent's time at start); failures are logged, never raised."""
        now = self.clock.now()
        due = self.clock.monotonic() + (math.floor(now / interval) + 1) * interval - now
        first = True
        while not stop.is_set():
            if not first:
                due += interval
            first = False
            if not await self._until_stop(stop, body, name):
                return
            mono = self.clock.monotonic()
            if due <= mono:  # the body overran: skip the missed slots rather than running back to back
                due += math.ceil((mono - due) / interval) * interval
                if due <= mono:
                    due += interval
            sleeper = asyncio.ensure_future(self.clock.sleep(due - mono))
            stopper = asyncio.ensure_future(stop.wait())
            await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
            for t in (sleeper, stopper):
                if not t.done():
                    t.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await t

    async def _until_stop(self, stop: asyncio.Event, body: Callable[[], Awaitable[None]], name: str) -> bool:
        """Run one round of ``body``; a stop cancels a round that hangs (an engine that never
        answers must not hold up shutdown). False when stopped."""
        work = asyncio.ensure_future(body())
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():
            work.cancel()
        elif not stopper.done():
            stopper.cancel()
        for t in (work, stopper):
            with contextlib.suppress(asyncio.CancelledError):
                try:
                    await t
                except Exception:
                    logger.exception("%s loop failed this round; it will run again", name)
        return not stop.is_set()

    async def _nvml_once(self) -> None:
        assert self.sampler is not None
        rnd = await self.sampler.sample()
        self.joiner.add_round(rnd)
        self.ledger.observe_nvml(rnd)
        if self.hooks.store is not None and len(self._nvml_rounds) < MAX_BUFFERED_ROUNDS:
            self._nvml_rounds.append(rnd)  # written with the next tick, in one transaction

    def _write_nvml_rounds(self, store: Store) -> None:
        """Write the NVML rounds sampled since the last tick (one transaction for all of them)."""
        rounds, self._nvml_rounds = self._nvml_rounds, []
        if rounds:
            self.history.call("writing NVML rounds", lambda: store.write_nvml_rounds(self.cfg.node, rounds))

    def _check_clock(self) -> None:
        if not isinstance(self.clock, SteadyClock):
            return
        jump = self.clock.resync()
        if jump is not None and jump.reanchored:
            # restart the cost interval: the next tick only sets the counters' baselines
            self.joiner = self._new_joiner()

    def _follow_engines(self, scrapers: list[EngineScraper]) -> None:
        """Take the engine source's current list (scrapers of unchanged engines are kept)."""
        src = self.hooks.engine_source
        if src is None or src.engines() == self.engines:
            return
        self.engines = src.engines()
        old = {s.cfg.name: s for s in scrapers}
        scrapers[:] = [
            old[e.name]
            if e.name in old and old[e.name].cfg == e
            else EngineScraper(e, self._session, self.clock)
            for e in self.engines
        ]
        self.joiner.engines = tuple(e.cost_spec() for e in self.engines)
        self.versions = VersionReader(self.engines)

    async def _tick_once(self, scrapers: list[EngineScraper]) -> None:
        self._check_clock()
        self._follow_engines(scrapers)
        slots = asyncio.Semaphore(MAX_CONCURRENT_SCRAPES)
        results: list[EngineScrape] = list(await asyncio.gather(*(_bounded(slots, s) for s in scrapers)))
        scrapes = {r.engine: r for r in results}
        for r in results:
            self.ledger.observe_scrape(r)
        tick = self.joiner.close_tick(self.clock.now(), scrapes, self.versions.read())
        self.ledger.apply(tick)
        if self.hooks.pipeline is not None:  # the outbox drains between detections: count it every tick
            self.ledger.set_alerts(self.hooks.pipeline.firing_counts(), self.hooks.pipeline.outbox_pending())
        # publish first: /metrics never waits for (or is stopped by) the store
        self._ticks += 1
        self._last_tick_mono = self.clock.monotonic()
        self._snapshot = self._publish()
        store = self.hooks.store
        if store is not None:
            self._write_nvml_rounds(store)
            self.history.call(
                "writing engine scrapes", lambda: store.write_engine_scrapes(self.cfg.node, results)
            )
            # history keeps priced, finite windows only: an unknown cost must not pull baselines to $0
            priced = [w for w in tick.windows if w.priced]
            finite = [w for w in priced if _finite(w)]
            if len(finite) < len(priced):
                if self._dropped_windows == 0:
                    logger.warning("a window with a non-finite number was kept out of the history")
                self._dropped_windows += len(priced) - len(finite)
            if finite:
                self.history.call("writing cost windows", lambda: store.write_windows(finite))
            if tick.gpus:  # per-GPU dollars: node idle (unused GPUs included) survives in history
                self.history.call("writing GPU costs", lambda: store.write_gpu_costs(self.cfg.node, tick))
            self._snapshot = self._publish()  # store_up may have changed
        for cb in self.hooks.on_tick:
            try:
                cb(tick, self._snapshot)
            except Exception:
                logger.exception("an on_tick hook failed")
        self._maybe_detect(tick.end)

    def _publish(self) -> Snapshot:
        store_up = None if self.hooks.store is None else self.history.up
        snap = self.ledger.snapshot(store_up=store_up)
        src = self.hooks.engine_source
        gpu_pods = src.gpu_pods() if src is not None else {}
        return replace(snap, store_files_recovered_total=self.hooks.recovered_files, gpu_pods=gpu_pods)

    def _maybe_detect(self, tick_end: float) -> None:
        """Start detection up to ``tick_end`` when a window boundary has passed since the last run.

        It runs after the tick wrote its windows, so a minute is never evaluated before its data
        is in the store; one detection at a time (a slow one is caught up by the next)."""
        if self.hooks.pipeline is None:
            return
        slot = math.floor(tick_end / self.cfg.intervals.window_seconds)
        if slot <= self._detected_slot or (self._detect_task is not None and not self._detect_task.done()):
            return
        self._detected_slot = slot
        self._detect_task = asyncio.create_task(self._detect_once(tick_end))

    async def _detect_once(self, now: float) -> None:
        pipeline = self.hooks.pipeline
        assert pipeline is not None
        try:
            if self.hooks.scorer is not None:  # before the rules, which may read anomaly_score
                for (engine, model, version), score in (await self.hooks.scorer.step(now)).items():
                    self.ledger.set_anomaly_score((engine, model, version), score)
            # off the event loop: the first step replays up to a week of history
            await asyncio.to_thread(_run_step, pipeline, now)
        except Exception as err:
            if self._detect_error is None:
                logger.exception("detection failed; it runs again at every window until it works")
            self._detect_error = f"{type(err).__name__}: {err}"
        else:
            if self._detect_error is not None:
                logger.warning("detection works again")
            self._detect_error = None
        self.ledger.set_alerts(pipeline.firing_counts(), pipeline.outbox_pending())
        self._snapshot = self._publish()


def _run_step(pipeline: Pipeline, now: float) -> None:
    """One pipeline step in a worker thread (its store connection is its own)."""
    asyncio.run(pipeline.step(now))
