"""The engine path against a REAL Triton Inference Server: the ``tritonserver`` bundled in PyPI
``nvidia-pytriton`` (``tests/triton_server.py``), serving two Python-backend models on CPU.

- every sample of its prometheus-cpp page (counters, gauges, summaries with ``Nan`` quantiles,
  series without labels) reads the same through the project's parser as through prometheus_client's;
- the real scraper maps it (``kind: triton``, and ``kind: auto`` recognises it): finished requests
  equal the successes and failures the server answered, per model, with versions summed; the
  pending-request gauge is ``requests_waiting`` (above 0 while requests queue behind a slow one);
- what a plain Triton does not have stays **absent**, not 0: tokens (``nv_llm_*`` come only from
  the TensorRT-LLM / vLLM backends), KV cache, running batch; TTFT is mapped from the
  first-response histogram where the release writes it (the 2.51 this wheel bundles does not);
- Triton's cumulative queue and compute ``*_duration_us`` counters (success only, as its metric
  reporter adds them) are mapped in seconds with the successes they cover; requests queued behind
  slow ones add at least the slow ones' time to both;
- the real daemon scrapes it: ``engine_up{kind="triton"}`` 1, ``requests_waiting`` exported, no
  token series and no $ per 1M for its models (absent, not 0) while its cost is exported, and the
  mean queue and compute seconds per request over the trailing window for the model with traffic.

It proves parsing and mapping of a real Triton, not $ per 1M tokens (a CPU Python model counts no
tokens). ``.ci/run`` makes the Python 3.13 virtualenv the server needs; without it the module skips.
"""

from __future__ import annotations

import asyncio
import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiohttp
import pytest
from netutil import wait_until
from prometheus_client.parser import text_string_to_metric_families
from triton_server import INSTALL_HINT, VENV, TritonServer, distribution

from agent.clock import SystemClock
from agent.config import EngineConfig
from agent.samples import EngineScrape, ModelSignals
from agent.sources.engines.parser import parse
from agent.sources.engines.scraper import EngineScraper

pytestmark = pytest.mark.slow  # a real tritonserver

DIST = distribution()
if DIST is None:
    pytest.skip(f"no tritonserver in {VENV} (make it with: {INSTALL_HINT})", allow_module_level=True)

OK, FAILED, STREAMS = 5, 2, 3  # requests to tiny that succeed, that raise; streams of 4 responses
SLOW_MS = 300.0  # milliseconds one slow request takes: the others queue behind it (one instance)
SLOW = 4  # concurrent slow requests
US = 1e-6  # Triton's duration counters are in microseconds
PACED_MS = 100.0  # milliseconds each request the daemon sees takes (the model sleeps that long)
NOT_IN_PLAIN_TRITON = (
    "prompt_tokens_total",
    "generation_tokens_total",
    "kv_cache_usage_ratio",
    "requests_running",
)
FIRST_RESPONSE = "nv_inference_first_response_histogram_ms"  # decoupled models, Triton after 2.51


@pytest.fixture(scope="module")
def triton() -> Iterator[TritonServer]:
    """One tritonserver for the module, with known traffic already served; stopped in teardown."""
    assert DIST is not None
    server = TritonServer(DIST)
    server.start()
    try:
        for i in range(OK):
            assert server.infer([1.0, 2.5, float(i)]) == [2.0, 5.0, 2.0 * i]
        for _ in range(FAILED):
            assert server.infer([-1.0]) is None
        for _ in range(STREAMS):
            assert server.stream(4) == [0, 1, 2, 3]
        wait_until(lambda: _settled(server.metrics()), timeout=30, what="Triton's request counters")
        yield server
    finally:
        server.close()


def _samples(text: str) -> dict[str, list[tuple[frozenset[tuple[str, str]], float]]]:
    """prometheus_client's reading: sample name as on the wire → (labels, value) in page order.

    prometheus_client names a counter's samples ``<family>_total`` even where the page wrote the
    family's name alone (every Triton counter): the name is taken back to the one on the page."""
    out: dict[str, list[tuple[frozenset[tuple[str, str]], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = s.name
            if fam.type == "counter" and not re.search(rf"(?m)^{re.escape(name)}[{{ ]", text):
                name = name.removesuffix("_total")
            out.setdefault(name, []).append((frozenset(s.labels.items()), s.value))
    return out


def _value(text: str, name: str, **labels: str) -> float:
    """The sum of one family's samples carrying ``labels`` (prometheus_client's reading)."""
    want = set(labels.items())
    return sum(v for ls, v in _samples(text).get(name, []) if want <= ls)


def _settled(text: str) -> bool:
    """Triton counts a request when it is released: wait until every request sent is counted."""
    return (
        _value(text, "nv_inference_request_success", model="tiny") == OK
        and _value(text, "nv_inference_request_failure", model="tiny") == FAILED
        and _value(text, "nv_inference_request_success", model="stream") == STREAMS
    )


def _cfg(server: TritonServer, kind: str = "triton") -> EngineConfig:
    return EngineConfig(name="triton", kind=kind, url=server.metrics_url)


def _models(scrape: EngineScrape) -> dict[str, ModelSignals]:
    assert scrape.up, scrape.error
    assert scrape.invalid_series == ()
    return {m.model: m for m in scrape.models}


def test_every_sample_reads_as_prometheus_client_reads_it(triton: TritonServer) -> None:
    text = triton.metrics()
    theirs = _samples(text)
    # the real page's shape: the request families per model and version, failures by reason,
    # summaries (with NaN quantiles for a model no summary observation reached), unlabelled gauges
    families = {
        "nv_inference_request_success",
        "nv_inference_request_failure",
        "nv_inference_count",
        "nv_inference_exec_count",
        "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_input_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_compute_output_duration_us",
        "nv_inference_pending_request_count",
        "nv_inference_queue_summary_us",
        "nv_inference_queue_summary_us_count",
        "nv_pinned_memory_pool_total_bytes",
    }
    assert families <= theirs.keys()
    reasons = {dict(ls)["reason"] for ls, _ in theirs["nv_inference_request_failure"]}
    assert reasons == {"OTHER", "BACKEND", "CANCELED", "REJECTED"}
    assert _value(text, "nv_inference_request_failure", model="tiny", reason="BACKEND") == FAILED

    page = parse(text, theirs.keys())
    ours = {name: [(frozenset(s.labels.items()), s.value) for s in samples] for name, samples in page.items()}
    assert ours.keys() == theirs.keys()
    for name, expected in theirs.items():
        got = ours[name]
        assert len(got) == len(expected), name
        for (labels, value), (want_labels, want) in zip(got, expected, strict=True):
            assert labels == want_labels, name
            assert value == want or (math.isnan(value) and math.isnan(want)), (name, labels)
    assert sum(len(v) for v in theirs.values()) >= 100  # the whole page, not a few lines


async def test_the_scraper_maps_a_real_triton(triton: TritonServer) -> None:
    async with aiohttp.ClientSession() as session:
        scraper = EngineScraper(_cfg(triton), session, SystemClock())
        auto = EngineScraper(_cfg(triton, "auto"), session, SystemClock())
        scrape = await scraper.scrape()
        detected = await auto.scrape()
    assert scrape.kind == "triton" and detected.kind == "triton" and auto.kind == "triton"
    assert detected.models == scrape.models
    models = _models(scrape)
    assert set(models) == {"tiny", "stream"}
    assert models["tiny"].requests_finished_total == {"failure": FAILED, "success": OK}
    assert models["stream"].requests_finished_total == {"failure": 0, "success": STREAMS}
    # the duration counters, in seconds, over the successes (a failure adds to its count only)
    text = triton.metrics()  # no traffic since the scrape: the same counters
    for name, m in models.items():
        assert m.timed_requests_total == m.requests_finished_total["success"]
        assert m.queue_seconds_total == pytest.approx(
            _value(text, "nv_inference_queue_duration_us", model=name) * US
        )
        compute = sum(
            _value(text, f"nv_inference_compute_{part}_duration_us", model=name)
            for part in ("input", "infer", "output")
        )
        assert m.compute_seconds_total == pytest.approx(compute * US)
        assert m.compute_seconds_total is not None and m.compute_seconds_total > 0
    for m in models.values():
        assert m.requests_waiting == 0  # nothing queued now
        for name in NOT_IN_PLAIN_TRITON:
            assert getattr(m, name) is None, f"{m.model}: {name} must be absent, not {getattr(m, name)}"
    # histogram_latencies=true is on: a release that has the histogram writes it for the decoupled
    # model only, one observation per stream, in milliseconds (read as seconds); 2.51 has none
    assert models["tiny"].ttft_seconds is None
    ttft = models["stream"].ttft_seconds
    if FIRST_RESPONSE + "_count" in _samples(triton.metrics()):
        assert ttft is not None and ttft.count == STREAMS
        assert 0 < ttft.sum < 60
    else:
        assert ttft is None


async def test_requests_queued_behind_a_slow_one_are_waiting(triton: TritonServer) -> None:
    async with aiohttp.ClientSession() as session:
        scraper = EngineScraper(_cfg(triton), session, SystemClock())
        before = _models(await scraper.scrape())["tiny"]
        waiting: list[float] = []
        began = time.monotonic()
        with ThreadPoolExecutor(SLOW) as pool:
            futures = [pool.submit(triton.infer, [SLOW_MS]) for _ in range(SLOW)]
            while not all(f.done() for f in futures):
                m = _models(await scraper.scrape())["tiny"]
                assert m.requests_waiting is not None
                waiting.append(m.requests_waiting)
                await asyncio.sleep(0.02)
            assert all(f.result() == [2 * SLOW_MS] for f in futures)
        burst = time.monotonic() - began  # seconds from the first send to the last answer
        wait_until(
            lambda: _value(triton.metrics(), "nv_inference_request_success", model="tiny") == OK + SLOW
        )
        after = _models(await scraper.scrape())["tiny"]
    # one instance runs one request at a time: the others wait in Triton's queue, and the gauge
    # never counts more than the requests sent
    assert 1 <= max(waiting) <= SLOW - 1
    assert after.requests_waiting == 0
    assert after.requests_finished_total == {"failure": FAILED, "success": OK + SLOW}
    # each slow request computes for SLOW_MS at least; the one instance runs them one at a time, and
    # the pool sends all of them well within one SLOW_MS, so the k-th waits about (k - 1) × SLOW_MS:
    # 0 + 1 + 2 + 3 of them in all (half of that asserted: a loaded box may start a thread late)
    assert before.compute_seconds_total is not None and after.compute_seconds_total is not None
    assert before.queue_seconds_total is not None and after.queue_seconds_total is not None
    assert after.timed_requests_total == OK + SLOW
    assert after.compute_seconds_total - before.compute_seconds_total >= SLOW * SLOW_MS / 1000
    slow = SLOW_MS / 1000
    queued = after.queue_seconds_total - before.queue_seconds_total
    # and no request can have waited longer than the whole burst lasted
    assert slow * (SLOW - 1) * SLOW / 2 / 2 <= queued <= SLOW * burst


Page = dict[str, list[tuple[frozenset[tuple[str, str]], float]]]


def _both_waiting(page: Page) -> bool:
    return len(page.get("infercost_requests_waiting", [])) == 2


async def _daemon_page(
    triton: TritonServer,
    state: Path,
    done: Callable[[Page], bool] = _both_waiting,
    traffic: Callable[[], object] | None = None,
) -> Page:
    """Run the real daemon on the server until its /metrics page is ``done`` (by default: both
    models shown); return that page. ``traffic``, when given, is called over and over in a thread
    while the daemon runs (requests the daemon's windows see)."""
    from agent.app import build_agent
    from agent.config import Config, ExportersConfig, IntervalsConfig, NvmlConfig, PrometheusExporterConfig
    from agent.sources.prices import parse_price_book

    book = parse_price_book({"engines": {"triton": {"usd_per_hour": 0.5}}}, "test-book")
    cfg = Config(
        node="cpu-node",
        state_dir=state,
        intervals=IntervalsConfig(nvml_seconds=1, scrape_seconds=0.25, window_seconds=60),
        nvml=NvmlConfig(backend="none"),
        exporters=ExportersConfig(prometheus=PrometheusExporterConfig(port=0)),
    )
    agent = await build_agent(
        cfg, clock=SystemClock(), book=book, backend=None, engines=[_cfg(triton)], history=False
    )
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    exported: Page = {}
    sending = threading.Event()
    sender = None
    if traffic is not None:
        send = traffic
        sending.set()

        def loop() -> None:
            while sending.is_set():
                send()

        sender = threading.Thread(target=loop, daemon=True)
    try:
        await agent.started.wait()
        if sender is not None:
            sender.start()
        assert agent.prometheus is not None
        url = f"http://127.0.0.1:{agent.prometheus.port}/metrics"
        async with aiohttp.ClientSession() as session:
            for _ in range(300):  # a few scrapes and a tick (generous: a loaded 2-core box)
                async with session.get(url) as resp:
                    exported = _samples(await resp.text())
                if done(exported):
                    break
                await asyncio.sleep(0.1)
    finally:
        sending.clear()
        if sender is not None and sender.is_alive():
            await asyncio.to_thread(sender.join, 10)
        stop.set()
        await asyncio.wait_for(task, 10)
    return exported


async def test_the_daemon_scrapes_a_real_triton(triton: TritonServer, tmp_path: Path) -> None:
    exported = await _daemon_page(triton, tmp_path)
    up = [(dict(ls), v) for ls, v in exported["infercost_engine_up"]]
    assert [(ls["engine"], ls["kind"], v) for ls, v in up] == [("triton", "triton", 1.0)]
    waiting = {dict(ls)["model"]: v for ls, v in exported["infercost_requests_waiting"]}
    assert waiting == {"tiny": 0.0, "stream": 0.0}
    assert "infercost_kv_cache_usage_ratio" not in exported and "infercost_requests_running" not in exported


def _costed(page: Page) -> bool:
    """Both models shown, and a priced window behind each one's cost."""
    return _both_waiting(page) and len(page.get("infercost_cost_usd_total", [])) == 2


async def test_the_daemon_exports_no_token_series_for_a_tokenless_engine(
    triton: TritonServer, tmp_path: Path
) -> None:
    exported = await _daemon_page(triton, tmp_path, _costed)
    tokens = sorted(
        name
        for name, samples in exported.items()
        if ("_tokens" in name or "usd_per_1m" in name)
        and any(("engine", "triton") in ls for ls, _ in samples)
    )
    assert tokens == []  # no token counts, rates or $ per 1M: absent, not 0
    # while what it costs is known (the engine's hourly price), for both models
    cost = {dict(ls)["model"]: v for ls, v in exported["infercost_cost_usd_total"]}
    assert set(cost) == {"tiny", "stream"} and all(v > 0 for v in cost.values())


def _timed(page: Page) -> bool:
    return any(dict(ls)["model"] == "tiny" for ls, _ in page.get("infercost_compute_seconds_per_request", []))


async def test_the_daemon_exports_queue_and_compute_time_per_request(
    triton: TritonServer, tmp_path: Path
) -> None:
    exported = await _daemon_page(triton, tmp_path, _timed, lambda: triton.infer([PACED_MS]))
    compute = {dict(ls)["model"]: v for ls, v in exported["infercost_compute_seconds_per_request"]}
    queue = {dict(ls)["model"]: v for ls, v in exported.get("infercost_queue_seconds_per_request", [])}
    # only tiny had requests in the trailing window: stream's means are absent (no request to
    # divide by), not 0
    assert set(compute) == set(queue) == {"tiny"}
    # one request at a time from one thread: each computes for PACED_MS (the model's sleep) and
    # barely waits; a mean above a second would be another request's time in this one's
    assert PACED_MS / 1000 <= compute["tiny"] < 1.0
    assert 0 <= queue["tiny"] < PACED_MS / 1000
