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
  where a model has several series of one (data-parallel ranks), each one's own histogram is kept
  in ``histogram_parts`` too, so the window join can difference them rank by rank;
- a signal whose series are all missing stays ``None`` (absent), never 0.

The adapter boundary: nothing hostile passes on to the cost path.

- one value per series: a series written twice on a page with the same value counts once; with
  two values it has none, and its signal is refused for its model (the parser leaves it out);
- counters must be finite, ≥ 0 and ≤ :data:`MAX_VALUE`; gauges too (ratios ≤ 1; a NaN gauge is
  simply no reading); histogram buckets finite, ≥ 0 and non-decreasing in ``le``. A series that
  fails makes its signal absent for that model in this scrape (never a made-up value or quantile)
  and is described in :attr:`Reading.invalid_series`; the other signals and models are unaffected;
  a histogram whose ``_count`` is not its ``+Inf`` bucket is refused too (both count every observation);
- each counter series' ``_created`` (prometheus_client engines: vLLM, SGLang, trtllm-serve) and the
  page's ``process_start_time_seconds`` go into ``counter_parts`` under the counter's name +
  :data:`agent.cost.counters.CREATED` and under :data:`agent.cost.counters.STARTED`: a change is a
  restart, which the window join tells from a glitch by them;
- model names (and finish reasons) are cleaned by :func:`clean_label`; at most ``max_models``
  models per engine (the first by name), the rest folded into ``model="other"``, their series
  counted in :attr:`Reading.dropped_series`.

Values are cumulative, as read; counter resets are the window join's business.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.cost.counters import CREATED, STARTED
from agent.samples import Histogram, ModelSignals
from agent.sources.engines.parser import Page, PageReader, PageRefused, Parsed, Sample, parser_for

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "default"  # model name when neither the page nor the config names one
OTHER_MODEL = "other"  # the models beyond an engine's max_models, folded together
DEFAULT_MAX_MODELS = 64  # models per engine (config: engines[].max_models)
DEFAULT_MAX_BUCKETS = 1000  # buckets of one histogram per model (config: limits.max_histogram_buckets)


# Why 1e15: an engine producing 100,000 tokens/s (far beyond one node today) takes 300 years to
# count that far, while 1e308 or Inf would turn every sum downstream into Inf or NaN.
MAX_VALUE = 1e15
# Why 128: real model names (Hugging Face ids, paths, LoRA names) are well under it; longer values
# are hostile or broken and would bloat /metrics and the store.
MAX_LABEL_CHARS = 128
MAX_REPORTED = 20  # refused series described per scrape (the rest only counted out of the signal)
# The process' start time, as prometheus_client's process collector exposes it (no labels): a change
# is a restart of every counter on the page (agent.cost.counters).
PROCESS_START = "process_start_time_seconds"
DUPLICATE = "written twice with different values"  # why a series the parser left out is refused
COUNT_MISMATCH = "_count differs from the +Inf bucket"  # both count every observation
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SeriesId = tuple[tuple[str, str], ...]  # a series' labels but le, sorted: one histogram of several

_SCALAR_FIELDS = frozenset(
    f.name
    for f in dataclasses.fields(ModelSignals)
    if f.name
    not in {
        "model",
        "requests_finished_total",
        "ttft_seconds",
        "itl_seconds",
        "e2e_seconds",
        "counter_parts",
        "histogram_parts",
    }
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
        "cached_prompt_tokens_total",
        "queue_seconds_total",
        "compute_seconds_total",
        "timed_requests_total",
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
        """The wire names it reads."""
        return (self.metric,) if isinstance(self.metric, str) else self.metric


@dataclass(frozen=True, slots=True)
class Finished:
    """A counter of finished requests: the reason from a label, or a fixed reason."""

    metric: str
    label: str | None = None  # e.g. "finished_reason"
    reason: str | None = None  # used when label is None (or missing on a sample)
    where: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class InfoProduct:
    """A value carried in an info gauge's labels: the product of those labels' numbers, averaged over
    the gauge's series (e.g. vLLM ``cache_config_info``: ``num_gpu_blocks × block_size`` per
    data-parallel rank). An info gauge without the model label applies to every model on the page."""

    metric: str
    labels: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Adapter:
    """One engine's metric map onto :class:`ModelSignals` (see the module docstring)."""

    kind: str  # vllm | sglang | tgi | triton | trtllm | llamacpp
    prefixes: tuple[str, ...]  # wire-name prefixes that identify the engine (kind: auto)
    model_label: str | None  # label carrying the served model name; None: one model per engine
    scalars: Mapping[str, tuple[Series, ...]] = field(default_factory=dict)
    histograms: Mapping[str, tuple[Series, ...]] = field(default_factory=dict)
    finished: tuple[Finished, ...] = ()
    info: Mapping[str, InfoProduct] = field(default_factory=dict)  # scalar signal → info-gauge labels
    placeholder_models: frozenset[str] = frozenset()  # label values that mean "no model name"

    def __post_init__(self) -> None:
        bad = (
            (set(self.scalars) - _SCALAR_FIELDS)
            | (set(self.histograms) - _HISTOGRAM_FIELDS)
            | (set(self.info) - _SCALAR_FIELDS)
        )
        if bad:
            raise ValueError(f"adapter {self.kind}: unknown ModelSignals fields {sorted(bad)}")

    @property
    def families(self) -> frozenset[str]:
        """The wire families it reads (with its counters' ``_created`` and the process start time)."""
        names = {n for _, s in _series(self) for n in s.names}
        names.update(f.metric for f in self.finished)
        names.update(i.metric for i in self.info.values())
        names.update(
            created_name(n)
            for signal, alternatives in self.scalars.items()
            if signal in COUNTER_FIELDS
            for s in alternatives
            for n in s.names
        )
        return frozenset({*names, PROCESS_START})

    def read(
        self,
        text: str,
        default_model: str | None = None,
        openmetrics: bool = False,
        max_models: int = DEFAULT_MAX_MODELS,
        max_buckets: int = DEFAULT_MAX_BUCKETS,
    ) -> Reading:
        """Parse a page (OpenMetrics text when ``openmetrics``) and map it with its checks;
        raises ParseError on a malformed wanted line, PageRefused on a histogram of more than
        ``max_buckets`` buckets."""
        page, duplicates = parser_for(self.families).read(text, openmetrics, max_buckets)
        return _Mapping(self, page, default_model, max_models, duplicates, max_buckets).run()

    def reader(self, openmetrics: bool = False, max_buckets: int = DEFAULT_MAX_BUCKETS) -> PageReader:
        """A reader of one page fed in pieces as it arrives (:class:`PageReader`); map what it
        read with :meth:`map_read`."""
        return parser_for(self.families).reader(openmetrics, max_buckets)

    def map_read(
        self,
        parsed: Parsed,
        default_model: str | None = None,
        max_models: int = DEFAULT_MAX_MODELS,
        max_buckets: int = DEFAULT_MAX_BUCKETS,
    ) -> Reading:
        """What :meth:`read` returns, from a page a :meth:`reader` has read."""
        page, duplicates = parsed
        return _Mapping(self, page, default_model, max_models, duplicates, max_buckets).run()

    def parse(
        self, text: str, default_model: str | None = None, openmetrics: bool = False
    ) -> tuple[ModelSignals, ...]:
        """The models of :meth:`read` (raises ParseError on a malformed wanted line)."""
        return self.read(text, default_model, openmetrics).models

    def map(
        self, page: Page, default_model: str | None = None, max_models: int = DEFAULT_MAX_MODELS
    ) -> Reading:
        """One :class:`ModelSignals` per model seen on the page, sorted by model name, with the
        series refused and the series folded (see the module docstring)."""
        return _Mapping(self, page, default_model, max_models).run()


def _series(adapter: Adapter) -> list[tuple[str, Series]]:
    """Every (signal, series) of the scalar and histogram maps."""
    return [
        (signal, s)
        for table in (adapter.scalars, adapter.histograms)
        for signal, alternatives in table.items()
        for s in alternatives
    ]


def _readers(adapter: Adapter, name: str) -> list[tuple[str, Mapping[str, str]]]:
    """The signals a wire sample name feeds, with their label filters."""
    out = [(signal, s.where) for signal, alts in adapter.scalars.items() for s in alts if name in s.names]
    out += [
        (signal, s.where)
        for signal, alts in adapter.histograms.items()
        for s in alts
        if name in (s.names[0] + "_bucket", s.names[0] + "_sum", s.names[0] + "_count")
    ]
    out += [("requests_finished_total", f.where) for f in adapter.finished if f.metric == name]
    out += [(signal, {}) for signal, i in adapter.info.items() if i.metric == name]
    return out


@dataclass(frozen=True, slots=True)
class Reading:
    """What one page said, after the adapter boundary's checks."""

    models: tuple[ModelSignals, ...]
    invalid_series: tuple[str, ...] = ()  # "signal: series (why)", at most MAX_REPORTED
    dropped_series: int = 0  # series of models beyond max_models, folded into OTHER_MODEL


def clean_label(value: str) -> str:
    """A label value as the agent passes it on: control characters removed, at most
    :data:`MAX_LABEL_CHARS` characters (a longer one is cut and ends in ``~`` and 8 hex digits of
    its SHA-256, so distinct long values stay distinct)."""
    cleaned = _CONTROL.sub("", value)
    if len(cleaned) > MAX_LABEL_CHARS:
        digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        cleaned = f"{cleaned[: MAX_LABEL_CHARS - 9]}~{digest}"
    return cleaned


def _ranked(
    labels: Mapping[str, str], model_label: str | None, where: Mapping[str, str] | None = None
) -> bool:
    """True when a series has labels besides the model's and the ones it was selected by (a DP rank,
    a version): such a series may come and go beside others, so even a lone one is named in
    ``counter_parts``."""
    fixed = (model_label in labels) + (len(where.keys() & labels.keys()) if where else 0)
    return len(labels) > fixed


def _series_key(name: str, labels: Mapping[str, str], model_label: str | None) -> str:
    """One series' name in ``counter_parts``: the metric name and its labels other than the model's."""
    if len(labels) <= (model_label in labels):  # no label, or the model's alone: the name
        return name
    return name + "".join(f",{k}={clean_label(x)}" for k, x in sorted(labels.items()) if k != model_label)


def created_name(counter: str) -> str:
    """The name of a counter's ``_created`` samples as prometheus_client writes them (``x_total`` →
    ``x_created``; a histogram's ``x_sum`` or ``x_count`` → ``x_created``)."""
    for suffix in ("_total", "_sum", "_count"):
        if counter.endswith(suffix):
            return counter[: -len(suffix)] + "_created"
    return counter + "_created"


def _describe(name: str, labels: Mapping[str, str], why: str) -> str:
    inner = ",".join(f"{k}={clean_label(v)[:40]}" for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"[:200] + f" ({why})"


class _Mapping:
    """One run of :meth:`Adapter.map` (state shared by its steps)."""

    def __init__(
        self,
        adapter: Adapter,
        page: Page,
        default_model: str | None,
        max_models: int,
        duplicates: tuple[tuple[str, dict[str, str]], ...] = (),
        max_buckets: int = DEFAULT_MAX_BUCKETS,
    ) -> None:
        self.a = adapter
        self.max_buckets = max_buckets
        self.page = page
        self.duplicates = duplicates  # the series the parser left out (written twice, two values)
        self.fallback = clean_label(default_model) if default_model else DEFAULT_MODEL
        self.invalid: list[str] = []
        self.bad: set[tuple[str, str]] = set()  # (model, signal) refused this scrape
        self.dropped = 0
        self.model_of: dict[str, str] = {}  # label value on the wire → model name passed on
        self._fold_models(max_models)

    def _fold_models(self, max_models: int) -> None:
        """Name every model label value on the page; those beyond ``max_models`` become OTHER_MODEL."""
        label = self.a.model_label
        if label is None:
            return
        page = self.page.values()
        wire = {w for samples in page for s in samples if (w := s.labels.get(label)) is not None}
        names: dict[str, str] = {}
        for w in wire:
            m = clean_label(w)
            names[w] = self.fallback if (not m or w in self.a.placeholder_models) else m
        kept = set(sorted(set(names.values()))[:max_models])
        for w, m in names.items():
            self.model_of[w] = m if m in kept else OTHER_MODEL
        folded = {w for w, m in self.model_of.items() if m == OTHER_MODEL}
        if folded:
            self.dropped = sum(1 for samples in page for s in samples if s.labels.get(label) in folded)

    def _model(self, labels: Mapping[str, str]) -> str | None:
        if self.a.model_label is None:
            return self.fallback
        wire = labels.get(self.a.model_label)
        return None if wire is None else self.model_of[wire]

    def _selected(self, name: str, where: Mapping[str, str]) -> Iterator[tuple[str, Sample]]:
        """The samples of ``name`` carrying ``where``'s labels and a model, with that model."""
        for sample in self.page.get(name, ()):
            if where and not where.items() <= sample.labels.items():
                continue
            model = self._model(sample.labels)
            if model is not None:
                yield model, sample

    def _refuse(self, model: str, signal: str, name: str, labels: Mapping[str, str], why: str) -> None:
        self.bad.add((model, signal))
        if len(self.invalid) < MAX_REPORTED:
            self.invalid.append(f"{signal}: {_describe(name, labels, why)}")

    def _scalar(self, signal: str, s: Series) -> tuple[dict[str, float], dict[str, dict[str, float]]] | None:
        """Per model, the series' value summed (averaged for a ratio) over every other label, and
        for a counter each summed series' own value (keyed by name and other labels) where there
        is something to tell apart. None when the series is not on the page."""
        if not self.page.get(s.names[0]):
            return None
        mean, counter = signal in _MEAN_FIELDS, signal in COUNTER_FIELDS
        high = 1.0 if mean else MAX_VALUE
        seen: dict[str, list[tuple[str, Mapping[str, str], float]]] = {}
        for name in s.names:
            for model, (_, labels, v, _) in self._selected(name, s.where):
                if not 0.0 <= v <= high:  # False for NaN too
                    if v != v and not counter:  # a NaN gauge: no reading, not an error
                        continue
                    kind = "counter" if counter else "gauge"
                    self._refuse(model, signal, name, labels, f"{kind} value {v!r} outside [0, {high:g}]")
                    continue
                seen.setdefault(model, []).append((name, labels, v * s.scale))
        totals = {m: sum(v for _, _, v in items) for m, items in seen.items()}
        if mean:
            totals = {m: v / len(seen[m]) for m, v in totals.items()}
        parts: dict[str, dict[str, float]] = {}
        ml = self.a.model_label
        for model, items in seen.items() if counter else ():
            if len(items) == 1 and not _ranked(items[0][1], ml, s.where):
                continue  # one series with no label but the model's: nothing to tell apart
            per = parts.setdefault(model, {})
            for wire, wire_labels, v in items:
                key = _series_key(wire, wire_labels, ml)
                per[key] = per.get(key, 0.0) + v
        return totals, parts

    def _scalars(
        self, values: dict[str, dict[str, Any]], counter_parts: dict[str, dict[str, dict[str, float]]]
    ) -> list[tuple[str, str, Series]]:
        """Put every scalar signal (the first alternative present wins); return (model, counter,
        the series it was read from) for each counter read."""
        won: list[tuple[str, str, Series]] = []
        for signal, alternatives in self.a.scalars.items():
            for s in alternatives:
                got = self._scalar(signal, s)
                if got is None:
                    continue
                per_model, parts = got
                for model, v in per_model.items():
                    mine = values.setdefault(model, {})
                    if signal in mine:
                        continue  # an earlier alternative wins
                    mine[signal] = v
                    if signal in COUNTER_FIELDS:
                        won.append((model, signal, s))
                    if parts.get(model):
                        counter_parts.setdefault(model, {})[signal] = parts[model]
        return won

    def _histograms(self, values: dict[str, dict[str, Any]]) -> dict[str, dict[str, dict[str, Histogram]]]:
        """Put every histogram signal (the first alternative present wins); return the per-series
        histograms, model → signal → series."""
        histogram_parts: dict[str, dict[str, dict[str, Histogram]]] = {}
        for signal, alternatives in self.a.histograms.items():
            for s in alternatives:
                hparts: dict[str, dict[str, Histogram]] = {}
                for model, h in self._histogram(signal, s, hparts).items():
                    mine = values.setdefault(model, {})
                    if signal not in mine:
                        mine[signal] = h
                        if model in hparts:
                            histogram_parts.setdefault(model, {})[signal] = hparts[model]
        return histogram_parts

    def _finished(self, values: dict[str, dict[str, Any]]) -> None:
        """Put each model's finished requests by reason (reasons cleaned, summed over other labels)."""
        finished: dict[str, dict[str, float]] = {}
        for f in self.a.finished:
            for owner, (_, labels, v, _) in self._selected(f.metric, f.where):
                reason = (labels.get(f.label) if f.label else None) or f.reason
                if reason is None:
                    continue
                if not 0.0 <= v <= MAX_VALUE:
                    self._refuse(owner, "requests_finished_total", f.metric, labels, f"counter value {v!r}")
                    continue
                per = finished.setdefault(owner, {})
                reason = clean_label(reason)
                per[reason] = per.get(reason, 0.0) + v
        for model, per in finished.items():
            values.setdefault(model, {}).setdefault("requests_finished_total", dict(sorted(per.items())))

    def _refuse_duplicates(self) -> None:
        """Refuse, for its model, every signal a series the parser left out (written twice with
        different values) feeds: the signal is absent this scrape, not read from the other line."""
        ml = self.a.model_label
        for name, labels in self.duplicates:
            wire = None if ml is None else labels.get(ml)
            if ml is not None and wire is None:
                continue  # a series without the model label feeds nothing
            owner = (
                self.fallback
                if wire is None
                else self.model_of.get(wire) or clean_label(wire) or self.fallback
            )
            for signal, where in _readers(self.a, name):
                if where.items() <= labels.items():
                    self._refuse(owner, signal, name, labels, DUPLICATE)

    def _created(
        self, won: list[tuple[str, str, Series]], counter_parts: dict[str, dict[str, dict[str, float]]]
    ) -> None:
        """Put each counter series' ``_created`` (epoch seconds) into ``counter_parts`` under the
        counter's name + CREATED, keyed as its value is; a series whose _created is not one number
        (two samples disagree) has none."""
        ml = self.a.model_label
        for model, signal, s in won:
            stamps: dict[str, float] = {}
            torn: set[str] = set()
            for n in s.names:
                for owner, (_, labels, v, _) in self._selected(created_name(n), s.where):
                    if owner != model:
                        continue
                    key = _series_key(n, labels, ml)
                    if key in stamps and stamps[key] != v:
                        torn.add(key)
                    stamps[key] = v
            for key in torn:
                del stamps[key]
            if stamps:
                counter_parts.setdefault(model, {})[signal + CREATED] = stamps

    def _started(
        self, values: dict[str, dict[str, Any]], counter_parts: dict[str, dict[str, dict[str, float]]]
    ) -> None:
        """Put the process' start time (one sample on the page) into every model's ``counter_parts``
        under STARTED."""
        samples = self.page.get(PROCESS_START, ())
        if len(samples) != 1:
            return
        for model in values:
            counter_parts.setdefault(model, {})[STARTED] = {PROCESS_START: samples[0].value}

    def _info(self, signal: str, info: InfoProduct, values: dict[str, dict[str, Any]]) -> None:
        """Put ``signal`` = the mean over the info gauge's series of the product of its label numbers."""
        per_model: dict[str | None, list[float]] = {}
        for sample in self.page.get(info.metric, ()):
            try:
                product = math.prod(float(sample.labels[k]) for k in info.labels)
            except (KeyError, ValueError):
                continue  # a label missing or not a number: the signal stays absent
            if not 0.0 <= product <= MAX_VALUE:
                continue
            model = self._model(sample.labels) if self.a.model_label in sample.labels else None
            per_model.setdefault(model, []).append(product)
        for model, products in per_model.items():
            mean = sum(products) / len(products)
            for m in [model] if model is not None else list(values):
                values.setdefault(m, {}).setdefault(signal, mean)

    def _several_series(self, name: str, where: Mapping[str, str], fixed: int) -> bool:
        """True when some model has more than one series of ``name`` with more than ``fixed``
        labels (besides the model's and ``where``'s: data-parallel ranks)."""
        seen: set[str] = set()
        for model, sample in self._selected(name, where):
            if len(sample.labels) <= fixed:
                continue
            if model in seen:
                return True
            seen.add(model)
        return False

    def _buckets(
        self, signal: str, s: Series, fixed: int | None
    ) -> tuple[dict[str, dict[float, float]], dict[str, dict[_SeriesId, dict[float, float]]]]:
        """Per model, a histogram's bucket counts by bound (scaled), summed over every other label;
        with ``fixed``, also per model each series' own (a series with more than ``fixed`` labels)."""
        buckets: dict[str, dict[float, float]] = {}
        ranked: dict[str, dict[_SeriesId, dict[float, float]]] = {}
        name = s.names[0] + "_bucket"
        for model, (_, labels, v, _) in self._selected(name, s.where):
            le_text = labels.get("le")
            if le_text is None:
                continue
            le = _bound(le_text)
            if le is None:
                self._refuse(model, signal, name, labels, "le is not a number")
                continue
            if not 0.0 <= v <= MAX_VALUE:
                self._refuse(model, signal, name, labels, f"bucket count {v!r}")
                continue
            le *= s.scale  # (+Inf stays +Inf)
            per = buckets.setdefault(model, {})
            per[le] = per.get(le, 0.0) + v
            if fixed is not None and len(labels) > fixed:
                gk = tuple(sorted(x for x in labels.items() if x[0] != "le"))
                own = ranked.setdefault(model, {}).setdefault(gk, {})
                own[le] = own.get(le, 0.0) + v  # (models folded into "other" add up)
        return buckets, ranked

    def _sums_counts(
        self, signal: str, s: Series, ranked: Mapping[str, object], fixed: int
    ) -> tuple[dict[str, float], dict[str, float], dict[tuple[str, _SeriesId], list[float | None]]]:
        """Per model, a histogram's ``_sum`` and ``_count`` summed over every other label, and for
        the models in ``ranked`` each series' own (a series with more than ``fixed`` labels)."""
        sums: dict[str, float] = {}
        counts: dict[str, float] = {}
        own: dict[tuple[str, _SeriesId], list[float | None]] = {}  # (model, series) → [sum, count]
        for i, (suffix, into, low) in enumerate((("_sum", sums, -MAX_VALUE), ("_count", counts, 0.0))):
            name = s.names[0] + suffix
            for model, (_, labels, v, _) in self._selected(name, s.where):
                if not low <= v <= MAX_VALUE:
                    self._refuse(model, signal, name, labels, f"value {v!r}")
                    continue
                into[model] = into.get(model, 0.0) + v
                if model in ranked and len(labels) > fixed:
                    sc = own.setdefault((model, tuple(sorted(labels.items()))), [None, None])
                    sc[i] = (sc[i] or 0.0) + v
        return sums, counts, own

    def _histogram(
        self, signal: str, s: Series, parts: dict[str, dict[str, Histogram]]
    ) -> dict[str, Histogram]:
        """Per model, the histogram summed bucket by bucket over every other label; a histogram
        with a NaN, negative or non-monotonic bucket, or a bad sum or count, is refused. A
        histogram split over series with labels besides the model's (data-parallel ranks) also
        puts each series' own histogram into ``parts``, keyed as ``counter_parts`` keys counters
        (only when some model has several such series; a lone one is the sum)."""
        base = s.names[0]
        fixed = 1 + (self.a.model_label is not None) + len(s.where)  # le, the model's and where's
        several = self._several_series(base + "_count", s.where, fixed - 1)
        buckets, ranked = self._buckets(signal, s, fixed if several else None)
        sums, counts, own_sc = self._sums_counts(signal, s, ranked, fixed - 1)
        out: dict[str, Histogram] = {}
        for model, per in buckets.items():
            if len(per) > self.max_buckets:
                raise PageRefused(
                    f"histogram {base}_bucket has {len(per)} buckets for model {model!r}, over the limit "
                    f"of {self.max_buckets} (limits.max_histogram_buckets)"
                )
            bounds = tuple(sorted(per))
            if not math.isinf(bounds[-1]):
                continue  # no +Inf bucket: not a usable histogram
            cumulative = [per[le] for le in bounds]
            if cumulative != sorted(cumulative):
                self._refuse(model, signal, base + "_bucket", {"model": model}, "bucket counts decrease")
                continue
            if model in counts and counts[model] != cumulative[-1]:
                self._refuse(model, signal, base + "_count", {"model": model}, COUNT_MISMATCH)
                continue
            out[model] = Histogram(
                tuple(zip(bounds, cumulative)),  # noqa: B905 (one count per bound)
                sums.get(model, 0.0) * s.scale,
                counts.get(model, cumulative[-1]),
            )
            if model in ranked:
                own = {gk: own_sc.get((model, gk), [None, None]) for gk in ranked[model]}
                got = _own_histograms(base, ranked[model], own, self.a.model_label, s.scale)
                if got is not None:
                    parts[model] = got
        return out

    def _drop_refused(self, values: dict[str, dict[str, Any]], *parts: dict[str, dict[str, Any]]) -> None:
        """A refused series makes its signal absent for its model (with its parts and _created)."""
        for model, signal in self.bad:
            if model in values:
                values[model].pop(signal, None)
                for per in parts:
                    per.get(model, {}).pop(signal, None)
                    per.get(model, {}).pop(signal + CREATED, None)

    def run(self) -> Reading:
        """The page's Reading."""
        values: dict[str, dict[str, Any]] = {}
        counter_parts: dict[str, dict[str, dict[str, float]]] = {}  # model → signal → series → value
        self._refuse_duplicates()
        won = self._scalars(values, counter_parts)
        histogram_parts = self._histograms(values)
        self._finished(values)
        for signal, info in self.a.info.items():
            self._info(signal, info, values)
        self._created(won, counter_parts)
        self._started(values, counter_parts)
        self._drop_refused(values, counter_parts, histogram_parts)
        for model, per_signal in counter_parts.items():
            if per_signal:
                values[model]["counter_parts"] = per_signal
        for model, per_hist in histogram_parts.items():
            if per_hist:
                values[model]["histogram_parts"] = per_hist
        models = tuple(ModelSignals(model=m, **values[m]) for m in sorted(values) if values[m])
        return Reading(models, tuple(self.invalid), self.dropped)


def _bound(le_text: str) -> float | None:
    """A bucket's ``le`` as a number; None when it is not one."""
    try:
        le = float(le_text)
    except ValueError:
        return None
    return None if le != le else le


def _own_histograms(
    base: str,
    series: Mapping[_SeriesId, Mapping[float, float]],
    sum_count: Mapping[_SeriesId, list[float | None]],
    model_label: str | None,
    scale: float,
) -> dict[str, Histogram] | None:
    """Each series' own histogram (buckets by bound; its [sum, count]), keyed as ``counter_parts``
    keys counters; None when one of them is not a usable histogram this scrape."""
    out: dict[str, Histogram] = {}
    for gk, own in series.items():
        seq = tuple(sorted(own.items()))
        own_sum, own_count = sum_count[gk]
        counts = [c for _, c in seq]
        if math.isinf(seq[-1][0]) and counts == sorted(counts) and own_count in (None, seq[-1][1]):
            n = seq[-1][1] if own_count is None else own_count
            out[_series_key(base, dict(gk), model_label)] = Histogram(seq, (own_sum or 0.0) * scale, n)
    return out if len(out) == len(series) else None
