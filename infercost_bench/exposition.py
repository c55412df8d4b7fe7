"""Benchmark: rendering ``/metrics`` for a large node, and serving it from the cache.

``run()`` builds a snapshot of ``models`` model versions on 8 GPUs (every catalogue family filled,
histograms and per-bound series included), times ``render`` in CPU time (median of several runs;
this is the once-per-snapshot cost, paid in a worker thread) against :data:`TARGET_MS_PER_5000`,
with prometheus_client's writer of the same bytes beside it as a reference, then starts the real
server and times 200 GETs of the cached page over loopback. It prints figures; nothing asserts on
them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import http.client
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

from agent.cost.bound import BOUNDS
from agent.samples import GpuSample, Histogram
from agent.sinks.prometheus import PrometheusServer, render, render_with_client
from agent.snapshot import EngineState, GpuState, ModelState, Snapshot

GPUS = 8
# Why 50 ms per 5,000 series: a render runs once per snapshot a scraper asks for; at Prometheus'
# usual 15 s that keeps a large node's /metrics under 0.4 % of one core.
TARGET_MS_PER_5000 = 50.0


def big_snapshot(models: int) -> Snapshot:
    """A snapshot with every field set: ``models`` versions spread over 8 engines and 8 GPUs."""
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
    by_type: dict[str, Any] = {
        "float": 1.5,
        "float | None": 1.5,
        "Mapping[str, float] | None": {b: 1.5 for b in BOUNDS},
        "Histogram | None": Histogram(((0.1, 1.0), (1.0, 3.0), (math.inf, 4.0)), 2.5, 4.0),
    }
    fields: dict[str, Any] = {
        f.name: by_type[str(f.type)] for f in dataclasses.fields(ModelState) if str(f.type) in by_type
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
    """Median CPU milliseconds of this process per call (other processes' load does not count)."""
    times = []
    for _ in range(runs):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
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
    client_ms = _median_ms(lambda: render_with_client(snap), 5)
    per_5000 = render_ms * 5000 / series
    get_ms, renders = asyncio.run(_serve(snap, 200))
    out = {
        "series": float(series),
        "page_bytes": float(len(body)),
        "render_ms": render_ms,
        "render_ms_per_5000": per_5000,
        "prometheus_client_ms": client_ms,
        "cached_get_ms": get_ms,
        "renders": renders,
    }
    verdict = "met" if per_5000 <= TARGET_MS_PER_5000 else "missed"
    client_verdict = "met" if client_ms * 5000 / series <= TARGET_MS_PER_5000 else "missed"
    print_fn(
        f"/metrics: {series} series, {len(body) / 1e6:.2f} MB; render (once per snapshot, worker thread) "
        f"{render_ms:.1f} CPU-ms median of 9 = {per_5000:.1f} ms per 5,000 series "
        f"(target <= {TARGET_MS_PER_5000:g} ms: {verdict}); prometheus_client writing the same bytes: "
        f"{client_ms:.1f} CPU-ms = {client_ms * 5000 / series:.1f} ms per 5,000 series ({client_verdict}; "
        f"reference); cached GET over loopback {get_ms:.2f} ms median of 200 "
        f"({int(renders)} render for all of them)"
    )
    return out
