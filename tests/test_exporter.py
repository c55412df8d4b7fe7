"""The Prometheus endpoint: catalogue-driven, absent means absent, and promtool accepts the page."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from agent.catalog import CATALOG
from agent.config import EngineConfig
from agent.cost.window import WindowJoiner
from agent.samples import EngineScrape, GpuSample, ModelSignals, NvmlRound
from agent.sinks.prometheus import PrometheusServer, render
from agent.snapshot import Ledger, Snapshot
from agent.sources.prices import parse_price_book

T0 = 1_780_000_000.0
ROOT = Path(__file__).resolve().parents[1]


def _snapshot() -> Snapshot:
    book = parse_price_book({"gpus": [{"match": "H100", "usd_per_hour": 3.6}]}, "book")
    engines = (EngineConfig(name="llama", url="http://x/metrics", gpus=(0,), model_version="v7"),)
    j = WindowJoiner("node-a", [e.cost_spec() for e in engines], book.table())
    led = Ledger("node-a", "0.1.0")

    def gpus(t: float, e: float) -> NvmlRound:
        return NvmlRound(
            timestamp=t,
            up=True,
            gpus=(
                GpuSample(
                    0,
                    "GPU-0",
                    "NVIDIA H100 80GB HBM3",
                    t,
                    util_gpu_ratio=0.9,
                    power_watts=600,
                    energy_joules=e,
                ),
                # GPU 1 does not support power readings: its power series must be absent
                GpuSample(1, "GPU-1", "NVIDIA H100 80GB HBM3", t, util_gpu_ratio=0.0),
            ),
        )

    def sc(t: float, g: float) -> dict[str, EngineScrape]:
        m = ModelSignals(
            "meta/llama", prompt_tokens_total=g / 2, generation_tokens_total=g, requests_running=4
        )
        return {"llama": EngineScrape("llama", "vllm", t, True, 0.01, (m,))}

    for k, (e, g) in enumerate([(0.0, 0.0), (6000.0, 2000.0), (12000.0, 4000.0)]):
        r = gpus(T0 + 10 * k, e)
        j.add_round(r)
        led.observe_nvml(r)
        for s in sc(T0 + 10 * k, g).values():
            led.observe_scrape(s)
        led.apply(j.close_tick(T0 + 10 * k, sc(T0 + 10 * k, g)))
    return led.snapshot()


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def test_values_and_absence() -> None:
    text = render(_snapshot()).decode()
    s = _samples(text)
    model = frozenset(
        {"node": "node-a", "engine": "llama", "model": "meta/llama", "model_version": "v7"}.items()
    )
    # 20 s of one $3.60/h GPU = $0.02 for 4000 output tokens → $5 per 1M
    assert s[("infercost_cost_usd_total", model)] == 0.02
    assert s[("infercost_generation_tokens_total", model)] == 4000
    assert round(s[("infercost_usd_per_1m_output_tokens", model)], 6) == 5.0
    assert s[("infercost_generation_tokens_per_second", model)] == 200
    gpu1 = frozenset({"node": "node-a", "gpu": "1"}.items())
    assert ("infercost_gpu_power_watts", gpu1) not in s  # unsupported → absent, not 0
    assert s[("infercost_gpu_idle_cost_usd_total", gpu1)] == 0.02  # no engine uses GPU 1
    assert ("infercost_gpu_power_watts", frozenset({"node": "node-a", "gpu": "0"}.items())) in s
    assert not any(v != v for v in s.values())  # no NaN anywhere


def test_promtool_check_metrics_accepts_the_page() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: .ci/run installs the Debian 'prometheus' package"
    proc = subprocess.run(
        [promtool, "check", "metrics"], input=render(_snapshot()), capture_output=True, timeout=30
    )
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()


def test_readme_lists_every_series() -> None:
    readme = (ROOT / "README.md").read_text()
    missing = [m.full_name for m in CATALOG if not re.search(rf"`{m.full_name}`", readme)]
    assert not missing, f"README is missing: {missing}"


def test_catalogue_names_follow_conventions() -> None:
    for m in CATALOG:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", m.name), m.name
        assert (m.kind == "counter") == m.name.endswith("_total"), m.name
        assert not any(bad in m.name for bad in ("percent", "mib", "mhz", "milli")), m.name


async def test_http_endpoint_serves_metrics_and_healthz() -> None:
    snap = _snapshot()
    server = PrometheusServer(lambda: snap, lambda: True, "127.0.0.1", 0)
    await server.start()
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{server.port}/metrics") as r:
                assert r.status == 200
                assert r.headers["Content-Type"].startswith("text/plain")
                assert "infercost_usd_per_1m_output_tokens" in await r.text()
            async with s.get(f"http://127.0.0.1:{server.port}/healthz") as r:
                assert r.status == 200 and (await r.json())["status"] == "ok"
    finally:
        await server.stop()


def test_nvml_going_down_marks_every_gpu_down_and_drops_its_readings() -> None:
    led = Ledger("node-a", "0.1.0")
    led.observe_nvml(
        NvmlRound(
            T0,
            True,
            (GpuSample(0, "GPU-0", "NVIDIA H100 80GB HBM3", T0, util_gpu_ratio=0.9, power_watts=500),),
        )
    )
    led.observe_nvml(NvmlRound(T0 + 1, False, (), error="driver not loaded"))
    s = _samples(render(led.snapshot()).decode())
    gpu0 = frozenset({"node": "node-a", "gpu": "0"}.items())
    assert s[("infercost_nvml_up", frozenset({"node": "node-a"}.items()))] == 0
    assert s[("infercost_gpu_up", gpu0)] == 0
    assert ("infercost_gpu_power_watts", gpu0) not in s and ("infercost_gpu_utilization_ratio", gpu0) not in s


def test_trailing_p99_merges_the_ticks_observations() -> None:
    from agent.samples import Histogram
    from agent.snapshot import _merged_p99

    # tick 1: 100 fast requests (≤ 0.1 s); tick 2: 2 slow ones (≤ 1 s). Merged: 2 of 102 are slow,
    # so p99 lies in the slow bucket — the max of per-tick p99s would say the same only by luck
    fast = Histogram(((0.1, 100.0), (1.0, 100.0), (float("inf"), 100.0)), 5.0, 100.0)
    slow = Histogram(((0.1, 0.0), (1.0, 2.0), (float("inf"), 2.0)), 1.6, 2.0)
    p99 = _merged_p99([fast, None, slow])
    assert p99 is not None and 0.1 < p99 <= 1.0
    assert _merged_p99([fast]) is not None and _merged_p99([fast]) <= 0.1  # type: ignore[operator]
    assert _merged_p99([None]) is None
