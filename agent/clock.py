"""Injected time. Every loop asks a Clock for the time and for sleeps, so the real daemon can run
end to end on an accelerated clock (the demo, the tests) exactly as it runs in production."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    """Wall time in seconds since the epoch, and sleeping in that time."""

    def now(self) -> float:
        """Seconds since the epoch."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Sleep for ``seconds`` of this clock's time."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        """Seconds since the epoch."""
        return time.time()

    async def sleep(self, seconds: float) -> None:
        """Sleep in real time."""
        await asyncio.sleep(max(0.0, seconds))


class AcceleratedClock:
    """A clock that runs ``factor`` times faster than real time, from ``start`` (epoch seconds)."""

    def __init__(self, factor: float, start: float | None = None) -> None:
        if factor <= 0:
            raise ValueError("factor must be > 0")
        self.factor = factor
        self._t0_real = time.monotonic()
        self._t0 = time.time() if start is None else start

    def now(self) -> float:
        """Simulated seconds since the epoch."""
        return self._t0 + (time.monotonic() - self._t0_real) * self.factor

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` of simulated time (``seconds / factor`` of real time)."""
        await asyncio.sleep(max(0.0, seconds) / self.factor)


class ManualClock:
    """A clock that only moves when told to (tests and offline benchmarks)."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._t = start

    def now(self) -> float:
        """Current simulated seconds since the epoch."""
        return self._t

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        self._t += seconds

    async def sleep(self, seconds: float) -> None:
        """Advance time by ``seconds`` and yield to the event loop once."""
        self._t += max(0.0, seconds)
        await asyncio.sleep(0)
