"""The daemon: one asyncio TaskGroup of isolated loops, shut down cleanly on a stop event.

Loops (each catches and logs its own failures, so one failing loop never stops the others):
- NVML: one batched round every ``intervals.nvml_seconds``, off the event loop;
- tick: scrape every engine concurrently every ``intervals.scrape_seconds``, join with the NVML
  rounds since the last tick, price, update the ledger, write the windows to the store;
- detect: once a tick has written a window boundary's data, score and evaluate rules up to the tick's
  time and run the alert lifecycle (in its own task, so a slow forest refit never delays a tick);
- delivery: the outbox to Slack / PagerDuty / webhook;
- exporters: Prometheus endpoint (always), OTLP push (when configured).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import aiohttp

from agent import __version__
from agent.clock import Clock
from agent.config import Config, EngineConfig
from agent.cost.window import TickResult, WindowJoiner
from agent.samples import EngineScrape
from agent.sinks.otlp import OtlpExporter
from agent.sinks.prometheus import PrometheusServer
from agent.snapshot import Ledger, Snapshot
from agent.sources.discovery import VersionReader
from agent.sources.engines.scraper import EngineScraper
from agent.sources.nvml.backend import NvmlBackend
from agent.sources.nvml.sampler import NvmlSampler
from agent.sources.prices import PriceBook

if TYPE_CHECKING:
    from agent.detect.pipeline import Pipeline
    from agent.detect.scoring import AnomalyScorer
    from agent.store import Store

logger = logging.getLogger(__name__)


@dataclass
class Hooks:
    """Optional parts wired in by the CLI (kept optional so the core runs alone)."""

    on_tick: list[Callable[[TickResult, Snapshot], None]] = field(default_factory=list)
    store: Store | None = None
    pipeline: Pipeline | None = None
    scorer: AnomalyScorer | None = None


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
        self.engines = tuple(cfg.engines if engines is None else engines)
        self.hooks = hooks or Hooks()
        self.ledger = Ledger(cfg.node, __version__, trailing_seconds=cfg.intervals.window_seconds)
        self.joiner = WindowJoiner(
            cfg.node, [e.cost_spec() for e in self.engines], book.table(), cfg.prices.share_policy
        )
        self.backend = backend
        self.sampler = NvmlSampler(backend, clock) if backend is not None else None
        self.versions = VersionReader(self.engines)
        self.prometheus: PrometheusServer | None = None
        self.started = asyncio.Event()
        self._ticks = 0
        self._detected_slot = -1
        self._detect_task: asyncio.Task[None] | None = None
        self._snapshot = self.ledger.snapshot()

    # ------------------------------------------------------------------ public
    def snapshot(self) -> Snapshot:
        """The latest snapshot (what /metrics serves)."""
        return self._snapshot

    async def run(self, stop: asyncio.Event) -> None:
        """Run every loop until ``stop`` is set, then shut down cleanly."""
        if self.sampler is not None:
            await self.sampler.start()
        else:
            logger.info("no NVML backend: GPU series are absent, engines are still scraped")
        exp = self.cfg.exporters
        if exp.prometheus.enabled:
            self.prometheus = PrometheusServer(
                self.snapshot, lambda: self._ticks > 0, exp.prometheus.host, exp.prometheus.port
            )
            await self.prometheus.start()
        otlp = OtlpExporter(self.snapshot, exp.otlp, self.cfg.node) if exp.otlp.endpoint else None
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
        finally:
            if self._detect_task is not None and not self._detect_task.done():
                await asyncio.wait({self._detect_task}, timeout=30)
            if otlp is not None:
                await asyncio.to_thread(otlp.shutdown)
            if self.prometheus is not None:
                await self.prometheus.stop()
            if self.sampler is not None:
                await self.sampler.close()
            if self.hooks.scorer is not None:
                await self.hooks.scorer.close()
            if self.hooks.pipeline is not None:
                await self.hooks.pipeline.close()
            if self.hooks.store is not None:
                self.hooks.store.close()
            logger.info("agent stopped")

    # ------------------------------------------------------------------ loops
    async def _every(
        self, stop: asyncio.Event, interval: float, body: Callable[[], Awaitable[None]], name: str
    ) -> None:
        """Run ``body`` at each multiple of ``interval`` of the clock until stop; failures are logged."""
        while not stop.is_set():
            try:
                await body()
            except Exception:
                logger.exception("%s loop failed this round; it will run again", name)
            now = self.clock.now()
            wait = (math.floor(now / interval) + 1) * interval - now
            sleeper = asyncio.ensure_future(self.clock.sleep(wait))
            stopper = asyncio.ensure_future(stop.wait())
            await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
            for t in (sleeper, stopper):
                if not t.done():
                    t.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await t

    async def _nvml_once(self) -> None:
        assert self.sampler is not None
        rnd = await self.sampler.sample()
        self.joiner.add_round(rnd)
        self.ledger.observe_nvml(rnd)
        if self.hooks.store is not None:
            self.hooks.store.write_nvml_round(self.cfg.node, rnd)

    async def _tick_once(self, scrapers: Sequence[EngineScraper]) -> None:
        results: list[EngineScrape] = list(await asyncio.gather(*(s.scrape() for s in scrapers)))
        scrapes = {r.engine: r for r in results}
        for r in results:
            self.ledger.observe_scrape(r)
        tick = self.joiner.close_tick(self.clock.now(), scrapes, self.versions.read())
        self.ledger.apply(tick)
        if self.hooks.store is not None:
            self.hooks.store.write_engine_scrapes(self.cfg.node, results)
            # history keeps priced windows only: an unknown cost must not pull baselines towards $0
            priced = [w for w in tick.windows if w.priced]
            if priced:
                self.hooks.store.write_windows(priced)
        self._ticks += 1
        self._snapshot = self.ledger.snapshot()
        for cb in self.hooks.on_tick:
            cb(tick, self._snapshot)
        self._maybe_detect(tick.end)

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
        self._detect_task.add_done_callback(_log_failure)

    async def _detect_once(self, now: float) -> None:
        pipeline = self.hooks.pipeline
        assert pipeline is not None
        if self.hooks.scorer is not None:  # before the rules, which may read anomaly_score
            for (engine, model, version), score in (await self.hooks.scorer.step(now)).items():
                self.ledger.set_anomaly_score((engine, model, version), score)
        await pipeline.step(now)
        self.ledger.set_alerts(pipeline.firing_counts(), pipeline.outbox_pending())
        self._snapshot = self.ledger.snapshot()


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error(
            "detection failed this round; it runs again at the next window", exc_info=task.exception()
        )
