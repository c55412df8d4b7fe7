"""Benchmark: rendering ``/metrics`` for a large node, and serving it from the cache.

``run()`` builds a snapshot of ``models`` model versions on 8 GPUs (every catalogue family filled,
≈ 5,000 series at the default 250 models), times ``render`` (median of several runs; this is the
once-per-tick cost, paid in a worker thread), then starts the real server and times 200 GETs of
the cached page over loopback. It prints figures; nothing asserts on them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import http.client
import statistics
import time
from collections.abc import Callable
from typing import Any

from agent.sinks.prometheus import PrometheusServer, render
from agent.snapshot import EngineState, GpuState, ModelState, Snapshot

GPUS = 8


def big_snapshot(models: int) -> Snapshot:
    """A snapshot with every field set: ``models`` versions spread over 8 engines and 8 GPUs."""
    from agent.samples import GpuSample

    gpus = tuple(
        GpuState(
            GpuSample(
                i,
                f"GPU-{i}",
                "NVIDIA H100 80GB HBM3",
                0.0,
                util_gpu_ratio=0.9,
                util_memory_ratio=0.6,
                dram_bw_ratio=0.7,
                sm_active_ratio=0.8,
                power_watts=600.0,
                energy_joules=1e9,
                memory_used_bytes=7e10,
                memory_total_bytes=8e10,
                sm_clock_hz=1.98e9,
                mem_clock_hz=2.6e9,
                temperature_celsius=61.0,
            ),
            usd_per_hour=3.5,
            cost_usd_total=100.0,
            idle_cost_usd_total=5.0,
        )
        for i in range(GPUS)
    )
    engines = tuple(EngineState(f"vllm-{e}", "vllm", True, 0.01) for e in range(GPUS))
    fields: dict[str, Any] = {
        f.name: 1.5
        for f in dataclasses.fields(ModelState)
        if f.name not in ("engine", "model", "model_version")
    }
    states = tuple(
        ModelState(f"vllm-{m % GPUS}", f"org/model-{m}", f"v{m % 3}", **fields) for m in range(models)
    )
    return Snapshot(
        "node-bench",
        "bench",
        0.0,
        nvml_up=True,
        gpus=gpus,
        engines=engines,
        models=states,
        alerts_firing={(f"rule_{r}", "warning"): 0 for r in range(10)},
        outbox_pending={"slack": 0},
    )


def _median_ms(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


async def _serve(snap: Snapshot, requests: int) -> tuple[float, float]:
    server = PrometheusServer(lambda: snap, lambda: True, "127.0.0.1", 0)
    await server.start()

    def client() -> list[float]:  # one kept-alive connection, as Prometheus scrapes
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        out = []
        for i in range(requests + 1):
            t0 = time.perf_counter()
            conn.request("GET", "/metrics")
            conn.getresponse().read()
            if i:  # the first request pays the one render
                out.append(time.perf_counter() - t0)
        conn.close()
        return out

    try:
        times = await asyncio.to_thread(client)
    finally:
        await server.stop()
    return statistics.median(times) * 1e3, float(server.cache.renders)


def run(models: int = 250, print_fn: Callable[[str], Any] = print) -> dict[str, float]:
    """Time the render and the cached serve; print and return the figures."""
    snap = big_snapshot(models)
    body = render(snap, process=False)
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    render_ms = _median_ms(lambda: render(snap), 9)
    get_ms, renders = asyncio.run(_serve(snap, 200))
    out = {
        "series": float(series),
        "page_bytes": float(len(body)),
        "render_ms": render_ms,
        "cached_get_ms": get_ms,
        "renders": renders,
    }
    print_fn(
        f"/metrics: {series} series, {len(body) / 1e6:.2f} MB; render (once per tick, worker thread) "
        f"{render_ms:.1f} ms median of 9 (target ≤ 50 ms for 5,000 series); "
        f"cached GET over loopback {get_ms:.2f} ms median of 200 ({int(renders)} render for all of them)"
    )
    return out
