"""The kubelet PodResources v1 client through grpcio against a local gRPC server on a unix socket.

The server speaks the kubelet's v1 messages with the fields infercost does not declare (cpu_ids,
topology with NUMA nodes, memory) filled in, built here from a descriptor of the kubelet's messages
independent of ``agent/sources/kube/podresources_pb2.py``, so the test shows the client decodes what
a kubelet sends and skips what it does not read.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from agent.sources.kube.podresources import ContainerGpus, GpuMap, list_gpus_blocking

ROOT = Path(__file__).resolve().parent.parent
KUBE = ROOT / "agent" / "sources" / "kube"

F = descriptor_pb2.FieldDescriptorProto


def _kubelet_messages() -> dict[str, Any]:
    """Message classes for the kubelet's v1 List response, including fields infercost skips."""
    fd = descriptor_pb2.FileDescriptorProto(
        name="kubelet_v1_test.proto", package="kubeletv1test", syntax="proto3"
    )

    def msg(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        m = fd.message_type.add(name=name)
        for fname, number, label, ftype, type_name in fields:
            f = m.field.add(name=fname, number=number, label=label, type=ftype)
            if type_name:
                f.type_name = f".kubeletv1test.{type_name}"

    rep, opt = F.LABEL_REPEATED, F.LABEL_OPTIONAL
    msg("NUMANode", ("ID", 1, opt, F.TYPE_INT64, ""))
    msg("TopologyInfo", ("nodes", 1, rep, F.TYPE_MESSAGE, "NUMANode"))
    msg(
        "ContainerMemory",
        ("memory_type", 1, opt, F.TYPE_STRING, ""),
        ("size", 2, opt, F.TYPE_UINT64, ""),
        ("topology", 3, opt, F.TYPE_MESSAGE, "TopologyInfo"),
    )
    msg(
        "ContainerDevices",
        ("resource_name", 1, opt, F.TYPE_STRING, ""),
        ("device_ids", 2, rep, F.TYPE_STRING, ""),
        ("topology", 3, opt, F.TYPE_MESSAGE, "TopologyInfo"),
    )
    msg(
        "ContainerResources",
        ("name", 1, opt, F.TYPE_STRING, ""),
        ("devices", 2, rep, F.TYPE_MESSAGE, "ContainerDevices"),
        ("cpu_ids", 3, rep, F.TYPE_INT64, ""),
        ("memory", 4, rep, F.TYPE_MESSAGE, "ContainerMemory"),
    )
    msg(
        "PodResources",
        ("name", 1, opt, F.TYPE_STRING, ""),
        ("namespace", 2, opt, F.TYPE_STRING, ""),
        ("containers", 3, rep, F.TYPE_MESSAGE, "ContainerResources"),
        ("cpu_ids", 4, rep, F.TYPE_INT64, ""),
    )
    msg("ListPodResourcesResponse", ("pod_resources", 1, rep, F.TYPE_MESSAGE, "PodResources"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return {
        m.name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"kubeletv1test.{m.name}"))
        for m in fd.message_type
    }


def kubelet_response(pods: list[dict[str, Any]]) -> bytes:
    """A serialized ListPodResourcesResponse as a kubelet would send it."""
    M = _kubelet_messages()
    resp = M["ListPodResourcesResponse"]()
    for p in pods:
        pr = resp.pod_resources.add(name=p["name"], namespace=p["namespace"])
        pr.cpu_ids.extend([2, 3])
        for cname, devices in p["containers"]:
            c = pr.containers.add(name=cname)
            c.cpu_ids.extend([2, 3])
            c.memory.add(memory_type="memory", size=1 << 30).topology.nodes.add(ID=0)
            for resource, ids in devices:
                d = c.devices.add(resource_name=resource, device_ids=ids)
                d.topology.nodes.add(ID=1)
    return bytes(resp.SerializeToString())


class Kubelet:
    """A gRPC server for ``/v1.PodResourcesLister/List`` on a unix socket."""

    def __init__(self, sock: Path, pods: list[dict[str, Any]]) -> None:
        self.sock = sock
        self.pods = pods
        self.calls = 0
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))

        def list_(_req: bytes, _ctx: grpc.ServicerContext) -> bytes:
            self.calls += 1
            return kubelet_response(self.pods)

        handler = grpc.unary_unary_rpc_method_handler(
            list_, request_deserializer=lambda b: b, response_serializer=lambda b: b
        )
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("v1.PodResourcesLister", {"List": handler}),)
        )
        self.server.add_insecure_port(f"unix://{sock}")

    def __enter__(self) -> Kubelet:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(grace=None).wait()


NODE_PODS: list[dict[str, Any]] = [
    {  # an engine on two whole GPUs
        "name": "llama-70b-7d9f8c6b5-x2x9q",
        "namespace": "llm",
        "containers": [("vllm", [("nvidia.com/gpu", ["GPU-aaaa", "GPU-bbbb"])])],
    },
    {  # a MIG slice, and a sidecar with no devices
        "name": "small-0",
        "namespace": "llm",
        "containers": [("tgi", [("nvidia.com/mig-1g.10gb", ["MIG-1111"])]), ("proxy", [])],
    },
    {  # time-sliced replicas of one GPU, and a non-GPU device that is ignored
        "name": "notebook-0",
        "namespace": "research",
        "containers": [
            ("jupyter", [("nvidia.com/gpu", ["GPU-cccc::0", "GPU-cccc::1"]), ("example.com/fpga", ["fpga0"])])
        ],
    },
]


@pytest.fixture
def sock(tmp_path: Path) -> Iterator[Path]:
    # unix socket paths are limited to ~107 bytes: pytest's tmp_path can be longer
    import tempfile

    with tempfile.TemporaryDirectory(prefix="pr") as d:
        yield Path(d) / "kubelet.sock"


def test_list_through_grpc_maps_containers_to_gpu_and_mig_uuids(sock: Path) -> None:
    with Kubelet(sock, NODE_PODS) as k:
        got = list_gpus_blocking(sock, timeout=5)
    assert k.calls == 1
    assert got == [
        ContainerGpus("llm", "llama-70b-7d9f8c6b5-x2x9q", "vllm", ("GPU-aaaa", "GPU-bbbb")),
        ContainerGpus("llm", "small-0", "tgi", ("MIG-1111",)),
        ContainerGpus("research", "notebook-0", "jupyter", ("GPU-cccc",)),
    ]


async def test_gpu_map_falls_back_with_one_warning_then_recovers(
    sock: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    gm = GpuMap(sock, timeout=2)
    await gm.refresh()
    await gm.refresh()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "no such socket" in warnings[0] and "GPUs in the config" in warnings[0]
    assert gm.available is False and gm.known is False
    assert gm.pod_gpus("llm", "small-0") == ()
    with Kubelet(sock, NODE_PODS):
        await gm.refresh()
    assert gm.available is True
    assert gm.pod_gpus("llm", "small-0") == ("MIG-1111",)
    assert gm.holders()["GPU-cccc"] == ("research", "notebook-0")
    # a socket file nobody listens on (a kubelet restarting): refused → the last map is kept
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(str(sock))
        await gm.refresh()
        await gm.refresh()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "keeping the last GPU map" in warnings[1] and "List failed" in warnings[1]
    assert gm.available is False and gm.known is True
    assert gm.pod_gpus("llm", "llama-70b-7d9f8c6b5-x2x9q") == ("GPU-aaaa", "GPU-bbbb")
    await asyncio.sleep(0)


def test_generated_module_matches_the_proto(tmp_path: Path) -> None:
    """podresources_pb2.py is generated from podresources.proto by grpcio-tools: regenerate and compare."""
    pytest.importorskip("grpc_tools")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{KUBE}",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            str(KUBE / "podresources.proto"),
        ],
        check=True,
    )
    for name in ("podresources_pb2.py", "podresources_pb2.pyi"):
        assert (tmp_path / name).read_text() == (KUBE / name).read_text(), f"regenerate {name}"
