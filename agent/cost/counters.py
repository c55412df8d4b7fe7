"""Counters with the exposition format's semantics, and the hardware's bound on them (pure).

An engine may export one counter as several series that the adapter sums: one per data-parallel
rank (vLLM ``engine=0,1``), per model version (Triton), per metric name (llama.cpp cached and
uncached prompt tokens). Differencing the *sum* goes wrong whenever one series restarts, appears
or vanishes for a scrape: the sum drops and is read as a reset, so every other series' whole
history is counted again. So the window join keeps the last value of every series it has seen,
including series that are missing from the latest scrape, and:

- a series seen before is differenced against its own last value (:func:`counter_step`);
- a series never seen before counts in full (it started from zero since the last scrape);
- a series missing from this scrape adds nothing, and its last value is kept, so when it comes
  back only what it made meanwhile counts.

What a reading of one series means (:func:`counter_step`):

- **a reset** when the series' ``_created`` or the process' start time moved on (the whole new
  value counts, even above the old one; an earlier one is another process, not a restart), or
  when the value fell to under half of the last one *and* no more than the engine could have
  counted since the last scrape (a restarted process that counted again);
- **a glitch** for any other decrease: nothing counts, the last value is kept, the series is
  flagged (a counter that goes down by one every scrape counts nothing, instead of its whole
  value every scrape);
- **a spike** for an increase beyond what the hardware can produce in the interval: refused
  (nothing counts, the last value is kept), flagged;
- a reading that continues the level a glitch or a spike left (at or above it by no more than the
  bound) is a level shift: what it made since that level counts, and the series goes on from there.

Whatever the readings, the increases are never negative and never sum to more than the bound ×
the time between the first and the last reading (``tests/test_properties_counters.py``).

The engine adapters name every series of a counter, a lone one too, so each is differenced against
itself. A reading without names (a source that only gives the sum) is matched to the remembered
series it continues (the one with the largest value not above it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agent.hardware import GPUS, GpuSpec, gpu_spec

ANONYMOUS = ""  # the key of an unnamed reading in CounterMemory's per-series maps
# Where the adapters put, beside a counter's series in ``ModelSignals.counter_parts``, each series'
# ``_created`` (under the counter's name + CREATED) and the process' start time (under STARTED).
# Neither is a signal name, so nothing that reads the counters' series takes them for one.
CREATED = "@created"
STARTED = "@process_start_time_seconds"
GLITCH = "glitch"  # a decrease that is no reset: nothing counted
SPIKE = "spike"  # an increase beyond the hardware bound: refused
# Why a half: a restart sets a counter back to zero, so a restarted process' counter lies far below
# the old one (with the bound: no higher than what it could count since the last scrape), while a
# read-out glitch (a torn sum, a float written with fewer digits) moves a counter by a few counts,
# nowhere near half of it.
RESET_FRACTION = 0.5
# Why 4,096 sequences × 8 tokens: a decode step emits at most one token per running sequence plus
# the draft tokens speculative decoding accepted; engines batch at most a few thousand sequences
# (vLLM's max_num_seqs defaults to 256–1024, SGLang's max_running_requests is sized by the KV
# cache) and accept at most a handful of draft tokens a step (EAGLE / MTP / n-gram proposals of
# ≤ 7): 4,096 × 8 tokens a step lies far above both, so no real engine reaches the bound.
TOKENS_PER_STEP = 4096 * 8
# Why the fastest GPU of the table: it bounds a GPU the table does not know (no board shipped has a
# higher peak or bandwidth).
FASTEST_GPU: GpuSpec = max(GPUS.values(), key=lambda s: (s.peak_flops, s.hbm_bandwidth_bytes_per_s))
# Why 4× the BF16 peak over 2 × 1e8 FLOPs a token: a generated token costs at least 2 FLOPs per
# active parameter, the smallest models served as LLMs have about 1e8 parameters, and the fastest
# number format (FP4 on Blackwell) runs at 4× the dense BF16 peak the table holds: no GPU generates
# faster, whatever the model and batch (the bound where the model's weights are unknown).
FLOP_FORMAT_SPEEDUP = 4.0
MIN_FLOPS_PER_TOKEN = 2 * 1e8  # FLOPs
# Why 50e9 bytes/s at 1 byte a token: every prompt token reaches the engine over the network (as
# text, ≥ 1 byte a token, or as a token id, more), and a 400 Gb/s NIC per GPU (the HGX reference
# design) moves 50e9 bytes/s; prefix-cache hits cost no compute, so compute cannot bound prompts.
PROMPT_BYTES_PER_S = 50e9  # bytes/s per GPU (a CPU engine: one such NIC)
PROMPT_BYTES_PER_TOKEN = 1.0  # bytes


def generation_ceiling(gpu_names: Sequence[str], weights_bytes: float | None, gpus: int = 0) -> float:
    """Tokens/s an engine's GPUs can generate at most (see the constants above).

    With the model's weights (bytes read per decode step): the GPUs' summed bandwidth reads them once
    a step, at :data:`TOKENS_PER_STEP` tokens a step. Without: each GPU's compute bound (the fastest
    GPU's for a name the table does not know). ``gpus``: GPUs configured, read or not (the unread
    ones counted as the fastest); an engine without GPUs is bounded as one fastest GPU, which no CPU
    outruns in bandwidth or compute."""
    specs = [gpu_spec(n) or FASTEST_GPU for n in gpu_names]
    specs += [FASTEST_GPU] * max(1 - len(specs), gpus - len(specs))
    if weights_bytes is not None and weights_bytes > 0:
        return sum(s.hbm_bandwidth_bytes_per_s for s in specs) / weights_bytes * TOKENS_PER_STEP
    return sum(s.peak_flops for s in specs) * FLOP_FORMAT_SPEEDUP / MIN_FLOPS_PER_TOKEN


def prompt_ceiling(gpu_names: Sequence[str], gpus: int = 0) -> float:
    """Prompt tokens/s an engine can take at most: its network, one NIC per GPU (one for a CPU engine)."""
    return max(1, len(gpu_names), gpus) * PROMPT_BYTES_PER_S / PROMPT_BYTES_PER_TOKEN


@dataclass(frozen=True, slots=True)
class Step:
    """What one reading of one series means (:func:`counter_step`)."""

    increase: float  # counted, ≥ 0
    keep: float  # the value to difference the next reading against
    pending: float | None = None  # a refused level the next reading may continue
    refused: str | None = None  # GLITCH or SPIKE when the reading was refused
    # the reading started the series over (a restart), counted from zero; what it means for the
    # process' other counters, not part of the step's value
    reset: bool = field(default=False, compare=False)


def counter_step(
    prev: float | None,
    cur: float,
    budget: float = math.inf,
    restarted: bool = False,
    pending: float | None = None,
) -> Step:
    """One series' reading ``cur`` after ``prev`` (None: never seen, it counts in full), counting at
    most ``budget`` (the bound × the interval); ``restarted``: its ``_created`` or start time changed;
    ``pending``: the level its last refused reading left (see the module docstring)."""
    if prev is None or restarted:
        if cur <= budget:
            return Step(cur, cur, reset=prev is not None)
        return Step(0.0, cur, None, SPIKE)  # a start beyond the bound: a baseline, nothing counted
    if prev <= cur <= prev + budget:
        return Step(cur - prev, cur)
    if cur < prev * RESET_FRACTION and cur <= budget:
        return Step(cur, cur, reset=True)
    if pending is not None and pending <= cur <= pending + budget:
        return Step(cur - pending, cur)
    return Step(0.0, prev, cur, SPIKE if cur > prev else GLITCH)


@dataclass(frozen=True, slots=True)
class CounterMemory:
    """What the join remembers of one counter: the last value of each series it has seen."""

    series: Mapping[str, float] = field(default_factory=dict)  # named series → last value
    anonymous: float | None = None  # last value of an unnamed reading that matched no named series
    current: str | None = None  # the named series the last unnamed reading continued
    at: float | None = None  # epoch seconds of the last reading (None: read without a clock)
    created: Mapping[str, float] = field(default_factory=dict)  # series → its _created, epoch seconds
    started: float | None = None  # the process' start time at the last reading, epoch seconds
    pending: Mapping[str, float] = field(default_factory=dict)  # series → a refused level (Step)
    refused: Mapping[str, str] = field(default_factory=dict)  # series → GLITCH / SPIKE, last reading
    # the last reading started every series seen before over (its process restarted)
    reset: bool = field(default=False, compare=False)


def _closest_below(series: Mapping[str, float], value: float) -> str | None:
    """The series whose last value is the largest one not above ``value`` (None if none is)."""
    best: str | None = None
    for k, v in series.items():
        if v <= value and (best is None or v > series[best]):
            best = k
    return best


def _closest_above(parts: Mapping[str, float], value: float) -> str | None:
    """The series in ``parts`` whose value is the smallest one not below ``value`` (None if none is)."""
    best: str | None = None
    for k, v in parts.items():
        if v >= value and (best is None or v < parts[best]):
            best = k
    return best


def _valid(x: float | None) -> bool:
    """A reading a counter can have: finite and ≥ 0."""
    return x is not None and math.isfinite(x) and x >= 0.0


def _budget(memory: CounterMemory, now: float | None, ceiling: float | None) -> float:
    """The most the counter may add since its last reading: the bound × the interval."""
    if ceiling is None or now is None or memory.at is None:
        return math.inf
    return ceiling * max(0.0, now - memory.at)


def _restarted(memory: CounterMemory, key: str, created: float | None, started: float | None) -> bool:
    """Whether the series' ``_created`` or the process' start time moved on since the last reading.

    Only a later one is a restart (time runs forward); an earlier one is another process answering
    at the same address (pods behind one Service), not a restart of this one."""
    old = memory.created.get(key)
    if created is not None and old is not None and created > old:
        return True
    return started is not None and memory.started is not None and started > memory.started


def _latest(old: float | None, new: float | None) -> float | None:
    """The later of two start times (either may be unknown)."""
    if old is None:
        return new
    return old if new is None else max(old, new)


def counter_increase(
    memory: CounterMemory | None,
    total: float | None,
    parts: Mapping[str, float] | None,
    now: float | None = None,
    ceiling: float | None = None,
    created: Mapping[str, float] | None = None,
    started: float | None = None,
    restarted: bool = False,
) -> tuple[float | None, CounterMemory | None]:
    """(what the counter added since the last reading, the memory to keep).

    ``total`` is the summed value as scraped (None or NaN: the counter is not exposed this time);
    ``parts`` its series by name when there are several; ``now`` the reading's time (epoch seconds);
    ``ceiling`` the most the counter can grow per second (None: unbounded); ``created`` the series'
    ``_created`` (by name; an unnamed reading's is its only entry) and ``started`` the process' start
    time, where the engine exposes them; ``restarted``: the process is known to have restarted since
    the last reading (another counter of it read as a reset: one process' counters restart together,
    so this one counts from zero too, within its bound). The increase is None without a previous
    reading (the first scrape sets the baseline) and never negative; the series refused are in
    ``memory.refused``, and ``memory.reset`` says whether the reading was read as a restart.
    """
    if total is None or not _valid(total):
        return None, memory
    made = {k: v for k, v in (created or {}).items() if _valid(v)}
    start = started if started is not None and _valid(started) else None
    if parts:
        readings = {k: v for k, v in parts.items() if _valid(v)}
        if memory is None:
            return None, CounterMemory(readings, at=now, created=made, started=start)
        return _named(memory, readings, now, _budget(memory, now, ceiling), made, start, restarted)
    own = next(iter(made.values())) if len(made) == 1 else None
    if memory is None:
        return None, CounterMemory(
            anonymous=total, at=now, created={ANONYMOUS: own} if own is not None else {}, started=start
        )
    return _unnamed(memory, total, now, _budget(memory, now, ceiling), own, start, restarted)


def _named(
    memory: CounterMemory,
    parts: Mapping[str, float],
    now: float | None,
    budget: float,
    created: Mapping[str, float],
    started: float | None,
    process_restarted: bool = False,
) -> tuple[float, CounterMemory]:
    """:func:`counter_increase` of a reading by series."""
    known = dict(memory.series)
    if memory.anonymous is not None:
        # the previous reading was one unnamed series: it continues one of these
        k = _closest_above(parts, memory.anonymous)
        if k is not None:
            known[k] = memory.anonymous
    restarted = {k: process_restarted or _restarted(memory, k, created.get(k), started) for k in parts}
    steps = {
        k: counter_step(known.get(k), v, budget, restarted[k], memory.pending.get(k))
        for k, v in parts.items()
    }
    if sum(s.increase for s in steps.values()) > budget:
        # together beyond the bound: every series that counted is refused (as one spike); a start
        # (a new or restarted series) is kept as its baseline, any other goes on from its last value
        steps = {k: _refuse(s, known.get(k), parts[k], restarted[k]) for k, s in steps.items()}
    # a restart of the process: every series read before started over (one rank's restart is not)
    reset = any(s.reset for s in steps.values()) and all(s.reset for k, s in steps.items() if k in known)
    known.update({k: s.keep for k, s in steps.items()})
    pending = {k: v for k, v in memory.pending.items() if k not in parts}
    pending.update({k: s.pending for k, s in steps.items() if s.pending is not None})
    return sum(s.increase for s in steps.values()), CounterMemory(
        known,
        at=now,
        created={**memory.created, **{k: max(v, memory.created.get(k, v)) for k, v in created.items()}},
        started=_latest(memory.started, started),
        pending=pending,
        refused={k: s.refused for k, s in steps.items() if s.refused is not None},
        reset=reset,
    )


def _refuse(step: Step, prev: float | None, cur: float, restarted: bool) -> Step:
    """``step`` refused as part of a spike, when it counted anything."""
    if step.increase <= 0.0:
        return step
    if prev is None or restarted:
        return Step(0.0, cur, None, SPIKE)
    return Step(0.0, prev, cur, SPIKE)


def _unnamed(
    memory: CounterMemory,
    total: float,
    now: float | None,
    budget: float,
    created: float | None,
    started: float | None,
    process_restarted: bool = False,
) -> tuple[float, CounterMemory]:
    """:func:`counter_increase` of a reading without series names."""
    if memory.current is not None and memory.current in memory.series:
        key, prev = memory.current, memory.series[memory.current]
    elif memory.anonymous is not None:
        key, prev = ANONYMOUS, memory.anonymous
    else:
        below = _closest_below(memory.series, total)
        if below is None:  # every remembered series is above it: the one left restarted, or a glitch
            above = _closest_above(memory.series, total)
            if above is None:  # (no series at all: a memory built by hand)
                return 0.0, _remember(memory, ANONYMOUS, Step(0.0, total), now, created, started)
            fell = total < memory.series[above] * RESET_FRACTION and total <= budget
            if fell or process_restarted or _restarted(memory, ANONYMOUS, created, started):
                # the series' last values are kept: they may come back named
                step = counter_step(memory.series[above], total, budget, restarted=True)
                return step.increase, _remember(memory, ANONYMOUS, step, now, created, started)
            below = above
        key, prev = below, memory.series[below]
    step = counter_step(
        prev,
        total,
        budget,
        process_restarted or _restarted(memory, key, created, started),
        memory.pending.get(key),
    )
    return step.increase, _remember(memory, key, step, now, created, started)


def _remember(
    memory: CounterMemory,
    key: str,
    step: Step,
    now: float | None,
    created: float | None,
    started: float | None,
) -> CounterMemory:
    """The memory after ``step`` of the unnamed reading that continued series ``key``."""
    pending = {k: v for k, v in memory.pending.items() if k != key}
    if step.pending is not None:
        pending[key] = step.pending
    if key == ANONYMOUS:
        series, anonymous, current = memory.series, step.keep, None
    else:
        series, anonymous, current = {**memory.series, key: step.keep}, None, key
    return CounterMemory(
        series,
        anonymous,
        current,
        at=now,
        created=memory.created
        if created is None
        else {**memory.created, key: max(created, memory.created.get(key, created))},
        started=_latest(memory.started, started),
        pending=pending,
        refused={key: step.refused} if step.refused is not None else {},
        reset=step.reset,
    )
