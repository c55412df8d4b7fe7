"""Test helper: stop a child process the polite way, then the hard way."""

from __future__ import annotations

import subprocess
from typing import Any


def terminate(proc: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL and wait again."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)
