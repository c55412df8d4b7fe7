"""Deployment metadata and local discovery.

- Model versions are not in engine metrics: they come from config, or from a downward-API labels
  file (Kubernetes writes pod labels as lines ``key="value"``), re-read at each tick so a rollout
  is seen without a restart.
- ``infercost run`` with no config looks for engines on their default local ports.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

import aiohttp

from agent.config import DEFAULT_ENGINE_PORTS, EngineConfig

logger = logging.getLogger(__name__)


def parse_labels_file(text: str) -> dict[str, str]:
    """Parse a downward-API labels file: one ``key="value"`` per line (values may be unquoted)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if not sep or not key:
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            # Kubernetes quotes values Go-style; label values only ever need \" \\ and \n
            value = value[1:-1].replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
        out[key.strip()] = value
    return out


class VersionReader:
    """Reads each engine's version file; logs a missing or unreadable file once per state change."""

    def __init__(self, engines: Sequence[EngineConfig]) -> None:
        self._engines = [e for e in engines if e.version_file is not None]
        self._failing: set[str] = set()

    def read(self) -> dict[str, str]:
        """engine name → version, for engines whose file names one."""
        out: dict[str, str] = {}
        for e in self._engines:
            assert e.version_file is not None
            try:
                labels = parse_labels_file(e.version_file.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError) as err:
                if e.name not in self._failing:
                    self._failing.add(e.name)
                    logger.warning("engine %s: cannot read version file %s: %s", e.name, e.version_file, err)
                continue
            self._failing.discard(e.name)
            version = labels.get(e.version_label)
            if version:
                out[e.name] = version
        return out


async def discover_local_engines(
    host: str = "127.0.0.1", ports: Mapping[str, int] = DEFAULT_ENGINE_PORTS, timeout: float = 1.0
) -> list[EngineConfig]:
    """Engines answering /metrics on their default local ports (kind detected from the page)."""

    async def probe(session: aiohttp.ClientSession, kind: str, port: int) -> EngineConfig | None:
        url = f"http://{host}:{port}/metrics"
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                if resp.status != 200:
                    return None
        except (aiohttp.ClientError, TimeoutError, OSError):
            return None
        return EngineConfig(name=f"{kind}-{port}", kind="auto", url=url)

    async with aiohttp.ClientSession() as session:
        found = await asyncio.gather(*(probe(session, k, p) for k, p in ports.items()))
    return [e for e in found if e is not None]
