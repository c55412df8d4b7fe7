"""Engine pages are decoded, parsed and mapped on the daemon's one page thread, never on the event
loop, so ``/metrics`` answers while every engine's pages are read.

The engines are a separate process on 127.0.0.1 streaming a page of wanted lines (histograms of many
buckets over many models, the costliest kind to parse) in 64 kB writes; the real scraper, parser and
adapter read it, and the real /metrics server answers a client process meanwhile. Counts and bounds
of CPU seconds only, never wall-clock times (``infercost bench hostile`` prints those)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator

import aiohttp
import pytest

from agent.clock import ManualClock
from agent.config import EngineConfig, LimitsConfig
from agent.sinks.prometheus import PrometheusServer
from agent.snapshot import Ledger
from agent.sources.engines.scraper import CHUNK_BYTES, EngineScraper, PageBudget, PageThread

MIB = 1024 * 1024
MODELS, BUCKETS = 48, 400  # about 1.5 MB of wanted lines: tenths of a CPU second to parse

# The engines' process: /NAME/metrics is a vLLM page of MODELS models, each a latency histogram of
# BUCKETS buckets, written 64 kB at a time; /NAME/metrics?stall=1 writes its first 64 kB and then
# nothing (the scrape times out while the page is being read).
_SERVER = r"""
import asyncio, sys
from aiohttp import web

models, buckets = int(sys.argv[1]), int(sys.argv[2])

def page(name):
    out = []
    for m in range(models):
        labels = f'model_name="{name}-{m}"'
        out.append(f"vllm:generation_tokens_total{{{labels}}} 1000")
        out.append(f"vllm:prompt_tokens_total{{{labels}}} 500")
        for i in range(buckets):
            out.append(f'vllm:e2e_request_latency_seconds_bucket{{le="{0.001 * (i + 1):g}",{labels}}} {i}')
        out.append(f'vllm:e2e_request_latency_seconds_bucket{{le="+Inf",{labels}}} {buckets}')
        out.append(f"vllm:e2e_request_latency_seconds_count{{{labels}}} {buckets}")
        out.append(f"vllm:e2e_request_latency_seconds_sum{{{labels}}} 2.5")
    return ("\n".join(out) + "\n").encode()

async def handle(request):
    body = page(request.match_info["name"])
    resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
    await resp.prepare(request)
    try:
        for i in range(0, len(body), 65536):
            await resp.write(body[i : i + 65536])
            if request.query.get("stall"):
                await asyncio.sleep(3600)
            await asyncio.sleep(0.001)
        await resp.write_eof()
    except (ConnectionError, RuntimeError):
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

# A client process: a GET of /metrics every 20 ms (as a scraper does, only faster) until told to stop
# (a line on stdin), then prints how many were answered 200 and how many were not.
_CLIENT = r"""
import http.client, sys, threading, time
port = int(sys.argv[1])
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
print("ready", flush=True)
ok = bad = 0
while not stop.is_set():
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        c.request("GET", "/metrics")
        r = c.getresponse()
        r.read()
        c.close()
        ok += r.status == 200
        bad += r.status != 200
    except OSError:
        bad += 1
    time.sleep(0.02)
print(ok, bad, flush=True)
"""


@pytest.fixture(scope="module")
def engines_port() -> Iterator[int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVER, str(MODELS), str(BUCKETS)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline())
    finally:
        proc.terminate()
        proc.wait(10)


def _scraper(
    session: aiohttp.ClientSession,
    port: int,
    name: str,
    thread: PageThread,
    query: str = "",
    timeout: float = 60,
) -> EngineScraper:
    cfg = EngineConfig(
        name=name, kind="vllm", url=f"http://127.0.0.1:{port}/{name}/metrics?{query}", timeout_seconds=timeout
    )
    # the CPU budget aside: the whole page is read, however slow the machine
    limits = LimitsConfig(scrape_cpu_seconds=60)
    return EngineScraper(cfg, session, ManualClock(), limits, PageBudget(64 * MIB), thread)


async def test_a_page_is_parsed_on_the_page_thread_not_on_the_event_loop(engines_port: int) -> None:
    thread = PageThread()
    async with aiohttp.ClientSession() as session:
        scrapers = [_scraper(session, engines_port, n, thread) for n in ("a", "b")]
        await asyncio.gather(*(s.scrape() for s in scrapers))  # connections, parser and adapter warm
        jobs0 = thread.jobs
        loop_cpu0 = time.thread_time()  # CPU seconds of this thread: the event loop's
        got = await asyncio.gather(*(s.scrape() for s in scrapers))
        loop_cpu = time.thread_time() - loop_cpu0
    thread.close()
    assert all(r.up for r in got), [r.error for r in got]
    assert all(len(r.models) == MODELS for r in got)
    page_cpu = sum(s.cpu_seconds for s in scrapers)  # decoding, parsing and mapping both pages
    # every chunk of each page (at most CHUNK_BYTES each), its end, its mapping and its close ran there
    least = sum(-(-r.size_bytes // CHUNK_BYTES) + 3 for r in got)
    assert thread.jobs - jobs0 >= least, (thread.jobs - jobs0, least)
    # the loop only moved the bytes (HTTP framing, a hand-over per chunk): a small share of what
    # parsing wanted lines costs. Why a quarter: parsed on the loop, all of page_cpu would be there
    # (a ratio of at least 1); the hand-overs cost a few per cent of it.
    assert loop_cpu < 0.25 * page_cpu, (loop_cpu, page_cpu)


async def test_metrics_answers_a_client_process_while_pages_are_parsed(engines_port: int) -> None:
    ledger = Ledger("node-1", "0")
    snap = ledger.snapshot()
    server = PrometheusServer(lambda: snap, lambda: True, "127.0.0.1", 0)
    await server.start()
    client = subprocess.Popen(
        [sys.executable, "-c", _CLIENT, str(server.port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    thread = PageThread()
    try:
        assert client.stdout is not None and client.stdin is not None
        ready = await asyncio.to_thread(client.stdout.readline)
        assert ready.strip() == "ready"
        async with aiohttp.ClientSession() as session:
            scrapers = [_scraper(session, engines_port, f"p{i}", thread) for i in range(4)]
            loop_cpu0 = time.thread_time()
            got = await asyncio.gather(*(s.scrape() for s in scrapers))
            loop_cpu = time.thread_time() - loop_cpu0
        client.stdin.write("stop\n")
        client.stdin.flush()
        ok, bad = (int(x) for x in (await asyncio.to_thread(client.stdout.readline)).split())
    finally:
        client.kill()
        client.wait(10)
        thread.close()
        await server.stop()
    assert all(r.up for r in got), [r.error for r in got]
    page_cpu = sum(s.cpu_seconds for s in scrapers)
    assert bad == 0 and ok >= 1  # every GET answered, and with 200
    # the loop served every GET and moved four pages' bytes. Why under half of page_cpu: parsed on
    # the loop, all of page_cpu would be there (a ratio of at least 1); a GET every 20 ms costs the
    # loop a few per cent of the time, the hand-overs a few per cent of page_cpu
    assert loop_cpu < 0.5 * page_cpu, (loop_cpu, page_cpu, ok)


async def test_a_timeout_mid_page_frees_its_budget_and_the_thread_goes_on(engines_port: int) -> None:
    thread = PageThread()
    async with aiohttp.ClientSession() as session:
        stalled = _scraper(session, engines_port, "stalled", thread, query="stall=1", timeout=1)
        budget = stalled.budget
        r = await stalled.scrape()
        assert not r.up and r.error == "timeout after 1 s"
        assert budget.held == 0  # given back once the chunk on the thread was done
        good = _scraper(session, engines_port, "good", thread)
        assert (await good.scrape()).up  # the same thread reads the next page
    thread.close()


async def test_a_closed_page_thread_reads_inline(engines_port: int) -> None:
    thread = PageThread()
    thread.close()
    async with aiohttp.ClientSession() as session:
        r = await _scraper(session, engines_port, "late", thread).scrape()
    assert r.up and len(r.models) == MODELS
    assert thread.jobs == 0  # nothing went to a thread after close
