"""Faults the daemon must survive, each with real parts: real HTTP engines serving hostile pages, a
real file-size limit standing in for a full disk, really damaged SQLite files, a read-only mount,
a hung engine socket, wall-clock steps. The daemon is the real one from ``build_agent``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import resource
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from netutil import async_wait_until, free_port, wait_until
from prometheus_client.parser import text_string_to_metric_families

from agent.app import build_agent
from agent.clock import AcceleratedClock
from agent.config import (
    Config,
    EngineConfig,
    ExportersConfig,
    IntervalsConfig,
    NvmlConfig,
    PrometheusExporterConfig,
)
from agent.logs import RateLimitFilter
from agent.sinks.outbox import Outbox
from agent.sources.prices import parse_price_book
from agent.store import Store
from agent.supervisor import Agent

PRICE = 2.0  # $ per GPU-hour in these tests' book
BOOK = parse_price_book({"gpus": [{"match": "H100", "usd_per_hour": PRICE}]}, "test-book")
Metrics = dict[str, dict[frozenset[tuple[str, str]], float]]


def _parse(text: str) -> Metrics:
    out: Metrics = defaultdict(dict)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name][frozenset(s.labels.items())] = s.value
    return out


async def _get(port: int, path: str = "/metrics") -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"http://127.0.0.1:{port}{path}", timeout=aiohttp.ClientTimeout(total=5)) as r,
    ):
        return r.status, await r.text()


async def _metrics(port: int) -> Metrics:
    status, text = await _get(port)
    assert status == 200
    return _parse(text)


def _cfg(tmp_path: Path, **kw: object) -> Config:
    base: dict[str, object] = {
        "node": "fault-node",
        "state_dir": tmp_path / "state",
        "intervals": IntervalsConfig(nvml_seconds=5, scrape_seconds=10, window_seconds=60),
        "nvml": NvmlConfig(backend="fake", fake_count=2),
        "exporters": ExportersConfig(prometheus=PrometheusExporterConfig(port=0)),
    }
    base.update(kw)
    return Config.model_validate(base)


class Running:
    """An Agent running in the background of the test's event loop."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        assert self.agent.prometheus is not None
        return self.agent.prometheus.port

    async def __aenter__(self) -> Running:
        self.task = asyncio.create_task(self.agent.run(self.stop))
        await self.agent.started.wait()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        assert self.task is not None
        await asyncio.wait_for(self.task, 30)


# ---------------------------------------------------------------- hostile values from an engine
def _vllm_page(model: str, prompt: str, gen: str) -> str:
    return (
        "# TYPE vllm:prompt_tokens_total counter\n"
        f'vllm:prompt_tokens_total{{model_name="{model}"}} {prompt}\n'
        "# TYPE vllm:generation_tokens_total counter\n"
        f'vllm:generation_tokens_total{{model_name="{model}"}} {gen}\n'
    )


class ScriptedEngine:
    """A real HTTP server answering /metrics with the next page of a script (then the last one)."""

    def __init__(self, pages: list[str]) -> None:
        self.pages = pages
        self.served = 0
        self.port = 0
        self._runner: web.AppRunner | None = None
        self.hang_after: int | None = None  # requests answered before the server stops answering

    async def _page(self, _req: web.Request) -> web.Response:
        n = self.served
        self.served += 1
        if self.hang_after is not None and n >= self.hang_after:
            await asyncio.sleep(3600)
        return web.Response(text=self.pages[min(n, len(self.pages) - 1)])

    async def __aenter__(self) -> ScriptedEngine:
        app = web.Application()
        app.router.add_get("/metrics", self._page)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    def engine(self, name: str, gpus: tuple[int, ...], timeout: float = 2.0) -> EngineConfig:
        return EngineConfig(
            name=name,
            kind="vllm",
            url=f"http://127.0.0.1:{self.port}/metrics",
            gpus=gpus,
            timeout_seconds=timeout,
        )


async def test_hostile_counters_never_make_the_agents_counters_decrease_or_stop_the_node(
    tmp_path: Path,
) -> None:
    values = ["100", "200", "-5", "+Inf", "-Inf", "1e308", "NaN", "garbage", "300", "400"]
    hostile_pages = [_vllm_page("bad-model", v, v) for v in values]
    hostile_pages[7] = "vllm:generation_tokens_total{model_name=\x00\xff\n"  # not an exposition at all
    good_pages = [_vllm_page("good-model", str(100 * i), str(1000 * i)) for i in range(1, 2000)]
    clock = AcceleratedClock(60.0)
    cfg = _cfg(tmp_path)
    async with ScriptedEngine(hostile_pages) as bad, ScriptedEngine(good_pages) as good:
        agent = await build_agent(
            cfg,
            clock=clock,
            book=BOOK,
            engines=[bad.engine("bad", (0,)), good.engine("good", (1,))],
            detection=False,
            scorer=False,
        )
        async with Running(agent) as run:
            seen: list[Metrics] = []

            async def through_the_script() -> bool:
                seen.append(await _metrics(run.port))
                return bad.served > len(values) + 1

            await async_wait_until(through_the_script, timeout=60, interval=0.05)
            seen.append(await _metrics(run.port))
            store = agent.hooks.store
            assert store is not None
            rows = store.records(0, 4e9, ("model",))
    # every counter the agent exports: finite, never negative, never decreasing, scrape after scrape
    last: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for m in seen:
        for name, series in m.items():
            if not name.endswith("_total"):
                continue
            for labels, v in series.items():
                assert math.isfinite(v) and v >= 0, (name, dict(labels), v)
                assert v >= last.get((name, labels), 0.0), (name, dict(labels), v)
                last[(name, labels)] = v
    final = seen[-1]
    good_gen = {dict(k)["model"]: v for k, v in final["infercost_generation_tokens_total"].items()}
    assert good_gen["good-model"] > 0  # the healthy engine was counted throughout
    assert final["infercost_store_up"][frozenset({("node", "fault-node")})] == 1.0
    # the hostile engine's real growth (100 → 200, 300 → 400) is at most what it can have made
    # at most 100 (100→200) + 300 (300 after the junk, counted as a restarted counter) + 100 (→400)
    assert good_gen.get("bad-model", 0.0) <= 500.0
    assert all(math.isfinite(v) for r in rows for v in r.sums.values())
    assert any(dict(r.labels)["engine"] == "good" for r in rows)  # history kept for the healthy one


# ---------------------------------------------------------------- the store fails: metrics go on
@pytest.mark.slow
def test_a_full_disk_pauses_history_only_with_one_log_line(tmp_path: Path) -> None:
    """The daemon as a process under RLIMIT_FSIZE (writes past 256 KiB fail as on a full disk)."""
    port = free_port()
    cfg = tmp_path / "node.yaml"
    cfg.write_text(
        f"node: full-node\nstate_dir: {tmp_path / 'state'}\nnvml: {{backend: fake, fake_count: 8}}\n"
        "intervals: {nvml_seconds: 0.1, scrape_seconds: 0.2}\n"
        f"exporters: {{prometheus: {{port: {port}}}}}\n"
    )

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, resource.RLIM_INFINITY))

    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "run", "--config", str(cfg)],
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=limit,
    )
    import urllib.request

    def get(path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError:
            return 0, ""

    def cost(text: str) -> float:
        m = _parse(text)
        return sum(m.get("infercost_gpu_cost_usd_total", {}).values())

    try:
        wait_until(lambda: 'infercost_store_up{node="full-node"} 0.0' in get("/metrics")[1], 60)
        c0 = cost(get("/metrics")[1])
        wait_until(lambda: cost(get("/metrics")[1]) > c0, 20)  # metrics keep moving
        status, body = get("/healthz")
        health = json.loads(body)
        assert status == 200 and health["components"]["history"]["state"] == "down"
        time.sleep(3)  # many more failing writes, retried with backoff
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    err = proc.stderr.read() if proc.stderr else ""
    assert err.count("history store failed") == 1, err[-3000:]
    assert "cannot rollback" not in err
    assert "disk I/O error" in err or "full" in err


# ---------------------------------------------------------------- damaged files, read-only dir
async def test_damaged_history_and_outbox_are_moved_aside_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "history.sqlite").write_bytes(b"\x13\x37 not a database " * 512)
    outbox = Outbox(state / "outbox.sqlite")
    for i in range(200):
        outbox.enqueue("slack", f"k{i}", "firing", {"rule_id": "r", "pad": "x" * 200}, 1.0)
    outbox.close()
    with (state / "outbox.sqlite").open("r+b") as f:  # overwrite the last table page
        f.seek((state / "outbox.sqlite").stat().st_size - 4096)
        f.write(b"\xa5" * 4096)
    with caplog.at_level(logging.ERROR):
        agent = await build_agent(
            _cfg(tmp_path), clock=AcceleratedClock(60.0), book=BOOK, engines=[], scorer=False
        )
    moved = sorted(
        p.name.split(".corrupt-")[0]
        for p in state.glob("*.corrupt-*")
        if not p.name.endswith(("-wal", "-shm"))
    )
    assert moved == ["history.sqlite", "outbox.sqlite"]
    assert len([r for r in caplog.records if "is damaged" in r.getMessage()]) == 2
    async with Running(agent) as run:
        m = await _metrics(run.port)
        assert m["infercost_store_files_recovered_total"][frozenset({("node", "fault-node")})] == 2.0
        status, body = await _get(run.port, "/healthz")
    assert Store(state / "history.sqlite").schema_version() >= 1  # recreated, usable
    assert status in (200, 503) and '"history": {"state": "ok"}' in body.replace("\n", "")


async def test_a_read_only_state_dir_runs_without_history_and_says_so(read_only_dir: Path) -> None:
    cfg = _cfg(read_only_dir.parent, state_dir=read_only_dir)
    agent = await build_agent(cfg, clock=AcceleratedClock(60.0), book=BOOK, engines=[], scorer=False)
    assert agent.hooks.store is not None and not str(agent.hooks.store.path).startswith(str(read_only_dir))
    async with Running(agent) as run:

        async def ticked() -> bool:
            m = await _metrics(run.port)
            return sum(m.get("infercost_gpu_cost_usd_total", {}).values()) > 0

        await async_wait_until(ticked, timeout=20)
        status, body = await _get(run.port, "/healthz")
        m = await _metrics(run.port)
    assert status == 200
    history = json.loads(body)["components"]["history"]
    assert history["state"] == "degraded" and "takes no writes" in history["detail"]
    assert "running without history" in history["detail"]
    assert sum(m["infercost_gpu_cost_usd_total"].values()) > 0  # costs still measured
    temp = agent.hooks.store.path.parent
    assert not temp.exists()  # the private temporary history is removed at shutdown


# ---------------------------------------------------------------- NVML auto without a driver
async def test_nvml_auto_without_a_driver_exports_nvml_up_0(tmp_path: Path) -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("this machine has a working NVIDIA driver")
    except Exception:
        pass
    cfg = _cfg(tmp_path, nvml=NvmlConfig(backend="auto"))
    agent = await build_agent(cfg, clock=AcceleratedClock(60.0), book=BOOK, engines=[], history=False)
    async with Running(agent) as run:
        m = await _metrics(run.port)
        _, body = await _get(run.port, "/healthz")
    assert m["infercost_nvml_up"] == {frozenset({("node", "fault-node")}): 0.0}
    assert '"nvml": {"state": "down"}' in body


# ---------------------------------------------------------------- a stuck loop fails liveness
async def test_liveness_fails_only_when_the_tick_is_stuck(tmp_path: Path) -> None:
    page = _vllm_page("m", "1", "1")
    async with ScriptedEngine([page]) as eng:
        eng.hang_after = 3  # then the engine accepts the connection and never answers
        cfg = _cfg(
            tmp_path,
            intervals=IntervalsConfig(nvml_seconds=0.1, scrape_seconds=0.2, window_seconds=60),
        )
        agent = await build_agent(
            cfg, book=BOOK, engines=[eng.engine("hung", (0,), timeout=600)], history=False
        )
        async with Running(agent) as run:
            states: list[tuple[int, str]] = []

            async def stuck() -> bool:
                status, body = await _get(run.port, "/healthz")
                states.append((status, body))
                return status == 503 and '"status": "stuck"' in body

            await async_wait_until(stuck, timeout=20, interval=0.1)
            assert any(s == 200 and '"status": "ok"' in b for s, b in states)  # it was live before
            status, _ = await _get(run.port, "/metrics")  # the endpoint itself still answers
            assert status == 200
            eng.hang_after = None


# ---------------------------------------------------------------- wall-clock steps
class SteppedClock(AcceleratedClock):
    """An accelerated clock whose *wall* face can be stepped (as NTP or an operator would)."""

    def __init__(self, factor: float) -> None:
        super().__init__(factor)
        self.offset = 0.0  # seconds added to wall time

    def now(self) -> float:
        return super().now() + self.offset


async def test_a_wall_clock_step_neither_charges_the_gap_nor_drops_history(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = SteppedClock(120.0)
    cfg = _cfg(tmp_path, intervals=IntervalsConfig(nvml_seconds=5, scrape_seconds=10, window_seconds=60))
    agent = await build_agent(cfg, clock=clock, book=BOOK, engines=[], detection=False, scorer=False)
    store = agent.hooks.store
    assert store is not None

    def gpu_rows() -> int:
        return len(store.records(0, 4e9, ("gpu",)))

    async with Running(agent) as run:

        async def costing() -> bool:
            return sum((await _metrics(run.port)).get("infercost_gpu_cost_usd_total", {}).values()) > 0

        with caplog.at_level(logging.WARNING):
            await async_wait_until(costing, timeout=20)
            clock.offset = 86400.0  # a day forward
            await asyncio.sleep(1.0)
            rows_before_back = gpu_rows()
            clock.offset = 86400.0 - 7200.0  # then two hours back
            await asyncio.sleep(1.5)
            m = await _metrics(run.port)
            elapsed = clock.monotonic()  # simulated seconds the agent has run
            rows_after = gpu_rows()
    total = sum(m["infercost_gpu_cost_usd_total"].values())
    # cost accrues with monotonic time only: at most 2 GPUs × $2/h over the elapsed time (not a day)
    assert 0 < total <= 2 * PRICE * elapsed / 3600 * 1.001
    assert rows_after > rows_before_back  # minutes kept being written after the backward step
    msgs = [r.getMessage() for r in caplog.records]
    assert sum("stepped forward by" in x for x in msgs) == 1
    assert sum("stepped back by" in x for x in msgs) == 1


# ---------------------------------------------------------------- log floods
def test_repeated_errors_log_once_per_interval_with_a_count() -> None:
    now = [0.0]
    filt = RateLimitFilter(interval=60.0, monotonic=lambda: now[0])
    log = logging.getLogger("test.flood")
    kept: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            kept.append(record.getMessage())

    h = Keep()
    h.addFilter(filt)
    log.addHandler(h)
    log.propagate = False
    log.setLevel(logging.DEBUG)

    def warn(line: str) -> None:  # one place in the code, as a scraper's error path is
        log.warning("malformed line %r", line)

    try:
        for i in range(1000):  # e.g. a malformed line whose text changes every scrape
            warn("x" * 1_000_000 if i == 0 else f"line {i}")
            now[0] += 0.05
        log.info("an info line is never held back")
        now[0] = 61.0
        warn("again")
    finally:
        log.removeHandler(h)
    assert len(kept) == 3
    assert len(kept[0]) < 2100 and "more characters" in kept[0]  # a 1 MB line is cut
    assert kept[1] == "an info line is never held back"
    assert kept[2] == "malformed line 'again' [999 similar messages held back in the last 61 s]"


async def test_healthz_is_json_per_component(tmp_path: Path) -> None:
    agent = await build_agent(
        _cfg(tmp_path), clock=AcceleratedClock(60.0), book=BOOK, engines=[], scorer=False
    )
    async with Running(agent) as run:

        async def ok() -> bool:
            m = await _metrics(run.port)
            return sum(m.get("infercost_gpu_cost_usd_total", {}).values()) > 0

        await async_wait_until(ok, timeout=20)
        doc = json.loads((await _get(run.port, "/healthz"))[1])
    assert doc["status"] == "ok" and doc["ok"] is True and doc["node"] == "fault-node"
    c = doc["components"]
    assert c["tick"]["state"] == "ok" and c["tick"]["ticks"] >= 1
    assert c["nvml"] == {"state": "up"}
    assert c["history"] == {"state": "ok"} and c["detection"] == {"state": "ok"}


@pytest.mark.slow
def test_file_descriptor_exhaustion_does_not_flood_the_log(tmp_path: Path) -> None:
    """The daemon as a process with 64 file descriptors; 100 idle connections to its port exhaust
    them, so every accept() fails (EMFILE) for a while. The log says so a few times, not thousands."""
    import socket
    import urllib.request

    port = free_port()
    cfg = tmp_path / "node.yaml"
    cfg.write_text(
        f"node: fd-node\nstate_dir: {tmp_path / 'state'}\nnvml: {{backend: fake, fake_count: 2}}\n"
        "intervals: {nvml_seconds: 0.2, scrape_seconds: 0.2}\n"
        f"exporters: {{prometheus: {{port: {port}}}}}\n"
    )

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    log = (tmp_path / "daemon.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "run", "--config", str(cfg)],
        stderr=log,
        preexec_fn=limit,
    )

    def up() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                return True
        except OSError:
            return False

    held: list[socket.socket] = []
    try:
        wait_until(up, 60)
        for _ in range(100):
            s = socket.socket()
            s.settimeout(2)
            try:
                s.connect(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            held.append(s)
        time.sleep(8)  # thousands of failed accepts a second, unthrottled
        assert proc.poll() is None
    finally:
        for s in held:
            s.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    log.close()
    lines = (tmp_path / "daemon.log").read_text().splitlines()
    assert len(lines) < 200, f"{len(lines)} lines; last: {lines[-5:]}"


def test_json_log_lines_carry_rfc3339_time_and_arguments_as_json() -> None:
    from agent.logs import JsonFormatter

    rec = logging.LogRecord(
        "agent.detect.pipeline", logging.INFO, __file__, 1, "alert %s %s %s",
        ("firing", "cost_per_token_regression", {"model": "m", "model_version": "v2"}), None,
    )  # fmt: skip
    rec.created = 1_795_996_800.25  # 2026-11-30T00:00:00.250Z
    rec.engine = "vllm-a"  # a structured field (extra=)
    doc = json.loads(JsonFormatter().format(rec))
    assert doc["time"] == "2026-11-30T00:00:00.250Z"
    assert doc["args"][2] == {"model": "m", "model_version": "v2"}
    assert doc["template"] == "alert %s %s %s" and doc["engine"] == "vllm-a"
    assert doc["level"] == "info" and doc["logger"] == "agent.detect.pipeline"


def test_steady_clock_ignores_wall_steps_for_intervals() -> None:
    from agent.clock import ManualClock, SteadyClock

    base = ManualClock(1_000_000.0)
    steady = SteadyClock(base)
    base.advance(10)
    assert steady.now() == 1_000_010.0 and steady.resync() is None
    base.step_wall(3600)  # an hour forward: noticed, re-anchored to wall time
    jump = steady.resync()
    assert jump is not None and jump.seconds == 3600 and jump.reanchored
    assert steady.now() == 1_003_610.0
    base.step_wall(-600)  # ten minutes back: the agent's time keeps going forward
    jump = steady.resync()
    assert jump is not None and jump.seconds == -600 and not jump.reanchored
    base.advance(5)
    assert steady.now() == 1_003_615.0 and steady.resync() is None  # logged once, not per tick
    base.step_wall(600)  # wall catches up: back in step
    assert steady.resync() is None and steady.now() == base.now()


@pytest.mark.slow
async def test_metrics_answer_while_detection_replays_history(tmp_path: Path) -> None:
    """Start-up replay runs off the event loop: /metrics answers while it is still going (with the
    replay on the loop, no request could complete before it ended)."""
    from infercost_bench.report import fill_store

    state = tmp_path / "state"
    state.mkdir()
    end = time.time() // 60 * 60
    await asyncio.to_thread(fill_store, state / "history.sqlite", 24, 3.0, end)
    cfg = _cfg(
        tmp_path,
        intervals=IntervalsConfig(nvml_seconds=0.5, scrape_seconds=0.5, window_seconds=60),
        store={"retention_days": 5},
    )
    agent = await build_agent(cfg, book=BOOK, engines=[], scorer=False)
    answered_during_replay = 0
    async with Running(agent) as run:

        async def replay_started() -> bool:
            return agent._detect_task is not None

        await async_wait_until(replay_started, timeout=30, interval=0.01)
        task = agent._detect_task
        assert task is not None
        while not task.done():
            status, _ = await _get(run.port)
            if status == 200 and not task.done():
                answered_during_replay += 1
            await asyncio.sleep(0.01)
    assert answered_during_replay >= 3
