"""Property tests of the counter arithmetic (:func:`agent.cost.counters.counter_increase`).

Random counter sequences with resets, jitter, gaps, NaN and absurd jumps, read one by one as the
window join reads them. Whatever the sequence: no increase is negative, and the increases never sum
to more than the hardware bound × the time between the first and the last reading. A true counter
(monotone, within the bound) sums to last − first exactly; a restart with a new ``_created``
counts its new value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.cost.counters import CounterMemory, counter_increase

CEILING = 1000.0  # tokens/s: the bound the sequences are read under
# deterministic and quick in CI: the same 200 examples every run
PROFILE = settings(derandomize=True, max_examples=200, deadline=None)


@dataclass(frozen=True)
class Reading:
    """One scrape of a counter: its time, value (None: not exposed) and _created."""

    dt: float  # seconds since the previous scrape
    value: float | None
    created: float | None = None


def _step(kind: str, dt: float, last: float, amount: int, created: float) -> Reading:
    """One reading of the kind named, after a counter at ``last``."""
    if kind == "grow":
        return Reading(dt, last + min(amount, int(CEILING * dt)), created)
    if kind == "jitter":
        return Reading(dt, max(0.0, last - 1 - amount % 3), created)
    if kind == "reset":
        return Reading(dt, float(amount % 1000), created)
    if kind == "restart":
        return Reading(dt, float(min(amount, int(CEILING * dt))), created + dt)
    if kind == "gap":
        return Reading(dt, None, created)
    if kind == "nan":
        return Reading(dt, math.nan, created)
    if kind == "spike":
        return Reading(dt, last + 9e14, created)
    return Reading(dt, -5.0 if kind == "negative" else math.inf, created)


@st.composite
def sequences(draw: st.DrawFn) -> list[Reading]:
    """Counter readings: growth, jitter, resets, restarts with a new _created, gaps, NaN, spikes."""
    kinds = st.sampled_from(
        ["grow", "grow", "grow", "jitter", "reset", "restart", "gap", "nan", "spike", "negative", "inf"]
    )
    out: list[Reading] = [Reading(0.0, float(draw(st.integers(0, 10**9))), 1.0)]
    last, created = out[0].value or 0.0, 1.0
    for _ in range(draw(st.integers(1, 30))):
        r = _step(draw(kinds), draw(st.integers(1, 120)) * 1.0, last, draw(st.integers(0, 10**6)), created)
        out.append(r)
        if r.value is not None and math.isfinite(r.value) and r.value >= 0:
            last = r.value
        created = r.created if r.created is not None else created
    return out


def _read(seq: list[Reading], named: bool) -> tuple[list[float], float, float]:
    """The increases of ``seq`` read one by one, and the times of its first and last valid readings."""
    mem: CounterMemory | None = None
    t, first, last_t = 0.0, None, 0.0
    incs: list[float] = []
    for r in seq:
        t += r.dt
        parts = {"s": r.value} if named and r.value is not None else None
        created = {"s": r.created} if r.created is not None else None
        inc, mem = counter_increase(mem, r.value, parts, t, CEILING, created)
        if r.value is not None and math.isfinite(r.value) and r.value >= 0:
            first = t if first is None else first
            last_t = t
        if inc is not None:
            incs.append(inc)
    return incs, first if first is not None else 0.0, last_t


@PROFILE
@given(sequences(), st.booleans())
def test_increases_are_never_negative_and_never_beyond_the_bound_times_the_time(
    seq: list[Reading], named: bool
) -> None:
    incs, first, last = _read(seq, named)
    assert all(i >= 0.0 for i in incs)
    assert sum(incs) <= CEILING * (last - first)


@PROFILE
@given(
    st.integers(0, 10**12),
    st.lists(st.tuples(st.integers(1, 60), st.integers(0, 60_000)), min_size=1, max_size=40),
    st.booleans(),
)
def test_a_true_counter_sums_to_last_minus_first_exactly(
    start: int, steps: list[tuple[int, int]], named: bool
) -> None:
    seq = [Reading(0.0, float(start), 1.0)]
    value = start
    for dt, add in steps:
        value += min(add, int(CEILING * dt))  # a real engine: within the bound
        seq.append(Reading(float(dt), float(value), 1.0))
    incs, _, _ = _read(seq, named)
    assert sum(incs) == value - start


@PROFILE
@given(
    st.integers(0, 10**9),
    st.integers(1, 600),
    st.integers(0, 10**6),
    st.booleans(),
)
def test_a_restart_with_a_new_created_counts_its_new_value(
    before: int, dt: int, after: int, named: bool
) -> None:
    after = min(after, int(CEILING * dt))  # what the new process could have counted since
    seq = [Reading(0.0, float(before), 100.0), Reading(float(dt), float(after), 100.0 + dt)]
    incs, _, _ = _read(seq, named)
    assert incs == [float(after)]  # even above the old value; never after − before


@PROFILE
@given(st.lists(st.integers(0, 10**9), min_size=2, max_size=6), st.integers(1, 60))
def test_several_series_together_stay_within_the_bound(values: list[int], dt: int) -> None:
    # series appear at once (each counts in full): together they may not pass the bound × the interval
    mem: CounterMemory | None = None
    _, mem = counter_increase(mem, 0.0, {"a": 0.0}, 0.0, CEILING)
    parts = {f"s{k}": float(v) for k, v in enumerate(values)}
    inc, mem = counter_increase(mem, sum(parts.values()), parts, float(dt), CEILING)
    assert inc is not None and 0.0 <= inc <= CEILING * dt
    alone = sum(v for v in values if v <= CEILING * dt)  # each beyond the bound alone is refused
    assert inc == (alone if alone <= CEILING * dt else 0.0)


@PROFILE
@given(sequences(), sequences())
def test_two_ranks_with_resets_and_gaps_stay_within_the_bound(a: list[Reading], b: list[Reading]) -> None:
    # two DP ranks read together (the first's clock): either may be missing, glitch, restart or spike
    mem: CounterMemory | None = None
    t, first, last = 0.0, None, 0.0
    total = 0.0
    for ra, rb in zip(a, b, strict=False):
        t += ra.dt
        parts = {k: r.value for k, r in (("a", ra), ("b", rb)) if r.value is not None}
        created = {k: r.created for k, r in (("a", ra), ("b", rb)) if r.created is not None}
        value = sum(v for v in parts.values() if math.isfinite(v)) if parts else None
        inc, mem = counter_increase(mem, value, parts or None, t, CEILING, created)
        if value is not None:
            first = t if first is None else first
            last = t
        assert inc is None or inc >= 0.0
        total += inc or 0.0
    assert total <= CEILING * (last - (first or 0.0))
