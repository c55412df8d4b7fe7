"""Discovery at scale: the real daemon against a local Kubernetes API server holding 5,000 engine pods on
its node, arriving by list and by watch.

Every pod is at 127.0.0.1 (``allow_loopback``) on the port of one local page server, so all traffic is
loopback; some pods' pages never answer. What must hold: the pods up to ``kubernetes.max_engines`` are
taken in (in the order they came), the rest are counted and the cap is named once in the log, the
discovery log grows with the engines taken in (one short line each), not with the pods or the events,
a static engine's counters keep advancing, and ``/metrics`` serves a full page every time it is read
while the pods arrive.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from agent.app import build_agent
from agent.catalog import CATALOG
from agent.clock import AcceleratedClock
from agent.config import (
    Config,
    ExportersConfig,
    IntervalsConfig,
    KubernetesConfig,
    NvmlConfig,
    PrometheusExporterConfig,
)
from agent.sources.kube.source import KubeEngines
from agent.sources.nvml.backend import NvmlBackend
from agent.sources.nvml.fake import FakeNvml
from agent.sources.prices import parse_price_book
from agent.supervisor import Agent
from infercost_sim.engine import MISTRAL_7B
from infercost_sim.node import EngineSpec, SimNode
from tests.kubeapi import TOKEN, FakeKubeApi, pod, write_kubeconfig
from tests.test_daemon import _parse

PODS = 5_000
CAP = 256  # the default kubernetes.max_engines
SLOW_EVERY = 6  # every sixth pod's page never answers: more of them than scrapes run at once
STATIC = "sim-mistral"  # the one engine of the config
LINE = 200  # characters: an upper bound for one discovery log line naming one pod
SPEED = 20.0  # simulated seconds per real second
METRICS_SERIES = "infercost_kube_engines_over_cap"  # the overflow series, once the catalogue has it

TINY_PAGE = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="tiny"} 0\n'


class PagedKubeApi(FakeKubeApi):
    """The local API server, paging a list as the real one does (``limit``, then ``continue``)."""

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        limit = int(request.query.get("limit") or 0)
        authorized = request.headers.get("Authorization") == f"Bearer {TOKEN}"
        if request.query.get("watch") or not limit or not authorized or self.fail_lists:
            return await super()._handle(request)
        self.requests.append(dict(request.query))
        start = int(request.query.get("continue") or 0)
        selected = [p for p in self.pods.values() if self._selected(request, p)]
        meta = {"resourceVersion": str(self.rv)}
        if start + limit < len(selected):
            meta["continue"] = str(start + limit)
        doc = {
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": meta,
            "items": selected[start : start + limit],
        }
        return web.Response(body=json.dumps(doc).encode(), headers={"Content-Type": "application/json"})


def _name(i: int) -> str:
    return f"engine-{i:05d}"


def _engine_pod(i: int, port: int) -> dict[str, object]:
    path = "/slow" if i % SLOW_EVERY == 0 else "/metrics"
    return pod(
        _name(i),
        ip="127.0.0.1",
        ports=(("metrics", port),),
        annotations={"infercost.io/scrape": "true", "infercost.io/engine": "vllm", "infercost.io/path": path},
        rv=str(10_000 + i),
    )


async def _pages() -> AsyncIterator[int]:
    """A loopback page server for every pod: a tiny vLLM page, or one that never answers."""
    forever = asyncio.Event()

    async def metrics(_req: web.Request) -> web.Response:
        return web.Response(text=TINY_PAGE, content_type="text/plain")

    async def slow(_req: web.Request) -> web.Response:
        await forever.wait()
        return web.Response(text="")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/slow", slow)
    runner = web.AppRunner(app, shutdown_timeout=0.1, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        forever.set()
        await runner.cleanup()


@pytest.fixture
async def page_port() -> AsyncIterator[int]:
    async for port in _pages():
        yield port


@dataclass
class Daemon:
    """The running agent, its discovery and a reader of its /metrics."""

    agent: Agent
    src: KubeEngines
    port: int
    families: set[str] = field(default_factory=set)  # every family /metrics has served so far
    reads: int = 0

    async def page(self) -> str:
        """One read of /metrics, checked to be a whole page: every family served before is in it."""
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{self.port}/metrics") as r:
            assert r.status == 200
            text = await r.text()
        assert text.startswith("# HELP ") and text.endswith("\n")
        served = {ln.split()[2] for ln in text.splitlines() if ln.startswith("# TYPE ")}
        assert "infercost_build_info" in served and self.families <= served
        self.families |= served
        self.reads += 1
        return text

    async def static_up(self) -> bool:
        """Whether /metrics shows the static engine up (after its first tick)."""
        m = _parse(await self.page())
        return any(
            dict(k).get("engine") == STATIC and v == 1 for k, v in m.get("infercost_engine_up", {}).items()
        )

    async def tokens(self) -> float:
        """The static engine's generation-token counter on /metrics."""
        m = _parse(await self.page())
        series = m.get("infercost_generation_tokens_total", {})
        return sum(v for k, v in series.items() if dict(k).get("engine") == STATIC)


async def _until(cond: Callable[[], bool], timeout: float = 120.0) -> None:
    async def poll() -> None:
        while not cond():
            await asyncio.sleep(0.05)

    await asyncio.wait_for(poll(), timeout)


async def _grows(d: Daemon) -> tuple[float, float]:
    """Two reads of the static engine's tokens, the second once it has moved on (bounded wait)."""
    first = await d.tokens()
    second = first
    for _ in range(600):
        second = await d.tokens()
        if second > first:
            break
        await asyncio.sleep(0.1)
    return first, second


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[tuple[SimNode, FakeNvml]]:
    clock = AcceleratedClock(SPEED)
    sim = SimNode(
        clock,
        tmp_path / "versions",
        engines=(EngineSpec(STATIC, MISTRAL_7B, (0,), "ignored", peak_load=0.6),),
        target_page_bytes=None,
    )
    await sim.start()
    try:
        yield sim, FakeNvml("H100-SXM", 8, sim.gpu_load, clock=clock.now)
    finally:
        await sim.stop()


async def _start(
    tmp_path: Path, api: FakeKubeApi, sim: SimNode, fake: FakeNvml
) -> tuple[Daemon, asyncio.Event, asyncio.Task[None]]:
    cfg = Config(
        node="gpu-node-1",
        state_dir=tmp_path,
        intervals=IntervalsConfig(nvml_seconds=5, scrape_seconds=10, window_seconds=60),
        nvml=NvmlConfig(backend="fake", fake_count=8),
        exporters=ExportersConfig(prometheus=PrometheusExporterConfig(port=0)),
        engines=tuple(sim.engine_configs()),
        kubernetes=KubernetesConfig(
            enabled=True,
            allow_loopback=True,  # every pod is at 127.0.0.1: the test's traffic stays on loopback
            kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", api.url),
            pod_resources_socket=None,
            timeout_seconds=0.5,  # the pages that never answer are given up on quickly
        ),
    )
    book = parse_price_book({"gpus": [{"match": "H100", "usd_per_hour": 2.0}]}, "test-book")
    agent = await build_agent(
        cfg,
        clock=sim.clock,
        book=book,
        backend=NvmlBackend(fake),
        history=False,
        detection=False,
        scorer=False,
    )
    src = agent.hooks.engine_source
    assert isinstance(src, KubeEngines) and cfg.kubernetes.max_engines == CAP
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    await agent.started.wait()
    assert agent.prometheus is not None
    return Daemon(agent, src, agent.prometheus.port), stop, task


def _discovery_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("agent.sources.kube")]


def _scraped_pods(d: Daemon) -> set[str]:
    return {e.name for e in d.src.engines() if e.name != STATIC}


def _check_log(lines: list[str], taken: int) -> None:
    """Added lines as many as pods taken in, the cap named once, the total bounded by them."""
    added = [ln for ln in lines if ln.startswith("engine pod ") and ln.endswith(")") and " added " in ln]
    assert len(added) == taken
    cap = [ln for ln in lines if "kubernetes.max_engines" in ln]
    assert len(cap) == 1 and f"({CAP})" in cap[0]
    assert all(len(ln) <= LINE for ln in added)
    assert sum(len(ln) for ln in lines) <= 2 * taken * LINE


def _overflow_on_metrics(text: str) -> float | None:
    """The overflow as /metrics reports it (None while the catalogue has no such series)."""
    if not any(spec.full_name == METRICS_SERIES for spec in CATALOG):
        return None
    (value,) = _parse(text)[METRICS_SERIES].values()
    return value


async def test_five_thousand_pods_by_list_fill_the_cap_count_the_rest_and_keep_the_static_engine(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    page_port: int,
    node: tuple[SimNode, FakeNvml],
) -> None:
    caplog.set_level(logging.INFO)
    api = PagedKubeApi()
    for i in range(PODS):
        api.put(_engine_pod(i, page_port))
    await api.start()
    d, stop, task = await _start(tmp_path, api, *node)
    try:
        for _ in range(2400):
            await d.page()  # a whole page each time, while the list is taken in
            if d.src.over_cap == PODS - CAP and len(d.src.pods()) == CAP:
                break
            await asyncio.sleep(0.05)
        assert (d.src.over_cap, len(d.src.pods())) == (PODS - CAP, CAP)
        lists = [q for q in api.requests if "watch" not in q]
        assert [q.get("continue") for q in lists] == [None] + [str(n) for n in range(500, PODS, 500)]
        assert _scraped_pods(d) == {_name(i) for i in range(CAP)}  # the first ones, in the order listed
        await _until(lambda: len(d.agent.engines) == CAP + 1)
        first, second = await _grows(d)
        assert second > first  # the static engine is still scraped, and its counters move
        text = await d.page()
        overflow = _overflow_on_metrics(text)
        assert overflow is None or overflow == PODS - CAP
        _check_log(_discovery_lines(caplog), CAP)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await api.stop()


async def test_five_thousand_pods_by_watch_while_metrics_is_read_then_leavers_make_room(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    page_port: int,
    node: tuple[SimNode, FakeNvml],
) -> None:
    caplog.set_level(logging.INFO)
    api = FakeKubeApi()
    await api.start()
    d, stop, task = await _start(tmp_path, api, *node)
    try:
        await _until(lambda: any(q.get("watch") == "true" for q in api.requests))
        for _ in range(600):
            if await d.static_up():
                break
            await asyncio.sleep(0.1)
        batch = 250
        pages = []
        for start in range(0, PODS, batch):
            for i in range(start, start + batch):
                api.emit("ADDED", _engine_pod(i, page_port))
            pages.append(await d.page())  # read while the batch streams in
        assert len(pages) == PODS // batch and all(f'engine="{STATIC}"' in p for p in pages)
        await _until(lambda: d.src.over_cap == PODS - CAP)
        assert len(d.src.pods()) == CAP
        assert _scraped_pods(d) == {_name(i) for i in range(CAP)}
        # status updates of pods already known change nothing and log nothing
        before = len(_discovery_lines(caplog))
        for i in range(0, PODS, 10):
            api.emit("MODIFIED", _engine_pod(i, page_port))
        api.emit("ADDED", pod("marker-0", ip="10.244.1.99"))  # not an engine: marks the end of the burst
        await _until(
            lambda: (
                ("llm", "marker-0") in {(p.metadata.namespace, p.metadata.name) for p in d.src.watcher.pods()}
            )
        )
        assert len(_discovery_lines(caplog)) == before
        # ten engines leave: the ten oldest waiting pods take their places
        for i in range(10):
            api.emit("DELETED", _engine_pod(i, page_port))
        await _until(lambda: d.src.over_cap == PODS - CAP - 10)
        assert _scraped_pods(d) == {_name(i) for i in range(10, CAP + 10)}
        await _until(lambda: len(d.agent.engines) == CAP + 1)
        first, second = await _grows(d)
        assert second > first
        overflow = _overflow_on_metrics(await d.page())
        assert overflow is None or overflow == PODS - CAP - 10
        lines = _discovery_lines(caplog)
        assert sum(1 for ln in lines if ln.endswith(" removed")) == 10
        _check_log(lines, CAP + 10)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await api.stop()


class _NoWatch:
    """A watcher that never runs: the test hands pods to discovery itself."""

    on_pod: object = None

    async def run(self, stop: asyncio.Event) -> None:
        """Nothing to follow."""


def test_the_cap_takes_pods_in_order_the_oldest_waiting_pod_fills_a_place_and_each_overflow_is_named_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    k = KubernetesConfig(enabled=True, pod_resources_socket=None, max_engines=2)
    src = KubeEngines(Config(node="gpu-node-1", kubernetes=k), watcher=_NoWatch())  # type: ignore[arg-type]
    ann = {"infercost.io/scrape": "true"}
    pods = {
        n: pod(n, ip=f"10.244.1.{i + 10}", annotations=ann)
        for i, n in enumerate(("a-0", "b-0", "c-0", "d-0"))
    }

    def change(name: str, gone: bool = False) -> None:
        src._pod_changed(("llm", name), None if gone else pods[name])

    def cap_lines() -> int:
        return sum("kubernetes.max_engines" in r.getMessage() for r in caplog.records)

    for n in pods:
        change(n)
    assert ({e.name for e in src.engines()}, src.over_cap, cap_lines()) == ({"a-0", "b-0"}, 2, 1)
    change("a-0")  # a status update of a pod taken in changes nothing
    change("a-0", gone=True)  # a place frees: the oldest waiting pod takes it
    assert ({e.name for e in src.engines()}, src.over_cap, cap_lines()) == ({"b-0", "c-0"}, 1, 1)
    change("d-0", gone=True)  # the last waiting pod leaves: nothing waits, the next overflow is named again
    assert src.over_cap == 0
    change("a-0")
    assert ({e.name for e in src.engines()}, src.over_cap, cap_lines()) == ({"b-0", "c-0"}, 1, 2)
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("agent.sources.kube")]
    assert [m for m in messages if "max_engines" not in m] == [
        "engine pod llm/a-0 added (a-0)",
        "engine pod llm/b-0 added (b-0)",
        "engine pod llm/a-0 removed",
        "engine pod llm/c-0 added (c-0)",
    ]
