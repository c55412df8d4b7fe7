"""Decode efficiency at its edges (agent/cost/efficiency.py; the formula is the detection owner's):
each case is a behaviour a surviving mutant showed no test pinned, computed by hand."""

from __future__ import annotations

import pytest

from agent.cost.efficiency import DecodeObservation, ModelFigures, decode_efficiency, prefill_share_floor

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


# -- the prefill share's floor: prompt FLOPs at the GPUs' peak over the window -------------------

PEAK = 1e15  # FLOP/s
F = 1e11  # FLOPs per token


def prefilling(**kw: object) -> DecodeObservation:
    """10 s window, 25,000 tokens prefilled: 25e3 × 1e11 / (1e15 × 10) = a floor of 0.25."""
    base: dict[str, object] = {"window_seconds": 10.0, "prefill_tokens": 25_000.0, "peak_flops_per_s": PEAK}
    return obs(**{**base, **kw})


def test_the_prefill_floor_is_prompt_flops_at_peak_over_the_window() -> None:
    assert prefill_share_floor(prefilling(), ModelFigures(W, None, None, F)) == pytest.approx(0.25)
    assert prefill_share_floor(
        prefilling(window_seconds=5.0), ModelFigures(W, None, None, F)
    ) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("kw", "flops"),
    [
        ({"prefill_tokens": None}, F),
        ({"prefill_tokens": 0.0}, F),
        ({"prefill_tokens": -1000.0}, F),  # a counter glitch is no prefill
        ({}, None),  # the model's FLOPs per token unknown
        ({}, 0.0),
        ({"peak_flops_per_s": 0.0}, F),
        ({"peak_flops_per_s": -1.0}, F),
        ({"window_seconds": 0.0}, F),
    ],
)
def test_the_prefill_floor_is_0_when_an_input_is_unknown(kw: dict[str, object], flops: float | None) -> None:
    fig = ModelFigures(W, None, None, flops)
    assert prefill_share_floor(prefilling(**kw), fig) == 0.0
    # and the figure is the step as run: ideal / 0.1 s
    assert decode_efficiency(prefilling(**kw), fig) == pytest.approx((W / H100_BW) / 0.1)


def test_request_timed_steps_lose_the_floor_of_their_prefill_share() -> None:
    ideal = W / H100_BW
    fig = ModelFigures(W, None, None, F)
    # decode seconds: step 0.1 s, a quarter of it at least prefill: decode step ≤ 0.075 s
    assert decode_efficiency(prefilling(), fig) == pytest.approx(ideal / 0.075)
    # the inter-token latency is the step where observed: 0.09 s × (1 − 0.25)
    got = decode_efficiency(prefilling(itl_seconds=90.0, itl_count=1000.0), fig)
    assert got == pytest.approx(ideal / (0.09 * 0.75))


def test_batch_seconds_time_decode_passes_alone_and_keep_their_step() -> None:
    fig = ModelFigures(W, None, None, F)
    assert decode_efficiency(prefilling(engine_kind="tgi"), fig) == pytest.approx((W / H100_BW) / 0.1)


def test_a_prefill_floor_of_1_or_a_figure_it_pushes_above_1_is_absent() -> None:
    fig = ModelFigures(W, None, None, F)
    # 1e5 tokens × 1e11 / (1e15 × 10) = exactly 1: no decode time left
    assert decode_efficiency(prefilling(prefill_tokens=100_000.0), fig) is None
    assert decode_efficiency(prefilling(prefill_tokens=200_000.0), fig) is None
    # floor 0.5: 41.79 ms / 50 ms = 0.836, a figure; floor 0.75: 41.79 / 25 ms = 1.67, impossible
    assert decode_efficiency(prefilling(prefill_tokens=50_000.0), fig) == pytest.approx((W / H100_BW) / 0.05)
    assert decode_efficiency(prefilling(prefill_tokens=75_000.0), fig) is None


@pytest.mark.parametrize(("accepted", "present"), [(None, True), (0.0, True), (1.0, False), (500.0, False)])
def test_a_window_with_accepted_draft_tokens_has_no_figure(accepted: float | None, present: bool) -> None:
    got = decode_efficiency(obs(spec_accepted_tokens=accepted), ModelFigures(W, None, None))
    assert (got is not None) is present
    if present:
        assert got == pytest.approx((W / H100_BW) / 0.1)
