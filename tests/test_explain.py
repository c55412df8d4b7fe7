"""The factor chain of $/token and its LMDI-I split (agent.cost.explain), on synthetic windows built
from physical inputs: change one input at a time and only its factor moves; the shares always sum
to the measured change."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.cost.efficiency import DecodeObservation, ModelFigures, decode_efficiency
from agent.cost.explain import (
    FACTORS,
    ExplainError,
    factors_of,
    log_mean,
    one_line,
    prefill_shares,
    split,
)


@dataclass(frozen=True)
class Inputs:
    """A window's physics: what the sums are made from."""

    usd_per_gpu_hour: float = 2.5  # $/GPU-h
    gpus: float = 2.0  # GPUs the engine holds
    busy: float = 1.0  # 0–1: share of the allocated time a kernel ran (steps run while one does)
    prompt_tokens_per_request: float = 500.0  # tokens; sets the prefill share of the steps' time
    step_seconds: float = 0.030  # seconds of one step's decode part (the step as run less its prefill)
    roofline_step_seconds: float = 0.015  # seconds of the fastest possible step
    batch: float = 24.0  # sequences per step (all replicas)
    seconds: float = 3600.0  # window length


PREFILL_SECONDS_PER_TOKEN = 2e-4  # per request's prompt token, against 1 s of decode per request
FLOOR_OF_SHARE = 0.5  # the FLOP floor of the prefill share the stored efficiency took out, of it


def sums_of(x: Inputs) -> dict[str, float]:
    """The store's model sums of a window with these inputs (hand-derived, one path): steps run
    back to back while the GPU is busy, each carrying prefill chunks for ``prefill_share`` of its
    time; the engine's decode request-seconds count every running sequence over the busy time, its
    prefill request-seconds one prefill at a time."""
    gpu_s = x.gpus * x.seconds
    cost = x.usd_per_gpu_hour * gpu_s / 3600.0
    prefill = x.prompt_tokens_per_request * PREFILL_SECONDS_PER_TOKEN
    prefill_share = prefill / (prefill + 1.0)
    of_window = prefill_share * x.busy  # prefill's share of the window (what the engine's seconds say)
    floor_share = of_window * FLOOR_OF_SHARE
    step_as_run = x.step_seconds / (1.0 - prefill_share)
    gen = x.busy * x.seconds / step_as_run * x.batch
    running = x.batch * x.busy  # sequences in the running set over the window
    floor_per_token = cost / x.seconds * x.roofline_step_seconds / running
    return {
        "seconds": x.seconds,
        "generation_tokens": gen,
        "prompt_tokens": gen * 2,
        "cost_usd": cost,
        "gpu_seconds": gpu_s,
        "usage_usd": cost * x.busy,
        "usage_alloc_usd": cost,
        "prefill_share.s": of_window * x.seconds,
        "prefill_share.w": x.seconds,
        "prefill_floor.s": floor_share * x.seconds,
        "prefill_floor.w": x.seconds,
        # the decode efficiency as the store keeps it: the step as run less the floor of its prefill
        "roofline.s": x.roofline_step_seconds / (step_as_run * (1.0 - floor_share)) * x.seconds,
        "roofline.w": x.seconds,
        "running.s": running * x.seconds,
        "running.w": x.seconds,
        "floor_usd": floor_per_token * gen,
        "floor_tokens": gen,
    }


BASE = Inputs()


def test_closure_is_exact_when_every_series_agrees() -> None:
    f = factors_of(sums_of(BASE))
    assert f.closure_gap is not None and abs(f.closure_gap) < 1e-12
    # the dimensions, by hand: price $/GPU-s, model GPU-s per step, batch 1/sequences
    assert f.values["price"] == pytest.approx(2.5 / 3600)
    assert f.values["model"] == pytest.approx(BASE.gpus * BASE.roofline_step_seconds)
    assert f.values["batch"] == pytest.approx(1 / 24)
    assert f.values["step_efficiency"] == pytest.approx(2.0)
    assert f.values["idle"] == pytest.approx(1.0)
    assert f.values["mix"] == pytest.approx(1 / (1 - 0.1 / 1.1))  # 500 × 2e-4 s of prefill per 1 s
    assert f.display("price") == pytest.approx(2.5)


def test_the_prefill_share_moves_mix_not_the_decode_step() -> None:
    """The stored efficiency took out only the floor of the prefill share: step efficiency puts the
    rest back, so the decode step it reads is the same at any prompt length."""
    short, long = (factors_of(sums_of(replace(BASE, prompt_tokens_per_request=n))) for n in (200.0, 8000.0))
    assert short.values["step_efficiency"] == pytest.approx(2.0)
    assert long.values["step_efficiency"] == pytest.approx(2.0)
    assert long.values["mix"] == pytest.approx(1 / (1 - 1.6 / 2.6))
    assert long.closure_gap is not None and abs(long.closure_gap) < 1e-12


@pytest.mark.parametrize(
    ("change", "factor"),
    [
        ({"usd_per_gpu_hour": 3.1}, "price"),
        ({"busy": 0.55}, "idle"),  # (mix and step efficiency move too, opposite: see below)
        ({"prompt_tokens_per_request": 4000.0}, "mix"),
        ({"step_seconds": 0.045}, "step_efficiency"),
        ({"batch": 12.0}, "batch"),
        ({"roofline_step_seconds": 0.02, "step_seconds": 0.04}, "model"),  # a longer context, same efficiency
    ],
)
def test_one_input_moves_only_its_factor(change: dict[str, float], factor: str) -> None:
    s = split(factors_of(sums_of(BASE)), factors_of(sums_of(replace(BASE, **change))))
    assert abs(s.total_usd_per_1m) > 0.01
    by = {t.name: t for t in s.terms}
    assert s.terms[0].name == factor
    assert by[factor].usd_per_1m == pytest.approx(s.total_usd_per_1m, rel=1e-9)
    # prefill's share is of the window: where the GPU idles part of it the share reads low by that
    # part, and mix and step efficiency move opposite by the same dollars
    if "busy" in change:
        pair = by["mix"].usd_per_1m + by["step_efficiency"].usd_per_1m
        assert abs(pair) <= 1e-9 * abs(s.total_usd_per_1m)
    for t in s.terms[1:]:
        if t.name not in ("mix", "step_efficiency") or "busy" not in change:
            assert abs(t.usd_per_1m) <= 1e-9 * abs(s.total_usd_per_1m), t
    assert s.closure_gap_before is not None and abs(s.closure_gap_before) < 1e-12


def test_longer_steps_raise_the_cost_by_the_step_factor_in_dollars() -> None:
    before, after = sums_of(BASE), sums_of(replace(BASE, step_seconds=0.045))
    s = split(factors_of(before), factors_of(after))
    measured = (
        after["cost_usd"] / after["generation_tokens"] - before["cost_usd"] / before["generation_tokens"]
    ) * 1e6
    assert s.total_usd_per_1m == pytest.approx(measured, rel=1e-12)
    assert s.total_usd_per_1m > 0 and s.terms[0].share == pytest.approx(1.0)
    assert one_line(s).startswith(f"+${measured:.2f}/1M: step efficiency +${measured:.2f}")


positive = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False, allow_infinity=False)
ratio = st.floats(min_value=0.05, max_value=1.0)


@st.composite
def inputs(draw: st.DrawFn) -> Inputs:
    step_min = draw(st.floats(min_value=1e-3, max_value=0.1))
    return Inputs(
        usd_per_gpu_hour=draw(positive),
        gpus=draw(st.sampled_from([1.0, 2.0, 4.0, 8.0])),
        busy=draw(ratio),
        prompt_tokens_per_request=draw(st.floats(min_value=0.0, max_value=1e5)),
        step_seconds=step_min / draw(ratio),
        roofline_step_seconds=step_min,
        batch=draw(st.floats(min_value=1.0, max_value=512.0)),
        seconds=draw(st.floats(min_value=60.0, max_value=1e6)),
    )


def _noisy(s: dict[str, float], noise: float) -> dict[str, float]:
    """The series out of line with one another (a closure gap): the gauges read ``noise`` off."""
    return {**s, "running.s": s["running.s"] * noise, "roofline.s": s["roofline.s"] * min(1.0, noise)}


@settings(max_examples=300, deadline=None)
@given(inputs(), inputs(), st.floats(min_value=0.5, max_value=2.0), st.floats(min_value=0.5, max_value=2.0))
def test_shares_sum_to_the_measured_change(a: Inputs, b: Inputs, na: float, nb: float) -> None:
    sa, sb = _noisy(sums_of(a), na), _noisy(sums_of(b), nb)
    s = split(factors_of(sa), factors_of(sb))
    total = s.total_usd_per_1m
    measured = (sb["cost_usd"] / sb["generation_tokens"] - sa["cost_usd"] / sa["generation_tokens"]) * 1e6
    assert total == pytest.approx(measured, rel=1e-9, abs=1e-9 * s.before_usd_per_1m)
    # within 1e-9 of the change, or where large terms cancel of the largest term (a float sum is
    # exact to the rounding of its largest part, no better)
    scale = max(abs(total), max(abs(t.usd_per_1m) for t in s.terms))
    assert abs(math.fsum(t.usd_per_1m for t in s.terms) - total) <= 1e-9 * scale
    if total:
        assert abs(math.fsum(t.share for t in s.terms) - 1.0) <= 1e-9 * scale / abs(total)
    assert {t.name for t in s.terms} == {*FACTORS, "closure"}
    # each factor's share has the sign of its own change
    fa, fb = factors_of(sa), factors_of(sb)
    for t in s.terms:
        if t.name in FACTORS:
            va, vb = fa.values[t.name], fb.values[t.name]
            assert va is not None and vb is not None
            assert (t.usd_per_1m > 0) == (vb > va) or t.usd_per_1m == 0 or vb == va
    # the closure gaps are measured: product ÷ measured − 1
    pa = fa.product()
    assert pa is not None and fa.usd_per_token is not None
    assert s.closure_gap_before == pytest.approx(pa / fa.usd_per_token - 1, rel=1e-9, abs=1e-12)


def test_sglang_merges_mix_and_step_efficiency_and_says_so() -> None:
    b, a = sums_of(BASE), sums_of(replace(BASE, step_seconds=0.06))
    s = split(factors_of(b, "sglang"), factors_of(a, "sglang"))
    names = [t.name for t in s.terms]
    assert names[0] == "mix+step_efficiency"
    assert s.terms[0].label == "mix and step efficiency"
    assert "closure" not in names and s.closure_gap_before is None and s.closure_gap_after is None
    assert any(n.startswith("step efficiency: no decode step timing") for n in s.merged)
    assert math.fsum(t.usd_per_1m for t in s.terms) == pytest.approx(s.total_usd_per_1m, rel=1e-12)


def test_a_factor_absent_in_one_window_merges_its_pair() -> None:
    b = sums_of(BASE)
    a = {k: v for k, v in sums_of(replace(BASE, busy=0.5)).items() if not k.startswith("usage")}
    s = split(factors_of(b), factors_of(a))
    names = [t.name for t in s.terms]
    assert "price+idle" in names and "price" not in names and "idle" not in names
    # without the busy share, fewer sequences in decode cannot be told from a smaller batch per
    # step: the idle time reads as batch, and the merged price and idle carry only the price (none)
    assert s.terms[0].name == "batch"
    assert abs({t.name: t for t in s.terms}["price+idle"].usd_per_1m) < 1e-9 * s.total_usd_per_1m
    assert s.merged == ("idle: no NVML busy time (usage basis)",)


def test_zero_and_absent_sums_are_absent_not_zero() -> None:
    f = factors_of({"cost_usd": 1.0, "gpu_seconds": 3600.0, "generation_tokens": 1e5, "usage_usd": 0.0})
    assert f.values["idle"] is None and f.values["batch"] is None and f.values["model"] is None
    assert f.usd_per_token == pytest.approx(1e-5)
    with pytest.raises(ExplainError, match="second window"):
        split(f, factors_of({"cost_usd": 1.0, "gpu_seconds": 3600.0, "generation_tokens": 0.0}))


def test_impossible_ratios_are_absent() -> None:
    s = sums_of(BASE)
    f = factors_of({**s, "usage_usd": s["cost_usd"] * 1.2, "roofline.s": s["roofline.w"] * 1.5})
    assert f.values["idle"] is None and f.values["step_efficiency"] is None


def test_windows_aggregate_as_ratios_of_sums() -> None:
    a, b = sums_of(BASE), sums_of(replace(BASE, usd_per_gpu_hour=10.0, gpus=8.0, seconds=60.0))
    both = {k: a[k] + b[k] for k in a}
    f = factors_of(both)
    assert f.values["price"] == pytest.approx(
        (a["cost_usd"] + b["cost_usd"]) / (a["gpu_seconds"] + b["gpu_seconds"])
    )
    mean_of_ratios = (a["cost_usd"] / a["gpu_seconds"] + b["cost_usd"] / b["gpu_seconds"]) / 2
    assert f.values["price"] != pytest.approx(mean_of_ratios)


@given(positive, positive)
def test_log_mean(a: float, b: float) -> None:
    m = log_mean(a, b)
    assert m == pytest.approx(log_mean(b, a), rel=1e-10)
    assert math.sqrt(a * b) * (1 - 1e-12) <= m <= (a + b) / 2 * (1 + 1e-12)
    assert log_mean(a, a) == a
    # L(a, b) · ln(a/b) = a − b to the rounding of the larger, at any ratio (the LMDI shares' sum)
    assert m * math.log(a / b) == pytest.approx(a - b, rel=1e-13, abs=1e-15 * max(a, b))


def test_log_mean_keeps_its_digits_at_a_ratio_of_a_billion() -> None:
    """Where a/b − 1 is near −1, log1p of it amplifies its rounding (found by the shares' property:
    a $0.27/token window against one of $5.7e-10 summed 1.1e-9 off the change)."""
    a, b = 5.747189854048964e-10, 0.26666666666666666
    assert log_mean(a, b) * math.log(a / b) == pytest.approx(a - b, rel=1e-15)


def _obs(kind: str = "vllm", **kw: float) -> tuple[DecodeObservation, ModelFigures]:
    """One replica of 70B fp16 on an H100 (no KV read): a step of 60 ms as run, 10 minutes."""
    args: dict[str, Any] = dict(
        engine_kind=kind, generation_tokens=16 * 600 / 0.06, decode_seconds=16 * 600.0,
        requests_running=16.0, kv_cache_usage_ratio=None, kv_capacity_tokens=None, replicas=1,
        bandwidth_bytes_per_s=3.35e12, window_seconds=600.0, prefill_tokens=1e6, peak_flops_per_s=989e12,
    )  # fmt: skip
    args.update(kw)
    return DecodeObservation(**args), ModelFigures(140e9, None, None, flops_per_token=2 * 70e9)


@pytest.mark.parametrize("prefill_seconds", [0.0, 60.0, 200.0])
def test_prefill_shares_read_the_share_and_what_the_efficiency_took_out(prefill_seconds: float) -> None:
    obs, fig = _obs()
    got = prefill_shares(obs, fig, prefill_seconds)
    assert got is not None
    share, taken = got
    floor = 1e6 * 2 * 70e9 / (989e12 * 600.0)  # the FLOPs at the peak: 0.236 of the window
    # at most what leaves the decode part of the 60 ms step at the 41.8 ms roofline step
    assert share == pytest.approx(min(max(floor, prefill_seconds / 600.0), 1 - (140e9 / 3.35e12) / 0.06))
    # the efficiency's own figure: 1 − the steps as run ÷ (step × efficiency)
    eff = decode_efficiency(obs, fig)
    assert eff is not None
    assert 1 - (140e9 / 3.35e12) / (0.06 * eff) == pytest.approx(taken, rel=1e-9)
    assert 0 <= taken <= share < 1


def test_prefill_shares_absent_or_whole() -> None:
    obs, fig = _obs()
    assert prefill_shares(obs, fig, None) is None  # no phase times
    assert prefill_shares(obs, fig, 600.0) is None  # prefills overlapping a whole replica's time
    assert prefill_shares(*_obs("sglang"), 60.0) is None  # no decode time at all
    tgi = prefill_shares(*_obs("tgi", decode_seconds=600.0, prefill_tokens=0.0), 60.0)
    assert tgi == (pytest.approx(0.1), pytest.approx(0.1))  # decode steps timed alone: all of it out


def test_where_the_efficiency_read_the_phase_times_its_share_is_the_share() -> None:
    # 100 finished requests, 150 s of prefill less the first-token step each holds: above the floor
    obs, fig = _obs(prefill_seconds=150.0, finished_requests=100.0)
    got = prefill_shares(obs, fig, 150.0)
    assert got is not None
    share, taken = got
    assert share == taken > 1e6 * 2 * 70e9 / (989e12 * 600.0)
    assert share < 150.0 / 600.0  # the held steps are not prefill


def test_the_phase_time_share_stands_where_the_request_seconds_overlap_the_replicas_time() -> None:
    # 8,000 short requests finished, each holding its first-token step (60 ms as run) in its prefill
    # time: of 630 request-seconds of prefill (1.05 of the window: past a replica's time), 480 s are
    # those steps and 150 s (0.25 of the window) prefill work
    obs, fig = _obs(prefill_seconds=630.0, finished_requests=8000.0, prefill_tokens=1e5)
    got = prefill_shares(obs, fig, 630.0)
    assert got is not None
    share, taken = got
    assert share == taken == pytest.approx((630.0 - 8000.0 * 0.06) / 600.0)
    # the same request-seconds without the finished requests' count: only the raw figure, absent
    obs, fig = _obs(prefill_seconds=630.0, prefill_tokens=1e5)
    assert prefill_shares(obs, fig, 630.0) is None
