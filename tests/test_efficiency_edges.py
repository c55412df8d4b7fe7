"""Decode efficiency at its edges (agent/cost/efficiency.py; the formula is the detection owner's):
each case is a behaviour a surviving mutant showed no test pinned, computed by hand."""

from __future__ import annotations

import pytest

from agent.cost.efficiency import DecodeObservation, ModelFigures, decode_efficiency

H100_BW = 3.35e12  # bytes/s
W = 140e9  # bytes of weights
KV = 327_680.0  # bytes per token


def obs(**kw: object) -> DecodeObservation:
    base: dict[str, object] = {
        "engine_kind": "vllm", "generation_tokens": 1000.0, "decode_seconds": 100.0,
        "requests_running": None, "kv_cache_usage_ratio": None, "kv_capacity_tokens": None,
        "replicas": 1, "bandwidth_bytes_per_s": H100_BW,
    }  # fmt: skip
    return DecodeObservation(**{**base, **kw})  # type: ignore[arg-type]


def test_small_but_positive_figures_still_give_an_efficiency() -> None:
    fig = ModelFigures(W, None, None)
    # half a second of decode for 1 token: step 0.5 s; ideal 140e9 / 3.35e12 = 41.79 ms
    assert decode_efficiency(obs(decode_seconds=0.5, generation_tokens=1.0), fig) == pytest.approx(
        (W / H100_BW) / 0.5
    )
    assert decode_efficiency(obs(bandwidth_bytes_per_s=2e12), fig) == pytest.approx((W / 2e12) / 0.1)
    # any positive bandwidth is a bandwidth (even 1 B/s): only ≤ 0 means unknown
    slow = obs(bandwidth_bytes_per_s=1.0, decode_seconds=1.5e14, generation_tokens=1000.0)
    assert decode_efficiency(slow, fig) == pytest.approx(W / 1.5e11)
    # a step the bandwidth could not have made (above the roofline) is absent
    assert decode_efficiency(obs(bandwidth_bytes_per_s=0.5e12), fig) is None


def test_without_kv_figures_only_the_weights_are_read() -> None:
    ideal = W / H100_BW
    assert decode_efficiency(obs(), ModelFigures(W, None, None)) == pytest.approx(ideal / 0.1)
    # a KV ratio without a capacity, or a capacity without a ratio: weights only
    assert decode_efficiency(obs(kv_cache_usage_ratio=0.5), ModelFigures(W, KV, None)) == pytest.approx(
        ideal / 0.1
    )
    assert decode_efficiency(obs(), ModelFigures(W, KV, 100_000)) == pytest.approx(ideal / 0.1)


def test_batch_seconds_count_running_sequences_per_replica() -> None:
    fig = ModelFigures(W, None, None)
    ideal = W / H100_BW
    # TGI: 100 batch-seconds, 3 running over 2 replicas = 1.5 per replica: step = 0.1 s × 1.5
    got = decode_efficiency(
        obs(engine_kind="tgi", requests_running=3.0, replicas=2, bandwidth_bytes_per_s=2 * H100_BW), fig
    )
    assert got == pytest.approx(ideal / (0.1 * 1.5))
    # running unknown: one sequence per step
    assert decode_efficiency(obs(engine_kind="tgi"), fig) == pytest.approx(ideal / 0.1)
