"""The engine path against a REAL inference engine: llama.cpp's server (xllamacpp wheel) on a tiny
random-weight model generated here, scraped by :class:`EngineScraper` while it serves requests.

- the token deltas the agent computes from scrapes equal the ``usage`` the server returned;
- a restart resets the cumulative counters: the scraper reports the lower values, deltas never go
  negative, and the scrapes while it is down are ``up=False``;
- the live page has the same series as the recorded fixture (``UPDATE_GOLDEN=1`` re-records it).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import gguf  # noqa: F401
import pytest
import xllamacpp  # noqa: F401  (CI installs it: a missing engine must fail, not skip)
from llamacpp_server import MODEL_ALIAS, LlamaServer, make_tiny_llama

from agent.clock import SystemClock
from agent.config import EngineConfig
from agent.cost.quantiles import counter_delta
from agent.samples import EngineScrape
from agent.sources.engines.scraper import EngineScraper

RECORDED = Path(__file__).parent / "fixtures" / "expositions" / "llamacpp_recorded.txt"
SCRAPE_EVERY = 0.02  # seconds between scrapes while requests run: several scrapes per request


@pytest.fixture(scope="session")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """One llama.cpp server for the session, killed in teardown."""
    model = make_tiny_llama(tmp_path_factory.mktemp("llama") / "tiny-llama.gguf")
    server = LlamaServer(model)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _cfg(server: LlamaServer) -> EngineConfig:
    return EngineConfig(name="llama", kind="auto", url=server.base_url + "/metrics", model=MODEL_ALIAS)


def _tokens(scrape: EngineScrape) -> tuple[float, float]:
    assert scrape.up, scrape.error
    (m,) = scrape.models
    assert m.model == MODEL_ALIAS
    assert m.prompt_tokens_total is not None and m.generation_tokens_total is not None
    return m.prompt_tokens_total, m.generation_tokens_total


async def _drive(server: LlamaServer, scraper: EngineScraper, n: int, first_seed: int) -> tuple[
    list[EngineScrape], int, int
]:  # fmt: skip
    """Send ``n`` completions (in a worker thread) while scraping; return scrapes and usage sums."""
    scrapes = [await scraper.scrape()]

    def requests() -> tuple[int, int]:
        prompt_sum = completion_sum = 0
        for i in range(n):
            seed = first_seed + i
            out = server.complete(
                f"Request {seed}: the llama server said a little word", 24 + 8 * (i % 3), seed
            )
            prompt_sum += out["usage"]["prompt_tokens"]
            completion_sum += out["usage"]["completion_tokens"]
        return prompt_sum, completion_sum

    work = asyncio.create_task(asyncio.to_thread(requests))
    while not work.done():
        scrapes.append(await scraper.scrape())
        await asyncio.sleep(SCRAPE_EVERY)
    prompt_sum, completion_sum = await work
    scrapes.append(await scraper.scrape())
    return scrapes, prompt_sum, completion_sum


def _delta_sums(scrapes: list[EngineScrape]) -> tuple[float, float]:
    prompt = generation = 0.0
    for prev, cur in itertools.pairwise(scrapes):
        (p0, g0), (p1, g1) = _tokens(prev), _tokens(cur)
        dp, dg = counter_delta(p0, p1), counter_delta(g0, g1)
        assert dp is not None and dg is not None and dp >= 0 and dg >= 0
        prompt += dp
        generation += dg
    return prompt, generation


async def test_scraped_token_deltas_equal_the_usage_the_server_returned(llama: LlamaServer) -> None:
    async with aiohttp.ClientSession() as session:
        scraper = EngineScraper(_cfg(llama), session, SystemClock())
        scrapes, prompt_sum, completion_sum = await _drive(llama, scraper, n=6, first_seed=100)
    assert scraper.kind == "llamacpp"  # auto-detected
    assert len(scrapes) >= 3
    assert all(s.up and s.kind == "llamacpp" for s in scrapes)
    assert prompt_sum > 0 and completion_sum > 0
    assert _delta_sums(scrapes) == (prompt_sum, completion_sum)
    (first,), (last,) = scrapes[0].models, scrapes[-1].models
    assert last.decode_seconds_total is not None and first.decode_seconds_total is not None
    assert last.decode_seconds_total > first.decode_seconds_total
    assert last.kv_cache_usage_ratio is None and last.ttft_seconds is None  # llama.cpp has none


async def test_restart_resets_counters_and_deltas_never_go_negative(llama: LlamaServer) -> None:
    async with aiohttp.ClientSession() as session:
        scraper = EngineScraper(_cfg(llama), session, SystemClock())
        before, _, _ = await _drive(llama, scraper, n=3, first_seed=200)
        high = _tokens(before[-1])
        assert high[0] > 0 and high[1] > 0

        llama.stop()
        down = await scraper.scrape()
        llama.start()  # same port: every counter starts from zero
        after, prompt_sum, completion_sum = await _drive(llama, scraper, n=3, first_seed=300)

    assert down.up is False and down.error is not None and down.error.startswith("connection failed")
    low = _tokens(after[0])
    assert low[0] < high[0] and low[1] < high[1]  # the scraper reports the lower, restarted values
    # Across the restart the delta is what was counted since it (increase() semantics), never < 0.
    assert counter_delta(high[0], low[0]) == low[0]
    assert counter_delta(high[1], low[1]) == low[1]
    everything = [*before, *after]
    total_prompt, total_generation = _delta_sums(everything)
    since_restart = _delta_sums(after)
    assert since_restart == (prompt_sum, completion_sum)
    assert total_prompt >= since_restart[0] and total_generation >= since_restart[1]


def _series(text: str) -> list[tuple[str, str]]:
    """(name, type) of every TYPE line: the page's shape, without its values."""
    return re.findall(r"(?m)^# TYPE (\S+) (\S+)$", text)


async def test_live_page_matches_the_recorded_fixture(llama: LlamaServer) -> None:
    llama.complete("the llama server", 8, 1)
    async with aiohttp.ClientSession() as session, session.get(llama.base_url + "/metrics") as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        live = await resp.text()
    if os.environ.get("UPDATE_GOLDEN") == "1":
        RECORDED.write_text(live)
    assert _series(live) == _series(RECORDED.read_text())
    assert ("llamacpp:tokens_predicted_total", "counter") in _series(live)


async def test_the_daemon_prices_a_cpu_engine_per_hour_across_a_restart(
    llama: LlamaServer, tmp_path: Path
) -> None:
    """The real Agent against the real server: $ per 1M = price × elapsed ÷ tokens, within 1 %,
    tokens equal the usage the server returned, and a restart makes no negative tokens and no spike."""
    from agent.app import build_agent
    from agent.config import Config, ExportersConfig, IntervalsConfig, NvmlConfig, PrometheusExporterConfig
    from agent.cost.window import TickResult
    from agent.snapshot import Snapshot
    from agent.sources.prices import parse_price_book

    price = 0.50  # $ per hour for this CPU-only engine
    book = parse_price_book({"engines": {"llama": {"usd_per_hour": price}}}, "test-book")
    cfg = Config(
        node="cpu-node",
        state_dir=tmp_path,
        intervals=IntervalsConfig(nvml_seconds=1, scrape_seconds=0.25, window_seconds=60),
        nvml=NvmlConfig(backend="none"),
        exporters=ExportersConfig(prometheus=PrometheusExporterConfig(port=0)),
    )
    ticks: list[TickResult] = []
    agent = await build_agent(
        cfg,
        clock=SystemClock(),
        book=book,
        backend=None,
        engines=[_cfg(llama)],
        history=False,
        on_tick=[lambda t, _s: ticks.append(t)],
    )
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    usage_prompt = usage_completion = 0

    def requests(first_seed: int, n: int) -> tuple[int, int]:
        p = c = 0
        for i in range(n):
            out = llama.complete(f"Request {first_seed + i}: tell the llama", 32, first_seed + i)
            p += out["usage"]["prompt_tokens"]
            c += out["usage"]["completion_tokens"]
        return p, c

    try:
        await agent.started.wait()
        while len(ticks) < 2:  # a baseline tick before any request
            await asyncio.sleep(0.05)
        p, c = await asyncio.to_thread(requests, 500, 5)
        usage_prompt, usage_completion = usage_prompt + p, usage_completion + c
        await asyncio.sleep(0.6)
        await asyncio.to_thread(llama.restart)
        await asyncio.sleep(0.6)
        p, c = await asyncio.to_thread(requests, 600, 5)
        usage_prompt, usage_completion = usage_prompt + p, usage_completion + c
        n = len(ticks)
        while len(ticks) < n + 3:  # let the last requests be scraped
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)

    windows = [w for t in ticks for w in t.windows]
    assert all(w.usage.prompt_tokens >= 0 and w.usage.generation_tokens >= 0 for w in windows)
    # tokens: exactly what the server said it processed, across the restart
    assert sum(w.usage.prompt_tokens for w in windows) == usage_prompt
    assert sum(w.usage.generation_tokens for w in windows) == usage_completion
    # cost: price × elapsed, and no tick costs more than price × its own length (no spike)
    elapsed = sum(t.end - t.start for t in ticks if t.windows)
    cost = sum(w.cost_usd for w in windows)
    assert cost == pytest.approx(price * elapsed / 3600, rel=0.01)
    for w in windows:
        assert w.cost_usd == pytest.approx(price * w.usage.duration / 3600, rel=1e-9)
    per_million = cost / usage_completion * 1e6
    snap: Snapshot = agent.snapshot()
    (m,) = snap.models
    assert m.cost_usd_total / m.generation_tokens_total * 1e6 == pytest.approx(per_million, rel=0.01)
    assert per_million == pytest.approx(price * elapsed / 3600 / usage_completion * 1e6, rel=0.01)
