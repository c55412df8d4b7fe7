"""Injected time. Every loop asks a Clock for the time and for sleeps, so the real daemon can run
end to end on an accelerated clock (the demo, the tests) exactly as it runs in production.

A clock has two faces: :meth:`Clock.now` (wall time, epoch seconds: only to *label* minutes) and
:meth:`Clock.monotonic` (never steps: intervals, backoff, rate limits). The daemon runs on a
:class:`SteadyClock` over the real one: its ``now()`` advances with the monotonic clock from a wall
anchor, so every interval, cost Δt and backoff in the agent is monotonic, and a step of the wall
clock (NTP, a VM resumed, an operator) is noticed at a tick boundary by :meth:`SteadyClock.resync`
and logged: a forward step re-anchors (the supervisor then restarts the cost interval, so the gap is
not charged), a backward step keeps the agent's timeline (so no minute is written twice and no
history is dropped) until wall time catches up with it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Protocol

logger = logging.getLogger(__name__)

# Why 2 s: NTP slews (≤ 0.5 ms/s) and scheduling jitter never reach it between two ticks, while any
# real step (a VM resumed, a manual date, NTP's step mode at > 128 ms... accumulated) does.
JUMP_TOLERANCE_SECONDS = 2.0


class Clock(Protocol):
    """Wall time in seconds since the epoch, a monotonic time, and sleeping in that time."""

    def now(self) -> float:
        """Seconds since the epoch."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never steps (any origin)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Sleep for ``seconds`` of this clock's time."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        """Seconds since the epoch."""
        return time.time()

    def monotonic(self) -> float:
        """The OS monotonic clock (seconds)."""
        return time.monotonic()

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

    def monotonic(self) -> float:
        """Simulated seconds since this clock was made (never steps)."""
        return (time.monotonic() - self._t0_real) * self.factor

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` of simulated time (``seconds / factor`` of real time)."""
        await asyncio.sleep(max(0.0, seconds) / self.factor)


class ManualClock:
    """A clock that only moves when told to (tests and offline benchmarks).

    :meth:`step_wall` moves only the wall time (a clock step), as NTP or an operator would."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._t = start
        self._mono = 0.0

    def now(self) -> float:
        """Current simulated seconds since the epoch."""
        return self._t

    def monotonic(self) -> float:
        """Seconds advanced so far (never steps)."""
        return self._mono

    def advance(self, seconds: float) -> None:
        """Move time forward (wall and monotonic)."""
        self._t += seconds
        self._mono += seconds

    def step_wall(self, seconds: float) -> None:
        """Step the wall clock by ``seconds`` (either sign); the monotonic clock does not move."""
        self._t += seconds

    async def sleep(self, seconds: float) -> None:
        """Advance time by ``seconds`` and yield to the event loop once."""
        self.advance(max(0.0, seconds))
        await asyncio.sleep(0)


@dataclass(frozen=True, slots=True)
class Jump:
    """A wall-clock step noticed by :meth:`SteadyClock.resync`."""

    seconds: float  # wall minus the agent's time when noticed; > 0 forward, < 0 backward
    reanchored: bool  # True: the agent's time moved to wall time (forward steps only)


class SteadyClock:
    """Wall-anchored monotonic time over ``base`` (see the module docstring)."""

    def __init__(self, base: Clock, tolerance: float = JUMP_TOLERANCE_SECONDS) -> None:
        self.base = base
        self.tolerance = tolerance  # seconds
        self._anchor_wall = base.now()
        self._anchor_mono = base.monotonic()
        self._behind = False  # a backward step is pending: wall is behind the agent's time

    def now(self) -> float:
        """The agent's time: the wall anchor plus monotonic seconds since it (epoch seconds)."""
        return self._anchor_wall + (self.base.monotonic() - self._anchor_mono)

    def monotonic(self) -> float:
        """The base clock's monotonic seconds."""
        return self.base.monotonic()

    async def sleep(self, seconds: float) -> None:
        """Sleep on the base clock (its sleeps are monotonic)."""
        await self.base.sleep(seconds)

    def resync(self) -> Jump | None:
        """Compare with wall time; returns the step noticed, or None. Logs each step once."""
        wall = self.base.now()
        ours = self.now()
        diff = wall - ours
        if abs(diff) <= self.tolerance:
            if self._behind:
                logger.info("wall clock has caught up with the agent's time again")
                self._behind = False
                self._anchor_wall, self._anchor_mono = wall, self.base.monotonic()
            return None
        if diff > 0:
            self._anchor_wall, self._anchor_mono = wall, self.base.monotonic()
            self._behind = False
            logger.warning(
                "wall clock stepped forward by %.1f s; the gap is not charged as cost and minutes "
                "are labelled by the new wall time",
                diff,
            )
            return Jump(diff, True)
        if not self._behind:
            self._behind = True
            logger.warning(
                "wall clock stepped back by %.1f s; keeping the agent's timeline (no minute is written "
                "twice, no history dropped) until wall time catches up",
                -diff,
            )
            return Jump(diff, False)
        return None
