"""SSRF through the pod IP: the API server says where a pod is, and whoever can write a pod's
status says what that is. A pod at a link-local (cloud metadata), loopback, multicast, unspecified
or reserved address, or at one of those written as IPv6, is never a scrape target, and says so in
one log line per pod. Nothing here connects to any pod: the checks are on what would be scraped."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.config import Config, ConfigError, KubernetesConfig, parse_config
from agent.sources.kube.pods import PodRefused, address_refusal, engine_pod
from agent.sources.kube.source import KubeEngines, describe
from tests.kubeapi import FakeKubeApi, pod, write_kubeconfig

K = KubernetesConfig(enabled=True, pod_resources_socket=None)
SCRAPE = {"infercost.io/scrape": "true"}

REFUSED = [
    ("169.254.169.254", "link-local"),  # the cloud metadata service
    ("169.254.0.1", "link-local"),
    ("fe80::1", "link-local"),
    ("fe80::a9fe:a9fe", "link-local"),
    ("::ffff:169.254.169.254", "link-local"),  # IPv4-mapped
    ("::ffff:a9fe:a9fe", "link-local"),  # the same, in hex
    ("64:ff9b::169.254.169.254", "link-local"),  # NAT64's well-known prefix
    ("::169.254.169.254", "link-local"),  # IPv4-compatible (deprecated, still parsed)
    ("127.0.0.1", "loopback"),
    ("127.1.2.3", "loopback"),
    ("::1", "loopback"),
    ("::ffff:127.0.0.1", "loopback"),
    ("224.0.0.1", "multicast"),
    ("239.255.255.250", "multicast"),
    ("ff02::1", "multicast"),
    ("::ffff:224.0.0.251", "multicast"),
    ("0.0.0.0", "unspecified"),
    ("0.1.2.3", "unspecified"),
    ("::", "unspecified"),
    ("::ffff:0.0.0.0", "unspecified"),
    ("255.255.255.255", "reserved"),
    ("240.0.0.1", "reserved"),
    ("metadata.google.internal", "not an IP address"),
    ("10.0.0.1:80@169.254.169.254", "not an IP address"),
]
ACCEPTED = ["10.244.1.17", "192.168.3.4", "172.16.0.9", "100.64.0.3", "fd00:10:244::17", "2001:db8::17"]


@pytest.mark.parametrize(("ip", "why"), REFUSED)
def test_a_pod_at_a_forbidden_address_is_refused_with_the_reason(ip: str, why: str) -> None:
    reason = address_refusal(ip)
    assert reason is not None and why in reason, (ip, reason)
    with pytest.raises(PodRefused, match=f"refused pod IP '{ip}'"):
        engine_pod(pod("evil-0", ip=ip, annotations=SCRAPE), K)


@pytest.mark.parametrize("ip", ACCEPTED)
def test_a_pod_at_a_pod_address_is_a_target_at_that_address(ip: str) -> None:
    ep = engine_pod(pod("ok-0", ip=ip, annotations=SCRAPE), K)
    assert ep is not None
    assert ep.url == (f"http://[{ip}]:8000/metrics" if ":" in ip else f"http://{ip}:8000/metrics")


def test_loopback_only_with_allow_loopback_and_link_local_never() -> None:
    allow = KubernetesConfig(enabled=True, pod_resources_socket=None, allow_loopback=True)
    for ip in ("127.0.0.1", "::1", "::ffff:127.0.0.1"):
        ep = engine_pod(pod("local-0", ip=ip, annotations=SCRAPE), allow)
        assert ep is not None and ep.url.endswith(":8000/metrics")
    for ip in ("169.254.169.254", "::ffff:169.254.169.254", "224.0.0.1", "0.0.0.0"):
        with pytest.raises(PodRefused):
            engine_pod(pod("evil-0", ip=ip, annotations=SCRAPE), allow)
    with pytest.raises(PodRefused, match=r"kubernetes\.allow_loopback"):  # the message names the fix
        engine_pod(pod("local-0", ip="127.0.0.1", annotations=SCRAPE), K)


def test_allow_loopback_is_a_config_key_and_durations_are_bounded() -> None:
    cfg = parse_config({"kubernetes": {"enabled": True, "allow_loopback": True}}, "node.yaml")
    assert cfg.kubernetes.allow_loopback is True
    assert parse_config({}, "node.yaml").kubernetes.allow_loopback is False
    for key in ("pod_resources_seconds", "backoff_max_seconds", "timeout_seconds"):
        with pytest.raises(ConfigError, match=f"kubernetes.{key}"):
            parse_config({"kubernetes": {key: 1e12}}, "node.yaml")


def test_check_says_when_loopback_pods_are_scraped(tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", "https://127.0.0.1:1")  # never called
    k = KubernetesConfig(enabled=True, kubeconfig=kubeconfig, pod_resources_socket=None)
    assert "allow_loopback" not in describe(Config(node="n1", kubernetes=k))
    allow = k.model_copy(update={"allow_loopback": True})
    assert describe(Config(node="n1", kubernetes=allow)).endswith(
        "; pods at loopback IPs scraped (allow_loopback)"
    )


async def _until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    async def poll() -> None:
        while not cond():
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), timeout)


async def test_the_watch_never_makes_a_metadata_address_a_target_and_says_so_once_per_pod(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """The real lightkube client against the local API server (list, then watch events)."""
    caplog.set_level(logging.INFO)
    api = FakeKubeApi()
    api.put(pod("good-0", ip="10.244.1.10", annotations=SCRAPE))
    api.put(pod("meta-0", ip="169.254.169.254", annotations=SCRAPE))
    await api.start()
    k = KubernetesConfig(
        enabled=True,
        kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", api.url),
        pod_resources_socket=None,
        backoff_min_seconds=0.05,
        backoff_max_seconds=0.2,
    )
    src = KubeEngines(Config(node="gpu-node-1", kubernetes=k))
    stop = asyncio.Event()
    task = asyncio.create_task(src.run(stop))

    def urls() -> set[str]:
        return {e.url for e in src.engines()}

    def lines(name: str) -> list[str]:
        return [r.getMessage() for r in caplog.records if name in r.getMessage()]

    try:
        await _until(lambda: "http://10.244.1.10:8000/metrics" in urls())
        assert urls() == {"http://10.244.1.10:8000/metrics"}
        # more pods at forbidden addresses, one of them changed again and again (status updates)
        api.emit("ADDED", pod("mapped-0", ip="::ffff:169.254.169.254", annotations=SCRAPE))
        api.emit("ADDED", pod("local-0", ip="127.0.0.1", annotations=SCRAPE))
        for rv in range(5):
            api.emit(
                "MODIFIED",
                pod("meta-0", ip="169.254.169.254", annotations=SCRAPE, rv=str(2000 + rv)),
            )
        api.emit("ADDED", pod("late-0", ip="10.244.1.11", annotations=SCRAPE))
        await _until(lambda: "http://10.244.1.11:8000/metrics" in urls())
        assert urls() == {"http://10.244.1.10:8000/metrics", "http://10.244.1.11:8000/metrics"}
        assert lines("meta-0") == [
            "pod llm/meta-0 skipped: refused pod IP '169.254.169.254': a link-local address (the "
            "cloud metadata service lives there) is never scraped"
        ]
        assert len(lines("mapped-0")) == 1 and "IPv4 169.254.169.254 written as IPv6" in lines("mapped-0")[0]
        assert len(lines("local-0")) == 1 and "loopback" in lines("local-0")[0]
        assert all("169.254" not in u and "127.0.0.1" not in u for u in urls())
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        await api.stop()
