"""The agent's configuration: one typed, frozen model loaded from YAML with environment overrides.

A bad file raises :class:`ConfigError`, whose message names the file, the key and the fix;
``cli.py`` turns it into exit code 2. Secrets (webhook URLs, routing keys) are never stored
here as values: the config names an environment variable or a file, read when needed.

Environment overrides: ``INFERCOST_NODE``, ``INFERCOST_STATE_DIR`` and, for any key,
``INFERCOST__SECTION__KEY=value`` (double underscores separate the path; values are YAML).
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agent.cost.inputs import EngineSpec
from agent.text import strip_invisible

EngineKind = Literal["vllm", "sglang", "tgi", "triton", "trtllm", "llamacpp", "auto"]

DEFAULT_ENGINE_PORTS: Mapping[str, int] = {
    "vllm": 8000,
    "sglang": 30000,
    "tgi": 9000,  # TGI's --prometheus-port default
    "triton": 8002,
    "llamacpp": 8080,
}


EngineRole = Literal["prefill", "decode", "both"]
ENGINE_ROLES: tuple[str, ...] = ("prefill", "decode", "both")
# Cost labels are user text (pod labels, node.yaml) exported on every node's info series and kept in
# the history. Why 16: the questions a finance lead asks (team, cost centre, product, environment)
# are a handful of labels; more is a label set copied whole, whose every value multiplies the fleet's
# series. Why 63: a Kubernetes label value's own limit, so every real pod label fits.
MAX_COST_LABELS = 16
MAX_LABEL_VALUE_CHARS = 63
_LABEL_NAME_BAD = re.compile(r"[^a-zA-Z0-9_]")


def cost_label_name(name: str) -> str:
    """The exported name of a cost label, as kube-state-metrics spells pod labels: ``label_`` and the
    name with every character outside ``[a-zA-Z0-9_]`` as ``_`` (``app.kubernetes.io/part-of`` →
    ``label_app_kubernetes_io_part_of``)."""
    return "label_" + _LABEL_NAME_BAD.sub("_", name)


def clean_label_value(value: object) -> str:
    """A cost label's value as exported: text without invisible format characters or control
    characters, surrounding blanks removed, at most :data:`MAX_LABEL_VALUE_CHARS` characters."""
    text = strip_invisible(str(value))
    text = "".join(ch for ch in text if ch.isprintable())
    return text.strip()[:MAX_LABEL_VALUE_CHARS]


class ConfigError(Exception):
    """A configuration file is unusable; the message names the file, the key and the fix."""


class _Frozen(BaseModel):
    # allow_inf_nan=False: `1e400` (YAML reads it as +inf) or `.nan` in any number is refused
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class SecretRef(_Frozen):
    """Where a secret lives: an environment variable or a file. The value never reaches a log."""

    env: str | None = None
    file: Path | None = None

    @model_validator(mode="after")
    def _one_source(self) -> SecretRef:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of 'env' (variable name) or 'file' (path)")
        return self

    def read(self) -> str | None:
        """The secret, or None when the variable / file is missing."""
        if self.env is not None:
            return os.environ.get(self.env) or None
        assert self.file is not None
        try:
            return self.file.read_text().strip() or None
        except OSError:
            return None

    def describe(self) -> str:
        """Where the secret comes from, for log lines (never the value)."""
        return f"${self.env}" if self.env else f"file {self.file}"


class IntervalsConfig(_Frozen):
    """Sampling cadence. Why 1 s / 5 s: NVML utilisation is averaged by the driver over ≤ 1 s, and
    engine counters move slowly enough that a 5 s scrape keeps the agent under 1 % of a core."""

    # Bounds, why: below 0.1 s NVML only repeats its last average and a scrape cannot finish; above a
    # day a tick would fold a day of counters into one window (and a sleep that long looks hung).
    nvml_seconds: float = Field(1.0, ge=0.1, le=86400)
    scrape_seconds: float = Field(5.0, ge=0.1, le=86400)
    # rollup written to the store and seen by detectors; 10 s–1 h: the store keeps 1-minute rows
    window_seconds: float = Field(60.0, ge=10, le=3600)


class NvmlConfig(_Frozen):
    """Which NVML backend to use. ``auto``: the real library when a driver answers, else none."""

    backend: Literal["auto", "real", "fake", "none"] = "auto"
    fake_profile: str = "H100-SXM"  # with backend: fake
    fake_count: int = Field(8, ge=0, le=64)


class EngineConfig(_Frozen):
    """One inference engine endpoint on this node."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$")
    kind: EngineKind = "auto"
    url: str  # full URL of the Prometheus page, e.g. http://127.0.0.1:8000/metrics
    gpus: tuple[int | str, ...] = ()  # NVML indexes or UUIDs; empty = a CPU-only engine
    model: str | None = None  # model name for engines whose metrics carry none (TGI, llama.cpp)
    model_version: str | None = None  # version of every model this engine serves
    model_versions: dict[str, str] = Field(default_factory=dict)  # per served model name
    version_file: Path | None = None  # a downward-API labels file (lines key="value"), re-read each window
    version_label: str = "app.kubernetes.io/version"  # the key to read from version_file
    timeout_seconds: float = Field(2.0, gt=0, le=600)  # why ≤ 10 min: longer is a hung engine
    max_bytes: int = Field(8 * 1024 * 1024, gt=0)  # larger pages are refused (hostile endpoints)
    # At most this many models per engine; the rest are folded into model="other" (why 64: bounds
    # the series per node that /metrics and the store carry, while a multi-LoRA server stays whole)
    max_models: int = Field(64, ge=1)
    weights_bytes: float | None = Field(None, gt=0)  # model weights read per decode step, for roofline
    # FLOPs of one token through the weights (2 × active parameters; for a MoE the active ones):
    # lets the decode efficiency take the least time the window's prefill could have cost out of the step
    flops_per_token: float | None = Field(None, gt=0)
    kv_bytes_per_token: float | None = Field(None, gt=0)  # 2 × layers × kv_heads × head_dim × bytes
    kv_capacity_tokens: float | None = Field(
        None, gt=0
    )  # KV-cache size in tokens (vLLM: blocks × block size)
    # Priority class of the traffic this engine serves (real-time vs batch on shared GPUs), per
    # served model name or for every model; exported as infercost_model_class_info to join on.
    priority_class: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]+$")
    priority_classes: dict[str, str] = Field(default_factory=dict)  # served model name → class
    # Cost labels (team, cost centre, …): who pays for this engine, exported once per engine on
    # infercost_engine_cost_info as label_<name> and kept with the history (docs/kubernetes.md)
    labels: dict[str, str] = Field(default_factory=dict)
    # prefill / decode for a disaggregated deployment's pools, both for an engine serving whole requests
    role: EngineRole = "both"
    # Filled in by Kubernetes discovery (the pod behind the engine); a static engine may set them
    namespace: str = ""
    pod: str = ""
    group: str = ""  # a multi-node engine's group (LeaderWorkerSet group key); "" for none
    group_leader: bool = True  # whether this pod is its group's leader (the one counting tokens)

    @field_validator("labels", mode="before")
    @classmethod
    def _cost_labels(cls, v: object) -> object:
        if not isinstance(v, Mapping):
            return v
        if len(v) > MAX_COST_LABELS:
            raise ValueError(
                f"{len(v)} cost labels, at most {MAX_COST_LABELS}; keep the ones a cost is grouped by"
            )
        out: dict[str, str] = {}
        for k, val in v.items():
            if not isinstance(k, str) or not k or len(k) > 253 or not k.isprintable():
                raise ValueError(f"cost label name {str(k)[:64]!r} must be a label key such as team")
            if isinstance(val, (Mapping, list, tuple)):
                raise ValueError(f"cost label {k!r} must have a text value, e.g. {k}: search")
            out[k] = clean_label_value(val)
        return out

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL, e.g. http://127.0.0.1:8000/metrics")
        return v

    def version_of(self, model: str) -> str:
        """The deployed version of ``model`` from deployment metadata, or "unknown"."""
        return self.model_versions.get(model) or self.model_version or "unknown"

    def cost_spec(self) -> EngineSpec:
        """This engine as plain data for the cost layer (which imports no configuration model)."""
        return EngineSpec(
            name=self.name,
            kind=self.kind,
            gpus=self.gpus,
            model_version=self.model_version,
            model_versions=dict(self.model_versions),
            weights_bytes=self.weights_bytes,
            flops_per_token=self.flops_per_token,
            kv_bytes_per_token=self.kv_bytes_per_token,
            kv_capacity_tokens=self.kv_capacity_tokens,
            priority_class=self.priority_class,
            priority_classes=dict(self.priority_classes),
        )


class PricesConfig(_Frozen):
    """Where prices come from and how a GPU shared by engines is split."""

    book: Path | None = None  # None = the bundled example book (override it!)
    share_policy: Literal["equal", "tokens"] = "equal"


class PrometheusExporterConfig(_Frozen):
    """The /metrics and /healthz endpoint."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = Field(9464, ge=0, le=65535)  # 0 = pick a free port
    # TLS and basic / bearer auth, in Prometheus exporter-toolkit's web-config shape (docs/configuration.md)
    web_config_file: Path | None = None


class OtlpExporterConfig(_Frozen):
    """Push to an OpenTelemetry Collector over OTLP (HTTP/protobuf, or gRPC with the ``grpc`` extra).

    Unset fields fall back to the standard ``OTEL_EXPORTER_OTLP_*`` variables: an endpoint from
    ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT`` alone enables export;
    headers, protocol, timeout, compression and certificates come from the environment too."""

    endpoint: str | None = None  # e.g. http://otel-collector:4318/v1/metrics; None = off (or env)
    protocol: Literal["http/protobuf", "grpc"] | None = None  # None = OTEL_EXPORTER_OTLP_PROTOCOL
    interval_seconds: float = Field(60.0, ge=1, le=86400)  # why ≥ 1 s: a Collector is not a hot path
    timeout_seconds: float = Field(5.0, gt=0, le=600)

    def endpoint_in(self, environ: Mapping[str, str]) -> str | None:
        """Where to push: this endpoint, else the standard variables in ``environ``; None = export off."""
        return (
            self.endpoint
            or environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
            or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
            or None
        )


class ExportersConfig(_Frozen):
    """Exporters of the current snapshot."""

    prometheus: PrometheusExporterConfig = PrometheusExporterConfig()
    otlp: OtlpExporterConfig = OtlpExporterConfig()


# Why ten years: a cost history is read for budgets and contracts, a few years at most; a longer
# retention is a typo. Rule durations are bounded by it (a longer one can never be evaluated).
MAX_RETENTION_DAYS = 3650


class StoreConfig(_Frozen):
    """Embedded SQLite history."""

    retention_days: float = Field(
        35.0, gt=0, le=MAX_RETENTION_DAYS
    )  # why 35: a month plus the week a weekly report looks back


class SlackConfig(_Frozen):
    """Slack incoming webhook."""

    webhook_url: SecretRef
    channel: str | None = None
    min_interval_seconds: float = Field(
        1.0, ge=0, le=3600
    )  # Slack allows about 1 message per second per webhook


class PagerDutyConfig(_Frozen):
    """PagerDuty Events API v2."""

    routing_key: SecretRef
    url: str = "https://events.pagerduty.com/v2/enqueue"
    max_events_per_minute: int = Field(120, gt=0)  # PagerDuty's documented per-routing-key limit


class WebhookConfig(_Frozen):
    """A generic receiver in Alertmanager's webhook JSON shape."""

    url: SecretRef


class AlertmanagerConfig(_Frozen):
    """Alertmanager's API v2: the recommended alert path for a fleet (silences, inhibition and
    grouping then apply to the agent's alerts too)."""

    url: str  # base URL, e.g. http://alertmanager.monitoring:9093 (alerts go to /api/v2/alerts)
    # Why 60 s: Prometheus re-sends firing alerts every minute; endsAt is 4 re-sends ahead, so
    # three lost posts in a row still do not resolve an alert that is firing.
    resend_seconds: float = Field(60.0, ge=1, le=3600)

    @field_validator("url")
    @classmethod
    def _http(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("give the Alertmanager base URL with http:// or https://")
        return v.rstrip("/")


class AlertsConfig(_Frozen):
    """Rules and where alerts go."""

    rules_dirs: tuple[Path, ...] = ()  # empty = the bundled default rules
    external_url: str | None = None  # link put in alerts (e.g. a Grafana dashboard; the generatorURL)
    # where the rules' relative runbook links (rules/agent/README.md#rule) resolve, e.g. the
    # project's repository or your own copy of the runbooks; unset: external_url, as before
    runbook_base_url: str | None = None
    slack: SlackConfig | None = None
    pagerduty: PagerDutyConfig | None = None
    webhook: WebhookConfig | None = None
    alertmanager: AlertmanagerConfig | None = None

    @field_validator("external_url", "runbook_base_url")
    @classmethod
    def _absolute(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("give an absolute http:// or https:// URL")
        return v

    @property
    def runbook_base(self) -> str | None:
        """The base relative runbook links are joined to."""
        return self.runbook_base_url or self.external_url


class KubernetesConfig(_Frozen):
    """Engine discovery from the Kubernetes API and GPU mapping from the kubelet (see
    docs/kubernetes.md). Off by default: static ``engines:`` are used alone."""

    enabled: bool = False
    node_name: str | None = None  # the node whose pods are watched; default: ``node`` (spec.nodeName)
    kubeconfig: Path | None = None  # None: in-cluster service account, else $KUBECONFIG / ~/.kube/config
    namespaces: tuple[str, ...] = ()  # empty = every namespace
    annotations: bool = True  # pods annotated infercost.io/scrape: "true" are engines
    # pods carrying all these labels are engines (an infercost.io/scrape: "false" annotation still
    # excludes one); with a selector only matching pods are watched at all
    label_selector: dict[str, str] = Field(default_factory=dict)
    default_path: str = "/metrics"
    version_labels: tuple[str, ...] = ("app.kubernetes.io/version",)  # first present wins, then image tag
    # Ports a discovered engine may be scraped on even if its pod does not declare them (SSRF limit:
    # otherwise only the pod's own IP and a containerPort it declares are ever contacted)
    allowed_ports: tuple[int, ...] = ()
    # A pod whose IP is loopback is refused (SSRF limit: 127.0.0.1 is the node's own services, not a
    # pod); true only where engines really serve on loopback (a local test cluster)
    allow_loopback: bool = False
    pod_resources_socket: Path | None = Path("/var/lib/kubelet/pod-resources/kubelet.sock")  # None = off
    # Why 15 s: devices are assigned once per container start; a few seconds late costs a few
    # seconds of one pod's GPUs attributed as idle, and List is cheap for the kubelet.
    # Why ≤ 1 day: GPUs found a day late are a day of cost misattributed; longer is a typo.
    pod_resources_seconds: float = Field(15.0, gt=0, le=86400)
    # Backoff after an API-server error: doubles from min to max (seconds), the last engines kept.
    # Why ≤ 1 day: the API server is back within hours; a longer wait keeps stale engines for days.
    backoff_min_seconds: float = Field(1.0, gt=0, le=86400)
    backoff_max_seconds: float = Field(60.0, gt=0, le=86400)
    # per scrape of a discovered engine; why ≤ 10 min: as engines.timeout_seconds, longer is hung
    timeout_seconds: float = Field(2.0, gt=0, le=600)
    max_bytes: int = Field(8 * 1024 * 1024, gt=0)  # per page of a discovered engine
    # Engine pods scraped on this node; the ones beyond wait (counted on /metrics, named once in the
    # log) and take a place when an engine leaves. Why 256: an engine holds a GPU or a slice of one: a
    # node has at most 8 GPUs (16 on the largest), each cut at most 7 ways by MIG (56, or 112), and
    # the kubelet runs at most 110 pods by default (250 where raised); past a few hundred the pods
    # cannot be real GPU engines, and scraping thousands would take the daemon's loop. Why ≤ 4,096:
    # beyond it one tick's scrapes no longer fit any sane interval.
    max_engines: int = Field(256, ge=1, le=4096)
    # Pod labels that say who pays (team, app.kubernetes.io/part-of, …): read from each engine pod,
    # exported on infercost_engine_cost_info as label_<name> (docs/kubernetes.md); at most 16
    cost_labels: tuple[str, ...] = Field((), max_length=MAX_COST_LABELS)
    role_label: str = "llm-d.ai/role"  # prefill / decode / both (llm-d's label); absent: both
    group_label: str = "leaderworkerset.sigs.k8s.io/group-key"  # a multi-node engine's group
    worker_index_label: str = "leaderworkerset.sigs.k8s.io/worker-index"  # "0" is the group's leader

    @field_validator("cost_labels")
    @classmethod
    def _label_keys(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for k in v:
            if not k or len(k) > 253 or not k.isprintable() or " " in k:
                raise ValueError(
                    f"{k[:64]!r} is not a pod label key (e.g. team or app.kubernetes.io/part-of)"
                )
        names = [cost_label_name(k) for k in v]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"two keys export as the same name {sorted(dup)}; keep one of them")
        return v


WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")


class ReportConfig(_Frozen):
    """The weekly cost report that ``infercost run`` posts to Slack (through alerts.slack)."""

    enabled: bool = False
    weekday: Literal["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"] = "monday"
    hour: int = Field(9, ge=0, le=23)  # local hour in `timezone` at which the week ends and is posted
    timezone: str = "UTC"  # an IANA name, e.g. Europe/Berlin
    link: str | None = (
        None  # where the full report is published (absolute, or relative to alerts.external_url)
    )
    keep_files: bool = True  # also write HTML/CSV/JSON/Markdown into state_dir/reports

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, v: str) -> str:
        import zoneinfo

        try:
            zoneinfo.ZoneInfo(v)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"unknown time zone {v!r}; use an IANA name such as Europe/Berlin or UTC"
            ) from None
        return v


class AllocationConfig(_Frozen):
    """How dollars are put to groups (namespace, team, …) by the cost API, ``infercost query`` and the
    report's ``--group-by`` (docs/cost-allocation.md)."""

    # idle: dollars that made no group's tokens (GPUs no engine used; on the usage basis also the
    # allocated time no kernel ran) as their own "__idle__" group; share: spread over the groups in
    # proportion to their dollars (OpenCost's shareIdle)
    idle_policy: Literal["idle", "share"] = "idle"


class BudgetConfig(_Frozen):
    """A monthly budget: dollars per calendar month (UTC, as Prometheus reads months) for one model,
    namespace or team. Exported as ``infercost_budget_usd``; the fleet rules and the report forecast
    the month against it (docs/fleet.md#budgets)."""

    scope: Literal["model", "namespace", "team"]  # team: the pods' `team` cost label (label_team)
    name: str = Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9_.:/-]+$")
    monthly_usd: float = Field(gt=0)  # dollars per calendar month


class LimitsConfig(_Frozen):
    """Bounds that hold whatever engines send: series lifetime, histogram size, parse CPU, page bytes."""

    # A model, version or engine not seen for this long leaves /metrics, the window join and
    # memory (its history stays in the store). Why 1 h: a replaced version stays through the
    # dashboards' before/after views and the fleet rules' 1-hour rates; a name a hostile page
    # invented once is gone after it. Why ≥ 1 min: shorter would expire a live series between two
    # scrapes of a slow engine; why ≤ 7 days: longer keeps a week of invented names in memory.
    series_ttl_seconds: float = Field(3600.0, ge=60, le=7 * 86400)
    # A page with a histogram of more buckets than this (for one model) is refused, the engine down
    # with the reason. Why 1,000: engines' histograms have tens of buckets (vLLM's largest has
    # about 30); each bucket is a series per model on /metrics and in memory, so a hundred-thousand
    # bucket page would cost the daemon (and Prometheus) far more than all real ones together.
    max_histogram_buckets: int = Field(1000, ge=2, le=100_000)
    # CPU seconds one page may cost to read (decode, parse, map); a page costing more is refused
    # (the engine down, the cost named) and its engine is read less often until it is cheap again.
    # Why 0.5 s: a tenth of a core at the default 5 s scrape interval; real engines' pages, even a
    # multi-LoRA server at max_models, cost a small part of it (``infercost bench parse``).
    scrape_cpu_seconds: float = Field(0.5, gt=0, le=60)
    # Bytes of engine pages read and not yet done with, over every engine together: a scrape whose
    # page would pass it waits (holding nothing) or is refused (the engine down, named). Why 32 MiB:
    # four pages at the default max_bytes at once, or a full node's engines (256) at 128 KiB each
    # (real pages are tens of kB), while a burst of hostile pages stays within what a node agent
    # may hold; why >= 1 MiB: one real multi-LoRA page must fit.
    page_bytes_in_flight: int = Field(32 * 1024 * 1024, ge=1024 * 1024, le=1024 * 1024 * 1024)


class Config(_Frozen):
    """The whole agent configuration."""

    node: str = Field(default_factory=socket.gethostname)
    state_dir: Path = Path("/var/lib/infercost")
    intervals: IntervalsConfig = IntervalsConfig()
    nvml: NvmlConfig = NvmlConfig()
    engines: tuple[EngineConfig, ...] = ()
    prices: PricesConfig = PricesConfig()
    exporters: ExportersConfig = ExportersConfig()
    store: StoreConfig = StoreConfig()
    alerts: AlertsConfig = AlertsConfig()
    kubernetes: KubernetesConfig = KubernetesConfig()
    report: ReportConfig = ReportConfig()
    allocation: AllocationConfig = AllocationConfig()
    budgets: tuple[BudgetConfig, ...] = ()
    limits: LimitsConfig = LimitsConfig()

    @field_validator("budgets")
    @classmethod
    def _one_budget_each(cls, v: tuple[BudgetConfig, ...]) -> tuple[BudgetConfig, ...]:
        seen = [(b.scope, b.name) for b in v]
        dup = sorted({k for k in seen if seen.count(k) > 1})
        if dup:
            raise ValueError(f"two budgets for {dup[0][0]} {dup[0][1]!r}; keep one per scope and name")
        return v

    @model_validator(mode="after")
    def _unique_engines(self) -> Config:
        seen: set[str] = set()
        for e in self.engines:
            if e.name in seen:
                raise ValueError(f"engine name {e.name!r} is used twice; give each engine a unique name")
            seen.add(e.name)
        keys = self.cost_label_keys()
        if len(keys) > MAX_COST_LABELS:
            raise ValueError(
                f"{len(keys)} cost label keys over kubernetes.cost_labels and the engines' labels, at most "
                f"{MAX_COST_LABELS}: {', '.join(keys)}; keep the ones a cost is grouped by"
            )
        names = [cost_label_name(k) for k in keys]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"cost label keys that export as the same name {dup}; spell them alike")
        return self

    def cost_label_keys(self) -> tuple[str, ...]:
        """Every cost label key of this node (``kubernetes.cost_labels`` and the static engines'
        ``labels:``), sorted: the label set of ``infercost_engine_cost_info`` (fixed per config)."""
        keys = set(self.kubernetes.cost_labels) if self.kubernetes.enabled else set()
        for e in self.engines:
            keys.update(e.labels)
        return tuple(sorted(keys))


def _set_path(tree: dict[str, Any], path: list[str], value: Any) -> None:
    node = tree
    for key in path[:-1]:
        nxt = node.get(key)
        if not isinstance(nxt, dict):
            nxt = {}
            node[key] = nxt
        node = nxt
    node[path[-1]] = value


def apply_env(raw: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """Overlay ``INFERCOST_*`` variables on a raw config tree (a new tree is returned)."""
    tree = dict(raw)
    if environ.get("INFERCOST_NODE"):
        tree["node"] = environ["INFERCOST_NODE"]
    if environ.get("INFERCOST_STATE_DIR"):
        tree["state_dir"] = environ["INFERCOST_STATE_DIR"]
    for name, value in environ.items():
        if name.startswith("INFERCOST__"):
            path = [p.lower() for p in name[len("INFERCOST__") :].split("__") if p]
            if path:
                _set_path(tree, path, yaml.safe_load(value))
    return tree


def _deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` on ``base``: mappings merge key by key, anything else (lists included) replaces."""
    out = dict(base)
    for k, v in over.items():
        cur = out.get(k)
        out[k] = _deep_merge(cur, v) if isinstance(cur, dict) and isinstance(v, dict) else v
    return out


def apply_node_overrides(
    raw: dict[str, Any], source: str, environ: Mapping[str, str]
) -> tuple[dict[str, Any], str]:
    """Merge the ``nodes.<this node>`` section over the file (one ConfigMap for a mixed fleet).

    The node is ``INFERCOST_NODE`` (the chart sets it from ``spec.nodeName``), else ``node``, else
    the hostname. Returns the merged tree and the source name to use in messages.
    """
    tree = dict(raw)
    nodes = tree.pop("nodes", None)
    if nodes is None:
        return tree, source
    if not isinstance(nodes, dict) or not all(isinstance(v, dict) for v in nodes.values()):
        raise ConfigError(
            f"{source}: key 'nodes': must map node names to partial configurations "
            "(e.g. nodes: {gpu-node-17: {engines: [...]}}); fix: correct the value"
        )
    name = str(environ.get("INFERCOST_NODE") or tree.get("node") or socket.gethostname())
    over = nodes.get(name)
    if not over:
        return tree, source
    if "node" in over or "nodes" in over:
        raise ConfigError(
            f"{source}: key 'nodes.{name}': a node override cannot set 'node' or 'nodes'; fix: remove it"
        )
    return _deep_merge(tree, over), f"{source} (with nodes.{name})"


def format_validation_error(source: str, err: ValidationError) -> str:
    """One line per problem: file, dotted key, what is wrong and how to fix it."""
    lines = [f"{source}: invalid configuration"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            fix = "remove it or check its spelling (see docs/configuration.md)"
            msg = "unknown key"
        elif e["type"] == "missing":
            fix = "add it"
            msg = "required key is missing"
        else:
            fix = "correct the value"
            msg = e["msg"]
        # values under alerts.* may be secrets (a webhook URL pasted where a reference belongs)
        got = "(value hidden)" if key.startswith("alerts.") else repr(e.get("input"))
        lines.append(f"  {source}: key '{key}': {msg} (got {got}); fix: {fix}")
    return "\n".join(lines)


def parse_config(raw: Any, source: str, environ: Mapping[str, str] | None = None) -> Config:
    """Validate a raw tree (from YAML) into a :class:`Config`; raise ConfigError on any problem."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of keys (node, engines, ...)")
    env = os.environ if environ is None else environ
    tree, source = apply_node_overrides(raw, source, env)
    tree = apply_env(tree, env)
    try:
        return Config.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(format_validation_error(source, err)) from None


def load_yaml(path: Path) -> Any:
    """Read a YAML file, turning I/O and syntax errors into ConfigError naming the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}; fix: check the path") from None
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte {err.object[err.start]:#04x} at offset {err.start}); "
            "fix: save the file as UTF-8"
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{where}: {getattr(err, 'problem', err)}") from None


def load_config(path: Path | None, environ: Mapping[str, str] | None = None) -> Config:
    """Load a config file (None = defaults plus environment)."""
    if path is None:
        return parse_config({}, "(defaults)", environ)
    return parse_config(load_yaml(path), str(path), environ)
