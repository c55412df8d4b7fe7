"""Memory, not time: what reading an engine page costs in bytes per series, while it is read and at
its peak, in-process (tracemalloc) and through the real scraper from a page server on 127.0.0.1.

Why it matters: a page refused for its CPU cost (``limits.scrape_cpu_seconds``) is refused only once
that CPU is spent, so what it left in memory is whatever the parser keeps for as many series as it
reads in that time; CPython keeps that working set after the page is dropped (a step in the agent's
RSS, one per costly page, not a leak). Every bound here is per series read, so it holds whatever
the page's size, and each is well under what the reader kept before it held series compactly
(about 1 kB per series while reading: a Sample, its label dict, a frozenset key and a string per
label name and value)."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager

import aiohttp
from aiohttp import web

from agent.clock import ManualClock
from agent.config import EngineConfig, LimitsConfig
from agent.sources.engines.parser import PageRefused
from agent.sources.engines.scraper import CHUNK_BYTES, EngineScraper
from agent.sources.engines.vllm import ADAPTER

MODELS = 16
BUCKETS = 599  # bounds per model (and +Inf): each histogram within the default limit of 1,000
# Why these bounds (bytes per series): a series being read is its value (a float), a tuple of shared
# strings and a slot in a dict, about 140 B; read whole, each series is also a Sample and its label
# dict, about 300 B more, and the scrape adds the mapping's own tables. The bounds leave room for
# allocator and Python-version differences; the old reader's figures (1,040, 1,115 and 1,160 B) are
# far over them.
HELD_WHILE_READ = 256
PEAK_READ_WHOLE = 640
PEAK_SCRAPE = 800


def costly_page(models: int = MODELS, buckets: int = BUCKETS) -> str:
    """A valid vLLM page of many histogram series: per model ``buckets`` bounds and +Inf."""
    out = []
    for m in range(models):
        name = f"lora-{m}"
        out.append(f'vllm:generation_tokens_total{{model_name="{name}"}} 1000')
        for i in range(buckets):
            out.append(
                f'vllm:e2e_request_latency_seconds_bucket{{le="{0.01 * (i + 1):g}",model_name="{name}"}} {i}'
            )
        out.append(f'vllm:e2e_request_latency_seconds_bucket{{le="+Inf",model_name="{name}"}} {buckets}')
        out.append(f'vllm:e2e_request_latency_seconds_count{{model_name="{name}"}} {buckets}')
        out.append(f'vllm:e2e_request_latency_seconds_sum{{model_name="{name}"}} 2.5')
    return "\n".join(out) + "\n"


def _pieces(text: str) -> Iterator[str]:
    """``text`` in whole lines of about one chunk each, as the scraper feeds it."""
    at = 0
    while at < len(text):
        end = text.rfind("\n", at, at + CHUNK_BYTES) + 1 or len(text)
        yield text[at:end]
        at = end


@contextmanager
def traced() -> Iterator[dict[str, int]]:
    """Bytes allocated and still held (``held``) and at most (``peak``) inside the block."""
    got: dict[str, int] = {}
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        yield got
        now, peak = tracemalloc.get_traced_memory()
        got["held"], got["peak"] = now - base, peak - base
    finally:
        tracemalloc.stop()


def test_a_page_being_read_holds_little_per_series() -> None:
    text = costly_page()
    series = text.count("\n")
    reader = ADAPTER.reader()
    pieces = list(_pieces(text))
    with traced() as mem:
        for piece in pieces:
            reader.feed(piece)
    assert mem["held"] < HELD_WHILE_READ * series, (mem, series)
    parsed = reader.finish()
    assert sum(len(v) for v in parsed.page.values()) == series  # every series read, none dropped


def test_a_page_read_whole_peaks_at_its_samples() -> None:
    text = costly_page()
    series = text.count("\n")
    with traced() as mem:
        reading = ADAPTER.read(text)
    assert len(reading.models) == MODELS and not reading.invalid_series
    assert mem["peak"] < PEAK_READ_WHOLE * series, (mem, series)


def test_a_page_over_the_bucket_limit_is_refused_holding_only_what_it_read() -> None:
    # one histogram of 100,000 buckets: refused at the one past the limit, having read a thousand
    text = costly_page(models=1, buckets=100_000)
    with traced() as mem:
        reader = ADAPTER.reader(max_buckets=1000)
        try:
            for piece in _pieces(text):
                reader.feed(piece)
        except PageRefused:
            pass
        else:
            raise AssertionError("not refused")
    # a piece's text twice (as fed, and with its newlines) and the thousand series it kept; the old
    # reader kept a thousand samples of about 1 kB each
    assert mem["peak"] < 4 * CHUNK_BYTES + HELD_WHILE_READ * 1000, mem


async def test_a_costly_page_scraped_peaks_at_a_bounded_size_per_series() -> None:
    text = costly_page()
    series = text.count("\n")

    async def metrics(_req: web.Request) -> web.Response:
        return web.Response(text=text, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    limits = LimitsConfig(scrape_cpu_seconds=60)  # tracemalloc slows the parse: the CPU budget aside
    try:
        async with aiohttp.ClientSession() as session:
            cfg = EngineConfig(name="costly", kind="vllm", url=f"http://127.0.0.1:{port}/metrics")
            scraper = EngineScraper(cfg, session, ManualClock(), limits)
            assert (await scraper.scrape()).up  # the connection, the parser and the page thread warm
            with traced() as mem:
                got = await scraper.scrape()
            scraper.thread.close()
    finally:
        await runner.cleanup()
    assert got.up and len(got.models) == MODELS, got.error
    assert mem["peak"] < PEAK_SCRAPE * series, (mem, series)
