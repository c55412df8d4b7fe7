"""The simulated engine's HTTP page: vLLM's wire format, parsed by prometheus_client's own parser."""

from __future__ import annotations

import asyncio
import gzip
import math
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from agent.clock import AcceleratedClock, ManualClock
from infercost_sim.engine import (
    H100_SXM,
    ITL_BUCKETS,
    LLAMA_70B,
    REQUEST_LATENCY_BUCKETS,
    TTFT_BUCKETS,
    Deployment,
    SimEngine,
    Traffic,
)
from infercost_sim.server import SimEngineServer

T0 = 1_700_049_600.0  # 2023-11-15 12:00 UTC, a Wednesday afternoon
MODEL = LLAMA_70B.name
LABELS = {"model_name": MODEL, "engine": "0"}


def make_engine(start: float = T0, peak_rps: float = 8.0) -> SimEngine:
    return SimEngine(Deployment(LLAMA_70B, H100_SXM, tp=4), Traffic(peak_rps=peak_rps), start=start, seed=2)


@pytest.fixture
async def served() -> AsyncIterator[tuple[SimEngineServer, ManualClock, aiohttp.ClientSession]]:
    clock = ManualClock(T0)
    server = SimEngineServer(make_engine(), clock)
    await server.start()
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        yield server, clock, session
    await server.stop()


async def fetch(
    session: aiohttp.ClientSession, url: str, gzip_ok: bool = False
) -> tuple[str, dict[str, str]]:
    headers = {"Accept-Encoding": "gzip" if gzip_ok else "identity"}
    async with session.get(url, headers=headers) as resp:
        assert resp.status == 200
        body = await resp.read()
        hdrs = dict(resp.headers)
    if hdrs.get("Content-Encoding") == "gzip":
        body = gzip.decompress(body)
    return body.decode(), hdrs


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the page by (name, sorted labels)."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def key(name: str, **extra: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return (name, tuple(sorted({**LABELS, **extra}.items())))


async def test_page_has_vllms_families_labels_and_buckets(
    served: tuple[SimEngineServer, ManualClock, aiohttp.ClientSession],
) -> None:
    server, clock, session = served
    clock.advance(600)
    text, headers = await fetch(session, server.url)
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    expected = {
        "vllm:prompt_tokens": "counter",
        "vllm:generation_tokens": "counter",
        "vllm:num_preemptions": "counter",
        "vllm:request_success": "counter",
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:request_prefill_time_seconds": "histogram",
        "vllm:request_decode_time_seconds": "histogram",
        "vllm:request_prompt_tokens": "histogram",
        "vllm:request_generation_tokens": "histogram",
        "vllm:iteration_tokens_total": "histogram",
        "http_requests": "counter",
        "http_request_duration_seconds": "histogram",
        "process_cpu_seconds": "counter",
    }
    for name, typ in expected.items():
        assert families[name].type == typ, name
    s = samples(text)
    # counters carry _total on the wire and a _created series
    assert s[key("vllm:prompt_tokens_total")] > 0
    assert s[key("vllm:generation_tokens_total")] > 0
    assert s[key("vllm:prompt_tokens_created")] == T0
    assert {"stop", "length", "abort", "error"} <= {
        dict(lbl)["finished_reason"] for (n, lbl) in s if n == "vllm:request_success_total"
    }
    assert 0.0 <= s[key("vllm:kv_cache_usage_perc")] <= 1.0
    # vLLM's bucket lists, cumulative, +Inf equal to _count
    for name, bounds in (
        ("vllm:time_to_first_token_seconds", TTFT_BUCKETS),
        ("vllm:inter_token_latency_seconds", ITL_BUCKETS),
        ("vllm:e2e_request_latency_seconds", REQUEST_LATENCY_BUCKETS),
    ):
        fam = families[name]
        buckets = [x for x in fam.samples if x.name == f"{name}_bucket"]
        les = [float(b.labels["le"]) for b in buckets]
        assert les == [*bounds, math.inf]
        assert all(b.labels["model_name"] == MODEL and b.labels["engine"] == "0" for b in buckets)
        counts = [b.value for b in buckets]
        assert counts == sorted(counts)
        assert counts[-1] == s[key(f"{name}_count")] > 0
        assert s[key(f"{name}_created")] == T0


async def test_counters_are_monotonic_across_scrapes(
    served: tuple[SimEngineServer, ManualClock, aiohttp.ClientSession],
) -> None:
    server, clock, session = served
    previous: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    moved = 0
    for _ in range(6):
        clock.advance(37)
        text, _ = await fetch(session, server.url)
        now = samples(text)
        for k, v in now.items():
            name = k[0]
            cumulative = name.endswith(("_total", "_bucket", "_count", "_sum")) and not name.startswith(
                ("process_", "python_")
            )
            if cumulative and k in previous:
                assert v >= previous[k], k
                moved += v > previous[k]
        previous = now
    assert moved > 100  # the engine did serve tokens between scrapes


async def test_page_is_about_100_kb_and_gzips(
    served: tuple[SimEngineServer, ManualClock, aiohttp.ClientSession],
) -> None:
    server, clock, session = served
    clock.advance(3600)
    text, _ = await fetch(session, server.url)
    assert 95_000 <= len(text.encode()) <= 130_000
    async with session.get(server.url, headers={"Accept-Encoding": "gzip"}) as resp:
        raw = await resp.read()
        assert resp.headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(raw).decode() == text  # the same page, only compressed
    assert len(raw) < len(text) / 5


async def test_minimal_page_without_padding() -> None:
    clock = ManualClock(T0)
    server = SimEngineServer(make_engine(), clock, target_page_bytes=None)
    padded = SimEngineServer(make_engine(), clock)
    clock.advance(300)
    text = server.render()[0].decode()
    assert len(text) < 0.7 * len(padded.render()[0])  # the http_* routes are the padding
    names = {f.name for f in text_string_to_metric_families(text)}
    assert "vllm:generation_tokens" in names


async def test_state_advances_on_an_accelerated_clock() -> None:
    clock = AcceleratedClock(factor=3600.0, start=T0)  # an hour of engine time per real second
    server = SimEngineServer(make_engine(start=T0), clock, target_page_bytes=None)
    await server.start()
    try:
        async with aiohttp.ClientSession() as session:
            first = samples((await fetch(session, server.url))[0])
            await asyncio.sleep(0.2)  # 12 simulated minutes
            second = samples((await fetch(session, server.url))[0])
    finally:
        await server.stop()
    gen = key("vllm:generation_tokens_total")
    assert second[gen] > first[gen]


def test_render_samples_are_prometheus_client_samples() -> None:
    # the page is prometheus_client's own rendering: the parser round-trips every sample
    clock = ManualClock(T0)
    server = SimEngineServer(make_engine(), clock, target_page_bytes=None)
    clock.advance(120)
    body, content_type = server.render()
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    fams = list(text_string_to_metric_families(body.decode()))
    assert all(isinstance(s, Sample) for f in fams for s in f.samples)
    assert sum(len(f.samples) for f in fams) > 300


async def test_openmetrics_is_negotiated_like_prometheus_client(
    served: tuple[SimEngineServer, ManualClock, aiohttp.ClientSession],
) -> None:
    server, clock, session = served
    clock.advance(600)
    # prometheus_client picks OpenMetrics whenever the Accept header lists it, whatever its q-value
    accept = "text/plain;version=0.0.4;q=1,application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1"
    async with session.get(server.url, headers={"Accept": accept, "Accept-Encoding": "identity"}) as resp:
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
        text = (await resp.read()).decode()
    lines = text.splitlines()
    assert lines[-1] == "# EOF"
    assert "# TYPE vllm:generation_tokens counter" in lines
    # prometheus/client_python#1177: samples are escaped to vllm_… while HELP/TYPE keep vllm:…
    (line,) = [
        ln
        for ln in lines
        if ln.startswith(("vllm:generation_tokens_total{", "vllm_generation_tokens_total{"))
    ]
    assert float(line.rsplit(" ", 1)[1]) > 0
    # asked for text only, the same server answers text 0.0.4
    async with session.get(server.url, headers={"Accept": "text/plain;version=0.0.4"}) as resp:
        assert resp.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"


async def test_openmetrics_can_be_turned_off() -> None:
    clock = ManualClock(T0)
    server = SimEngineServer(make_engine(), clock, target_page_bytes=None, openmetrics=False)
    clock.advance(60)
    _, content_type = server.render("application/openmetrics-text;version=1.0.0")
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
