"""Why the cost per token changed (pure): the factors of a window and their LMDI-I split.

For a window, dollars per output token is a chain of factors, each read from its own sums:

    $/token = price        Σ cost $ ÷ Σ allocated GPU-s                         [$ / GPU-s]
            × idle         Σ allocation $ ÷ Σ usage $ (NVML busy time)            [1, ≥ 1]
            × mix          step time ÷ its decode part, 1 ÷ (1 − f): f prefill's
                           share of the window per replica (the measure
                           ``prefill_share``, time-weighted)                       [1, ≥ 1]
            × step eff.    decode step ÷ roofline step: the step as run (ITL, or
                           decode seconds per token) less its prefill share f, over
                           the roofline step — the stored decode efficiency took out
                           its own estimate s of f (``prefill_floor``), so
                           1 ÷ efficiency × (1 − f) ÷ (1 − s)                     [1, ≥ 1]
            × model        GPU-s of one roofline step (weights + resident KV
                           ÷ bandwidth, × GPUs), from the cost floor: floor $/token
                           ÷ price × batch                                         [GPU-s / step]
            ÷ batch        sequences per step: the sequences in the running set over
                           the window (the counter-derived batch, decode
                           request-seconds ÷ seconds; else the running gauge) over
                           the busy share (steps run while a kernel runs)          [tokens / step]

Dimensions: $/GPU-s × GPU-s/step ÷ tokens/step = $/token, and the chain closes: idle × batch is
1 ÷ the sequences running, and mix × step efficiency is the step as run ÷ the roofline step, so the
product is price × GPUs × step as run ÷ sequences running — what a continuously batching engine's
cost per token is (vLLM's decode request time and inter-token latency both span the prefill work its
steps carry). Longer prompts show as mix (and as model and context, their KV read by every step); a
night with fewer requests as a smaller batch; time no kernel ran as idle.

Prefill's share of the window is the decode efficiency's own estimate where it read the engine's
phase times, else the engine's prefill request-seconds per replica-second, at least the floor its
prefilled tokens' FLOPs at the GPUs' peak put on it and at most what leaves a step's decode part at
the roofline step (:func:`prefill_shares`). It is taken as the share of
the steps' time (a step carries its prefill chunks, or waits for a prefill step): exact where steps
run back to back; where the GPU idles part of the window, f reads low by that part, and mix and step
efficiency move opposite by the same dollars (their product does not depend on f).

The product is checked against the measured Σ cost ÷ Σ output tokens; their ratio less 1 is the
**closure gap**, a measurement (the factors come from different series: price book and GPU time,
NVML busy time, the engine's phase times, its step timing, the configured model and the hardware's
bandwidth, the counter-derived batch), not forced to zero. For one minute whose series agree it is
the engine's output tokens over its inter-token intervals, less 1: the first token of each request
is made by its prefill and ends no interval (``1 ÷ (mean output − 1)``, a few tenths of a percent).

**Many minutes.** Every factor of a longer window is a ratio of sums over its minutes, never a mean
of per-minute ratios: each minute's factors become additive quantities (:func:`chain_sums`: its
steps, the roofline, decode and as-run GPU-seconds of those steps, its busy GPU-seconds), added
over the minutes, and each factor is a ratio of two of them (:func:`_chained`), so the chain
telescopes and the window's closure gap is the busy-weighted mean of its minutes'. (The gauges'
time-weighted means and the floor's token-weighted one, multiplied, missed the measured $/token by
8–12 % on the bursty Azure-trace model: a gap of the means, not of any series.) Minutes that lack a
factor (the decode efficiency refuses a coarse minute whose gauges' instant disagrees with its
counters) still count for the factors they have; what they bring beyond that is the **coverage**
term, shown beside the closure gap, never spread over the factors. A window summed without chain
sums (one minute, or rows from elsewhere) is read as one window.

**What moves what** (decided, with the physics): longer prompts move mix (prefill's time) *and*
model and context (every decode step reads the longer prompts' KV: the roofline step is longer, as
it physically is), and with the router's load the sequences running; both are the prompts' doing.
The busy share is NVML's kernel time, so host gaps between steps read as idle, and batch (sequences
running over the busy share) is high by the same factor: prefill, which runs without host gaps,
raises the busy share, and idle falls by what batch rises (their sum is the sequences running).
Work lost to KV-cache preemption reads as step efficiency (the stalled sequences' inter-token
intervals hold it, and they still count as running): telling it from fewer sequences per step needs
the steps counted (vLLM's ``iteration_tokens_total`` ``_count``), which no series read here does.

Between two windows the change of the measured $/1M splits additively by the log-mean Divisia
index (LMDI-I; Ang, Energy Policy 2004 and 2015): factor i's share is ``L(V₁, V₀) · ln(fᵢ₁ / fᵢ₀)``
with ``L(a, b) = (a − b) / (ln a − ln b)``. The closure gap's change is a term of its own
(``closure``), so the shares sum to the measured change exactly; nothing is spread over the factors.

**Absent, not guessed.** A factor that cannot be read in either window (SGLang and Triton report no
phase or decode times: no mix, no step efficiency; a GPU without NVML utilisation: no idle; a model
without configured weights: no cost floor) is merged with its partner — price with idle, mix with step
efficiency, model with batch — and the merged factor is what the measured $/token leaves after the
readable factors: it then also carries the closure gap, which is not measured (``closure_gap`` None)
and the result says which factors were merged and why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from agent.cost.efficiency import (
    DECODE_TIME_KIND,
    DecodeObservation,
    ModelFigures,
    decode_efficiency_parts,
    prefill_share_floor,
)
from agent.cost.model import PER_MILLION

# The chain, in order; each factor's value v enters the product as v (batch as 1 / batch).
FACTORS = ("price", "idle", "mix", "step_efficiency", "model", "batch")
LABELS: Mapping[str, str] = {
    "price": "price",
    "idle": "idle",
    "mix": "mix",
    "step_efficiency": "step efficiency",
    "model": "model and context",
    "batch": "batch",
    "closure": "closure gap",
    "coverage": "minutes without every factor",
}
UNITS: Mapping[str, str] = {
    "price": "$/GPU-h",
    "idle": "allocated/busy",
    "mix": "step/decode",
    "step_efficiency": "step/roofline",
    "model": "GPU-ms/step",
    "batch": "sequences/step",
}
# Factors that share series or physics: one unreadable, both are merged into one.
PAIRS: tuple[tuple[str, str], ...] = (("price", "idle"), ("mix", "step_efficiency"), ("model", "batch"))
# Why each factor can be absent (for the "merged" notes).
ABSENT_WHY: Mapping[str, str] = {
    "price": "no GPU-seconds",
    "idle": "no NVML busy time (usage basis)",
    "mix": "no prefill share (no prefill phase times, or more than the replicas' time)",
    "step_efficiency": "no decode step timing (no decode efficiency)",
    "model": "no cost floor (model weights or GPU bandwidth unknown)",
    "batch": "no running-sequences gauge",
}
# Which factors each engine kind cannot read at all (its series do not exist): SGLang and Triton
# have no decode time, so mix and step efficiency merge; the rest can read every factor.
ENGINE_MERGES: Mapping[str, tuple[str, ...]] = {
    "sglang": ("mix", "step_efficiency"),
    "triton": ("mix", "step_efficiency"),
}
# Shares whose sum misses the measured change by at most this much of the two levels are floating
# point rounding (a few ulps of V), not a gap: the remainder goes to the unexplained term.
ROUNDING = 1e-12


@dataclass(frozen=True, slots=True)
class Factors:
    """One window's factors (None: unreadable) and its measured $/token."""

    values: Mapping[str, float | None]  # factor → value in the product (batch as 1 / batch)
    usd_per_token: float | None  # measured Σ cost ÷ Σ output tokens (dollars per token)
    in_decode: float | None = None  # sequences in decode over the window (time-weighted mean)
    # the minutes without every factor: their part of the product (1: none; see _chained)
    coverage: float | None = None
    covered_share: float = 1.0  # 0–1: share of the output tokens in minutes with every factor

    def product(self, names: Sequence[str] = FACTORS) -> float | None:
        """The product of ``names`` (None if any is unreadable)."""
        p = 1.0
        for n in names:
            v = self.values.get(n)
            if v is None:
                return None
            p *= v
        return p

    @property
    def closure_gap(self) -> float | None:
        """Product of all factors (and the coverage term, where some minutes lacked one) ÷ measured
        $/token − 1 (None if either is unknown)."""
        p = self.product()
        if p is None or not self.usd_per_token:
            return None
        return p * (self.coverage or 1.0) / self.usd_per_token - 1.0

    def display(self, name: str) -> float | None:
        """A factor in its display unit (:data:`UNITS`): $/GPU-h, GPU-ms per step, sequences."""
        v = self.values.get(name)
        if v is None:
            return None
        if name == "price":
            return v * 3600.0
        if name == "model":
            return v * 1e3
        if name == "batch":
            return 1.0 / v
        return v


def _ratio(num: float, den: float) -> float | None:
    """num ÷ den where both are positive and finite, else None (absent)."""
    if not (den > 0 and num > 0) or not math.isfinite(num) or not math.isfinite(den):
        return None
    return num / den


def _mean(sums: Mapping[str, float], name: str) -> float | None:
    """A time-weighted gauge's mean from its pair ``name.s`` / ``name.w`` (None: never read)."""
    w = sums.get(name + ".w", 0.0)
    return sums.get(name + ".s", 0.0) / w if w > 0 else None


def factors_of(sums: Mapping[str, float], engine_kind: str | None = None) -> Factors:
    """The factors of a window from its model sums (the store's names: ``cost_usd``,
    ``gpu_seconds``, ``usage_usd``/``usage_alloc_usd``, ``prefill_share.s``/``.w``,
    ``prefill_floor.s``/``.w``, ``roofline.s``/``.w``, ``running.s``/``.w``,
    ``floor_usd``/``floor_tokens``, ``generation_tokens``), summed over its minutes, and where the
    minutes' chain sums are among them (:func:`chain_sums`, added per minute before the minutes are
    summed) the chain read from those (:func:`_chained`). ``engine_kind`` drops the factors that kind
    cannot read (:data:`ENGINE_MERGES`) even where a sum happens to be present."""
    whole = _window_factors(sums, engine_kind)
    if engine_kind in ENGINE_MERGES:
        return whole
    return _chained(sums, whole) or whole


def _window_factors(sums: Mapping[str, float], engine_kind: str | None = None) -> Factors:
    """The factors of ``sums`` read as one window (the gauges' time-weighted means, the floor's
    token-weighted one): exact for one minute, an approximation over many whose load moves."""
    g = sums.get
    price = _ratio(g("cost_usd", 0.0), g("gpu_seconds", 0.0))
    idle = _ratio(g("usage_alloc_usd", 0.0), g("usage_usd", 0.0))
    if idle is not None and idle < 1.0:
        idle = None  # busy > allocated: impossible, absent
    # prefill's share of the window (of the steps' time: steps run back to back, their host gaps
    # in them) and the part of it the stored efficiency took out of the step
    share, taken = _mean(sums, "prefill_share"), _mean(sums, "prefill_floor")
    readable = share is not None and taken is not None and 0.0 <= share < 1.0 and 0.0 <= taken < 1.0
    mix = 1.0 / (1.0 - share) if readable and share is not None else None
    step = _ratio(g("roofline.w", 0.0), g("roofline.s", 0.0))  # 1 ÷ the mean decode efficiency
    if step is not None and readable and share is not None and taken is not None:
        step *= (1.0 - share) / (1.0 - taken)  # the step less f, where the store's took out its own
    running = _ratio(g("running.s", 0.0), g("running.w", 0.0))
    floor = _ratio(g("floor_usd", 0.0), g("floor_tokens", 0.0))  # $/token at the roofline, running batch
    model = floor / price * running if floor and price and running else None
    values: dict[str, float | None] = {
        "price": price,
        "idle": idle,
        "mix": mix,
        # efficiency above 1: absent (a step at the roofline itself reads 1 to the rounding of the
        # product that put the prefill share back)
        "step_efficiency": step if step is None or step >= 1.0 - ROUNDING else None,
        "model": model,
    }
    for name in ENGINE_MERGES.get(engine_kind or "", ()):
        values[name] = None
    values["batch"] = _per_step(running, values, BATCH_SHARES)
    return Factors(values, _ratio(g("cost_usd", 0.0), g("generation_tokens", 0.0)), running)


# The chain sums of a minute (:func:`chain_sums`), prefixed in the sums they are added to.
CHAIN = "chain."
# Of every minute whose price, idle and batch are read (the counters and NVML: nearly all):
CHAIN_SUMS = (
    "cost_usd",  # dollars
    "gpu_seconds",  # allocated GPU-seconds
    "busy_gpu_seconds",  # GPU-seconds a kernel ran (allocated ÷ idle)
    "steps",  # steps of the engine (every replica stepping once): output tokens ÷ sequences per step
    "generation_tokens",  # output tokens
)
# Of the minutes that also have a cost floor (model and context):
FLOOR_SUMS = (
    "floor_steps",  # their steps
    "floor_roofline_gpu_seconds",  # GPU-seconds their steps take at the roofline (steps × model)
)
# Of the minutes that also have the roofline split (decode efficiency, prefill share, cost floor):
CHAIN_SPLIT_SUMS = (
    "split_busy_gpu_seconds",  # their busy GPU-seconds
    "split_steps",  # their steps
    "split_roofline_gpu_seconds",  # GPU-seconds their steps take at the roofline (steps × model)
    "split_decode_gpu_seconds",  # the steps' decode parts (× step efficiency)
    "split_as_run_gpu_seconds",  # the steps as run (× mix)
    "split_generation_tokens",  # their output tokens
)


def chain_sums(sums: Mapping[str, float]) -> dict[str, float]:
    """One minute's factor chain as additive sums (:data:`CHAIN_SUMS`, :data:`CHAIN_SPLIT_SUMS`; keys
    prefixed :data:`CHAIN`), or nothing where its price, idle or batch cannot be read.

    Why: over many minutes whose load moves (a day's cycle, bursts), the gauges' time-weighted means
    and the floor's token-weighted mean do not compose: their product missed the measured $/token by
    as much as the load varied (8–12 % on the Azure trace's bursty minutes, the closure gap of means,
    not of any series). Each minute's own factors are turned into quantities that add: its steps
    (output tokens ÷ sequences per step, the counter-derived batch over the busy share), the
    GPU-seconds those steps take at the roofline (steps × model and context), their decode parts
    (× step efficiency), the steps as run (× mix) and the busy GPU-seconds (allocated ÷ idle). A
    longer window's factor is a ratio of two such sums (step efficiency = Σ decode GPU-s ÷ Σ roofline
    GPU-s, batch = Σ steps ÷ Σ tokens, …), each still read from its own series minute by minute, and
    the chain telescopes: its product is Σ cost ÷ Σ tokens × Σ steps-as-run GPU-s ÷ Σ busy GPU-s,
    so the closure gap is the busy-weighted mean of the minutes' own gaps (the engine's step timing
    and batch against its token counter: where every series agrees, the first tokens, which prefill
    makes and no inter-token interval counts)."""
    f = _window_factors(sums)
    v = f.values
    tokens = sums.get("generation_tokens", 0.0)
    idle, batch = v.get("idle"), v.get("batch")
    if v.get("price") is None or idle is None or batch is None or not f.usd_per_token or tokens <= 0:
        return {}
    steps = tokens * batch  # batch's value is 1 ÷ sequences per step
    busy = sums.get("gpu_seconds", 0.0) / idle
    out = {
        "cost_usd": sums.get("cost_usd", 0.0),
        "gpu_seconds": sums.get("gpu_seconds", 0.0),
        "busy_gpu_seconds": busy,
        "steps": steps,
        "generation_tokens": tokens,
    }
    model, step, mix = v.get("model"), v.get("step_efficiency"), v.get("mix")
    if model is not None:
        out.update(floor_steps=steps, floor_roofline_gpu_seconds=steps * model)
    if model is not None and step is not None and mix is not None:
        roofline = steps * model
        out.update(
            split_busy_gpu_seconds=busy,
            split_steps=steps,
            split_roofline_gpu_seconds=roofline,
            split_decode_gpu_seconds=roofline * step,
            split_as_run_gpu_seconds=roofline * step * mix,
            split_generation_tokens=tokens,
        )
    return {CHAIN + k: x for k, x in out.items()}


def with_chain(sums: Mapping[str, float]) -> dict[str, float]:
    """``sums`` of one minute (or bucket) with its chain sums added (:func:`chain_sums`)."""
    return {**sums, **chain_sums(sums)}


def _chained(sums: Mapping[str, float], whole: Factors) -> Factors | None:
    """The factors from the chain sums among ``sums`` (None: no minute had the whole chain).

    Each factor is a ratio of sums over the minutes that read it: price, idle and batch nearly all
    (the counters and NVML), model and context those with a cost floor, mix and step efficiency
    those that also have the roofline split (a decode efficiency and a prefill share: the efficiency
    refuses a coarse minute whose gauges' instant disagrees with its counters). Where every minute
    has every factor the chain telescopes as :func:`chain_sums` says. Where some lack one, the
    **coverage** term is what those minutes bring: the window's measured $/token against the
    factors' product at the closure of the minutes with the whole chain (their steps as run ÷ busy
    time), i.e. the steps as run per step of the minutes without the split against what the split
    minutes' mix and efficiency make of the roofline, and any minute outside the chain by its
    $/token. It is a term of its own so that it is neither spread over the factors nor read as
    closure gap; it is 0 where both windows have every factor in every minute."""
    c = {n: sums.get(CHAIN + n, 0.0) for n in (*CHAIN_SUMS, *FLOOR_SUMS, *CHAIN_SPLIT_SUMS)}
    if not all(x > 0 for x in c.values()) or not whole.usd_per_token:
        return None
    values: dict[str, float | None] = {
        "price": c["cost_usd"] / c["gpu_seconds"],
        "idle": c["gpu_seconds"] / c["busy_gpu_seconds"],
        "mix": c["split_as_run_gpu_seconds"] / c["split_decode_gpu_seconds"],
        "step_efficiency": c["split_decode_gpu_seconds"] / c["split_roofline_gpu_seconds"],
        "model": c["floor_roofline_gpu_seconds"] / c["floor_steps"],
        "batch": c["steps"] / c["generation_tokens"],
    }
    product = math.prod(v or 1.0 for v in values.values())
    closure = c["split_as_run_gpu_seconds"] / c["split_busy_gpu_seconds"]  # 1 + the split minutes' gap
    coverage = whole.usd_per_token * closure / product
    full = all(c[n] == c[m] for n, m in (("steps", "floor_steps"), ("steps", "split_steps")))
    idle = values["idle"] or 1.0
    # the split puts batch back as 1 ÷ (in_decode × the busy share): sequences per step ÷ idle
    in_decode = c["generation_tokens"] / c["steps"] / idle
    tokens = sums.get("generation_tokens", 0.0)
    share = min(1.0, c["split_generation_tokens"] / tokens) if tokens > 0 else 1.0
    whole_minutes = full and share == 1.0
    return Factors(values, whole.usd_per_token, in_decode, None if whole_minutes else coverage, share)


# The share of a window no kernel ran: batch per step is the sequences running over the window
# divided by the busy share (steps run while a kernel runs; the prefill a step carries is in it).
BATCH_SHARES = ("idle",)


def _per_step(
    in_decode: float | None, values: Mapping[str, float | None], shares: Sequence[str]
) -> float | None:
    """1 ÷ sequences per step: the sequences running over the window over the share of it that
    steps ran (the busy share, of ``shares`` those readable; one that is not counts as 1, and the
    merged residual that replaces it makes up for it, so the product stays price × mix × step
    efficiency × model ÷ sequences running)."""
    if not in_decode:
        return None
    per_step = in_decode
    for n in shares:
        per_step *= values.get(n) or 1.0
    return 1.0 / per_step


def prefill_shares(
    obs: DecodeObservation,
    model: ModelFigures,
    prefill_seconds: float | None,
    parts: tuple[float, float] | None = None,
) -> tuple[float, float] | None:
    """Prefill's share of a window and the part of it the decode efficiency of ``obs`` takes out of
    the step, both 0–1 of the window's seconds per replica; None where the share or the efficiency
    cannot be read.

    The share is the engine's prefill request-seconds per replica-second (``prefill_seconds`` over
    replicas × seconds): exact where one prefill runs at a time per replica, an upper bound where
    several share a step. It is at least the floor (the prefilled tokens' FLOPs at the GPUs' peak),
    and a figure of 1 or more (prefills overlapping more than a replica's time) says nothing: None.
    The part taken out is the efficiency's own (:func:`~agent.cost.efficiency.decode_efficiency_parts`,
    or ``parts`` when the caller has them), whatever estimate of it the efficiency used. Where that
    estimate is above the floor (the efficiency read the engine's phase times) it is the share too;
    else the share is at most what leaves the step's decode part at the roofline step (1 − the
    efficiency as run), and at least the part taken out. An engine
    whose decode time is batch forward time (TGI) times decode steps alone, so its efficiency has the
    whole share out: the part returned is the share itself."""
    kind = DECODE_TIME_KIND.get(obs.engine_kind)
    if kind is None or prefill_seconds is None or prefill_seconds < 0 or obs.window_seconds <= 0:
        return None
    floor = prefill_share_floor(obs, model) if kind == "request" else 0.0
    parts = parts or decode_efficiency_parts(obs, model)
    if parts is None:
        return None
    efficiency, taken = parts
    # the efficiency's own estimate where it has one above the floor (vLLM: the phase times less the
    # first-token step each holds, agent.cost.efficiency): one share for mix and step efficiency.
    # It is tested before the raw request-seconds: those hold every finished request's first-token
    # step as well, which on short outputs (a few tokens each) adds up to more than the replicas'
    # time although the prefill work in it is a fraction of it
    if kind == "request" and taken > floor:
        return taken, taken
    share = max(floor, prefill_seconds / (max(1, obs.replicas) * obs.window_seconds))
    if not share < 1.0:
        return None
    if kind != "request":
        return share, share
    as_run = efficiency * (1.0 - taken)  # the efficiency of the steps as run, no prefill taken out
    # else the request-seconds, at most what leaves a step's decode part at the roofline step
    return max(taken, min(share, 1.0 - as_run)), taken


@dataclass(frozen=True, slots=True)
class Term:
    """One term of the split: a factor (or merged factors) and its dollars of the change."""

    name: str  # a factor name, names joined by "+" when merged, or "closure"
    usd_per_1m: float  # dollars per 1M output tokens of the change this term carries
    share: float  # usd_per_1m ÷ the total change (signed; the shares sum to 1)
    before: float | None  # the term's value in the first window (product of its factors)
    after: float | None

    @property
    def label(self) -> str:
        """For people: "mix and step efficiency" etc."""
        return " and ".join(LABELS.get(n, n) for n in self.name.split("+"))


@dataclass(frozen=True, slots=True)
class Split:
    """The change of $/1M between two windows, split into terms that sum to it."""

    before_usd_per_1m: float  # measured, the first window
    after_usd_per_1m: float  # measured, the second
    terms: tuple[Term, ...]  # largest |usd_per_1m| first
    closure_gap_before: float | None  # product ÷ measured − 1; None where a factor was merged
    closure_gap_after: float | None
    merged: tuple[str, ...] = ()  # one note per factor merged: "mix: no prefill/decode phase times"

    @property
    def total_usd_per_1m(self) -> float:
        """The measured change in dollars per 1M output tokens."""
        return self.after_usd_per_1m - self.before_usd_per_1m


def log_mean(a: float, b: float) -> float:
    """The logarithmic mean L(a, b) = (a − b) / (ln a − ln b), L(a, a) = a; a, b > 0."""
    x = (a - b) / b  # a − b is exact when a and b are within a factor of 2 of each other (Sterbenz)
    if abs(x) < 1e-6:  # the series (1 + x/2 − x²/12) is exact to double precision here
        return b * (1.0 + x / 2.0 - x * x / 12.0)
    # log1p near a ratio of 1 (where ln(a/b) would lose the digits of a/b − 1); ln(a/b) far from it,
    # where x is near −1 and log1p(x) would amplify x's rounding (a ratio of 1e-9: by 1e-7 relative)
    return (a - b) / (math.log1p(x) if abs(x) < 0.5 else math.log(a / b))


class ExplainError(ValueError):
    """No split: a window has no measured $/token (no tokens or no dollars)."""


def _groups(before: Factors, after: Factors) -> tuple[list[tuple[str, ...]], tuple[str, ...]]:
    """The terms' factor groups and the merge notes: a pair with a member unreadable in either
    window is merged, and all merged pairs form one residual group (listed last)."""
    unreadable = [n for n in FACTORS if before.values.get(n) is None or after.values.get(n) is None]
    residual: list[str] = []
    for pair in PAIRS:
        if any(n in unreadable for n in pair):
            residual.extend(pair)
    groups: list[tuple[str, ...]] = [(n,) for n in FACTORS if n not in residual]
    if residual:
        groups.append(tuple(residual))
    notes = tuple(f"{LABELS[n]}: {ABSENT_WHY[n]}" for n in unreadable)
    return groups, notes


def split(before: Factors, after: Factors) -> Split:
    """The LMDI-I split of the measured change from ``before`` to ``after`` (see the module
    docstring); raises ExplainError when either window has no measured $/token."""
    v0, v1 = before.usd_per_token, after.usd_per_token
    if not v0 or not v1:
        raise ExplainError(
            "no cost per token in the "
            + ("first" if not v0 else "second")
            + " window (no tokens or no dollars)"
        )
    groups, notes = _groups(before, after)
    # batch per step over the shares both windows can read (an unreadable one is merged in both)
    shares = [n for n in BATCH_SHARES if before.values.get(n) is not None and after.values.get(n) is not None]
    before, after = (
        replace(f, values={**f.values, "batch": _per_step(f.in_decode, f.values, shares)})
        for f in (before, after)
    )
    merged = bool(notes)
    weight = log_mean(v1, v0) * PER_MILLION
    rows: list[tuple[str, float, float | None, float | None]] = []
    explained0 = explained1 = 1.0
    for names in groups if not merged else groups[:-1]:
        f0, f1 = before.product(names), after.product(names)
        assert f0 is not None and f1 is not None  # readable in both, by construction of the groups
        explained0, explained1 = explained0 * f0, explained1 * f1
        rows.append(("+".join(names), weight * math.log(f1 / f0), f0, f1))
    # the rest of the measured change: the merged factors' (when any), else the closure gap's (of
    # the minutes the chain was read over) and the change the minutes without it bring (their $/token
    # against the chain's minutes': "coverage", only where some minute lacked a factor)
    if merged:
        rest0, rest1 = v0 / explained0, v1 / explained1
        rows.append(("+".join(groups[-1]), weight * math.log(rest1 / rest0), rest0, rest1))
    else:
        k0, k1 = before.coverage or 1.0, after.coverage or 1.0
        if before.coverage is not None or after.coverage is not None:
            rows.append(("coverage", weight * math.log(k1 / k0), k0, k1))
        rows.append(
            ("closure", weight * math.log((v1 / (explained1 * k1)) / (v0 / (explained0 * k0))), None, None)
        )
    total = v1 * PER_MILLION - v0 * PER_MILLION  # as Split.total_usd_per_1m computes it
    off = total - math.fsum(r[1] for r in rows)
    if abs(off) <= ROUNDING * (v0 + v1) * PER_MILLION:
        name, usd, a, b = rows[-1]
        rows[-1] = (name, usd + off, a, b)
    terms = tuple(
        sorted(
            (Term(n, usd, usd / total if total else 0.0, a, b) for n, usd, a, b in rows),
            key=lambda t: -abs(t.usd_per_1m),
        )
    )
    return Split(
        v0 * PER_MILLION,
        v1 * PER_MILLION,
        terms,
        None if merged else before.closure_gap,
        None if merged else after.closure_gap,
        notes,
    )


def one_line(s: Split, top: int = 3, note: str | None = None) -> str:
    """The split in one line, largest terms first: ``+$0.88/1M: step efficiency +$0.79 (deploy
    2024-10), batch +$0.11, idle −$0.02`` (``note`` after the largest; the closure gap is named only
    when it is among the largest)."""
    head = f"{_usd(s.total_usd_per_1m)}/1M"
    parts = [f"{t.label} {_usd(t.usd_per_1m)}" for t in s.terms[:top]]
    if note and parts:
        parts[0] += f" ({note})"
    return head + ": " + ", ".join(parts)


def _usd(v: float) -> str:
    sign = "+" if v >= 0 else "−"
    a = abs(v)
    return f"{sign}${a:.2f}" if a >= 0.01 or a == 0 else f"{sign}${a:.2g}"
