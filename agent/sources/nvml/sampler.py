"""The asyncio face of the NVML source: one batched round per tick, run off the event loop.

:class:`NvmlSampler` wraps an :class:`~agent.sources.nvml.backend.NvmlBackend`; every blocking NVML
call happens in a worker thread (``asyncio.to_thread``) and no method raises for NVML trouble:
a failure is an ``NvmlRound(up=False, error=...)``, so one broken source never stops the agent.
:func:`make_backend` turns the ``nvml`` config section into a backend (or None: no GPUs here).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from agent.clock import Clock
from agent.config import ConfigError, NvmlConfig
from agent.samples import GpuLoad, NvmlRound
from agent.sources.nvml.backend import NvmlBackend, NvmlUnavailable
from agent.sources.nvml.fake import PROFILES, FakeNvml

logger = logging.getLogger(__name__)

LoadFn = Callable[[int, float], GpuLoad | None]  # (GPU index, epoch seconds) → load, for the fake


class NvmlSampler:
    """Reads NVML once per :meth:`sample` call, in a thread, stamped with ``clock.now()``."""

    def __init__(self, backend: NvmlBackend, clock: Clock) -> None:
        self._backend = backend
        self._clock = clock
        self._closed = False

    @property
    def driver_version(self) -> str | None:
        """The driver version once :meth:`start` succeeded, else None."""
        return self._backend.driver_version

    async def start(self) -> str | None:
        """Initialise NVML; returns the driver version, or None when it is unavailable (logged;
        :meth:`sample` then reports ``up=False`` and keeps retrying)."""
        try:
            version = await asyncio.to_thread(self._backend.open)
        except NvmlUnavailable as err:
            logger.warning("NVML unavailable at start: %s", err.reason)
            return None
        logger.info("NVML ready, driver %s", version)
        return version

    async def sample(self) -> NvmlRound:
        """One round over every GPU; never raises (a failure is ``NvmlRound(up=False)``)."""
        now = self._clock.now()
        if self._closed:
            return NvmlRound(timestamp=now, up=False, error="sampler closed")
        try:
            return await asyncio.to_thread(self._backend.read_round, now)
        except Exception as err:  # the source must never take the agent down
            logger.exception("NVML round failed")
            return NvmlRound(timestamp=now, up=False, error=f"{type(err).__name__}: {err}")

    async def close(self) -> None:
        """Shut NVML down (once)."""
        if self._closed:
            return
        self._closed = True
        try:
            await asyncio.to_thread(self._backend.close)
        except Exception:
            logger.exception("NVML shutdown failed")


def make_backend(
    cfg: NvmlConfig, load: LoadFn | None = None, clock: Clock | None = None
) -> NvmlBackend | None:
    """The backend ``cfg.backend`` asks for, or None when there are no GPUs to read.

    - ``none``: None.
    - ``fake``: a :class:`FakeNvml` of ``cfg.fake_count`` × ``cfg.fake_profile`` driven by ``load``
      (and ``clock``, so energy follows simulated time).
    - ``real``: the real library, opened now; raises :class:`NvmlUnavailable` when it cannot be
      (the operator asked for it, so ``cli.py`` should report it and exit).
    - ``auto``: the real library when a driver answers, else one clear log line and None.
    """
    if cfg.backend == "none":
        return None
    if cfg.backend == "fake":
        if cfg.fake_profile not in PROFILES:
            raise ConfigError(
                f"nvml.fake_profile {cfg.fake_profile!r} is unknown; use one of {', '.join(PROFILES)}"
            )
        fake = FakeNvml(
            cfg.fake_profile, cfg.fake_count, load, clock=clock.now if clock is not None else time.time
        )
        return NvmlBackend(fake)
    backend = NvmlBackend()
    try:
        backend.open()
    except NvmlUnavailable as err:
        if cfg.backend == "real":
            raise
        logger.warning(
            "no NVIDIA driver found: %s; GPU metrics are off (set nvml.backend: none to silence this)",
            err.reason,
        )
        return None
    return backend
