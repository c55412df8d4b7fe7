"""Every series infercost exports: name, type, unit, help and labels — the contract.

WHERE THE ROWS LIVE: ``agent/data/measures.csv``, the table of measures (columns described in
:mod:`agent.measures`). To add a series, add one row there — kind ``gauge``/``counter``/
``histogram``, its ``source`` (the snapshot collection) and ``field`` (the attribute on each item),
the labels beyond the source's own, the OTLP name — then run ``python scripts/metrics_doc.py``.
Nothing here or in the exporters names a series: this module only turns the table's exported rows
into :class:`MetricSpec` values, which the exporters (Prometheus, OTLP), the metrics reference
(docs/metrics.md) and the tests read. A ``None`` value means "absent", and the series is not
emitted. Label cardinality per node is bounded: gpus (≤ 8, or MIG instances), engines and their
models (a handful), rules (tens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agent.measures import BASE_LABELS, MEASURES, Measure

Kind = Literal["gauge", "counter", "histogram"]
Source = Literal["node", "build", "gpu", "engine", "model", "deploy", "alert", "outbox", "budget"]

NAMESPACE = "infercost"
NODE_LABELS = BASE_LABELS["node"]
GPU_LABELS = BASE_LABELS["gpu"]
ENGINE_LABELS = BASE_LABELS["engine"]
MODEL_LABELS = BASE_LABELS["model"]
# Stands for the node's cost labels (label_team, …: kubernetes.cost_labels and engines' labels:),
# fixed per config; exporters put the names in its place (agent.snapshot.label_names).
COST_LABELS_MARK = "label_*"


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One exported series family (one exported row of the table of measures)."""

    name: str  # Prometheus name without the namespace; counters end in _total
    kind: Kind
    unit: str  # UCUM unit for OTLP ("1", "s", "W", "J", "By", "USD", "{token}")
    help: str
    source: Source
    field: str  # attribute read on each item of the source ("": derived from the aggregation)
    labels: tuple[str, ...]
    otel: str = ""  # the OTLP name ("-": not its own metric; "name{k=v}": merged with others)
    otel_unit: str = ""  # its UCUM unit over OTLP
    signal: str | None = None  # the rule signal of the same measure (None: not aggregated)

    @property
    def full_name(self) -> str:
        """The exported Prometheus name."""
        return f"{NAMESPACE}_{self.name}"


def spec_of(m: Measure) -> MetricSpec:
    """The exported series family of one table row."""
    kind: Kind = m.kind  # type: ignore[assignment]  # exported rows only
    source: Source = m.source  # type: ignore[assignment]  # the table checks its sources
    return MetricSpec(m.name, kind, m.unit, m.help, source, m.field, m.labels, m.otel, m.otel_unit, m.signal)


# One number per label set, in table order.
CATALOG: tuple[MetricSpec, ...] = tuple(spec_of(m) for m in MEASURES if m.kind in ("gauge", "counter"))

# The engines' latency histograms re-based under infercost's labels (agent.cost.latency): each is
# a Prometheus histogram (``_bucket`` by ``le``, ``_sum``, ``_count``) with the engine's own bucket
# bounds, cumulative since the agent started and never decreasing across engine restarts. Kept
# apart from CATALOG, whose rows are one number per label set.
HISTOGRAMS: tuple[MetricSpec, ...] = tuple(spec_of(m) for m in MEASURES if m.kind == "histogram")
