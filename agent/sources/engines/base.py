"""The declarative engine adapter: which wire series feed which :class:`ModelSignals` field.

An engine adapter is data, not code (see ``vllm.py``, ``sglang.py``, ...): for each signal, the
wire series that carry it, most preferred first (a renamed metric keeps its old name as a later
alternative), an optional label filter and a scale to base units. :meth:`Adapter.map` turns a
parsed page into one :class:`ModelSignals` per served model:

- the model comes from the adapter's model label; engines without one (TGI, llama.cpp) or with a
  placeholder value (trtllm-serve's ``"undefined"``) get the configured model or ``"default"``;
- every other label (vLLM's ``engine`` data-parallel rank, SGLang's ``is_streaming``, ...) is
  summed over, except ratio fields (KV-cache usage), which are averaged;
- histograms are summed bucket by bucket (Prometheus ``sum by (le)``), ``le`` read from the page;
- a signal whose series are all missing stays ``None`` (absent), never 0.

Values are cumulative, as read; counter resets are the window join's business.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.samples import Histogram, ModelSignals
from agent.sources.engines.parser import FamilyParser, Page

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "default"  # model name when neither the page nor the config names one

_SCALAR_FIELDS = frozenset(
    f.name
    for f in dataclasses.fields(ModelSignals)
    if f.name
    not in {"model", "requests_finished_total", "ttft_seconds", "itl_seconds", "e2e_seconds", "counter_parts"}
)
_HISTOGRAM_FIELDS = frozenset({"ttft_seconds", "itl_seconds", "e2e_seconds"})
# Cumulative counters: when one summed over several series (data-parallel ranks, Triton model
# versions), each series' value is kept too, so a reset of one series is not read as a reset of the sum.
COUNTER_FIELDS = frozenset(
    {
        "prompt_tokens_total",
        "generation_tokens_total",
        "preemptions_total",
        "prefill_seconds_total",
        "decode_seconds_total",
    }
)
# Fields that are ratios: averaged over data-parallel ranks rather than summed.
_MEAN_FIELDS = frozenset({"kv_cache_usage_ratio"})


@dataclass(frozen=True, slots=True)
class Series:
    """One wire series feeding a signal.

    ``metric`` is the wire sample name for a scalar (``vllm:prompt_tokens_total``, or a histogram's
    ``..._sum``), the family's base name for a histogram; a tuple of names is summed (the first
    must be present). ``where`` keeps only samples with those label values; ``scale`` converts to
    base units (``0.001`` for milliseconds, also applied to histogram ``le`` bounds and sums).
    """

    metric: str | tuple[str, ...]
    where: Mapping[str, str] = field(default_factory=dict)
    scale: float = 1.0

    @property
    def names(self) -> tuple[str, ...]:
        """The wire names this series reads."""
        return (self.metric,) if isinstance(self.metric, str) else self.metric


@dataclass(frozen=True, slots=True)
class Finished:
    """A counter of finished requests: the reason from a label, or a fixed reason."""

    metric: str
    label: str | None = None  # e.g. "finished_reason"
    reason: str | None = None  # used when label is None (or missing on a sample)
    where: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Adapter:
    """One engine's metric map onto :class:`ModelSignals` (see the module docstring)."""

    kind: str  # vllm | sglang | tgi | triton | trtllm | llamacpp
    prefixes: tuple[str, ...]  # wire-name prefixes that identify the engine (kind: auto)
    model_label: str | None  # label carrying the served model name; None: one model per engine
    scalars: Mapping[str, tuple[Series, ...]] = field(default_factory=dict)
    histograms: Mapping[str, tuple[Series, ...]] = field(default_factory=dict)
    finished: tuple[Finished, ...] = ()
    placeholder_models: frozenset[str] = frozenset()  # label values that mean "no model name"

    def __post_init__(self) -> None:
        bad = (set(self.scalars) - _SCALAR_FIELDS) | (set(self.histograms) - _HISTOGRAM_FIELDS)
        if bad:
            raise ValueError(f"adapter {self.kind}: unknown ModelSignals fields {sorted(bad)}")
        families: set[str] = set()
        for alternatives in self.scalars.values():
            for s in alternatives:
                families.update(s.names)
        for alternatives in self.histograms.values():
            for s in alternatives:
                families.update(s.names)
        families.update(f.metric for f in self.finished)
        object.__setattr__(self, "families", frozenset(families))
        object.__setattr__(self, "parser", FamilyParser(families))

    families: frozenset[str] = field(init=False, default=frozenset())  # wire families it reads
    parser: FamilyParser = field(init=False, repr=False, compare=False, default=None)  # type: ignore[assignment]

    def parse(
        self, text: str, default_model: str | None = None, openmetrics: bool = False
    ) -> tuple[ModelSignals, ...]:
        """Parse a page (OpenMetrics text when ``openmetrics``) and map it; raises ParseError on a
        malformed wanted line."""
        return self.map(self.parser.parse(text, openmetrics), default_model)

    def _model_of(self, labels: Mapping[str, str], default_model: str) -> str | None:
        if self.model_label is None:
            return default_model
        model = labels.get(self.model_label)
        if model is None:
            return None
        if model in self.placeholder_models:
            return default_model
        return model

    @staticmethod
    def _matches(labels: Mapping[str, str], where: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in where.items())

    def _scalar(
        self,
        page: Page,
        s: Series,
        default_model: str,
        mean: bool,
        parts: dict[str, dict[str, float]] | None = None,
    ) -> dict[str, float]:
        """Per model, the series' value summed (or averaged) over every other label; with ``parts``,
        also each summed series' own value (keyed by its name and other labels), for counters."""
        first = page.get(s.names[0])
        if not first:
            return {}
        total: dict[str, float] = {}
        count: dict[str, int] = {}
        for name in s.names:
            for sample in page.get(name, ()):
                if math.isnan(sample.value) or not self._matches(sample.labels, s.where):
                    continue
                model = self._model_of(sample.labels, default_model)
                if model is None:
                    continue
                total[model] = total.get(model, 0.0) + sample.value * s.scale
                count[model] = count.get(model, 0) + 1
                if parts is not None:
                    key = name + "".join(
                        f",{k}={v}" for k, v in sorted(sample.labels.items()) if k != self.model_label
                    )
                    per = parts.setdefault(model, {})
                    per[key] = per.get(key, 0.0) + sample.value * s.scale
        if mean:
            return {m: v / count[m] for m, v in total.items()}
        return total

    def _histogram(self, page: Page, s: Series, default_model: str) -> dict[str, Histogram]:
        """Per model, the histogram summed bucket by bucket over every other label."""
        base = s.names[0]
        buckets: dict[str, dict[float, float]] = {}
        for sample in page.get(base + "_bucket", ()):
            if not self._matches(sample.labels, s.where):
                continue
            model = self._model_of(sample.labels, default_model)
            le_text = sample.labels.get("le")
            if model is None or le_text is None:
                continue
            try:
                le = float(le_text)
            except ValueError:
                logger.debug("bad le %r on %s", le_text, base)
                continue
            le = le * s.scale if math.isfinite(le) else le
            per = buckets.setdefault(model, {})
            per[le] = per.get(le, 0.0) + sample.value
        sums: dict[str, float] = {}
        counts: dict[str, float] = {}
        for suffix, into in (("_sum", sums), ("_count", counts)):
            for sample in page.get(base + suffix, ()):
                if not self._matches(sample.labels, s.where):
                    continue
                model = self._model_of(sample.labels, default_model)
                if model is not None:
                    into[model] = into.get(model, 0.0) + sample.value
        out: dict[str, Histogram] = {}
        for model, per in buckets.items():
            ordered = tuple(sorted(per.items()))
            if not ordered or not math.isinf(ordered[-1][0]):
                continue  # no +Inf bucket: not a usable histogram
            count = counts.get(model, ordered[-1][1])
            out[model] = Histogram(buckets=ordered, sum=sums.get(model, 0.0) * s.scale, count=count)
        return out

    def map(self, page: Page, default_model: str | None = None) -> tuple[ModelSignals, ...]:
        """One :class:`ModelSignals` per model seen on the page, sorted by model name."""
        fallback = default_model or DEFAULT_MODEL
        values: dict[str, dict[str, Any]] = {}

        def put(model: str, name: str, value: Any) -> None:
            values.setdefault(model, {}).setdefault(name, value)  # first alternative wins

        counter_parts: dict[str, dict[str, dict[str, float]]] = {}  # model → signal → series → value
        for name, alternatives in self.scalars.items():
            for s in alternatives:
                parts: dict[str, dict[str, float]] | None = {} if name in COUNTER_FIELDS else None
                for model, v in self._scalar(page, s, fallback, name in _MEAN_FIELDS, parts).items():
                    if (
                        name not in values.get(model, {})
                        and parts is not None
                        and len(parts.get(model, {})) > 1
                    ):
                        counter_parts.setdefault(model, {})[name] = parts[model]
                    put(model, name, v)
        for model, per_signal in counter_parts.items():
            values[model]["counter_parts"] = per_signal
        for name, alternatives in self.histograms.items():
            for s in alternatives:
                for model, h in self._histogram(page, s, fallback).items():
                    put(model, name, h)
        finished: dict[str, dict[str, float]] = {}
        for f in self.finished:
            for sample in page.get(f.metric, ()):
                if math.isnan(sample.value) or not self._matches(sample.labels, f.where):
                    continue
                owner = self._model_of(sample.labels, fallback)
                reason = (sample.labels.get(f.label) if f.label else None) or f.reason
                if owner is None or reason is None:
                    continue
                per = finished.setdefault(owner, {})
                per[reason] = per.get(reason, 0.0) + sample.value
        for model, per in finished.items():
            put(model, "requests_finished_total", dict(sorted(per.items())))
        return tuple(ModelSignals(model=m, **values[m]) for m in sorted(values))
