"""The cost model's contract, checked against hand-computed numbers and DESIGN.md's reference figures."""

from __future__ import annotations

import pytest

from agent.cost import model as cm


def test_reference_gpu_at_1_5_per_hour_200_tok_s_is_2_08_per_million() -> None:
    # 1.5 / (200 × 3600) × 1e6 = 2.0833…
    cost = cm.gpu_time_cost(1.5, 3600)
    assert cm.usd_per_million(cost, 200 * 3600) == pytest.approx(2.0833333, rel=1e-6)


def test_kv_bytes_per_token_70b_gqa_is_320_kib() -> None:
    assert cm.kv_bytes_per_token(80, 8, 128, 2) == 327_680
    assert cm.kv_bytes_per_token(80, 8, 128, 2) / 1024 == 320


@pytest.mark.parametrize(
    ("gpu_name", "expected_tok_s"),
    [("NVIDIA H100 80GB HBM3", 24.0), ("NVIDIA A100-SXM4-80GB", 14.6), ("NVIDIA H200", 34.3)],
)
def test_decode_ceiling_70b_fp16_single_stream(gpu_name: str, expected_tok_s: float) -> None:
    bw = cm.bandwidth_of(gpu_name)
    assert bw is not None
    assert cm.decode_ceiling_tokens_per_second(bw, 140e9) == pytest.approx(expected_tok_s, rel=0.02)


def test_decode_ceiling_grows_with_batch_and_kv_bends_it() -> None:
    bw, w, kv = 3.35e12, 140e9, cm.kv_bytes_per_token(80, 8, 128, 2)
    one = cm.decode_ceiling_tokens_per_second(bw, w, 1, 1000, kv)
    b32 = cm.decode_ceiling_tokens_per_second(bw, w, 32, 1000, kv)
    assert 20 < one < 24 < b32 < 32 * one
    # hand computed: 32 × 3.35e12 / (140e9 + 32 × 1000 × 327680) = 661.5
    assert b32 == pytest.approx(32 * 3.35e12 / (140e9 + 32 * 1000 * 327_680))


def test_energy_cost_kwh_and_pue() -> None:
    # 700 W for one hour = 2.52e6 J = 0.7 kWh; × $0.12 × PUE 1.3 = $0.1092
    assert cm.energy_cost(700 * 3600, 0.12, 1.3) == pytest.approx(0.1092)


@pytest.mark.parametrize(
    ("prev", "cur", "power", "secs", "expected"),
    [
        (1000.0, 1700.0, 999.0, 1.0, 700.0),  # the counter wins
        (1700.0, 100.0, 500.0, 2.0, 1000.0),  # counter went backwards → mean power × Δt
        (None, 100.0, 400.0, 5.0, 2000.0),  # no previous reading → power
        (None, None, None, 5.0, None),  # nothing known → absent
    ],
)
def test_energy_from_counter(
    prev: float | None, cur: float | None, power: float | None, secs: float, expected: float | None
) -> None:
    assert cm.energy_from_counter(prev, cur, power, secs) == expected


def test_no_tokens_means_absent_not_zero_or_infinite() -> None:
    assert cm.usd_per_million(5.0, 0) is None


def test_split_shares() -> None:
    assert cm.split_shares(["a", "b"], "equal") == {"a": 0.5, "b": 0.5}
    assert cm.split_shares(["a", "b"], "tokens", {"a": 300, "b": 100}) == {"a": 0.75, "b": 0.25}
    assert cm.split_shares(["a", "b"], "tokens", {"a": 0, "b": 0}) == {"a": 0.5, "b": 0.5}
    assert cm.split_shares([], "equal") == {}


def test_ratio_of_sums_not_mean_of_ratios() -> None:
    # busy hour: $3 for 3M tokens ($1/M); quiet hour: $3 for 0.1M tokens ($30/M)
    assert cm.usd_per_million(3.0 + 3.0, 3e6 + 1e5) == pytest.approx(6.0 / 3.1)  # 1.935, not 15.5


def test_energy_cost_without_a_pue_is_the_it_energy_alone() -> None:
    assert cm.energy_cost(3.6e6, 0.12) == pytest.approx(0.12)  # 1 kWh × $0.12 × PUE 1


def test_an_energy_counter_that_did_not_move_means_no_energy() -> None:
    assert cm.energy_from_counter(1000.0, 1000.0, 500.0, 2.0) == 0.0  # not the 1,000 J of power × Δt


def test_one_token_is_a_ratio() -> None:
    assert cm.usd_per_million(0.5, 1) == pytest.approx(500_000.0)


def test_split_shares_by_tokens_with_a_user_that_made_none_or_is_unlisted() -> None:
    assert cm.split_shares(["a", "b"], "tokens", {"a": 3.0}) == {"a": 1.0, "b": 0.0}
    # a total of exactly one token still splits by tokens
    assert cm.split_shares(["a", "b"], "tokens", {"a": 0.75, "b": 0.25}) == {"a": 0.75, "b": 0.25}


def test_decode_ceiling_defaults_are_no_kv() -> None:
    bw, w = 3.35e12, 140e9
    # a KV size without a context (or a context without a KV size) reads no KV
    assert cm.decode_ceiling_tokens_per_second(bw, w, 2, kv_bytes_per_token_=327_680) == pytest.approx(
        2 * bw / w
    )
    assert cm.decode_ceiling_tokens_per_second(bw, w, 2, mean_context_tokens=1000) == 2 * bw / w


def test_an_unknown_share_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown share policy 'even'"):
        cm.split_shares(["a"], "even")
