"""Plain records that flow between the layers: minute records, signals, deploy and alert events.

Every layer may import this module; it imports nothing above ``agent.samples`` and the pure cost
model's names (no store, no detectors, no sinks), so the data path stays one-directional
(sources → cost → store → detect → sinks).

A :class:`MinuteRecord` is one minute of one series as additive *sums* (seconds, tokens, dollars,
and value × seconds / seconds pairs for gauges), so that any window's value is a ratio of sums.
Kinds and their labels: ``model`` (node, engine, model, model_version), ``engine`` (node, engine),
``gpu`` (node, gpu), ``node`` (node). A :class:`Signal` is a formula over those sums (the
catalogue's names without the ``infercost_`` prefix). Deploy events and alert events are what the
detectors emit and the sinks deliver.
"""

from __future__ import annotations

import hashlib
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from agent.cost.bound import BOUNDS
from agent.measures import MEASURES, Measure
from agent.samples import CostWindow, UsageWindow

HOUR_OF_WEEK_SECONDS = 3600.0  # width of one hour-of-week bucket
WEEK_SECONDS = 7 * 86400.0

MINUTE = 60.0  # seconds; the rollup and evaluation granularity
# Why a microsecond: summed window edges (4 × 15 s) differ from the minute by float rounding only.
EDGE_SECONDS = 1e-6


def tokens_counted(tokenless_seconds: float, seconds: float) -> bool:
    """Whether a span of ``seconds`` with ``tokenless_seconds`` of it from engines without token
    counters has tokens to show: only a span tokenless all through has them absent."""
    return not 0.0 < tokenless_seconds >= seconds - EDGE_SECONDS


Kind = Literal["model", "engine", "gpu", "node"]
Labels = tuple[tuple[str, str], ...]

KIND_LABELS: Mapping[str, tuple[str, ...]] = {
    "model": ("node", "engine", "model", "model_version"),
    "engine": ("node", "engine"),
    "gpu": ("node", "gpu"),
    "node": ("node",),
}

# ---------------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------------

# Gauges are kept as a pair "<name>.s" (value × seconds) and "<name>.w" (seconds with a value),
# so a window's mean is time-weighted and a minute without the value does not drag it to zero.
# The model sums a priced window gives (agent/data/measures.csv: the model rows that add a store
# column and name the window attribute it comes from); split_sums and bound_sums add the rest.
_WINDOW_ROWS: tuple[tuple[Measure, Callable[[CostWindow], Any]], ...] = tuple(
    (m, operator.attrgetter(m.window))
    for m in MEASURES
    if m.source == "model" and m.since is not None and m.window
)
# gauge pair → the UsageWindow attribute it is the mean of (window_from_record's inverse)
MODEL_GAUGES: Mapping[str, str] = {
    m.store: m.window.removeprefix("usage.")
    for m, _ in _WINDOW_ROWS
    if m.aggregation == "mean" and m.window.startswith("usage.")
}


@dataclass(frozen=True, slots=True)
class MinuteRecord:
    """One minute of one series as additive sums (see the module docstring for the fields)."""

    kind: Kind
    labels: Labels  # in KIND_LABELS order
    minute: float  # epoch seconds, start of the minute
    sums: Mapping[str, float] = field(default_factory=dict)

    def label(self, name: str) -> str:
        """The value of one label ("" when absent)."""
        for k, v in self.labels:
            if k == name:
                return v
        return ""


def _gauge(sums: dict[str, float], name: str, value: float | None, seconds: float) -> None:
    if value is not None:
        sums[name + ".s"] = sums.get(name + ".s", 0.0) + value * seconds
        sums[name + ".w"] = sums.get(name + ".w", 0.0) + seconds


def model_sums(cw: CostWindow) -> dict[str, float]:
    """The additive sums of one priced window (seconds, tokens, dollars, gauge pairs)."""
    secs = cw.usage.duration
    sums: dict[str, float] = {}
    for m, get in _WINDOW_ROWS:
        if m.aggregation == "mean":
            _gauge(sums, m.store, get(cw), secs)
        else:
            sums[m.store] = float(get(cw) or 0.0)
    sums.update(split_sums(cw))
    sums.update(bound_sums(cw))
    return sums


# The sums of split_sums, in order (the store's model_minutes columns since schema 5).
SPLIT_SUMS = (
    "prompt_usd",
    "split_usd",
    "split_prompt_tokens",
    "split_generation_tokens",
    "usage_usd",
    "usage_alloc_usd",
    "cache_saved_usd",
    "floor_usd",
    "floor_cost_usd",
    "floor_tokens",
    "floor_max_usd",
    "floor_max_cost_usd",
    "floor_max_tokens",
)


def split_sums(cw: CostWindow) -> dict[str, float]:
    """Where the window's dollars went, as sums (each paired with the dollars and tokens it covers,
    so a longer range is a ratio of sums over only the windows that had the figure):

    - prompt vs output: ``prompt_usd`` (prefill-time share), with ``split_usd`` /
      ``split_prompt_tokens`` / ``split_generation_tokens`` the cost and tokens of windows with a
      split (0 without phase times); the output share is ``cost_usd − prompt_usd``;
    - usage basis: ``usage_usd`` (GPU busy time) and ``usage_alloc_usd`` (the allocation dollars of
      the same windows), so allocation − usage (paid while no kernel ran) is their difference;
    - ``cache_saved_usd``: what prefix-cache hits would have cost;
    - cost floor: ``floor_usd`` = the window's output tokens at the floor's $ per 1M, with
      ``floor_cost_usd`` / ``floor_tokens`` the actual dollars and output tokens of those windows
      (``floor_max_*`` the same at the largest batch the KV cache holds).
    """
    u = cw.usage
    cost, gen = cw.cost_usd, u.generation_tokens
    split = cw.prompt_usd is not None
    usage = cw.usage_usd is not None
    floor = cw.floor_usd_per_1m_output is not None and gen > 0
    floor_max = cw.floor_usd_per_1m_output_max_batch is not None and gen > 0
    return {
        "prompt_usd": cw.prompt_usd or 0.0,
        "split_usd": cost if split else 0.0,
        "split_prompt_tokens": u.prompt_tokens if split else 0.0,
        "split_generation_tokens": gen if split else 0.0,
        "usage_usd": cw.usage_usd or 0.0,
        "usage_alloc_usd": cost if usage else 0.0,
        "cache_saved_usd": cw.prefix_cache_saved_usd or 0.0,
        "floor_usd": (cw.floor_usd_per_1m_output or 0.0) * gen / 1e6 if floor else 0.0,
        "floor_cost_usd": cost if floor else 0.0,
        "floor_tokens": gen if floor else 0.0,
        "floor_max_usd": (cw.floor_usd_per_1m_output_max_batch or 0.0) * gen / 1e6 if floor_max else 0.0,
        "floor_max_cost_usd": cost if floor_max else 0.0,
        "floor_max_tokens": gen if floor_max else 0.0,
    }


# The sums of bound_sums, in order (the store's model_minutes columns since schema 6): GPU-seconds
# then GPU dollars by bound (compute, memory, communication, idle; agent.cost.bound.BOUNDS order).
BOUND_SECONDS = tuple(f"bound_{b}_seconds" for b in BOUNDS)
BOUND_USD = tuple(f"bound_{b}_usd" for b in BOUNDS)
BOUND_SUMS = (*BOUND_SECONDS, *BOUND_USD)


def bound_sums(cw: CostWindow) -> dict[str, float]:
    """Where the window's GPU time went (:mod:`agent.cost.bound`), as sums: GPU-seconds and GPU
    dollars by bound. Each set covers itself: the four dollar sums add up to the GPU dollars of the
    windows that had a split (the four seconds to their GPU-seconds), and a window without a split
    (GPM unsupported on one of its GPUs) adds 0 to all eight, so a longer range's shares are over
    only the windows that had one, and its coverage is Σ bound dollars ÷ its dollars."""
    secs, usd = cw.bound_gpu_seconds, cw.bound_usd
    return {
        **{f"bound_{b}_seconds": (secs or {}).get(b, 0.0) for b in BOUNDS},
        **{f"bound_{b}_usd": (usd or {}).get(b, 0.0) for b in BOUNDS},
    }


def record_from_cost_window(cw: CostWindow) -> MinuteRecord:
    """A MinuteRecord from one priced window (a window belongs to the minute it starts in)."""
    u = cw.usage
    minute = (u.start // MINUTE) * MINUTE
    labels = (("node", u.node), ("engine", u.engine), ("model", u.model), ("model_version", u.model_version))
    return MinuteRecord("model", labels, minute, model_sums(cw))


def add_sums(into: dict[str, float], sums: Mapping[str, float], weight: float = 1.0) -> None:
    """Add ``sums`` × ``weight`` into ``into`` (every sum is additive)."""
    for k, v in sums.items():
        into[k] = into.get(k, 0.0) + v * weight


def mean_of(sums: Mapping[str, float], name: str) -> float | None:
    w = sums.get(name + ".w", 0.0)
    return sums.get(name + ".s", 0.0) / w if w > 0 else None


def window_from_record(r: MinuteRecord) -> CostWindow:
    """The inverse of :func:`record_from_cost_window`: one model minute as a priced window
    ([minute, minute + seconds), gauges as their time-weighted means)."""
    s = r.sums
    secs = s.get("seconds", MINUTE)
    gauges: dict[str, Any] = {attr: mean_of(s, short) for short, attr in MODEL_GAUGES.items()}
    gen, prompt, cost = s.get("generation_tokens", 0.0), s.get("prompt_tokens", 0.0), s.get("cost_usd", 0.0)
    timed = s.get("timed_requests", 0.0) > 0
    usage = UsageWindow(
        node=r.label("node"),
        engine=r.label("engine"),
        model=r.label("model"),
        model_version=r.label("model_version") or "unknown",
        start=r.minute,
        end=r.minute + secs,
        prompt_tokens=prompt,
        generation_tokens=gen,
        gpu_seconds=s.get("gpu_seconds", 0.0),
        energy_joules=s.get("energy_joules"),
        preemptions=s.get("preemptions"),
        # a minute wholly without token counters (a tokenless engine) has its tokens absent
        tokens_counted=tokens_counted(s.get("tokenless_seconds", 0.0), secs),
        queue_seconds=s.get("request_queue_seconds") if timed else None,
        compute_seconds=s.get("request_compute_seconds") if timed else None,
        timed_requests=s.get("timed_requests") if timed else None,
        **gauges,
    )
    # the bound split: absent where the minute had none (every GPU-second sum 0), not zero
    bound_secs: dict[str, float] | None = _by_bound(s, BOUND_SECONDS)
    if not any(v > 0 for v in (bound_secs or {}).values()):
        bound_secs = None
    return CostWindow(
        usage=usage,
        gpu_time_usd=s.get("gpu_time_usd", cost - s.get("energy_usd", 0.0)),
        energy_usd=s.get("energy_usd", 0.0),
        usd_per_1m_output=cost / gen * 1e6 if gen > 0 else None,
        usd_per_1m_total=cost / (gen + prompt) * 1e6 if gen + prompt > 0 else None,
        idle_usd=s.get("idle_usd", 0.0),
        roofline_ratio=mean_of(s, "roofline"),
        prompt_usd=s.get("prompt_usd") if s.get("split_usd", 0.0) > 0 else None,
        usage_usd=s.get("usage_usd") if s.get("usage_alloc_usd", 0.0) > 0 else None,
        prefix_cache_saved_usd=s.get("cache_saved_usd") or None,
        floor_usd_per_1m_output=_per_1m((s.get("floor_usd", 0.0), s.get("floor_tokens", 0.0))),
        floor_usd_per_1m_output_max_batch=_per_1m(
            (s.get("floor_max_usd", 0.0), s.get("floor_max_tokens", 0.0))
        ),
        bound_gpu_seconds=bound_secs,
        bound_usd=None if bound_secs is None else _by_bound(s, BOUND_USD),
    )


def _by_bound(s: Mapping[str, float], names: Sequence[str]) -> dict[str, float]:
    return {b: s.get(n, 0.0) for b, n in zip(BOUNDS, names, strict=True)}


# ---------------------------------------------------------------------------------------------
# Signals: every table row with an aggregation, as its formula over sums
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Signal:
    """A signal rules can use: which kind of record, which sums it needs, and how to compute it."""

    name: str
    kind: Kind
    inputs: tuple[str, ...]
    fn: Callable[[Sequence[float]], float | None]
    unit: str  # for messages: "USD", "ratio", "seconds", ...
    # the value is the other inputs over the last one, so that a window's value is the mean of its
    # minutes' values weighted by that last input (per-minute baselines)
    over_last_input: bool = False


def _per_1m(s: Sequence[float]) -> float | None:
    return s[0] / s[1] * 1e6 if s[1] > 0 else None


def signal_of(m: Measure) -> Signal:
    """The rule signal of a table row with an aggregation (its formula over stored sums)."""
    assert m.signal is not None and m.formula is not None, m.name
    kind: Kind = m.source  # type: ignore[assignment]  # the table checks it is a record kind
    f = m.formula
    return Signal(m.signal, kind, f.inputs, f.function(), m.signal_unit, f.over_last_input)


SIGNALS: Mapping[str, Signal] = {s.name: s for s in (signal_of(m) for m in MEASURES if m.signal)}


# ---------------------------------------------------------------------------------------------
# Baseline helpers (pure)
# ---------------------------------------------------------------------------------------------


def hour_of_week(t: float) -> int:
    """Hour of the week (0–167, UTC, Monday 00:00 = 0) of epoch seconds ``t``."""
    # The epoch (1970-01-01) was a Thursday: shift by 3 days so Monday is hour 0.
    return int(((t + 3 * 86400.0) % WEEK_SECONDS) // HOUR_OF_WEEK_SECONDS)


def load_band(tokens_per_second: float, band_ratio: float) -> int | None:
    """The load band of a rate: bands are ``band_ratio`` wide on a log scale (None at zero load)."""
    if tokens_per_second <= 0:
        return None
    return math.floor(math.log(tokens_per_second) / math.log(band_ratio))


# ---------------------------------------------------------------------------------------------
# Deploy and alert events
# ---------------------------------------------------------------------------------------------

State = Literal["pending", "firing", "resolved"]


def dedup_key(rule_id: str, labels: Labels) -> str:
    """A stable key for one alert: sha256 of the rule id and the sorted series labels (hex)."""
    text = rule_id + "\x00" + "\x00".join(f"{k}={v}" for k, v in sorted(labels))
    return hashlib.sha256(text.encode()).hexdigest()


def iso(t: float) -> str:
    """RFC 3339 UTC with milliseconds, as Alertmanager writes times."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(t * 1000) % 1000:03d}Z"


@dataclass(frozen=True, slots=True)
class DeployInfo:
    """A model version change that an alert is attributed to."""

    node: str
    engine: str
    model: str
    from_version: str
    to_version: str
    at: float  # epoch seconds
    # The previous and new version's value of the rule's signal at like load (None when unknown).
    previous_value: float | None = None
    new_value: float | None = None
    kind: str = "model"  # see DeployEvent.kind
    rollback: bool = False  # to_version was deployed before this one (a return to it)
    model_version: str | None = None  # for an engine deploy: the model version, unchanged

    def describe(self) -> str:
        """One line for annotations."""
        if self.kind == "engine":
            what = "engine rollback" if self.rollback else "engine upgrade"
            text = (
                f"{what} of {self.engine}: {short_image(self.from_version)} → {short_image(self.to_version)}"
                f" at {iso(self.at)}"
            )
            if self.model_version:
                text += f", same model version {self.model_version}"
        else:
            text = f"{self.model} {self.from_version} → {self.to_version} at {iso(self.at)}"
            if self.rollback:
                text += " (rollback)"
        if self.previous_value is not None and self.new_value is not None:
            text += f" (at like load: {self.previous_value:.4g} before, {self.new_value:.4g} after"
            if self.previous_value > 0:
                text += f", {(self.new_value / self.previous_value - 1) * 100:+.1f} %"
            text += ")"
        return text


@dataclass(frozen=True, slots=True)
class DeployEvent:
    """The version of (node, engine, model) changed.

    ``kind`` "model": the model version changed. ``kind`` "engine": the engine's build changed (the
    running image and digest, e.g. vLLM 0.8.4 → 0.9.0 serving the same weights); then ``model`` is
    "" and the versions are image references."""

    node: str
    engine: str
    model: str
    from_version: str
    to_version: str
    at: float  # epoch seconds: start of the first minute seen with the new version
    kind: str = "model"  # "model" | "engine"


def short_image(ref: str) -> str:
    """An image reference for people: ``repo:tag`` (no registry host) and 12 hex digits of its digest."""
    name, _, digest = ref.partition("@")
    host, sep, rest = name.partition("/")
    if sep and ("." in host or ":" in host or host == "localhost"):
        name = rest
    if digest:
        return f"{name} ({digest.removeprefix('sha256:')[:12]})"
    return name


@dataclass(frozen=True, slots=True)
class Alert:
    """One alert instance (rule × series)."""

    rule_id: str
    dedup_key: str
    severity: str
    state: State
    labels: Mapping[str, str]  # series labels + alertname + severity + the rule's extra labels
    annotations: Mapping[str, str]
    active_since: float  # epoch seconds: first minute the condition held
    last_true_at: float  # epoch seconds
    value: float  # latest value, in the signal's unit
    threshold: float
    baseline: float | None = None
    fired_at: float | None = None  # epoch seconds
    resolved_at: float | None = None  # epoch seconds
    deploy: DeployInfo | None = None


@dataclass(frozen=True, slots=True)
class AlertEvent:
    """A lifecycle transition; ``firing`` and ``resolved`` are the ones notifiers deliver."""

    kind: State
    alert: Alert
    at: float  # epoch seconds
