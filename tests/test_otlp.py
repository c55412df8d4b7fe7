"""OTLP export: the real SDK exporters push to local receivers (OTLP/HTTP and OTLP/gRPC) that decode
the protobuf with ``opentelemetry-proto``. Names, instrument types, units and required attributes
are checked against the ``opentelemetry-semantic-conventions`` package (its constants and its
``create_*`` instrument factories), not against strings typed here."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, replace
from typing import Any

import grpc
import pytest
from aiohttp import web
from opentelemetry import metrics as api
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.semconv._incubating.attributes import host_attributes as host
from opentelemetry.semconv._incubating.attributes import hw_attributes as hw
from opentelemetry.semconv._incubating.metrics import hw_metrics
from opentelemetry.semconv.attributes import k8s_attributes as k8s
from opentelemetry.semconv.attributes import service_attributes as service
from test_exporter import _snapshot

from agent import __version__
from agent.config import ConfigError, OtlpExporterConfig
from agent.sinks.otlp import SCHEMA_URL, SEMCONV_VERSION, otlp_exporter
from agent.snapshot import Snapshot

OTEL_VARS = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_SERVICE_NAME",
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for v in OTEL_VARS:
        monkeypatch.delenv(v, raising=False)


def _snap() -> Snapshot:
    """The exporter test's snapshot, GPU 0 with memory and temperature readings added."""
    snap = _snapshot()
    g0 = snap.gpus[0]
    s0 = replace(g0.sample, memory_used_bytes=60e9, memory_total_bytes=80e9, temperature_celsius=61.0)
    return replace(snap, gpus=(replace(g0, sample=s0), *snap.gpus[1:]))


@dataclass
class Point:
    attrs: dict[str, Any]
    value: float


@dataclass
class Received:
    kind: str  # gauge | sum | histogram
    monotonic: bool | None
    unit: str
    points: list[Point]
    description: str = ""


def _value(v: AnyValue) -> Any:
    return getattr(v, v.WhichOneof("value"))


def _point_value(kind: str, dp: Any) -> Any:
    """A number point's value (int or float as sent); a histogram point's count."""
    if kind == "histogram":
        return dp.count
    return dp.as_double if dp.WhichOneof("value") == "as_double" else dp.as_int


def decode(msg: ExportMetricsServiceRequest) -> tuple[dict[str, Any], str, dict[str, Received]]:
    """(resource attributes, resource schema URL, name → Received) of one export request."""
    resource: dict[str, Any] = {}
    out: dict[str, Received] = {}
    schema = ""
    for rm in msg.resource_metrics:
        resource.update({a.key: _value(a.value) for a in rm.resource.attributes})
        schema = rm.schema_url
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                data = getattr(m, kind)
                mono = data.is_monotonic if kind == "sum" else None
                pts = [
                    Point({a.key: _value(a.value) for a in dp.attributes}, _point_value(kind, dp))
                    for dp in data.data_points
                ]
                out[m.name] = Received(kind, mono, m.unit, pts, m.description)
    return resource, schema, out


def semconv_instrument(name: str) -> tuple[str, bool | None, str]:
    """(OTLP data kind, monotonic, unit) the conventions package gives metric ``name``: its
    ``create_*`` factory run on a scratch meter."""
    factory = getattr(hw_metrics, "create_" + name.replace(".", "_"))
    meter = MeterProvider().get_meter("semconv-check")
    args = [None] * (len(inspect.signature(factory).parameters) - 1)  # callbacks, if it takes any
    inst = factory(meter, *args)
    if isinstance(inst, api.Counter | api.ObservableCounter):
        return "sum", True, inst.unit  # type: ignore[attr-defined]
    if isinstance(inst, api.UpDownCounter | api.ObservableUpDownCounter):
        return "sum", False, inst.unit  # type: ignore[attr-defined]
    if isinstance(inst, api.Histogram):
        return "histogram", None, inst.unit  # type: ignore[attr-defined]
    return "gauge", None, inst.unit  # type: ignore[attr-defined]


class HttpReceiver:
    """A local OTLP/HTTP endpoint: records (path, headers, decoded request)."""

    def __init__(self) -> None:
        self.got: list[tuple[str, dict[str, str], ExportMetricsServiceRequest]] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> None:
        async def handler(req: web.Request) -> web.Response:
            msg = ExportMetricsServiceRequest()
            msg.ParseFromString(await req.read())
            self.got.append((req.path, dict(req.headers), msg))
            return web.Response(body=ExportMetricsServiceResponse().SerializeToString())

        app = web.Application()
        app.router.add_post("/v1/metrics", handler)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def close(self) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


async def test_endpoint_from_env_alone_enables_semconv_export(monkeypatch: pytest.MonkeyPatch) -> None:
    rx = HttpReceiver()
    await rx.start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{rx.port}")  # no path: SDK adds it
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-scope-orgid=team-a")
    monkeypatch.setenv("K8S_NODE_NAME", "gpu-node-7")
    monkeypatch.setenv("K8S_POD_NAME", "infercost-abcde")
    snap = _snap()
    exp = otlp_exporter(lambda: snap, OtlpExporterConfig(interval_seconds=3600), snap.node)
    assert exp is not None, "OTEL_EXPORTER_OTLP_ENDPOINT alone enables export"
    try:
        assert await asyncio.to_thread(exp.flush, 10.0)
    finally:
        await asyncio.to_thread(exp.shutdown)
        await rx.close()
    path, headers, msg = rx.got[0]
    assert path == "/v1/metrics" and headers["x-scope-orgid"] == "team-a"
    resource, schema, got = decode(msg)
    assert schema == SCHEMA_URL and SEMCONV_VERSION in SCHEMA_URL
    assert resource[service.SERVICE_NAME] == "infercost"
    assert resource[service.SERVICE_VERSION] == __version__
    assert resource[host.HOST_NAME] == "node-a"
    assert resource[k8s.K8S_NODE_NAME] == "gpu-node-7" and resource[k8s.K8S_POD_NAME] == "infercost-abcde"

    # every name is a conventions metric or ours; none carries a unit
    semconv_names = {v for k, v in vars(hw_metrics).items() if k.isupper() and isinstance(v, str)}
    for name, r in got.items():
        assert name in semconv_names or name.startswith("infercost."), name
        words = set(name.replace("_", ".").split("."))
        assert not words & {"usd", "seconds", "bytes", "watts", "joules", "hertz", "ratio", "total"}, name
        for p in r.points:
            assert host.HOST_NAME not in p.attrs and "infercost.node" not in p.attrs  # node: Resource
    # conventions metrics: the package's instrument and unit
    for name in got.keys() & semconv_names:
        kind, mono, unit = semconv_instrument(name)
        assert (got[name].kind, got[name].monotonic, got[name].unit) == (kind, mono, unit), name
    assert {
        hw_metrics.HW_POWER,
        hw_metrics.HW_ENERGY,
        hw_metrics.HW_GPU_UTILIZATION,
        hw_metrics.HW_GPU_MEMORY_USAGE,
        hw_metrics.HW_GPU_MEMORY_LIMIT,
        hw_metrics.HW_GPU_MEMORY_UTILIZATION,
        hw_metrics.HW_STATUS,
    } <= got.keys()
    # hw.power / hw.energy: hw.type is required and must be "gpu"; hw.id is the GPU's UUID, the
    # NVML index an attribute of its own
    gpu = hw.HwTypeValues.GPU.value
    for name in (hw_metrics.HW_POWER, hw_metrics.HW_ENERGY):
        pts = got[name].points
        assert [(p.attrs[hw.HW_ID], p.attrs[hw.HW_TYPE]) for p in pts] == [("GPU-0", gpu)], name
        assert [p.attrs["infercost.gpu.index"] for p in pts] == [0], name
    assert got[hw_metrics.HW_POWER].points[0].value == 600.0  # GPU 1 has no power reading: absent
    assert got[hw_metrics.HW_ENERGY].points[0].value == 12000.0  # joules (NVML total energy)
    assert got[hw_metrics.HW_POWER].points[0].attrs[hw.HW_MODEL] == "NVIDIA H100 80GB HBM3"
    util = {p.attrs[hw.HW_ID]: p.value for p in got[hw_metrics.HW_GPU_UTILIZATION].points}
    assert util == {"GPU-0": 0.9, "GPU-1": 0.0}
    # memory: bytes as integers on UpDownCounters; utilisation 60 / 80 GB
    assert [p.value for p in got[hw_metrics.HW_GPU_MEMORY_USAGE].points] == [60_000_000_000]
    assert [p.value for p in got[hw_metrics.HW_GPU_MEMORY_LIMIT].points] == [80_000_000_000]
    assert [p.value for p in got[hw_metrics.HW_GPU_MEMORY_UTILIZATION].points] == [0.75]
    status = {(p.attrs[hw.HW_ID], p.attrs[hw.HW_STATE]): p.value for p in got[hw_metrics.HW_STATUS].points}
    ok, failed = hw.HwStateValues.OK.value, hw.HwStateValues.FAILED.value
    assert status == {("GPU-0", ok): 1, ("GPU-0", failed): 0, ("GPU-1", ok): 1, ("GPU-1", failed): 0}
    # tokens: one metric split by gen_ai.token.type; the model is gen_ai.request.model (names
    # checked against the GenAI registry in test_otlp_semconv)
    assert "gen_ai.client.token.usage" not in got  # a per-request histogram we cannot fill
    tokens = got["infercost.token.usage"]
    assert (tokens.kind, tokens.monotonic, tokens.unit) == ("sum", True, "{token}")
    by_type = {p.attrs["gen_ai.token.type"]: p.value for p in tokens.points}
    # _snapshot(): 4000 generated tokens, prompt counter at half of that
    assert by_type == {"input": 2000, "output": 4000}
    assert {p.attrs["gen_ai.request.model"] for p in tokens.points} == {"meta/llama"}
    (cost,) = got["infercost.cost"].points
    assert cost.attrs["infercost.model.version"] == "v7" and round(cost.value, 6) == 0.02
    assert got["infercost.cost"].unit == "{USD}"


async def test_no_endpoint_no_export_and_bad_protocol_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    snap = _snap()
    assert otlp_exporter(lambda: snap, OtlpExporterConfig(), snap.node) is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    with pytest.raises(ConfigError, match=r"OTEL_EXPORTER_OTLP_PROTOCOL.*fix"):
        otlp_exporter(lambda: snap, OtlpExporterConfig(), snap.node)


class _GrpcCollector(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self) -> None:
        self.got: list[tuple[dict[str, str], ExportMetricsServiceRequest]] = []

    def Export(self, request: ExportMetricsServiceRequest, context: grpc.ServicerContext) -> Any:
        self.got.append((dict(context.invocation_metadata()), request))
        return ExportMetricsServiceResponse()


@pytest.fixture
def grpc_collector() -> Iterator[tuple[_GrpcCollector, int]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    collector = _GrpcCollector()
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(collector, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield collector, port
    finally:
        server.stop(grace=None)


def test_grpc_protocol_from_env(
    monkeypatch: pytest.MonkeyPatch, grpc_collector: tuple[_GrpcCollector, int]
) -> None:
    collector, port = grpc_collector
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")  # http: no TLS
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20t0k")
    snap = _snap()
    exp = otlp_exporter(lambda: snap, OtlpExporterConfig(interval_seconds=3600), snap.node)
    assert exp is not None
    try:
        assert exp.flush(10.0)
    finally:
        exp.shutdown()
    metadata, msg = collector.got[0]
    assert metadata["authorization"] == "Bearer t0k"
    resource, _, got = decode(msg)
    assert resource[host.HOST_NAME] == "node-a"
    assert [p.value for p in got[hw_metrics.HW_POWER].points] == [600.0]


def test_resource_names_the_pod_and_node_on_kubernetes() -> None:
    from agent.sinks.otlp import resource

    pod = {
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
        "INFERCOST_NODE": "gpu-node-3",
        "HOSTNAME": "infercost-x7k2p",
    }
    attrs = dict(resource("gpu-node-3", pod).attributes)
    assert attrs[k8s.K8S_NODE_NAME] == "gpu-node-3" and attrs[k8s.K8S_POD_NAME] == "infercost-x7k2p"
    assert attrs[host.HOST_NAME] == "gpu-node-3"
    # outside a pod, HOSTNAME is just the machine's name: no k8s attributes are made up
    bare = dict(resource("box", {"HOSTNAME": "box", "INFERCOST_NODE": "box"}).attributes)
    assert k8s.K8S_NODE_NAME not in bare and k8s.K8S_POD_NAME not in bare
