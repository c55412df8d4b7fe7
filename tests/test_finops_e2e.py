"""Cost by namespace and team, end to end.

A local Kubernetes API server lists engine pods in two namespaces owned by two teams (the team a
pod label, the namespaces crossing the teams); each pod is a simulated vLLM engine serving real
``/metrics`` over HTTP; the real daemon discovers them, prices their GPUs from a book whose price
doubles at midnight, and keeps its history. Over an RFC 3339 window that crosses the price change:

- ``/api/v1/cost`` by team and by namespace, under both cost bases, agrees to the cent with the
  per-engine figures of the same history (each group the sum of its engines'), and its items add
  up to the GPUs' dollars;
- the weekly report's ``--group-by team`` agrees to the cent with the API over the report's week;
- a real Prometheus scraping the daemon and evaluating rules/prometheus records cost by team and by
  namespace under the labels the pods carry, every group adding up to the fleet's GPU dollars.

The rules are 1-hour rates evaluated on Prometheus' clock, so they are held to the per-engine
rates of the same Prometheus (the join), not to the cent of a history window.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import io
import json
import time
from collections import defaultdict
from pathlib import Path

import aiohttp
import pytest
from netutil import async_wait_until
from promstack import Prometheus, test_copy_of_rules

from agent.app import build_agent
from agent.cli import build_parser
from agent.clock import AcceleratedClock
from agent.config import (
    Config,
    ExportersConfig,
    IntervalsConfig,
    KubernetesConfig,
    NvmlConfig,
    PrometheusExporterConfig,
)
from agent.report.data import build_from_store
from agent.report.groups import groups_from_prometheus, groups_from_store
from agent.report.prom import PromApi, http_fetcher
from agent.sources.prices import parse_price_book
from agent.store import Store
from infercost_sim.engine import LLAMA_70B_FP8, MISTRAL_7B, QWEN_14B
from infercost_sim.node import EngineSpec, SimNode
from tests.kubeapi import FakeKubeApi, pod, write_kubeconfig

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "rules" / "prometheus" / "infercost.rules.yml"
MIDNIGHT = dt.datetime(2026, 6, 11, tzinfo=dt.UTC).timestamp()  # the price change
BEFORE, AFTER = 3.0, 6.0  # $ per H100-hour before and after it
SPEED = 30.0  # simulated seconds per real second
# engine → (namespace, team, GPUs): namespaces and teams cross, so the two groupings differ
OWNERS = {
    "search-llm": ("search", "alpha", (0, 1)),
    "chat-llm": ("chat", "beta", (2,)),
    "embed-llm": ("chat", "alpha", (3,)),
}
GPU_COUNT = 5  # GPU 4 is held by no engine: idle dollars


def _cents(v: float) -> int:
    return round(v * 100)


async def _get(session: aiohttp.ClientSession, url: str) -> dict:  # type: ignore[type-arg]
    async with session.get(url) as r:
        assert r.status == 200, await r.text()
        return dict(await r.json())


@pytest.fixture
async def node(tmp_path: Path):  # type: ignore[no-untyped-def]
    clock = AcceleratedClock(SPEED, start=MIDNIGHT - 330.0)  # 23:54:30, the day before
    sim = SimNode(
        clock,
        tmp_path / "labels",
        engines=(
            EngineSpec("search-llm", LLAMA_70B_FP8, OWNERS["search-llm"][2], "2024-09", capacity_routed=True),
            EngineSpec("chat-llm", QWEN_14B, OWNERS["chat-llm"][2], "2024-09", peak_load=0.7),
            EngineSpec("embed-llm", MISTRAL_7B, OWNERS["embed-llm"][2], "v0.3", peak_load=0.6),
        ),
        gpu_count=GPU_COUNT,
        target_page_bytes=None,
    )
    await sim.start()
    statics = sim.engine_configs()
    api = FakeKubeApi()
    for e in statics:
        ns, team, _ = OWNERS[e.name]
        port = int(e.url.rsplit(":", 1)[1].split("/")[0])
        api.put(
            pod(
                e.name,
                namespace=ns,
                node="gpu-node-1",
                ip="127.0.0.1",
                ports=(("http", port),),
                labels={"team": team, "app.kubernetes.io/version": e.model_version or ""},
                annotations={"infercost.io/scrape": "true", "infercost.io/engine": "vllm"},
            )
        )
    await api.start()
    cfg = Config(
        node="gpu-node-1",
        state_dir=tmp_path / "state",
        intervals=IntervalsConfig(nvml_seconds=5, scrape_seconds=10, window_seconds=60),
        nvml=NvmlConfig(backend="fake", fake_count=GPU_COUNT),
        exporters=ExportersConfig(prometheus=PrometheusExporterConfig(port=0)),
        # GPUs of the discovered pods from the static engines of the same name (no kubelet socket here)
        engines=tuple(e.model_copy(update={"version_file": None}) for e in statics),
        kubernetes=KubernetesConfig(
            enabled=True,
            kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", api.url),
            pod_resources_socket=None,
            allow_loopback=True,  # the simulated engines serve on loopback
            cost_labels=("team",),
        ),
    )
    book = parse_price_book(
        {
            "gpus": [
                {"match": "H100", "usd_per_hour": BEFORE, "effective_from": "2026-06-01"},
                {"match": "H100", "usd_per_hour": AFTER, "effective_from": "2026-06-11"},
            ]
        },
        "test-book",
    )
    agent = await build_agent(cfg, clock=clock, book=book, load=sim.gpu_load, detection=False, scorer=False)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    await agent.started.wait()
    try:
        yield clock, agent, tmp_path
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await sim.stop()
        await api.stop()


async def test_api_report_and_rules_agree_by_namespace_and_team_across_a_price_change(node) -> None:  # type: ignore[no-untyped-def]
    clock, agent, tmp = node
    assert agent.prometheus is not None
    base = f"http://127.0.0.1:{agent.prometheus.port}"
    prom = Prometheus(tmp / "prom", targets=[f"127.0.0.1:{agent.prometheus.port}"],
                      rule_files=[test_copy_of_rules(RULES, tmp / "rules.yml")])  # fmt: skip
    try:
        # the window: 23:57 to 00:03, across the midnight price change
        start, end = MIDNIGHT - 180.0, MIDNIGHT + 180.0

        async def past() -> bool:
            return bool(clock.now() >= end + 30.0)

        await async_wait_until(past, timeout=120, what="past the window")
        window = "2026-06-10T23:57:00Z,2026-06-11T00:03:00Z"

        # the per-engine figures of the same history
        store = Store(tmp / "state" / "history.sqlite")
        try:
            minutes = store.records(start, end, ("model",))
            gpu_minutes = store.records(start, end, ("gpu",))
        finally:
            store.close()
        per_engine: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for r in minutes:
            e = dict(r.labels)["engine"]
            for k in ("cost_usd", "usage_usd", "usage_alloc_usd", "generation_tokens", "prompt_tokens"):
                per_engine[e][k] += r.sums.get(k, 0.0)
        assert set(per_engine) == set(OWNERS)
        gpu_usd = sum(r.sums["cost_usd"] for r in gpu_minutes)
        # the price doubled at midnight: a GPU-second of a minute well before it costs half one after
        # it (the minute a tick straddles midnight in is priced by each side's share)
        rate = {
            m: sum(r.sums["cost_usd"] for r in minutes if r.minute == MIDNIGHT + m)
            / sum(r.sums["gpu_seconds"] for r in minutes if r.minute == MIDNIGHT + m)
            for m in (-120.0, 60.0)
        }
        assert rate[-120.0] == pytest.approx(BEFORE / 3600) and rate[60.0] == pytest.approx(AFTER / 3600)

        async with aiohttp.ClientSession() as s:
            for by, pos in (("team", 1), ("namespace", 0)):
                for basis in ("allocation", "usage"):
                    body = await _get(
                        s, f"{base}/api/v1/cost?window={window}&aggregate={by}&costBasis={basis}"
                    )
                    assert body["window"] == {"start": "2026-06-10T23:57:00Z", "end": "2026-06-11T00:03:00Z"}
                    items = {it["key"][by]: it for it in body["items"]}
                    want: dict[str, float] = defaultdict(float)
                    tokens: dict[str, float] = defaultdict(float)
                    for e, f in per_engine.items():
                        g = OWNERS[e][pos]
                        used = f["usage_usd"] + f["cost_usd"] - f["usage_alloc_usd"]
                        want[g] += f["cost_usd"] if basis == "allocation" else used
                        tokens[g] += f["generation_tokens"]
                    assert set(items) == {*want, "__idle__"}, (by, basis)
                    for g, usd in want.items():
                        assert _cents(items[g]["costUsd"]) == _cents(usd), (by, basis, g)
                        assert items[g]["outputTokens"] == pytest.approx(tokens[g])
                    # every dollar of the GPUs in one item, idle included
                    assert _cents(sum(it["costUsd"] for it in body["items"])) == _cents(gpu_usd)

            # the report's week by team = the API's over the same week
            report_end = MIDNIGHT + 180.0
            rep = build_from_store(tmp / "state" / "history.sqlite", report_end)
            groups = groups_from_store(tmp / "state" / "history.sqlite", rep.start, rep.end, "team", False)
            week = f"{_iso(rep.start)},{_iso(rep.end)}"
            api_week = await _get(s, f"{base}/api/v1/cost?window={week}&aggregate=team")
            by_api = {it["key"]["team"]: it["costUsd"] for it in api_week["items"]}
            assert {g.group: _cents(g.cost_usd) for g in groups} == {k: _cents(v) for k, v in by_api.items()}
            assert _cents(sum(g.cost_usd for g in groups if g.group != "__idle__")) == _cents(rep.total_usd)

        # the fleet rules, on Prometheus' clock: the pods' namespaces and teams, joined by engine
        beta = 'team:infercost_cost_usd:rate1h{label_team="beta"}'
        assert await asyncio.to_thread(prom.wait_for, beta, 60)
        await asyncio.sleep(3)  # a few more evaluations of every record
        (stamp,) = prom.query(f"timestamp({beta})")
        at = float(stamp["value"][1])  # one evaluation of the group: every record of it at this instant

        def by(expr: str, label: str) -> dict[str, float]:
            return {r["metric"].get(label, ""): float(r["value"][1]) for r in prom.query(expr, at)}

        teams = by("team:infercost_cost_usd:rate1h", "label_team")
        spaces = by("engine_namespace:infercost_cost_usd:rate1h", "engine_namespace")
        assert set(teams) == {"alpha", "beta", "__idle__"} and set(spaces) == {"search", "chat", "__idle__"}
        per = by("sum by (engine) (engine_model_version:infercost_cost_usd:rate1h)", "engine")
        assert set(per) == set(OWNERS)
        for g, pos, got in (
            ("alpha", 1, teams),
            ("beta", 1, teams),
            ("search", 0, spaces),
            ("chat", 0, spaces),
        ):
            assert got[g] == pytest.approx(sum(v for e, v in per.items() if OWNERS[e][pos] == g), rel=1e-9), g
        idle = sum(by("node:infercost_unallocated_gpu_cost_usd:rate1h", "node").values())
        assert teams["__idle__"] == pytest.approx(idle) and spaces["__idle__"] == pytest.approx(idle)
        assert sum(teams.values()) == pytest.approx(sum(spaces.values()), rel=1e-9)
        # and the raw GPU dollars: a scrape may land between the group's evaluation and this query,
        # moving a 1-hour rate of a minutes-old series by a share of a scrape interval over its age
        fleet = float(prom.query("sum(rate(infercost_gpu_cost_usd_total[1h]))", at)[0]["value"][1])
        assert sum(teams.values()) == pytest.approx(fleet, rel=0.05)

        # `infercost query` for the fleet, through the same Prometheus (the test's minutes of data)
        args = ["query", "--prometheus", prom.url, "--window", "15m", "--aggregate", "team,namespace"]
        out = io.StringIO()
        parsed = build_parser().parse_args(args)  # main() would also set up the process's logging
        with contextlib.redirect_stdout(out):
            assert await asyncio.to_thread(parsed.func, parsed) == 0
        fleet_q = json.loads(out.getvalue())
        keys = {(it["key"]["team"], it["key"]["namespace"]) for it in fleet_q["items"]}
        assert keys == {("alpha", "search"), ("beta", "chat"), ("alpha", "chat"), ("__idle__", "__idle__")}
        raw = float(prom.query("sum(increase(infercost_gpu_cost_usd_total[15m]))")[0]["value"][1])
        assert sum(it["costUsd"] for it in fleet_q["items"]) == pytest.approx(raw, rel=0.05)
        # and the fleet report's --group-by team, from the same rows
        now = time.time()
        fleet_groups = groups_from_prometheus(
            PromApi(prom.url, http_fetcher()), now - 900, now, "team", False
        )
        assert {g.group for g in fleet_groups} == {"alpha", "beta", "__idle__"}
        assert sum(g.cost_usd for g in fleet_groups) == pytest.approx(raw, rel=0.05)
    finally:
        prom.close()


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
