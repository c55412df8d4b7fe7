"""The detection bench's forest training windows, read from the store a minute at a time, equal a
full read of the trailing training window at every fit (same windows, same order)."""

from __future__ import annotations

from pathlib import Path

from agent.clock import ManualClock
from agent.records import window_from_record
from agent.samples import CostWindow, UsageWindow
from agent.store import Store
from infercost_bench.detection import TrainingWindows

T0 = 1704067200.0  # Monday 2024-01-01 00:00 UTC


def window(start: float, dur: float, tokens: float, version: str) -> CostWindow:
    u = UsageWindow(
        "n1", "vllm-0", "llama", version, start, start + dur, prompt_tokens=tokens * 3,
        generation_tokens=tokens, gpu_seconds=8 * dur, energy_joules=dur * 2400.0, gpu_util_ratio=0.5,
        requests_running=tokens / 100.0,
    )  # fmt: skip
    usd = 8 * dur * 3.0 / 3600.0
    return CostWindow(
        u, gpu_time_usd=usd, energy_usd=0.0, usd_per_1m_output=usd / tokens * 1e6,
        usd_per_1m_total=usd / (4 * tokens) * 1e6, idle_usd=0.0, priced=True, roofline_ratio=0.4,
    )  # fmt: skip


def test_incremental_read_equals_a_full_read_at_every_fit(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    store = Store(Path(":memory:"), retention_days=60.0, clock=clock)
    held = TrainingWindows(store, training_seconds=3 * 3600.0)  # 3 h of training windows
    pending: list[CostWindow] = []
    t = T0
    fits = 0
    # 1-minute windows for 10 h, then 5-minute ones; an agent gap (no window 04:00–04:37, the next
    # window spans it from its last tick) and a deploy at 06:00; written in hourly batches, every
    # written minute's anomaly score updated after the write (as the bench does), a fit every 70 min.
    while t < T0 + 14 * 3600.0:
        step = 60.0 if t < T0 + 10 * 3600.0 else 300.0
        if T0 + 4 * 3600.0 <= t < T0 + 4 * 3600.0 + 37 * 60.0:
            step = 37 * 60.0  # the window after the gap starts at the last tick before it
        version = "v1" if t < T0 + 6 * 3600.0 else "v2"
        pending.append(window(t, step, 1000.0 + (t - T0) / 60.0, version))
        t += step
        if (t - T0) % 3600.0 == 0.0:
            store.write_windows(pending)
            for w in pending:
                store.write_anomaly_score("n1", "vllm-0", "llama", w.usage.model_version, w.usage.start, 0.7)
            pending = []
        if (t - T0) % 4200.0 == 0.0:  # every 70 min, after the writes up to t
            if pending:
                store.write_windows(pending)
                pending = []
            full = [window_from_record(r) for r in store.records(t - 3 * 3600.0, t, kinds=("model",))]
            got = held.at(t)
            assert got == full
            assert len(got) > 0
            fits += 1
    assert fits == 12
    # the 3 h window holds 3 h of minutes at most: 180 one-minute windows, or 36 five-minute ones
    assert len(held.at(t)) == 36
    store.close()
