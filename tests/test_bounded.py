"""Bounded by construction: model names that stop appearing expire from /metrics, the window join and
memory; a histogram over the bucket limit and a page over its CPU budget are refused and named, the
other engines going on. Real HTTP engines on 127.0.0.1, the real scraper, parser and daemon."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from agent.app import build_agent
from agent.clock import AcceleratedClock, ManualClock
from agent.config import (
    Config,
    EngineConfig,
    ExportersConfig,
    IntervalsConfig,
    LimitsConfig,
    NvmlConfig,
    PrometheusExporterConfig,
)
from agent.sources.engines.parser import PageRefused, ParseError
from agent.sources.engines.scraper import MAX_SKIPPED_SCRAPES, EngineScraper
from agent.sources.engines.vllm import ADAPTER
from agent.sources.prices import parse_price_book


def vllm_page(models: list[str], tokens: float, buckets: int = 5) -> str:
    """A vLLM page: per model its token counters, running requests and one latency histogram of
    ``buckets`` finite bounds (and +Inf)."""
    out = ["# TYPE vllm:generation_tokens_total counter", "# TYPE vllm:prompt_tokens_total counter"]
    for m in models:
        out.append(f'vllm:generation_tokens_total{{model_name="{m}"}} {tokens}')
        out.append(f'vllm:prompt_tokens_total{{model_name="{m}"}} {tokens / 2}')
        out.append(f'vllm:num_requests_running{{model_name="{m}"}} 3')
    out.append("# TYPE vllm:e2e_request_latency_seconds histogram")
    for m in models:
        for i in range(buckets):
            le = 0.001 * (i + 1)
            out.append(f'vllm:e2e_request_latency_seconds_bucket{{le="{le:g}",model_name="{m}"}} {i}')
        out.append(f'vllm:e2e_request_latency_seconds_bucket{{le="+Inf",model_name="{m}"}} {buckets}')
        out.append(f'vllm:e2e_request_latency_seconds_count{{model_name="{m}"}} {buckets}')
        out.append(f'vllm:e2e_request_latency_seconds_sum{{model_name="{m}"}} 1.5')
    return "\n".join(out) + "\n"


class Engine:
    """An engine's /metrics on 127.0.0.1 whose page is ``page(n)`` at the n-th request."""

    def __init__(self, page: Callable[[int], str]) -> None:
        self.page = page
        self.requests = 0
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def _metrics(self, _req: web.Request) -> web.Response:
        self.requests += 1
        return web.Response(text=self.page(self.requests), content_type="text/plain")

    async def __aenter__(self) -> Engine:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"


def _models_on(text: str) -> set[str]:
    return {
        s.labels["model"]
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if "model" in s.labels and s.labels.get("engine") == "churn"
    }


async def test_a_new_model_name_every_scrape_expires_from_metrics_join_and_memory(tmp_path: Path) -> None:
    ttl, interval = 120.0, 10.0  # seconds of the daemon's (accelerated) time
    async with Engine(lambda n: vllm_page([f"model-{n}"], 100.0 * n)) as churn:
        clock = AcceleratedClock(100.0)
        cfg = Config(
            node="n",
            state_dir=tmp_path,
            intervals=IntervalsConfig(nvml_seconds=5, scrape_seconds=interval, window_seconds=60),
            nvml=NvmlConfig(backend="none"),
            exporters=ExportersConfig(prometheus=PrometheusExporterConfig(port=0)),
            limits=LimitsConfig(series_ttl_seconds=ttl),
        )
        book = parse_price_book({"gpus": [{"match": "H100", "usd_per_hour": 2.0}]}, "book")
        engines = [EngineConfig(name="churn", kind="vllm", url=churn.url, timeout_seconds=5)]
        agent = await build_agent(cfg, clock=clock, book=book, engines=engines, history=False)
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        await agent.started.wait()
        assert agent.prometheus is not None
        live = int(ttl / interval) + 2  # the names read within the last ttl, and the tick in flight
        most_on_page = most_joined = 0
        try:
            async with aiohttp.ClientSession() as s:
                while churn.requests < 3 * live + 20:  # several lifetimes of names
                    async with s.get(f"http://127.0.0.1:{agent.prometheus.port}/metrics") as r:
                        most_on_page = max(most_on_page, len(_models_on(await r.text())))
                    most_joined = max(most_joined, agent.joiner.remembered_models)
                    await asyncio.sleep(0.05)
        finally:
            stop.set()
            await asyncio.wait_for(task, 20)
        names = churn.requests
        assert names >= 3 * live + 20
        assert 1 <= most_on_page <= live, most_on_page
        assert most_joined <= live, most_joined
        assert agent.joiner.expired_models >= names - live - 2
        assert agent.ledger.expired_series >= names - live - 2


async def _scrape_all(scrapers: list[EngineScraper]) -> dict[str, tuple[bool, str | None]]:
    got = await asyncio.gather(*(s.scrape() for s in scrapers))
    return {r.engine: (r.up, r.error) for r in got}


async def test_a_histogram_over_the_bucket_limit_is_refused_and_the_rest_goes_on() -> None:
    limits = LimitsConfig(max_histogram_buckets=1000)
    async with (
        Engine(lambda n: vllm_page(["m"], 10.0 * n, buckets=999)) as at_limit,
        Engine(lambda n: vllm_page(["m"], 10.0 * n, buckets=100_000)) as hostile,
        Engine(lambda n: vllm_page(["m"], 10.0 * n)) as good,
        aiohttp.ClientSession() as session,
    ):
        clock = ManualClock()
        scrapers = [
            EngineScraper(
                EngineConfig(name=name, kind="vllm", url=e.url, timeout_seconds=30), session, clock, limits
            )
            for name, e in (("at-limit", at_limit), ("hostile", hostile), ("good", good))
        ]
        states = await _scrape_all(scrapers)
        assert states["good"] == (True, None)
        assert states["at-limit"] == (True, None)  # 999 bounds and +Inf: 1,000 buckets
        up, why = states["hostile"]
        assert not up and why is not None
        assert "more than 1000 buckets" in why and "limits.max_histogram_buckets" in why


async def test_a_page_over_its_cpu_budget_is_refused_named_and_read_less_often() -> None:
    page = vllm_page([f"m{i}" for i in range(64)], 1e6, buckets=40)
    async with (
        Engine(lambda _n: page) as costly,
        Engine(lambda n: vllm_page(["m"], 10.0 * n)) as good,
        aiohttp.ClientSession() as session,
    ):
        clock = ManualClock()
        tiny = LimitsConfig(scrape_cpu_seconds=1e-6)  # any real page costs more than a microsecond
        slow = EngineScraper(EngineConfig(name="costly", kind="vllm", url=costly.url), session, clock, tiny)
        fine = EngineScraper(EngineConfig(name="good", kind="vllm", url=good.url), session, clock)
        fetched = []
        for _ in range(1 + 2 + 4 + 1):
            states = await _scrape_all([slow, fine])
            fetched.append(costly.requests)
            assert states["good"] == (True, None)
            up, why = states["costly"]
            assert not up and why is not None and "limits.scrape_cpu_seconds" in why
        # read at the 1st, 3rd and 6th scrape: one skipped, then two, then four (doubling)
        assert fetched == [1, 1, 2, 2, 2, 3, 3, 3] and slow.cpu_seconds > 1e-6
        assert MAX_SKIPPED_SCRAPES >= 4
        # the same page within a real budget is read
        ok = EngineScraper(EngineConfig(name="costly", kind="vllm", url=costly.url), session, clock)
        reading = await ok.scrape()
        assert reading.up and len(reading.models) == 64 and ok.cpu_seconds > 0


def test_the_parser_stops_at_the_bucket_limit_without_reading_the_rest() -> None:
    """A page whose histogram passes the limit is refused at the bucket past it: a malformed line
    further down (which a whole read would report) is never reached."""
    page = vllm_page(["m"], 1.0, buckets=2000) + 'vllm:num_requests_running{model_name="m" 1\n'
    with pytest.raises(PageRefused, match=r'model_name="m"\} has more than 1000 buckets'):
        ADAPTER.read(page, max_buckets=1000)
    with pytest.raises(ParseError):  # read whole, the bad line is found
        ADAPTER.read(page, max_buckets=5000)
    # two series of 600 buckets each: 1,200 bucket lines of the family, each series within the limit
    two = vllm_page(["a", "b"], 1.0, buckets=599)
    assert {m.model for m in ADAPTER.read(two, max_buckets=1000).models} == {"a", "b"}


class Streamer:
    """An engine on 127.0.0.1 whose page is ``body`` bytes sent with ``headers``, in 64 kB writes."""

    def __init__(self, body: bytes, headers: dict[str, str]) -> None:
        self.body, self.headers = body, headers
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def _page(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers=self.headers)
        await resp.prepare(request)
        try:
            for i in range(0, len(self.body), 65536):
                await resp.write(self.body[i : i + 65536])
        except (ConnectionError, RuntimeError):  # the agent hung up: what it was meant to do
            pass
        return resp

    async def __aenter__(self) -> Streamer:
        app = web.Application()
        app.router.add_get("/metrics", self._page)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/metrics"
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


async def test_a_compressed_page_is_refused_unexpanded_and_an_oversized_one_not_kept() -> None:
    import gc
    import gzip
    import tracemalloc

    bomb = gzip.compress(b"0" * (64 * 1024 * 1024), 9)  # 64 MiB of text in about 64 kB
    big = b'vllm:num_requests_running{model_name="h"} 1\n' * 300_000  # 13 MB, over max_bytes
    async with (
        Streamer(bomb, {"Content-Type": "text/plain", "Content-Encoding": "gzip"}) as zipped,
        Streamer(big, {"Content-Type": "text/plain"}) as huge,
        aiohttp.ClientSession() as session,
    ):
        clock = ManualClock()
        z = EngineScraper(EngineConfig(name="z", kind="vllm", url=zipped.url), session, clock)
        h = EngineScraper(
            EngineConfig(name="h", kind="vllm", url=huge.url, timeout_seconds=30), session, clock
        )
        gc.disable()  # what is freed must be freed by reference counts, not by a later cyclic GC
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(3):
                rz, rh = await z.scrape(), await h.scrape()
                assert not rz.up and rz.error is not None and "compressed body" in rz.error
                assert not rh.up and rh.error is not None and "max_bytes" in rh.error
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
            gc.enable()
        assert held < 4 * 1024 * 1024, held  # bytes: not one 8 MiB page (of the three read) kept
