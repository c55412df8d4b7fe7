"""Shared helpers for tests that run real servers on loopback: a free port, waiting for a condition.

Import them (``from netutil import free_port``: pytest puts tests/ on the path). One copy of each,
so a fix (say, IPv6 loopback) lands everywhere at once.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(
    pred: Callable[[], bool], timeout: float = 20.0, interval: float = 0.1, what: str = ""
) -> None:
    """Poll ``pred`` until it is true; fail the test after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, f"condition not reached in {timeout:g} s {what}".rstrip()
        time.sleep(interval)


async def async_wait_until(
    pred: Callable[[], Awaitable[bool]], timeout: float = 20.0, interval: float = 0.2, what: str = ""
) -> None:
    """Await ``pred`` until it is true; fail the test after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not await pred():
        assert loop.time() < end, f"condition not reached in {timeout:g} s {what}".rstrip()
        await asyncio.sleep(interval)
