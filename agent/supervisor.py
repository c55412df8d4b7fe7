"""The daemon: one asyncio TaskGroup running a list of :class:`Loop` (each an interval and a round
to run, or a part that runs until stop, and its close), shut down cleanly on a stop event: every
part's close gets the one shutdown deadline (:data:`SHUTDOWN_SECONDS`), in the list's order.

Loops (each catches and logs its own failures, so one failing loop never stops the others):
- NVML: one batched round every ``intervals.nvml_seconds``, off the event loop;
- tick: scrape every engine concurrently every ``intervals.scrape_seconds``, join with the NVML
  rounds since the last tick, price, update the ledger and publish the snapshot (what /metrics
  serves) — *then* write the windows to the store. The store is behind a :class:`HistoryGuard`: a
  failing disk (full, read-only, I/O errors) degrades history only (``infercost_store_up`` 0, one
  log line per state change, retries with backoff); the snapshot and /metrics never wait for it.
  What a tick writes goes through a :class:`HistoryBuffer` of minute rows in memory, so while the
  store fails no minute is lost (up to :data:`HISTORY_BUFFER_SECONDS`; the oldest minutes past it
  are dropped, counted and logged) and each is written, whole, when the store works again;
- minutes tell the truth: a tick longer than :data:`LONG_TICK_INTERVALS` scrape intervals (the
  process paused, a blocked loop) is spread over the minutes it covers, marked estimated and
  logged; its windows are joined with the next tick's first (a pause between a scrape and the
  tick's close puts the pause's tokens in the next tick). An engine's windows while it is down are
  held back and joined with the tick it comes back in (whose tokens were made during the outage),
  then spread over the outage the same way;
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
import signal
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from agent import __version__
from agent.clock import Clock, SteadyClock
from agent.config import Config, ConfigError, EngineConfig
from agent.cost.window import TickResult, WindowJoiner
from agent.records import MINUTE
from agent.samples import CostWindow, EngineScrape, NvmlRound
from agent.sinks.prometheus import PrometheusServer
from agent.sinks.webconfig import load_web_config
from agent.snapshot import Ledger, Snapshot
from agent.sources.discovery import VersionReader
from agent.sources.engines.scraper import EngineScraper, PageBudget, PageThread
from agent.sources.nvml.backend import NvmlBackend
from agent.sources.nvml.sampler import NvmlSampler
from agent.sources.prices import PriceBook, load_price_book

if TYPE_CHECKING:
    from agent.detect.pipeline import Pipeline
    from agent.detect.rules import RuleSet
    from agent.detect.scoring import AnomalyScorer
    from agent.sinks.delivery import Delivery
    from agent.sinks.otlp import OtlpExporter
    from agent.sources.kube.source import KubeEngines as EngineSource
    from agent.store import GpuCostSpan, ModelSpan, Store

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
# Why 3: the tick loop skips a slot it overran (a slow scrape, whose timeout is normally below the
# interval, or a slow NVML round), so a working loop's tick covers one or two intervals; a tick of
# three or more means the loop did not run at all (the process stopped, a GC stall, a blocked loop),
# and its window spans minutes that must each get their share rather than the first one all of it.
LONG_TICK_INTERVALS = 3.0
# Why 6 h: a full or read-only disk at night waits for the person on call to free it, and a night on
# call is hours; at a few series per node that is a few thousand minute rows (megabytes). Past it the
# oldest minutes are dropped (counted in infercost_store_dropped_seconds_total, logged once).
HISTORY_BUFFER_SECONDS = 6 * 3600.0
# Why 1 h: an engine's windows are held back while it is down (one summed span per series, so memory
# does not grow), to be joined with the tick it comes back in; detectors read history, so an outage
# longer than an hour is written as the idle cost it is so far instead of staying out of history.
MAX_HELD_OUTAGE_SECONDS = 3600.0
# Why 1 s .. 5 min: a full disk or a remounted volume is fixed by a person in minutes; retrying
# faster only floods the log, slower leaves history paused long after the fix.
HISTORY_RETRY_MIN_SECONDS = 1.0
HISTORY_RETRY_MAX_SECONDS = 300.0
# Why 20 s: Kubernetes kills a pod 30 s after SIGTERM (terminationGracePeriodSeconds' default); every
# part closes by this one deadline (an unfinished detection, an OTLP flush, a hung sink abandoned).
SHUTDOWN_SECONDS = 20.0
# Why 0.5 s: a part reached after the deadline still gets this long, so what closes at once (a file, a
# session, killing the fit's process) is never left open; the few parts' slices and the last history
# write stay inside the 10 s left before the kill.
CLOSE_GRACE_SECONDS = 0.5


# Why 5 s: an edited price book or rule file takes effect within one default scrape interval, and a
# stat of a handful of files costs microseconds. Kubernetes swaps a mounted ConfigMap's files by
# symlink, which the inode in the signature catches.
CONFIG_POLL_SECONDS = 5.0


class ConfigWatch:
    """The price book and rule files a running agent reloads: on SIGHUP and when one changes (its
    inode, modification time or size; a rule folder's listing too)."""

    def __init__(self, book: Path | None, rules_dirs: Sequence[Path], rules: bool) -> None:
        self.book = book  # None: the bundled example book, not watched
        self.rules_dirs = tuple(rules_dirs) if rules else ()  # empty: the bundled rules, not watched

    @property
    def watched(self) -> bool:
        """Whether anything is reloaded at all."""
        return self.book is not None or bool(self.rules_dirs)

    def signature(self) -> tuple[tuple[str, int, int, int], ...]:
        """What identifies the files' current contents (missing files included, as -1)."""
        paths: list[Path] = [] if self.book is None else [self.book]
        for d in self.rules_dirs:
            paths.append(d)
            if d.is_dir():
                paths.extend(sorted(f for f in d.iterdir() if f.suffix in (".yaml", ".yml")))
        out = []
        for p in paths:
            try:
                st = p.stat()
            except OSError:
                out.append((str(p), -1, -1, -1))
                continue
            out.append((str(p), st.st_ino, st.st_mtime_ns, -1 if p.is_dir() else st.st_size))
        return tuple(out)


class StartupError(Exception):
    """A problem at start-up that the operator fixes (busy port, state dir held by another agent);
    the message says what and how. ``cli.py`` turns it into exit code 2."""


@dataclass(frozen=True, slots=True)
class Loop:
    """One of the daemon's loops. With ``run_once`` and ``interval`` (seconds): one round every
    interval of the monotonic clock (aligned to its multiples; a round that fails is logged and the
    next one runs, a round that hangs is cancelled at stop). With ``run``: started once, runs until
    the stop event is set (a part with tasks of its own: delivery's one per sink, the Kubernetes
    watch, the weekly report). At shutdown ``close(deadline)`` is awaited with the one deadline
    every part shares (the event loop's time, seconds); past it the part is abandoned."""

    name: str
    run_once: Callable[[], Awaitable[None]] | None = None
    interval: float | None = None  # seconds, with run_once
    run: Callable[[asyncio.Event], Awaitable[None]] | None = None
    close: Callable[[float], Awaitable[None]] | None = None

    def __post_init__(self) -> None:
        if (self.run_once is None) == (self.run is None) or (self.run_once is None) != (
            self.interval is None
        ):
            raise ValueError(f"loop {self.name}: either run_once with an interval, or run")


async def close_by(deadline: float, what: str, close: Awaitable[None]) -> None:
    """Await one part's close until ``deadline`` (event-loop time; at least
    :data:`CLOSE_GRACE_SECONDS`); log, never raise, what fails or overruns (a shutdown step that
    fails must not keep the others from running)."""
    left = max(CLOSE_GRACE_SECONDS, deadline - asyncio.get_running_loop().time())
    try:
        await asyncio.wait_for(close, left)
    except TimeoutError:
        logger.warning("%s did not close within the shutdown deadline; abandoned", what)
    except Exception:
        logger.exception("shutdown of %s failed", what)


@dataclass
class Hooks:
    """Optional parts wired in by :func:`agent.app.build_agent` (optional so the core runs alone)."""

    on_tick: list[Callable[[TickResult, Snapshot], None]] = field(default_factory=list)
    store: Store | None = None  # the tick's connection (writes)
    pipeline: Pipeline | None = None  # runs in a worker thread over its own store connection
    delivery: Delivery | None = None  # the outbox and notifiers the pipeline's events go through
    scorer: AnomalyScorer | None = None
    closers: list[Callable[[], None]] = field(default_factory=list)  # run last at shutdown (e.g. the lock)
    history_note: str | None = None  # why history is off or degraded, for /healthz
    history_expected: bool = False  # history was asked for: without a store, store_up is 0
    history_temporary: bool = False  # the store is a private temporary one (state_dir takes no writes)
    rules_reload: bool = True  # the rules came from alerts.rules_dirs (False: handed in, not reloaded)
    nvml_expected: bool = False  # nvml.backend auto/real but no backend: export nvml_up 0
    recovered_files: int = 0  # damaged SQLite files moved aside at start
    engine_source: EngineSource | None = None  # engines that come and go (Kubernetes discovery)
    loops: list[Loop] = field(default_factory=list)  # more loops, run with the daemon's (the weekly report)
    # more GET paths on the /metrics server, behind its TLS and auth (path → aiohttp handler: the cost API)
    routes: dict[str, Callable[[Any], Awaitable[Any]]] = field(default_factory=dict)


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

    def call(self, what: str, fn: Callable[[], Any], force: bool = False) -> bool:
        """Run ``fn`` unless backing off (``force``: even then); True when it ran and succeeded."""
        if not self.up and not force and self._clock.monotonic() < self._retry_at:
            self.failures += 1
            return False
        try:
            fn()
        except (sqlite3.Error, OSError) as err:
            self.failures += 1
            self.error = f"{type(err).__name__}: {err}"
            if self.up:
                self.up = False
                from agent.state import is_corrupt

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
            logger.warning(
                "history store works again after %d failed or skipped writes; the minutes kept in memory "
                "meanwhile are written now",
                self.failures,
            )
            self.up = True
            self.error = None
            self.failures = 0
            self._delay = HISTORY_RETRY_MIN_SECONDS
        return True


class HistoryBuffer:
    """What ticks produced for the history and the store has not taken yet: model and GPU-dollar
    rows per minute (spans of one minute each, summed), engine scrapes and NVML rounds.

    Bounded by minutes held (``max_minutes``; the oldest minute's rows go first) and NVML rounds
    (``max_rounds``). Written in time order by :meth:`flush`; each part leaves the buffer only once
    its transaction committed, and the store's merges are idempotent, so a retry never counts twice."""

    def __init__(self, max_minutes: int, max_rounds: int = MAX_BUFFERED_ROUNDS) -> None:
        self.max_minutes = max_minutes
        self.max_rounds = max_rounds
        self.dropped_minutes = 0  # minutes dropped past the bound, ever
        self._models: dict[tuple[tuple[str, ...], int], ModelSpan] = {}
        self._gpus: dict[tuple[str, int], GpuCostSpan] = {}
        self._scrapes: list[EngineScrape] = []
        self._rounds: list[NvmlRound] = []

    def __len__(self) -> int:
        return len(self._models) + len(self._gpus) + len(self._scrapes) + len(self._rounds)

    def add_spans(self, spans: Sequence[ModelSpan]) -> None:
        """Add model spans (each within one minute), summed per series and minute."""
        from agent.store import join_spans

        for sp in spans:
            key = (sp.keys, _minute_of(sp.start))
            cur = self._models.get(key)
            self._models[key] = sp if cur is None else join_spans(cur, sp)

    def add_gpu_spans(self, spans: Sequence[GpuCostSpan]) -> None:
        """Add GPU dollar spans (each within one minute), summed per GPU and minute."""
        for sp in spans:
            key = (sp.gpu, _minute_of(sp.start))
            cur = self._gpus.get(key)
            self._gpus[key] = sp if cur is None else _join_gpu(cur, sp)

    def add_samples(self, scrapes: Sequence[EngineScrape], rounds: Sequence[NvmlRound]) -> None:
        """Add one tick's engine scrapes (only what history keeps of them) and NVML rounds."""
        self._scrapes.extend(replace(s, models=(), invalid_series=()) for s in scrapes)
        self._rounds.extend(rounds)
        del self._rounds[: max(0, len(self._rounds) - self.max_rounds)]

    def trim(self) -> list[int]:
        """Drop the oldest minutes beyond ``max_minutes``; returns the minutes dropped."""
        minutes = sorted({m for _, m in self._models} | {m for _, m in self._gpus})
        if len(minutes) <= self.max_minutes:
            return []
        dropped = minutes[: len(minutes) - self.max_minutes]
        last = dropped[-1]
        self._models = {k: v for k, v in self._models.items() if k[1] > last}
        self._gpus = {k: v for k, v in self._gpus.items() if k[1] > last}
        self._scrapes = [s for s in self._scrapes if _minute_of(s.timestamp) > last]
        self._rounds = [r for r in self._rounds if _minute_of(r.timestamp) > last]
        self.dropped_minutes += len(dropped)
        return dropped

    def flush(self, store: Store, node: str) -> None:
        """Write everything held, oldest first; raises what the store raises (the rest stays)."""
        if self._rounds:
            store.write_nvml_rounds(node, self._rounds)
            self._rounds = []
        if self._scrapes:
            store.write_engine_scrapes(node, self._scrapes)
            self._scrapes = []
        if self._models:
            store.write_spans(sorted(self._models.values(), key=lambda sp: sp.start))
            self._models = {}
        if self._gpus:
            store.write_gpu_spans(node, sorted(self._gpus.values(), key=lambda sp: sp.start))
            self._gpus = {}


def _minute_of(t: float) -> int:
    return int(t // MINUTE * MINUTE)


def _join_gpu(a: GpuCostSpan, b: GpuCostSpan) -> GpuCostSpan:
    """``a`` then ``b`` (same GPU) as one span."""
    return replace(
        a,
        end=max(a.end, b.end),
        cost_usd=a.cost_usd + b.cost_usd,
        idle_usd=a.idle_usd + b.idle_usd,
        unallocated_usd=a.unallocated_usd + b.unallocated_usd,
    )


def outage_span(held: ModelSpan, back: ModelSpan) -> ModelSpan:
    """An outage's held windows joined with the window its engine came back in: the tokens counted
    then were made over the whole span, so where there are any, none of its dollars were idle."""
    from agent.store import join_spans

    sp = join_spans(held, back)
    if sp.sums.get("prompt_tokens", 0.0) + sp.sums.get("generation_tokens", 0.0) > 0:
        sp = replace(sp, sums={**sp.sums, "idle_usd": 0.0})
    return sp


def _utc(t: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(t, tz=dt.UTC).strftime("%Y-%m-%dT%H:%MZ")


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
        # one budget of page bytes in flight for every scraper, static and discovered alike
        self.page_budget = PageBudget(cfg.limits.page_bytes_in_flight)
        self.page_thread = PageThread()  # and one thread where every page is parsed, off the event loop
        self.ledger = Ledger(
            cfg.node,
            __version__,
            trailing_seconds=cfg.intervals.window_seconds,
            expire_after_seconds=cfg.limits.series_ttl_seconds,
        )
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
        interval = cfg.intervals.scrape_seconds
        self._buffer = HistoryBuffer(max(1, math.ceil(HISTORY_BUFFER_SECONDS / MINUTE)))
        self._long_tick_seconds = LONG_TICK_INTERVALS * interval  # seconds
        self._held: dict[tuple[str, ...], ModelSpan] = {}  # series → its windows while its engine is down
        self._dropping = False  # minutes are being dropped from the buffer (logged once per outage)
        rules = self.hooks.pipeline is not None and self.hooks.rules_reload
        self.watch = ConfigWatch(cfg.prices.book, cfg.alerts.rules_dirs, rules)
        self._watch_sig = self.watch.signature()  # the files as loaded at start
        self.reload_ok = True  # the last load (start, SIGHUP or change) succeeded
        self.reloads = 0  # reloads tried, ever
        self._reload_wanted = asyncio.Event()  # set by SIGHUP
        self._new_rules: RuleSet | None = None  # a reloaded rule set, taken between two detections
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
            self.cfg.limits.series_ttl_seconds,
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
                await self._shutdown(self._loops([]))
                raise
            self.prometheus = PrometheusServer(
                self.snapshot,
                self.health,
                exp.prometheus.host,
                exp.prometheus.port,
                web_config=web_cfg,
                routes=self.hooks.routes,
            )
            try:
                await self.prometheus.start()
            except OSError as err:
                await self._shutdown(self._loops([]))
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
        hup = self._on_sighup()
        loops: list[Loop] = []
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                self._session = session
                loops = self._loops([self._scraper(e) for e in self.engines])
                async with asyncio.TaskGroup() as tg:
                    for loop in loops:
                        tg.create_task(self._run_loop(loop, stop), name=loop.name)
        finally:
            if hup:
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            await self._shutdown(loops or self._loops([]), otlp)
            logger.info("agent stopped")

    def _loops(self, scrapers: list[EngineScraper]) -> list[Loop]:
        """The daemon's loops, in the order they close: NVML, the tick (then detection and the last
        history write), delivery, engine discovery, the hooks' loops, the config watch."""
        iv = self.cfg.intervals
        loops: list[Loop] = []
        sampler = self.sampler
        if sampler is not None:
            loops.append(Loop("nvml", self._nvml_once, iv.nvml_seconds, close=lambda _: sampler.close()))
        loops.append(
            Loop("tick", lambda: self._tick_once(scrapers), iv.scrape_seconds, close=self._close_tick)
        )
        delivery = self.hooks.delivery
        if delivery is not None:
            loops.append(Loop("delivery", run=delivery.run, close=lambda _: delivery.close()))
        if self.hooks.engine_source is not None:
            loops.append(Loop("engine discovery", run=self.hooks.engine_source.run))
        loops.extend(self.hooks.loops)
        loops.append(Loop("config watch", run=self._watch_config))
        return loops

    async def _run_loop(self, loop: Loop, stop: asyncio.Event) -> None:
        if loop.run_once is not None and loop.interval is not None:
            await self._every(stop, loop.interval, loop.run_once, loop.name)
        elif loop.run is not None:
            await loop.run(stop)

    async def _close_tick(self, deadline: float) -> None:
        """The tick loop's close: let a detection in flight finish (by ``deadline``), then write what
        is held and buffered."""
        if self._detect_task is not None and not self._detect_task.done():
            await close_by(deadline, "detection", asyncio.shield(self._detect_task))
        self._last_history_write()

    async def _shutdown(self, loops: Sequence[Loop], otlp: OtlpExporter | None = None) -> None:
        """Close every part by one deadline (:data:`SHUTDOWN_SECONDS` from now, event-loop time):
        the loops' closes in their order, then a last OTLP flush, the page thread, the /metrics
        server, the scorer and the store connections."""
        deadline = asyncio.get_running_loop().time() + SHUTDOWN_SECONDS
        for loop in loops:
            if loop.close is not None:
                await close_by(deadline, loop.name, loop.close(deadline))
        if otlp is not None:
            await close_by(deadline, "OTLP export", asyncio.to_thread(otlp.shutdown))
        self.page_thread.close()
        if self.prometheus is not None:
            await close_by(deadline, "the /metrics server", self.prometheus.stop())
        if self.hooks.scorer is not None:
            await close_by(deadline, "the anomaly scorer", self.hooks.scorer.close())
        if self.hooks.pipeline is not None:
            with contextlib.suppress(sqlite3.Error):
                self.hooks.pipeline.store.close()
        if self.hooks.store is not None:
            with contextlib.suppress(sqlite3.Error, OSError):
                self.hooks.store.close()

    # ------------------------------------------------------------------ config reload
    def _on_sighup(self) -> bool:
        """SIGHUP asks for a reload (never the default: the process ending); False where the loop
        cannot take signals (not the main thread)."""
        try:
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.request_reload)
        except (ValueError, RuntimeError, NotImplementedError):
            return False
        return True

    def request_reload(self) -> None:
        """Reload the price book and rule files now (what SIGHUP does)."""
        self._reload_wanted.set()

    async def _watch_config(self, stop: asyncio.Event) -> None:
        """Reload on SIGHUP, and when a watched file changes (polled every CONFIG_POLL_SECONDS)."""
        while not stop.is_set():
            waits = [
                asyncio.ensure_future(self.clock.sleep(CONFIG_POLL_SECONDS)),
                asyncio.ensure_future(self._reload_wanted.wait()),
                asyncio.ensure_future(stop.wait()),
            ]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for t in waits:
                if not t.done():
                    t.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await t
            if stop.is_set():
                return
            asked = self._reload_wanted.is_set()
            self._reload_wanted.clear()
            try:
                sig = await asyncio.to_thread(self.watch.signature)
                if asked or (self.watch.watched and sig != self._watch_sig):
                    self._watch_sig = sig
                    await self.reload("SIGHUP" if asked else "a change")
            except Exception:
                logger.exception("config reload failed unexpectedly; the last good version is kept")

    async def reload(self, why: str = "a request") -> bool:
        """Load the price book and rule files again; take them only if all of them load, else keep
        the last good ones (one log line, ``infercost_config_reload_success`` 0). True on success."""
        from agent.config import ConfigError
        from agent.detect.rules import RuleError, load_rules

        self.reloads += 1
        book, rules = self.book, None
        try:
            if self.watch.book is not None:
                book = await asyncio.to_thread(load_price_book, self.watch.book, self.clock.now())
            if self.watch.rules_dirs:
                rules = await asyncio.to_thread(load_rules, self.watch.rules_dirs)
        except (ConfigError, RuleError) as err:
            self.reload_ok = False
            logger.error(
                "config reload after %s failed, the last good price book and rules are kept: %s",
                why,
                str(err).replace("\n", "; "),
                extra={"subject": f"reload {self.reloads}"},  # each attempt its line (the log's limit)
            )
            self._snapshot = self._publish()
            return False
        self.book = book
        self.joiner.prices = book.table()
        if rules is not None:
            self._new_rules = rules
            self._take_rules()
        self.reload_ok = True
        logger.info(
            "config reloaded after %s: %s%s",
            why,
            f"price book {self.watch.book}" if self.watch.book is not None else "bundled price book",
            f", {len(rules.rules)} rules from {', '.join(map(str, self.watch.rules_dirs))}" if rules else "",
        )
        self._snapshot = self._publish()
        return True

    def _take_rules(self) -> None:
        """Hand a reloaded rule set to the pipeline between two detections (a detection runs in a
        worker thread: its rules never change under it)."""
        pipeline = self.hooks.pipeline
        rules = self._new_rules
        if pipeline is None or rules is None:
            return
        if self._detect_task is not None and not self._detect_task.done():
            return  # taken when that detection ends, before the next starts
        self._new_rules = None
        pipeline.replace_rules(rules)
        self.ledger.declare_alert_rules((r.id, r.severity) for r in rules)

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
            old[e.name] if e.name in old and old[e.name].cfg == e else self._scraper(e) for e in self.engines
        ]
        self.joiner.engines = tuple(e.cost_spec() for e in self.engines)
        self.versions = VersionReader(self.engines)

    def _scraper(self, engine: EngineConfig) -> EngineScraper:
        """A scraper of one engine, sharing the daemon's session, page budget and page thread."""
        return EngineScraper(
            engine, self._session, self.clock, self.cfg.limits, self.page_budget, self.page_thread
        )

    async def _tick_once(self, scrapers: list[EngineScraper]) -> None:
        self._check_clock()
        self._follow_engines(scrapers)
        self.ledger.observe_engines(self.engines, self.cfg.cost_label_keys())
        slots = asyncio.Semaphore(MAX_CONCURRENT_SCRAPES)
        results: list[EngineScrape] = list(await asyncio.gather(*(_bounded(slots, s) for s in scrapers)))
        scrapes = {r.engine: r for r in results}
        for r in results:
            self.ledger.observe_scrape(r)
        tick = self.joiner.close_tick(self.clock.now(), scrapes, self.versions.read())
        self.ledger.apply(tick)
        if self.hooks.pipeline is not None:  # the outbox drains between detections: count it every tick
            self._count_alerts(self.hooks.pipeline)
        # publish first: /metrics never waits for (or is stopped by) the store
        self._ticks += 1
        self._last_tick_mono = self.clock.monotonic()
        self._snapshot = self._publish()
        store = self.hooks.store
        if store is not None:
            self._buffer_tick(tick, results)
            self.history.call("writing history", lambda: self._buffer.flush(store, self.cfg.node))
            if self.history.up:
                self._dropping = False
            self._snapshot = self._publish()  # store_up may have changed
        for cb in self.hooks.on_tick:
            try:
                cb(tick, self._snapshot)
            except Exception:
                logger.exception("an on_tick hook failed")
        self._maybe_detect(tick.end)

    # ------------------------------------------------------------------ history
    def _buffer_tick(self, tick: TickResult, scrapes: Sequence[EngineScrape]) -> None:
        """Put what this tick writes into the history buffer: minutes that tell the truth (see the
        module docstring), the oldest dropped past the bound."""
        from agent.store import gpu_cost_spans, spread_gpu_span

        rounds, self._nvml_rounds = self._nvml_rounds, []
        self._buffer.add_samples(scrapes, rounds)
        # history keeps priced, finite windows only: an unknown cost must not pull baselines to $0
        priced = [w for w in tick.windows if w.priced]
        finite = [w for w in priced if _finite(w)]
        if len(finite) < len(priced):
            if self._dropped_windows == 0:
                logger.warning("a window with a non-finite number was kept out of the history")
            self._dropped_windows += len(priced) - len(finite)
        long = tick.end - tick.start > self._long_tick_seconds
        self._buffer.add_spans(self._minute_spans(tick, finite, long))
        if tick.gpus:  # per-GPU dollars: node idle (unused GPUs included) survives in history
            gpu = gpu_cost_spans(tick)
            self._buffer.add_gpu_spans([p for sp in gpu for p in spread_gpu_span(sp)] if long else gpu)
        if long:
            logger.warning(
                "a tick covered %.1f s, %.1f scrape intervals (the agent was stopped or its loop blocked): "
                "its windows are spread over the minutes %s to %s, marked estimated",
                tick.end - tick.start,
                (tick.end - tick.start) / self.cfg.intervals.scrape_seconds,
                _utc(tick.start),
                _utc(tick.end),
            )
        dropped = self._buffer.trim()
        if dropped and not self._dropping:
            self._dropping = True
            logger.error(
                "history store down for longer than the %.0f h of minutes kept in memory: dropping the "
                "oldest (from %s; infercost_store_dropped_seconds_total counts them)",
                HISTORY_BUFFER_SECONDS / 3600,
                _utc(dropped[0]),
            )

    def _minute_spans(self, tick: TickResult, windows: Sequence[CostWindow], long: bool) -> list[ModelSpan]:
        """The tick's windows as spans for the buffer. Held back: a down engine's windows, and a long
        tick's (its counters may have been read before the pause, so the pause's tokens can come in
        the next tick). The next window of a held series is joined with what was held and the whole
        spread over the minutes it covers."""
        from agent.store import join_spans, span_of, spread_span

        out: list[ModelSpan] = []
        touched: set[tuple[str, ...]] = set()
        back: dict[str, float] = {}
        for w in windows:
            sp = span_of(w)
            touched.add(sp.keys)
            held = self._held.pop(sp.keys, None)
            if long or sp.engine in tick.down_since:
                self._held[sp.keys] = sp if held is None else join_spans(held, sp)
                continue
            if held is None:
                out.append(sp)
                continue
            joined = outage_span(held, sp)
            if sp.engine in tick.gap_since:
                back[sp.engine] = joined.start
            out.extend(spread_span(joined))
        for keys, held in list(self._held.items()):  # an engine gone, or down for too long
            if keys not in touched or held.end - held.start > MAX_HELD_OUTAGE_SECONDS:
                out.extend(spread_span(self._held.pop(keys)))
        for engine, since in back.items():
            logger.info(
                "engine %s read again after %.0f s: the tokens it counted meanwhile are spread over the "
                "minutes %s to %s with the outage's cost, marked estimated",
                engine,
                tick.end - since,
                _utc(since),
                _utc(tick.end),
            )
        return out

    def _last_history_write(self) -> None:
        """At shutdown: what is held and buffered, written once more (even while backing off)."""
        store = self.hooks.store
        if store is None:
            return
        from agent.store import spread_span

        self._buffer.add_spans([p for sp in self._held.values() for p in spread_span(sp)])
        self._held = {}
        if len(self._buffer) and not self.history.call(
            "writing history at shutdown", lambda: self._buffer.flush(store, self.cfg.node), force=True
        ):
            logger.error("history store still fails at shutdown: the minutes kept in memory are lost")

    def _publish(self) -> Snapshot:
        if self.hooks.store is None:  # history wanted but unavailable: down, not absent
            store_up = False if self.hooks.history_expected else None
        else:
            store_up = self.history.up and not self.hooks.history_temporary
        snap = self.ledger.snapshot(store_up=store_up)
        src = self.hooks.engine_source
        gpu_pods = src.gpu_pods() if src is not None else {}
        return replace(
            snap,
            store_files_recovered_total=self.hooks.recovered_files,
            kube_engines_over_cap=src.over_cap if src is not None else None,
            store_dropped_seconds_total=self._buffer.dropped_minutes * MINUTE,
            config_reload_success=self.reload_ok,
            gpu_pods=gpu_pods,
            budgets=tuple((b.scope, b.name, b.monthly_usd) for b in self.cfg.budgets),
        )

    def _maybe_detect(self, tick_end: float) -> None:
        """Start detection up to ``tick_end`` when a window boundary has passed since the last run.

        It runs after the tick wrote its windows, so a minute is never evaluated before its data
        is in the store; one detection at a time (a slow one is caught up by the next)."""
        if self.hooks.pipeline is None:
            return
        self._take_rules()
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
            # off the event loop, its store connection its own: the first step replays up to a week
            await asyncio.to_thread(pipeline.step, now)
        except Exception as err:
            if self._detect_error is None:
                logger.exception("detection failed; it runs again at every window until it works")
            self._detect_error = f"{type(err).__name__}: {err}"
        else:
            if self._detect_error is not None:
                logger.warning("detection works again")
            self._detect_error = None
        self._count_alerts(pipeline)
        self._snapshot = self._publish()

    def _count_alerts(self, pipeline: Pipeline) -> None:
        """Firing alerts and undelivered notifications into the ledger."""
        delivery = self.hooks.delivery
        self.ledger.set_alerts(pipeline.firing_counts(), delivery.pending() if delivery is not None else {})
