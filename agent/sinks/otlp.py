"""OTLP export of the same snapshot, by the OpenTelemetry semantic conventions (pinned below).

Each catalogue row maps (its OTLP name, unit and attributes from the table of measures;
:func:`metric_table` builds the instruments) to an observable instrument whose callback reads the
current snapshot; a PeriodicExportingMetricReader
pushes them over OTLP/HTTP (protobuf), or gRPC with the ``grpc`` extra. The table of measures is the
one place OTLP names are declared. Where the conventions define a metric, its name, instrument, unit
and attributes are the conventions' (the ``opentelemetry-semantic-conventions`` package's
constants): ``hw.gpu.utilization``, ``hw.gpu.memory.usage`` / ``.limit`` (UpDownCounters, bytes),
``hw.gpu.memory.utilization``, ``hw.gpu.io`` (bytes over PCIe and NVLink, an estimate: see
:class:`GpuIo`), ``hw.power`` and ``hw.energy`` (with the required ``hw.type="gpu"``),
``hw.status`` (``hw.state`` ok / failed) and ``hw.temperature``. Everything else is
``infercost.*`` with UCUM units in the unit field, never in the name.

Attributes: the GPU is ``hw.id`` = its UUID (a MIG instance's own ``MIG-…`` UUID, with the GPU's
UUID as ``hw.parent``), plus ``hw.model``, ``hw.vendor`` and ``infercost.gpu.index`` (the NVML
index; the hardware registry has no attribute for it) and ``hw.driver_version`` where NVML
reported one. The served model is ``gen_ai.request.model``; the
engine, model version, rule and sink are ``infercost.*``. The node is not a point attribute:
``host.name`` (and ``k8s.node.name``, ``k8s.pod.name`` when the environment says) sit on the
Resource with ``service.name`` and ``service.version``.

``gen_ai.*`` names: semantic conventions 1.44 deprecate every ``gen_ai`` attribute as moved to the
GenAI registry (``open-telemetry/semantic-conventions-genai``), so the two the agent sends are
declared here from that registry (``model/gen-ai/registry.yaml``), not taken from the pinned
package's deprecated constants; the names and values are unchanged.

Token counts: the GenAI registry's token metrics (``gen_ai.client.token.usage``, a histogram per
request; the ``gen_ai.client.inference.*`` counters) are recorded by a *client* per operation and
require ``gen_ai.provider.name`` and ``gen_ai.operation.name``; the agent sees an engine's
cumulative counters, not requests. So tokens go out as one counter, ``infercost.token.usage``,
with the registry's ``gen_ai.token.type`` (``input`` / ``output``) and ``gen_ai.request.model``
attributes — the same split a backend would query on the histogram's sum.

Latency histograms: the engines' TTFT, inter-token and end-to-end histograms re-based under the
agent's labels (``HISTOGRAMS`` in the catalogue) go out as explicit-bucket histograms with the
engine's own bounds, cumulative temporality, start time = when the agent started. The SDK has no
observable histogram instrument, so the exporter is wrapped (:class:`HistogramExporter`) and adds
them to each batch the reader hands it. Names are ``infercost.*``: the registry's
``gen_ai.server.*`` histograms require attributes (operation, provider) an agent reading engine
counters does not know.

Configuration: ``exporters.otlp`` fields, else the standard ``OTEL_EXPORTER_OTLP_*`` variables
(an endpoint alone enables export; headers, protocol, timeout, compression and certificates are
the SDK's own handling of those variables; ``OTEL_RESOURCE_ATTRIBUTES`` is merged).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal
from urllib.parse import urlsplit

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.semconv._incubating.attributes import host_attributes as host
from opentelemetry.semconv._incubating.attributes import hw_attributes as hw
from opentelemetry.semconv._incubating.attributes import network_attributes as network
from opentelemetry.semconv._incubating.metrics import hw_metrics
from opentelemetry.semconv.attributes import k8s_attributes as k8s
from opentelemetry.semconv.attributes import service_attributes as service
from opentelemetry.semconv.schemas import Schemas

from agent import __version__
from agent.catalog import CATALOG, HISTOGRAMS, MetricSpec
from agent.config import ConfigError, OtlpExporterConfig
from agent.snapshot import GpuState, Snapshot, series

logger = logging.getLogger(__name__)

# The semantic-conventions version this mapping follows (docs/fleet.md); the schema URL
# goes out with the Resource and the instrumentation scope.
SEMCONV_VERSION = "1.44.0"
SCHEMA_URL = Schemas.V1_44_0.value

# The GenAI registry's names (open-telemetry/semantic-conventions-genai, model/gen-ai/registry.yaml
# at 002c8a6e): 1.44 keeps them only as deprecated constants pointing there.
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_TOKEN_TYPE = "gen_ai.token.type"
TOKEN_INPUT, TOKEN_OUTPUT = "input", "output"  # gen_ai.token.type's members

Instrument = Literal["counter", "updowncounter", "gauge"]
Points = Iterator[tuple[dict[str, Any], float | int]]


@dataclass(frozen=True, slots=True)
class OtelMetric:
    """One OTLP metric: name, instrument, UCUM unit and the catalogue rows that feed it."""

    name: str
    instrument: Instrument
    unit: str
    description: str
    points: Callable[[Snapshot], Points]


# Catalogue label → OTel attribute. The node goes on the Resource, never on a point; the GPU's
# attributes (hw.id = its UUID, not the label's index) come from _gpu_attrs.
ATTRIBUTES: Mapping[str, str | None] = {
    "node": None,
    "gpu": None,
    "model": GEN_AI_REQUEST_MODEL,
    "model_version": "infercost.model.version",
    "engine": "infercost.engine",
    "kind": "infercost.engine.kind",
    "rule": "infercost.rule",
    "severity": "infercost.severity",
    "sink": "infercost.sink",
}
GPU_INDEX = "infercost.gpu.index"  # the NVML index (a MIG instance's: its GPU's); no hw.* holds it
GPU_LINK = "infercost.gpu.link"  # hw.gpu.io's link: "pcie" or "nvlink"; the conventions name none
GPU = hw.HwTypeValues.GPU.value  # hw.type of every GPU point that requires it
GPU_VENDOR = "NVIDIA"  # every GPU the agent reads comes through NVML
# Every OTLP name, unit and distinguishing attribute comes from the table of measures (the
# ``otel`` and ``otel_unit`` columns of agent/data/measures.csv): ``name`` or ``name{k=v,…}``,
# rows sharing a name going out as one metric told apart by those attributes; ``-`` for a row that
# is not a metric of its own (identity and build are attributes / the Resource; gpu_up is
# hw.status; temperature is hw.temperature, built below). What the conventions define beyond the
# name is here, keyed by the conventions' names: the instrument where it is not the row's kind
# (memory usage and limit are UpDownCounters), and the help of a metric merged from several rows.
SEMCONV_INSTRUMENTS: Mapping[str, Instrument] = {
    hw_metrics.HW_GPU_MEMORY_USAGE: "updowncounter",
    hw_metrics.HW_GPU_MEMORY_LIMIT: "updowncounter",
}
RECEIVE = network.NetworkIoDirectionValues.RECEIVE.value
TRANSMIT = network.NetworkIoDirectionValues.TRANSMIT.value
GPU_IO_HELP = (
    "Bytes received and transmitted over PCIe and NVLink (infercost.gpu.link), an estimate: NVML "
    "samples throughput (bytes/s), which the agent integrates between the samples it exports "
    "(trapezoid rule), so traffic that rises and falls between two of them is not seen."
)
MERGED_HELP: Mapping[str, str] = {
    "infercost.token.usage": "Tokens processed, by gen_ai.token.type (input = prompt, output = generated).",
    "infercost.token.rate": "Tokens per second over the trailing window, by gen_ai.token.type.",
    hw_metrics.HW_GPU_IO: GPU_IO_HELP,
}
NOT_SENT = "-"  # the otel column of a row that is not a metric of its own


def parse_otel(text: str) -> tuple[str, dict[str, str]]:
    """``name{k=v,…}`` → (name, {k: v}); a plain name has no attributes."""
    name, brace, rest = text.partition("{")
    if not brace:
        return text, {}
    pairs = (kv.split("=", 1) for kv in rest.rstrip("}").split(","))
    return name, {k.strip(): v.strip() for k, v in pairs}


def otel_name(spec: MetricSpec) -> str:
    """The OTLP name of a catalogue row (``-``: not sent as its own metric)."""
    return parse_otel(spec.otel)[0]


def _attrs(spec: MetricSpec, values: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in zip(spec.labels, values, strict=True):
        key = ATTRIBUTES.get(k, f"infercost.{k}")
        if key is not None:
            out[key] = v
    return out


def _gpu_attrs(snap: Snapshot) -> dict[str, dict[str, Any]]:
    """Per GPU label: hw.id (the UUID), hw.model, hw.vendor, the NVML index and, for a MIG
    instance, hw.parent (its GPU's UUID, that GPU's hw.id)."""
    out: dict[str, dict[str, Any]] = {}
    for g in snap.gpus:
        s = g.sample
        a = {hw.HW_ID: s.uuid, hw.HW_MODEL: s.name, hw.HW_VENDOR: GPU_VENDOR, GPU_INDEX: s.index}
        if s.mig_parent_uuid:
            a[hw.HW_PARENT] = s.mig_parent_uuid
        if snap.driver_version:
            a[hw.HW_DRIVER_VERSION] = snap.driver_version
        out[g.gpu] = a
    return out


def _catalogue_points(
    rows: Sequence[tuple[MetricSpec, Mapping[str, str]]], integer: bool
) -> Callable[[Snapshot], Points]:
    """The points of one or more catalogue rows (each with the attributes that tell it apart)."""

    def points(snap: Snapshot) -> Points:
        gpus = _gpu_attrs(snap) if any(spec.source == "gpu" for spec, _ in rows) else {}
        for spec, extra in rows:
            for labels, v in series(spec, snap):
                if v is None:
                    continue
                a = _attrs(spec, labels)
                if spec.source == "gpu":
                    a.update(gpus.get(labels[1], {}))
                a.update(extra)
                yield a, int(v) if integer else float(v)

    return points


def _gpu_status(snap: Snapshot) -> Points:
    """hw.status of each GPU: 1 for its current hw.state (ok or failed), 0 for the other."""
    gpus = _gpu_attrs(snap)
    for g in snap.gpus:
        base = {**gpus[g.gpu], hw.HW_TYPE: GPU}
        up = 1 if g.sample.up else 0
        yield {**base, hw.HW_STATE: hw.HwStateValues.OK.value}, up
        yield {**base, hw.HW_STATE: hw.HwStateValues.FAILED.value}, 1 - up


def _gpu_memory_utilization(snap: Snapshot) -> Points:
    """Fraction of GPU memory used (usage ÷ limit), where both are known."""
    gpus = _gpu_attrs(snap)
    for g in snap.gpus:
        used, total = g.sample.memory_used_bytes, g.sample.memory_total_bytes
        if used is not None and total:
            yield gpus[g.gpu], used / total


def _gpu_temperature(snap: Snapshot) -> Points:
    """The GPU's temperature sensor: its own hw.id, the GPU (its UUID) as hw.parent."""
    for g in snap.gpus:
        t = g.sample.temperature_celsius
        if t is not None:
            uuid = g.sample.uuid
            yield {hw.HW_ID: f"{uuid}.temperature", hw.HW_PARENT: uuid, hw.HW_SENSOR_LOCATION: "gpu"}, t


@dataclass(slots=True)
class _Link:
    """One (GPU, link, direction) being integrated."""

    total: float  # bytes since the sink first saw this link's throughput
    at: float | None  # epoch seconds of the last sample integrated; None after a gap
    rate: float  # bytes/s at ``at``


class GpuIo:
    """``hw.gpu.io`` points: NVML's sampled PCIe / NVLink throughput integrated into byte counters.

    Between two samples the sink sees, the bytes are the trapezoid of their rates over the time
    between the samples' timestamps: an estimate (traffic between two samples is taken as linear).
    A sample seen again adds nothing; an absent rate (no GPM, a MIG instance, the GPU lost) leaves
    the counter out and integrates nothing across the gap; a negative or non-finite rate counts as
    absent, so the counter never goes down. One per exporter: it holds the running totals (the
    SDK runs callbacks one at a time, under its collection lock)."""

    def __init__(self, rows: Sequence[tuple[MetricSpec, Mapping[str, str]]] = ()) -> None:
        self._rows = tuple(rows)  # the throughput rows, each with its link and direction attributes
        self._links: dict[tuple[str, str, str], _Link] = {}  # (UUID, link, direction) → state

    def __call__(self, snap: Snapshot) -> Points:
        gpus = _gpu_attrs(snap)
        by_label: dict[str, GpuState] = {g.gpu: g for g in snap.gpus}
        out: list[tuple[dict[str, Any], float | int]] = []
        for spec, extra in self._rows:
            link, direction = extra[GPU_LINK], extra[network.NETWORK_IO_DIRECTION]
            for (_, label), rate in series(spec, snap):
                sample = by_label[label].sample
                key = (sample.uuid, link, direction)
                state = self._links.get(key)
                if rate is None or not math.isfinite(rate) or rate < 0:
                    if state is not None:
                        state.at = None
                    continue
                t = sample.timestamp
                if state is None:
                    state = self._links[key] = _Link(0.0, None, rate)
                if state.at is not None and t > state.at:
                    state.total += (state.rate + rate) / 2 * (t - state.at)
                if state.at is None or t > state.at:
                    state.at, state.rate = t, rate
                attrs = {**gpus[label], **extra}
                out.append((attrs, round(state.total)))
        return iter(out)


def metric_table() -> tuple[OtelMetric, ...]:
    """Every OTLP metric the agent sends but the latency histograms; a fresh table per exporter
    (``hw.gpu.io`` holds running totals)."""
    out = [
        OtelMetric(hw_metrics.HW_STATUS, "updowncounter", "1", "GPU operational status.", _gpu_status),
        OtelMetric(
            hw_metrics.HW_GPU_MEMORY_UTILIZATION,
            "gauge",
            "1",
            "Fraction of GPU memory used.",
            _gpu_memory_utilization,
        ),
        OtelMetric(hw_metrics.HW_TEMPERATURE, "gauge", "Cel", "GPU temperature.", _gpu_temperature),
    ]
    groups: dict[str, list[tuple[MetricSpec, Mapping[str, str]]]] = {}
    for spec in CATALOG:
        name, extra = parse_otel(spec.otel)
        if name != NOT_SENT:
            groups.setdefault(name, []).append((spec, extra))
    for name, rows in groups.items():
        first = rows[0][0]
        units = {spec.otel_unit for spec, _ in rows}
        assert len(units) == 1, f"rows of one OTLP metric {name} with different units: {units}"
        help_ = MERGED_HELP.get(name, first.help) if len(rows) > 1 else first.help
        if name == hw_metrics.HW_GPU_IO:
            out.append(OtelMetric(name, "counter", first.otel_unit, help_, GpuIo(rows)))
            continue
        inst: Instrument = SEMCONV_INSTRUMENTS.get(name) or (
            "counter" if first.kind == "counter" else "gauge"
        )
        points = _catalogue_points(rows, integer=first.otel_unit == "By")
        out.append(OtelMetric(name, inst, first.otel_unit, help_, points))
    return tuple(out)


# Re-based latency histograms (catalogue HISTOGRAMS) → OTLP name.
HISTOGRAM_NAMES: Mapping[str, str] = {spec.name: otel_name(spec) for spec in HISTOGRAMS}


def histogram_metrics(snap: Snapshot, start_ns: int, now_ns: int) -> list[Metric]:
    """The re-based latency histograms of a snapshot as OTLP explicit-bucket histograms: the
    engine's finite ``le`` bounds as ``explicit_bounds``, per-bucket (not cumulative) counts with
    the ``+Inf`` bucket last, cumulative since ``start_ns``; min and max unknown (left unset).
    A family without a point is left out."""
    out: list[Metric] = []
    for spec in HISTOGRAMS:
        points: list[HistogramDataPoint] = []
        for labels, h in series(spec, snap):
            if h is None:
                continue
            counts: list[int] = []
            below = 0.0
            for _, c in h.buckets:
                counts.append(round(c - below))
                below = c
            points.append(
                HistogramDataPoint(
                    attributes=_attrs(spec, labels),
                    start_time_unix_nano=start_ns,
                    time_unix_nano=now_ns,
                    count=round(h.buckets[-1][1]),
                    sum=h.sum,
                    bucket_counts=counts,
                    explicit_bounds=[le for le, _ in h.buckets[:-1]],
                    min=None,  # type: ignore[arg-type]  # unknown: unset in OTLP
                    max=None,  # type: ignore[arg-type]
                )
            )
        if points:
            data = Histogram(points, AggregationTemporality.CUMULATIVE)
            out.append(Metric(HISTOGRAM_NAMES[spec.name], spec.help, "s", data))
    return out


class HistogramExporter(MetricExporter):
    """Wraps the SDK's exporter: each batch also carries the snapshot's re-based latency histograms
    (under the agent's Resource and scope), which no observable instrument can produce."""

    def __init__(
        self,
        inner: MetricExporter,
        get: Callable[[], Snapshot],
        res: Resource,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        super().__init__(inner._preferred_temporality, inner._preferred_aggregation)
        self._inner = inner
        self._get = get
        self._resource = res
        self._clock_ns = clock_ns
        self._start_ns = clock_ns()  # the histograms are cumulative since the agent started
        self._scope = InstrumentationScope("infercost", __version__, SCHEMA_URL)

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        """Add the histograms to the batch, then hand it to the wrapped exporter."""
        extra = histogram_metrics(self._get(), self._start_ns, self._clock_ns())
        if extra:
            metrics_data = _with_metrics(metrics_data, extra, self._resource, self._scope)
        return self._inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        """Flush the wrapped exporter."""
        return self._inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        """Shut the wrapped exporter down."""
        self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)


def _with_metrics(
    data: MetricsData, extra: list[Metric], res: Resource, scope: InstrumentationScope
) -> MetricsData:
    """``data`` with ``extra`` added to the agent's scope (or a new Resource/scope when absent)."""
    rms = list(data.resource_metrics)
    for i, rm in enumerate(rms):
        for j, sm in enumerate(rm.scope_metrics):
            if sm.scope.name == scope.name:
                sms = list(rm.scope_metrics)
                sms[j] = replace(sm, metrics=[*sm.metrics, *extra])
                rms[i] = replace(rm, scope_metrics=sms)
                return replace(data, resource_metrics=rms)
    rms.append(ResourceMetrics(res, [ScopeMetrics(scope, extra, SCHEMA_URL)], SCHEMA_URL))
    return replace(data, resource_metrics=rms)


def resource(node: str, environ: Mapping[str, str]) -> Resource:
    """service.*, host.name and, on Kubernetes, k8s.node.name / k8s.pod.name;
    ``OTEL_RESOURCE_ATTRIBUTES`` / ``OTEL_SERVICE_NAME`` are merged by the SDK.

    In a pod (``KUBERNETES_SERVICE_HOST`` set) the node name is ``K8S_NODE_NAME``, else the
    chart's ``INFERCOST_NODE`` (the downward API's ``spec.nodeName``), and the pod name is
    ``K8S_POD_NAME``, else ``HOSTNAME`` (a pod's hostname is its name; the chart does not use
    host networking). Outside Kubernetes only explicit ``K8S_*`` variables count."""
    attrs: dict[str, str] = {
        service.SERVICE_NAME: "infercost",
        service.SERVICE_VERSION: __version__,
        host.HOST_NAME: node,
    }
    in_pod = bool(environ.get("KUBERNETES_SERVICE_HOST"))
    node_name = environ.get("K8S_NODE_NAME") or (environ.get("INFERCOST_NODE") if in_pod else None)
    pod_name = environ.get("K8S_POD_NAME") or (environ.get("HOSTNAME") if in_pod else None)
    if node_name:
        attrs[k8s.K8S_NODE_NAME] = node_name
    if pod_name:
        attrs[k8s.K8S_POD_NAME] = pod_name
    return Resource.create(attrs, schema_url=SCHEMA_URL)


def protocol_of(cfg: OtlpExporterConfig, environ: Mapping[str, str]) -> str:
    """http/protobuf (default) or grpc; http/json is refused (the SDK does not send it)."""
    proto = (
        cfg.protocol
        or environ.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    )
    if proto not in ("http/protobuf", "grpc"):
        raise ConfigError(
            f"OTLP protocol {proto!r} (exporters.otlp.protocol or OTEL_EXPORTER_OTLP_PROTOCOL) is not "
            "supported; fix: use http/protobuf or grpc"
        )
    return proto


def make_exporter(cfg: OtlpExporterConfig, environ: Mapping[str, str]) -> MetricExporter:
    """The SDK's OTLP exporter for the configured protocol (endpoint, headers etc. from env if unset)."""
    timeout = cfg.timeout_seconds
    if protocol_of(cfg, environ) == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
                OTLPMetricExporter as GrpcExporter,
            )
        except ImportError:
            raise ConfigError(
                "OTLP protocol grpc needs the grpc extra; "
                "fix: pip install 'infercost[grpc]' or use http/protobuf"
            ) from None
        return GrpcExporter(endpoint=cfg.endpoint, timeout=timeout)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    return OTLPMetricExporter(endpoint=cfg.endpoint, timeout=timeout)


class OtlpExporter:
    """Periodic OTLP push of the snapshot; ``shutdown`` flushes once with a deadline."""

    def __init__(
        self,
        get: Callable[[], Snapshot],
        cfg: OtlpExporterConfig,
        node: str,
        exporter: MetricExporter | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        self._get = get
        if exporter is None:
            exporter = make_exporter(cfg, env)
        res = resource(node, env)
        self._reader = PeriodicExportingMetricReader(
            HistogramExporter(exporter, get, res),
            export_interval_millis=cfg.interval_seconds * 1000,
            export_timeout_millis=cfg.timeout_seconds * 1000,
        )
        self._provider = MeterProvider(resource=res, metric_readers=[self._reader])
        meter = self._provider.get_meter("infercost", __version__, schema_url=SCHEMA_URL)
        for m in metric_table():
            cb = self._callback(m)
            if m.instrument == "counter":
                meter.create_observable_counter(
                    m.name, callbacks=[cb], unit=m.unit, description=m.description
                )
            elif m.instrument == "updowncounter":
                meter.create_observable_up_down_counter(
                    m.name, callbacks=[cb], unit=m.unit, description=m.description
                )
            else:
                meter.create_observable_gauge(m.name, callbacks=[cb], unit=m.unit, description=m.description)
        self._closed = False

    def _callback(self, m: OtelMetric) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def cb(_opts: CallbackOptions) -> Iterable[Observation]:
            return [Observation(v, a) for a, v in m.points(self._get())]

        return cb

    def flush(self, timeout_seconds: float = 5.0) -> bool:
        """Export now; False when the collector did not take it in time."""
        return self._provider.force_flush(int(timeout_seconds * 1000))

    def shutdown(self) -> None:
        """Final flush and stop, once."""
        if not self._closed:
            self._closed = True
            self._provider.shutdown()


def otlp_exporter(
    get: Callable[[], Snapshot],
    cfg: OtlpExporterConfig,
    node: str,
    environ: Mapping[str, str] | None = None,
) -> OtlpExporter | None:
    """The exporter when an endpoint is configured (config or ``OTEL_EXPORTER_OTLP_*``), else None."""
    env = os.environ if environ is None else environ
    endpoint = cfg.endpoint_in(env)
    if endpoint is None:
        return None
    where = urlsplit(endpoint)  # scheme and host only: a URL may carry credentials
    logger.info(
        "OTLP export (%s) to %s://%s every %.0f s",
        protocol_of(cfg, env),
        where.scheme,
        where.hostname,
        cfg.interval_seconds,
    )
    return OtlpExporter(get, cfg, node, environ=env)
