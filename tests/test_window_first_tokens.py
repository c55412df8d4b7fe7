"""The window join hands the decode efficiency every count it reads (agent/cost/window.py): the
window's first tokens (its TTFT histogram's count) beside its finished requests (the e2e count),
so a window after a burst, whose finished requests were prefilled before it, counts only its own
prefills. Two vLLM scrapes 10 s apart through the real WindowJoiner; the efficiency it stores is
the estimator's over the same counts, not the one that counts the finished requests as prefills."""

from __future__ import annotations

import pytest

from agent.cost.efficiency import DecodeObservation, ModelFigures, decode_efficiency
from agent.cost.inputs import EngineSpec, GpuRate, PriceTable
from agent.cost.window import WindowJoiner
from agent.samples import EngineScrape, GpuSample, Histogram, ModelSignals, NvmlRound

T0 = 1_700_000_000.0  # epoch seconds
WINDOW = 10.0  # seconds between the two scrapes
GPU = "NVIDIA H100 80GB HBM3"
H100_BW = 3.35e12  # bytes/s of HBM3 on an H100 SXM (the hardware table's figure)
H100_PEAK = 989e12  # dense BF16 FLOP/s (the hardware table's figure)
W = 16e9  # bytes of weights read per decode step
F = 16e9  # FLOPs per token (2 × 8 B parameters)
TOKENS = 2000.0  # output tokens the window made
STEP = 0.0065  # seconds per decode step as run
FINISHED = 40.0  # requests finished in the window (their phase times are in it)
FIRST = 10.0  # first tokens the window made: the rest of the finished were prefilled before it
PREFILL = 40 * (STEP + 0.02)  # request-seconds of prefill of the finished: each its first step + 20 ms


def hist(count: float, total: float) -> Histogram:
    return Histogram(((1.0, count), (float("inf"), count)), total, count)


def signals(i: int) -> ModelSignals:
    return ModelSignals(
        "llama",
        prompt_tokens_total=5000.0 * i,
        generation_tokens_total=TOKENS * i,
        requests_running=32.0,
        decode_seconds_total=TOKENS * STEP * i,
        prefill_seconds_total=PREFILL * i,
        ttft_seconds=hist(FIRST * i, 0.05 * FIRST * i),
        e2e_seconds=hist(FINISHED * i, 3.0 * FINISHED * i),
        itl_seconds=hist(TOKENS * i, TOKENS * STEP * i),
    )


def test_the_join_counts_the_windows_prefills_by_its_first_tokens() -> None:
    spec = EngineSpec("vllm-0", "vllm", gpus=(0,), model_version="v1", weights_bytes=W, flops_per_token=F)
    prices = PriceTable(gpus=(GpuRate("H100", 4.0),), source="test")
    joiner = WindowJoiner("n1", [spec], prices)
    made = []
    for i in range(2):
        t = T0 + i * WINDOW
        joiner.add_round(NvmlRound(t, True, (GpuSample(0, "GPU-0", GPU, t, util_gpu_ratio=0.9),)))
        scrape = EngineScrape("vllm-0", "vllm", t, True, 0.01, (signals(i),))
        made += joiner.close_tick(t, {"vllm-0": scrape}).windows
    (w,) = made
    obs = DecodeObservation(
        engine_kind="vllm", generation_tokens=TOKENS, decode_seconds=TOKENS * STEP,
        requests_running=32.0, kv_cache_usage_ratio=None, kv_capacity_tokens=None, replicas=1,
        bandwidth_bytes_per_s=H100_BW, window_seconds=WINDOW, itl_seconds=TOKENS * STEP,
        itl_count=TOKENS, prefill_tokens=None, peak_flops_per_s=H100_PEAK, prefill_seconds=PREFILL,
        finished_requests=FINISHED, first_tokens=FIRST,
    )  # fmt: skip
    figures = ModelFigures(W, None, None, F)
    own = decode_efficiency(obs, figures)
    finished = decode_efficiency(DecodeObservation(**{**_fields(obs), "first_tokens": None}), figures)
    assert own is not None and finished is not None
    assert w.roofline_ratio == pytest.approx(own, rel=1e-12)
    # the finished requests' 40 prefills are four times the window's own: counted as its prefills
    # they take four times the prompt work out of the step, and the figure reads high
    assert finished > own * (1 + 0.05)


def _fields(obs: DecodeObservation) -> dict[str, object]:
    return {f: getattr(obs, f) for f in obs.__dataclass_fields__}
