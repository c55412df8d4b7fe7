"""The cost API, ``GET /api/v1/cost``: parameters as OpenCost names them, answered from the node's
own history, behind the /metrics server's TLS and auth.

The end-to-end test runs the real daemon (``python -m agent.cli run``) on a node.yaml whose static
engines carry ``labels: {team: …}``, scraping simulated vLLM engines over HTTP, and asks the API
what ``curl 'http://127.0.0.1:9464/api/v1/cost?window=1h&aggregate=team'`` would."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from netutil import free_port
from prometheus_client.parser import text_string_to_metric_families

from agent.clock import SystemClock
from agent.sinks.api import BadRequest, parse_aggregate, parse_query, parse_window
from agent.store import Store
from infercost_sim.engine import MISTRAL_7B, QWEN_14B
from infercost_sim.node import EngineSpec, SimNode
from tests.procs import terminate

PRICE = 3.0  # $ per GPU-hour in this test's book
QUERY = (sys.executable, "-m", "agent.cli", "query", "--state-dir")
NOW = 1_781_136_000.0  # 2026-06-11T00:00:00Z


# ------------------------------------------------------------------------------- parameters
@pytest.mark.parametrize(
    ("window", "start", "end"),
    [
        ("1h", NOW - 3600, NOW),
        ("24h", NOW - 86400, NOW),
        ("7d", NOW - 7 * 86400, NOW),
        ("30m", NOW - 1800, NOW),
        ("2026-06-10T00:00:00Z,2026-06-10T12:00:00Z", NOW - 86400, NOW - 43200),
        ("2026-06-10T02:00:00+02:00,2026-06-10T12:00:00Z", NOW - 86400, NOW - 43200),
        ("1781049600,1781092800", NOW - 86400, NOW - 43200),
    ],
)
def test_windows_are_durations_back_from_now_or_rfc3339_pairs(window: str, start: float, end: float) -> None:
    assert parse_window(window, NOW) == (start, end)


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({}, "window: required"),
        ({"window": "yesterday-ish"}, "neither a duration"),
        ({"window": "2026-06-10T00:00:00,2026-06-10T12:00:00Z"}, "no offset"),
        ({"window": "2026-06-10T12:00:00Z,2026-06-10T00:00:00Z"}, "end must be after the start"),
        ({"window": "2026-13-10T00:00:00Z,2026-06-10T12:00:00Z"}, "not an RFC 3339 time"),
        ({"window": "0h"}, "longer than 0"),
        ({"window": "1h", "costBasis": "amortised"}, "costBasis"),
        ({"window": "1h", "aggregate": "team;drop table"}, "aggregate"),
        ({"window": "1h", "aggregate": ","}, "aggregate: give"),
        ({"window": "1h", "shareIdle": "maybe"}, "shareIdle"),
        ({"window": "1h", "step": "1d"}, "unknown parameter 'step'"),
        ({"window": "2027-06-10T00:00:00Z,2027-06-11T00:00:00Z"}, "future"),
        ({"window": "2025-06-10T00:00:00Z,2025-06-11T00:00:00Z"}, "before the oldest minute"),
    ],
)
def test_a_bad_parameter_is_refused_naming_it(params: dict[str, str], fragment: str) -> None:
    with pytest.raises(BadRequest, match=fragment):
        parse_query(params, NOW, 35 * 86400)


def test_a_window_beyond_retention_is_read_from_the_oldest_minute_and_says_so() -> None:
    q = parse_query({"window": "90d", "aggregate": "label:team,namespace"}, NOW, 35 * 86400)
    assert (q.start, q.end) == (NOW - 35 * 86400, NOW)
    assert q.aggregate == ("team", "namespace")
    assert len(q.warnings) == 1 and "35 days" in q.warnings[0]
    assert parse_aggregate("model_name, model_version,model_name") == ("model_name", "model_version")


# ------------------------------------------------------------------------------- the real daemon
class Daemon:
    """``python -m agent.cli run`` on a node.yaml of its own; stderr kept in a file."""

    def __init__(self, tmp: Path, engines: list[tuple[str, str, int, str]], web_config: Path | None = None):
        self.port = free_port()
        book = tmp / "book.yaml"
        book.write_text(f"gpus:\n  - {{match: H100, usd_per_hour: {PRICE}}}\n")
        lines = [
            "node: api-node",
            f"state_dir: {tmp / 'state'}",
            "nvml: {backend: fake, fake_count: 3}",  # GPU 2 is used by no engine: idle dollars
            "intervals: {nvml_seconds: 0.5, scrape_seconds: 0.5}",
            f"prices: {{book: {book}}}",
            f"exporters: {{prometheus: {{port: {self.port}"
            + (f", web_config_file: {web_config}" if web_config else "")
            + "}}",
            "engines:",
        ]
        for name, url, gpu, team in engines:
            lines.append(
                f"  - {{name: {name}, kind: vllm, url: '{url}', gpus: [{gpu}], labels: {{team: {team}}}}}"
            )
        cfg = tmp / "node.yaml"
        cfg.write_text("\n".join(lines) + "\n")
        self.log = tmp / "daemon.log"
        self._log = self.log.open("w")
        self.started = time.time()  # epoch seconds: the daemon can have cost no more than since
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent.cli", "run", "--config", str(cfg)], stderr=self._log
        )

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def metric(self, name: str, **labels: str) -> float:
        status, text = self.get("/metrics")
        assert status == 200
        return sum(
            s.value
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
            if s.name == name and labels.items() <= s.labels.items()
        )

    def stop(self) -> str:
        terminate(self.proc)
        self._log.close()
        return self.log.read_text()


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[SimNode]:
    node = SimNode(
        SystemClock(),
        tmp_path / "labels",
        engines=(
            EngineSpec("search-llm", MISTRAL_7B, (0,), "v0.3", peak_load=0.6),
            EngineSpec("chat-llm", QWEN_14B, (1,), "2024-09", peak_load=0.7),
        ),
        gpu_count=3,
        target_page_bytes=None,
    )
    await node.start()
    yield node
    await node.stop()


async def _wait(pred: Any, timeout: float = 60.0) -> None:
    """Poll a blocking ``pred`` off the event loop (the simulated engines are served on it)."""
    end = time.monotonic() + timeout
    while not await asyncio.to_thread(pred):
        assert time.monotonic() < end, "condition not reached"
        await asyncio.sleep(0.2)


async def test_the_cost_of_team_search_over_the_last_hour_from_the_running_daemon(
    sim: SimNode, tmp_path: Path
) -> None:
    urls = {c.name: c.url for c in sim.engine_configs()}
    d = Daemon(
        tmp_path, [("search-llm", urls["search-llm"], 0, "search"), ("chat-llm", urls["chat-llm"], 1, "chat")]
    )
    try:

        def priced() -> bool:
            try:
                return d.metric("infercost_cost_usd_total", engine="search-llm") > 0 and (
                    d.metric("infercost_generation_tokens_total", engine="search-llm") > 0
                )
            except (OSError, AssertionError):
                return False

        await _wait(priced)

        async def around_a_query() -> tuple[dict[str, float], float, int, str, dict[str, float], float]:
            """/metrics' counters, the team query, /metrics again: the query's figures lie between."""
            names = (
                "infercost_cost_usd_total",
                "infercost_prompt_tokens_total",
                "infercost_generation_tokens_total",
            )
            before = {n: await asyncio.to_thread(d.metric, n, engine="search-llm") for n in names}
            gpus_before = await asyncio.to_thread(d.metric, "infercost_gpu_cost_usd_total")
            status, text = await asyncio.to_thread(d.get, "/api/v1/cost?window=1h&aggregate=team")
            after = {n: await asyncio.to_thread(d.metric, n, engine="search-llm") for n in names}
            gpus_after = await asyncio.to_thread(d.metric, "infercost_gpu_cost_usd_total")
            return before, gpus_before, status, text, after, gpus_after

        # vLLM observes a request's prefill and decode times when it finishes, so the first minutes can have
        # tokens and no phase split yet: query until a finished request has given the window one
        end = time.monotonic() + 120
        while True:
            before, gpus_before, status, text, after, gpus_after = await around_a_query()
            split = status == 200 and all(
                it["promptCostUsd"] is not None
                for it in json.loads(text)["items"]
                if it["key"]["team"] == "search"
            )
            if split or time.monotonic() > end:
                break
            await asyncio.sleep(1.0)
        assert status == 200, text
        body = json.loads(text)
        items = {it["key"]["team"]: it for it in body["items"]}
        assert set(items) == {"search", "chat", "__idle__"}  # GPU 2 held by no engine
        search = items["search"]
        assert body["costBasis"] == "allocation"
        assert set(body["window"]) == {"start", "end"}
        # the team's dollars and tokens are its engine's, as /metrics counted them around the query
        for field, name in (
            ("costUsd", "infercost_cost_usd_total"),
            ("promptTokens", "infercost_prompt_tokens_total"),
            ("outputTokens", "infercost_generation_tokens_total"),
        ):
            assert before[name] * (1 - 1e-9) <= search[field] <= after[name] * (1 + 1e-9), field
        assert search["outputTokens"] > 0 and search["costUsd"] > 0
        # a simulated vLLM has phase times: prompt + output dollars are the whole, prices per 1M follow
        assert search["promptCostUsd"] + search["outputCostUsd"] == pytest.approx(search["costUsd"])
        assert search["usdPer1MOutputTokens"] == pytest.approx(
            search["outputCostUsd"] / search["outputTokens"] * 1e6
        )
        # one GPU at $3/h for at most the daemon's life: a physically possible figure
        assert search["costUsd"] <= PRICE / 3600 * (time.time() - d.started) + 1e-9
        # every dollar of the node's GPUs is in exactly one item (GPU 2's in __idle__)
        assert gpus_before <= sum(it["costUsd"] for it in body["items"]) * (1 + 1e-9)
        assert sum(it["costUsd"] for it in body["items"]) <= gpus_after * (1 + 1e-9)

        # shared idle: no __idle__ item, the GPUs' dollars all the same
        status, text = await asyncio.to_thread(d.get, "/api/v1/cost?window=1h&aggregate=team&shareIdle=true")
        shared = json.loads(text)
        assert status == 200 and {it["key"]["team"] for it in shared["items"]} == {"search", "chat"}
        # usage basis: without a GPU load the fake NVML reads idle GPUs, so nothing was used
        status, text = await asyncio.to_thread(d.get, "/api/v1/cost?window=1h&aggregate=team&costBasis=usage")
        usage = json.loads(text)
        assert status == 200 and usage["costBasis"] == "usage"
        assert sum(it["costUsd"] for it in usage["items"]) >= gpus_before * (1 - 1e-9)
        status, text = await asyncio.to_thread(d.get, "/api/v1/cost?window=1h&aggregate=team&costBasis=cheap")
        assert status == 400 and "costBasis" in json.loads(text)["error"]
    finally:
        log = d.stop()
    assert "Traceback" not in log, log

    # the stopped node's store through `infercost query`: every GPU dollar of the window in one item
    window = f"{body['window']['start']},{body['window']['end']}"
    out = subprocess.run(
        [*QUERY, str(tmp_path / "state"), "--window", window, "--aggregate", "team,namespace"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    later = json.loads(out.stdout)
    store = Store(tmp_path / "state" / "history.sqlite")
    try:
        start, end = parse_window(window, time.time())
        gpu_usd = sum(r.sums["cost_usd"] for r in store.records(start, end, ("gpu",)))
        model = store.records(start, end, ("model",))
    finally:
        store.close()
    assert sum(it["costUsd"] for it in later["items"]) == pytest.approx(gpu_usd, rel=1e-9)
    by_team = {it["key"]["team"]: it for it in later["items"]}
    assert by_team["search"]["key"]["namespace"] == "__unallocated__"  # a static engine has none
    assert by_team["search"]["outputTokens"] == pytest.approx(
        sum(r.sums["generation_tokens"] for r in model if dict(r.labels)["engine"] == "search-llm")
    )
    assert by_team["__idle__"]["costUsd"] == pytest.approx(
        gpu_usd - sum(r.sums["cost_usd"] for r in model), rel=1e-9
    )
    table = subprocess.run(
        [*QUERY, str(tmp_path / "state"), "--window", window, "--aggregate", "team", "--format", "table"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "search" in table and "$" in table and "$0.000" not in table
    bad = subprocess.run(
        [*QUERY, str(tmp_path / "state"), "--window", "soon"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert bad.returncode == 2 and "window" in bad.stderr


async def test_the_api_is_behind_the_metrics_servers_auth(tmp_path: Path) -> None:
    from agent.sinks.api import CostApi
    from agent.sinks.prometheus import PrometheusServer
    from agent.sinks.webconfig import load_web_config
    from agent.snapshot import Snapshot

    (tmp_path / "token").write_text("tok-123\n")
    (tmp_path / "web.yml").write_text("bearer_token_file: token\n")
    Store(tmp_path / "history.sqlite").close()
    api = CostApi(tmp_path / "history.sqlite", 35.0)
    snap = Snapshot(node="n", version="t", timestamp=0.0)
    server = PrometheusServer(
        lambda: snap,
        lambda: True,
        "127.0.0.1",
        0,
        web_config=load_web_config(tmp_path / "web.yml"),
        routes={CostApi.PATH: api.handle},
    )
    await server.start()
    try:
        url = f"http://127.0.0.1:{server.port}/api/v1/cost?window=1h&aggregate=team"
        async with aiohttp.ClientSession() as s:
            async with s.get(url) as r:
                assert r.status == 401
            async with s.get(url, headers={"Authorization": "Bearer tok-123"}) as r:
                assert r.status == 200
                body = await r.json()
                assert body["items"] == [] and body["costBasis"] == "allocation"
            async with s.get(url + "&window=2h", headers={"Authorization": "Bearer tok-123"}) as r:
                assert r.status == 200  # the first value of a repeated parameter
            async with s.get(url + "&costBasis=x", headers={"Authorization": "Bearer tok-123"}) as r:
                assert r.status == 400 and "costBasis" in (await r.json())["error"]
    finally:
        await server.stop()
