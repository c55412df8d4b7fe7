"""A local HTTP server that answers like the Kubernetes API server for pods (list + watch).

Real wire format: ``GET /api/v1/pods`` (or ``/api/v1/namespaces/NS/pods``) returns a ``PodList``
with ``metadata.resourceVersion``; with ``watch=true`` it streams one JSON watch event per line
(``{"type": "ADDED", "object": {...}}``), and an expired version is an ``ERROR`` event carrying a
``Status`` with code 410, as the API server sends it. Tests script what each request gets.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

TOKEN = "test-service-account-token"


def write_kubeconfig(path: Path, server: str, token: str = TOKEN) -> Path:
    """A kubeconfig file (as kubectl writes it) for a bearer-token user of ``server``."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server}}],
        "users": [{"name": "infercost", "user": {"token": token}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "infercost"}}],
        "current-context": "local",
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def pod(
    name: str,
    *,
    namespace: str = "llm",
    node: str = "gpu-node-1",
    ip: str | None = "10.244.1.17",
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    image: str = "docker.io/vllm/vllm-openai:v0.8.4",
    digest: str = "sha256:" + "a" * 64,
    ports: tuple[tuple[str, int], ...] = (("http", 8000),),
    owner: tuple[str, str] | None = None,
    phase: str = "Running",
    rv: str = "1000",
    container: str = "vllm",
) -> dict[str, Any]:
    """A Pod object as the API server returns it (the fields infercost reads and their neighbours)."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{namespace}-{name}",
        "resourceVersion": rv,
        "creationTimestamp": "2026-11-30T10:00:00Z",
        "labels": dict(labels or {}),
        "annotations": dict(annotations or {}),
    }
    if owner is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": owner[0],
                "name": owner[1],
                "uid": "uid-owner",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    status: dict[str, Any] = {"phase": phase, "qosClass": "Guaranteed", "hostIP": "192.168.0.11"}
    if ip is not None:
        status["podIP"] = ip
        status["podIPs"] = [{"ip": ip}]
        status["containerStatuses"] = [
            {
                "name": container,
                "image": image,
                "imageID": image.split(":")[0] + "@" + digest,
                "containerID": "containerd://" + "c" * 64,
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": "2026-11-30T10:00:05Z"}},
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeName": node,
            "restartPolicy": "Always",
            "serviceAccountName": "default",
            "containers": [
                {
                    "name": container,
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "ports": [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in ports],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
        "status": status,
    }


def gone_event(rv: str) -> dict[str, Any]:
    """The ERROR event an API server streams when the watched resourceVersion is too old."""
    return {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f"too old resource version: {rv} (2000)",
            "reason": "Expired",
            "code": 410,
        },
    }


def _json(doc: dict[str, Any], status: int) -> web.Response:
    # exactly "application/json", as the API server sends it (clients key their error decoding on it)
    return web.Response(
        body=json.dumps(doc).encode(), status=status, headers={"Content-Type": "application/json"}
    )


class FakeKubeApi:
    """Pods of a cluster behind a local API endpoint.

    ``pods`` is the current state (what a list returns). :meth:`emit` changes it and streams the
    event to the open watch (an ``ERROR`` event ends that watch, as the API server does).
    ``fail_lists`` > 0 makes that many lists answer 503 (an API-server outage).
    """

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.rv = 1000
        self.fail_lists = 0
        self.requests: list[dict[str, str]] = []  # query of every request, in order
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

    def _apply(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        if kind == "DELETED":
            self.pods.pop(key, None)
        else:
            self.pods[key] = obj
        return obj

    def put(self, obj: dict[str, Any]) -> None:
        """Create or replace a pod without telling any watch (state before the first list)."""
        self._apply("ADDED", obj)

    def emit(self, kind: str, obj: dict[str, Any]) -> None:
        """ADDED / MODIFIED / DELETED a pod now, or ERROR with a Status object (see :func:`gone_event`)."""
        if kind == "ERROR":
            self._events.put_nowait({"type": "ERROR", "object": obj})
        else:
            self._events.put_nowait({"type": kind, "object": self._apply(kind, obj)})

    async def start(self, port: int = 0) -> str:
        """Listen on a loopback port (default: a free one); return the base URL."""
        app = web.Application()
        app.router.add_get("/api/v1/pods", self._handle)
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port, reuse_address=True)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        """Close every stream and stop listening."""
        self._events.put_nowait(None)
        if self._runner is not None:
            await self._runner.cleanup()

    def _selected(self, request: web.Request, obj: dict[str, Any]) -> bool:
        ns = request.match_info.get("ns")
        if ns and obj["metadata"]["namespace"] != ns:
            return False
        fs = request.query.get("fieldSelector", "")
        for term in filter(None, fs.split(",")):
            k, _, v = term.partition("=")
            if k == "spec.nodeName" and obj["spec"].get("nodeName") != v:
                return False
        ls = request.query.get("labelSelector", "")
        for term in filter(None, ls.split(",")):
            k, _, v = term.partition("=")
            if obj["metadata"]["labels"].get(k) != v:
                return False
        return True

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(dict(request.query))
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            unauthorized = {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": "Unauthorized",
                "reason": "Unauthorized",
                "code": 401,
            }
            return _json(unauthorized, 401)
        if request.query.get("watch") in ("true", "1"):
            return await self._watch(request)
        if self.fail_lists > 0:
            self.fail_lists -= 1
            status = {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": "the server is currently unable to handle the request",
                "reason": "ServiceUnavailable",
                "code": 503,
            }
            return _json(status, 503)
        items = [copy.deepcopy(p) for p in self.pods.values() if self._selected(request, p)]
        body = {
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": str(self.rv)},
            "items": items,
        }
        return _json(body, 200)

    async def _watch(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        while True:
            ev = await self._events.get()
            if ev is None:
                self._events.put_nowait(None)  # every other open watch ends too
                return resp
            if ev["type"] != "ERROR" and not self._selected(request, ev["object"]):
                continue
            await resp.write((json.dumps(ev) + "\n").encode())
            if ev["type"] == "ERROR":
                return resp
