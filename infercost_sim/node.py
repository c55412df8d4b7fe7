"""The simulated demo node: 8 × H100-SXM, four vLLM engines serving real ``/metrics`` pages.

- ``llama-70b``: Llama-3.1-70B-Instruct in bf16, TP4 on GPUs 0–3, version ``2024-07``
  (the production deployment);
- ``llama-70b-canary``: the same served model in fp8 (weights and KV cache), TP2 on GPUs 4–5,
  version ``2024-09`` (the canary of the next build);
- ``mistral-7b``: Mistral-7B-Instruct-v0.3 on GPU 6, version ``v0.3``;
- ``qwen-14b``: Qwen2.5-14B-Instruct on GPU 7, version ``2024-09``.

Each engine's traffic peaks at ``peak_load`` × its capacity in the afternoon and falls to a
fifth of that at night, so cost per token swings through the day like a real node's. The two
Llama engines sit behind a least-loaded router of a larger fleet (``capacity_routed``): a slower
build receives proportionally less work, so its tokens per GPU-hour, and its cost per token,
move with its speed at every hour of the day.

The agent learns versions the way it would on Kubernetes: from a downward-API labels file per
engine (``app.kubernetes.io/version="2024-09"``) written under ``version_dir``.
:meth:`SimNode.rollout` switches an engine to another build (now or at a given time): the file
changes and the engine's step time stretches by ``1 / throughput_factor``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent.clock import Clock
from agent.config import EngineConfig
from agent.samples import GpuLoad
from infercost_sim.engine import (
    H100_SXM,
    LLAMA_70B,
    LLAMA_70B_FP8,
    MISTRAL_7B,
    QWEN_14B,
    Deployment,
    GpuSpec,
    ModelShape,
    SimEngine,
    Traffic,
)
from infercost_sim.server import SimEngineServer

logger = logging.getLogger(__name__)

VERSION_LABEL = "app.kubernetes.io/version"  # the key the agent reads from a version file


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """One engine of a simulated node."""

    name: str  # engine name (unique per node)
    model: ModelShape
    gpus: tuple[int, ...]  # NVML indexes; the tensor-parallel degree is their count
    version: str
    peak_load: float = 0.8  # arrival rate at the daily peak as a fraction of the engine's capacity
    throughput_factor: float = 1.0  # < 1: a slower build
    capacity_routed: bool = False  # behind a least-loaded router: work follows the build's speed
    traffic: Traffic | None = None  # None: derived from peak_load and the engine's capacity


DEFAULT_ENGINES: tuple[EngineSpec, ...] = (
    EngineSpec("llama-70b", LLAMA_70B, (0, 1, 2, 3), "2024-07", capacity_routed=True),
    EngineSpec("llama-70b-canary", LLAMA_70B_FP8, (4, 5), "2024-09", capacity_routed=True),
    EngineSpec("mistral-7b", MISTRAL_7B, (6,), "v0.3", peak_load=0.6),
    EngineSpec("qwen-14b", QWEN_14B, (7,), "2024-09", peak_load=0.7),
)


@dataclass(slots=True)
class _Rollout:
    at: float  # seconds since the epoch
    engine: str
    version: str
    throughput_factor: float


@dataclass(slots=True)
class _Member:
    spec: EngineSpec
    engine: SimEngine
    server: SimEngineServer
    version_file: Path
    pending: list[_Rollout] = field(default_factory=list)


def write_version_file(path: Path, version: str, label: str = VERSION_LABEL) -> None:
    """Write a downward-API labels file atomically (the agent may read it at any moment)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(f'{label}="{version}"\napp.kubernetes.io/managed-by="infercost-sim"\n')
    os.replace(tmp, path)


def build_engine(spec: EngineSpec, gpu: GpuSpec, start: float, seed: int, **kwargs: float) -> SimEngine:
    """One simulated engine of a node spec, its traffic sized from its own capacity unless the
    spec gives one (``kwargs``: e.g. ``tick_seconds`` for offline history)."""
    dep = Deployment(spec.model, gpu, tp=len(spec.gpus))
    traffic = spec.traffic
    if traffic is None:
        probe = SimEngine(dep, Traffic(peak_rps=1.0), start=start, version=spec.version)
        traffic = Traffic(
            peak_rps=probe.capacity_rps() * spec.peak_load, capacity_routed=spec.capacity_routed
        )
    return SimEngine(
        dep, traffic, start=start, version=spec.version, throughput_factor=spec.throughput_factor, seed=seed,
        **kwargs,
    )  # fmt: skip


def engine_config(
    spec: EngineSpec, engine: SimEngine, url: str, version_file: Path | None = None
) -> EngineConfig:
    """The agent's config of a simulated engine (model shape for the roofline, GPUs, versions)."""
    dep = engine.deployment
    return EngineConfig(
        name=spec.name, kind="vllm", url=url, gpus=spec.gpus, model_version=spec.version,
        version_file=version_file, version_label=VERSION_LABEL, weights_bytes=dep.model.weight_bytes,
        kv_bytes_per_token=dep.model.kv_bytes_per_token, kv_capacity_tokens=dep.kv_capacity_tokens,
        flops_per_token=dep.model.flops_per_token,
    )  # fmt: skip


class SimNode:
    """A simulated GPU node: engines with real physics behind real HTTP ``/metrics`` endpoints.

    ``gpu_load`` is the callback the fake NVML backend reads; ``engine_configs`` is what the
    agent's config needs to scrape the engines. Start it with ``await start()``.
    """

    def __init__(
        self,
        clock: Clock,
        version_dir: Path,
        *,
        engines: Sequence[EngineSpec] = DEFAULT_ENGINES,
        gpu: GpuSpec = H100_SXM,
        gpu_count: int = 8,
        seed: int = 0,
        target_page_bytes: int | None = 100_000,  # bytes per /metrics page; None = minimal pages
        openmetrics: bool = True,  # engines negotiate OpenMetrics like vLLM (see infercost_sim.server)
        tick_seconds: float | None = 5.0,  # clock seconds between background advances; None: lazy only
    ) -> None:
        self.clock = clock
        self.version_dir = version_dir
        self.gpu = gpu
        self.gpu_count = gpu_count
        self.tick_seconds = tick_seconds
        self._members: dict[str, _Member] = {}
        self._by_gpu: dict[int, _Member] = {}
        self._task: asyncio.Task[None] | None = None
        self._rollout_lock = threading.Lock()  # gpu_load runs on NVML worker threads
        start = clock.now()
        for i, spec in enumerate(engines):
            engine = build_engine(spec, gpu, start, seed * 1000 + i)
            server = SimEngineServer(
                engine, clock, target_page_bytes=target_page_bytes, openmetrics=openmetrics
            )
            member = _Member(spec, engine, server, version_dir / f"{spec.name}.labels")
            if spec.name in self._members:
                raise ValueError(f"engine name {spec.name!r} is used twice")
            self._members[spec.name] = member
            for g in spec.gpus:
                if not 0 <= g < gpu_count:
                    raise ValueError(f"engine {spec.name!r} uses GPU {g}, the node has {gpu_count}")
                if g in self._by_gpu:
                    raise ValueError(
                        f"GPU {g} is given to both {self._by_gpu[g].spec.name!r} and {spec.name!r}"
                    )
                self._by_gpu[g] = member

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Write the version files, start every engine's HTTP server and the background tick."""
        self.version_dir.mkdir(parents=True, exist_ok=True)
        for m in self._members.values():
            write_version_file(m.version_file, m.engine.version)
            await m.server.start()
        if self.tick_seconds is not None:
            self._task = asyncio.create_task(self._tick_loop(self.tick_seconds), name="sim-node-tick")

    async def stop(self) -> None:
        """Stop the background tick and the HTTP servers (idempotent)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for m in self._members.values():
            await m.server.stop()

    async def _tick_loop(self, seconds: float) -> None:
        """Advance between scrapes, so scheduled rollouts land on time even when nobody scrapes."""
        while True:
            await self.clock.sleep(seconds)
            self.advance(self.clock.now())

    # -- what the agent sees ------------------------------------------------------------------

    @property
    def engines(self) -> dict[str, SimEngine]:
        """The simulated engines by name."""
        return {name: m.engine for name, m in self._members.items()}

    def engine_configs(self) -> list[EngineConfig]:
        """The agent's config of every engine: URL of the running server, GPUs, version file.

        Call it after :meth:`start` (the servers bind free ports then).
        """
        if any(m.server.port == 0 for m in self._members.values()):
            raise RuntimeError("SimNode.engine_configs() needs the servers' ports: await start() first")
        return [engine_config(m.spec, m.engine, m.server.url, m.version_file) for m in self._members.values()]

    def gpu_load(self, index: int, t: float) -> GpuLoad | None:
        """What GPU ``index`` is doing at ``t`` (epoch seconds); None for a GPU no engine uses.

        Thread-safe: the fake NVML backend calls it from a worker thread.
        """
        member = self._by_gpu.get(index)
        if member is None:
            return None
        self._apply_rollouts(member, t)
        member.engine.advance_to(t)
        return member.engine.gpu_load()

    # -- the story ----------------------------------------------------------------------------

    def rollout(
        self, engine: str, version: str, throughput_factor: float = 1.0, at: float | None = None
    ) -> None:
        """Deploy ``version`` on ``engine`` now (``at`` None) or at ``at`` (epoch seconds).

        The engine's state is advanced to the rollout time first, so tokens before it belong to
        the old version; then the version file is rewritten and the step time stretches by
        ``1 / throughput_factor`` (0.65: a build that lost a fused kernel).
        """
        if throughput_factor <= 0:
            raise ValueError("throughput_factor must be > 0")
        member = self._members.get(engine)
        if member is None:
            raise KeyError(f"no simulated engine {engine!r}; have {sorted(self._members)}")
        when = self.clock.now() if at is None else at
        member.pending.append(_Rollout(when, engine, version, throughput_factor))
        member.pending.sort(key=lambda r: r.at)
        self._apply_rollouts(member, self.clock.now())

    def advance(self, t: float) -> None:
        """Advance every engine to ``t`` (epoch seconds), applying due rollouts on the way."""
        for m in self._members.values():
            self._apply_rollouts(m, t)
            m.engine.advance_to(t)

    def _apply_rollouts(self, member: _Member, t: float) -> None:
        with self._rollout_lock:
            while member.pending and member.pending[0].at <= t:
                r = member.pending.pop(0)
                member.engine.advance_to(r.at)
                member.engine.set_version(r.version, r.throughput_factor)
                write_version_file(member.version_file, r.version)
                logger.info(
                    "simulated rollout: %s now runs %s (throughput x%.2f)",
                    r.engine,
                    r.version,
                    r.throughput_factor,
                )
