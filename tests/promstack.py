"""Test helper: real Prometheus and Alertmanager on free loopback ports, and a small real exporter
that serves every series of the catalogue (``agent.catalog.CATALOG``).

Processes are started with :class:`subprocess.Popen`, log to files in the test's temp dir, and are
stopped by their own PID (terminate, then kill) — nothing outlives the test. Missing binaries are
a failure, not a skip: CI's ``.ci/run`` installs them.

Quirks handled here (see the shared PROMETHEUS_RIG notes): Prometheus 2.42 throttles discovery
for 5 s, so the first scrape lands about 5–6 s after start; Alertmanager gets
``--cluster.listen-address=`` so it opens no gossip port.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from netutil import free_port
from procs import terminate
from prometheus_client import start_http_server
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from agent.catalog import CATALOG, COST_LABELS_MARK, HISTOGRAMS, MetricSpec

if TYPE_CHECKING:
    from agent.supervisor import Agent

READY_TIMEOUT_S = 15.0  # seconds; Prometheus is ready in ~0.4 s, Alertmanager in ~0.6 s


def binary(name: str) -> str:
    """Path of a tool CI installs; fails (not skips) when it is missing."""
    path = shutil.which(name)
    assert path, f"{name} not found: apt-get install prometheus prometheus-alertmanager (CI's .ci/run does)"
    return path


def http_get_json(url: str, timeout: float = 5.0) -> Any:
    """GET a URL and decode its JSON body."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


# ---------------------------------------------------------------------------------------------
# The catalogue exporter
# ---------------------------------------------------------------------------------------------

NODES = {"node-a": "NVIDIA H100 80GB HBM3", "node-b": "NVIDIA A100-SXM4-80GB"}  # node → GPU model
GPUS = ("0", "1")
MODELS = (  # (engine, kind, model, model_version)
    ("vllm-0", "vllm", "llama-3-70b", "v1"),
    ("vllm-1", "vllm", "llama-3-70b", "v2"),
    ("sglang-0", "sglang", "qwen2-7b", "2024-06"),
)


# The cost labels the exporter's engines carry (infercost_engine_cost_info's label_* mark) and who
# each engine's pod belongs to: two namespaces and two teams
COST_LABEL_NAMES = ("label_team",)
ENGINE_OWNERS = {"vllm-0": ("search", "search"), "vllm-1": ("search", "search"), "sglang-0": ("chat", "chat")}


def label_names(spec: MetricSpec) -> tuple[str, ...]:
    """A family's label names, the cost-labels mark replaced by :data:`COST_LABEL_NAMES`."""
    return tuple(n for k in spec.labels for n in (COST_LABEL_NAMES if k == COST_LABELS_MARK else (k,)))


def label_sets(spec: MetricSpec) -> Iterator[dict[str, str]]:
    """Plausible label values for every label set a catalogue family can carry."""
    for node, gpu_model in NODES.items():
        if spec.source == "node":
            yield {"node": node}
        elif spec.source == "build":
            yield {"node": node, "version": "0.1.0", "python_version": "3.11.7"}
        elif spec.source == "gpu":
            for gpu in GPUS:
                base = {"node": node, "gpu": gpu}
                extra = {"uuid": f"GPU-{node}-{gpu}", "gpu_model": gpu_model, "mig_parent": ""}
                extra |= {"namespace": "research", "pod": "notebook-0"}  # gpu_pod_info
                yield {k: ({**base, **extra})[k] for k in spec.labels}
        elif spec.source == "engine":
            for engine, kind, _, _ in MODELS:
                namespace, team = ENGINE_OWNERS[engine]
                ident = {"node": node, "engine": engine, "kind": kind, "engine_namespace": namespace,
                         "engine_pod": f"{engine}-0", "engine_role": "both", "engine_group": "",
                         "engine_group_leader": "true", "label_team": team}  # fmt: skip
                yield {k: ident[k] for k in label_names(spec)}
        elif spec.source in ("model", "deploy"):
            for engine, _, model, version in MODELS:
                labels = {"node": node, "engine": engine, "model": model, "model_version": version}
                labels["gpu_model"] = gpu_model  # infercost_model_gpu_info
                labels["priority_class"] = "batch" if "qwen" in model.lower() else "realtime"
                labels["bound"] = "memory"  # infercost_gpu_time_bound_seconds_total, _cost_bound_usd_total
                yield {k: labels[k] for k in spec.labels}
        elif spec.source == "alert":
            yield {"node": node, "rule": "cost_per_token_regression", "severity": "critical"}
        elif spec.source == "outbox":
            yield {"node": node, "sink": "slack"}
        elif spec.source == "budget":
            yield {"node": node, "scope": "team", "name": "search"}


def _rate(spec: MetricSpec, labels: Mapping[str, str]) -> float:
    """A per-second increase for counters, a level for gauges; deterministic per label set."""
    spread = 1.0 + (sum(map(ord, "".join(labels.values()))) % 7) / 10.0
    if "tokens" in spec.name:
        return 200.0 * spread  # tokens/s
    if "usd" in spec.name:
        return 0.0008 * spread  # $/s ≈ $2.9/h
    if "joules" in spec.name or "watts" in spec.name:
        return 350.0 * spread  # W (= J/s)
    if "bytes" in spec.name:
        return 40e9 * spread  # bytes
    if spec.name.endswith("_up") or spec.name == "gpu_info":
        return 1.0
    if "seconds" in spec.name:
        return 0.05 * spread  # s (latencies, GPU-seconds per second)
    return 0.1 * spread  # ratios, counts, scores


class CatalogueCollector:
    """A prometheus_client collector that emits every catalogue family with synthetic values:
    counters grow linearly from the collector's start, gauges hold steady. ``overrides`` pins a
    family (full name) to one value, e.g. ``{"infercost_engine_up": 0.0}``."""

    def __init__(self, overrides: Mapping[str, float] | None = None) -> None:
        self._t0 = time.time()
        self.overrides = dict(overrides or {})

    def collect(self) -> Iterator[Metric]:
        """Build the families at scrape time."""
        elapsed = time.time() - self._t0 + 1.0  # seconds
        for spec in CATALOG:
            fam: GaugeMetricFamily | CounterMetricFamily
            if spec.kind == "counter":
                fam = CounterMetricFamily(spec.full_name, spec.help, labels=label_names(spec))
            else:
                fam = GaugeMetricFamily(spec.full_name, spec.help, labels=label_names(spec))
            for labels in label_sets(spec):
                rate = _rate(spec, labels)
                value = rate * elapsed if spec.kind == "counter" else rate
                value = 1.0 if spec.name == "engine_cost_info" else value  # an info series joins by × 1
                value = self.overrides.get(spec.full_name, value)
                fam.add_metric([labels[k] for k in label_names(spec)], value)
            yield fam
        yield from self._histograms(elapsed)

    @staticmethod
    def _histograms(elapsed: float) -> Iterator[Metric]:
        """The re-based latency histograms (catalog.HISTOGRAMS): 2 requests/s per label set, a
        quarter under 0.1 s, half under 0.5 s, 95 % under 2 s, all under 10 s (cumulative counts
        growing linearly, like the counters)."""
        for spec in HISTOGRAMS:
            fam = HistogramMetricFamily(spec.full_name, spec.help, labels=spec.labels)
            for labels in label_sets(spec):
                n = 2.0 * elapsed  # requests so far
                shares = (("0.1", 0.25), ("0.5", 0.5), ("2.0", 0.95), ("10.0", 1.0))  # le → share under it
                buckets = [(le, n * f) for le, f in shares]
                fam.add_metric([labels[k] for k in spec.labels], [*buckets, ("+Inf", n)], 0.6 * n)
            yield fam


class CatalogueExporter:
    """A real HTTP /metrics endpoint (prometheus_client's server) serving the catalogue."""

    def __init__(self, overrides: Mapping[str, float] | None = None) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(CatalogueCollector(overrides))
        self._server, self._thread = start_http_server(0, addr="127.0.0.1", registry=self.registry)
        self.port = int(self._server.server_address[1])

    @property
    def target(self) -> str:
        """host:port for a scrape config."""
        return f"127.0.0.1:{self.port}"

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


# ---------------------------------------------------------------------------------------------
# Prometheus and Alertmanager processes
# ---------------------------------------------------------------------------------------------


class _Process:
    """A server process with a log file, stopped by its own PID."""

    def __init__(self, argv: Sequence[str], log: Path, ready_url: str) -> None:
        self.log = log
        self._fh = log.open("wb")
        self.proc = subprocess.Popen(list(argv), stdout=self._fh, stderr=subprocess.STDOUT)
        self._wait_ready(ready_url)

    def _wait_ready(self, url: str) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with urllib.request.urlopen(url, timeout=1) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        self.close()
        raise AssertionError(f"{url} not ready; log:\n{self.log.read_text(errors='replace')[-3000:]}")

    def close(self) -> None:
        """Terminate (then kill) the process and wait for it."""
        terminate(self.proc)
        self._fh.close()


def test_copy_of_rules(src: Path, dest: Path, alert_for: str | None = None) -> Path:
    """Copy a rule file with every group's ``interval`` removed, so all groups run at the test
    config's 1 s evaluation interval (a 5 m group would not evaluate within a test); with
    ``alert_for``, every alert's ``for:`` becomes that duration (e.g. "0s")."""
    doc = yaml.safe_load(src.read_text())
    for group in doc["groups"]:
        group.pop("interval", None)
        for rule in group["rules"]:
            if alert_for is not None and "alert" in rule:
                rule["for"] = alert_for
    dest.write_text(yaml.safe_dump(doc, sort_keys=False))
    return dest


test_copy_of_rules.__test__ = False  # type: ignore[attr-defined]  # not a pytest test


def openmetrics_of(families: Mapping[str, Sequence[str]]) -> str:
    """An OpenMetrics text of sample lines per family name (``*_total``: a counter, else a gauge),
    for :func:`backfill`."""
    out = []
    for name, lines in families.items():
        out.append(
            f"# TYPE {name.removesuffix('_total')} {'counter' if name.endswith('_total') else 'gauge'}"
        )
        out.extend(lines)
    return "\n".join([*out, "# EOF"]) + "\n"


def backfill(openmetrics: str, workdir: Path, max_block: str = "384h") -> Path:
    """TSDB blocks made from an OpenMetrics text by ``promtool tsdb create-blocks-from openmetrics``,
    in ``workdir/data`` (the text kept beside it as ``history.om``); blocks of at most ``max_block``."""
    workdir.mkdir(parents=True, exist_ok=True)
    om = workdir / "history.om"
    om.write_text(openmetrics)
    data = workdir / "data"
    cmd = [binary("promtool"), "tsdb", "create-blocks-from", "openmetrics", "--quiet"]
    out = subprocess.run(
        [*cmd, f"--max-block-duration={max_block}", str(om), str(data)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return data


@contextlib.contextmanager
def backfilled_prometheus(workdir: Path, openmetrics: str) -> Iterator[Prometheus]:
    """A real Prometheus over the history an OpenMetrics text holds (:func:`backfill`), closed on exit."""
    prom = Prometheus(workdir, data_dir=backfill(openmetrics, workdir))
    try:
        yield prom
    finally:
        prom.close()


@contextlib.asynccontextmanager
async def scraped_by_prometheus(agent: Agent, workdir: Path, rules: Path) -> AsyncIterator[Prometheus]:
    """Run a built agent and a real Prometheus scraping its ``/metrics`` with a test copy of
    ``rules`` (:func:`test_copy_of_rules`); on exit the agent stops (within 30 s), then Prometheus."""
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    prom = None
    try:
        await agent.started.wait()
        assert agent.prometheus is not None
        copy = test_copy_of_rules(rules, workdir / "rules.yml")
        target = f"127.0.0.1:{agent.prometheus.port}"
        prom = await asyncio.to_thread(Prometheus, workdir / "prom", [target], [copy])
        yield prom
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        if prom is not None:
            await asyncio.to_thread(prom.close)


class Prometheus(_Process):
    """A real Prometheus on a free loopback port, scraping ``targets`` every second (job
    ``infercost``), plus any further ``scrape_configs`` given whole."""

    def __init__(
        self,
        workdir: Path,
        targets: Sequence[str] = (),
        rule_files: Sequence[Path] = (),
        alertmanager: str | None = None,
        data_dir: Path | None = None,
        retention: str = "90d",
        scrape_configs: Sequence[dict[str, Any]] = (),
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config: dict[str, Any] = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [{"job_name": "infercost", "static_configs": [{"targets": list(targets)}]}],
        }
        config["scrape_configs"].extend(scrape_configs)  # extra jobs (TLS, auth, ...)
        if alertmanager:
            config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
        cfg = workdir / "prometheus.yml"
        cfg.write_text(yaml.safe_dump(config))
        argv = [
            binary("prometheus"),
            f"--config.file={cfg}",
            f"--storage.tsdb.path={data_dir or workdir / 'data'}",
            f"--storage.tsdb.retention.time={retention}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        super().__init__(argv, workdir / "prometheus.log", f"{self.url}/-/ready")

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """Instant query; the result vector (raises on an API error)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        body = http_get_json(f"{self.url}/api/v1/query?{urllib.parse.urlencode(params)}")
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def wait_for(self, expr: str, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Poll until ``expr`` returns at least one series (the 5 s discovery throttle applies)."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if result or time.monotonic() > deadline:
                return result
            time.sleep(0.25)


class Alertmanager(_Process):
    """A real Alertmanager on a free loopback port, without cluster gossip."""

    def __init__(self, workdir: Path, config: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [
            binary("prometheus-alertmanager"),
            f"--config.file={config}",
            f"--storage.path={workdir / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",
        ]
        super().__init__(argv, workdir / "alertmanager.log", f"{self.url}/-/ready")
