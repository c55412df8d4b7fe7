"""What the agent sends over OTLP, decoded from real posts to a local receiver, held against the
conventions: every ``hw.*`` name a constant of the pinned ``opentelemetry-semantic-conventions``
package with its instrument, unit and required attributes; every ``gen_ai.*`` name one of the GenAI
registry's (listed below with its source); everything else under ``infercost.``. Then the
Prometheus names that OTLP path produces, against the table in docs/fleet.md, and ``hw.gpu.io``'s
integration of NVML's sampled throughput."""

from __future__ import annotations

import asyncio
import importlib
import math
import pkgutil
import re
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import opentelemetry.semconv._incubating.attributes as incubating_attributes
import opentelemetry.semconv._incubating.metrics as incubating_metrics
import opentelemetry.semconv.attributes as stable_attributes
import opentelemetry.semconv.metrics as stable_metrics
import pytest
from opentelemetry.semconv._incubating.attributes import hw_attributes as hw
from opentelemetry.semconv._incubating.attributes import network_attributes as network
from opentelemetry.semconv._incubating.metrics import hw_metrics
from test_exporter import T0
from test_otlp import HttpReceiver, Received, _snap, decode, semconv_instrument

from agent.catalog import CATALOG, HISTOGRAMS
from agent.config import OtlpExporterConfig
from agent.samples import GpuSample, Histogram
from agent.sinks.otlp import HISTOGRAM_NAMES, metric_table, otel_name, otlp_exporter
from agent.snapshot import GpuState, Snapshot

ROOT = Path(__file__).resolve().parents[1]

# The GenAI registry: semantic conventions 1.44 deprecate every gen_ai.* name as "moved to
# semantic-conventions-genai". From open-telemetry/semantic-conventions-genai,
# model/gen-ai/registry.yaml at commit 002c8a6ea1c8a42b14a4527db83b3cabcded610a: attribute → its
# enumerated members (None: a free string). It defines no metric a reader of engine counters can
# fill (model/gen-ai/metrics.yaml: per-request client and server histograms that require
# gen_ai.provider.name), so no gen_ai.* metric name is allowed.
GENAI_ATTRIBUTES: dict[str, frozenset[str] | None] = {
    "gen_ai.request.model": None,
    "gen_ai.token.type": frozenset({"input", "output"}),
}
GENAI_METRICS: frozenset[str] = frozenset()

# From open-telemetry/semantic-conventions v1.44.0 (commit e10a930844c6951757a43b849d364f7d056ac32b),
# model/hardware/common.yaml, common-metrics.yaml, gpu-metrics.yaml and temperature-metrics.yaml:
# the attributes each hw metric requires, and the metrics whose values are integers
# (metric_value_type: int). The Python package carries names, instruments and units, not these.
HW_REQUIRED: dict[str, frozenset[str]] = {
    hw_metrics.HW_GPU_UTILIZATION: frozenset({hw.HW_ID}),
    hw_metrics.HW_GPU_MEMORY_USAGE: frozenset({hw.HW_ID}),
    hw_metrics.HW_GPU_MEMORY_LIMIT: frozenset({hw.HW_ID}),
    hw_metrics.HW_GPU_MEMORY_UTILIZATION: frozenset({hw.HW_ID}),
    hw_metrics.HW_GPU_IO: frozenset({hw.HW_ID, network.NETWORK_IO_DIRECTION}),
    hw_metrics.HW_POWER: frozenset({hw.HW_ID, hw.HW_TYPE}),
    hw_metrics.HW_ENERGY: frozenset({hw.HW_ID, hw.HW_TYPE}),
    hw_metrics.HW_STATUS: frozenset({hw.HW_ID, hw.HW_TYPE, hw.HW_STATE}),
    hw_metrics.HW_TEMPERATURE: frozenset({hw.HW_ID}),
}
HW_INTEGER = {
    hw_metrics.HW_GPU_IO,
    hw_metrics.HW_GPU_MEMORY_USAGE,
    hw_metrics.HW_GPU_MEMORY_LIMIT,
    hw_metrics.HW_STATUS,
}
# Enumerated attributes: the package's enums (and the registry's for gen_ai.*).
ENUMS: dict[str, frozenset[str]] = {
    hw.HW_TYPE: frozenset(v.value for v in hw.HwTypeValues),
    hw.HW_STATE: frozenset(v.value for v in hw.HwStateValues),
    hw.HW_GPU_TASK: frozenset(v.value for v in hw.HwGpuTaskValues),
    network.NETWORK_IO_DIRECTION: frozenset(v.value for v in network.NetworkIoDirectionValues),
    **{k: v for k, v in GENAI_ATTRIBUTES.items() if v is not None},
}
# UCUM units the agent uses: base units, annotations ({token}), and ratios of them.
UCUM = {"1", "s", "By", "W", "J", "Hz", "Cel", "{token}", "{token}/s", "{request}", "{series}"}
UCUM |= {"{alert}", "{message}", "{USD}", "{USD}/h", "{USD}/10*6{token}"}


def _constants(package: ModuleType) -> set[str]:
    """Every string constant of every module of a conventions package."""
    out: set[str] = set()
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        out |= {v for k, v in vars(module).items() if k.isupper() and isinstance(v, str)}
    return out


# gen_ai.* constants of the pinned package are deprecated and only point at the registry above.
SEMCONV_ATTRIBUTES = {
    a
    for a in _constants(stable_attributes) | _constants(incubating_attributes)
    if not a.startswith("gen_ai.")
}
SEMCONV_METRICS = {
    m for m in _constants(stable_metrics) | _constants(incubating_metrics) if not m.startswith("gen_ai.")
}

MIG = "MIG-5c2e"  # a MIG instance of GPU 1
RATES = {  # bytes/s, NVML GPM throughput of GPU 0
    "pcie_rx_bytes_per_s": 2.0e9,
    "pcie_tx_bytes_per_s": 1.0e9,
    "nvlink_rx_bytes_per_s": 4.0e10,
    "nvlink_tx_bytes_per_s": 3.0e10,
}


def _rich_snapshot() -> Snapshot:
    """test_otlp's snapshot with every kind of attribute the agent can send: GPM throughput on GPU 0,
    a MIG instance of GPU 1 (a pod holds it), a latency histogram, time by bound, a priority class,
    a deploy, a firing alert and an outbox."""
    snap = _snap()
    g0, g1 = snap.gpus
    mig = GpuSample(1, MIG, "NVIDIA H100 80GB HBM3 MIG 1g.10gb", g1.sample.timestamp, mig_parent_uuid="GPU-1")
    (m,) = snap.models
    hist = Histogram(((0.1, 4.0), (1.0, 9.0), (math.inf, 10.0)), 3.5, 10.0)
    model = replace(
        m,
        ttft_histogram=hist,
        bound_gpu_seconds_total={"compute": 12.0, "memory": 8.0},
        bound_cost_usd_total={"compute": 0.012, "memory": 0.008},
        priority_class="realtime",
    )
    return replace(
        snap,
        gpus=(replace(g0, sample=replace(g0.sample, **RATES)), g1, GpuState(sample=mig)),
        models=(model,),
        alerts_firing={("CostPerTokenRegression", "warning"): 1},
        outbox_pending={"slack": 2},
        deploys={(m.engine, m.model, m.model_version): T0},
        gpu_pods={MIG: ("batch", "trainer-0")},
        driver_version="580.159.04",
    )


async def _posts(snaps: list[Snapshot]) -> list[dict[str, Received]]:
    """One OTLP/HTTP post per snapshot, from the real exporter, decoded; and the last Resource."""
    rx = HttpReceiver()
    await rx.start()
    current = [snaps[0]]
    cfg = OtlpExporterConfig(endpoint=f"http://127.0.0.1:{rx.port}/v1/metrics", interval_seconds=3600)
    exp = otlp_exporter(lambda: current[0], cfg, snaps[0].node, environ={})
    assert exp is not None
    try:
        for s in snaps:
            current[0] = s
            assert await asyncio.to_thread(exp.flush, 10.0)
    finally:
        await asyncio.to_thread(exp.shutdown)
        await rx.close()
    return [decode(msg)[2] for _, _, msg in rx.got[: len(snaps)]]


@pytest.fixture(scope="module")
def sent() -> tuple[dict[str, Any], dict[str, Received]]:
    """(Resource attributes, name → metric) of one post of the rich snapshot."""

    async def post() -> tuple[dict[str, Any], dict[str, Received]]:
        rx = HttpReceiver()
        await rx.start()
        snap = _rich_snapshot()
        cfg = OtlpExporterConfig(endpoint=f"http://127.0.0.1:{rx.port}/v1/metrics", interval_seconds=3600)
        exp = otlp_exporter(lambda: snap, cfg, snap.node, environ={})
        assert exp is not None
        try:
            assert await asyncio.to_thread(exp.flush, 10.0)
        finally:
            await asyncio.to_thread(exp.shutdown)
            await rx.close()
        resource, _, got = decode(rx.got[0][2])
        return resource, got

    return asyncio.run(post())


def test_every_name_unit_instrument_and_attribute_is_the_conventions_or_ours(
    sent: tuple[dict[str, Any], dict[str, Received]],
) -> None:
    resource, got = sent
    assert set(resource) <= SEMCONV_ATTRIBUTES, set(resource) - SEMCONV_ATTRIBUTES
    bad: list[str] = []
    for name, r in got.items():
        if name.startswith("hw."):
            if name not in SEMCONV_METRICS:
                bad.append(f"{name}: not a conventions metric")
                continue
            if (r.kind, r.monotonic, r.unit) != semconv_instrument(name):
                bad.append(f"{name}: {(r.kind, r.monotonic, r.unit)} ≠ {semconv_instrument(name)}")
            for p in r.points:
                if missing := HW_REQUIRED[name] - p.attrs.keys():
                    bad.append(f"{name}: point without required {sorted(missing)}")
                if name in HW_INTEGER and not isinstance(p.value, int):
                    bad.append(f"{name}: {p.value!r} is not an integer")
                if p.attrs.get(hw.HW_TYPE, hw.HwTypeValues.GPU.value) != hw.HwTypeValues.GPU.value:
                    bad.append(f"{name}: hw.type {p.attrs[hw.HW_TYPE]} on a GPU")
        elif name.startswith("gen_ai."):
            if name not in GENAI_METRICS:
                bad.append(f"{name}: not a GenAI registry metric")
        elif not name.startswith("infercost."):
            bad.append(f"{name}: neither the conventions' nor under infercost.")
        if r.unit not in UCUM:
            bad.append(f"{name}: unit {r.unit!r}")
        if set(name.replace("_", ".").split(".")) & {"usd", "seconds", "bytes", "watts", "ratio", "total"}:
            bad.append(f"{name}: a unit in the name")
        for p in r.points:
            for key, value in p.attrs.items():
                if key.startswith("gen_ai."):
                    ok = key in GENAI_ATTRIBUTES
                elif key.startswith(("hw.", "network.")):
                    ok = key in SEMCONV_ATTRIBUTES
                else:
                    ok = key.startswith("infercost.")
                if not ok:
                    bad.append(f"{name}: attribute {key}")
                if key in ENUMS and value not in ENUMS[key]:
                    bad.append(f"{name}: {key}={value!r} is not one of {sorted(ENUMS[key])}")
    assert not bad, "\n".join(bad)
    # the families the rich snapshot feeds are all there
    assert {
        hw_metrics.HW_GPU_IO,
        hw_metrics.HW_TEMPERATURE,
        "infercost.token.usage",
        "infercost.time_to_first_token",
        "infercost.cost.by_bound",
        "infercost.alerts.firing",
        "infercost.outbox.pending",
        "infercost.gpu.pod.info",
        "infercost.model.class.info",
    } <= got.keys()


def test_the_gpu_is_its_uuid_with_the_nvml_index_beside(
    sent: tuple[dict[str, Any], dict[str, Received]],
) -> None:
    _, got = sent
    status = got[hw_metrics.HW_STATUS].points
    ids = {(p.attrs[hw.HW_ID], p.attrs["infercost.gpu.index"], p.attrs.get(hw.HW_PARENT)) for p in status}
    # a MIG instance is its own UUID under its GPU's: hw.parent is the GPU's hw.id
    assert ids == {("GPU-0", 0, None), ("GPU-1", 1, None), (MIG, 1, "GPU-1")}
    assert all(p.attrs[hw.HW_VENDOR] == "NVIDIA" for p in status)
    assert all(p.attrs[hw.HW_DRIVER_VERSION] == "580.159.04" for p in status)
    (temp,) = got[hw_metrics.HW_TEMPERATURE].points
    assert temp.attrs[hw.HW_PARENT] == "GPU-0" and temp.attrs[hw.HW_ID] != "GPU-0"
    # the pod holding the MIG instance is read on that instance's hw.id
    (pod,) = got["infercost.gpu.pod.info"].points
    assert pod.attrs[hw.HW_ID] == MIG and pod.attrs["infercost.pod"] == "trainer-0"


def test_gpu_io_is_one_byte_counter_by_link_and_direction(
    sent: tuple[dict[str, Any], dict[str, Received]],
) -> None:
    _, got = sent
    io = got[hw_metrics.HW_GPU_IO]
    assert "estimate" in io.description
    keys = {
        (p.attrs[hw.HW_ID], p.attrs["infercost.gpu.link"], p.attrs[network.NETWORK_IO_DIRECTION])
        for p in io.points
    }
    rx, tx = network.NetworkIoDirectionValues.RECEIVE.value, network.NetworkIoDirectionValues.TRANSMIT.value
    # GPU 1 and the MIG instance have no GPM throughput: absent, not 0
    assert keys == {("GPU-0", link, d) for link in ("pcie", "nvlink") for d in (rx, tx)}
    assert not any("pcie" in n or "nvlink" in n for n in got), "the rate gauges are replaced"


def _with_rates(snap: Snapshot, t: float, rates: dict[str, float | None]) -> Snapshot:
    g0, *rest = snap.gpus
    return replace(snap, gpus=(replace(g0, sample=replace(g0.sample, timestamp=t, **rates)), *rest))


async def test_gpu_io_integrates_the_sampled_throughput_and_never_goes_down() -> None:
    base = _snap()
    pcie = {"pcie_rx_bytes_per_s": 1.0e9, "pcie_tx_bytes_per_s": 2.0e8}
    gone: dict[str, float | None] = {"pcie_rx_bytes_per_s": None, "pcie_tx_bytes_per_s": None}
    snaps = [
        _with_rates(base, T0, pcie),
        _with_rates(base, T0 + 10, {"pcie_rx_bytes_per_s": 3.0e9, "pcie_tx_bytes_per_s": 2.0e8}),
        _with_rates(base, T0 + 10, {"pcie_rx_bytes_per_s": 3.0e9, "pcie_tx_bytes_per_s": 2.0e8}),  # again
        _with_rates(base, T0 + 20, gone),  # GPM stopped answering
        _with_rates(base, T0 + 60, pcie),  # back: the gap adds nothing
        _with_rates(base, T0 + 65, {"pcie_rx_bytes_per_s": -1.0, "pcie_tx_bytes_per_s": math.nan}),
        _with_rates(base, T0 + 70, pcie),
    ]
    posts = await _posts(snaps)

    def io(post: dict[str, Received]) -> dict[str, int]:
        pts = post[hw_metrics.HW_GPU_IO].points if hw_metrics.HW_GPU_IO in post else []
        return {p.attrs[network.NETWORK_IO_DIRECTION]: p.value for p in pts}

    seen = [io(p) for p in posts]
    # trapezoid: (1 + 3) / 2 GB/s × 10 s = 20 GB received; 0.2 GB/s × 10 s = 2 GB sent
    assert seen[0] == {"receive": 0, "transmit": 0}
    assert seen[1] == {"receive": 20_000_000_000, "transmit": 2_000_000_000}
    assert seen[2] == seen[1]  # the same sample again adds nothing
    assert seen[3] == {}  # unknown throughput: absent, not 0
    assert seen[4] == seen[1]  # nothing integrated across the gap
    assert seen[5] == {}  # a negative or NaN rate is no reading
    assert seen[6] == seen[1]


# ---- The OTLP → Prometheus names (docs/fleet.md)
# The translation Prometheus and the Collector apply with suffixes and underscore escaping (the
# default UnderscoreEscapingWithSuffixes): prometheus/otlptranslator metric_namer.go and
# unit_namer.go at 51da77392288a9e499af0900c6cde6a8d769dc34, which the Collector's
# pkg/translator/prometheus/normalize_name.go (at 239be622b58f940fbbc86668b3e1a47d40004073) matches
# for every unit used here. Main units by unitMap, "/x" as per_<perUnitMap>, a unit with {…} adds
# nothing, _total for a monotonic sum, _ratio for a gauge of unit 1.
UNIT_WORDS = {"d": "days", "h": "hours", "min": "minutes", "s": "seconds", "ms": "milliseconds"}
UNIT_WORDS |= {"us": "microseconds", "ns": "nanoseconds", "By": "bytes", "m": "meters", "V": "volts"}
UNIT_WORDS |= {"A": "amperes", "J": "joules", "W": "watts", "g": "grams", "Cel": "celsius"}
UNIT_WORDS |= {"Hz": "hertz", "1": "", "%": "percent"}
PER_WORDS = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "mo": "month", "y": "year"}


def _clean(unit: str) -> str:
    return re.sub(r"_+", "_", re.sub(r"[^a-zA-Z0-9:]", "_", unit)).lstrip("_")


def prometheus_name(name: str, r: Received) -> str:
    """The Prometheus name of an OTLP metric by the rules above."""
    tokens = [t for t in re.split(r"[^a-zA-Z0-9:]", name) if t]
    main, _, per = (u.strip() for u in r.unit.partition("/"))
    main_word = _clean(UNIT_WORDS.get(main, main)) if main and not set(main) & set("{}") else ""
    per_word = _clean("per_" + PER_WORDS.get(per, per)) if per and not set(per) & set("{}") else ""
    per_word = "" if per_word == "per_" else per_word.removesuffix("_")
    if main_word in tokens:
        main_word = ""
    if per_word:
        main_word = main_word.removesuffix("_")
    tokens += [w for w in (main_word, per_word) if w]
    if r.kind == "sum" and r.monotonic:
        tokens = [t for t in tokens if t != "total"] + ["total"]
    if r.unit == "1" and r.kind == "gauge":
        tokens = [t for t in tokens if t != "ratio"] + ["ratio"]
    return "_".join(tokens)


def test_prometheus_name_follows_the_translator() -> None:
    """Cases from the translator's own tests (otlptranslator metric_namer_test.go, with suffixes)."""
    cases = [
        ("requests", "", "sum", True, "requests_total"),
        ("cpu_usage", "1", "gauge", None, "cpu_usage_ratio"),
        ("items", "1", "sum", True, "items_total"),
        ("response_time", "ms", "gauge", None, "response_time_milliseconds"),
        ("memory_usage", "By", "gauge", None, "memory_usage_bytes"),
        ("requests", "1/s", "gauge", None, "requests_per_second"),
        ("throughput", "By/s", "gauge", None, "throughput_bytes_per_second"),
        ("custom_metric", "{custom}", "gauge", None, "custom_metric"),
        ("custom_metric", "By/{custom}", "gauge", None, "custom_metric_bytes"),
        ("cpu_seconds_total", "s", "sum", True, "cpu_seconds_total"),
        ("otelcol_process_cpu_seconds", "s", "sum", True, "otelcol_process_cpu_seconds_total"),
    ]
    for name, unit, kind, mono, want in cases:
        assert prometheus_name(name, Received(kind, mono, unit, [])) == want, (name, unit)


_ROW = re.compile(r"^\| `([a-z0-9_.]+)` \| `([^`]*)` \| `([a-z0-9_]+)` \| (.*) \|$")


def _docs_table() -> dict[str, tuple[str, str, set[str]]]:
    """docs/fleet.md's OTLP table: OTLP name → (unit, Prometheus name, scrape-path names)."""
    text = (ROOT / "docs" / "fleet.md").read_text(encoding="utf-8")
    out = {}
    for line in text.splitlines():
        if m := _ROW.match(line):
            out[m[1]] = (m[2], m[3], set(re.findall(r"`(infercost_[a-z0-9_]+)`", m[4])))
    return out


def test_the_docs_give_the_prometheus_name_of_every_metric(
    sent: tuple[dict[str, Any], dict[str, Received]],
) -> None:
    """docs/fleet.md lists every OTLP metric with its unit, its Prometheus name through OTLP and the
    scrape-path families that feed it; instrument and unit as decoded from a real post where the
    rich snapshot sends the metric, else as the sink declares them."""
    _, got = sent
    kinds = {"counter": ("sum", True), "updowncounter": ("sum", False), "gauge": ("gauge", None)}
    expected = {m.name: Received(*kinds[m.instrument], m.unit, []) for m in metric_table()}
    expected |= {name: Received("histogram", None, "s", []) for name in HISTOGRAM_NAMES.values()}
    assert got.keys() <= expected.keys()
    expected |= got
    table = _docs_table()
    want = {name: (r.unit, prometheus_name(name, r)) for name, r in expected.items()}
    have = {name: row[:2] for name, row in table.items()}
    wrong = sorted(n for n in want.keys() | have.keys() if want.get(n) != have.get(n))
    assert not wrong, f"docs/fleet.md's OTLP table: rows missing, stale or wrong: {wrong}"
    scrape = {s.full_name for s in (*CATALOG, *HISTOGRAMS)}
    for name, (_, _, families) in table.items():
        assert families and families <= scrape, (name, families - scrape)
    for spec in (*CATALOG, *HISTOGRAMS):
        name = HISTOGRAM_NAMES.get(spec.name) or otel_name(spec)
        if name in table:
            assert spec.full_name in table[name][2], (name, spec.full_name)
