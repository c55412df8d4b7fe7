"""The engines of this node on Kubernetes: discovered pods + kubelet GPUs + the static config.

:class:`KubeEngines` is what the daemon asks for its engine list at every tick. It combines:

- the engine pods the :class:`~agent.sources.kube.watch.PodWatcher` follows (see ``pods.py`` for
  the annotations and the SSRF limits);
- the GPUs each pod holds, from the kubelet's pod-resources socket (``podresources.py``); when the
  socket is absent or refuses, the GPUs of a static engine of the same name apply (one warning);
- the static ``engines:`` of the config: an engine there with a discovered engine's name lends it
  its settings (GPUs, weights and KV shape, model name); the others are scraped as configured.

A pod with unusable annotations is skipped with one log line naming it (again only if its reason
changes). GPUs held by pods that are not engines are reported by :meth:`KubeEngines.gpu_holders`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from agent.config import Config, EngineConfig
from agent.records import DeployEvent
from agent.sources.kube.podresources import GpuMap
from agent.sources.kube.pods import ANN, EnginePod, PodRefused, engine_names, engine_pod, is_selected
from agent.sources.kube.watch import PodWatcher, make_client

logger = logging.getLogger(__name__)


class EngineVersionStore(Protocol):
    """Where engine builds are remembered (:class:`agent.store.Store`)."""

    def note_engine_version(self, node: str, engine: str, version: str, at: float) -> DeployEvent | None:
        """Remember a build; a change is returned as an engine deploy."""


@dataclass(frozen=True, slots=True)
class GpuHolder:
    """A GPU held by a pod that is not scraped: its cost stays that pod's."""

    gpu: str  # GPU or MIG device UUID
    namespace: str
    pod: str


class KubeEngines:
    """Engines from the Kubernetes API for the daemon (see the module docstring)."""

    def __init__(
        self,
        cfg: Config,
        watcher: PodWatcher | None = None,
        gpu_map: GpuMap | None = None,
        on_engine_version: Callable[[str, str], object] | None = None,
    ) -> None:
        """``on_engine_version(engine, image@digest)`` is called when a discovered engine's build is
        first seen or changes (the store turns a change into an engine deploy)."""
        k = cfg.kubernetes
        self.cfg = cfg
        self.node = k.node_name or cfg.node
        self.watcher = watcher or PodWatcher(k, self.node, make_client(k), self._changed)
        self.watcher.on_change = self._changed
        if gpu_map is None and k.pod_resources_socket is not None:
            gpu_map = GpuMap(k.pod_resources_socket)
        self.gpu_map = gpu_map
        self._static = {e.name: e for e in cfg.engines}
        self._refused: dict[tuple[str, str], str] = {}
        self._pods: dict[str, EnginePod] = {}  # engine name → pod
        self._engines: tuple[EngineConfig, ...] = tuple(cfg.engines)
        self._no_gpu_logged: set[str] = set()
        self._on_engine_version = on_engine_version
        self._noted: dict[str, str] = {}  # engine → build last passed to on_engine_version
        self._holders_logged: dict[str, tuple[str, str]] = {}
        self.generation = 0  # bumps whenever the engine list may have changed

    # ---------------------------------------------------------------- the daemon's side
    def engines(self) -> tuple[EngineConfig, ...]:
        """The engines to scrape now (static ones until the first list)."""
        return self._engines

    def engine_versions(self) -> dict[str, str]:
        """engine name → engine build (image@digest) of the discovered engines."""
        return {n: p.engine_version for n, p in self._pods.items() if p.engine_version}

    def pods(self) -> Mapping[str, EnginePod]:
        """engine name → the pod behind it."""
        return dict(self._pods)

    def gpu_holders(self) -> list[GpuHolder]:
        """GPUs held (per the kubelet) by pods that are not engines."""
        if self.gpu_map is None:
            return []
        engine_pods = {(p.namespace, p.pod) for p in self._pods.values()}
        return [
            GpuHolder(g, ns, pod)
            for g, (ns, pod) in self.gpu_map.holders().items()
            if (ns, pod) not in engine_pods
        ]

    def gpu_pods(self) -> dict[str, tuple[str, str]]:
        """GPU UUID → (namespace, pod) for GPUs held by pods that are not engines (exported as
        ``infercost_gpu_pod_info``; one log line per new holder)."""
        out = {h.gpu: (h.namespace, h.pod) for h in self.gpu_holders()}
        for gpu, (ns, pod) in out.items():
            if self._holders_logged.get(gpu) != (ns, pod):
                logger.info(
                    "GPU %s is held by pod %s/%s, which is not scraped: its cost is that pod's", gpu, ns, pod
                )
        self._holders_logged = dict(out)
        return out

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the pods and refresh the GPU map until ``stop`` is set."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.watcher.run(stop))
            if self.gpu_map is not None:
                tg.create_task(self._gpu_loop(stop))

    async def _gpu_loop(self, stop: asyncio.Event) -> None:
        assert self.gpu_map is not None
        while not stop.is_set():
            before = dict(self.gpu_map.containers())
            await self.gpu_map.refresh()
            if dict(self.gpu_map.containers()) != before:
                self._changed()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.cfg.kubernetes.pod_resources_seconds)

    # ---------------------------------------------------------------- building the list
    def _changed(self) -> None:
        k = self.cfg.kubernetes
        found: list[EnginePod] = []
        seen: set[tuple[str, str]] = set()
        for pod in self.watcher.pods():
            if not is_selected(pod, k):
                continue
            key = (str(pod.metadata.namespace), str(pod.metadata.name))
            seen.add(key)
            try:
                ep = engine_pod(pod, k)
            except PodRefused as err:
                if self._refused.get(key) != str(err):
                    self._refused[key] = str(err)
                    logger.warning("pod %s/%s skipped: %s", key[0], key[1], err)
                continue
            self._refused.pop(key, None)
            if ep is not None:
                found.append(ep)
        for key in list(self._refused):
            if key not in seen:
                del self._refused[key]
        names = engine_names(found)
        pods = {names[(p.namespace, p.pod)]: p for p in found}
        engines = [self._engine(name, p) for name, p in sorted(pods.items())]
        engines += [e for n, e in self._static.items() if n not in pods]
        new = tuple(engines)
        if new != self._engines or pods != self._pods:
            added = sorted(set(pods) - set(self._pods))
            gone = sorted(set(self._pods) - set(pods))
            if added or gone:
                logger.info(
                    "engines on node %s: %s (added %s, gone %s)",
                    self.node,
                    ", ".join(sorted(pods)) or "none",
                    ", ".join(added) or "none",
                    ", ".join(gone) or "none",
                )
            self._pods = pods
            self._engines = new
            self.generation += 1
        self._note_versions()

    def record_builds_in(self, store: EngineVersionStore, now: Callable[[], float]) -> None:
        """Send each discovered engine's build to ``store`` from now on (a change is an engine deploy)."""

        def record(engine: str, build: str) -> None:
            event = store.note_engine_version(self.cfg.node, engine, build, now())
            if event is not None:
                logger.info("engine %s now runs %s (was %s)", engine, event.to_version, event.from_version)

        self._on_engine_version = record
        self._noted.clear()
        self._note_versions()

    def _note_versions(self) -> None:
        if self._on_engine_version is None:
            return
        for name, build in self.engine_versions().items():
            if self._noted.get(name) == build:
                continue
            try:
                self._on_engine_version(name, build)
            except Exception:
                logger.exception(
                    "could not record the build of engine %s; trying again at the next change", name
                )
                continue
            self._noted[name] = build

    def _engine(self, name: str, p: EnginePod) -> EngineConfig:
        k = self.cfg.kubernetes
        base = self._static.get(name)
        gpus: tuple[int | str, ...] = ()
        if self.gpu_map is not None and self.gpu_map.known:
            gpus = self.gpu_map.pod_gpus(p.namespace, p.pod)
        elif base is not None:
            gpus = base.gpus
        if (
            not gpus
            and name not in self._no_gpu_logged
            and self.gpu_map is not None
            and self.gpu_map.available
        ):
            self._no_gpu_logged.add(name)
            logger.info("engine %s (pod %s/%s) holds no GPU per the kubelet", name, p.namespace, p.pod)
        update = {
            "name": name,
            "kind": p.kind if p.kind != "auto" or base is None else base.kind,
            "url": p.url,
            "gpus": gpus,
            "model_version": p.model_version or (base.model_version if base is not None else None),
            "version_file": None,
        }
        if base is not None:
            return base.model_copy(update=update)
        return EngineConfig(timeout_seconds=k.timeout_seconds, max_bytes=k.max_bytes, **update)


def kube_engines(cfg: Config, store: EngineVersionStore | None, now: Callable[[], float]) -> KubeEngines:
    """The Kubernetes engine source for the daemon; engine builds go to ``store`` (engine deploys).

    Raises :class:`~agent.config.ConfigError` without API credentials (see ``make_client``)."""
    src = KubeEngines(cfg)
    if store is not None:
        src.record_builds_in(store, now)
    return src


SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


def describe(cfg: Config) -> str:
    """One line for ``infercost check``: where API credentials come from (no API call is made), the
    node whose pods are watched, how engines are chosen and the pod-resources socket's state.

    Raises :class:`~agent.config.ConfigError` when there are no credentials."""
    k = cfg.kubernetes
    make_client(k)
    if k.kubeconfig is not None:
        creds = f"kubeconfig {k.kubeconfig}"
    elif SERVICE_ACCOUNT_TOKEN.exists():
        creds = "the in-cluster service account"
    else:
        creds = "$KUBECONFIG / ~/.kube/config"
    chosen = [f'annotation {ANN}scrape: "true"'] if k.annotations else []
    if k.label_selector:
        chosen.append("labels " + ",".join(f"{a}={b}" for a, b in sorted(k.label_selector.items())))
    sock = k.pod_resources_socket
    if sock is None:
        gpus = "off (GPUs from engines:)"
    elif sock.exists():
        gpus = f"{sock} present"
    else:
        gpus = f"{sock} absent (GPUs from engines: until it appears)"
    loopback = "; pods at loopback IPs scraped (allow_loopback)" if k.allow_loopback else ""
    return (
        f"kubernetes: ok — pods of node {k.node_name or cfg.node} via {creds}; engines by "
        f"{' or '.join(chosen) or 'nothing (set annotations or label_selector)'}; pod-resources {gpus}"
        f"{loopback}"
    )
