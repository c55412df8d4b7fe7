"""End to end on loopback: the daemon finds its engines through the Kubernetes API (lightkube against a
local API server), learns which GPUs each engine pod holds from a kubelet pod-resources gRPC server
on a unix socket, scrapes simulated vLLM engines and prices them; the model version comes from the
pod's label; a new engine image with the same weights is recorded as an engine upgrade, and an alert
after it names the upgrade (and a return to the old image a rollback)."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from agent.app import build_agent
from agent.clock import AcceleratedClock, ManualClock
from agent.config import (
    Config,
    ExportersConfig,
    IntervalsConfig,
    KubernetesConfig,
    NvmlConfig,
    PrometheusExporterConfig,
    parse_config,
)
from agent.detect.deploys import DeployTracker, record_deploy
from agent.detect.evaluator import Finding
from agent.detect.pipeline import build_pipeline
from agent.detect.rules import load_rules
from agent.samples import CostWindow, UsageWindow
from agent.sources.nvml.backend import NvmlBackend
from agent.sources.nvml.fake import FakeNvml
from agent.sources.prices import parse_price_book
from agent.store import Store
from infercost_sim.engine import LLAMA_70B, MISTRAL_7B
from infercost_sim.node import EngineSpec, SimNode
from tests.kubeapi import FakeKubeApi, pod, write_kubeconfig
from tests.test_daemon import _scrape
from tests.test_podresources import Kubelet

PRICE = 2.0  # $ per GPU-hour in this test's book
SPEED = 60.0  # simulated seconds per real second
OLD_IMAGE, NEW_IMAGE = "docker.io/vllm/vllm-openai:v0.8.4", "docker.io/vllm/vllm-openai:v0.9.0"
OLD_DIGEST, NEW_DIGEST = "sha256:" + "a" * 64, "sha256:" + "b" * 64


async def _until(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    async def poll() -> None:
        while not cond():
            await asyncio.sleep(0.1)

    await asyncio.wait_for(poll(), timeout)


def _llama_pod(port: int, image: str, digest: str) -> dict[str, object]:
    return pod(
        "llama-70b-7d9f8c6b5-x2x9q",
        ip="127.0.0.1",
        ports=(("http", port),),
        labels={"app.kubernetes.io/version": "2024-07", "pod-template-hash": "7d9f8c6b5"},
        annotations={"infercost.io/scrape": "true", "infercost.io/engine": "vllm"},
        owner=("ReplicaSet", "llama-70b-7d9f8c6b5"),
        image=image,
        digest=digest,
    )


async def test_discovered_engines_are_priced_by_their_kubelet_gpus_and_an_image_change_is_an_engine_upgrade(
    tmp_path: Path,
) -> None:
    clock = AcceleratedClock(SPEED)
    specs = (
        EngineSpec("sim-llama", LLAMA_70B, (0, 1, 2, 3), "ignored", peak_load=0.7),
        EngineSpec("sim-mistral", MISTRAL_7B, (6,), "ignored", peak_load=0.6),
    )
    sim = SimNode(clock, tmp_path / "versions", engines=specs, target_page_bytes=None)
    await sim.start()
    ports = {e.name: int(urlsplit(e.url).port or 0) for e in sim.engine_configs()}
    fake = FakeNvml("H100-SXM", 8, sim.gpu_load, clock=clock.now)
    uuid = [fake.uuid_of(i) for i in range(8)]

    api = FakeKubeApi()
    api.put(_llama_pod(ports["sim-llama"], OLD_IMAGE, OLD_DIGEST))
    api.put(
        pod(
            "mistral-7b-0",
            ip="127.0.0.1",
            ports=(("metrics", ports["sim-mistral"]),),
            labels={"app.kubernetes.io/version": "v0.3"},
            annotations={"infercost.io/scrape": "true"},
            owner=("StatefulSet", "mistral-7b"),
        )
    )
    api.put(pod("notebook-0", namespace="research", ip="10.244.1.50"))  # holds GPUs, not an engine
    await api.start()
    kubelet_pods = [
        {
            "name": "llama-70b-7d9f8c6b5-x2x9q",
            "namespace": "llm",
            "containers": [("vllm", [("nvidia.com/gpu", uuid[0:4])])],
        },
        {
            "name": "mistral-7b-0",
            "namespace": "llm",
            "containers": [("vllm", [("nvidia.com/gpu", [uuid[6]])])],
        },
        {
            "name": "notebook-0",
            "namespace": "research",
            "containers": [("jupyter", [("nvidia.com/gpu", uuid[4:6])])],
        },
    ]  # GPU 7: held by nobody
    with tempfile.TemporaryDirectory(prefix="k") as d:
        sock = Path(d) / "kubelet.sock"
        with Kubelet(sock, kubelet_pods):
            cfg = Config(
                node="gpu-node-1",
                state_dir=tmp_path,
                intervals=IntervalsConfig(nvml_seconds=5, scrape_seconds=10, window_seconds=60),
                nvml=NvmlConfig(backend="fake", fake_count=8),
                exporters=ExportersConfig(prometheus=PrometheusExporterConfig(port=0)),
                kubernetes=KubernetesConfig(
                    enabled=True,
                    allow_loopback=True,  # the simulated engines serve on 127.0.0.1
                    kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", api.url),
                    pod_resources_socket=sock,
                    pod_resources_seconds=0.2,
                ),
            )
            book = parse_price_book({"gpus": [{"match": "H100", "usd_per_hour": PRICE}]}, "test-book")
            # the daemon as `infercost run` builds it (history on; detection tested below on its own)
            agent = await build_agent(
                cfg, clock=clock, book=book, backend=NvmlBackend(fake), detection=False, scorer=False
            )
            store = agent.hooks.store
            assert store is not None
            stop = asyncio.Event()
            task = asyncio.create_task(agent.run(stop))
            try:
                await agent.started.wait()
                assert agent.prometheus is not None
                port = agent.prometheus.port
                m: dict[str, dict[frozenset[tuple[str, str]], float]] = {}

                async def priced() -> bool:
                    nonlocal m
                    m = await _scrape(port)
                    return len(m.get("infercost_usd_per_1m_output_tokens", {})) == 2

                for _ in range(300):
                    if await priced():
                        break
                    await asyncio.sleep(0.1)
                assert len(m["infercost_usd_per_1m_output_tokens"]) == 2
                # names from the workloads, versions from the pods' labels, GPUs from the kubelet:
                # llama holds 4 GPUs at $2/h = $8/h, mistral (a StatefulSet pod keeps its name) 1 GPU = $2/h
                n_gpus = {("llama-70b", "2024-07"): 4, ("mistral-7b-0", "v0.3"): 1}
                series = {
                    (dict(k)["engine"], dict(k)["model_version"]): k for k in m["infercost_cost_usd_total"]
                }
                assert set(series) == set(n_gpus)
                gs = {e: m["infercost_gpu_seconds_total"][k] for e, k in series.items()}
                assert gs[("llama-70b", "2024-07")] == pytest.approx(4 * gs[("mistral-7b-0", "v0.3")])
                for e, k in series.items():
                    assert m["infercost_cost_usd_total"][k] == pytest.approx(gs[e] * PRICE / 3600, rel=1e-9)
                for k, usd_per_m in m["infercost_usd_per_1m_output_tokens"].items():
                    rate = m["infercost_generation_tokens_per_second"][k]
                    per_hour = n_gpus[(dict(k)["engine"], dict(k)["model_version"])] * PRICE
                    assert rate > 0 and usd_per_m == pytest.approx(per_hour / 3600 / rate * 1e6, rel=1e-6)
                # the notebook's GPUs (4, 5) and the unheld GPU 7 made no tokens: all idle cost
                idle = {dict(k)["gpu"]: v for k, v in m["infercost_gpu_idle_cost_usd_total"].items()}
                cost = {dict(k)["gpu"]: v for k, v in m["infercost_gpu_cost_usd_total"].items()}
                for g in ("4", "5", "7"):
                    assert cost[g] > 0 and idle[g] == pytest.approx(cost[g])
                assert agent.hooks.engine_source is not None
                holders = {(h.gpu, h.namespace, h.pod) for h in agent.hooks.engine_source.gpu_holders()}
                assert holders == {(uuid[4], "research", "notebook-0"), (uuid[5], "research", "notebook-0")}
                # ... and named on /metrics, so the notebook's GPUs are its cost, not anonymous idle
                pod_info = {tuple(sorted(k)) for k in m["infercost_gpu_pod_info"]}
                assert pod_info == {
                    tuple(
                        sorted(
                            {
                                "node": "gpu-node-1",
                                "gpu": g,
                                "namespace": "research",
                                "pod": "notebook-0",
                            }.items()
                        )
                    )
                    for g in ("4", "5")
                }

                # a new vLLM image, same weights (same version label): an engine upgrade, no new model version
                assert store.deploys() == []
                api.emit("MODIFIED", _llama_pod(ports["sim-llama"], NEW_IMAGE, NEW_DIGEST))
                await _until(lambda: len(store.deploys()) == 1)
                (d,) = store.deploys()
                assert (d.kind, d.engine, d.model) == ("engine", "llama-70b", "")
                assert (d.from_version, d.to_version) == (
                    f"{OLD_IMAGE}@{OLD_DIGEST}",
                    f"{NEW_IMAGE}@{NEW_DIGEST}",
                )
                m = await _scrape(port)
                versions = {dict(k)["model_version"] for k in m["infercost_cost_usd_total"]}
                assert versions == {"2024-07", "v0.3"}
            finally:
                stop.set()
                await asyncio.wait_for(task, 10)  # closes the store
                await api.stop()
                await sim.stop()


RULE = {
    "id": "regression",
    "signal": "usd_per_1m_output_tokens",
    "over": "5m",
    "op": ">",
    "factor": 1.5,
    "baseline": {"window": "1d", "like_load": {"band_ratio": 2.0, "min_tokens_per_second": 1}},
    "for": "15m",
    "severity": "warning",
    "summary": "{model} {model_version}: ${value}/1M ({change_pct})",
    "description": "Deploy: {deploy}",
}
T0 = 1699833600.0


def _window(t: float, usd: float) -> CostWindow:
    u = UsageWindow("n1", "llama-70b", "llama", "2024-07", t, t + 60, 3000, 6000, 60, None)
    return CostWindow(u, usd, 0.0, usd / 6000 * 1e6, usd / 9000 * 1e6, 0.0)


async def test_an_alert_after_an_engine_image_change_names_the_engine_upgrade_then_a_rollback(
    tmp_path: Path,
) -> None:
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump({"rules": [RULE]}))
    cfg = parse_config({"node": "n1", "state_dir": str(tmp_path)}, "test", environ={})
    clock = ManualClock(T0)
    store = Store(tmp_path / "history.sqlite", 35, clock, deploys=record_deploy)
    old, new = f"{OLD_IMAGE}@{OLD_DIGEST}", f"{NEW_IMAGE}@{NEW_DIGEST}"
    assert store.note_engine_version("n1", "llama-70b", old, T0) is None  # first sight: no deploy
    store.write_windows([_window(T0 + i * 60, 0.03) for i in range(1440)])  # a day at $5/1M
    upgrade_at = T0 + 1440 * 60
    clock.advance(1440 * 60)
    rules = load_rules([p])
    pipeline = build_pipeline(cfg, store, clock, rules=rules)
    assert pipeline.step(upgrade_at) == []
    ev = store.note_engine_version("n1", "llama-70b", new, upgrade_at + 5)
    assert ev is not None and ev.kind == "engine" and ev.at == upgrade_at
    fired = None
    for i in range(25):  # the new build costs twice as much per token, same model version
        t = upgrade_at + i * 60
        store.write_windows([_window(t, 0.06)])
        clock.advance(60)
        for e in pipeline.step(t + 60):
            if e.kind == "firing":
                fired = e
    assert fired is not None
    a = fired.alert
    assert a.deploy is not None and a.deploy.kind == "engine" and not a.deploy.rollback
    assert a.deploy.previous_value == pytest.approx(5.0) and a.deploy.new_value == pytest.approx(10.0)
    text = a.annotations["description"]
    assert text.startswith(
        "Deploy: engine upgrade of llama-70b: vllm/vllm-openai:v0.8.4 (aaaaaaaaaaaa) → "
        "vllm/vllm-openai:v0.9.0 (bbbbbbbbbbbb) at "
    )
    assert "same model version 2024-07" in text and "+100.0 %" in text
    # back to the old image: a rollback
    back = store.note_engine_version("n1", "llama-70b", old, upgrade_at + 30 * 60)
    assert back is not None and back.to_version == old
    tracker = DeployTracker()
    tracker.seed(store.deploys())
    labels = (("node", "n1"), ("engine", "llama-70b"), ("model", "llama"), ("model_version", "2024-07"))
    finding = Finding("regression", labels, upgrade_at + 31 * 60, 10.0, 7.5, 5.0)
    info = tracker.lookup(rules.rules[0], finding)
    assert info is not None and info.rollback
    assert info.describe().startswith(
        "engine rollback of llama-70b: vllm/vllm-openai:v0.9.0 (bbbbbbbbbbbb) → "
    )
    store.close()
