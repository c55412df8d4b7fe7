"""Cost labels: who pays for an engine, from node.yaml or the engine pod's labels, exported as one
``infercost_engine_cost_info`` series per engine (sanitised, capped, expired with the engine)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.config import (
    MAX_COST_LABELS,
    MAX_LABEL_VALUE_CHARS,
    Config,
    ConfigError,
    EngineConfig,
    KubernetesConfig,
    cost_label_name,
    parse_config,
)
from agent.cost.window import TickResult
from agent.sinks.prometheus import render, render_with_client
from agent.snapshot import Ledger
from agent.sources.kube.pods import engine_pod
from agent.sources.kube.source import KubeEngines
from tests.kubeapi import FakeKubeApi, pod, write_kubeconfig

INFO = "infercost_engine_cost_info"
SCRAPE = {"infercost.io/scrape": "true"}


def _info(text: str) -> dict[str, dict[str, str]]:
    """engine → labels of its info series, parsed from the exposition by prometheus_client."""
    out: dict[str, dict[str, str]] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name == INFO:
            for s in fam.samples:
                assert s.value == 1.0
                out[s.labels["engine"]] = dict(s.labels)
    return out


@pytest.mark.parametrize(
    ("key", "name"),
    [
        ("team", "label_team"),
        ("app.kubernetes.io/part-of", "label_app_kubernetes_io_part_of"),
        ("llm-d.ai/role", "label_llm_d_ai_role"),
    ],
)
def test_cost_label_names_are_spelled_as_kube_state_metrics_spells_pod_labels(key: str, name: str) -> None:
    assert cost_label_name(key) == name


def test_static_labels_are_sanitised_capped_and_bounded_in_count() -> None:
    cfg = parse_config(
        {
            "engines": [
                {
                    "name": "a",
                    "url": "http://127.0.0.1:8000/metrics",
                    # a right-to-left override and a zero-width space: reads as another team
                    "labels": {"team": " se\u202earch\u200b ", "cost-centre": "x" * 500},
                    "role": "decode",
                }
            ]
        },
        "node.yaml",
    )
    (e,) = cfg.engines
    assert e.labels == {"team": "search", "cost-centre": "x" * MAX_LABEL_VALUE_CHARS}
    assert e.role == "decode"
    assert cfg.cost_label_keys() == ("cost-centre", "team")
    many = {f"k{i}": "v" for i in range(MAX_COST_LABELS + 1)}
    with pytest.raises(ConfigError, match=r"node.yaml: key 'engines.0.labels'.*at most 16"):
        parse_config({"engines": [{"name": "a", "url": "http://x/metrics", "labels": many}]}, "node.yaml")
    with pytest.raises(ConfigError, match=r"engines.0.labels.*text value"):
        parse_config({"engines": [{"name": "a", "url": "http://x/m", "labels": {"t": [1]}}]}, "node.yaml")
    with pytest.raises(ConfigError, match=r"engines.0.role"):
        parse_config({"engines": [{"name": "a", "url": "http://x/m", "role": "both-ish"}]}, "node.yaml")
    # two spellings that export as one name cannot both be cost labels
    with pytest.raises(ConfigError, match=r"label_a_b"):
        parse_config(
            {"engines": [{"name": "a", "url": "http://x/m", "labels": {"a.b": "1", "a-b": "2"}}]}, "n.yaml"
        )


def test_pod_labels_give_namespace_cost_labels_role_and_multi_node_group() -> None:
    k = KubernetesConfig(
        enabled=True, pod_resources_socket=None, cost_labels=("team", "app.kubernetes.io/part-of")
    )
    leader = pod(
        "big-0",
        namespace="search",
        annotations=SCRAPE,
        labels={
            "team": "search\u2066-infra",
            "app.kubernetes.io/part-of": "p" * 300,  # whoever deploys it writes this
            "llm-d.ai/role": "Prefill",
            "leaderworkerset.sigs.k8s.io/group-key": "g1",
            "leaderworkerset.sigs.k8s.io/worker-index": "0",
            "unrelated": "not exported",
        },
    )
    worker = pod(
        "big-0-1",
        namespace="search",
        annotations=SCRAPE,
        labels={
            "leaderworkerset.sigs.k8s.io/group-key": "g1",
            "leaderworkerset.sigs.k8s.io/worker-index": "1",
        },
    )
    plain = pod("chat-0", namespace="chat", annotations=SCRAPE, labels={"llm-d.ai/role": "sideways"})
    a, b, c = (engine_pod(p, k) for p in (leader, worker, plain))
    assert a is not None and b is not None and c is not None
    assert (a.namespace, a.cost_labels, a.role, a.group, a.group_leader) == (
        "search",
        (("team", "search-infra"), ("app.kubernetes.io/part-of", "p" * MAX_LABEL_VALUE_CHARS)),
        "prefill",
        "g1",
        True,
    )
    assert (b.group, b.group_leader, b.role) == ("g1", False, None)
    assert (c.group, c.group_leader, c.role) == ("", True, None)  # an unknown role reads as none


async def _until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    async def poll() -> None:
        while not cond():
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), timeout)


async def test_discovered_engines_in_two_namespaces_export_one_info_series_each_that_expires_with_them(
    tmp_path: Path,
) -> None:
    api = FakeKubeApi()
    api.put(
        pod("search-0", namespace="search", ip="10.244.1.10", annotations=SCRAPE, labels={"team": "search"})
    )
    api.put(
        pod(
            "chat-0",
            namespace="chat",
            ip="10.244.1.11",
            annotations=SCRAPE,
            labels={"team": "chat", "llm-d.ai/role": "decode"},
        )
    )
    await api.start()
    k = KubernetesConfig(
        enabled=True,
        kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", api.url),
        pod_resources_socket=None,
        cost_labels=("team",),
    )
    static = EngineConfig(name="static", url="http://127.0.0.1:9/metrics", labels={"cost-centre": "cc-7"})
    cfg = Config(node="gpu-node-1", kubernetes=k, engines=(static,))
    src = KubeEngines(cfg)
    stop = asyncio.Event()
    task = asyncio.create_task(src.run(stop))
    try:
        await _until(lambda: {"search-0", "chat-0"} <= {e.name for e in src.engines()})
        ledger = Ledger("gpu-node-1", "test", expire_after_seconds=3600)
        ledger.observe_engines(src.engines(), cfg.cost_label_keys())
        from agent.samples import EngineScrape

        for e in src.engines():
            ledger.observe_scrape(EngineScrape(e.name, "vllm", 1000.0, True, 0.01))
        text = render(ledger.snapshot(), process=False).decode()
        assert render_with_client(ledger.snapshot()).decode() == text  # one writer, same bytes
        assert _info(text) == {
            "chat-0": {
                "node": "gpu-node-1",
                "engine": "chat-0",
                "engine_namespace": "chat",
                "engine_pod": "chat-0",
                "engine_role": "decode",
                "engine_group": "",
                "engine_group_leader": "true",
                "label_team": "chat",
                "label_cost_centre": "",
            },
            "search-0": {
                "node": "gpu-node-1",
                "engine": "search-0",
                "engine_namespace": "search",
                "engine_pod": "search-0",
                "engine_role": "both",
                "engine_group": "",
                "engine_group_leader": "true",
                "label_team": "search",
                "label_cost_centre": "",
            },
            "static": {
                "node": "gpu-node-1",
                "engine": "static",
                "engine_namespace": "",
                "engine_pod": "",
                "engine_role": "both",
                "engine_group": "",
                "engine_group_leader": "true",
                "label_team": "",
                "label_cost_centre": "cc-7",
            },
        }
        # the chat pod leaves: its identity stays while its series do, then expires with them
        api.emit("DELETED", pod("chat-0", namespace="chat", ip="10.244.1.11", annotations=SCRAPE))
        await _until(lambda: "chat-0" not in {e.name for e in src.engines()})
        ledger.observe_engines(src.engines(), cfg.cost_label_keys())
        for e in src.engines():
            ledger.observe_scrape(EngineScrape(e.name, "vllm", 4000.0, True, 0.01))
        assert "chat-0" in _info(render(ledger.snapshot(), process=False).decode())
        ledger.apply(TickResult(start=4600.0, end=4700.0, windows=(), gpus=()))
        assert set(_info(render(ledger.snapshot(), process=False).decode())) == {"search-0", "static"}
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await api.stop()
