"""Engine discovery from the Kubernetes API: pod annotations, SSRF limits, versions, and the
list → watch → 410 → relist loop through the real lightkube client against a local API server."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
import yaml
from aiohttp import web

from agent.cli import main
from agent.clock import SystemClock
from agent.config import Config, ConfigError, EngineConfig, KubernetesConfig, parse_config
from agent.sources.engines.scraper import EngineScraper
from agent.sources.kube.pods import EnginePod, PodRefused, engine_names, engine_pod, image_tag, is_selected
from agent.sources.kube.source import KubeEngines
from agent.sources.kube.watch import make_client
from tests.kubeapi import FakeKubeApi, gone_event, pod, write_kubeconfig

K = KubernetesConfig(enabled=True, pod_resources_socket=None)
SCRAPE = {"infercost.io/scrape": "true"}


def _ann(**kw: str) -> dict[str, str]:
    return {**SCRAPE, **{f"infercost.io/{k}": v for k, v in kw.items()}}


# ------------------------------------------------------------------------------------ pure: one pod
def test_an_annotated_deployment_pod_becomes_an_engine_at_its_own_ip() -> None:
    p = pod(
        "llama-70b-7d9f8c6b5-x2x9q",
        labels={"app.kubernetes.io/version": "2024-09", "pod-template-hash": "7d9f8c6b5"},
        annotations=_ann(port="8000", engine="vllm"),
        owner=("ReplicaSet", "llama-70b-7d9f8c6b5"),
    )
    ep = engine_pod(p, K)
    assert ep is not None
    assert (ep.workload, ep.kind, ep.url, ep.container) == (
        "llama-70b",
        "vllm",
        "http://10.244.1.17:8000/metrics",
        "vllm",
    )
    assert ep.model_version == "2024-09"
    assert ep.engine_version == "docker.io/vllm/vllm-openai:v0.8.4@sha256:" + "a" * 64


def test_an_ipv6_pod_is_scraped_at_its_bracketed_address() -> None:
    ep = engine_pod(pod("v6", ip="fd00:10:244::17", annotations=SCRAPE), K)
    assert ep is not None and ep.url == "http://[fd00:10:244::17]:8000/metrics"


def test_version_falls_back_to_the_image_tag_then_to_the_next_configured_label() -> None:
    p = pod("e-0", annotations=SCRAPE, image="ghcr.io/acme/llm:2024-10.3")
    ep = engine_pod(p, K)
    assert ep is not None and ep.model_version == "2024-10.3"
    k2 = KubernetesConfig(version_labels=("acme.io/model-rev", "app.kubernetes.io/version"))
    p2 = pod("e-0", annotations=SCRAPE, labels={"app.kubernetes.io/version": "v7"})
    assert (ep2 := engine_pod(p2, k2)) is not None and ep2.model_version == "v7"
    assert image_tag("registry:5000/a/b@sha256:00") is None
    assert image_tag("registry:5000/a/b:1.2@sha256:00") == "1.2"


@pytest.mark.parametrize(
    ("annotations", "fragment"),
    [
        (_ann(port="abc"), "infercost.io/port 'abc' is not a port number"),
        (_ann(port="70000"), "'70000' is not a port number"),
        (_ann(engine="foo"), "infercost.io/engine 'foo' is not one of"),
        # SSRF: a port the pod does not declare (the kubelet's 10250 on a host-network pod, say)
        (_ann(port="10250"), "refused scrape target port 10250"),
        # SSRF: a path that would make the URL point at another host
        (_ann(path="http://169.254.169.254/latest/meta-data/"), "refused scrape target path"),
        (_ann(path="//169.254.169.254/latest/meta-data/"), "refused scrape target path"),
        (_ann(path="/metrics x"), "refused scrape target path"),
        (_ann(name="a/b"), "engine name 'a/b'"),
    ],
)
def test_bad_annotations_are_refused_with_the_reason(annotations: dict[str, str], fragment: str) -> None:
    with pytest.raises(PodRefused, match=None) as err:
        engine_pod(pod("bad", annotations=annotations), K)
    assert fragment in str(err.value)


def test_an_allow_listed_port_may_be_undeclared_and_a_named_metrics_port_is_preferred() -> None:
    k = KubernetesConfig(allowed_ports=(9400,))
    ep = engine_pod(pod("e", annotations=_ann(port="9400")), k)
    assert ep is not None and ep.url == "http://10.244.1.17:9400/metrics"
    ep2 = engine_pod(pod("e", annotations=SCRAPE, ports=(("http", 8000), ("metrics", 8001))), K)
    assert ep2 is not None and ep2.url == "http://10.244.1.17:8001/metrics"


def test_selection_by_annotation_or_label_selector_and_pending_pods_wait() -> None:
    assert not is_selected(pod("x"), K)
    assert is_selected(pod("x", annotations=SCRAPE), K)
    by_label = KubernetesConfig(label_selector={"app.kubernetes.io/component": "llm"})
    assert is_selected(pod("x", labels={"app.kubernetes.io/component": "llm"}), by_label)
    no = pod("x", labels={"app.kubernetes.io/component": "llm"}, annotations={"infercost.io/scrape": "false"})
    assert not is_selected(no, by_label)
    assert engine_pod(pod("x", annotations=SCRAPE, ip=None, phase="Pending"), K) is None


def _replica(name: str, rs: str = "m-5f", namespace: str = "llm") -> EnginePod:
    hash_ = {"pod-template-hash": rs.split("-")[-1]}
    ep = engine_pod(
        pod(name, namespace=namespace, annotations=SCRAPE, owner=("ReplicaSet", rs), labels=hash_), K
    )
    assert ep is not None
    return ep


def test_two_replicas_on_one_node_get_distinct_names() -> None:
    a, b = _replica("m-5f-aaaaa"), _replica("m-5f-bbbbb")
    c = engine_pod(pod("solo-0", annotations=SCRAPE, owner=("StatefulSet", "solo")), K)
    assert c
    assert engine_names([a, b, c]) == {
        ("llm", "m-5f-aaaaa"): "m",
        ("llm", "m-5f-bbbbb"): "m:2",
        ("llm", "solo-0"): "solo-0",
    }


def test_a_replica_keeps_its_name_while_others_come_and_go() -> None:
    """A second replica landing beside the first must not rename it (its history is keyed by name);
    a replacement takes the lowest free slot; the same workload name in another namespace is apart."""
    a = _replica("m-5f-aaaaa")
    names = engine_names([a])
    assert names == {("llm", "m-5f-aaaaa"): "m"}
    b = _replica("m-5f-bbbbb")
    names = engine_names([b, a], names)  # b sorts first: only the sticky slot keeps a at "m"
    assert names == {("llm", "m-5f-aaaaa"): "m", ("llm", "m-5f-bbbbb"): "m:2"}
    names = engine_names([b], names)  # a leaves: b stays "m:2"
    assert names == {("llm", "m-5f-bbbbb"): "m:2"}
    c = _replica("m-6a-ccccc", rs="m-6a")  # a rollout's new pod takes the free first slot
    names = engine_names([b, c], names)
    assert names == {("llm", "m-5f-bbbbb"): "m:2", ("llm", "m-6a-ccccc"): "m"}
    other = _replica("m-7b-ddddd", rs="m-7b", namespace="search")
    names = engine_names([b, c, other], names)
    assert names[("search", "m-7b-ddddd")] == "search.m"
    assert engine_names([other]) == {("search", "m-7b-ddddd"): "m"}


# ------------------------------------------------------------------------------------ list + watch
async def _until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    async def poll() -> None:
        while not cond():
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), timeout)


def _urls(src: KubeEngines) -> dict[str, tuple[str, str | None]]:
    return {e.name: (e.url, e.model_version) for e in src.engines()}


async def test_list_then_watch_follows_pods_relists_after_410_and_keeps_engines_in_an_outage(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.INFO)
    api = FakeKubeApi()
    v1 = {"app.kubernetes.io/version": "v1"}
    a = pod("a-0", ip="10.244.1.10", annotations=_ann(engine="vllm"), labels=v1)
    bad = pod("bad-0", ip="10.244.1.11", annotations=_ann(port="abc"))
    other_node = pod("far-0", node="gpu-node-2", ip="10.244.2.10", annotations=SCRAPE)
    not_engine = pod("web-0", ip="10.244.1.12")
    for p in (a, bad, other_node, not_engine):
        api.put(p)
    await api.start()
    k = KubernetesConfig(
        enabled=True,
        kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", api.url),
        pod_resources_socket=None,
        backoff_min_seconds=0.05,
        backoff_max_seconds=0.2,
    )
    static = EngineConfig(name="static", url="http://127.0.0.1:9/metrics")
    src = KubeEngines(
        Config(node="gpu-node-1", kubernetes=k, engines=(static,)),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(src.run(stop))
    try:
        await _until(lambda: "a-0" in _urls(src))
        assert _urls(src) == {
            "a-0": ("http://10.244.1.10:8000/metrics", "v1"),
            "static": ("http://127.0.0.1:9/metrics", None),  # static engines keep working
        }
        # the list is scoped to this node; the watch resumes from the list's resourceVersion
        first = api.requests[0]
        assert first["fieldSelector"] == "spec.nodeName=gpu-node-1" and "watch" not in first
        await _until(lambda: len(api.requests) == 2)
        assert api.requests[1]["watch"] == "true" and api.requests[1]["resourceVersion"] == "1004"

        # ADDED, MODIFIED (a new version label), a bad pod changed again, then DELETED
        c = pod("c-0", ip="10.244.1.13", annotations=_ann(port="8000", path="/v2/metrics"))
        api.emit("ADDED", c)
        api.emit(
            "MODIFIED",
            pod(
                "a-0",
                ip="10.244.1.10",
                annotations=_ann(engine="vllm"),
                labels={"app.kubernetes.io/version": "v2"},
            ),
        )
        api.emit("MODIFIED", bad)
        api.emit("DELETED", bad)
        await _until(lambda: "c-0" in _urls(src) and _urls(src)["a-0"][1] == "v2")
        assert _urls(src) == {
            "a-0": ("http://10.244.1.10:8000/metrics", "v2"),
            "c-0": ("http://10.244.1.13:8000/v2/metrics", "v0.8.4"),  # no label: the image tag
            "static": ("http://127.0.0.1:9/metrics", None),
        }
        skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
        assert skipped == [
            "pod llm/bad-0 skipped: annotation infercost.io/port 'abc' is not a port number (1-65535)"
        ]
        # SSRF: an annotation pointing at the cloud metadata address is refused with one line
        evil = pod(
            "evil-0", ip="10.244.1.14", annotations=_ann(path="http://169.254.169.254/latest/meta-data/")
        )
        api.emit("ADDED", evil)
        await _until(lambda: any("evil-0" in r.getMessage() for r in caplog.records))
        assert [r.getMessage() for r in caplog.records if "evil-0" in r.getMessage()] == [
            "pod llm/evil-0 skipped: refused scrape target path 'http://169.254.169.254/latest/meta-data/': "
            "it must be an absolute path such as /metrics"
        ]
        assert "evil-0" not in _urls(src)
        api.emit("DELETED", evil)
        await _until(
            lambda: (
                ("llm", "evil-0") not in {(p.metadata.namespace, p.metadata.name) for p in src.watcher.pods()}
            )
        )

        # 410 Gone → a fresh list, which sees a pod deleted while no watch was open
        lists = src.watcher.lists
        api.pods.pop(("llm", "c-0"))
        api.emit("ERROR", gone_event("1004")["object"])
        await _until(lambda: src.watcher.lists == lists + 1)
        await _until(lambda: "c-0" not in _urls(src))
        assert set(_urls(src)) == {"a-0", "static"}

        # API-server outage: lists answer 503 twice; the last engines stay, one warning, then back
        caplog.clear()
        api.fail_lists = 2
        api.emit("ERROR", gone_event("1010")["object"])
        await _until(lambda: api.fail_lists == 0)
        assert set(_urls(src)) == {"a-0", "static"}
        await _until(lambda: src.watcher.lists == lists + 2)
        outage = [r.getMessage() for r in caplog.records if "unavailable" in r.getMessage()]
        assert len(outage) == 1 and "503" in outage[0] and "keeping the last 2 known pod(s)" in outage[0]
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        await api.stop()


async def test_a_redirect_to_another_host_is_not_followed() -> None:
    """SSRF: an engine answering 302 to another address marks that engine down; nothing is fetched there."""
    hits: list[str] = []

    async def elsewhere(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(text="vllm:num_requests_running 0\n")

    other = web.Application()
    other.router.add_get("/{tail:.*}", elsewhere)
    other_runner = web.AppRunner(other)
    await other_runner.setup()
    other_site = web.TCPSite(other_runner, "127.0.0.2", 0)
    await other_site.start()
    target = f"http://127.0.0.2:{other_site._server.sockets[0].getsockname()[1]}/latest/meta-data/"  # type: ignore[union-attr]

    async def redirect(_request: web.Request) -> web.Response:
        raise web.HTTPFound(target)

    app = web.Application()
    app.router.add_get("/metrics", redirect)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as session:
            cfg = EngineConfig(name="e", kind="vllm", url=f"http://127.0.0.1:{port}/metrics")
            result = await EngineScraper(cfg, session, SystemClock()).scrape()
    finally:
        await runner.cleanup()
        await other_runner.cleanup()
    assert not result.up and result.error == "HTTP 302"
    assert hits == []


def test_one_config_file_serves_a_mixed_fleet_through_per_node_overrides() -> None:
    raw = {
        "kubernetes": {"enabled": True, "version_labels": ["app.kubernetes.io/version"]},
        "engines": [{"name": "llama-70b", "url": "http://127.0.0.1:8000/metrics", "gpus": [0, 1, 2, 3]}],
        "nodes": {
            "gpu-node-17": {
                "engines": [{"name": "llama-70b", "url": "http://127.0.0.1:8000/metrics", "gpus": [0, 1]}],
                "kubernetes": {"allowed_ports": [9400]},
            },
        },
    }
    a = parse_config(raw, "node.yaml", environ={"INFERCOST_NODE": "gpu-node-17"})
    assert a.node == "gpu-node-17" and a.engines[0].gpus == (0, 1)
    assert a.kubernetes.enabled and a.kubernetes.allowed_ports == (9400,)  # mappings merge key by key
    b = parse_config(raw, "node.yaml", environ={"INFERCOST_NODE": "gpu-node-3"})
    assert b.engines[0].gpus == (0, 1, 2, 3) and b.kubernetes.allowed_ports == ()
    with pytest.raises(ConfigError, match=r"node.yaml \(with nodes.gpu-node-17\): invalid configuration"):
        bad = {**raw, "nodes": {"gpu-node-17": {"kubernetes": {"allowed_portz": [1]}}}}
        parse_config(bad, "node.yaml", environ={"INFERCOST_NODE": "gpu-node-17"})
    with pytest.raises(ConfigError, match="key 'nodes': must map node names"):
        parse_config({"nodes": ["gpu-node-17"]}, "node.yaml", environ={})


async def test_a_watch_cut_by_an_api_server_restart_reconnects(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """The API server goes away mid-watch (connection refused): the engines stay; when it is back on
    the same address the agent lists again and follows the change it missed."""
    caplog.set_level(logging.INFO)
    labels = {"app.kubernetes.io/version": "v1"}
    api = FakeKubeApi()
    api.put(pod("a-0", ip="10.244.1.10", annotations=SCRAPE, labels=labels))
    url = await api.start()
    k = KubernetesConfig(
        enabled=True,
        kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", url),
        pod_resources_socket=None,
        backoff_min_seconds=0.05,
        backoff_max_seconds=0.2,
    )
    src = KubeEngines(Config(node="gpu-node-1", kubernetes=k))
    stop = asyncio.Event()
    task = asyncio.create_task(src.run(stop))
    again = FakeKubeApi()
    try:
        await _until(lambda: _urls(src).get("a-0") == ("http://10.244.1.10:8000/metrics", "v1"))
        await _until(lambda: any(q.get("watch") == "true" for q in api.requests))
        await api.stop()
        await _until(lambda: any("unavailable" in r.getMessage() for r in caplog.records))
        assert _urls(src) == {"a-0": ("http://10.244.1.10:8000/metrics", "v1")}  # the last engines stay
        again.put(
            pod("a-0", ip="10.244.1.10", annotations=SCRAPE, labels={"app.kubernetes.io/version": "v2"})
        )
        await again.start(port=int(url.rsplit(":", 1)[1]))
        await _until(lambda: _urls(src).get("a-0") == ("http://10.244.1.10:8000/metrics", "v2"))
        assert any("answering again" in r.getMessage() for r in caplog.records)
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        await again.stop()


def test_no_api_credentials_is_a_config_error_that_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"kubernetes.kubeconfig .*missing.* fix: run the agent in a pod"):
        make_client(KubernetesConfig(enabled=True, kubeconfig=tmp_path / "missing"))
    no_user = tmp_path / "kubeconfig"
    write_kubeconfig(no_user, "https://127.0.0.1:6443")
    doc = yaml.safe_load(no_user.read_text())
    doc["contexts"][0]["context"].pop("user")
    no_user.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="no usable API credentials"):
        make_client(KubernetesConfig(enabled=True, kubeconfig=no_user))


def test_infercost_run_exits_2_without_api_credentials(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node_yaml = tmp_path / "node.yaml"
    node_yaml.write_text(
        yaml.safe_dump(
            {
                "node": "gpu-node-1",
                "state_dir": str(tmp_path / "state"),
                "nvml": {"backend": "none"},
                "exporters": {"prometheus": {"port": 0}},
                "kubernetes": {"enabled": True, "kubeconfig": str(tmp_path / "missing")},
            }
        )
    )
    assert main(["run", "--config", str(node_yaml)]) == 2
    err = capsys.readouterr().err
    assert "kubernetes.enabled is true but no usable API credentials" in err and "fix:" in err


def test_check_describes_discovery_without_calling_the_api(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node_yaml = tmp_path / "node.yaml"
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", "https://127.0.0.1:1")  # nothing listens there
    node_yaml.write_text(
        yaml.safe_dump(
            {
                "node": "gpu-node-1",
                "state_dir": str(tmp_path / "state"),
                "exporters": {"prometheus": {"port": 0}},
                "kubernetes": {
                    "enabled": True,
                    "kubeconfig": str(kubeconfig),
                    "label_selector": {"app": "llm"},
                    "pod_resources_socket": str(tmp_path / "kubelet.sock"),
                },
            }
        )
    )
    assert main(["check", "--config", str(node_yaml)]) == 0
    out = capsys.readouterr().out
    assert (
        f"kubernetes: ok — pods of node gpu-node-1 via kubeconfig {kubeconfig}; engines by annotation "
        f'infercost.io/scrape: "true" or labels app=llm; pod-resources {tmp_path / "kubelet.sock"} absent '
        "(GPUs from engines: until it appears)"
    ) in out


async def test_a_second_replica_landing_by_watch_does_not_rename_the_first(tmp_path: Path) -> None:
    """Scale-up by watch: the first replica keeps its name (and so its history); the new one is
    ``m:2``; when the first leaves, a rollout's new pod takes the first slot back."""
    api = FakeKubeApi()

    def replica(name: str, rs: str, ip: str) -> dict[str, object]:
        hash_ = {"pod-template-hash": rs.split("-")[-1]}
        return pod(name, ip=ip, annotations=SCRAPE, owner=("ReplicaSet", rs), labels=hash_)

    # "m-5f-zzzzz" sorts after the newcomer: only the sticky slot keeps it at "m"
    api.put(replica("m-5f-zzzzz", "m-5f", "10.244.1.20"))
    await api.start()
    k = KubernetesConfig(
        enabled=True,
        kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", api.url),
        pod_resources_socket=None,
    )
    src = KubeEngines(Config(node="gpu-node-1", kubernetes=k))
    stop = asyncio.Event()
    task = asyncio.create_task(src.run(stop))
    try:
        await _until(lambda: "m" in _urls(src))
        api.emit("ADDED", replica("m-5f-aaaaa", "m-5f", "10.244.1.21"))
        await _until(lambda: len(_urls(src)) == 2)
        assert {n: u for n, (u, _v) in _urls(src).items()} == {
            "m": "http://10.244.1.20:8000/metrics",
            "m:2": "http://10.244.1.21:8000/metrics",
        }
        api.emit("DELETED", replica("m-5f-zzzzz", "m-5f", "10.244.1.20"))
        api.emit("ADDED", replica("m-6a-bbbbb", "m-6a", "10.244.1.22"))
        await _until(lambda: _urls(src).get("m", ("",))[0] == "http://10.244.1.22:8000/metrics")
        assert {n: u for n, (u, _v) in _urls(src).items()} == {
            "m": "http://10.244.1.22:8000/metrics",
            "m:2": "http://10.244.1.21:8000/metrics",
        }
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        await api.stop()
