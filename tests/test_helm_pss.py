"""The chart against the Pod Security Standards, with a small table-driven checker over pod specs.

The controls are those of the Pod Security Standards as of Kubernetes v1.37
(https://kubernetes.io/docs/concepts/security/pod-security-standards/), read control by control
against the admission plugin that enforces them, k8s.io/pod-security-admission (``policy/check_*.go``
on its v1.37 line): each control below carries that plugin's check ID, and a restricted control that
supersedes a baseline one says so (``replaces``), as the plugin's ``OverrideCheckIDs`` do. The
optional "non-root groups" control of the restricted table is not enforced by the plugin and is not
checked here.

The checker is tested on its own first: a minimal pod passes baseline and fails restricted on the
four controls the documentation names; a hardened pod passes both; and each control has a pod that
fails it and only it (and, where the documentation allows a value, a pod that uses it and passes).
Then it is applied to every pod template the chart renders through the real Helm engine: the
default render fails baseline on its hostPath volumes alone, and ``-f values-restricted.yaml`` passes
restricted in the DaemonSet and the fleet-report CronJob, every container and init container.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

helm = pytest.importorskip("helm_python")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

from test_helm import CHART, FULL, K8S, NAMESPACE, NON_ROOT, RELEASE  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PROFILE = CHART / "values-restricted.yaml"
BASELINE, RESTRICTED = "baseline", "restricted"
Obj = dict[str, Any]

# ------------------------------------------------------------------------------------------ allowed values
BASELINE_CAPABILITIES = frozenset(  # Docker's default set (the documentation's "default set")
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
SAFE_SYSCTLS = frozenset(  # namespaced and isolated from other pods on the node (v1.37 list)
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.ping_group_range",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
        "net.ipv4.tcp_rmem",
        "net.ipv4.tcp_wmem",
        "net.ipv4.tcp_slow_start_after_idle",
        "net.ipv4.tcp_notsent_lowat",
    }
)
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
CONFINED = frozenset({"RuntimeDefault", "Localhost"})  # seccomp and AppArmor profile types
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
# inline volume sources the restricted level allows (everything else, hostPath first, is refused)
RESTRICTED_VOLUMES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "image",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)


# ------------------------------------------------------------------------------------------ the checker
def _containers(spec: Obj) -> Iterator[Obj]:
    """Init containers, containers and ephemeral containers: every control covers all three."""
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(key) or []


def _sc(obj: Obj) -> Obj:
    return obj.get("securityContext") or {}


def _windows(spec: Obj) -> bool:
    """A Windows pod: exempt from the Linux-only restricted controls (v1.25+)."""
    return (spec.get("os") or {}).get("name") == "windows"


def _user_namespace(spec: Obj) -> bool:
    """``hostUsers: false``: uid 0 and /proc are the pod's own, which relaxes three controls (v1.35+)."""
    return spec.get("hostUsers") is False


def _named(bad: list[str]) -> list[str]:
    return sorted(set(bad))


def host_process(meta: Obj, spec: Obj) -> list[str]:
    """Windows HostProcess containers (privileged access to the node) on the pod or a container."""
    owners = [("pod", _sc(spec)), *((c["name"], _sc(c)) for c in _containers(spec))]
    return _named([n for n, sc in owners if (sc.get("windowsOptions") or {}).get("hostProcess") is True])


def host_namespaces(meta: Obj, spec: Obj) -> list[str]:
    """The node's network, PID or IPC namespace shared."""
    return [f"{k}=true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k) is True]


def privileged(meta: Obj, spec: Obj) -> list[str]:
    """Privileged containers."""
    return _named([c["name"] for c in _containers(spec) if _sc(c).get("privileged") is True])


def _added(c: Obj) -> list[str]:
    return list((_sc(c).get("capabilities") or {}).get("add") or [])


def capabilities_baseline(meta: Obj, spec: Obj) -> list[str]:
    """Capabilities added beyond the default set."""
    return _named(
        [f"{c['name']}:{a}" for c in _containers(spec) for a in _added(c) if a not in BASELINE_CAPABILITIES]
    )


def host_path_volumes(meta: Obj, spec: Obj) -> list[str]:
    """hostPath volumes."""
    return _named([v["name"] for v in spec.get("volumes") or [] if "hostPath" in v])


def host_ports(meta: Obj, spec: Obj) -> list[str]:
    """Host ports (0 = none)."""
    return _named(
        [
            f"{c['name']}:{p['hostPort']}"
            for c in _containers(spec)
            for p in c.get("ports") or []
            if p.get("hostPort")
        ]
    )


def app_armor(meta: Obj, spec: Obj) -> list[str]:
    """An AppArmor profile other than RuntimeDefault or Localhost (field or beta annotation)."""
    owners = [("pod", _sc(spec)), *((c["name"], _sc(c)) for c in _containers(spec))]
    bad = [
        n for n, sc in owners if "appArmorProfile" in sc and sc["appArmorProfile"].get("type") not in CONFINED
    ]
    for key, value in (meta.get("annotations") or {}).items():
        if (
            key.startswith(APPARMOR_ANNOTATION)
            and value not in ("", "runtime/default")
            and not value.startswith("localhost/")
        ):
            bad.append(key)
    return _named(bad)


def se_linux(meta: Obj, spec: Obj) -> list[str]:
    """An SELinux type outside the container types, or any SELinux user or role."""
    owners = [("pod", _sc(spec)), *((c["name"], _sc(c)) for c in _containers(spec))]
    bad = []
    for name, sc in owners:
        opts = sc.get("seLinuxOptions")
        if opts is not None and (
            opts.get("type", "") not in SELINUX_TYPES or opts.get("user") or opts.get("role")
        ):
            bad.append(name)
    return _named(bad)


def _unmasked_proc(spec: Obj) -> list[str]:
    return _named([c["name"] for c in _containers(spec) if _sc(c).get("procMount", "Default") != "Default"])


def proc_mount_baseline(meta: Obj, spec: Obj) -> list[str]:
    """An unmasked /proc, unless the pod has its own user namespace."""
    return [] if _user_namespace(spec) else _unmasked_proc(spec)


def proc_mount_restricted(meta: Obj, spec: Obj) -> list[str]:
    """An unmasked /proc, user namespace or not (v1.35+)."""
    return _unmasked_proc(spec)


def _seccomp_owners(spec: Obj) -> list[tuple[str, str | None]]:
    """(owner, seccomp profile type or None where unset) for the pod and each container."""
    return [
        (name, None if sc.get("seccompProfile") is None else sc["seccompProfile"].get("type", ""))
        for name, sc in [("pod", _sc(spec)), *((c["name"], _sc(c)) for c in _containers(spec))]
    ]


def seccomp_baseline(meta: Obj, spec: Obj) -> list[str]:
    """A seccomp profile set to anything but RuntimeDefault or Localhost (Unconfined)."""
    return _named([n for n, t in _seccomp_owners(spec) if t is not None and t not in CONFINED])


def sysctls(meta: Obj, spec: Obj) -> list[str]:
    """Sysctls outside the safe set."""
    return _named([s["name"] for s in _sc(spec).get("sysctls") or [] if s["name"] not in SAFE_SYSCTLS])


def host_probes(meta: Obj, spec: Obj) -> list[str]:
    """v1.34+: a probe or lifecycle hook may not aim at another host than the pod."""
    bad = []
    for c in _containers(spec):
        handlers = [c.get(p) for p in ("livenessProbe", "readinessProbe", "startupProbe")]
        handlers += [(c.get("lifecycle") or {}).get(h) for h in ("postStart", "preStop")]
        for h in filter(None, handlers):
            bad += [
                f"{c['name']}:{a['host']}"
                for a in (h.get("httpGet"), h.get("tcpSocket"))
                if a and a.get("host")
            ]
    return _named(bad)


def restricted_volumes(meta: Obj, spec: Obj) -> list[str]:
    """Volume sources other than the restricted level's list."""
    bad = []
    for v in spec.get("volumes") or []:
        source = [k for k in v if k != "name"]
        if not source or source[0] not in RESTRICTED_VOLUMES:
            bad.append(f"{v['name']}:{source[0] if source else 'unknown'}")
    return _named(bad)


def privilege_escalation(meta: Obj, spec: Obj) -> list[str]:
    """Must be set false on every container (unset allows escalation)."""
    if _windows(spec):
        return []
    return _named(
        [c["name"] for c in _containers(spec) if _sc(c).get("allowPrivilegeEscalation") is not False]
    )


def run_as_non_root(meta: Obj, spec: Obj) -> list[str]:
    """True on the pod (a container may leave it unset) or on every container; false nowhere."""
    if _user_namespace(spec):
        return []
    pod = _sc(spec).get("runAsNonRoot")
    bad = ["pod"] if pod is False else []
    for c in _containers(spec):
        mine = _sc(c).get("runAsNonRoot")
        if mine is False or (mine is None and pod is not True):
            bad.append(c["name"])
    return _named(bad)


def run_as_user(meta: Obj, spec: Obj) -> list[str]:
    """uid 0 on the pod or a container."""
    if _user_namespace(spec):
        return []
    owners = [("pod", _sc(spec)), *((c["name"], _sc(c)) for c in _containers(spec))]
    return _named([n for n, sc in owners if sc.get("runAsUser") == 0])


def seccomp_restricted(meta: Obj, spec: Obj) -> list[str]:
    """RuntimeDefault or Localhost on the pod (a container may leave it unset) or on every container."""
    if _windows(spec):
        return []
    (_, pod), *containers = _seccomp_owners(spec)
    bad = ["pod"] if pod is not None and pod not in CONFINED else []
    for name, t in containers:
        if (t is not None and t not in CONFINED) or (t is None and pod not in CONFINED):
            bad.append(name)
    return _named(bad)


def capabilities_restricted(meta: Obj, spec: Obj) -> list[str]:
    """Drop ALL, and add nothing but NET_BIND_SERVICE."""
    if _windows(spec):
        return []
    bad = []
    for c in _containers(spec):
        caps = _sc(c).get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            bad.append(f"{c['name']}:drop")
        bad += [f"{c['name']}:{a}" for a in caps.get("add") or [] if a != "NET_BIND_SERVICE"]
    return _named(bad)


@dataclass(frozen=True, slots=True)
class Control:
    """One control of the Pod Security Standards."""

    id: str  # the admission plugin's check ID
    level: str  # baseline or restricted (restricted includes every baseline control)
    title: str  # the control's name in the documentation
    check: Callable[[Obj, Obj], list[str]]  # (pod metadata, pod spec) → what breaks it; [] = passes
    replaces: str | None = None  # the baseline control this restricted one tightens


CONTROLS: tuple[Control, ...] = (
    Control("windowsHostProcess", BASELINE, "HostProcess", host_process),
    Control("hostNamespaces", BASELINE, "Host Namespaces", host_namespaces),
    Control("privileged", BASELINE, "Privileged Containers", privileged),
    Control("capabilities_baseline", BASELINE, "Capabilities", capabilities_baseline),
    Control("hostPathVolumes", BASELINE, "HostPath Volumes", host_path_volumes),
    Control("hostPorts", BASELINE, "Host Ports", host_ports),
    Control("hostProbesAndHostLifecycle", BASELINE, "Host Probes / Lifecycle Hooks", host_probes),
    Control("appArmorProfile", BASELINE, "AppArmor", app_armor),
    Control("seLinuxOptions", BASELINE, "SELinux", se_linux),
    Control("procMount", BASELINE, "/proc Mount Type", proc_mount_baseline),
    Control("seccompProfile_baseline", BASELINE, "Seccomp", seccomp_baseline),
    Control("sysctls", BASELINE, "Sysctls", sysctls),
    Control("restrictedVolumes", RESTRICTED, "Volume Types", restricted_volumes, "hostPathVolumes"),
    Control("allowPrivilegeEscalation", RESTRICTED, "Privilege Escalation", privilege_escalation),
    Control("runAsNonRoot", RESTRICTED, "Running as Non-root", run_as_non_root),
    Control("runAsUser", RESTRICTED, "Running as Non-root user", run_as_user),
    Control(
        "seccompProfile_restricted", RESTRICTED, "Seccomp", seccomp_restricted, "seccompProfile_baseline"
    ),
    Control(
        "capabilities_restricted",
        RESTRICTED,
        "Capabilities",
        capabilities_restricted,
        "capabilities_baseline",
    ),
    Control("procMount_restricted", RESTRICTED, "/proc Mount Type", proc_mount_restricted, "procMount"),
)


def controls(level: str) -> list[Control]:
    """The controls a level enforces: baseline's, or baseline's and restricted's less those replaced."""
    chosen = [c for c in CONTROLS if c.level == BASELINE or level == RESTRICTED]
    replaced = {c.replaces for c in chosen}
    return [c for c in chosen if c.id not in replaced]


def violations(meta: Obj, spec: Obj, level: str) -> dict[str, list[str]]:
    """Control ID → what breaks it, for the controls of ``level`` this pod fails ({} = it passes)."""
    return {c.id: bad for c in controls(level) if (bad := c.check(meta, spec))}


def pod_templates(obj: Obj) -> Iterator[tuple[str, Obj, Obj]]:
    """(where, pod metadata, pod spec) of each pod an object makes."""
    kind, name = obj["kind"], obj["metadata"]["name"]
    if kind == "Pod":
        yield f"Pod/{name}", obj["metadata"], obj["spec"]
    elif kind in ("DaemonSet", "Deployment", "StatefulSet", "ReplicaSet", "Job"):
        t = obj["spec"]["template"]
        yield f"{kind}/{name}", t.get("metadata") or {}, t["spec"]
    elif kind == "CronJob":
        t = obj["spec"]["jobTemplate"]["spec"]["template"]
        yield f"{kind}/{name}", t.get("metadata") or {}, t["spec"]


# ------------------------------------------------------------------------------------------ checker tests
MINIMAL: Obj = {"metadata": {"name": "minimal"}, "spec": {"containers": [{"name": "app", "image": "app:1"}]}}
HARDENED: Obj = {
    "metadata": {"name": "hardened", "annotations": {}},
    "spec": {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "initContainers": [
            {
                "name": "init",
                "image": "app:1",
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            }
        ],
        "containers": [
            {
                "name": "app",
                "image": "app:1",
                "ports": [{"containerPort": 8080}],
                "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080}},
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            }
        ],
        "volumes": [{"name": "cfg", "configMap": {"name": "cfg"}}, {"name": "tmp", "emptyDir": {}}],
    },
}

DELETE = object()


def edited(pod: Obj, edits: dict[str, Any]) -> Obj:
    """A copy of ``pod`` with each dotted path ("spec.containers.0.ports") set, created where missing,
    or removed where the value is DELETE."""
    out = copy.deepcopy(pod)
    for path, value in edits.items():
        *parents, last = path.split(".")
        node: Any = out
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
        if value is DELETE:
            del node[last]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return out


@dataclass(frozen=True, slots=True)
class Case:
    """HARDENED with ``edits``, and the controls it fails at each level."""

    name: str
    edits: dict[str, Any]
    baseline: frozenset[str]
    restricted: frozenset[str]


def case(name: str, edits: dict[str, Any], baseline: str = "", restricted: str | None = None) -> Case:
    """Control IDs space-separated; ``restricted`` defaults to what fails at baseline."""
    fails = frozenset(baseline.split())
    return Case(name, edits, fails, fails if restricted is None else frozenset(restricted.split()))


POD, APP, INIT = "spec.securityContext.", "spec.containers.0.", "spec.initContainers.0."
A, I = APP + "securityContext.", INIT + "securityContext."  # noqa: E741
PRIVATE = {"name": "tmp", "nfs": {"server": "nfs.example", "path": "/"}}
EPHEMERAL = [{"name": "debug", "image": "busybox", "securityContext": {"privileged": True}}]
# a failing example for every control, and beside it the allowed values the documentation names
CASES: list[Case] = [
    case("hardened", {}),
    case("pod hostProcess", {POD + "windowsOptions.hostProcess": True}, "windowsHostProcess"),
    case("init container hostProcess", {I + "windowsOptions.hostProcess": True}, "windowsHostProcess"),
    case("hostProcess false", {POD + "windowsOptions.hostProcess": False}),
    case("hostNetwork", {"spec.hostNetwork": True}, "hostNamespaces"),
    case("hostPID", {"spec.hostPID": True}, "hostNamespaces"),
    case("hostIPC", {"spec.hostIPC": True}, "hostNamespaces"),
    case("host namespaces false", {"spec.hostNetwork": False, "spec.hostPID": False, "spec.hostIPC": False}),
    case("privileged", {A + "privileged": True}, "privileged"),
    case("privileged init container", {I + "privileged": True}, "privileged"),
    case(
        "privileged ephemeral container",
        {"spec.ephemeralContainers": EPHEMERAL},
        "privileged",
        "privileged allowPrivilegeEscalation capabilities_restricted",
    ),
    case("privileged false", {A + "privileged": False}),
    case(
        "add SYS_ADMIN",
        {A + "capabilities.add": ["SYS_ADMIN"]},
        "capabilities_baseline",
        "capabilities_restricted",
    ),
    case(
        "add NET_RAW",
        {I + "capabilities.add": ["NET_RAW"]},
        "capabilities_baseline",
        "capabilities_restricted",
    ),
    case("add CHOWN, a default", {A + "capabilities.add": ["CHOWN"]}, "", "capabilities_restricted"),
    case("add NET_BIND_SERVICE", {A + "capabilities.add": ["NET_BIND_SERVICE"]}),
    case("no drop ALL", {A + "capabilities.drop": ["NET_RAW"]}, "", "capabilities_restricted"),
    case(
        "hostPath volume",
        {"spec.volumes.1": {"name": "tmp", "hostPath": {"path": "/tmp"}}},
        "hostPathVolumes",
        "restrictedVolumes",
    ),
    case("hostPort", {APP + "ports.0.hostPort": 8080}, "hostPorts"),
    case("hostPort 0", {APP + "ports.0.hostPort": 0}),
    case(
        "probe at a host",
        {APP + "livenessProbe.httpGet.host": "169.254.169.254"},
        "hostProbesAndHostLifecycle",
    ),
    case(
        "tcp probe at a host",
        {APP + "readinessProbe": {"tcpSocket": {"port": 8080, "host": "10.0.0.1"}}},
        "hostProbesAndHostLifecycle",
    ),
    case(
        "preStop at a host",
        {APP + "lifecycle.preStop.httpGet": {"port": 80, "host": "example.com"}},
        "hostProbesAndHostLifecycle",
    ),
    case("AppArmor Unconfined", {A + "appArmorProfile": {"type": "Unconfined"}}, "appArmorProfile"),
    case(
        "AppArmor annotation unconfined",
        {"metadata.annotations": {APPARMOR_ANNOTATION + "app": "unconfined"}},
        "appArmorProfile",
    ),
    case("AppArmor Localhost", {POD + "appArmorProfile": {"type": "Localhost", "localhostProfile": "p"}}),
    case(
        "AppArmor annotation runtime/default",
        {"metadata.annotations": {APPARMOR_ANNOTATION + "app": "runtime/default"}},
    ),
    case("SELinux type spc_t", {POD + "seLinuxOptions": {"type": "spc_t"}}, "seLinuxOptions"),
    case("SELinux user", {A + "seLinuxOptions": {"user": "system_u"}}, "seLinuxOptions"),
    case("SELinux role", {I + "seLinuxOptions": {"role": "system_r"}}, "seLinuxOptions"),
    case(
        "SELinux container_t and a level", {A + "seLinuxOptions": {"type": "container_t", "level": "s0:c1"}}
    ),
    case("procMount Unmasked", {A + "procMount": "Unmasked"}, "procMount", "procMount_restricted"),
    case(
        "procMount Unmasked, user namespace",
        {"spec.hostUsers": False, A + "procMount": "Unmasked"},
        "",
        "procMount_restricted",
    ),
    case("procMount Default", {A + "procMount": "Default"}),
    case(
        "seccomp Unconfined on the pod",
        {POD + "seccompProfile.type": "Unconfined"},
        "seccompProfile_baseline",
        "seccompProfile_restricted",
    ),
    case(
        "seccomp Unconfined on a container",
        {I + "seccompProfile": {"type": "Unconfined"}},
        "seccompProfile_baseline",
        "seccompProfile_restricted",
    ),
    case("seccomp unset", {POD + "seccompProfile": DELETE}, "", "seccompProfile_restricted"),
    case(
        "seccomp on each container only",
        {
            POD + "seccompProfile": DELETE,
            I + "seccompProfile.type": "RuntimeDefault",
            A + "seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"},
        },
    ),
    case("unsafe sysctl", {POD + "sysctls": [{"name": "kernel.msgmax", "value": "65536"}]}, "sysctls"),
    case("safe sysctls", {POD + "sysctls": [{"name": n, "value": "1"} for n in sorted(SAFE_SYSCTLS)]}),
    case("nfs volume", {"spec.volumes.1": PRIVATE}, "", "restrictedVolumes"),
    case(
        "gitRepo volume",
        {"spec.volumes.1": {"name": "tmp", "gitRepo": {"repository": "x"}}},
        "",
        "restrictedVolumes",
    ),
    case(
        "every allowed volume type",
        {"spec.volumes": [{"name": t, t: {}} for t in sorted(RESTRICTED_VOLUMES)]},
    ),
    case(
        "allowPrivilegeEscalation unset",
        {A + "allowPrivilegeEscalation": DELETE},
        "",
        "allowPrivilegeEscalation",
    ),
    case(
        "allowPrivilegeEscalation true",
        {I + "allowPrivilegeEscalation": True},
        "",
        "allowPrivilegeEscalation",
    ),
    case("runAsNonRoot unset", {POD + "runAsNonRoot": DELETE}, "", "runAsNonRoot"),
    case("runAsNonRoot false on a container", {A + "runAsNonRoot": False}, "", "runAsNonRoot"),
    case(
        "runAsNonRoot on each container only",
        {POD + "runAsNonRoot": DELETE, A + "runAsNonRoot": True, I + "runAsNonRoot": True},
    ),
    case("runAsUser 0 on the pod", {POD + "runAsUser": 0}, "", "runAsUser"),
    case("runAsUser 0 on a container", {I + "runAsUser": 0}, "", "runAsUser"),
    case(
        "root in a user namespace",
        {"spec.hostUsers": False, POD + "runAsUser": 0, POD + "runAsNonRoot": False},
    ),
    case(
        "Windows, no Linux settings",
        {
            "spec.os": {"name": "windows"},
            POD + "seccompProfile": DELETE,
            APP + "securityContext": {},
            INIT + "securityContext": {},
        },
    ),
]


@pytest.mark.parametrize("c", CASES, ids=[c.name for c in CASES])
def test_each_control_on_known_good_and_bad_pods(c: Case) -> None:
    pod = edited(HARDENED, c.edits)
    assert set(violations(pod["metadata"], pod["spec"], BASELINE)) == c.baseline
    assert set(violations(pod["metadata"], pod["spec"], RESTRICTED)) == c.restricted


def test_every_control_has_a_failing_example() -> None:
    failed = {f for c in CASES for f in c.baseline | c.restricted}
    # a replaced baseline control shows at baseline only; its restricted successor at restricted
    assert failed == {c.id for c in CONTROLS}
    assert len({c.id for c in CONTROLS}) == len(CONTROLS)


def test_a_minimal_pod_is_baseline_and_fails_restricted_on_its_defaults() -> None:
    """The documentation: baseline "allows the default (minimally specified) Pod configuration";
    restricted then wants escalation off, non-root, a seccomp profile and every capability dropped."""
    assert violations(MINIMAL["metadata"], MINIMAL["spec"], BASELINE) == {}
    assert violations(MINIMAL["metadata"], MINIMAL["spec"], RESTRICTED) == {
        "allowPrivilegeEscalation": ["app"],
        "runAsNonRoot": ["app"],
        "seccompProfile_restricted": ["app"],
        "capabilities_restricted": ["app:drop"],
    }


def test_violations_name_what_breaks_the_control() -> None:
    pod = edited(
        HARDENED,
        {
            "spec.volumes": [{"name": "root", "hostPath": {"path": "/"}}, {"name": "ok", "emptyDir": {}}],
            APP + "ports": [{"containerPort": 80, "hostPort": 80}],
            A + "capabilities.add": ["SYS_ADMIN", "CHOWN"],
        },
    )
    assert violations(pod["metadata"], pod["spec"], BASELINE) == {
        "capabilities_baseline": ["app:SYS_ADMIN"],
        "hostPathVolumes": ["root"],
        "hostPorts": ["app:80"],
    }
    restricted = violations(pod["metadata"], pod["spec"], RESTRICTED)
    assert restricted["restrictedVolumes"] == ["root:hostPath"]
    assert restricted["capabilities_restricted"] == ["app:CHOWN", "app:SYS_ADMIN"]


def test_restricted_is_baseline_and_more() -> None:
    """Every baseline control is enforced at restricted, itself or through its tighter successor."""
    restricted = {c.id for c in controls(RESTRICTED)}
    successors = {c.replaces: c.id for c in CONTROLS if c.replaces}
    for c in controls(BASELINE):
        assert c.id in restricted or successors[c.id] in restricted, c.id


# ------------------------------------------------------------------------------------------ the chart
REPORT: Obj = {  # the fleet-report CronJob with every volume it can mount
    "fleetReport": {
        "enabled": True,
        "prometheusUrl": "https://mimir.example/prometheus",
        "persistentVolumeClaim": "cost-reports",
        "bearerTokenSecret": {"existingSecret": "mimir-token", "key": "token"},
        "basicAuth": {"user": "u", "passwordSecret": {"existingSecret": "mimir-pw", "key": "password"}},
        "caSecret": {"existingSecret": "mimir-ca", "key": "ca.crt"},
        "slackSecret": {"existingSecret": "cost-slack", "key": "webhook-url"},
    }
}
CLAIM: Obj = {"stateDir": {"hostPath": "", "persistentVolumeClaim": "infercost-state"}}


def _profile() -> Obj:
    """values-restricted.yaml, as ``-f`` reads it."""
    return dict(yaml.safe_load(PROFILE.read_text()))


def _merge(*layers: Obj) -> Obj:
    """Values layered as ``-f a -f b`` does: maps merge key by key, anything else is replaced."""
    out: Obj = {}
    for layer in layers:
        for k, v in layer.items():
            out[k] = (
                _merge(out[k], v)
                if isinstance(v, dict) and isinstance(out.get(k), dict)
                else copy.deepcopy(v)
            )
    return out


def render_all(values: Obj) -> tuple[list[Obj], str]:
    """Every object Helm renders (a kind may repeat) and NOTES.txt."""
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(values)
        manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objs = [
        d
        for path, text in manifests.items()
        if not path.endswith("NOTES.txt")
        for d in yaml.safe_load_all(text)
        if d
    ]
    notes = next((t for p, t in manifests.items() if p.endswith("NOTES.txt")), "")
    return objs, notes


def chart_pods(values: Obj) -> dict[str, tuple[Obj, Obj]]:
    """Kind/name → (pod metadata, pod spec) of every pod template the chart renders."""
    return {where: (meta, spec) for obj in render_all(values)[0] for where, meta, spec in pod_templates(obj)}


RESTRICTED_SETS: dict[str, Obj] = {
    "profile": _profile(),
    "profile with a claim": _merge(_profile(), CLAIM),
    "profile with everything on": _merge(FULL, REPORT, _profile(), CLAIM),
}


def test_default_render_fails_baseline_only_on_its_host_paths() -> None:
    pods = chart_pods(REPORT)  # the defaults, with the CronJob rendered too
    assert set(pods) == {"DaemonSet/infercost", "CronJob/infercost-report"}
    meta, spec = pods["DaemonSet/infercost"]
    assert violations(meta, spec, BASELINE) == {"hostPathVolumes": ["pod-resources", "state"]}
    assert violations(meta, spec, RESTRICTED) == {
        "restrictedVolumes": ["pod-resources:hostPath", "state:hostPath"],
        "runAsNonRoot": ["agent", "pod"],
        "runAsUser": ["pod"],
    }
    meta, spec = pods["CronJob/infercost-report"]
    assert violations(meta, spec, RESTRICTED) == {}  # the report never needed more


@pytest.mark.parametrize("name", list(RESTRICTED_SETS))
def test_restricted_profile_passes_restricted(name: str) -> None:
    values = RESTRICTED_SETS[name]
    pods = chart_pods(values)
    assert "DaemonSet/infercost" in pods
    for where, (meta, spec) in pods.items():
        assert violations(meta, spec, RESTRICTED) == {}, where
        psc = spec["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["runAsUser"] == 65532, where
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}, where
        for c in _containers(spec):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"], where
    ds = pods["DaemonSet/infercost"][1]
    assert not {"hostNetwork", "hostPID", "hostIPC"} & set(ds) and "hostPort" not in yaml.safe_dump(ds)
    vols = {v["name"]: v for v in ds["volumes"]}
    assert "pod-resources" not in vols
    (agent,) = ds["containers"]
    state = next(m for m in agent["volumeMounts"] if m["name"] == "state")
    if values["stateDir"]["persistentVolumeClaim"]:
        assert vols["state"]["persistentVolumeClaim"] == {"claimName": "infercost-state"}
        assert state["subPathExpr"] == "$(INFERCOST_NODE)"  # one claim, a directory per node
        assert ds["securityContext"]["fsGroup"] == 65532
    else:
        assert vols["state"] == {"name": "state", "emptyDir": {}} and "subPathExpr" not in state


def test_restricted_profile_is_valid_and_lints_strict() -> None:
    for name, values in RESTRICTED_SETS.items():
        report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE, kube_version=f"v{K8S}")
        assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == [], name
        for obj in render_all(values)[0]:
            if obj["kind"] not in ("ServiceMonitor", "PrometheusRule"):
                kubernetes_validate.validate(obj, K8S, strict=True)


def test_the_switch_refuses_what_restricted_would_reject() -> None:
    cases = [
        ({"podSecurity": "restricted"}, ["podResources.enabled=false", 'stateDir.hostPath=""']),
        ({"podSecurity": "restricted", "podResources": {"enabled": False}}, ['stateDir.hostPath=""']),
        ({"podSecurity": "restricted", "stateDir": {"hostPath": ""}}, ["podResources.enabled=false"]),
    ]
    for values, fixes in cases:
        with pytest.raises(helm.HelmRenderError) as err:
            render_all(values)
        message = str(err.value)
        assert "podSecurity=restricted" in message and "values-restricted.yaml" in message
        assert all(f in message for f in fixes), message
        assert ("podResources" in message) is ("podResources.enabled=false" in fixes)
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError, match="podSecurity"):
        chart.validate_schema({"podSecurity": "baseline"})  # not a level this chart can render


def _strictest(pods: dict[str, tuple[Obj, Obj]]) -> str:
    for level in (RESTRICTED, BASELINE):
        if all(not violations(meta, spec, level) for meta, spec in pods.values()):
            return level
    return "privileged"


@pytest.mark.parametrize(
    "values",
    [
        {},
        NON_ROOT,
        {"stateDir": {"hostPath": ""}},
        {"podResources": {"enabled": False}},
        CLAIM,
        *RESTRICTED_SETS.values(),
    ],
    ids=["defaults", "non-root", "emptyDir only", "socket off only", "claim", *RESTRICTED_SETS],
)
def test_notes_name_the_level_the_render_needs(values: Obj) -> None:
    """What NOTES.txt tells the user to label the namespace is what the checker finds."""
    objs, notes = render_all(values)
    level = _strictest({w: (m, s) for o in objs for w, m, s in pod_templates(o)})
    (said,) = re.findall(r"pod-security\.kubernetes\.io/enforce=(\w+)", notes.split("kubectl label")[0])
    assert said == level
    if level == "privileged":
        assert f"kubectl label namespace {NAMESPACE} pod-security.kubernetes.io/enforce=privileged" in notes


def test_values_and_docs_name_the_level_and_its_reason() -> None:
    values = (CHART / "values.yaml").read_text()
    page = (ROOT / "docs" / "kubernetes.md").read_text()
    for text in (values, page):
        assert "pod-security.kubernetes.io/enforce=privileged" in text
        assert "hostPath" in text and "pod-resources" in text
    assert "## Pod Security" in page and "values-restricted.yaml" in page
