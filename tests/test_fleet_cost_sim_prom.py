"""The FinOps rules with the real Prometheus over the real agent and simulated vLLM engines: a
model served by a prefill pod and two decode pods (namespace and team chat), a model on a leader
whose worker pod holds a GPU and serves nothing (namespace and team search; the worker's /metrics
does not answer, as a LeaderWorkerSet worker's does not), all on one simulated 8-GPU node.

Each recorded figure is held against the same figure computed straight from the agent's exported
counters at the same instant.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from netutil import async_wait_until, free_port
from promstack import Prometheus, scraped_by_prometheus

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "rules" / "prometheus" / "infercost.rules.yml"


# A scrape's samples carry the time it began and are committed when the page has been read, so a
# rule evaluation while a scrape is in flight misses samples a later query at the same instant sees.
# Why 10 evaluations: a scrape of the agent is in flight for a small share of each second; ten in
# a row all caught by one would be a fault, not the race.
TRIES = 10


def at_some_evaluation(prom: Prometheus, record: str, check: Callable[[float], None]) -> None:
    """``check`` at the latest evaluation time of ``record``, else at each one before it (up to
    :data:`TRIES`): it must hold at one with no scrape in flight."""
    err: AssertionError | None = None
    at = None
    for _ in range(TRIES):
        found = prom.query(f"timestamp({record})", None if at is None else at - 0.001)
        if not found:
            break
        at = float(found[0]["value"][1])
        try:
            check(at)
            return
        except AssertionError as e:
            err = e
    assert err is not None, f"{record} was never recorded"
    raise err


def one(prom: Prometheus, expr: str, at: float) -> float:
    [s] = prom.query(expr, at)
    return float(s["value"][1])


def by(prom: Prometheus, expr: str, at: float, label: str) -> dict[str, float]:
    return {s["metric"].get(label, ""): float(s["value"][1]) for s in prom.query(expr, at)}


@pytest.mark.slow
async def test_pools_groups_and_workers_over_a_real_agent(tmp_path: Path) -> None:
    from agent.app import build_agent
    from agent.clock import AcceleratedClock
    from agent.config import Config, ExportersConfig, IntervalsConfig, NvmlConfig, PrometheusExporterConfig
    from agent.sources.prices import parse_price_book
    from infercost_sim.engine import LLAMA_70B, MISTRAL_7B
    from infercost_sim.node import EngineSpec, SimNode

    clock = AcceleratedClock(60.0)
    specs = (
        EngineSpec("prefill-0", LLAMA_70B, (0, 1), "v1", peak_load=0.5),
        EngineSpec("decode-0", LLAMA_70B, (2, 3), "v1", peak_load=0.6),
        EngineSpec("decode-1", LLAMA_70B, (4, 5), "v1", peak_load=0.7),
        EngineSpec("lws-0", MISTRAL_7B, (6,), "v2", peak_load=0.6),
    )
    sim = SimNode(clock, tmp_path / "podinfo", engines=specs, target_page_bytes=None)
    await sim.start()
    chat = {"namespace": "chat", "labels": {"team": "chat"}}
    search = {"namespace": "search", "labels": {"team": "search"}, "group": "g-1"}
    roles = {"prefill-0": "prefill", "decode-0": "decode", "decode-1": "decode", "lws-0": "both"}
    engines = [
        e.model_copy(update={"role": roles[e.name], **(search if e.name == "lws-0" else chat)})
        for e in sim.engine_configs()
    ]
    worker = engines[-1].model_copy(
        update={
            "name": "lws-0-1",
            "url": f"http://127.0.0.1:{free_port()}/metrics",  # nothing listens: a worker has no /metrics
            "gpus": (7,),
            "group_leader": False,
            "version_file": None,
        }
    )
    cfg = Config(
        node="n1",
        engines=(*engines, worker),  # in the config: its engines' labels: are the node's cost label keys
        state_dir=tmp_path / "state",
        intervals=IntervalsConfig(nvml_seconds=5, scrape_seconds=10, window_seconds=60),
        nvml=NvmlConfig(backend="fake", fake_count=8),
        exporters=ExportersConfig(prometheus=PrometheusExporterConfig(port=0)),
    )
    book = parse_price_book({"gpus": [{"match": "H100", "usd_per_hour": 2.0}]}, "test-book")
    agent = await build_agent(cfg, clock=clock, book=book, load=sim.gpu_load)
    try:
        async with scraped_by_prometheus(agent, tmp_path, RULES) as p:

            async def ready() -> bool:
                got = await asyncio.to_thread(
                    p.query, "engine_group_model_version:infercost_worker_cost_usd:rate1h"
                )
                return bool(got)

            await async_wait_until(ready, 90, what="the worker's dollars recorded")
            await asyncio.sleep(3)  # a few more scrapes

            def check(at: float) -> None:
                r = "[1h]"
                # the disaggregated model: every pool's dollars over the decode pods' output tokens
                pooled = one(
                    p,
                    'model_version:infercost_pooled_usd_per_1m_output_tokens:ratio_rate1h{model_version="v1"}',
                    at,
                )
                cost = one(p, f'sum(rate(infercost_cost_usd_total{{engine=~"prefill-0|decode-.*"}}{r}))', at)
                out = one(p, f'sum(rate(infercost_generation_tokens_total{{engine=~"decode-.*"}}{r}))', at)
                assert pooled == pytest.approx(cost / out * 1e6, rel=1e-9)
                prefill_out = one(
                    p, f'sum(rate(infercost_generation_tokens_total{{engine="prefill-0"}}{r}))', at
                )
                assert prefill_out > 0  # counted by the prefill pod, and left out of the figure
                share = by(
                    p,
                    'model_version_role:infercost_cost_share:ratio_rate1h{model_version="v1"}',
                    at,
                    "engine_role",
                )
                prefill_cost = one(p, f'sum(rate(infercost_cost_usd_total{{engine="prefill-0"}}{r}))', at)
                assert share["prefill"] == pytest.approx(prefill_cost / cost, rel=1e-9)
                assert share["prefill"] + share["decode"] == pytest.approx(1.0, rel=1e-12)
                # the multi-node engine: the worker's GPU dollars on the leader's version
                pooled2 = one(p, 'model_version:infercost_pooled_cost_usd:rate1h{model_version="v2"}', at)
                leader = one(p, f'sum(rate(infercost_cost_usd_total{{engine="lws-0"}}{r}))', at)
                worker_usd = one(
                    p, f'sum(rate(infercost_engine_gpu_cost_usd_total{{engine="lws-0-1"}}{r}))', at
                )
                assert worker_usd > 0 and pooled2 == pytest.approx(leader + worker_usd, rel=1e-9)
                # groups: namespaces and teams hold their pods' dollars; all GPUs are held by engines
                ns = by(p, "engine_namespace:infercost_cost_usd:rate1h", at, "engine_namespace")
                team = by(p, "team:infercost_cost_usd:rate1h", at, "label_team")
                assert ns.keys() == team.keys() == {"chat", "search", "__idle__"}
                assert ns["chat"] == pytest.approx(cost, rel=1e-9) and team["chat"] == pytest.approx(
                    cost, rel=1e-9
                )
                assert ns["search"] == pytest.approx(leader + worker_usd, rel=1e-9)
                assert ns["__idle__"] == pytest.approx(0.0, abs=1e-12)
                # (the groups add up to the GPUs' dollars in the promtool test; here a model's counters
                # start a window after its GPUs', and rate() over [1h] extrapolates each from its own
                # first sample)
                per_1m = by(
                    p,
                    "engine_namespace:infercost_usd_per_1m_output_tokens:ratio_rate1h",
                    at,
                    "engine_namespace",
                )
                search_out = one(p, f'sum(rate(infercost_generation_tokens_total{{engine="lws-0"}}{r}))', at)
                assert per_1m["chat"] == pytest.approx(cost / out * 1e6, rel=1e-9)
                assert per_1m["search"] == pytest.approx((leader + worker_usd) / search_out * 1e6, rel=1e-9)

            record = 'model_version:infercost_pooled_cost_usd:rate1h{model_version="v1"}'
            await asyncio.to_thread(at_some_evaluation, p, record, check)
    finally:
        await sim.stop()
