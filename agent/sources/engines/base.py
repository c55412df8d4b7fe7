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
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain
from operator import itemgetter
from typing import Any

from agent.cost.counters import CREATED, STARTED
from agent.samples import Histogram, ModelSignals
from agent.sources.engines.parser import FamilyParser, Page, Sample

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "default"  # model name when neither the page nor the config names one
OTHER_MODEL = "other"  # the models beyond an engine's max_models, folded together
DEFAULT_MAX_MODELS = 64  # models per engine (config: engines[].max_models)
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
_LE: dict[str, float] = {}  # le label text → bound (parsed once)
_PART_KEYS: dict[tuple[str, Hashable], str] = {}  # (histogram, rank labels) → its counter_parts-style name
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_LABELS = itemgetter(1)  # a Sample's labels (Sample is the NamedTuple name, labels, value, timestamp)
_VALUE = itemgetter(2)  # a Sample's value
# Bucket layouts remembered per adapter (why 256: a few histograms per engine and a few engines of
# one kind per node; each entry holds its label dicts, which the parser keeps anyway)
BUCKET_PLANS = 256
# A histogram's buckets as laid out on a page: per model label value (None: the engine has no
# model label), the bounds in order (scaled) and the position of each bound's sample.
_BucketPlan = tuple[tuple[str | None, tuple[float, ...], tuple[int, ...]], ...]

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
    names: tuple[str, ...] = field(init=False, default=(), compare=False)  # the wire names it reads

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", (self.metric,) if isinstance(self.metric, str) else self.metric)


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


@dataclass(frozen=True)
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
        families: set[str] = set()
        for alternatives in self.scalars.values():
            for s in alternatives:
                families.update(s.names)
        for alternatives in self.histograms.values():
            for s in alternatives:
                families.update(s.names)
        families.update(f.metric for f in self.finished)
        families.update(i.metric for i in self.info.values())
        # each counter series' _created (prometheus_client engines expose one per series)
        created = {
            n: created_name(n)
            for signal, alternatives in self.scalars.items()
            if signal in COUNTER_FIELDS
            for s in alternatives
            for n in s.names
        }
        families.update(created.values())
        families.add(PROCESS_START)
        readers: dict[str, list[tuple[str, Mapping[str, str]]]] = {}  # wire name → (signal, where)
        for signal, alternatives in self.scalars.items():
            for s in alternatives:
                for n in s.names:
                    readers.setdefault(n, []).append((signal, s.where))
        for signal, alternatives in self.histograms.items():
            for s in alternatives:
                for suffix in ("_bucket", "_sum", "_count"):
                    readers.setdefault(s.names[0] + suffix, []).append((signal, s.where))
        for f in self.finished:
            readers.setdefault(f.metric, []).append(("requests_finished_total", f.where))
        for signal, i in self.info.items():
            readers.setdefault(i.metric, []).append((signal, {}))
        object.__setattr__(self, "created_names", created)
        object.__setattr__(self, "readers", {n: tuple(r) for n, r in readers.items()})
        plan = tuple(
            (signal, s, signal in _MEAN_FIELDS, signal in COUNTER_FIELDS, len(s.names) == 1 and not s.where)
            for signal, alternatives in self.scalars.items()
            for s in alternatives
        )
        object.__setattr__(self, "scalar_plan", plan)
        object.__setattr__(self, "families", frozenset(families))
        object.__setattr__(self, "parser", FamilyParser(families))
        object.__setattr__(self, "bucket_plans", {})
        object.__setattr__(self, "map_plans", [])
        object.__setattr__(self, "layout_plans", [])

    families: frozenset[str] = field(init=False, default=frozenset())  # wire families it reads
    # a counter's wire name → the name of its _created samples
    created_names: Mapping[str, str] = field(init=False, repr=False, default_factory=dict)
    # a wire sample name → the signals (and their label filters) it feeds
    readers: Mapping[str, tuple[tuple[str, Mapping[str, str]], ...]] = field(
        init=False, repr=False, default_factory=dict
    )
    # (signal, series, averaged?, counter?, one name and no filter?) in preference order: the map's work list
    scalar_plan: tuple[tuple[str, Series, bool, bool, bool], ...] = field(init=False, repr=False, default=())
    parser: FamilyParser = field(init=False, repr=False, compare=False, default=None)  # type: ignore[assignment]
    # (series id, ids of the bucket samples' label dicts) → (those label dicts, their layout or None)
    bucket_plans: dict[
        tuple[int, tuple[int, ...]], tuple[tuple[Mapping[str, str], ...], _BucketPlan | None]
    ] = field(init=False, repr=False, compare=False, default_factory=dict)
    # Page structures seen (see _map): [names, labels, default model, max_models, plan or None, tries]
    map_plans: list[list[Any]] = field(init=False, repr=False, compare=False, default_factory=list)
    # The parser's page layouts seen (see _read): [layout, default model, max_models, plan or None, tries]
    layout_plans: list[list[Any]] = field(init=False, repr=False, compare=False, default_factory=list)

    def read(
        self,
        text: str,
        default_model: str | None = None,
        openmetrics: bool = False,
        max_models: int = DEFAULT_MAX_MODELS,
    ) -> Reading:
        """Parse a page (OpenMetrics text when ``openmetrics``) and map it with its checks;
        raises ParseError on a malformed wanted line."""
        return _read(self, text, default_model, openmetrics, max_models)

    def parse(
        self, text: str, default_model: str | None = None, openmetrics: bool = False
    ) -> tuple[ModelSignals, ...]:
        """The models of :meth:`read` (raises ParseError on a malformed wanted line)."""
        return _read(self, text, default_model, openmetrics, DEFAULT_MAX_MODELS).models

    def forget(self) -> None:
        """Drop what earlier pages taught the parser and the map (label blocks, page and bucket
        layouts): the next page is read as a first scrape (benchmarks)."""
        self.parser.forget()
        self.bucket_plans.clear()
        self.map_plans.clear()
        self.layout_plans.clear()

    def map(
        self, page: Page, default_model: str | None = None, max_models: int = DEFAULT_MAX_MODELS
    ) -> Reading:
        """One :class:`ModelSignals` per model seen on the page, sorted by model name, with the
        series refused and the series folded (see the module docstring)."""
        return _map(self, page, default_model, max_models)


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
    if len(value) <= MAX_LABEL_CHARS:
        return _clean_short(value)
    return _clean(value)


# Model names and reasons repeat every scrape; only short values are remembered, so a hostile page
# churns at most 4,096 x 128 characters.
@lru_cache(maxsize=4096)
def _clean_short(value: str) -> str:
    return value if _CONTROL.search(value) is None else _clean(value)


def _clean(value: str) -> str:
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
    ) -> None:
        self.a = adapter
        self.page = page
        self.duplicates = duplicates  # the series the parser left out (written twice, two values)
        self.fallback = clean_label(default_model) if default_model else DEFAULT_MODEL
        self.invalid: list[str] = []
        self.bad: set[tuple[str, str]] = set()  # (model, signal) refused this scrape
        self.dropped = 0
        self.model_of: dict[str, str] = {}  # label value on the wire → model name passed on
        self._plan_models(max_models)

    def _plan_models(self, max_models: int) -> None:
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
            self.dropped = sum(
                1 for samples in self.page.values() for s in samples if s.labels.get(label) in folded
            )

    def _model(self, labels: Mapping[str, str]) -> str | None:
        if self.a.model_label is None:
            return self.fallback
        wire = labels.get(self.a.model_label)
        return None if wire is None else self.model_of[wire]

    def _refuse(self, model: str, signal: str, name: str, labels: Mapping[str, str], why: str) -> None:
        self.bad.add((model, signal))
        if len(self.invalid) < MAX_REPORTED:
            self.invalid.append(f"{signal}: {_describe(name, labels, why)}")

    def _scalar(
        self, signal: str, s: Series, parts: dict[str, dict[str, float]] | None, mean: bool, counter: bool
    ) -> dict[str, float] | None:
        """Per model, the series' value summed (or averaged) over every other label; with
        ``parts``, also each summed series' own value (keyed by name and other labels). None when
        the series is not on the page."""
        first = self.page.get(s.names[0])
        if not first:
            return None
        high = 1.0 if mean else MAX_VALUE
        ml = self.a.model_label
        if len(first) == 1 and len(s.names) == 1 and not s.where:  # one series: nothing to sum
            sample = first[0]
            model = self.fallback if ml is None else self.model_of.get(sample.labels.get(ml))  # type: ignore[arg-type]
            if model is not None and 0.0 <= sample.value <= high:
                # a lone DP rank or version: labels besides the model's (_ranked, inlined)
                if parts is not None and len(sample.labels) > (ml in sample.labels):
                    parts[model] = {_series_key(s.names[0], sample.labels, ml): sample.value * s.scale}
                return {model: sample.value * s.scale}
        where = s.where
        wanted = where.items() if where else None  # labels a sample must carry
        scale = s.scale
        total: dict[str, float] = {}
        count: dict[str, int] = {}
        seen: dict[str, list[tuple[str, Mapping[str, str], float]]] = {}
        model_of, fallback = self.model_of, self.fallback
        for name in s.names:
            for sample in self.page.get(name, ()):
                labels = sample.labels
                if wanted is not None and not wanted <= labels.items():
                    continue
                model = fallback if ml is None else model_of.get(labels.get(ml))  # type: ignore[arg-type]
                if model is None:
                    continue
                v = sample.value
                if not 0.0 <= v <= high:  # False for NaN too
                    if v != v and not counter:  # a NaN gauge: no reading, not an error
                        continue
                    kind = "counter" if counter else "gauge"
                    self._refuse(model, signal, name, labels, f"{kind} value {v!r} outside [0, {high:g}]")
                    continue
                if scale != 1.0:
                    v *= scale
                total[model] = total.get(model, 0.0) + v
                if mean:
                    count[model] = count.get(model, 0) + 1
                if parts is not None:
                    seen.setdefault(model, []).append((name, labels, v))
        if parts is not None:
            for model, items in seen.items():
                if len(items) == 1 and not _ranked(items[0][1], ml, where):
                    continue  # one series with no label but the model's: nothing to tell apart
                per = parts.setdefault(model, {})
                for wire, wire_labels, v in items:
                    key = _series_key(wire, wire_labels, ml)
                    per[key] = per.get(key, 0.0) + v
        if mean:
            return {m: v / count[m] for m, v in total.items()}
        return total

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
            for signal, where in self.a.readers.get(name, ()):
                if not where.items() <= labels.items():
                    continue
                self._refuse(owner, signal, name, labels, DUPLICATE)

    def _created(
        self, won: list[tuple[str, str, Series]], counter_parts: dict[str, dict[str, dict[str, float]]]
    ) -> None:
        """Put each counter series' ``_created`` (epoch seconds) into ``counter_parts`` under the
        counter's name + CREATED, keyed as its value is; a series whose _created is not one number
        (two samples disagree) has none."""
        ml, names, page = self.a.model_label, self.a.created_names, self.page
        for model, signal, s in won:
            stamps: dict[str, Any] = {}
            torn: set[str] = set()
            for n in s.names:
                for sample in page.get(names[n], ()):
                    labels = sample.labels
                    if s.where and not s.where.items() <= labels.items():
                        continue
                    if (self.fallback if ml is None else self.model_of.get(labels.get(ml))) != model:  # type: ignore[arg-type]
                        continue
                    key = _series_key(n, labels, ml)
                    if key in stamps and stamps[key] != sample.value:
                        torn.add(key)
                    stamps[key] = sample.value
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
        """True when some model has more than one series of ``name`` with labels besides the
        model's and ``where``'s (data-parallel ranks): a cheap look at one sample per series."""
        ml, model_of, fallback = self.a.model_label, self.model_of, self.fallback
        seen: set[str] = set()
        for sample in self.page.get(name, ()):
            labels = sample.labels
            if len(labels) <= fixed or (where and any(labels.get(k) != v for k, v in where.items())):
                continue
            model = fallback if ml is None else model_of.get(labels.get(ml))  # type: ignore[arg-type]
            if model in seen:
                return True
            if model is not None:
                seen.add(model)
        return False

    def _bucket_plan(self, s: Series, samples: list[Sample]) -> _BucketPlan | None:
        """The layout of a histogram's bucket samples (one sample per model and bound), or None
        when the buckets need :meth:`_histogram`'s own loop (several series summed, an ``le``
        that is not a number)."""
        labels_of = tuple(map(_LABELS, samples))
        key = (id(s), tuple(map(id, labels_of)))
        known = self.a.bucket_plans.get(key)
        if known is not None and known[0] == labels_of:  # the same labels: the same layout
            return known[1]
        wanted = s.where.items() if s.where else None
        ml, scale = self.a.model_label, s.scale
        groups: dict[str | None, dict[float, int]] = {}
        plan: _BucketPlan | None = None
        for i, labels in enumerate(labels_of):
            if wanted is not None and not wanted <= labels.items():
                continue
            wire = None if ml is None else labels.get(ml)
            le_text = labels.get("le")
            if (ml is not None and wire is None) or le_text is None:
                continue
            try:
                le = float(le_text)
            except ValueError:
                break
            if le != le:
                break
            if scale != 1.0 and le != math.inf:
                le *= scale
            at = groups.setdefault(wire, {})
            if le in at:
                break
            at[le] = i
        else:
            plan = tuple(
                (wire, tuple(sorted(at)), tuple(at[le] for le in sorted(at))) for wire, at in groups.items()
            )
        if len(self.a.bucket_plans) >= BUCKET_PLANS:
            self.a.bucket_plans.clear()
        self.a.bucket_plans[key] = (labels_of, plan)
        return plan

    def _planned_buckets(
        self, s: Series, samples: list[Sample]
    ) -> dict[str, tuple[tuple[float, ...], list[float]]] | None:
        """Per model, the bounds and counts of a histogram's buckets read through their layout,
        or None when its own loop must read them (no layout; a count NaN, negative, huge or
        decreasing, which that loop refuses; two model label values folded into one model)."""
        plan = self._bucket_plan(s, samples)
        if plan is None:
            return None
        ml, model_of, fallback = self.a.model_label, self.model_of, self.fallback
        out: dict[str, tuple[tuple[float, ...], list[float]]] = {}
        for wire, bounds, positions in plan:
            model = fallback if ml is None else model_of[wire]  # type: ignore[index]
            counts = list(map(_VALUE, map(samples.__getitem__, positions)))
            total = sum(counts)  # NaN when a count is NaN
            # (no NaN and in order: the first is the least, the last the greatest)
            if (
                model in out
                or total != total
                or counts != sorted(counts)
                or counts[0] < 0.0
                or counts[-1] > MAX_VALUE
            ):
                return None
            out[model] = (bounds, counts)
        return out

    def _planned_histograms(
        self, signal: str, s: Series, planned: dict[str, tuple[tuple[float, ...], list[float]]]
    ) -> dict[str, Histogram]:
        """:meth:`_histogram` for buckets read through their layout (one series per model): the
        sums and counts read as there, then one histogram per model with a +Inf bucket."""
        base, page = s.names[0], self.page
        wanted = s.where.items() if s.where else None
        ml, model_of, fallback = self.a.model_label, self.model_of, self.fallback
        sums: dict[str, float] = {}
        counts: dict[str, float] = {}
        for suffix, into, low in (("_sum", sums, -MAX_VALUE), ("_count", counts, 0.0)):
            for _, labels, v, _ in page.get(base + suffix, ()):
                if wanted is not None and not wanted <= labels.items():
                    continue
                model = fallback if ml is None else model_of.get(labels.get(ml))  # type: ignore[arg-type]
                if model is None:
                    continue
                if not low <= v <= MAX_VALUE:
                    self._refuse(model, signal, base + suffix, labels, f"value {v!r}")
                    continue
                into[model] = into.get(model, 0.0) + v
        out: dict[str, Histogram] = {}
        for model, (bounds, cumulative) in planned.items():
            if math.isinf(bounds[-1]):  # else no +Inf bucket: not a usable histogram
                if model in counts and counts[model] != cumulative[-1]:
                    self._refuse(model, signal, base + "_count", {"model": model}, COUNT_MISMATCH)
                    continue
                out[model] = Histogram(
                    tuple(zip(bounds, cumulative)),  # noqa: B905 (one count per bound)
                    sums.get(model, 0.0) * s.scale,
                    counts.get(model, cumulative[-1]),
                )
        return out

    def _histogram(
        self, signal: str, s: Series, parts: dict[str, dict[str, Histogram]] | None = None
    ) -> dict[str, Histogram]:
        """Per model, the histogram summed bucket by bucket over every other label; a histogram
        with a NaN, negative or non-monotonic bucket, or a bad sum or count, is refused. With
        ``parts``, a histogram split over series with labels besides the model's (data-parallel
        ranks) also gives each series' own histogram, keyed as ``counter_parts`` keys counters
        (only when some model has several such series; a lone one is the sum)."""
        base = s.names[0]
        where = s.where
        wanted = where.items() if where else None  # labels a sample must carry
        bucket_samples = self.page.get(base + "_bucket")
        if bucket_samples is None and base + "_sum" not in self.page and base + "_count" not in self.page:
            return {}  # not on the page (an older name's alternative, say)
        fixed = 1 + (self.a.model_label is not None) + len(where)
        if parts is not None and not self._several_series(base + "_count", where, fixed - 1):
            parts = None  # one series per model: the sum is that series, nothing to tell apart
        if parts is None and bucket_samples:  # one series per model: maybe read through its layout
            planned = self._planned_buckets(s, bucket_samples)
            if planned is not None:
                return self._planned_histograms(signal, s, planned)
        buckets: dict[str, dict[float, float]] = {}
        # per model, per ranked series: its buckets (only where series carry labels besides le, the
        # model's and the selecting ones: the rank labels, named once from the first such series)
        ranked: dict[str, dict[Hashable, dict[float, float]]] = {}
        one_of: dict[Hashable, Mapping[str, str]] = {}  # a series' labels, for its name at the end
        rank_keys: tuple[str, ...] = ()
        ml, model_of, fallback = self.a.model_label, self.model_of, self.fallback
        scale, known_le, inf = s.scale, _LE, math.inf
        for _, labels, v, _ in bucket_samples or ():
            if wanted is not None and not wanted <= labels.items():
                continue
            model = fallback if ml is None else model_of.get(labels.get(ml))  # type: ignore[arg-type]
            le_text = labels.get("le")
            if model is None or le_text is None:
                continue
            le = known_le.get(le_text)
            if le is None:
                try:
                    le = float(le_text)
                except ValueError:
                    le = math.nan
                if le != le:
                    self._refuse(model, signal, base + "_bucket", labels, "le is not a number")
                    continue
                if len(known_le) < 4096:  # bucket bounds are few; a hostile page cannot grow this
                    known_le[le_text] = le
            if not 0.0 <= v <= MAX_VALUE:
                self._refuse(model, signal, base + "_bucket", labels, f"bucket count {v!r}")
                continue
            if scale != 1.0 and le != inf:
                le *= scale
            per = buckets.get(model)
            if per is None:
                buckets[model] = per = {}
            per[le] = per.get(le, 0.0) + v
            if parts is not None and len(labels) > fixed:
                if not rank_keys:
                    rank_keys = tuple(k for k in labels if k != "le" and k != ml and k not in where)
                gk: Hashable
                if len(labels) != fixed + len(rank_keys):  # a series with other labels
                    gk = tuple(sorted(x for x in labels.items() if x[0] != "le"))
                elif len(rank_keys) == 1:
                    gk = labels.get(rank_keys[0])
                else:
                    gk = tuple(labels.get(k) for k in rank_keys)
                if gk not in one_of:
                    one_of[gk] = labels
                of_model = ranked.get(model)
                if of_model is None:
                    ranked[model] = of_model = {}
                own = of_model.get(gk)
                if own is None:
                    of_model[gk] = own = {}
                own[le] = own.get(le, 0.0) + v  # (models folded into "other" add up)
        sums: dict[str, float] = {}
        counts: dict[str, float] = {}
        own_sc: dict[tuple[str, Hashable], list[float | None]] = {}  # (model, series) → [sum, count]
        for suffix, into, low in (("_sum", sums, -MAX_VALUE), ("_count", counts, 0.0)):
            for _, labels, v, _ in self.page.get(base + suffix, ()):
                if wanted is not None and not wanted <= labels.items():
                    continue
                model = fallback if ml is None else model_of.get(labels.get(ml))  # type: ignore[arg-type]
                if model is None:
                    continue
                if not low <= v <= MAX_VALUE:
                    self._refuse(model, signal, base + suffix, labels, f"value {v!r}")
                    continue
                into[model] = into.get(model, 0.0) + v
                if model in ranked and len(labels) > fixed - 1:
                    sgk: Hashable
                    if len(labels) != fixed - 1 + len(rank_keys):
                        sgk = tuple(sorted(labels.items()))
                    elif len(rank_keys) == 1:
                        sgk = labels.get(rank_keys[0])
                    else:
                        sgk = tuple(labels.get(k) for k in rank_keys)
                    sc = own_sc.setdefault((model, sgk), [None, None])
                    i = 0 if suffix == "_sum" else 1
                    sc[i] = (sc[i] or 0.0) + v
        out: dict[str, Histogram] = {}
        for model, per in buckets.items():
            bounds = tuple(sorted(per))
            if not math.isinf(bounds[-1]):
                continue  # no +Inf bucket: not a usable histogram
            cumulative = list(map(per.__getitem__, bounds))
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
            if parts is not None and model in ranked:
                own_parts: dict[str, Histogram] = {}
                for gk, own_buckets in ranked[model].items():
                    key = _PART_KEYS.get((base, gk))
                    if key is None:
                        key = _series_key(base, {k: x for k, x in one_of[gk].items() if k != "le"}, ml)
                        if len(_PART_KEYS) < 4096:  # ranks are few; a hostile page cannot grow this
                            _PART_KEYS[(base, gk)] = key
                    seq = tuple(sorted(own_buckets.items()))
                    own_sum, own_count = own_sc.get((model, gk), (None, None))
                    if (
                        math.isinf(seq[-1][0])
                        and [c for _, c in seq] == sorted(c for _, c in seq)
                        and (own_count is None or own_count == seq[-1][1])
                    ):
                        n = seq[-1][1] if own_count is None else own_count
                        own_parts[key] = Histogram(seq, (own_sum or 0.0) * s.scale, n)
                if len(own_parts) == len(ranked[model]):  # else: no per-series reading this scrape
                    parts[model] = own_parts
        return out

    def run(self) -> Reading:
        a = self.a
        values: dict[str, dict[str, Any]] = {}
        counter_parts: dict[str, dict[str, dict[str, float]]] = {}  # model → signal → series → value
        page, ml, model_of, fallback = self.page, a.model_label, self.model_of, self.fallback
        self._refuse_duplicates()
        won: list[tuple[str, str, Series]] = []  # (model, counter, the series it was read from)
        for signal, s, mean, counter, lone in a.scalar_plan:
            first = page.get(s.names[0])
            if not first:
                continue
            if lone and len(first) == 1:  # one series, valid: nothing to sum (_scalar's first case)
                _, labels, v, _ = first[0]
                model = fallback if ml is None else model_of.get(labels.get(ml))  # type: ignore[arg-type]
                if model is not None and 0.0 <= v <= (1.0 if mean else MAX_VALUE):
                    got = values.get(model)
                    if got is None:
                        values[model] = got = {}
                    elif signal in got:
                        continue  # an earlier alternative wins
                    got[signal] = v * s.scale
                    if counter:
                        won.append((model, signal, s))
                        if len(labels) > (ml in labels):  # a lone DP rank or version
                            counter_parts.setdefault(model, {})[signal] = {
                                _series_key(s.names[0], labels, ml): v * s.scale
                            }
                    continue
            parts: dict[str, dict[str, float]] | None = {} if counter else None
            per_model = self._scalar(signal, s, parts, mean, counter)
            if per_model:
                for model, v in per_model.items():
                    got = values.get(model)
                    if got is None:
                        values[model] = got = {}
                    elif signal in got:
                        continue  # an earlier alternative wins
                    got[signal] = v
                    if counter:
                        won.append((model, signal, s))
                    if parts and parts.get(model):
                        counter_parts.setdefault(model, {})[signal] = parts[model]
        histogram_parts: dict[str, dict[str, dict[str, Histogram]]] = {}  # model → signal → series
        for signal, alternatives in a.histograms.items():
            for s in alternatives:
                hparts: dict[str, dict[str, Histogram]] = {}
                for model, h in self._histogram(signal, s, hparts).items():
                    got_h = values.setdefault(model, {})
                    if signal not in got_h:
                        got_h[signal] = h
                        if model in hparts:
                            histogram_parts.setdefault(model, {})[signal] = hparts[model]
        finished: dict[str, dict[str, float]] = {}
        ml, model_of, fallback = a.model_label, self.model_of, self.fallback
        for f in a.finished:
            wanted = f.where.items() if f.where else None  # labels a sample must carry
            for sample in self.page.get(f.metric, ()):
                labels = sample.labels
                if wanted is not None and not wanted <= labels.items():
                    continue
                owner = fallback if ml is None else model_of.get(labels.get(ml))  # type: ignore[arg-type]
                reason = (labels.get(f.label) if f.label else None) or f.reason
                if owner is None or reason is None:
                    continue
                if not 0.0 <= sample.value <= MAX_VALUE:
                    self._refuse(
                        owner, "requests_finished_total", f.metric, labels, f"counter value {sample.value!r}"
                    )
                    continue
                per = finished.setdefault(owner, {})
                reason = clean_label(reason)
                per[reason] = per.get(reason, 0.0) + sample.value
        for model, per in finished.items():
            values.setdefault(model, {}).setdefault("requests_finished_total", dict(sorted(per.items())))
        for signal, info in a.info.items():
            self._info(signal, info, values)
        self._created(won, counter_parts)
        self._started(values, counter_parts)
        for model, signal in self.bad:  # a refused series makes its signal absent for the model
            if model in values:
                values[model].pop(signal, None)
                counter_parts.get(model, {}).pop(signal, None)
                counter_parts.get(model, {}).pop(signal + CREATED, None)
                histogram_parts.get(model, {}).pop(signal, None)
        for model, per_signal in counter_parts.items():
            if per_signal:
                values[model]["counter_parts"] = per_signal
        for model, per_hist in histogram_parts.items():
            if per_hist:
                values[model]["histogram_parts"] = per_hist
        models = tuple([ModelSignals(model=m, **values[m]) for m in sorted(values) if values[m]])
        return Reading(models, tuple(self.invalid), self.dropped)


# --- Two-phase map: a page layout's mapping worked out once, then only its values applied ---------
# The map's output is a function of the page's structure (names and labels, in order), the default
# model and max_models, and of its values only through arithmetic (sums, scales, means) and
# comparisons (range checks, bucket order). A page seen a second time with the same structure is
# mapped once more with each value replaced by a _Traced stand-in that records every comparison's
# outcome (the guards) and every value's arithmetic; the recorded map becomes a compiled function.
# Later pages of that structure run it: when every guard holds, the slow map would take exactly the
# same branches, so it returns the same Reading from the same operations in the same order; when a
# guard fails (a value turned hostile, a bucket decreased), the page is mapped the slow way.
# Why 8: one adapter serves every engine of its kind on the node, as the parser's LAYOUTS.
MAP_PLANS = 8
# Why 1,024 samples: compiling costs ~a millisecond per hundred samples, once per layout; larger
# pages (the dense vLLM page: 3,008 samples) are already far above the speed target without it.
PLAN_SAMPLES = 1024
_NAME = itemgetter(0)  # a Sample's name


class _Untraceable(Exception):
    """A value was used in a way the recorder cannot replay (formatted, hashed, converted)."""


class _Recorder:
    """Guards and constants of one traced map."""

    __slots__ = ("consts", "guards")

    def __init__(self) -> None:
        self.consts: list[object] = []
        self.guards: list[str] = []

    def const(self, x: object) -> str:
        """Source for the constant ``x``: a literal where its repr reads back as the same value."""
        if x is None or type(x) in (bool, int, str) or (type(x) is float and math.isfinite(x)):
            return f"({x!r})"
        self.consts.append(x)
        return f"K[{len(self.consts) - 1}]"


class _Traced:
    """A page value during tracing: its value now and the expression computing it from ``v``."""

    __slots__ = ("code", "rec", "val")

    def __init__(self, code: str, val: Any, rec: _Recorder) -> None:
        self.code, self.val, self.rec = code, val, rec

    def _code(self, other: object) -> tuple[str, Any]:
        if isinstance(other, _Traced):
            return other.code, other.val
        if type(other) not in (float, int):
            raise _Untraceable
        return self.rec.const(other), other

    def _op(self, other: object, sym: str, reflected: bool) -> _Traced:
        code, val = self._code(other)
        expr = f"({code} {sym} {self.code})" if reflected else f"({self.code} {sym} {code})"
        a, b = (val, self.val) if reflected else (self.val, val)
        res = {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "/": lambda: a / b}[sym]()
        return _Traced(expr, res, self.rec)

    def _cmp(self, other: object, sym: str) -> bool:
        code, val = self._code(other)
        res = {
            "<": lambda: self.val < val,
            "<=": lambda: self.val <= val,
            ">": lambda: self.val > val,
            ">=": lambda: self.val >= val,
            "==": lambda: self.val == val,
            "!=": lambda: self.val != val,
        }[sym]()
        expr = f"({self.code} {sym} {code})"
        self.rec.guards.append(expr if res else f"not {expr}")
        return bool(res)

    def __add__(self, o: object) -> _Traced:
        return self._op(o, "+", False)

    def __radd__(self, o: object) -> _Traced:
        return self._op(o, "+", True)

    def __sub__(self, o: object) -> _Traced:
        return self._op(o, "-", False)

    def __rsub__(self, o: object) -> _Traced:
        return self._op(o, "-", True)

    def __mul__(self, o: object) -> _Traced:
        return self._op(o, "*", False)

    def __rmul__(self, o: object) -> _Traced:
        return self._op(o, "*", True)

    def __truediv__(self, o: object) -> _Traced:
        return self._op(o, "/", False)

    def __rtruediv__(self, o: object) -> _Traced:
        return self._op(o, "/", True)

    def __lt__(self, o: object) -> bool:
        return self._cmp(o, "<")

    def __le__(self, o: object) -> bool:
        return self._cmp(o, "<=")

    def __gt__(self, o: object) -> bool:
        return self._cmp(o, ">")

    def __ge__(self, o: object) -> bool:
        return self._cmp(o, ">=")

    def __eq__(self, o: object) -> bool:
        return self._cmp(o, "==")

    def __ne__(self, o: object) -> bool:
        return self._cmp(o, "!=")

    def __bool__(self) -> bool:
        res = bool(self.val)
        expr = f"bool({self.code})"
        self.rec.guards.append(expr if res else f"not {expr}")
        return res

    def _refused(self, *_: object) -> Any:
        raise _Untraceable

    __hash__ = __float__ = __int__ = __index__ = __repr__ = __str__ = __format__ = _refused
    __neg__ = __pos__ = __abs__ = __round__ = __floordiv__ = __mod__ = __pow__ = _refused


_BUILDERS: dict[type, str] = {Histogram: "H", ModelSignals: "M", Reading: "R"}


def _source(x: object, rec: _Recorder) -> str:
    """Python source rebuilding ``x`` (a map's output, holding traced values) from ``v``."""
    t = type(x)
    if isinstance(x, _Traced):
        return x.code
    if x is None or t in (float, int, str, bool):
        return rec.const(x)
    if isinstance(x, tuple) and t is tuple:
        return "(" + "".join(_source(i, rec) + "," for i in x) + ")"
    if isinstance(x, dict) and t is dict:
        return "{" + ",".join(f"{_source(k, rec)}:{_source(i, rec)}" for k, i in x.items()) + "}"
    builder = _BUILDERS.get(t)
    if builder is None or not dataclasses.is_dataclass(x):
        raise _Untraceable
    args = ",".join(f"{f.name}={_source(getattr(x, f.name), rec)}" for f in dataclasses.fields(x))
    return f"{builder}({args})"


def _compile(
    adapter: Adapter, stand_in: Any, rec: _Recorder, default_model: str | None, max_models: int
) -> Any:
    """The map of ``stand_in`` (a page whose values are ``_Traced`` stand-ins for ``v[i]``) as a
    function of ``v`` returning the Reading, or None when a guard fails; None when the map cannot
    be traced."""
    try:
        reading = _Mapping(adapter, stand_in, default_model, max_models).run()
        body = _source(reading, rec)
    except _Untraceable:
        return None
    guard = "    if not (" + " and ".join(rec.guards) + "):\n        return None\n" if rec.guards else ""
    src = f"def plan(v):\n{guard}    return {body}\n"
    scope: dict[str, Any] = {"K": rec.consts, "H": Histogram, "M": ModelSignals, "R": Reading}
    try:
        code = compile(src, f"<{adapter.kind} map plan>", "exec")
    except (SyntaxError, RecursionError, MemoryError):  # a sum nested past the parser's limits
        return None
    exec(code, scope)
    return scope["plan"]


def _map(
    adapter: Adapter,
    page: Page,
    default_model: str | None,
    max_models: int,
    duplicates: tuple[tuple[str, dict[str, str]], ...] = (),
) -> Reading:
    """:class:`_Mapping`'s Reading, through a compiled plan when the page's structure was seen before
    (never for a page with ``duplicates``: series the parser left out, which no plan knows of)."""
    if duplicates:
        return _Mapping(adapter, page, default_model, max_models, duplicates).run()
    flat = list(chain.from_iterable(page.values()))
    if len(flat) > PLAN_SAMPLES:
        return _Mapping(adapter, page, default_model, max_models).run()
    names = tuple(map(_NAME, flat))
    labels = tuple(map(_LABELS, flat))
    plans = adapter.map_plans
    for entry in plans:
        if entry[2] == default_model and entry[3] == max_models and entry[1] == labels and entry[0] == names:
            plan = entry[4]
            if plan is not None:
                got = plan(list(map(_VALUE, flat)))
                if got is not None:
                    return got
            reading = _Mapping(adapter, page, default_model, max_models).run()
            if plan is None and entry[5] < 3:  # seen before: trace it (a few tries: a value may be hostile)
                entry[5] += 1
                rec = _Recorder()
                stand_ins: list[Any] = [_Traced(f"v[{i}]", s.value, rec) for i, s in enumerate(flat)]
                traced = iter(stand_ins)
                stand_in = {name: [s._replace(value=next(traced)) for s in ss] for name, ss in page.items()}
                plan = _compile(adapter, stand_in, rec, default_model, max_models)
                if plan is not None and plan(list(map(_VALUE, flat))) == reading:
                    entry[4] = plan
            return reading
    if len(plans) >= MAP_PLANS:
        del plans[0]
    plans.append([names, labels, default_model, max_models, None, 0])
    return _Mapping(adapter, page, default_model, max_models).run()


def _read(
    adapter: Adapter, text: str, default_model: str | None, openmetrics: bool, max_models: int
) -> Reading:
    """Parse and map a page; a page of a layout the parser knows skips its samples altogether when
    that layout's map is compiled (the plan takes the page's values as the parser converted them)."""
    got = adapter.parser.read_layout(text, openmetrics)
    if isinstance(got, dict):
        return _map(adapter, got, default_model, max_models, adapter.parser.duplicates)
    layout, values = got
    if len(values) > PLAN_SAMPLES:
        return _Mapping(adapter, adapter.parser.page_of(layout, values), default_model, max_models).run()
    plans = adapter.layout_plans
    for entry in plans:
        if entry[0] is layout and entry[1] == default_model and entry[2] == max_models:
            plan = entry[3]
            if plan is not None:
                reading = plan(values)
                if reading is not None:
                    return reading
            break
    else:
        if len(plans) >= MAP_PLANS:
            del plans[0]
        entry = [layout, default_model, max_models, None, 0]
        plans.append(entry)
    reading = _Mapping(adapter, adapter.parser.page_of(layout, values), default_model, max_models).run()
    # a layout seen again: trace its map (a few tries: a value may be hostile, the trace then fails)
    if entry[3] is None and entry[4] < 3:
        entry[4] += 1
        rec = _Recorder()
        stand_in = adapter.parser.page_of(layout, [_Traced(f"v[{i}]", x, rec) for i, x in enumerate(values)])
        plan = _compile(adapter, stand_in, rec, default_model, max_models)
        if plan is not None and plan(values) == reading:
            entry[3] = plan
    return reading
