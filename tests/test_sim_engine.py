"""The simulated engine's physics against DESIGN.md's reference figures, and its queue model
against Little's law."""

from __future__ import annotations

import itertools
import math

import pytest

from agent.hardware import A100_SXM_80GB as A100_80GB
from agent.hardware import H100_SXM, H200
from infercost_sim.engine import (
    LLAMA_70B,
    LLAMA_70B_FP8,
    MISTRAL_7B,
    QWEN_14B,
    TTFT_BUCKETS,
    Deployment,
    SimEngine,
    Traffic,
    request_tokens_buckets,
)

T0 = 1_700_006_400.0  # 2023-11-15 00:00 UTC, a Wednesday


def flat(rps: float, **kw: float) -> Traffic:
    """Constant traffic: no daily curve, no weekend dip, no noise."""
    return Traffic(peak_rps=rps, trough_ratio=1.0, weekend_ratio=1.0, noise_sigma=0.0, **kw)  # type: ignore[arg-type]


def gen_rate(engine: SimEngine, start: float, seconds: float, step: float = 60.0) -> float:
    """Generation tokens/s over [start, start + seconds], advancing in ``step`` increments."""
    engine.advance_to(start)
    before = engine.state().generation_tokens_total
    t = start
    while t < start + seconds:
        t = min(start + seconds, t + step)
        engine.advance_to(t)
    return (engine.state().generation_tokens_total - before) / seconds


def test_kv_bytes_per_token_llama_70b_gqa() -> None:
    # 2 × 80 layers × 8 KV heads × 128 head_dim × 2 bytes
    assert LLAMA_70B.kv_bytes_per_token == 327_680
    assert LLAMA_70B_FP8.kv_bytes_per_token == 163_840


@pytest.mark.parametrize(
    ("gpu", "expected_tok_s"),
    [(H100_SXM, 24.0), (A100_80GB, 14.0), (H200, 4.8e12 / 141.2e9)],
)
def test_single_stream_ceiling_70b_fp16(gpu: object, expected_tok_s: float) -> None:
    dep = Deployment(LLAMA_70B, gpu, bandwidth_efficiency=1.0)  # type: ignore[arg-type]
    assert dep.decode_tokens_per_second(1, 0) == pytest.approx(expected_tok_s, rel=0.10)
    assert dep.roofline_tokens_per_second() == pytest.approx(expected_tok_s, rel=0.10)


def test_default_efficiency_is_below_the_roofline() -> None:
    dep = Deployment(LLAMA_70B, H100_SXM)
    ratio = dep.decode_tokens_per_second(1, 1000) / dep.roofline_tokens_per_second()
    assert 0.75 < ratio < 0.9


def test_throughput_rises_with_batch_then_saturates() -> None:
    dep = Deployment(LLAMA_70B_FP8, H100_SXM, tp=2)
    batches = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    tps = [dep.decode_tokens_per_second(b, 1000) for b in batches]
    assert all(b > a for a, b in itertools.pairwise(tps))
    gains = [b / a for a, b in itertools.pairwise(tps)]
    assert gains[0] > 1.9  # memory bound: a second sequence is almost free
    assert gains[-1] < 1.1  # compute bound at 256: doubling the batch buys little
    assert tps[-1] / tps[0] > 50  # continuous batching's whole point


def test_kv_capacity_and_memory() -> None:
    assert not Deployment(LLAMA_70B, H100_SXM, tp=1).fits()  # 141 GB of weights on 80 GB
    dep = Deployment(LLAMA_70B, H100_SXM, tp=4)
    assert dep.fits()
    assert dep.weights_per_gpu_bytes == pytest.approx(35.3e9)
    # vLLM takes 90 % of HBM at start-up; NVML sees that plus the CUDA context
    assert 0.9 * H100_SXM.memory_bytes < dep.memory_used_per_gpu_bytes < H100_SXM.memory_bytes
    assert dep.kv_capacity_tokens == pytest.approx(dep.kv_pool_bytes / 327_680)
    with pytest.raises(ValueError, match="does not fit"):
        SimEngine(Deployment(LLAMA_70B, H100_SXM), flat(1.0), start=T0)


def test_request_tokens_buckets_are_vllms_1_2_5_series() -> None:
    assert request_tokens_buckets(32768)[:6] == (1.0, 2.0, 5.0, 10.0, 20.0, 50.0)
    assert request_tokens_buckets(32768)[-1] == 20000.0
    assert request_tokens_buckets(131072)[-1] == 100000.0


def test_daily_curve() -> None:
    tr = Traffic(peak_rps=10.0, trough_ratio=0.2, trough_hour=4.0, weekend_ratio=0.5)
    assert tr.rate(T0 + 16 * 3600) == pytest.approx(10.0)  # Wednesday 16:00
    assert tr.rate(T0 + 4 * 3600) == pytest.approx(2.0)  # Wednesday 04:00
    assert tr.rate(T0 + 3 * 86400 + 16 * 3600) == pytest.approx(5.0)  # Saturday 16:00


def test_littles_law_below_capacity() -> None:
    dep = Deployment(MISTRAL_7B, H100_SXM)
    probe = SimEngine(dep, flat(1.0), start=T0)
    lam = 0.5 * probe.capacity_rps()
    engine = SimEngine(dep, flat(lam), start=T0, seed=3)
    engine.advance_to(T0 + 600)  # warm up
    s0 = engine.state()
    rate = gen_rate(engine, T0 + 600, 3600)
    s1 = engine.state()
    assert rate == pytest.approx(lam * engine.mean_output_tokens, rel=0.05)
    finished = sum(s1.finished_total.values()) - sum(s0.finished_total.values())
    assert finished == pytest.approx(lam * 3600, rel=0.05)
    assert s1.finished_total["abort"] == 0
    assert s1.requests_waiting == 0
    assert 0 < s1.requests_running < dep.max_num_seqs
    # every completed request is in the latency histograms, once
    done = s1.finished_total["stop"] + s1.finished_total["length"]
    for name in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_generation_tokens"):
        assert s1.histograms[name][-1] == (math.inf, done)
    # the output-length histogram sums to about the generation counter
    assert s1.histogram_sums["request_generation_tokens"] == pytest.approx(
        s1.generation_tokens_total, rel=0.05
    )
    load = engine.gpu_load()
    assert 0.5 < load.util_gpu_ratio <= 1.0
    assert 0.3 < load.dram_bw_ratio < 0.9
    assert load.memory_used_bytes == dep.memory_used_per_gpu_bytes


def test_saturation_queues_and_caps_throughput() -> None:
    dep = Deployment(LLAMA_70B, H100_SXM, tp=4)
    probe = SimEngine(dep, flat(1.0), start=T0)
    cap = probe.capacity_rps()
    engine = SimEngine(dep, flat(2.0 * cap), start=T0, seed=4)
    rate = gen_rate(engine, T0 + 1800, 1800)
    s = engine.state()
    assert rate == pytest.approx(cap * engine.mean_output_tokens, rel=0.05)
    assert s.requests_waiting > 100
    assert s.finished_total["abort"] > 0  # clients give up
    assert s.requests_running == dep.max_num_seqs
    ttft = dict(s.histograms["time_to_first_token_seconds"])
    assert ttft[10.0] < 0.5 * ttft[math.inf]  # most requests waited more than 10 s


def test_kv_cache_limit_preempts() -> None:
    dep = Deployment(QWEN_14B, H100_SXM)
    engine = SimEngine(dep, flat(30.0, prompt_mean_tokens=4000.0), start=T0, seed=5)
    engine.advance_to(T0 + 1800)
    s = engine.state()
    assert s.kv_cache_usage_ratio > 0.95
    assert s.preemptions_total > 0
    assert s.requests_running < dep.max_num_seqs  # the KV cache binds before max_num_seqs


def test_throughput_factor_slows_a_saturated_engine() -> None:
    dep = Deployment(LLAMA_70B_FP8, H100_SXM, tp=2)
    engine = SimEngine(dep, flat(50.0), start=T0, seed=6)
    before = gen_rate(engine, T0 + 1800, 1800)
    engine.set_version("2024-10", 0.65)
    after = gen_rate(engine, T0 + 5400, 1800)
    assert engine.state().version == "2024-10"
    assert after / before == pytest.approx(0.65, rel=0.03)


def test_capacity_routed_traffic_follows_the_build() -> None:
    dep = Deployment(LLAMA_70B_FP8, H100_SXM, tp=2)
    probe = SimEngine(dep, flat(1.0), start=T0)
    traffic = Traffic(
        peak_rps=0.5 * probe.capacity_rps(), trough_ratio=1.0, noise_sigma=0.0, capacity_routed=True
    )
    engine = SimEngine(dep, traffic, start=T0, seed=7)
    before = gen_rate(engine, T0 + 900, 1800)
    engine.set_version("2024-10", 0.65)
    after = gen_rate(engine, T0 + 3600, 1800)
    assert after / before == pytest.approx(0.65, rel=0.05)
    assert engine.gpu_load().util_gpu_ratio > 0.9  # the GPUs stay as busy: more cost per token


def test_same_seed_same_schedule_is_deterministic() -> None:
    dep = Deployment(MISTRAL_7B, H100_SXM)
    a = SimEngine(dep, Traffic(peak_rps=20.0), start=T0, seed=9)
    b = SimEngine(dep, Traffic(peak_rps=20.0), start=T0, seed=9)
    for t in (T0 + 100, T0 + 3700, T0 + 9000):
        a.advance_to(t)
        b.advance_to(t)
    assert a.state() == b.state()


def test_coarse_and_fine_advances_agree() -> None:
    dep = Deployment(MISTRAL_7B, H100_SXM)
    traffic = Traffic(peak_rps=20.0, noise_sigma=0.0)  # the daily curve only: isolate the time step
    fine = SimEngine(dep, traffic, start=T0, seed=1)
    coarse = SimEngine(dep, traffic, start=T0, seed=1)
    half_day = 43200.0
    gen_rate(fine, T0, half_day, step=60.0)  # ticks of 1 s
    gen_rate(coarse, T0, half_day, step=half_day)  # 240 ticks of 3 minutes
    f, c = fine.state(), coarse.state()
    assert c.generation_tokens_total == pytest.approx(f.generation_tokens_total, rel=0.02)
    assert c.prompt_tokens_total == pytest.approx(f.prompt_tokens_total, rel=0.02)


def test_time_never_goes_backwards() -> None:
    engine = SimEngine(Deployment(MISTRAL_7B, H100_SXM), flat(10.0), start=T0)
    engine.advance_to(T0 + 600)
    s = engine.state()
    engine.advance_to(T0 + 300)
    assert engine.state() == s


def test_histogram_buckets_are_vllms() -> None:
    engine = SimEngine(Deployment(MISTRAL_7B, H100_SXM), flat(10.0), start=T0)
    engine.advance_to(T0 + 120)
    les = [le for le, _ in engine.state().histograms["time_to_first_token_seconds"]]
    assert les == [*TTFT_BUCKETS, math.inf]
