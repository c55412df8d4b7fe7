"""OTLP export: a real OTLP/HTTP exporter pushes to a local receiver that decodes the protobuf."""

from __future__ import annotations

import asyncio

from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from test_exporter import _snapshot

from agent.config import OtlpExporterConfig
from agent.sinks.otlp import OtlpExporter


async def test_otlp_push_carries_semconv_names_values_and_resource() -> None:
    received: list[ExportMetricsServiceRequest] = []

    async def handler(req: web.Request) -> web.Response:
        body = await req.read()
        msg = ExportMetricsServiceRequest()
        msg.ParseFromString(body)
        received.append(msg)
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/v1/metrics", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    snap = _snapshot()
    cfg = OtlpExporterConfig(
        endpoint=f"http://127.0.0.1:{port}/v1/metrics", interval_seconds=3600, timeout_seconds=5
    )
    exp = OtlpExporter(lambda: snap, cfg, snap.node)
    try:
        assert await asyncio.to_thread(exp.flush, 10.0)
    finally:
        await asyncio.to_thread(exp.shutdown)
        await runner.cleanup()

    assert received
    points: dict[str, list[tuple[dict[str, str], float]]] = {}
    resource: dict[str, str] = {}
    for msg in received[:1]:  # shutdown exports once more; the first push is enough
        for rm in msg.resource_metrics:
            resource.update({a.key: a.value.string_value for a in rm.resource.attributes})
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    data = m.gauge.data_points if m.HasField("gauge") else m.sum.data_points
                    for dp in data:
                        attrs = {a.key: a.value.string_value for a in dp.attributes}
                        points.setdefault(m.name, []).append((attrs, dp.as_double))
    assert resource["service.name"] == "infercost"
    assert resource["host.name"] == "node-a"
    util = {a["hw.id"]: v for a, v in points["hw.gpu.utilization"]}
    assert util == {"0": 0.9, "1": 0.0}
    assert [v for a, v in points["hw.power"]] == [600.0]  # GPU 1 has no power reading: absent
    ((attrs, cost),) = points["infercost.cost_usd"]
    assert attrs["infercost.model_version"] == "v7"
    assert round(cost, 6) == 0.02
