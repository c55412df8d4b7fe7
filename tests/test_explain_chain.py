"""The factor chain over many minutes (agent.cost.explain.chain_sums): each minute's factors as sums
that add (steps, roofline, decode and as-run GPU-seconds, busy GPU-seconds), so a longer window's
factors compose into its measured $/token where every minute's do; the minutes without every factor
as a term of their own; and the floor reading the efficiency's batch and resident KV (the window
join), so that one minute's chain closes whatever its gauge's instant says."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from test_explain import BASE, sums_of

from agent.cost.explain import FACTORS, factors_of, split, with_chain
from agent.cost.inputs import EngineSpec, GpuRate, PriceTable
from agent.cost.window import WindowJoiner
from agent.records import model_sums
from agent.samples import EngineScrape, GpuSample, Histogram, ModelSignals, NvmlRound

# a busy afternoon minute and a quiet night minute: batch, busy share and prefill share all differ
# (and the steps' length: the day's contexts are longer, its roofline step too)
DAY = replace(
    BASE, batch=96.0, busy=0.95, prompt_tokens_per_request=1500.0, seconds=60.0, step_seconds=0.04,
    roofline_step_seconds=0.03,
)  # fmt: skip
NIGHT = replace(
    BASE, batch=4.0, busy=0.3, prompt_tokens_per_request=300.0, seconds=60.0, step_seconds=0.03,
    roofline_step_seconds=0.01,
)  # fmt: skip


def added(*minutes: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for m in minutes:
        for k, v in m.items():
            out[k] = out.get(k, 0.0) + v
    return out


def test_minutes_that_close_compose_into_a_window_that_closes() -> None:
    day, night = sums_of(DAY), sums_of(NIGHT)
    for m in (day, night):
        gap = factors_of(m).closure_gap
        assert gap is not None and abs(gap) < 1e-12
    # the gauges' time-weighted means and the floor's token-weighted one do not compose: the day's
    # many tokens and the night's few put the product of means 1.8 % off the measured $/token
    means = factors_of(added(day, night)).closure_gap
    assert means is not None and abs(means) > 0.01
    chained = factors_of(added(with_chain(day), with_chain(night)))
    assert chained.closure_gap is not None and abs(chained.closure_gap) < 1e-12
    assert chained.coverage is None and chained.covered_share == 1.0


def test_the_chained_factors_are_ratios_of_the_minutes_sums() -> None:
    day, night = with_chain(sums_of(DAY)), with_chain(sums_of(NIGHT))
    f = factors_of(added(day, night))
    # step efficiency: decode GPU-s over roofline GPU-s of both minutes' steps, between the two
    # minutes' own (a mean weighted by their roofline time, not by their seconds)
    step = (day["chain.split_decode_gpu_seconds"] + night["chain.split_decode_gpu_seconds"]) / (
        day["chain.split_roofline_gpu_seconds"] + night["chain.split_roofline_gpu_seconds"]
    )
    assert f.values["step_efficiency"] == pytest.approx(step, rel=1e-12)
    # batch: the steps over the tokens (1 ÷ sequences per step), the day's many steps dominating
    tokens = day["generation_tokens"] + night["generation_tokens"]
    assert f.values["batch"] == pytest.approx((day["chain.steps"] + night["chain.steps"]) / tokens, rel=1e-12)
    for n in FACTORS:
        lo, hi = sorted((factors_of(day).values[n] or 0.0, factors_of(night).values[n] or 0.0))
        assert lo * (1 - 1e-12) <= (f.values[n] or 0.0) <= hi * (1 + 1e-12)


def test_a_slower_build_over_a_day_is_step_efficiency_alone() -> None:
    """Only the step's decode part changes, at every hour: the whole change is step efficiency (with
    the means of the old aggregation, batch and model took a share as the day's load mix weighed)."""
    before = added(with_chain(sums_of(DAY)), with_chain(sums_of(NIGHT)))
    slow = {k: replace(v, step_seconds=v.step_seconds * 1.5) for k, v in (("d", DAY), ("n", NIGHT))}
    after = added(with_chain(sums_of(slow["d"])), with_chain(sums_of(slow["n"])))
    s = split(factors_of(before), factors_of(after))
    by = {t.name: t.share for t in s.terms}
    assert by["step_efficiency"] == pytest.approx(1.0, abs=1e-9)
    assert math.fsum(t.usd_per_1m for t in s.terms) == pytest.approx(s.total_usd_per_1m, rel=1e-12)


def test_minutes_without_every_factor_are_a_term_of_their_own() -> None:
    """A minute the efficiency refused (no roofline split) still has price, idle and batch; its
    step as run is not split, and its part of the change is the coverage term, not the closure's."""
    refused = {k: v for k, v in sums_of(NIGHT).items() if not k.startswith(("roofline", "prefill_"))}
    before = added(with_chain(sums_of(DAY)), with_chain(sums_of(NIGHT)))
    after = added(with_chain(sums_of(replace(DAY, step_seconds=0.06))), with_chain(refused))
    fa = factors_of(after)
    assert fa.coverage is not None and 0.0 < fa.covered_share < 1.0
    assert fa.closure_gap is not None and abs(fa.closure_gap) < 1e-12  # the split minutes' gap
    s = split(factors_of(before), fa)
    by = {t.name: t for t in s.terms}
    assert s.terms[0].name == "step_efficiency" and "coverage" in by
    assert abs(by["closure"].usd_per_1m) < 1e-9 * s.before_usd_per_1m
    assert math.fsum(t.usd_per_1m for t in s.terms) == pytest.approx(s.total_usd_per_1m, rel=1e-9)


def one_window(gauge_running: float, itl: bool = False) -> dict[str, float]:
    """One minute through the real window join: 16 sequences by the decode request-seconds, steps of
    100 ms, the KV cache a quarter full at the scrape, the running gauge at ``gauge_running``; with
    ``itl`` an inter-token latency histogram too, whose intervals (9,500 of them, 100 fewer than the
    tokens: the first tokens) add up to 14 sequences over the minute."""
    spec = EngineSpec(
        "vllm-0", kind="vllm", gpus=(0,), weights_bytes=140e9, kv_bytes_per_token=327_680,
        kv_capacity_tokens=400_000,
    )  # fmt: skip
    joiner = WindowJoiner("n1", (spec,), PriceTable(gpus=(GpuRate("H100", 3.6),)))
    sums: dict[str, float] = {}
    for i, t in enumerate((1000.0, 1060.0)):
        gpu = GpuSample(0, "GPU-0", "NVIDIA H100 80GB HBM3", t, util_gpu_ratio=0.9)
        joiner.add_round(NvmlRound(t, True, (gpu,)))
        page = ModelSignals(
            "llama-70b",
            prompt_tokens_total=i * 20_000.0,
            generation_tokens_total=i * 16 * 60 / 0.1,
            prefill_seconds_total=i * 6.0,
            decode_seconds_total=i * 16 * 60.0,
            requests_running=gauge_running,
            kv_cache_usage_ratio=0.25,
            itl_seconds=Histogram(((0.1, i * 4750.0), (math.inf, i * 9500.0)), i * 14 * 60.0, i * 9500.0)
            if itl
            else None,
        )
        tick = joiner.close_tick(t, {"vllm-0": EngineScrape("vllm-0", "vllm", t, True, 0.01, (page,))})
        for w in tick.windows:
            sums = model_sums(w)
    return sums


@pytest.mark.parametrize("gauge", [16.0, 8.0, 24.0])
def test_one_minute_closes_whatever_its_gauges_instant(gauge: float) -> None:
    """The efficiency reads the context per sequence from the gauges' instant and the sequences
    from the counters; the floor (model and context) reads the same, so their ratio is the step as run
    over the counters' batch and the minute closes on its $/token. With the instant's resident KV in
    the floor (the gauge at half the counters' batch) the product read 16 % low."""
    f = factors_of(one_window(gauge))
    assert all(f.values[n] is not None for n in FACTORS)
    assert f.closure_gap is not None and abs(f.closure_gap) < 1e-9


@pytest.mark.parametrize("gauge", [14.0, 7.0])
def test_the_floor_reads_the_batch_of_the_inter_token_intervals(gauge: float) -> None:
    """Where the window observed inter-token intervals the efficiency's batch is theirs (14 here, not
    the decode request-seconds' 16), and so is the floor's: the minute's product misses its $/token
    by the first tokens alone, which end no interval (9,600 tokens ÷ 9,500 intervals − 1)."""
    f = factors_of(one_window(gauge, itl=True))
    assert f.closure_gap == pytest.approx(9600 / 9500 - 1, rel=1e-9)
