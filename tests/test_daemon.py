"""The whole daemon, end to end: fake NVML + simulated vLLM engines over HTTP → /metrics.

Runs the real Agent (the same one `infercost run` starts) on an accelerated clock and reads its
Prometheus endpoint over HTTP, as Prometheus would.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path

import aiohttp
import pytest
from netutil import async_wait_until
from prometheus_client.parser import text_string_to_metric_families

from agent.app import build_agent
from agent.clock import AcceleratedClock
from agent.config import Config, ExportersConfig, IntervalsConfig, NvmlConfig, PrometheusExporterConfig
from agent.sources.prices import parse_price_book
from infercost_sim.node import SimNode

PRICE = 2.0  # $ per GPU-hour in this test's book
SPEED = 60.0  # simulated seconds per real second


def _parse(text: str) -> dict[str, dict[frozenset[tuple[str, str]], float]]:
    out: dict[str, dict[frozenset[tuple[str, str]], float]] = defaultdict(dict)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name][frozenset(s.labels.items())] = s.value
    return out


async def _scrape(port: int) -> dict[str, dict[frozenset[tuple[str, str]], float]]:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as r:
        assert r.status == 200
        return _parse(await r.text())


@pytest.fixture
async def running(tmp_path: Path):  # type: ignore[no-untyped-def]
    clock = AcceleratedClock(SPEED)
    sim = SimNode(clock, tmp_path / "podinfo", target_page_bytes=None)
    await sim.start()
    cfg = Config(
        node="test-node",
        state_dir=tmp_path,
        intervals=IntervalsConfig(nvml_seconds=5, scrape_seconds=10, window_seconds=60),
        nvml=NvmlConfig(backend="fake", fake_count=8),
        exporters=ExportersConfig(prometheus=PrometheusExporterConfig(port=0)),
    )
    book = parse_price_book({"gpus": [{"match": "H100", "usd_per_hour": PRICE}]}, "test-book")
    agent = await build_agent(
        cfg, clock=clock, book=book, load=sim.gpu_load, engines=sim.engine_configs(), history=False
    )
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    await agent.started.wait()
    assert agent.prometheus is not None
    yield sim, agent, agent.prometheus.port
    stop.set()
    await asyncio.wait_for(task, 10)
    await sim.stop()


async def test_costs_add_up_per_model_version_and_per_gpu(running) -> None:  # type: ignore[no-untyped-def]
    _sim, _agent, port = running

    async def every_model_has_a_price() -> bool:
        m = await _scrape(port)
        return len(m.get("infercost_usd_per_1m_output_tokens", {})) >= 4

    await async_wait_until(every_model_has_a_price)
    m = await _scrape(port)

    versions = {dict(k)["engine"]: dict(k)["model_version"] for k in m["infercost_cost_usd_total"]}
    assert versions == {
        "llama-70b": "2024-07",
        "llama-70b-canary": "2024-09",
        "mistral-7b": "v0.3",
        "qwen-14b": "2024-09",
    }
    assert all(v == 1.0 for v in m["infercost_engine_up"].values())
    assert m["infercost_nvml_up"][frozenset({("node", "test-node")})] == 1.0
    assert len(m["infercost_gpu_utilization_ratio"]) == 8

    # cost = GPU-seconds × price (no energy in this book), per model version
    for k, cost in m["infercost_cost_usd_total"].items():
        assert cost == pytest.approx(m["infercost_gpu_seconds_total"][k] * PRICE / 3600, rel=1e-9)
        assert cost > 0
    # every GPU is used by exactly one engine: model costs add up to the GPUs' costs
    assert sum(m["infercost_cost_usd_total"].values()) == pytest.approx(
        sum(m["infercost_gpu_cost_usd_total"].values())
    )
    # the 4-GPU engine accrues twice the GPU-seconds of the 2-GPU one
    gs = {dict(k)["engine"]: v for k, v in m["infercost_gpu_seconds_total"].items()}
    assert gs["llama-70b"] == pytest.approx(2 * gs["llama-70b-canary"])
    assert gs["llama-70b"] == pytest.approx(4 * gs["mistral-7b"])
    # $/1M output is the trailing-window ratio of sums: cost rate (the engine's GPUs × $/GPU-hour,
    # no energy in this book) / token rate
    n_gpus = {"llama-70b": 4, "llama-70b-canary": 2, "mistral-7b": 1, "qwen-14b": 1}
    for k, per_m in m["infercost_usd_per_1m_output_tokens"].items():
        rate = m["infercost_generation_tokens_per_second"][k]
        per_hour = n_gpus[dict(k)["engine"]] * PRICE
        assert per_m == pytest.approx(per_hour / 3600 / rate * 1e6, rel=1e-6)


async def test_rollout_is_a_new_version_series(running) -> None:  # type: ignore[no-untyped-def]
    sim, _agent, port = running

    async def old_version_counted() -> bool:
        m = await _scrape(port)
        return any(dict(k).get("model_version") == "2024-09" for k in m.get("infercost_cost_usd_total", {}))

    await async_wait_until(old_version_counted)
    sim.rollout("llama-70b-canary", "2024-10", 0.65)

    async def new_version_seen() -> bool:
        m = await _scrape(port)
        return any(
            dict(k).get("model_version") == "2024-10" for k in m.get("infercost_generation_tokens_total", {})
        )

    await async_wait_until(new_version_seen)
    m = await _scrape(port)
    canary = {
        dict(k)["model_version"]: v
        for k, v in m["infercost_generation_tokens_total"].items()
        if dict(k)["engine"] == "llama-70b-canary"
    }
    assert set(canary) == {"2024-09", "2024-10"}  # the old version keeps its counters


async def test_a_vanished_engine_is_down_and_the_rest_goes_on(running) -> None:  # type: ignore[no-untyped-def]
    sim, _agent, port = running

    async def all_up() -> bool:
        m = await _scrape(port)
        return len(m.get("infercost_engine_up", {})) == 4 and all(
            v == 1.0 for v in m["infercost_engine_up"].values()
        )

    await async_wait_until(all_up)
    await sim._members["qwen-14b"].server.stop()
    before = await _scrape(port)

    async def qwen_down() -> bool:
        m = await _scrape(port)
        return any(dict(k)["engine"] == "qwen-14b" and v == 0.0 for k, v in m["infercost_engine_up"].items())

    await async_wait_until(qwen_down)

    async def others_moved() -> bool:
        m = await _scrape(port)
        return all(
            m["infercost_generation_tokens_total"][k] > v
            for k, v in before["infercost_generation_tokens_total"].items()
            if dict(k)["engine"] != "qwen-14b"
        )

    await async_wait_until(others_moved)
    m = await _scrape(port)
    up = {dict(k)["engine"]: v for k, v in m["infercost_engine_up"].items()}
    assert up == {"llama-70b": 1.0, "llama-70b-canary": 1.0, "mistral-7b": 1.0, "qwen-14b": 0.0}

    # its GPU still costs money, now as idle cost of the model it served: the idle counter grows
    def qwen_idle(metrics: dict[str, dict[frozenset[tuple[str, str]], float]]) -> float:
        return sum(
            v for k, v in metrics["infercost_idle_cost_usd_total"].items() if dict(k)["engine"] == "qwen-14b"
        )

    assert qwen_idle(m) > qwen_idle(before)
