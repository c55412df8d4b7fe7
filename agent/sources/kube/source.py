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

Each watch event updates only its own pod (an engine taken in, changed, removed or refused: one
short log line naming the pod); the engine list is rebuilt from the engines taken in when the daemon
next asks for it, never per event. At most ``kubernetes.max_engines`` pods are engines, in the order
they came; the ones beyond wait, are counted (:attr:`KubeEngines.over_cap`), named in one warning
when the cap is first reached, and take a place when an engine leaves.
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
from agent.sources.kube.watch import PodKey, PodWatcher, make_client

logger = logging.getLogger(__name__)

# Why 300: a refusal names the value it refused, and an annotation may hold up to 256 KiB; the line
# keeps enough to recognise the value, not a page of it.
REASON_CHARS = 300


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
        self.watcher = watcher or PodWatcher(k, self.node, make_client(k))
        self.watcher.on_pod = self._pod_changed
        if gpu_map is None and k.pod_resources_socket is not None:
            gpu_map = GpuMap(k.pod_resources_socket)
        self.gpu_map = gpu_map
        self._static = {e.name: e for e in cfg.engines}
        self._refused: dict[PodKey, str] = {}  # pod → why it is no engine (the reason last logged)
        self._taken: dict[PodKey, EnginePod] = {}  # the engine pods scraped (at most max_engines)
        self._waiting: dict[PodKey, EnginePod] = {}  # engine pods beyond the cap, oldest first
        self._cap_logged = False  # the cap was named in the log since pods last waited
        self._dirty = False  # the engine list must be rebuilt before it is handed out
        self._pods: dict[str, EnginePod] = {}  # engine name → pod
        self._names: dict[PodKey, str] = {}  # pod → engine name (its slot, kept while it lives)
        self._engines: tuple[EngineConfig, ...] = tuple(cfg.engines)
        self._no_gpu_logged: set[str] = set()
        self._on_engine_version = on_engine_version
        self._noted: dict[str, str] = {}  # engine → build last passed to on_engine_version
        self._holders_logged: dict[str, tuple[str, str]] = {}
        self.generation = 0  # bumps whenever the engine list may have changed

    # ---------------------------------------------------------------- the daemon's side
    def engines(self) -> tuple[EngineConfig, ...]:
        """The engines to scrape now (static ones until the first list)."""
        self._rebuild()
        return self._engines

    @property
    def over_cap(self) -> int:
        """Engine pods on this node beyond ``kubernetes.max_engines``, not scraped."""
        return len(self._waiting)

    def engine_versions(self) -> dict[str, str]:
        """engine name → engine build (image@digest) of the discovered engines."""
        self._rebuild()
        return {n: p.engine_version for n, p in self._pods.items() if p.engine_version}

    def pods(self) -> Mapping[str, EnginePod]:
        """engine name → the pod behind it."""
        self._rebuild()
        return dict(self._pods)

    def gpu_holders(self) -> list[GpuHolder]:
        """GPUs held (per the kubelet) by pods that are not engines."""
        if self.gpu_map is None:
            return []
        engine_pods = set(self._taken)
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
                self._dirty = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.cfg.kubernetes.pod_resources_seconds)

    # ---------------------------------------------------------------- one pod at a time
    def _pod_changed(self, key: PodKey, pod: object | None) -> None:
        """Take one pod's change (None: it is gone); the work does not grow with the node's pods."""
        ep = self._engine_pod(key, pod)
        if ep is None:
            self._drop(key)
        else:
            self._take(key, ep)

    def _engine_pod(self, key: PodKey, pod: object | None) -> EnginePod | None:
        """The engine ``pod`` is now, None when it is none (gone, not selected, pending, refused)."""
        k = self.cfg.kubernetes
        if pod is None or not is_selected(pod, k):
            self._refused.pop(key, None)
            return None
        try:
            ep = engine_pod(pod, k)
        except PodRefused as err:
            why = str(err)[:REASON_CHARS]
            if self._refused.get(key) != why:
                self._refused[key] = why
                logger.warning("pod %s/%s skipped: %s", key[0], key[1], why)
            return None
        self._refused.pop(key, None)
        return ep

    def _take(self, key: PodKey, ep: EnginePod) -> None:
        if key in self._taken:
            if self._taken[key] != ep:
                self._taken[key] = ep
                self._dirty = True
        elif key in self._waiting:
            self._waiting[key] = ep
        elif len(self._taken) < self.cfg.kubernetes.max_engines:
            self._admit(key, ep)
        else:
            self._waiting[key] = ep
            self._note_cap(key)

    def _admit(self, key: PodKey, ep: EnginePod) -> None:
        self._taken[key] = ep
        self._dirty = True
        logger.info("engine pod %s/%s added (%s)", key[0], key[1], ep.workload)

    def _drop(self, key: PodKey) -> None:
        if self._waiting.pop(key, None) is not None and not self._waiting:
            self._cap_logged = False
        if self._taken.pop(key, None) is None:
            return
        self._dirty = True
        logger.info("engine pod %s/%s removed", key[0], key[1])
        if self._waiting:
            first = next(iter(self._waiting))
            self._admit(first, self._waiting.pop(first))
            if not self._waiting:
                self._cap_logged = False

    def _note_cap(self, key: PodKey) -> None:
        """Name the cap once while pods wait beyond it (they are counted, not each logged)."""
        if self._cap_logged:
            return
        self._cap_logged = True
        logger.warning(
            "engine pods on node %s exceed kubernetes.max_engines (%d): pod %s/%s and any more wait, "
            "unscraped, for an engine to leave (counted in infercost_kube_engines_over_cap); fix: raise "
            "kubernetes.max_engines only if this node really runs that many GPU engines",
            self.node,
            self.cfg.kubernetes.max_engines,
            key[0],
            key[1],
        )

    # ---------------------------------------------------------------- building the list
    def _rebuild(self) -> None:
        """The engine list from the engines taken in, when something changed since the last one."""
        if not self._dirty:
            return
        self._dirty = False
        found = list(self._taken.values())
        names = self._names = engine_names(found, self._names)
        pods = {names[(p.namespace, p.pod)]: p for p in found}
        engines = [self._engine(name, p) for name, p in sorted(pods.items())]
        engines += [e for n, e in self._static.items() if n not in pods]
        new = tuple(engines)
        if new != self._engines or pods != self._pods:
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
        self._rebuild()
        self._note_versions()

    def _note_versions(self) -> None:
        if self._on_engine_version is None:
            return
        for name, p in self._pods.items():
            build = p.engine_version
            if build is None or self._noted.get(name) == build:
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
            "labels": {**(base.labels if base is not None else {}), **dict(p.cost_labels)},
            "role": p.role or (base.role if base is not None else "both"),
            "namespace": p.namespace,
            "pod": p.pod,
            "group": p.group,
            "group_leader": p.group_leader,
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
