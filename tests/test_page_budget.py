"""Engine pages in flight share one byte budget (``limits.page_bytes_in_flight``): it is never
passed; a page that cannot fit is refused and named while the other engines go on; a page that
holds nothing yet waits for room; a page is read as it arrives, never held whole.

The engines are a separate process on 127.0.0.1 streaming their pages in 64 kB writes; the real
scraper, parser and adapter read them. Counts and bounds only, never wall-clock times."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import aiohttp
import pytest

from agent.clock import ManualClock
from agent.config import EngineConfig, LimitsConfig
from agent.samples import EngineScrape
from agent.sources.engines.scraper import EngineScraper, PageBudget

MIB = 1024 * 1024

# The engines' process: /NAME/metrics?kb=K[&buckets=B][&declared=1] is a vLLM page whose counter is
# the request's number, padded with K kB of series nobody reads (and a histogram of B buckets),
# written 64 kB at a time with a pause between writes (so pages of several engines are in flight
# together), with a Content-Length only when declared=1.
_SERVER = r"""
import asyncio, sys
from aiohttp import web

counts = {}

def page(name, n, kb):
    head = (
        f'vllm:generation_tokens_total{{model_name="{name}"}} {100 * n}\n'
        f'vllm:prompt_tokens_total{{model_name="{name}"}} {50 * n}\n'
    )
    pad = "".join(f'http_padding_bytes{{i="{i:08d}"}} 1\n' for i in range(kb * 1024 // 32 + 1))
    return (head + pad[: kb * 1024]).rsplit("\n", 1)[0] + "\n"

def histogram(name, buckets):
    return "".join(
        f'vllm:e2e_request_latency_seconds_bucket{{le="{i}",model_name="{name}"}} {i}\n'
        for i in range(buckets)
    )

async def handle(request):
    name = request.match_info["name"]
    n = counts[name] = counts.get(name, 0) + 1
    body = page(name, n, int(request.query.get("kb", "0")))
    body = (body + histogram(name, int(request.query.get("buckets", "0")))).encode()
    resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
    if request.query.get("declared") == "1":
        resp.content_length = len(body)
    await resp.prepare(request)
    try:
        for i in range(0, len(body), 65536):
            await resp.write(body[i : i + 65536])
            await asyncio.sleep(0.01)
        await resp.write_eof()
    except (ConnectionError, RuntimeError):  # the agent hung up on a refused page
        pass
    return resp

async def main():
    app = web.Application()
    app.router.add_get("/{name}/metrics", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(runner.addresses[0][1], flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


@pytest.fixture(scope="module")
def engines_port() -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, "-c", _SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline())
    finally:
        proc.terminate()
        proc.wait(10)


@asynccontextmanager
async def _scrapers(
    port: int,
    pages: dict[str, str],
    budget: PageBudget,
    limits: LimitsConfig | None = None,
    timeout: float = 30,
) -> AsyncIterator[dict[str, EngineScraper]]:
    async with aiohttp.ClientSession() as session:
        clock = ManualClock()
        yield {
            name: EngineScraper(
                EngineConfig(
                    name=name,
                    kind="vllm",
                    url=f"http://127.0.0.1:{port}/{name}/metrics?{query}",
                    timeout_seconds=timeout,
                ),
                session,
                clock,
                limits,
                budget,
            )
            for name, query in pages.items()
        }


async def _round(scrapers: dict[str, EngineScraper]) -> dict[str, EngineScrape]:
    got = await asyncio.gather(*(s.scrape() for s in scrapers.values()))
    return {r.engine: r for r in got}


def _tokens(r: EngineScrape) -> float | None:
    return r.models[0].generation_tokens_total if r.up and r.models else None


async def test_pages_growing_past_the_budget_are_refused_named_and_the_rest_go_on(engines_port: int) -> None:
    budget = PageBudget(MIB)
    big = {f"big-{c}": "kb=700" for c in "abc"}  # three can never be in flight whole together
    async with _scrapers(engines_port, {**big, "good": "kb=1"}, budget) as scrapers:
        good: list[float | None] = []
        outcomes: list[bool] = []
        for _ in range(4):
            got = await _round(scrapers)
            assert budget.held == 0  # every scrape gave back what it took
            good.append(_tokens(got["good"]))
            for name in big:
                r = got[name]
                if r.up:
                    assert _tokens(r) is not None
                else:
                    assert r.error is not None and "limits.page_bytes_in_flight" in r.error, r.error
                outcomes.append(r.up)
    assert budget.most <= budget.total, budget.most
    assert budget.refused >= 1 and not all(outcomes)  # pages grew past the room left: refused
    assert any(outcomes)  # and others were read whole
    read = [t for t in good if t is not None]
    assert len(read) == len(good) and read == sorted(read) and read[0] < read[-1]  # the good engine went on


async def test_declared_pages_wait_for_room_and_are_all_read(engines_port: int) -> None:
    budget = PageBudget(MIB)
    pages = {f"declared-{c}": "kb=700&declared=1" for c in "abc"}
    async with _scrapers(engines_port, pages, budget) as scrapers:
        for _ in range(2):
            got = await _round(scrapers)
            assert all(r.up for r in got.values()), {n: r.error for n, r in got.items()}
            assert budget.held == 0
    assert budget.most <= budget.total
    assert budget.waits >= 1 and budget.refused == 0  # one at a time: the others waited


async def test_a_page_larger_than_the_whole_budget_is_refused_and_a_full_budget_times_out_named(
    engines_port: int,
) -> None:
    budget = PageBudget(MIB)
    async with _scrapers(engines_port, {"whale": "kb=1500", "small": "kb=1"}, budget, timeout=1) as scrapers:
        got = await _round(scrapers)
        assert got["small"].up
        whale = got["whale"]
        assert not whale.up and whale.error is not None
        assert "more than limits.page_bytes_in_flight (1048576)" in whale.error, whale.error
        assert budget.held == 0
        await budget.take(budget.total, 0)  # the whole budget held elsewhere
        try:
            blocked = await scrapers["small"].scrape()
        finally:
            budget.give(budget.total)
        assert not blocked.up and blocked.error is not None
        assert "waiting for room" in blocked.error and "limits.page_bytes_in_flight" in blocked.error
        assert (await scrapers["small"].scrape()).up  # room again: read
    assert budget.most <= budget.total


async def test_a_page_is_read_as_it_arrives_never_held_whole(engines_port: int) -> None:
    import gc
    import tracemalloc

    kb = 6 * 1024  # a 6 MiB page, mostly series nobody reads
    limits = LimitsConfig(scrape_cpu_seconds=60)  # tracemalloc slows the parse: the CPU budget aside
    async with _scrapers(engines_port, {"padded": f"kb={kb}"}, PageBudget(64 * MIB), limits) as scrapers:
        assert (await scrapers["padded"].scrape()).up  # the connection and the parser warm
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            r = await scrapers["padded"].scrape()
            peak = tracemalloc.get_traced_memory()[1] - before
        finally:
            tracemalloc.stop()
    assert r.up and r.size_bytes >= kb * 1024 - 64
    # bytes: a chunk or two and their text at a time; a page read whole (bytes, text and a copy of
    # the text) would be three times the page, and even its bytes alone are the page
    assert peak < r.size_bytes / 2, (peak, r.size_bytes)


async def test_a_refused_page_is_freed_at_once_not_by_a_later_cyclic_gc(engines_port: int) -> None:
    import gc
    import tracemalloc

    # a histogram of 100,000 buckets: refused once its series passes 1,000, its reader then holding
    # a thousand samples; a failed scrape's traceback would keep them until a full cyclic GC
    pages = {"buckets": "buckets=100000", "good": "kb=1"}
    async with _scrapers(engines_port, pages, PageBudget(64 * MIB)) as scrapers:
        await _round(scrapers)  # the connections and the parser warm
        gc.collect()
        gc.disable()  # what is freed must be freed by reference counts
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(5):
                got = await _round(scrapers)
                assert got["good"].up
                why = got["buckets"].error
                assert not got["buckets"].up and why is not None and "limits.max_histogram_buckets" in why
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
            gc.enable()
    assert held < 256 * 1024, held  # bytes: not one refused page's thousand samples (~0.5 MB) kept
