"""The simulated node end to end: real HTTP servers scraped by the agent's own scraper, version
files read by the agent's own reader, GPUs read through the fake NVML library."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from agent.clock import ManualClock
from agent.samples import EngineScrape
from agent.sources.discovery import VersionReader
from agent.sources.engines.scraper import EngineScraper
from agent.sources.nvml.fake import FakeNvml
from infercost_sim.engine import H100_SXM
from infercost_sim.node import SimNode
from infercost_sim.scenario import REGRESSION, SCENARIOS

T0 = 1_700_049_600.0  # 2023-11-15 12:00 UTC, a Wednesday afternoon


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[tuple[SimNode, ManualClock]]:
    clock = ManualClock(T0)
    # tick_seconds=None: a ManualClock's sleep moves time, so a background tick would race the test.
    # openmetrics=False: these tests do not depend on the scraper's Accept header;
    # test_agent_scraper_against_negotiating_engines covers negotiation.
    sim = SimNode(clock, tmp_path / "labels", seed=1, tick_seconds=None, openmetrics=False)
    await sim.start()
    yield sim, clock
    await sim.stop()


async def scrape_all(sim: SimNode, clock: ManualClock) -> dict[str, EngineScrape]:
    async with aiohttp.ClientSession() as session:
        return {cfg.name: await EngineScraper(cfg, session, clock).scrape() for cfg in sim.engine_configs()}


def generation(scrape: EngineScrape) -> float:
    (model,) = scrape.models
    assert model.generation_tokens_total is not None
    return model.generation_tokens_total


async def test_engine_configs_and_version_files(node: tuple[SimNode, ManualClock]) -> None:
    sim, _ = node
    configs = {c.name: c for c in sim.engine_configs()}
    assert set(configs) == {"llama-70b", "llama-70b-canary", "mistral-7b", "qwen-14b"}
    assert configs["llama-70b"].gpus == (0, 1, 2, 3)
    assert configs["llama-70b-canary"].gpus == (4, 5)
    assert sorted(g for c in configs.values() for g in c.gpus) == list(range(8))  # type: ignore[type-var]
    assert all(c.kind == "vllm" and c.url.startswith("http://127.0.0.1:") for c in configs.values())
    assert configs["llama-70b"].weights_bytes == pytest.approx(141.2e9)
    path = configs["llama-70b-canary"].version_file
    assert path is not None
    assert 'app.kubernetes.io/version="2024-09"' in path.read_text().splitlines()
    assert VersionReader(list(configs.values())).read() == {
        "llama-70b": "2024-07",
        "llama-70b-canary": "2024-09",
        "mistral-7b": "v0.3",
        "qwen-14b": "2024-09",
    }


async def test_agent_scraper_reads_every_engine(node: tuple[SimNode, ManualClock]) -> None:
    sim, clock = node
    clock.advance(300)
    scrapes = await scrape_all(sim, clock)
    for name, scrape in scrapes.items():
        assert scrape.up, (name, scrape.error)
        assert scrape.kind == "vllm"
        assert 95_000 <= scrape.size_bytes <= 130_000
        (model,) = scrape.models
        assert model.prompt_tokens_total and model.prompt_tokens_total > 0
        assert model.generation_tokens_total and model.generation_tokens_total > 0
        assert model.ttft_seconds is not None and model.ttft_seconds.count > 0
        assert model.kv_cache_usage_ratio is not None and 0 <= model.kv_cache_usage_ratio <= 1
    assert scrapes["llama-70b"].models[0].model == "meta-llama/Llama-3.1-70B-Instruct"
    assert scrapes["llama-70b-canary"].models[0].model == "meta-llama/Llama-3.1-70B-Instruct"


async def test_agent_scraper_against_negotiating_engines(tmp_path: Path) -> None:
    # vLLM's make_asgi_app answers OpenMetrics to any Accept header that lists it, and
    # prometheus_client then renames vllm:x samples to vllm_x but not their # TYPE lines
    # (prometheus/client_python#1177): the scraper must ask for text/plain only.
    clock = ManualClock(T0)
    sim = SimNode(clock, tmp_path, seed=1, tick_seconds=None, target_page_bytes=None)  # negotiates like vLLM
    await sim.start()
    try:
        clock.advance(300)
        scrapes = await scrape_all(sim, clock)
    finally:
        await sim.stop()
    for scrape in scrapes.values():
        assert scrape.up
        (model,) = scrape.models
        assert model.generation_tokens_total


async def test_gpu_load_per_gpu(node: tuple[SimNode, ManualClock]) -> None:
    sim, clock = node
    t = clock.now() + 600
    loads = [sim.gpu_load(i, t) for i in range(8)]
    assert all(load is not None for load in loads)
    assert loads[0] == loads[1] == loads[2] == loads[3]  # one tensor-parallel engine
    assert loads[4] == loads[5]
    for load in loads:
        assert load is not None
        assert 0.5 < load.util_gpu_ratio <= 1.0  # afternoon traffic keeps every engine busy
        assert 0.1 < load.dram_bw_ratio < 1.0
        assert 0.85 * H100_SXM.memory_bytes < load.memory_used_bytes <= H100_SXM.memory_bytes
    assert sim.gpu_load(8, t) is None


async def test_fake_nvml_reads_the_simulated_node(node: tuple[SimNode, ManualClock]) -> None:
    sim, clock = node
    nvml = FakeNvml("H100-SXM", count=8, load=sim.gpu_load, clock=clock.now)
    nvml.nvmlInit()
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
        nvml.nvmlDeviceGetUtilizationRates(handles[0])
        clock.advance(60)
        util = [nvml.nvmlDeviceGetUtilizationRates(h).gpu for h in handles]
        used = [nvml.nvmlDeviceGetMemoryInfo(h).used for h in handles]
    finally:
        nvml.nvmlShutdown()
    assert all(u >= 50 for u in util)  # percent, as NVML reports it
    assert all(u > 70e9 for u in used)  # bytes: vLLM's pre-allocated 90 %


async def test_rollout_slows_the_engine_and_rewrites_version_file(
    node: tuple[SimNode, ManualClock],
) -> None:
    sim, clock = node
    cfg = {c.name: c for c in sim.engine_configs()}["llama-70b-canary"]
    clock.advance(600)
    s0 = await scrape_all(sim, clock)
    clock.advance(1800)
    s1 = await scrape_all(sim, clock)
    sim.rollout("llama-70b-canary", "2024-10", throughput_factor=0.65)
    assert VersionReader([cfg]).read() == {"llama-70b-canary": "2024-10"}
    clock.advance(600)  # let the queue settle on the new build
    s2 = await scrape_all(sim, clock)
    clock.advance(1800)
    s3 = await scrape_all(sim, clock)
    before = generation(s1["llama-70b-canary"]) - generation(s0["llama-70b-canary"])
    after = generation(s3["llama-70b-canary"]) - generation(s2["llama-70b-canary"])
    # the same half hour of the afternoon, ±: the build produces ~35 % fewer tokens on the same GPUs
    assert after / before == pytest.approx(0.65, rel=0.1)
    # the other engines are untouched
    main_before = generation(s1["llama-70b"]) - generation(s0["llama-70b"])
    main_after = generation(s3["llama-70b"]) - generation(s2["llama-70b"])
    assert main_after / main_before == pytest.approx(1.0, rel=0.15)
    with pytest.raises(KeyError):
        sim.rollout("no-such-engine", "x")


async def test_scenario_schedules_a_future_rollout(node: tuple[SimNode, ManualClock]) -> None:
    sim, clock = node
    cfg = {c.name: c for c in sim.engine_configs()}["llama-70b-canary"]
    assert SCENARIOS["regression"] is REGRESSION
    REGRESSION.schedule(sim, start=clock.now())
    clock.advance(3600)
    await scrape_all(sim, clock)
    sim.advance(clock.now())
    assert VersionReader([cfg]).read() == {"llama-70b-canary": "2024-09"}
    clock.advance(3601)  # past the event at +2 h
    sim.advance(clock.now())
    assert VersionReader([cfg]).read() == {"llama-70b-canary": "2024-10"}
    assert sim.engines["llama-70b-canary"].throughput_factor == 0.65


async def test_gpus_must_not_be_shared(tmp_path: Path) -> None:
    from infercost_sim.node import DEFAULT_ENGINES, EngineSpec

    clash = (*DEFAULT_ENGINES, EngineSpec("extra", DEFAULT_ENGINES[2].model, (6,), "v1"))
    with pytest.raises(ValueError, match="GPU 6"):
        SimNode(ManualClock(T0), tmp_path, engines=clash)


def test_engine_configs_need_a_started_node(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="start"):
        SimNode(ManualClock(T0), tmp_path, target_page_bytes=None).engine_configs()
