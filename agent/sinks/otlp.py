"""OTLP export of the same snapshot, through the OpenTelemetry SDK.

Each catalogue row becomes an observable instrument whose callback reads the current snapshot;
a PeriodicExportingMetricReader pushes them over OTLP/HTTP. Names follow the semantic conventions
where one exists (``hw.gpu.utilization``, ``hw.power``, ``hw.energy``, ...) and ``infercost.*``
otherwise; label names become ``infercost.*`` attributes except ``hw.id`` for the GPU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from agent import __version__
from agent.catalog import CATALOG, MetricSpec
from agent.config import OtlpExporterConfig
from agent.snapshot import Snapshot, series

logger = logging.getLogger(__name__)

_ATTR = {"gpu": "hw.id", "gpu_model": "hw.model", "node": "host.name"}


def otel_name(spec: MetricSpec) -> str:
    """The OTLP instrument name of a catalogue row."""
    if spec.otel_name:
        return spec.otel_name
    return "infercost." + spec.name.removesuffix("_total")


def _attrs(spec: MetricSpec, values: tuple[str, ...]) -> dict[str, str]:
    return {_ATTR.get(k, f"infercost.{k}"): v for k, v in zip(spec.labels, values, strict=True)}


class OtlpExporter:
    """Periodic OTLP push of the snapshot; ``shutdown`` flushes once with a deadline."""

    def __init__(
        self,
        get: Callable[[], Snapshot],
        cfg: OtlpExporterConfig,
        node: str,
        exporter: MetricExporter | None = None,
    ) -> None:
        self._get = get
        if exporter is None:
            assert cfg.endpoint is not None
            exporter = OTLPMetricExporter(endpoint=cfg.endpoint, timeout=cfg.timeout_seconds)
        self._reader = PeriodicExportingMetricReader(
            exporter,
            export_interval_millis=cfg.interval_seconds * 1000,
            export_timeout_millis=cfg.timeout_seconds * 1000,
        )
        resource = Resource.create(
            {"service.name": "infercost", "service.version": __version__, "host.name": node}
        )
        self._provider = MeterProvider(resource=resource, metric_readers=[self._reader])
        meter = self._provider.get_meter("infercost", __version__)
        seen: set[str] = set()
        for spec in CATALOG:
            name = otel_name(spec)
            if name in seen:
                continue
            seen.add(name)
            cb = self._callback(spec)
            if spec.kind == "counter":
                meter.create_observable_counter(name, callbacks=[cb], unit=spec.unit, description=spec.help)
            else:
                meter.create_observable_gauge(name, callbacks=[cb], unit=spec.unit, description=spec.help)
        self._closed = False

    def _callback(self, spec: MetricSpec) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def cb(_opts: CallbackOptions) -> Iterable[Observation]:
            snap = self._get()
            return [
                Observation(float(v), _attrs(spec, labels))
                for labels, v in series(spec, snap)
                if v is not None
            ]

        return cb

    def flush(self, timeout_seconds: float = 5.0) -> bool:
        """Export now; False when the collector did not take it in time."""
        return self._provider.force_flush(int(timeout_seconds * 1000))

    def shutdown(self) -> None:
        """Final flush and stop, once."""
        if not self._closed:
            self._closed = True
            self._provider.shutdown()
