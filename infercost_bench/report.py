"""Benchmark: the weekly report from a 35-day store, time and peak memory.

``run()`` fills a store with 35 days of 1-minute history (``series`` model-version series on one
node, a day-shaped load; a deploy every week on a quarter of them; a bound split on two thirds of
them), or reuses ``store`` if given,
then builds the report for the last week in a fresh child process per method and prints, for each:

- ``sql`` (the report's path): :func:`agent.report.data.build_from_store`, hourly sums in SQL;
- ``records`` (the previous implementation's read path, the baseline): every model minute of the two
  weeks loaded as :class:`MinuteRecord` → :class:`CostWindow`, then aggregated in Python.

Each figure is the child's wall time and peak RSS (``ru_maxrss``, which includes the interpreter and
the imports). The goal: ≤ 5 s and ≤ 100 MB. It prints figures; nothing asserts on them.

``python -m infercost_bench.report [--series N] [--days D] [--store FILE]`` or ``infercost bench report``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

GOAL_SECONDS = 5.0  # the goal: the week's report built within this many seconds (wall)
GOAL_MB = 100.0  # the goal: at most this peak RSS (MB) while building it
MINUTE = 60.0
DAY = 86400.0


def fill_store(path: Path, series: int, days: float, end: float, seed: int = 1) -> int:
    """Write ``days`` of 1-minute history of ``series`` model versions ending at ``end``; returns
    windows written. Every 4th series gets a new version each week (a deploy)."""
    from agent.clock import ManualClock
    from agent.detect.deploys import record_deploy
    from agent.samples import CostWindow, UsageWindow
    from agent.store import Store

    store = Store(path, retention_days=days + 1, clock=ManualClock(start=end), deploys=record_deploy)
    rng = random.Random(seed)
    start = math.floor((end - days * DAY) / MINUTE) * MINUTE
    written = 0
    batch: list[CostWindow] = []
    t = start
    while t < end:
        hour = (t % DAY) / 3600.0
        shape = 0.1 + 0.9 * (0.5 + 0.5 * math.cos((hour - 14.0) / 24.0 * 2 * math.pi)) ** 2
        week = int((t - start) // (7 * DAY))
        for i in range(series):
            version = f"2024-{week + 1:02d}" if i % 4 == 0 else "v1"
            tps = 400.0 * shape * (1 + rng.uniform(-0.05, 0.05))
            gen = tps * MINUTE
            usd = 2.0 * MINUTE / 3600.0
            u = UsageWindow(
                "bench-node", f"engine-{i}", f"model-{i // 2}", version, t, t + MINUTE,
                prompt_tokens=2 * gen, generation_tokens=gen, gpu_seconds=MINUTE, energy_joules=400 * MINUTE,
                gpu_util_ratio=min(1.0, 0.2 + 0.75 * shape), power_watts=400.0, requests_running=8 * shape,
                kv_cache_usage_ratio=0.5, ttft_p99_seconds=0.1,
            )  # fmt: skip
            busy = min(1.0, 0.2 + 0.75 * shape)
            # where GPU time went (schema 6): every third series on GPUs without GPM has no split
            shares = None if i % 3 == 2 else {
                "compute": 0.3 * busy, "memory": 0.6 * busy, "communication": 0.1 * busy, "idle": 1.0 - busy,
            }  # fmt: skip
            b_secs = None if shares is None else {k: v * MINUTE for k, v in shares.items()}
            b_usd = None if shares is None else {k: v * usd for k, v in shares.items()}
            batch.append(
                CostWindow(
                    u,
                    usd,
                    0.0,
                    usd / gen * 1e6,
                    usd / (3 * gen) * 1e6,
                    0.0,
                    bound_gpu_seconds=b_secs,
                    bound_usd=b_usd,
                )
            )
        if len(batch) >= 20_000:
            written += store.write_windows(batch)
            batch = []
        t += MINUTE
    if batch:
        written += store.write_windows(batch)
    store.close()
    return written


def _by_sql(path: Path, end: float) -> Any:
    from agent.report.data import build_from_store

    return build_from_store(path, end)


def _by_records(path: Path, end: float) -> Any:
    from agent.records import window_from_record
    from agent.report.data import WEEK_SECONDS, build_from_windows
    from agent.store import Store

    store = Store(path)
    records = store.records(end - 2 * WEEK_SECONDS - MINUTE, end, kinds=("model",))
    windows = [window_from_record(r) for r in records if r.kind == "model"]
    return build_from_windows(windows, end)


METHODS: dict[str, Callable[[Path, float], Any]] = {"sql": _by_sql, "records": _by_records}


def _child(method: str, path: Path, end: float) -> None:
    t0 = time.perf_counter()
    rep = METHODS[method](path, end)
    elapsed = time.perf_counter() - t0
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kilobytes on Linux
    out = {"seconds": elapsed, "peak_rss_mb": rss_kb / 1024.0, "total_usd": rep.total_usd}
    print(json.dumps(out))


def measure(method: str, path: Path, end: float) -> dict[str, float]:
    """Run one method in a fresh interpreter; its time and peak RSS."""
    cmd = [
        sys.executable,
        "-m",
        "infercost_bench.report",
        "--child",
        method,
        "--store",
        str(path),
        "--end",
        str(end),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env={**os.environ})
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def run(
    series: int = 24, days: float = 35.0, store: Path | None = None, print_fn: Callable[[str], Any] = print
) -> dict[str, dict[str, float]]:
    """Run the benchmark; print and return the figures per method."""
    end = math.floor(time.time() / 3600.0) * 3600.0
    with tempfile.TemporaryDirectory(prefix="infercost-bench-report-") as tmp:
        path = store or Path(tmp) / "history.sqlite"
        if not path.exists():
            t0 = time.perf_counter()
            n = fill_store(path, series, days, end)
            print_fn(
                f"filled {path}: {n:,} windows, {days:g} days × {series} series "
                f"in {time.perf_counter() - t0:.0f} s"
            )
        else:
            from agent.store import Store

            span = Store(path).span()
            end = (span[1] + MINUTE) if span else end
        size_mb = path.stat().st_size / 1e6
        print_fn(
            f"store {size_mb:.0f} MB; machine: {platform.machine()}, {os.cpu_count()} CPUs, "
            f"Python {platform.python_version()}"
        )
        figures: dict[str, dict[str, float]] = {}
        for method in ("records", "sql"):
            f = measure(method, path, end)
            figures[method] = f
            label = "baseline: minutes loaded into Python" if method == "records" else "SQL GROUP BY per hour"
            print_fn(
                f"{method:8s} {f['seconds']:6.2f} s  peak RSS {f['peak_rss_mb']:6.1f} MB  "
                f"total ${f['total_usd']:,.2f}  ({label})"
            )
        sql, base = figures["sql"], figures["records"]
        met = sql["seconds"] <= GOAL_SECONDS and sql["peak_rss_mb"] <= GOAL_MB
        print_fn(
            f"sql vs baseline: {base['seconds'] / sql['seconds']:.1f}× faster, "
            f"{base['peak_rss_mb'] / sql['peak_rss_mb']:.1f}× less memory; goal ≤ {GOAL_SECONDS:g} s and "
            f"≤ {GOAL_MB:g} MB: {'met' if met else 'NOT met'}"
        )
        return figures


def main(argv: list[str] | None = None) -> None:
    """Command line (also the child process of each measurement)."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--series", type=int, default=24)
    p.add_argument("--days", type=float, default=35.0)
    p.add_argument("--store", type=Path, default=None, help="reuse (or create) this store file")
    p.add_argument("--child", choices=sorted(METHODS), help=argparse.SUPPRESS)
    p.add_argument("--end", type=float, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        _child(a.child, a.store, a.end)
    else:
        run(a.series, a.days, a.store)


if __name__ == "__main__":
    main()
