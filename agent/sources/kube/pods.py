"""Which pods are engines, where to scrape them, and their versions (pure: no I/O, no clock).

A pod is an engine when it is annotated ``infercost.io/scrape: "true"`` (or matches the configured
label selector), is running and has an IP. Annotations:

- ``infercost.io/port``: the port of ``/metrics`` (default: the pod's port named ``metrics``, else its
  first declared port);
- ``infercost.io/path``: the page's path (default ``/metrics``);
- ``infercost.io/engine``: ``vllm``, ``sglang``, ``tgi``, ``triton``, ``trtllm``, ``llamacpp`` or ``auto``;
- ``infercost.io/name``: the engine name (default: the Deployment / DaemonSet name, else the pod name).

SSRF limit: the scrape URL is always ``http://<the pod's own IP>:<port><path>`` where the port is one
the pod declares (``containerPort``) or one the config allows; a path that is not a plain absolute
path is refused. What an annotation names is checked, never trusted. The pod's IP comes from the
API server (i.e. from whoever can write a pod's status) and is checked too: a link-local address
(169.254.0.0/16 holds the cloud metadata service, fe80::/10), a loopback address (the node's own
services; unless ``kubernetes.allow_loopback``), a multicast, unspecified or reserved address, or
one of those written as IPv6 (``::ffff:169.254.169.254``, NAT64 ``64:ff9b::``) is refused
(:func:`address_refusal`).

Versions: the model version is the first of the configured pod labels present (default
``app.kubernetes.io/version``), else the engine container's image tag; the engine version is the
running image and its digest from ``status.containerStatuses``.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, get_args
from urllib.parse import urlsplit

from agent.config import ENGINE_ROLES, EngineKind, KubernetesConfig, clean_label_value

ANN = "infercost.io/"
KINDS = frozenset(get_args(EngineKind))
_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")  # the engine-name pattern of the config
# A path is printable ASCII without spaces, '\', '#' or '?'-less tricks: it must start with one '/'.
_PATH = re.compile(r"^/(?!/)[\x21-\x7e]{0,1023}$")


# IPv6 forms that reach an IPv4 address: NAT64's well-known prefix (RFC 6052) and the deprecated
# IPv4-compatible ::a.b.c.d; IPv4-mapped ::ffff:a.b.c.d is ipaddress's own ipv4_mapped.
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_COMPAT = ipaddress.IPv6Network("::/96")
_THIS_NETWORK = ipaddress.IPv4Network("0.0.0.0/8")  # Linux connects 0.x.x.x to the local host


class PodRefused(Exception):
    """A pod selected as an engine whose annotations cannot be used; the message says why."""


@dataclass(frozen=True, slots=True)
class EnginePod:
    """One engine pod on this node, ready to scrape."""

    namespace: str
    pod: str
    workload: str  # engine name before collisions are resolved (annotation, owner or pod name)
    kind: str  # an EngineKind
    url: str  # http://<pod IP>:<port><path>
    container: str  # the container serving the page
    model_version: str | None  # from the pod's labels, else the image tag
    image: str | None  # the running image of that container (status), e.g. vllm/vllm-openai:v0.9.0
    image_digest: str | None  # sha256:… of the running image, when the runtime reports it
    # who pays: the pod's values of kubernetes.cost_labels (sanitised, capped), as (key, value)
    cost_labels: tuple[tuple[str, str], ...] = ()
    role: str | None = None  # prefill / decode / both from kubernetes.role_label; None: not labelled
    group: str = ""  # multi-node group (kubernetes.group_label); "" for a single-pod engine
    group_leader: bool = True  # worker index "0" (or none): the pod that counts the group's tokens

    @property
    def engine_version(self) -> str | None:
        """The engine build: image and digest (a re-pushed tag is a new build)."""
        if self.image is None:
            return None
        return f"{self.image}@{self.image_digest}" if self.image_digest else self.image


def _ipv4_behind(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for (mapped, NAT64, compatible), else None."""
    if isinstance(addr, ipaddress.IPv4Address):
        return None
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr in _NAT64 or (addr in _COMPAT and int(addr) > 1):  # :: and ::1 are IPv6's own
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return None


def address_refusal(ip: str, allow_loopback: bool = False) -> str | None:
    """Why ``ip`` (a pod's IP from the API) is no scrape target, None when it is one."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return "it is not an IP address"
    v4 = _ipv4_behind(addr)
    seen = v4 if v4 is not None else addr
    also = f" (IPv4 {v4} written as IPv6)" if v4 is not None else ""
    if seen.is_link_local:
        return f"a link-local address{also} (the cloud metadata service lives there) is never scraped"
    if seen.is_loopback and allow_loopback:
        return None
    if seen.is_loopback:
        return (
            f"a loopback address{also} is the node's own, not a pod's; "
            "fix: set kubernetes.allow_loopback: true only where engines really run on loopback"
        )
    if seen.is_multicast:
        return f"a multicast address{also} is no pod"
    if seen.is_unspecified or seen in _THIS_NETWORK:
        return f"an unspecified address{also} reaches the node itself"
    if seen.is_reserved:
        return f"a reserved address{also} is no pod"
    return None


def _get(obj: Any, *path: str) -> Any:
    """Attribute path on a lightkube model or key path on a plain dict (None when absent)."""
    cur = obj
    for p in path:
        if cur is None:
            return None
        cur = cur.get(p) if isinstance(cur, Mapping) else getattr(cur, p, None)
    return cur


def image_tag(image: str | None) -> str | None:
    """The tag of an image reference (``repo:tag`` or ``repo:tag@sha256:…``), None without one."""
    if not image:
        return None
    ref = image.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    return last.rsplit(":", 1)[1] if ":" in last else None


def _digest(image_id: str | None) -> str | None:
    if image_id and "@" in image_id:
        return image_id.rsplit("@", 1)[1]
    if image_id and image_id.startswith("sha256:"):
        return image_id
    return None


def workload_name(pod: Any) -> str:
    """A name that survives rollouts: ``infercost.io/name``, the Deployment or DaemonSet, else the pod."""
    name = str(_get(pod, "metadata", "name") or "")
    ann = _get(pod, "metadata", "annotations") or {}
    if ann.get(ANN + "name"):
        return str(ann[ANN + "name"])
    labels = _get(pod, "metadata", "labels") or {}
    for ref in _get(pod, "metadata", "ownerReferences") or ():
        kind, owner = _get(ref, "kind"), str(_get(ref, "name") or "")
        if kind == "ReplicaSet":
            h = labels.get("pod-template-hash")
            return owner[: -len(h) - 1] if h and owner.endswith("-" + h) else owner
        if kind == "DaemonSet":
            return owner
    return name


def is_selected(pod: Any, cfg: KubernetesConfig) -> bool:
    """Whether the pod is meant to be an engine (selection only; its annotations are checked later)."""
    ann = _get(pod, "metadata", "annotations") or {}
    flag = str(ann.get(ANN + "scrape", "")).lower()
    if flag == "false":
        return False
    if cfg.label_selector:
        labels = _get(pod, "metadata", "labels") or {}
        if all(labels.get(k) == v for k, v in cfg.label_selector.items()):
            return True
    return cfg.annotations and flag == "true"


def _declared_ports(pod: Any) -> list[tuple[str, int, str | None]]:
    """(container, port, port name) for every containerPort the pod declares."""
    out: list[tuple[str, int, str | None]] = []
    for c in _get(pod, "spec", "containers") or ():
        for p in _get(c, "ports") or ():
            port = _get(p, "containerPort")
            if isinstance(port, int):
                out.append((str(_get(c, "name")), port, _get(p, "name")))
    return out


def _scrape_port(pod: Any, ann: Mapping[str, str], cfg: KubernetesConfig) -> tuple[int, str | None]:
    """The port to scrape (the annotation's, else the declared ``metrics`` port, else the first
    declared one) and the container declaring it; raises :class:`PodRefused` naming what is wrong."""
    declared = _declared_ports(pod)
    raw_port = ann.get(ANN + "port")
    container: str | None = None
    if raw_port is not None:
        try:
            port = int(str(raw_port).strip())
        except ValueError:
            raise PodRefused(f"annotation {ANN}port {raw_port!r} is not a port number (1-65535)") from None
        if not 1 <= port <= 65535:
            raise PodRefused(f"annotation {ANN}port {raw_port!r} is not a port number (1-65535)")
    elif declared:
        named = [d for d in declared if d[2] == "metrics"]
        port = (named or declared)[0][1]
    else:
        raise PodRefused(f"no {ANN}port annotation and no declared containerPort to scrape")
    owners = [c for c, p, _n in declared if p == port]
    if owners:
        container = owners[0]
    elif port not in cfg.allowed_ports:
        raise PodRefused(
            f"refused scrape target port {port}: the pod declares no such containerPort "
            "(add it to the pod's ports or to kubernetes.allowed_ports)"
        )
    return port, container


def engine_pod(pod: Any, cfg: KubernetesConfig) -> EnginePod | None:
    """The engine a selected pod is, None while it is not running with an IP yet.

    Raises :class:`PodRefused` naming what is wrong (bad port, unknown kind, a target outside the
    pod) so the caller logs it once and skips the pod.
    """
    meta_ns = str(_get(pod, "metadata", "namespace") or "")
    meta_name = str(_get(pod, "metadata", "name") or "")
    ann: Mapping[str, str] = _get(pod, "metadata", "annotations") or {}
    ip = _get(pod, "status", "podIP")
    if _get(pod, "status", "phase") != "Running" or not ip:
        return None
    why = address_refusal(str(ip), cfg.allow_loopback)
    if why is not None:
        raise PodRefused(f"refused pod IP {str(ip)[:64]!r}: {why}")
    kind = str(ann.get(ANN + "engine", "auto")).strip().lower()
    if kind not in KINDS:
        raise PodRefused(f"annotation {ANN}engine {ann.get(ANN + 'engine')!r} is not one of {sorted(KINDS)}")
    name = workload_name(pod)
    if not _NAME.match(name):
        raise PodRefused(f"engine name {name!r} must match [A-Za-z0-9_.:-]{{1,128}} (set {ANN}name)")
    port, container = _scrape_port(pod, ann, cfg)
    path = str(ann.get(ANN + "path", cfg.default_path)).strip()
    if not _PATH.match(path) or "\\" in path or "#" in path:
        raise PodRefused(f"refused scrape target path {path!r}: it must be an absolute path such as /metrics")
    url = f"http://{_host(str(ip))}:{port}{path}"
    parts = urlsplit(url)
    if parts.hostname != str(ip).lower() or parts.port != port or parts.username or parts.password:
        raise PodRefused(f"refused scrape target {url!r}: it is not the pod's own address {ip}:{port}")
    containers = list(_get(pod, "spec", "containers") or ())
    if container is None and containers:
        container = str(_get(containers[0], "name"))
    spec_image = next((_get(c, "image") for c in containers if _get(c, "name") == container), None)
    status = next(
        (s for s in _get(pod, "status", "containerStatuses") or () if _get(s, "name") == container), None
    )
    image = _get(status, "image") or spec_image
    labels: Mapping[str, str] = _get(pod, "metadata", "labels") or {}
    version = next((labels[k] for k in cfg.version_labels if labels.get(k)), None) or image_tag(spec_image)
    role = str(labels.get(cfg.role_label, "")).strip().lower()
    group = clean_label_value(labels.get(cfg.group_label, ""))
    worker = str(labels.get(cfg.worker_index_label, "0")).strip()
    return EnginePod(
        cost_labels=cost_labels_of(labels, cfg),
        role=role if role in ENGINE_ROLES else None,
        group=group,
        group_leader=not group or worker == "0",
        namespace=meta_ns,
        pod=meta_name,
        workload=name,
        kind=kind,
        url=url,
        container=container or "",
        model_version=version,
        image=image,
        image_digest=_digest(_get(status, "imageID")),
    )


def cost_labels_of(labels: Mapping[str, str], cfg: KubernetesConfig) -> tuple[tuple[str, str], ...]:
    """The pod's values of ``kubernetes.cost_labels`` (those it carries), sanitised and capped
    (:func:`agent.config.clean_label_value`): a pod's labels are whoever deploys it's text."""
    return tuple((k, clean_label_value(labels[k])) for k in cfg.cost_labels if k in labels)


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


def _in_group(name: str, pod: EnginePod) -> bool:
    """Whether ``name`` is one of the slots of ``pod``'s workload (see :func:`engine_names`)."""
    for base in (pod.workload, f"{pod.namespace}.{pod.workload}"):
        if name == base or (name.startswith(base + ":") and name[len(base) + 1 :].isdigit()):
            return True
    return False


def engine_names(
    pods: Sequence[EnginePod], before: Mapping[tuple[str, str], str] | None = None
) -> dict[tuple[str, str], str]:
    """(namespace, pod) → engine name: the workload name for its first replica on this node, then
    ``workload:2``, ``workload:3`` … for the replicas beside it; a workload of the same name in a
    second namespace is ``namespace.workload`` (and ``namespace.workload:2`` …). Every name is unique.

    Names are slots, and they stick: a pod keeps the name ``before`` gave it for as long as it
    lives, and a new pod takes its workload's lowest free slot. Why: an engine's name keys its
    history, baselines and deploy record, so a second replica landing on the node must not rename
    the first (that would cut its history at every scale-up), and a rollout's replacement pod takes
    over the slot of the pod it replaces (the same model version, served from the same place).
    """
    before = before or {}
    out: dict[tuple[str, str], str] = {}
    by_key = {(p.namespace, p.pod): p for p in pods}
    taken: set[str] = set()
    base_of: dict[tuple[str, str], str] = {}  # (namespace, workload) → the base of its slot names
    for key, name in before.items():  # the living keep their names (while still their workload's)
        pod = by_key.get(key)
        if pod is not None and name not in taken and _in_group(name, pod):
            out[key] = name
            taken.add(name)
            base_of.setdefault((pod.namespace, pod.workload), name.split(":")[0])
    owners = {base: group for group, base in base_of.items()}
    for p in sorted(pods, key=lambda p: (p.workload, p.namespace, p.pod)):
        key = (p.namespace, p.pod)
        if key in out:
            continue
        group = (p.namespace, p.workload)
        if group not in base_of:
            base = p.workload if owners.get(p.workload, group) == group else f"{p.namespace}.{p.workload}"
            base_of[group] = base
            owners[base] = group
        base = base_of[group]
        slot, name = 1, base
        while name in taken:
            slot += 1
            name = f"{base}:{slot}"
        out[key] = name
        taken.add(name)
    return out
