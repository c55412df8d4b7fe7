"""The Prometheus endpoint: ``/metrics`` built from the current snapshot at scrape time, and
``/healthz``. One collector, driven by the catalogue; absent values emit no series."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from agent.catalog import CATALOG
from agent.snapshot import Snapshot, series

logger = logging.getLogger(__name__)


def families(snap: Snapshot) -> list[Metric]:
    """All metric families of a snapshot, in catalogue order."""
    out: list[Metric] = []
    for spec in CATALOG:
        fam: Metric
        if spec.kind == "counter":
            # prometheus_client appends _total itself
            fam = CounterMetricFamily(spec.full_name.removesuffix("_total"), spec.help, labels=spec.labels)
        else:
            fam = GaugeMetricFamily(spec.full_name, spec.help, labels=spec.labels)
        for labels, value in series(spec, snap):
            if value is None:
                continue
            fam.add_metric(list(labels), float(value))
        out.append(fam)
    return out


class SnapshotCollector:
    """A prometheus_client collector over whatever snapshot ``get`` returns at scrape time."""

    def __init__(self, get: Callable[[], Snapshot]) -> None:
        self._get = get

    def collect(self) -> Iterator[Metric]:
        """Build the families from the current snapshot."""
        yield from families(self._get())


def render(snap: Snapshot) -> bytes:
    """The Prometheus text exposition of one snapshot."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SnapshotCollector(lambda: snap))
    return generate_latest(reg)


class PrometheusServer:
    """aiohttp server for /metrics and /healthz on the event loop."""

    def __init__(
        self,
        get: Callable[[], Snapshot],
        healthy: Callable[[], bool | Mapping[str, Any]],
        host: str,
        port: int,
    ) -> None:
        self._get = get
        self._healthy = healthy
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        """Bind and serve; ``port`` 0 picks a free port (read ``self.port`` afterwards)."""
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._health)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        for addr in self._runner.addresses:
            self.port = int(addr[1])
        logger.info("serving /metrics on http://%s:%d", self.host, self.port)

    async def _metrics(self, _req: web.Request) -> web.Response:
        body = render(self._get())
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _health(self, _req: web.Request) -> web.Response:
        res = self._healthy()
        if isinstance(res, Mapping):  # each component's state; 503 only when ``ok`` is false
            return web.json_response(dict(res), status=200 if res.get("ok") else 503)
        return web.json_response({"status": "ok" if res else "starting"}, status=200 if res else 503)

    async def stop(self) -> None:
        """Stop serving."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
