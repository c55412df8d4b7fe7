"""Which GPUs each container holds, from the kubelet's PodResources v1 gRPC API.

The kubelet serves ``v1.PodResourcesLister/List`` on a unix socket
(``/var/lib/kubelet/pod-resources/kubelet.sock``); for every pod on the node it lists, per
container, the device-plugin devices it was given: for NVIDIA's plugin the resource
``nvidia.com/gpu`` with GPU UUIDs (``GPU-…``), or ``nvidia.com/mig-…`` with MIG device UUIDs
(``MIG-…``). Time-sliced replicas are reported as ``GPU-…::N``; the suffix is dropped, so the
replicas of one GPU share it by the cost model's share policy. Devices allocated through Dynamic
Resource Allocation (``dynamic_resources``) name a driver's device (``gpu-0``), not a UUID, and are
not mapped yet: such an engine's GPUs come from the config.

The messages are our own wire-compatible declaration of the kubelet's proto (``podresources.proto``,
compiled by grpcio-tools into ``podresources_pb2.py``). ``grpc`` is imported only when the socket is
used, so a node without Kubernetes never pays for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
LIST_METHOD = "/v1.PodResourcesLister/List"
# Resource names of GPUs: NVIDIA's device plugin (whole GPUs, MIG profiles, shared replicas).
GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")


@dataclass(frozen=True, slots=True)
class ContainerGpus:
    """The GPUs one container holds."""

    namespace: str
    pod: str
    container: str
    gpus: tuple[str, ...]  # GPU UUIDs (GPU-…) or MIG device UUIDs (MIG-…), in the kubelet's order


class PodResourcesError(Exception):
    """The kubelet's pod-resources socket is absent, refuses, or answered something unusable."""


def _device_id(raw: str) -> str:
    """A device id as NVML names it: time-slicing replicas ``GPU-…::3`` share ``GPU-…``."""
    return raw.split("::", 1)[0]


def parse_list_response(resp: Any) -> list[ContainerGpus]:
    """The GPU-holding containers in a ``ListPodResourcesResponse`` (other devices are ignored)."""
    out: list[ContainerGpus] = []
    for pod in resp.pod_resources:
        for c in pod.containers:
            ids: list[str] = []
            for dev in c.devices:
                if dev.resource_name.startswith(GPU_RESOURCE_PREFIXES):
                    for raw in dev.device_ids:
                        d = _device_id(raw)
                        if d not in ids:
                            ids.append(d)
            if ids:
                out.append(ContainerGpus(pod.namespace, pod.name, c.name, tuple(ids)))
    return out


def list_gpus_blocking(socket_path: Path, timeout: float = 5.0) -> list[ContainerGpus]:
    """Call ``List`` on the kubelet socket (blocking; run it off the event loop)."""
    if not socket_path.exists():
        raise PodResourcesError(
            f"{socket_path}: no such socket (is the kubelet's pod-resources dir mounted?)"
        )
    import grpc

    from agent.sources.kube import podresources_pb2 as pb

    with grpc.insecure_channel(f"unix://{socket_path}") as channel:
        call = channel.unary_unary(
            LIST_METHOD,
            request_serializer=pb.ListPodResourcesRequest.SerializeToString,
            response_deserializer=pb.ListPodResourcesResponse.FromString,
        )
        try:
            resp = call(pb.ListPodResourcesRequest(), timeout=timeout)
        except grpc.RpcError as err:
            code = err.code() if isinstance(err, grpc.Call) else None
            detail = err.details() if isinstance(err, grpc.Call) else str(err)
            raise PodResourcesError(f"{socket_path}: List failed: {code}: {detail}") from None
    return parse_list_response(resp)


class GpuMap:
    """The latest pod → GPUs map from the kubelet, refreshed on demand, falling back to nothing.

    ``refresh()`` never raises: when the socket is absent or refuses, the last map is kept (a
    kubelet restart does not move cost), or, before any answer, there is none and the config's GPUs
    apply; one warning is logged per state change.
    """

    def __init__(self, socket_path: Path = DEFAULT_SOCKET, timeout: float = 5.0) -> None:
        self.socket_path = socket_path
        self.timeout = timeout  # seconds for one List call
        self._by_container: dict[tuple[str, str, str], tuple[str, ...]] = {}
        self._by_pod: dict[tuple[str, str], tuple[str, ...]] = {}  # (namespace, pod) → its GPUs
        self.available: bool | None = None  # whether the last List answered; None before the first
        self.known = False  # whether any List ever answered (then the map is used)

    async def refresh(self) -> None:
        """Ask the kubelet again (off the event loop)."""
        try:
            found = await asyncio.to_thread(list_gpus_blocking, self.socket_path, self.timeout)
        except PodResourcesError as err:
            if self.available is not False:
                fallback = "keeping the last GPU map" if self.known else "using the GPUs in the config"
                logger.warning("kubelet pod-resources unavailable, %s: %s", fallback, err)
            self.available = False
            return
        if self.available is False:
            logger.info("kubelet pod-resources answering again at %s", self.socket_path)
        self.available = self.known = True
        self._by_container = {(c.namespace, c.pod, c.container): c.gpus for c in found}
        by_pod: dict[tuple[str, str], list[str]] = {}
        for c in found:
            gpus = by_pod.setdefault((c.namespace, c.pod), [])
            gpus.extend(g for g in c.gpus if g not in gpus)
        self._by_pod = {key: tuple(gpus) for key, gpus in by_pod.items()}

    def containers(self) -> Mapping[tuple[str, str, str], tuple[str, ...]]:
        """(namespace, pod, container) → GPU UUIDs, from the last successful refresh."""
        return self._by_container

    def pod_gpus(self, namespace: str, pod: str) -> tuple[str, ...]:
        """Every GPU the pod's containers hold (kubelet order, no duplicates)."""
        return self._by_pod.get((namespace, pod), ())

    def holders(self) -> dict[str, tuple[str, str]]:
        """GPU UUID → (namespace, pod) holding it."""
        return {g: (ns, p) for (ns, p, _c), gpus in self._by_container.items() for g in gpus}
