"""The Prometheus endpoint: ``/metrics`` built from the current snapshot at scrape time, and
``/healthz``. One collector, driven by the catalogue; absent values emit no series."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from agent.catalog import CATALOG, MetricSpec
from agent.snapshot import Snapshot

logger = logging.getLogger(__name__)


def _items(spec: MetricSpec, snap: Snapshot) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(label values, value) pairs of one catalogue row over a snapshot."""
    node = snap.node
    if spec.source == "node":
        yield (node,), getattr(snap, spec.field)
    elif spec.source == "gpu":
        for g in snap.gpus:
            s = g.sample
            if spec.field == "info":
                yield (node, g.gpu, s.uuid, s.name, s.mig_parent_uuid or ""), 1.0
            elif spec.field == "up":
                yield (node, g.gpu), s.up
            elif hasattr(g, spec.field):
                yield (node, g.gpu), getattr(g, spec.field)
            else:
                yield (node, g.gpu), getattr(s, spec.field)
    elif spec.source == "engine":
        for e in snap.engines:
            labels = (node, e.engine, e.kind) if "kind" in spec.labels else (node, e.engine)
            yield labels, getattr(e, spec.field)
    elif spec.source == "model":
        for m in snap.models:
            yield (node, m.engine, m.model, m.model_version), getattr(m, spec.field)
    elif spec.source == "alert":
        for (rule, severity), n in snap.alerts_firing.items():
            yield (node, rule, severity), n
    elif spec.source == "outbox":
        for sink, n in snap.outbox_pending.items():
            yield (node, sink), n


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
        for labels, value in _items(spec, snap):
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
    reg.register(SnapshotCollector(lambda: snap))  # type: ignore[arg-type]
    return generate_latest(reg)


class PrometheusServer:
    """aiohttp server for /metrics and /healthz on the event loop."""

    def __init__(self, get: Callable[[], Snapshot], healthy: Callable[[], bool], host: str, port: int) -> None:
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
        server = site._server
        if server is not None and getattr(server, "sockets", None):
            self.port = server.sockets[0].getsockname()[1]
        logger.info("serving /metrics on http://%s:%d", self.host, self.port)

    async def _metrics(self, _req: web.Request) -> web.Response:
        body = render(self._get())
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _health(self, _req: web.Request) -> web.Response:
        ok = self._healthy()
        return web.json_response({"status": "ok" if ok else "starting"}, status=200 if ok else 503)

    async def stop(self) -> None:
        """Stop serving."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
