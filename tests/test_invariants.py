"""The laws of :mod:`agent.cost.invariants`, hand-checked: a real tick keeps them all, and each law
names what breaks it when one number of that tick is made impossible.

The tick: two H100s at $3.60 per GPU-hour for 10 s ($0.01 each); engine ``a`` holds GPU 0 and made
1,000 output and 500 prompt tokens (2 s of prefill, 8 s of decode: prompt $0.002, output $0.008);
GPU 1 is held by no engine (unallocated, idle); a CPU engine ``cpu`` at $0.36 per hour made nothing
($0.001 of idle).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from agent.cost.inputs import EngineSpec, GpuRate, PriceTable
from agent.cost.invariants import counters_read_at, violations
from agent.cost.window import TickResult, WindowJoiner
from agent.samples import EngineScrape, GpuSample, ModelSignals, NvmlRound

T0 = 1_780_000_000.0
H100 = "NVIDIA H100 80GB HBM3"
BOOK = PriceTable(gpus=(GpuRate("H100", 3.6),), engines={"cpu": 0.36})
ENGINES = (EngineSpec("a", kind="vllm", gpus=(0,), weights_bytes=14e9), EngineSpec("cpu", kind="llamacpp"))


def _round(t: float, names: tuple[str, ...] = (H100, H100)) -> NvmlRound:
    return NvmlRound(
        t, True, tuple(GpuSample(i, f"GPU-{i}", n, t, util_gpu_ratio=0.5) for i, n in enumerate(names))
    )


def _scrapes(t: float, gen: float, prompt: float, prefill: float, decode: float) -> dict[str, EngineScrape]:
    a = ModelSignals(
        "m",
        prompt_tokens_total=prompt,
        generation_tokens_total=gen,
        requests_running=4.0,
        kv_cache_usage_ratio=0.25,
        prefill_seconds_total=prefill,
        decode_seconds_total=decode,
    )
    cpu = ModelSignals("c", prompt_tokens_total=0.0, generation_tokens_total=0.0)
    return {
        "a": EngineScrape("a", "vllm", t, True, 0.01, (a,)),
        "cpu": EngineScrape("cpu", "llamacpp", t, True, 0.01, (cpu,)),
    }


def _tick(engines: tuple[EngineSpec, ...] = ENGINES, names: tuple[str, ...] = (H100, H100)) -> TickResult:
    j = WindowJoiner("n1", engines, BOOK)
    j.add_round(_round(T0, names))
    j.close_tick(T0, _scrapes(T0, 0.0, 0.0, 0.0, 0.0))
    j.add_round(_round(T0 + 10, names))
    return j.close_tick(T0 + 10, _scrapes(T0 + 10, 1000.0, 500.0, 2.0, 8.0))


def test_a_real_tick_keeps_every_law() -> None:
    tick = _tick()
    w = {x.usage.engine: x for x in tick.windows}
    assert w["a"].cost_usd == pytest.approx(0.01) and w["a"].prompt_usd == pytest.approx(0.002)
    assert w["cpu"].idle_usd == pytest.approx(0.001) and tick.engine_usd == pytest.approx(0.001)
    assert w["a"].floor_usd_per_1m_output is not None and w["a"].usd_per_1m_output is not None
    assert violations(tick, ENGINES, BOOK) == []


def _window(tick: TickResult, engine: str, **changes: object) -> TickResult:
    windows = tuple(replace(w, **changes) if w.usage.engine == engine else w for w in tick.windows)  # type: ignore[arg-type]
    return replace(tick, windows=windows)


def _usage(tick: TickResult, engine: str, **changes: object) -> TickResult:
    windows = tuple(
        replace(w, usage=replace(w.usage, **changes)) if w.usage.engine == engine else w  # type: ignore[arg-type]
        for w in tick.windows
    )
    return replace(tick, windows=windows)


def _gpu(tick: TickResult, index: int, **changes: object) -> TickResult:
    gpus = tuple(replace(g, **changes) if g.sample.index == index else g for g in tick.gpus)  # type: ignore[arg-type]
    return replace(tick, gpus=gpus)


CASES: list[tuple[str, Callable[[TickResult], TickResult], str]] = [
    # conservation
    ("a dollar of GPU time lost", lambda t: _gpu(t, 1, cost_usd=0.011), "Σ GPU"),
    ("the CPU engine's own dollars not its price", lambda t: replace(t, engine_usd=0.002), "engines' own"),
    ("GPU idle that is not idle", lambda t: _gpu(t, 0, idle_usd=0.005), "Σ GPU idle"),
    # the split of a window
    ("prompt dollars above the cost", lambda t: _window(t, "a", prompt_usd=0.02), "prompt $"),
    ("idle dollars in a window with tokens", lambda t: _window(t, "a", idle_usd=0.001), "idle $"),
    ("a usage basis above the cost", lambda t: _window(t, "a", usage_usd=0.02), "usage-basis"),
    ("unallocated above idle", lambda t: _gpu(t, 0, unallocated_usd=0.001), "unallocated"),
    (
        "bound dollars that do not add up",
        lambda t: _window(t, "a", bound_usd={"idle": 0.001}),
        "bound dollars",
    ),
    (
        "throttled beyond the GPU-seconds held",
        lambda t: _usage(t, "a", throttled_gpu_seconds=20.0),
        "throttled",
    ),
    ("more GPU-seconds than the GPUs had", lambda t: _usage(t, "a", gpu_seconds=30.0), "GPU-seconds"),
    (
        "a price per token that is not cost ÷ tokens",
        lambda t: _window(t, "a", usd_per_1m_total=1.0),
        "≠ cost",
    ),
    (
        "a floor at the largest batch above the running batch's",
        lambda t: _window(t, "a", floor_usd_per_1m_output_max_batch=1e9),
        "largest batch",
    ),
    # ranges
    ("a utilisation above 1", lambda t: _usage(t, "a", gpu_util_ratio=1.5), "gpu_util_ratio"),
    ("a KV-cache usage below 0", lambda t: _usage(t, "a", kv_cache_usage_ratio=-0.1), "kv_cache_usage_ratio"),
    ("a decode efficiency of 0", lambda t: _window(t, "a", roofline_ratio=0.0), "roofline_ratio"),
    ("a GPU's bandwidth above 1", lambda t: _gpu(t, 0, bw_ratio=1.01), "bw_ratio"),
    ("negative tokens", lambda t: _usage(t, "a", prompt_tokens=-1.0), "prompt_tokens"),
    ("a NaN", lambda t: _usage(t, "a", power_watts=float("nan")), "not finite"),
    # the hardware
    ("more tokens than the GPU can make", lambda t: _usage(t, "a", generation_tokens=1e12), "ceiling"),
    ("a price per token under the floor", lambda t: _window(t, "a", usd_per_1m_output=0.01), "floor"),
    # absent, not zero
    (
        "a price per token without tokens",
        lambda t: _window(t, "cpu", usd_per_1m_output=0.0),
        "without output tokens",
    ),
    ("a price per token of an unpriced cost", lambda t: _window(t, "a", priced=False), "unpriced"),
]


@pytest.mark.parametrize(("tamper", "law"), [(c[1], c[2]) for c in CASES], ids=[c[0] for c in CASES])
def test_each_law_names_what_breaks_it(tamper: Callable[[TickResult], TickResult], law: str) -> None:
    broken = violations(tamper(_tick()), ENGINES, BOOK)
    assert broken and any(law in line for line in broken), broken


def test_tokens_counted_after_a_gap_are_bounded_by_the_gap() -> None:
    # the counter last counted 100 s before the tick: its tokens are bounded by 110 s, and the floor
    # (which prices this window's 10 s) says nothing of them
    tick = _usage(_tick(), "a", generation_tokens=3e8)  # the ceiling: 7.84e6 tok/s
    assert any("ceiling" in line for line in violations(tick, ENGINES, BOOK))
    before = {("a", "m"): T0 - 100.0, ("cpu", "c"): T0}
    broken = violations(tick, ENGINES, BOOK, before)
    assert not any("ceiling" in line or "floor" in line for line in broken), broken


def test_a_refused_reading_does_not_move_the_counters_clock() -> None:
    tick = replace(_tick(), refused_counters=("a/m/generation_tokens_total/generation_tokens_total (spike)",))
    read = counters_read_at({("a", "m"): T0}, tick, _scrapes(T0 + 10, 1e15, 0.0, 0.0, 0.0))
    assert read == {("a", "m"): T0, ("cpu", "c"): T0 + 10}
    down = {"a": EngineScrape("a", "vllm", T0 + 10, False, 2.0, error="connection refused")}
    assert counters_read_at({}, tick, down) == {}


def test_an_engine_on_a_gpu_the_table_does_not_know_has_no_floor_under_its_price() -> None:
    # one sequence on two GPUs of 3.35 TB/s, the second unknown to the table: 140 GB a step at
    # 6.7 TB/s is 20.9 ms, 47.9 tok/s; at 90 % of that, 430 tokens in 10 s ($46.51 per 1M); a floor
    # from the H100 alone is $83.58 per 1M, above what was paid
    names = (H100, "Mystery GPU 9000")
    book = PriceTable(gpus=(GpuRate("H100", 3.6), GpuRate("Mystery", 3.6)))
    spec = (EngineSpec("a", kind="vllm", gpus=(0, 1), weights_bytes=140e9),)
    j = WindowJoiner("n1", spec, book)
    j.add_round(_round(T0, names))
    j.close_tick(T0, {"a": _scrapes(T0, 0.0, 0.0, 0.0, 0.0)["a"]})
    j.add_round(_round(T0 + 10, names))
    page = ModelSignals("m", prompt_tokens_total=0.0, generation_tokens_total=430.0, requests_running=1.0)
    tick = j.close_tick(T0 + 10, {"a": EngineScrape("a", "vllm", T0 + 10, True, 0.01, (page,))})
    assert violations(tick, spec, book) == []
