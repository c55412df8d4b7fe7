"""Decode efficiency against the bandwidth roofline: hand-computed values (agent.cost.efficiency)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agent.cost.efficiency import (
    DecodeObservation,
    ModelFigures,
    decode_efficiency,
    mean_decode_batch,
    min_step_seconds,
)

H100_BW = 3.35e12  # bytes/s
W70 = 140e9  # bytes, 70B fp16
KV70 = 327_680.0  # bytes per token, 70B GQA fp16
FIG = ModelFigures(W70, KV70, 100_000.0)


def obs(**kw: object) -> DecodeObservation:
    base: dict[str, object] = {
        "engine_kind": "vllm",
        "generation_tokens": 1000.0,
        "decode_seconds": 100.0,
        "requests_running": 8.0,
        "kv_cache_usage_ratio": 0.5,
        "kv_capacity_tokens": None,
        "replicas": 1,
        "bandwidth_bytes_per_s": H100_BW,
    }
    base.update(kw)
    return DecodeObservation(**base)  # type: ignore[arg-type]


def test_single_stream_reference_70b_on_one_h100() -> None:
    # DESIGN.md: 70B fp16 on one H100 ≈ 24 tok/s single-stream, i.e. a fastest step of 41.8 ms
    assert 1.0 / min_step_seconds(W70, 0.0, KV70, H100_BW) == pytest.approx(23.93, abs=0.01)


def test_request_seconds_give_the_per_sequence_step() -> None:
    # measured step 100 s / 1000 tokens = 0.1 s; fastest (140e9 + 50,000 × 327,680) / 3.35e12 = 46.68 ms
    assert decode_efficiency(obs(), FIG) == pytest.approx(0.46682, rel=1e-4)


def test_the_figure_does_not_move_with_wall_clock_time_or_batch() -> None:
    # the same per-sequence step at twice the traffic: twice the tokens and decode seconds
    assert decode_efficiency(
        obs(generation_tokens=2000.0, decode_seconds=200.0, requests_running=16.0), FIG
    ) == (pytest.approx(decode_efficiency(obs(), FIG)))


def test_batch_seconds_count_one_step_per_forward_of_the_whole_batch() -> None:
    # TGI: 12.5 s of decode forwards for 1000 tokens at batch 8 → 125 steps of 0.1 s
    got = decode_efficiency(obs(engine_kind="tgi", decode_seconds=12.5), FIG)
    assert got == pytest.approx(0.46682, rel=1e-4)


def test_data_parallel_ranks_each_get_their_share_of_the_bandwidth() -> None:
    # two ranks over 2 GPUs: each replica reads its weights at one GPU's bandwidth
    one = decode_efficiency(obs(), FIG)
    two = decode_efficiency(obs(replicas=2, bandwidth_bytes_per_s=2 * H100_BW), FIG)
    assert two == pytest.approx(one)


def test_the_engine_reported_kv_capacity_wins_over_the_config() -> None:
    # the engine says 20,000 tokens (a deploy shrank the cache): resident = 10,000 tokens
    got = decode_efficiency(obs(kv_capacity_tokens=20_000.0), FIG)
    assert got == pytest.approx((140e9 + 10_000 * KV70) / H100_BW / 0.1)


@pytest.mark.parametrize(
    "kw",
    [
        {"engine_kind": "sglang"},  # no decode-time series
        {"engine_kind": "triton"},
        {"decode_seconds": None},
        {"decode_seconds": 0.0},
        {"generation_tokens": 0.0},
        {"bandwidth_bytes_per_s": 0.0},  # unknown GPU
    ],
)
def test_absent_not_guessed(kw: dict[str, object]) -> None:
    assert decode_efficiency(obs(**kw), FIG) is None


def test_unknown_weights_mean_no_figure() -> None:
    assert decode_efficiency(obs(), ModelFigures(None, KV70, 1.0)) is None


def test_the_inter_token_latency_is_the_step_where_the_window_observed_it() -> None:
    # 400 intervals summing to 32 s: a mean step of 0.08 s, observed as the steps ran, wins over the
    # request-seconds of requests that happened to finish in the window (100 s / 1000 tokens)
    got = decode_efficiency(obs(itl_seconds=32.0, itl_count=400.0), FIG)
    assert got == pytest.approx((140e9 + 50_000 * KV70) / H100_BW / 0.08)
    # no interval observed: back to decode seconds per token
    assert decode_efficiency(obs(itl_seconds=0.0, itl_count=0.0), FIG) == pytest.approx(0.46682, rel=1e-4)
    # TGI's decode time is engine time per forward: its own path
    assert decode_efficiency(
        obs(engine_kind="tgi", decode_seconds=12.5, itl_seconds=1.0, itl_count=1000.0), FIG
    ) == (pytest.approx(0.46682, rel=1e-4))


@pytest.mark.parametrize(
    ("decode_seconds", "present"),
    [(100.0, True), (46.682, True), (46.0, False), (10.0, False)],
)
def test_a_step_faster_than_the_roofline_is_impossible_and_absent(
    decode_seconds: float, present: bool
) -> None:
    # the fastest step is 46.68 ms; 1000 tokens in 46 request-seconds would beat peak bandwidth
    got = decode_efficiency(obs(decode_seconds=decode_seconds), FIG)
    assert (got is not None) is present
    assert got is None or 0.0 < got <= 1.0


def test_a_coarse_window_takes_its_batch_from_the_decode_counter_not_the_one_instant_gauge() -> None:
    # 5-minute history: the gauges read 16 running and half the cache at the scrape instant, but
    # 2,400 request-seconds of decode over 300 s is a mean batch of 8: the resident cache was half
    # what the instant shows (25,000 tokens at the instant's context per sequence)
    coarse = obs(
        decode_seconds=2400.0, generation_tokens=24_000.0, requests_running=16.0, window_seconds=300.0
    )
    assert decode_efficiency(coarse, FIG) == pytest.approx((140e9 + 25_000 * KV70) / H100_BW / 0.1)
    # a daemon tick (60 s): its batch from the counter too (the instant is one reading of a population
    # that moves; its context per sequence scales to the counter's batch: resident 25,000), and a live
    # window's instant 2× off its mean is not refused (only a coarse window's is)
    tick = obs(decode_seconds=480.0, generation_tokens=4800.0, requests_running=16.0, window_seconds=60.0)
    assert decode_efficiency(tick, FIG) == pytest.approx((140e9 + 25_000 * KV70) / H100_BW / 0.1)
    far = obs(decode_seconds=240.0, generation_tokens=2400.0, requests_running=16.0, window_seconds=60.0)
    assert decode_efficiency(far, FIG) == pytest.approx((140e9 + 12_500 * KV70) / H100_BW / 0.1)
    # TGI's decode time is engine time, not request-seconds: no batch in it
    assert mean_decode_batch("tgi", 2400.0, 300.0) is None
    assert mean_decode_batch("vllm", 2400.0, 300.0) == 8.0
    # at every window length; no decode time, no batch
    assert mean_decode_batch("vllm", 960.0, 120.0) == 8.0
    assert mean_decode_batch("vllm", 952.0, 119.0) == 8.0
    assert mean_decode_batch("vllm", 80.0, 10.0) == 8.0
    assert mean_decode_batch("vllm", 80.0, 0.0) is None
    assert mean_decode_batch("vllm", 0.0, 300.0) is None
    assert mean_decode_batch("vllm", 0.6, 300.0) == pytest.approx(0.002)  # one short request is a batch
    assert mean_decode_batch("vllm", None, 300.0) is None
    # a gauge that read no running sequence cannot say the context per sequence: no figure (it was the
    # cache as read, and on bursty traffic those windows read up to 2× too low)
    idle = obs(decode_seconds=2400.0, generation_tokens=24_000.0, requests_running=0.0, window_seconds=300.0)
    assert decode_efficiency(idle, FIG) is None


@pytest.mark.parametrize(
    ("decode_seconds", "known"),
    [(2400.0, True), (9600.0, True), (9601.0, False), (2399.0, False), (1200.0, False)],
)
def test_a_coarse_window_whose_instant_is_more_than_2x_off_its_mean_batch_has_no_efficiency(
    decode_seconds: float, known: bool
) -> None:
    # the gauge read 16 running; the counter's mean batch over 300 s is decode_seconds / 300: from
    # 8 to 32 the instant's context per sequence stands for the window, beyond it (a lull or a
    # burst at the instant) it does not
    w = obs(
        decode_seconds=decode_seconds, generation_tokens=24_000.0, requests_running=16.0, window_seconds=300.0
    )
    assert (decode_efficiency(w, FIG) is not None) is known
    # a daemon tick is never judged so: its gauge is the window's
    tick = obs(
        decode_seconds=decode_seconds / 5,
        generation_tokens=4800.0,
        requests_running=16.0,
        window_seconds=60.0,
    )
    assert decode_efficiency(tick, FIG) is not None


def test_the_batch_is_the_inter_token_intervals_the_window_observed_where_it_has_them() -> None:
    """A request's inter-token intervals add up to its decode time and each is observed as its step
    runs, so the window's Σ ITL is the request-seconds of decode it accrued itself; the decode
    request-seconds are added when requests finish, so after a burst they hold the drained batch's
    whole lifetimes."""
    # 60 s at 8 sequences: Σ ITL 480 s; the finished requests' decode time says 12 (720 s)
    assert mean_decode_batch("vllm", 720.0, 60.0, 480.0) == 8.0
    # no interval observed (a page without the histogram, or none in the window): the request-seconds
    for itl in (None, 0.0):
        assert mean_decode_batch("vllm", 720.0, 60.0, itl) == 12.0
    assert mean_decode_batch("vllm", None, 60.0, 0.0) is None
    assert mean_decode_batch("vllm", 0.0, 60.0, None) is None
    assert mean_decode_batch("vllm", 720.0, 0.0, 480.0) is None
    assert mean_decode_batch("tgi", 720.0, 60.0, 480.0) is None  # engine time, not request-seconds
    assert mean_decode_batch("vllm", 720.0, 60.0, 0.5) == pytest.approx(0.5 / 60.0)  # under a second
    assert mean_decode_batch("vllm", 720.0, 0.5, 4.0) == 8.0  # a window under a second is a window
    # the figure: 4,800 intervals of 0.1 s over 60 s with the gauge at 8 sequences and half the cache in
    # use (50,000 tokens): resident 50,000 at the intervals' batch of 8, not 75,000 at the finished
    # requests' 12
    drained = obs(
        decode_seconds=720.0, generation_tokens=4800.0, requests_running=8.0, window_seconds=60.0,
        itl_seconds=480.0, itl_count=4800.0,
    )  # fmt: skip
    assert decode_efficiency(drained, FIG) == pytest.approx((140e9 + 50_000 * KV70) / H100_BW / 0.1)
    # a coarse window is judged against the intervals' batch too: the finished requests' 48 is 3× the
    # gauge's 16, the intervals' 24 is not
    coarse = obs(
        decode_seconds=14_400.0, generation_tokens=72_000.0, requests_running=16.0, window_seconds=300.0,
        itl_seconds=7200.0, itl_count=72_000.0,
    )  # fmt: skip
    assert decode_efficiency(coarse, FIG) == pytest.approx((140e9 + 75_000 * KV70) / H100_BW / 0.1)
    assert decode_efficiency(replace(coarse, itl_seconds=None, itl_count=None), FIG) is None
