"""The shared scraper against a real local HTTP server that misbehaves in every way we know.

Each hostile endpoint must give ``up=False`` with a reason, never an exception, and a healthy
scraper running beside them must be unaffected.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from netutil import free_port

from agent.clock import ManualClock
from agent.config import EngineConfig
from agent.sources.engines.scraper import EngineScraper

EXPOSITIONS = Path(__file__).parent / "fixtures" / "expositions"
LLAMA_PAGE = (EXPOSITIONS / "ref_llamacpp_real.txt").read_text()
VLLM_PAGE = (EXPOSITIONS / "vllm_v1_dp2.txt").read_text()
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MAX_BYTES = 256 * 1024  # small cap so the huge / endless cases are quick
TIMEOUT = 0.5  # seconds; the slow endpoints take far longer


async def _text(_: web.Request, body: str, ctype: str = "text/plain; version=0.0.4") -> web.Response:
    return web.Response(body=body.encode(), headers={"Content-Type": ctype})


def _fixed(body: str | bytes, ctype: str = "text/plain; version=0.0.4") -> Handler:
    """A handler that always answers 200 with this body and content type."""
    raw = body.encode() if isinstance(body, str) else body

    async def handler(_: web.Request) -> web.Response:
        return web.Response(body=raw, headers={"Content-Type": ctype})

    return handler


async def endless(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
    await resp.prepare(request)
    line = b"llamacpp:prompt_tokens_total 1\n" * 2048
    while True:  # ends when the client goes away
        await resp.write(line)
        await asyncio.sleep(0)


async def drip(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
    await resp.prepare(request)
    while True:  # a few bytes now and then: never big, never done
        await resp.write(b"# still here\n")
        await asyncio.sleep(0.05)


async def slow(request: web.Request) -> web.Response:
    await asyncio.sleep(30)
    return web.Response(text=LLAMA_PAGE)


async def vanish(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
    resp.content_length = 100_000
    await resp.prepare(request)
    await resp.write(LLAMA_PAGE.encode()[:500])
    assert request.transport is not None
    request.transport.close()
    return resp


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, dict[str, str]]]:
    """A local server on a free port; ``state`` switches the /flaky and /switch endpoints."""
    state = {"flaky": "down", "switch": "llamacpp"}

    async def flaky(request: web.Request) -> web.Response:
        if state["flaky"] == "down":
            return web.Response(status=503, text="busy")
        return await _text(request, LLAMA_PAGE)

    async def switch(request: web.Request) -> web.Response:
        return await _text(request, LLAMA_PAGE if state["switch"] == "llamacpp" else VLLM_PAGE)

    app = web.Application()
    routes: dict[str, Handler] = {
        "/llama": _fixed(LLAMA_PAGE),
        "/vllm": _fixed(VLLM_PAGE, "text/plain; version=0.0.4; charset=utf-8"),
        "/openmetrics": _fixed(VLLM_PAGE + "# EOF\n", "application/openmetrics-text; version=1.0.0"),
        "/huge": _fixed(LLAMA_PAGE * (2 * MAX_BYTES // len(LLAMA_PAGE))),
        "/binary": _fixed(b"\x1f\x8b\x08\x00\x00\x00" * 100, "text/plain"),
        "/latin1": _fixed("llamacpp:é 1\n".encode("latin-1"), "text/plain"),
        "/json": _fixed('{"gpuMemUsage": 1}', "application/json"),
        "/html": _fixed("<html>login</html>", "text/html"),
        "/garbage": _fixed("hello world\nthis is no exposition\n"),
        "/broken": _fixed("llamacpp:prompt_tokens_total{oops 1\n"),
        "/endless": endless,
        "/drip": drip,
        "/slow": slow,
        "/vanish": vanish,
        "/flaky": flaky,
        "/switch": switch,
    }
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", state
    finally:
        await runner.cleanup()


def _cfg(url: str, kind: str = "auto", **kw: object) -> EngineConfig:
    return EngineConfig.model_validate(
        {"name": "e", "kind": kind, "url": url, "timeout_seconds": TIMEOUT, "max_bytes": MAX_BYTES, **kw}
    )


HOSTILE = [
    ("/huge", "llamacpp", "page too large"),
    ("/endless", "llamacpp", "page too large"),
    ("/drip", "llamacpp", "timeout after 0.5 s"),
    ("/slow", "llamacpp", "timeout after 0.5 s"),
    ("/binary", "llamacpp", "binary body"),
    ("/latin1", "llamacpp", "not UTF-8"),
    ("/json", "auto", "wrong content type 'application/json"),
    ("/html", "auto", "wrong content type 'text/html"),
    ("/nowhere", "auto", "HTTP 404"),
    ("/garbage", "auto", "no known engine series"),
    ("/broken", "llamacpp", "unparsable page"),
    ("/vanish", "llamacpp", "ClientPayloadError"),
]


async def test_hostile_endpoints_are_down_with_a_reason_and_a_healthy_one_is_unaffected(
    server: tuple[str, dict[str, str]],
) -> None:
    base, _ = server
    clock = ManualClock()
    async with aiohttp.ClientSession() as session:
        hostile = [EngineScraper(_cfg(base + path, kind), session, clock) for path, kind, _ in HOSTILE]
        refused = EngineScraper(_cfg(f"http://127.0.0.1:{free_port()}/metrics"), session, clock)
        healthy = EngineScraper(_cfg(base + "/vllm", model="unused"), session, clock)
        results = await asyncio.gather(*(s.scrape() for s in [*hostile, refused, healthy]))
    for (path, _, reason), got in zip(HOSTILE, results, strict=False):
        assert got.up is False, path
        assert got.error is not None and reason in got.error, (path, got.error)
        assert got.models == ()
        assert got.timestamp == clock.now()
    assert results[-2].up is False
    assert results[-2].error is not None and results[-2].error.startswith("connection failed")
    ok = results[-1]
    assert ok.up is True and ok.error is None and ok.kind == "vllm" and ok.engine == "e"
    assert ok.size_bytes == len(VLLM_PAGE.encode())
    (m,) = ok.models
    assert m.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert m.generation_tokens_total == 750_000


async def test_openmetrics_page_is_accepted(server: tuple[str, dict[str, str]]) -> None:
    base, _ = server
    async with aiohttp.ClientSession() as session:
        got = await EngineScraper(_cfg(base + "/openmetrics"), session, ManualClock()).scrape()
    assert got.up and got.kind == "vllm" and got.models[0].prompt_tokens_total == 2_000_000


async def test_logs_once_per_state_change(
    server: tuple[str, dict[str, str]], caplog: pytest.LogCaptureFixture
) -> None:
    base, state = server
    caplog.set_level(logging.INFO, logger="agent.sources.engines.scraper")
    async with aiohttp.ClientSession() as session:
        scraper = EngineScraper(_cfg(base + "/flaky", "llamacpp", model="tiny"), session, ManualClock())
        downs = [await scraper.scrape() for _ in range(3)]
        state["flaky"] = "up"
        ups = [await scraper.scrape() for _ in range(2)]
    assert [r.up for r in downs + ups] == [False, False, False, True, True]
    assert downs[0].error == "HTTP 503"
    assert ups[0].models[0].model == "tiny"
    messages = [r.getMessage() for r in caplog.records]
    assert sum("is down: HTTP 503" in msg for msg in messages) == 1
    assert sum("is up again" in msg for msg in messages) == 1


async def test_auto_kind_is_detected_once_then_kept(server: tuple[str, dict[str, str]]) -> None:
    base, state = server
    async with aiohttp.ClientSession() as session:
        scraper = EngineScraper(_cfg(base + "/switch"), session, ManualClock())
        first = await scraper.scrape()
        state["switch"] = "vllm"
        second = await scraper.scrape()
    assert first.kind == "llamacpp" and first.models[0].model == "default"
    assert second.up and second.kind == "llamacpp"  # not re-detected: a vLLM page has no llamacpp series
    assert second.models == ()


@pytest.fixture
async def pages() -> AsyncIterator[tuple[str, dict[str, bytes | str]]]:
    """A local server answering /page with whatever ``state["body"]`` holds right now."""
    state: dict[str, bytes | str] = {"body": "", "ctype": "text/plain; version=0.0.4"}

    async def page(_: web.Request) -> web.Response:
        body = state["body"]
        raw = body.encode() if isinstance(body, str) else body
        return web.Response(body=raw, headers={"Content-Type": str(state["ctype"])})

    app = web.Application()
    app.router.add_get("/page", page)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/page", state
    finally:
        await runner.cleanup()


GOOD_B = 'vllm:generation_tokens_total{model_name="b"} 10\n'


async def test_hostile_values_never_pass_and_are_logged_once_per_change(
    pages: tuple[str, dict[str, bytes | str]], caplog: pytest.LogCaptureFixture
) -> None:
    url, state = pages
    caplog.set_level(logging.INFO, logger="agent.sources.engines.scraper")
    results = []
    async with aiohttp.ClientSession() as session:
        scraper = EngineScraper(_cfg(url, "vllm"), session, ManualClock())
        for bad in ["+Inf", "-Inf", "1e308", "NaN", "-5"]:  # five scrapes, one bad series throughout
            state["body"] = f'vllm:generation_tokens_total{{model_name="a"}} {bad}\n' + GOOD_B
            results.append(await scraper.scrape())
        state["body"] = 'vllm:generation_tokens_total{model_name="a"} 7\n' + GOOD_B
        results.append(await scraper.scrape())
    for r in results[:-1]:
        assert r.up and len(r.invalid_series) == 1
        got = {m.model: m.generation_tokens_total for m in r.models}
        assert got == {"b": 10.0}  # model a has no valid signal at all: absent, not Inf
    assert results[-1].invalid_series == () and {m.model for m in results[-1].models} == {"a", "b"}
    messages = [r.getMessage() for r in caplog.records]
    assert sum("series refused" in msg for msg in messages) == 1
    assert sum("every series valid again" in msg for msg in messages) == 1


async def test_a_huge_malformed_line_is_quoted_short_and_logged_once(
    pages: tuple[str, dict[str, bytes | str]], caplog: pytest.LogCaptureFixture
) -> None:
    url, state = pages
    caplog.set_level(logging.INFO, logger="agent.sources.engines.scraper")
    async with aiohttp.ClientSession() as session:
        scraper = EngineScraper(_cfg(url, "vllm", max_bytes=4 * 1024 * 1024), session, ManualClock())
        errors = []
        for i in range(4):  # the line differs every scrape
            state["body"] = 'vllm:generation_tokens_total{model_name="' + str(i) + "x" * 1_000_000 + "} 1\n"
            got = await scraper.scrape()
            assert not got.up and got.error is not None
            errors.append(got.error)
    assert all(e.startswith("unparsable page") and len(e) < 400 for e in errors)
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 1 and len(logged[0]) < 600


async def test_nul_bytes_in_comments_and_openmetrics_pages(pages: tuple[str, dict[str, bytes | str]]) -> None:
    url, state = pages
    async with aiohttp.ClientSession() as session:
        scraper = EngineScraper(_cfg(url, "vllm"), session, ManualClock())
        state["body"] = b"# HELP vllm:generation_tokens_total he\x00lp\n" + GOOD_B.encode()
        nul = await scraper.scrape()
        state["body"] = 'vllm:generation_tokens_total{model_name="b"} 10 1700000000\n# EOF\n' + (
            'vllm:generation_tokens_total{model_name="b"} 99\n'
        )
        text_eof = await scraper.scrape()
        state["ctype"] = "application/openmetrics-text; version=1.0.0; charset=utf-8"
        om_eof = await scraper.scrape()
        state["body"] = b"\x00" * 200 + GOOD_B.encode()
        binary = await scraper.scrape()
    assert nul.up and nul.models[0].generation_tokens_total == 10
    # text format: "# EOF" is a comment, so the series is written twice, with two values: refused
    assert text_eof.up and text_eof.models == ()
    (refused,) = text_eof.invalid_series
    assert refused == (
        "generation_tokens_total: vllm:generation_tokens_total{model_name=b}"
        " (written twice with different values)"
    )
    assert om_eof.models[0].generation_tokens_total == 10  # OpenMetrics: the page ends at # EOF
    assert not binary.up and binary.error is not None and "binary body" in binary.error
