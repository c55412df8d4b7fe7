"""The cost model: pure functions with hand-checkable numbers (no clock, no I/O).

The contract (DESIGN.md): GPU time cost = $/GPU-hour × Δt / 3600; energy cost = ΔE / 3.6e6 × $/kWh × PUE;
an engine's cost is the sum over the GPUs it uses, a shared GPU split by a stated policy;
$ per 1M tokens = cost / tokens × 1e6, absent (None) when there are no tokens; longer windows are
a ratio of sums, never a mean of ratios.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from agent.hardware import gpu_spec

SECONDS_PER_HOUR = 3600.0
JOULES_PER_KWH = 3.6e6
PER_MILLION = 1e6


def gpu_time_cost(usd_per_hour: float, seconds: float) -> float:
    """Dollars for ``seconds`` of a resource priced at ``usd_per_hour``."""
    return usd_per_hour * seconds / SECONDS_PER_HOUR


def energy_cost(joules: float, usd_per_kwh: float, pue: float = 1.0) -> float:
    """Dollars for ``joules`` of IT energy at ``usd_per_kwh``, grossed up by the data centre's PUE."""
    return joules / JOULES_PER_KWH * usd_per_kwh * pue


def energy_from_counter(
    prev_joules: float | None, cur_joules: float | None, mean_power_watts: float | None, seconds: float
) -> float | None:
    """Joules used over an interval: the energy counter's delta, falling back to mean power × Δt.

    A counter that went backwards (driver reload) or is missing falls back to power; None when
    neither is known.
    """
    if prev_joules is not None and cur_joules is not None and cur_joules >= prev_joules:
        return cur_joules - prev_joules
    if mean_power_watts is not None:
        return mean_power_watts * seconds
    return None


def usd_per_million(cost_usd: float, tokens: float) -> float | None:
    """$ per 1M tokens, or None (absent — not zero, not infinity) when there were no tokens."""
    if tokens <= 0:
        return None
    return cost_usd / tokens * PER_MILLION


def split_shares(
    users: Sequence[str], policy: str, tokens: Mapping[str, float] | None = None
) -> dict[str, float]:
    """How a GPU used by several engines is split among them; the shares sum to 1.

    ``equal``: each user pays 1/n (the default: a GPU held is a GPU paid for, whoever uses it more).
    ``tokens``: by each user's share of the tokens in the interval; equal when none produced any.
    """
    if policy not in ("equal", "tokens"):
        raise ValueError(f"unknown share policy {policy!r}: use equal or tokens")
    if not users:
        return {}
    if policy == "tokens" and tokens:
        total = sum(max(0.0, tokens.get(u, 0.0)) for u in users)
        if total > 0:
            return {u: max(0.0, tokens.get(u, 0.0)) / total for u in users}
    return {u: 1.0 / len(users) for u in users}


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, bytes_per_element: float) -> float:
    """KV-cache bytes one token occupies: 2 (K and V) × layers × kv_heads × head_dim × bytes."""
    return 2 * layers * kv_heads * head_dim * bytes_per_element


def bandwidth_of(gpu_name: str) -> float | None:
    """Peak memory bandwidth (bytes/s) of a GPU by its NVML name (:mod:`agent.hardware`), or None."""
    spec = gpu_spec(gpu_name)
    return None if spec is None else spec.hbm_bandwidth_bytes_per_s


def peak_flops_of(gpu_name: str) -> float | None:
    """Dense tensor-core peak (FLOP/s) of a GPU by its NVML name (:mod:`agent.hardware`), or None."""
    spec = gpu_spec(gpu_name)
    return None if spec is None else spec.peak_flops


def decode_ceiling_tokens_per_second(
    bandwidth_bytes_per_second: float,
    weights_bytes: float,
    batch: float = 1.0,
    mean_context_tokens: float = 0.0,
    kv_bytes_per_token_: float = 0.0,
) -> float:
    """Bandwidth-bound decode ceiling: each step reads the weights once plus every sequence's KV.

    tokens per step = batch; bytes per step ≈ W + batch × context × kv_bytes_per_token.
    70B fp16 (≈ 140 GB) on one H100 (3.35 TB/s), batch 1: ≈ 24 tok/s.
    """
    batch = max(batch, 1.0)
    bytes_per_step = weights_bytes + batch * mean_context_tokens * kv_bytes_per_token_
    return batch * bandwidth_bytes_per_second / bytes_per_step
