"""The cost floor (pure): what a million output tokens would cost at the bandwidth roofline.

"You pay $X per 1M; the hardware floor at this batch is $Y; at batch B it would be $Z":

- at the **running batch**: each replica's fastest decode step reads its weights and the resident
  KV cache once at peak bandwidth (:func:`agent.cost.efficiency.min_step_seconds`), and every
  running sequence gains a token per step, so the ceiling is ``replicas × batch / step`` tokens/s
  and the floor is the window's dollars per second over that ceiling;
- at the **largest batch the KV cache allows**: at the window's mean context per sequence, the
  cache holds ``capacity / context`` sequences; a step then reads the weights and the full cache.

Reference (DESIGN.md): 70B fp16 (140 GB) on one H100 (3.35 TB/s) at $3.60/h, one sequence: a step
of 41.8 ms, 23.9 tok/s, a floor of $41.79 per 1M output tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.cost.efficiency import min_step_seconds
from agent.cost.model import PER_MILLION


@dataclass(frozen=True, slots=True)
class CostFloor:
    """The roofline's price of output tokens for one window."""

    usd_per_1m_at_batch: float  # dollars per 1M output tokens at the running batch's ceiling
    usd_per_1m_at_max_batch: float | None  # at the largest batch the KV cache holds; None: unknown
    max_batch: float | None  # sequences per replica the KV cache holds at the mean context


def cost_floor(
    usd_per_second: float,
    weights_bytes: float,
    bandwidth_bytes_per_s: float,
    *,
    replicas: int,
    running: float | None,
    resident_kv_tokens: float,
    kv_bytes_per_token: float | None,
    kv_capacity_tokens: float | None,
    generated_per_second: float = 0.0,
) -> CostFloor | None:
    """The floor for a window costing ``usd_per_second`` (None without weights or bandwidth).

    ``bandwidth_bytes_per_s`` is summed over the engine's GPUs and ``running`` over its replicas;
    ``resident_kv_tokens`` and ``kv_capacity_tokens`` are per replica; ``generated_per_second``: the
    output tokens the window counted, over its seconds. A step gains at most one token per running
    sequence, so the batch is at least what those tokens need at the fastest step: a batch read
    lower (a decode-seconds counter read a few counts short) would put the floor above the price.
    """
    if weights_bytes <= 0 or bandwidth_bytes_per_s <= 0:
        return None
    replicas = max(1, replicas)
    bw = bandwidth_bytes_per_s / replicas
    kv = kv_bytes_per_token or 0.0
    step = min_step_seconds(weights_bytes, resident_kv_tokens, kv, bw)  # no KV size: weights only
    batch = max(1.0, (running or 1.0) / replicas, generated_per_second * step / replicas)
    at_batch = usd_per_second / (replicas * batch / step) * PER_MILLION
    if not (kv and kv_capacity_tokens and resident_kv_tokens > 0):
        return CostFloor(at_batch, None, None)
    context = resident_kv_tokens / batch  # tokens per running sequence
    max_batch = kv_capacity_tokens / context
    step_full = min_step_seconds(weights_bytes, kv_capacity_tokens, kv, bw)
    at_max = usd_per_second / (replicas * max_batch / step_full) * PER_MILLION
    return CostFloor(at_batch, at_max, max_batch)
