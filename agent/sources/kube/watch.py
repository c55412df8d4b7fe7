"""The pods on this node, followed through the Kubernetes API (lightkube): list, then watch.

One loop per watched namespace (or one for all): list the pods with the field selector
``spec.nodeName=<node>`` (and the label selector, when configured), remember the list's
``resourceVersion``, then watch from it. ADDED/MODIFIED/DELETED update the set as they arrive; a
watch the server ends is resumed from the last version; ``410 Gone`` (the version is too old) means
a fresh list; any other failure (API server down, token refused) keeps the last known pods, logs one
warning per outage and retries with exponential backoff.

Each change reaches ``on_pod`` as that one pod (``None`` when it is gone), so an event costs the same
on a node of five pods or five thousand; after a list every listed pod is passed on (the receiver
keeps what did not change) and every known pod the list lacks is passed on as gone, yielding to the
event loop between pages and every :data:`YIELD_EVERY` pods so ``/metrics`` keeps answering through
a large list.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from lightkube import AsyncClient, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.core.exceptions import ConfigError as LightkubeConfigError
from lightkube.resources.core_v1 import Pod

from agent.config import ConfigError, KubernetesConfig

logger = logging.getLogger(__name__)

ALL_NAMESPACES = "*"
PodKey = tuple[str, str]  # (namespace, name)
OnPod = Callable[[PodKey, Any], None]  # (namespace, name), the pod or None when it is gone
# Why 500: kubectl's own page size (--chunk-size); a page of 500 pods decodes in milliseconds, so a
# node with thousands of pods is listed in several short steps instead of one long one.
LIST_CHUNK = 500
# Why 50: decoding a pod and checking it take tens of microseconds on an idle core (ten times that
# on a busy one), so 50 of them hold the event loop for milliseconds, not the 200 ms a /metrics
# read may wait, before the scrapes and /metrics get their turn.
YIELD_EVERY = 50


def make_client(cfg: KubernetesConfig) -> AsyncClient:
    """A lightkube client: the configured kubeconfig file, else in-cluster (service-account token
    and CA), else $KUBECONFIG or ~/.kube/config.

    Raises :class:`~agent.config.ConfigError` (exit 2) when there is neither: the message says
    where it looked and how to fix it."""
    try:
        config = KubeConfig.from_file(cfg.kubeconfig) if cfg.kubeconfig is not None else KubeConfig.from_env()
        return AsyncClient(config, trust_env=False)
    # lightkube raises its ConfigError for a missing file, and asserts on an incomplete kubeconfig
    except (LightkubeConfigError, OSError, ValueError, KeyError, TypeError, AssertionError) as err:
        where = (
            f"kubernetes.kubeconfig {cfg.kubeconfig}"
            if cfg.kubeconfig
            else (
                "the in-cluster service account (/var/run/secrets/kubernetes.io/serviceaccount) and "
                "$KUBECONFIG / ~/.kube/config"
            )
        )
        raise ConfigError(
            f"kubernetes.enabled is true but no usable API credentials in {where}: {err}; fix: run the agent "
            "in a pod with its service-account token mounted, set kubernetes.kubeconfig, or set "
            "kubernetes.enabled: false"
        ) from None


def _key(pod: Any) -> PodKey:
    return (str(pod.metadata.namespace), str(pod.metadata.name))


def _ignore(_key: PodKey, _pod: Any) -> None:
    """The default ``on_pod``: nobody listens."""


class PodWatcher:
    """The current pods of one node; ``on_pod(key, pod)`` is called for every pod that changed
    (``pod`` is None when it is gone)."""

    def __init__(
        self,
        cfg: KubernetesConfig,
        node: str,
        client: AsyncClient,
        on_pod: OnPod = _ignore,
    ) -> None:
        self.cfg = cfg
        self.node = node
        self.client = client
        self.on_pod = on_pod
        self._pods: dict[str, dict[PodKey, Any]] = {}  # namespace loop → its pods
        self.synced = asyncio.Event()  # set once every loop has listed successfully
        self._listed: set[str] = set()
        self.lists = 0  # full lists done (the first, then after 410 or an outage)

    def pods(self) -> list[Any]:
        """Every known pod (lightkube ``Pod`` models)."""
        return [p for pods in self._pods.values() for p in pods.values()]

    def _scopes(self) -> list[str]:
        return list(self.cfg.namespaces) or [ALL_NAMESPACES]

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the pods until ``stop`` is set."""
        async with asyncio.TaskGroup() as tg:
            for ns in self._scopes():
                tg.create_task(self._follow(ns, stop))

    async def _follow(self, ns: str, stop: asyncio.Event) -> None:
        task = asyncio.ensure_future(self._list_and_watch(ns))
        stopper = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (task, stopper):
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t

    async def _list_and_watch(self, ns: str) -> None:
        fields: dict[str, Any] = {"spec.nodeName": self.node}
        labels: dict[str, Any] | None = dict(self.cfg.label_selector) or None
        backoff = self.cfg.backoff_min_seconds
        failing = False
        while True:
            try:
                listing = self.client.list(
                    Pod, namespace=ns, fields=fields, labels=labels, chunk_size=LIST_CHUNK
                )
                pods = await self._listed_pods(listing)
                rv = listing.resourceVersion
                await self._resync(ns, pods)
                self.lists += 1
                self._listed.add(ns)
                if len(self._listed) == len(self._scopes()):
                    self.synced.set()
                if failing:
                    logger.info("kubernetes API answering again: %d pod(s) on node %s", len(pods), self.node)
                failing = False
                backoff = self.cfg.backoff_min_seconds
                events = 0
                async for event, pod in self.client.watch(
                    Pod, namespace=ns, fields=fields, labels=labels, resource_version=rv
                ):
                    if event in ("ADDED", "MODIFIED"):
                        pods[_key(pod)] = pod
                        self.on_pod(_key(pod), pod)
                    elif event == "DELETED":
                        pods.pop(_key(pod), None)
                        self.on_pod(_key(pod), None)
                    else:
                        continue  # BOOKMARK: only moves the resourceVersion (lightkube keeps it)
                    events += 1
                    if events % YIELD_EVERY == 0:
                        await asyncio.sleep(0)  # a burst already buffered would not yield by itself
            except ApiError as err:
                if err.status.code == 410:
                    logger.info("pod watch expired (410 Gone): listing the node's pods again")
                    continue
                failing = self._log_outage(failing, f"{err.status.code} {err.status.message}")
            except asyncio.CancelledError:
                raise
            except Exception as err:  # connection refused, TLS, a garbled stream: keep the last pods
                failing = self._log_outage(failing, f"{type(err).__name__}: {err}")
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.cfg.backoff_max_seconds)

    @staticmethod
    async def _listed_pods(listing: Any) -> dict[PodKey, Any]:
        """The pods of a list, page by page (the loop runs between pages and every few pods)."""
        pods: dict[PodKey, Any] = {}
        async for p in listing:
            pods[_key(p)] = p
            if len(pods) % YIELD_EVERY == 0:
                await asyncio.sleep(0)
        return pods

    async def _resync(self, ns: str, pods: dict[PodKey, Any]) -> None:
        """Take a fresh list of ``ns``: pass on every listed pod, and the known ones it lacks as gone."""
        old = self._pods.get(ns, {})
        self._pods[ns] = pods
        done = 0
        for key, pod in pods.items():
            self.on_pod(key, pod)
            done += 1
            if done % YIELD_EVERY == 0:
                await asyncio.sleep(0)
        for key in [k for k in old if k not in pods]:
            self.on_pod(key, None)
            done += 1
            if done % YIELD_EVERY == 0:
                await asyncio.sleep(0)

    def _log_outage(self, failing: bool, why: str) -> bool:
        if not failing:
            logger.warning(
                "kubernetes API unavailable (%s): keeping the last %d known pod(s), retrying with backoff",
                why,
                len(self.pods()),
            )
        return True
