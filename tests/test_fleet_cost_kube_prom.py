"""The FinOps rules over engines found through the Kubernetes API: the real agent discovers pods in
two namespaces and two teams (a local API server; GPUs from a kubelet pod-resources server on a unix
socket), scrapes simulated vLLM engines, and a real Prometheus evaluates the shipped rules.

The pods: in namespace chat (team chat) a prefill and a decode pod of one model version (llm-d's
role label); in namespace search (team search) a LeaderWorkerSet group, its leader serving a model
and its worker holding a GPU with no /metrics; a notebook pod holding a GPU (no engine), and a GPU
held by nobody. Each group's dollars must be its pods' as the agent exported them and the GPUs no
engine holds the "__idle__" group.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from kubeapi import FakeKubeApi, pod, write_kubeconfig
from netutil import async_wait_until, free_port
from promstack import scraped_by_prometheus
from test_fleet_cost_sim_prom import at_some_evaluation
from test_podresources import Kubelet

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "rules" / "prometheus" / "infercost.rules.yml"
LWS = "leaderworkerset.sigs.k8s.io/"


def engine_pod(name: str, namespace: str, port: int, labels: dict[str, str]) -> dict[str, object]:
    return pod(
        name,
        namespace=namespace,
        ip="127.0.0.1",
        ports=(("metrics", port),),
        labels={"app.kubernetes.io/version": "v1", **labels},
        annotations={"infercost.io/scrape": "true", "infercost.io/engine": "vllm", "infercost.io/name": name},
    )


@pytest.mark.slow
async def test_groups_pools_and_workers_from_discovered_pods(tmp_path: Path) -> None:
    from agent.app import build_agent
    from agent.clock import AcceleratedClock
    from agent.config import (
        Config,
        ExportersConfig,
        IntervalsConfig,
        KubernetesConfig,
        NvmlConfig,
        PrometheusExporterConfig,
    )
    from agent.sources.nvml.backend import NvmlBackend
    from agent.sources.nvml.fake import FakeNvml
    from agent.sources.prices import parse_price_book
    from infercost_sim.engine import LLAMA_70B, MISTRAL_7B
    from infercost_sim.node import EngineSpec, SimNode

    clock = AcceleratedClock(60.0)
    specs = (
        EngineSpec("sim-prefill", LLAMA_70B, (0, 1), "ignored", peak_load=0.5),
        EngineSpec("sim-decode", LLAMA_70B, (2, 3), "ignored", peak_load=0.7),
        EngineSpec("sim-leader", MISTRAL_7B, (4,), "ignored", peak_load=0.6),
    )
    sim = SimNode(clock, tmp_path / "versions", engines=specs, target_page_bytes=None)
    await sim.start()
    ports = {e.name: int(urlsplit(e.url).port or 0) for e in sim.engine_configs()}
    fake = FakeNvml("H100-SXM", 8, sim.gpu_load, clock=clock.now)
    uuid = [fake.uuid_of(i) for i in range(8)]
    api = FakeKubeApi()
    chat = {"team": "chat"}
    search = {"team": "search", f"{LWS}group-key": "3f1c9a"}
    api.put(engine_pod("chat-prefill-0", "chat", ports["sim-prefill"], {**chat, "llm-d.ai/role": "prefill"}))
    api.put(engine_pod("chat-decode-0", "chat", ports["sim-decode"], {**chat, "llm-d.ai/role": "decode"}))
    api.put(engine_pod("lws-0", "search", ports["sim-leader"], {**search, f"{LWS}worker-index": "0"}))
    # the worker declares a port nothing listens on: it serves no /metrics, as a worker does not
    api.put(engine_pod("lws-0-1", "search", free_port(), {**search, f"{LWS}worker-index": "1"}))
    api.put(pod("notebook-0", namespace="research", ip="10.244.1.50"))  # holds a GPU, not an engine
    await api.start()
    held = {"chat-prefill-0": uuid[0:2], "chat-decode-0": uuid[2:4], "lws-0": [uuid[4]], "lws-0-1": [uuid[5]]}
    kubelet_pods = [
        {"name": name, "namespace": ns, "containers": [("vllm", [("nvidia.com/gpu", held[name])])]}
        for name, ns in (
            ("chat-prefill-0", "chat"),
            ("chat-decode-0", "chat"),
            ("lws-0", "search"),
            ("lws-0-1", "search"),
        )
    ]
    kubelet_pods.append(
        {
            "name": "notebook-0",
            "namespace": "research",
            "containers": [("jupyter", [("nvidia.com/gpu", [uuid[6]])])],
        }
    )  # GPU 7: held by nobody
    with tempfile.TemporaryDirectory(prefix="k") as d:
        sock = Path(d) / "kubelet.sock"
        with Kubelet(sock, kubelet_pods):
            cfg = Config(
                node="gpu-node-1",
                state_dir=tmp_path / "state",
                intervals=IntervalsConfig(nvml_seconds=5, scrape_seconds=10, window_seconds=60),
                nvml=NvmlConfig(backend="fake", fake_count=8),
                exporters=ExportersConfig(prometheus=PrometheusExporterConfig(port=0)),
                kubernetes=KubernetesConfig(
                    enabled=True,
                    allow_loopback=True,  # the simulated engines serve on 127.0.0.1
                    kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", api.url),
                    pod_resources_socket=sock,
                    pod_resources_seconds=0.2,
                    cost_labels=("team",),
                ),
            )
            book = parse_price_book({"gpus": [{"match": "H100", "usd_per_hour": 2.0}]}, "test-book")
            agent = await build_agent(
                cfg, clock=clock, book=book, backend=NvmlBackend(fake), detection=False, scorer=False
            )
            try:
                async with scraped_by_prometheus(agent, tmp_path, RULES) as p:

                    async def ready() -> bool:
                        got = await asyncio.to_thread(
                            p.query, "engine_group_model_version:infercost_worker_cost_usd:rate1h"
                        )
                        both = await asyncio.to_thread(
                            p.query, "model_version_role:infercost_cost_share:ratio_rate1h"
                        )
                        return bool(got) and {b["metric"]["engine_role"] for b in both} >= {
                            "prefill",
                            "decode",
                        }

                    await async_wait_until(ready, 120, what="the pools and the worker's dollars recorded")
                    await asyncio.sleep(3)

                    def check(at: float) -> None:
                        def one(expr: str) -> float:
                            [s] = p.query(expr, at)
                            return float(s["value"][1])

                        def by(expr: str, label: str) -> dict[str, float]:
                            return {
                                s["metric"].get(label, ""): float(s["value"][1]) for s in p.query(expr, at)
                            }

                        def rate(name: str, sel: str) -> float:
                            return one(f"sum(rate({name}{{{sel}}}[1h]))")

                        chat_usd = rate("infercost_cost_usd_total", 'engine=~"chat-.*"')
                        leader = rate("infercost_cost_usd_total", 'engine="lws-0"')
                        worker = rate("infercost_engine_gpu_cost_usd_total", 'engine="lws-0-1"')
                        unheld = rate("infercost_gpu_cost_usd_total", 'gpu=~"6|7"')
                        assert min(chat_usd, leader, worker, unheld) > 0
                        ns = by("engine_namespace:infercost_cost_usd:rate1h", "engine_namespace")
                        team = by("team:infercost_cost_usd:rate1h", "label_team")
                        want = {"chat": chat_usd, "search": leader + worker, "__idle__": unheld}
                        assert ns == pytest.approx(want, rel=1e-9) and team == pytest.approx(want, rel=1e-9)
                        # (that the groups add up to the GPUs' dollars is the promtool test's: here the
                        # GPUs' counters start before the engines are discovered and their models'
                        # counters one window later, and rate() over [1h] extrapolates each from its own
                        # first sample until the hour has passed)
                        shared = by("team:infercost_cost_usd_idle_shared:rate1h", "label_team")
                        k = 1 + unheld / (chat_usd + leader + worker)
                        assert shared == pytest.approx(
                            {"chat": chat_usd * k, "search": (leader + worker) * k}, rel=1e-9
                        )

                        # the disaggregated version: both pools' dollars over the decode pod's tokens; the
                        # multi-node one: the leader's and its worker's
                        def model_of(engine: str) -> str:
                            [s] = p.query(f'infercost_cost_usd_total{{engine="{engine}"}}', at)
                            return str(s["metric"]["model"])

                        llama, mistral = model_of("chat-decode-0"), model_of("lws-0")
                        assert model_of("chat-prefill-0") == llama != mistral
                        decode_out = rate("infercost_generation_tokens_total", 'engine="chat-decode-0"')
                        per_1m = by(
                            "model_version:infercost_pooled_usd_per_1m_output_tokens:ratio_rate1h", "model"
                        )
                        assert per_1m[llama] == pytest.approx(chat_usd / decode_out * 1e6, rel=1e-9)
                        cost = by("model_version:infercost_pooled_cost_usd:rate1h", "model")
                        assert cost == pytest.approx({llama: chat_usd, mistral: leader + worker}, rel=1e-9)

                    record = 'engine_namespace:infercost_cost_usd:rate1h{engine_namespace="chat"}'
                    await asyncio.to_thread(at_some_evaluation, p, record, check)
            finally:
                await sim.stop()
                await api.stop()
