"""Test helper: a fast synthetic week of per-minute history written into a real Store."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from agent.records import MINUTE as _M
from agent.samples import CostWindow, UsageWindow
from agent.store import Store


def backfill_simulated(
    store: Store,
    series: Sequence[tuple[str, str, str, str]],
    start: float,
    end: float,
    usd_per_hour: float = 2.0,
    peak_tokens_per_second: float = 400.0,
    seed: int = 0,
) -> int:
    """Fill [start, end) with synthetic 1-minute history for (node, engine, model, model_version)
    series (fast, no physics: tests that need a week of baselines). Load follows a day curve (peak at 14:00
    UTC, a tenth of it at night) with ±5 % noise; cost is ``usd_per_hour`` of GPU time, so the
    cost per token rises at night as it does on real fleets. Returns windows written."""
    rng = random.Random(seed)
    t = start // _M * _M
    written = 0
    batch: list[CostWindow] = []
    while t < end:
        hour = (t % 86400.0) / 3600.0
        shape = 0.1 + 0.9 * (0.5 + 0.5 * math.cos((hour - 14.0) / 24.0 * 2 * math.pi)) ** 2
        for node, engine, model, version in series:
            tps = peak_tokens_per_second * shape * (1 + rng.uniform(-0.05, 0.05))
            gen = tps * _M
            usd = usd_per_hour * _M / 3600.0
            u = UsageWindow(
                node, engine, model, version, t, t + _M,
                prompt_tokens=gen * 2, generation_tokens=gen, gpu_seconds=_M,
                energy_joules=(150 + 450 * shape) * _M, gpu_util_ratio=min(1.0, 0.2 + 0.75 * shape),
                power_watts=150 + 450 * shape, requests_running=8 * shape,
                kv_cache_usage_ratio=0.3 + 0.5 * shape, ttft_p99_seconds=0.05 + 0.1 * shape,
            )  # fmt: skip
            batch.append(CostWindow(u, usd, 0.0, usd / gen * 1e6, usd / (3 * gen) * 1e6, 0.0))
        if len(batch) >= 5000:
            written += store.write_windows(batch)
            batch = []
        t += _M
    if batch:
        written += store.write_windows(batch)
    return written
