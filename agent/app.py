"""The composition root: :func:`build_agent` wires the daemon from a config, for ``infercost run``,
``infercost demo``, the benchmarks and the tests alike (no other place builds an Agent).

What it wires, in order: the clock (a :class:`~agent.clock.SteadyClock`: monotonic intervals, wall
time only for labels), the price book, the NVML backend, the engines (configured, or found on the
default local ports), the state directory (an exclusive lock; damaged SQLite files moved aside; a
read-only or full directory means running without history), the history store (deploys decided by
:func:`agent.detect.deploys.record_deploy`), the delivery of alerts (outbox and notifiers,
:class:`agent.sinks.delivery.Delivery`), the detection pipeline (rules and alert lifecycle, its
events to that delivery) and the isolation-forest scorer.

Every seam is a keyword argument, so tests and the simulator inject a clock, a fake NVML load, the
simulated engines, a rule subset or sinks, and still run the real daemon.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from agent.clock import Clock, SteadyClock, SystemClock
from agent.config import Config, EngineConfig
from agent.cost.window import TickResult
from agent.snapshot import Snapshot
from agent.sources.nvml.backend import NvmlBackend
from agent.sources.nvml.sampler import LoadFn, make_backend
from agent.sources.prices import PriceBook, load_price_book
from agent.state import HISTORY_NAME, OUTBOX_NAME, StateDir, StateDirError, open_recovering, write_problem
from agent.state import open_state_dir as _open_state_dir
from agent.supervisor import Agent, Hooks, Loop, StartupError

if TYPE_CHECKING:
    from agent.detect.rules import RuleSet
    from agent.sinks.notify import Sink

logger = logging.getLogger(__name__)

__all__ = ["StartupError", "StateDir", "build_agent", "open_state_dir", "write_problem"]


def open_state_dir(path: Path, now: float, history: bool = True) -> StateDir:
    """:func:`agent.state.open_state_dir`, its refusal as a start-up error (exit 2)."""
    try:
        return _open_state_dir(path, now, history)
    except StateDirError as err:
        raise StartupError(str(err)) from None


async def _find_engines(cfg: Config, backend: NvmlBackend | None, clock: Clock) -> list[EngineConfig]:
    from agent.sources.discovery import discover_local_engines

    engines = await discover_local_engines()
    if not engines:
        logger.info("no engine answered on the default local ports; GPU cost is reported as idle")
        return []
    logger.info("found engines on default ports: %s", ", ".join(f"{e.name} at {e.url}" for e in engines))
    if len(engines) == 1 and backend is not None:
        # one engine on a GPU node: assume it uses every GPU (say so; node.yaml can correct it)
        rnd = await asyncio.to_thread(backend.read_round, clock.now())
        gpus = tuple(sorted({g.index for g in rnd.gpus if g.mig_parent_uuid is None}))
        engines = [engines[0].model_copy(update={"gpus": gpus})]
        logger.info("assuming %s uses all %d GPUs of this node", engines[0].name, len(gpus))
    elif len(engines) > 1:
        logger.info("several engines: GPU cost is node idle cost until node.yaml lists each engine's GPUs")
    return engines


async def build_agent(
    cfg: Config,
    *,
    clock: Clock | None = None,
    book: PriceBook | None = None,
    backend: NvmlBackend | Literal["config"] | None = "config",
    load: LoadFn | None = None,
    engines: Sequence[EngineConfig] | None = None,
    discover: bool = True,
    history: bool = True,
    detection: bool = True,
    rules: RuleSet | None = None,
    sinks: Sequence[Sink] | None = None,
    scorer: bool = True,
    on_tick: Sequence[Callable[[TickResult, Snapshot], None]] = (),
) -> Agent:
    """The daemon for ``cfg``, ready to :meth:`~agent.supervisor.Agent.run`.

    ``clock``: wall/monotonic time (default the system clock), wrapped in a SteadyClock.
    ``backend``: an NVML backend, None for none, or "config" to follow ``cfg.nvml`` (``load`` then
    drives a fake backend). ``engines``: overrides ``cfg.engines``; with neither and ``discover``,
    engines are looked for on the default local ports. ``history``: open the store in
    ``cfg.state_dir`` (locked); ``detection``: the rules/alerts pipeline over it (``rules`` and
    ``sinks`` override the configured ones); ``scorer``: the isolation-forest worker. With
    ``cfg.kubernetes.enabled`` (and ``discover``) engines also come from the Kubernetes API
    (:class:`agent.sources.kube.source.KubeEngines`).

    Raises :class:`StartupError`, ``ConfigError``, ``RuleError``, ``StoreError`` or
    ``NvmlUnavailable`` for what the operator must fix (``cli.py`` exits 2 on each)."""
    steady = clock if isinstance(clock, SteadyClock) else SteadyClock(clock or SystemClock())
    if book is None:
        book = await asyncio.to_thread(load_price_book, cfg.prices.book)
    nvml_expected = False
    nvml: NvmlBackend | None
    if backend == "config":
        nvml = await asyncio.to_thread(make_backend, cfg.nvml, load, steady)
        nvml_expected = nvml is None and cfg.nvml.backend in ("auto", "real")
    else:
        nvml = backend
    if engines is None:
        engines = list(cfg.engines)
        if not engines and discover and not cfg.kubernetes.enabled:
            engines = await _find_engines(cfg, nvml, steady)
    kube = None
    if cfg.kubernetes.enabled and discover:
        from agent.sources.kube.source import KubeEngines

        kube = KubeEngines(cfg)  # before the state dir is locked: no API credentials = exit 2 now
    hooks = Hooks(on_tick=list(on_tick), nvml_expected=nvml_expected)
    if history:
        await _wire_history(cfg, steady, hooks, detection=detection, rules=rules, sinks=sinks, scorer=scorer)
    if kube is not None:
        if hooks.store is not None:
            kube.record_builds_in(hooks.store, steady.now)
        hooks.engine_source = kube
    return Agent(cfg, steady, book, nvml, engines, hooks)


def _cost_api(cfg: Config, hooks: Hooks, path: Path, clock: Clock) -> None:
    """Engines' cost identities kept with the history, and /api/v1/cost over it."""
    import sqlite3

    from agent.sinks.api import CostApi
    from agent.sinks.costlabels import CostLabelHistory

    try:
        labels = CostLabelHistory(path, cfg.store.retention_days)
    except sqlite3.Error as err:
        logger.error("cost labels cannot be kept in %s (%s): /api/v1/cost groups without them", path, err)
    else:
        hooks.on_tick.append(labels.on_tick)
        hooks.closers.append(labels.close)
    api = CostApi(path, cfg.store.retention_days, cfg.allocation.idle_policy == "share", clock.now)
    hooks.routes[CostApi.PATH] = api.handle


async def _wire_history(
    cfg: Config,
    clock: SteadyClock,
    hooks: Hooks,
    *,
    detection: bool,
    rules: RuleSet | None,
    sinks: Sequence[Sink] | None,
    scorer: bool,
) -> None:
    """The store, the delivery, the pipeline (own store connection) and the scorer, in ``hooks``."""
    import sqlite3

    from agent.detect.deploys import record_deploy
    from agent.store import Store

    hooks.history_expected = True
    state = await asyncio.to_thread(open_state_dir, cfg.state_dir, clock.now(), True)
    hooks.closers.append(state.close)
    hooks.history_note = state.note
    hooks.history_temporary = state.temporary
    path = state.path / HISTORY_NAME
    try:
        store = await asyncio.to_thread(
            open_recovering,
            path,
            clock.now(),
            lambda p: Store(p, cfg.store.retention_days, clock, deploys=record_deploy),
            state.recovered,
        )
    except (sqlite3.Error, OSError) as err:
        hooks.history_note = f"history store {path} cannot be opened ({err}): running without history"
        logger.error("%s", hooks.history_note)
        return
    hooks.store = store
    hooks.recovered_files = len(state.recovered)
    _cost_api(cfg, hooks, path, clock)
    if not detection:
        return
    from agent.detect.pipeline import build_pipeline
    from agent.sinks.delivery import Delivery

    detect_store = await asyncio.to_thread(Store, path, cfg.store.retention_days, clock)
    try:
        delivery = await asyncio.to_thread(Delivery.open, cfg.alerts, state.path / OUTBOX_NAME, clock, sinks)
    except BaseException:
        detect_store.close()
        raise
    try:
        hooks.pipeline = build_pipeline(cfg, detect_store, clock, delivery, rules=rules)
        hooks.rules_reload = rules is None  # rules handed in are not the files' to reload
    except BaseException:
        detect_store.close()
        delivery.outbox.close()
        raise
    hooks.delivery = delivery
    if cfg.report.enabled:
        from agent.report.schedule import WeeklyReporter

        reporter = WeeklyReporter(cfg.report, store, path, delivery, clock, state.path / "reports")
        hooks.loops.append(Loop("weekly report", run=reporter.run))
    if scorer and not state.temporary:
        from agent.detect.scoring import AnomalyScorer

        hooks.scorer = AnomalyScorer(store.path, state.path, store)  # the loop's connection, shared
