"""The Helm chart, without a ``helm`` binary: a small, strict renderer of the Go-template subset
the chart uses (if/else/with/define/include, pipelines, toYaml/nindent/quote/default/printf/…)
renders every template with the default values and with every option on; the output must be
valid YAML of well-formed Kubernetes objects, the ConfigMap's node.yaml must validate against
``agent.config.Config`` and its price book against the price-book schema, and the
PrometheusRule must carry exactly ``rules/prometheus/infercost.rules.yml``.

The renderer fails on anything it does not know (a function, a missing value key, a map printed
without toYaml), so a template typo fails the test rather than rendering quietly.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.config import parse_config
from agent.sources.prices import parse_price_book

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "infercost"
RULES = ROOT / "rules" / "prometheus" / "infercost.rules.yml"

# ---------------------------------------------------------------------------------------------
# A strict mini Go-template renderer
# ---------------------------------------------------------------------------------------------

ACTION = re.compile(r"\{\{(-\s)?\s*(.*?)\s*(\s-)?\}\}", re.S)
TOKEN = re.compile(r'\s*("(?:[^"\\]|\\.)*"|\(|\)|\||-?\d+|\$?[.\w]+|\$)')


class TemplateError(Exception):
    """The template uses something this renderer (and so the chart's contract) does not allow."""


@dataclass
class Node:
    kind: str  # text | expr | if | with | define
    arg: str = ""
    body: list[Node] = field(default_factory=list)
    orelse: list[Node] = field(default_factory=list)


def parse(src: str) -> list[Node]:
    pieces: list[tuple[str, str]] = []
    pos = 0
    for m in ACTION.finditer(src):
        text = src[pos : m.start()]
        if m.group(1):
            text = text.rstrip()
        if pieces and pieces[-1][0] == "rtrim":
            pieces.pop()
            text = text.lstrip()
        pieces.append(("text", text))
        pieces.append(("action", m.group(2)))
        if m.group(3):
            pieces.append(("rtrim", ""))
        pos = m.end()
    tail = src[pos:]
    if pieces and pieces[-1][0] == "rtrim":
        pieces.pop()
        tail = tail.lstrip()
    pieces.append(("text", tail))

    root: list[Node] = []
    stack: list[tuple[Node | None, list[Node]]] = [(None, root)]
    for kind, s in pieces:
        _, out = stack[-1]
        if kind == "text":
            if s:
                out.append(Node("text", s))
            continue
        if s.startswith("/*"):
            continue
        word, _, rest = s.partition(" ")
        if word in ("if", "with", "define"):
            node = Node(word, rest.strip())
            out.append(node)
            stack.append((node, node.body))
        elif word == "else":
            node_ = stack[-1][0]
            assert node_ is not None and not rest, s
            stack[-1] = (node_, node_.orelse)
        elif word == "end":
            stack.pop()
        elif word in ("range", "template", "block", "tpl"):
            raise TemplateError(f"unsupported action: {s}")
        else:
            out.append(Node("expr", s))
    assert len(stack) == 1, "unclosed block"
    return root


def truthy(v: Any) -> bool:
    return bool(v)


def to_yaml(v: Any) -> str:
    return yaml.safe_dump(v, sort_keys=True, default_flow_style=False).rstrip("\n")


def _indent(n: int, s: str) -> str:
    return "\n".join((" " * n + line) if line else line for line in str(s).split("\n"))


class Renderer:
    """Renders the chart's templates with one set of values."""

    def __init__(self, values: dict[str, Any]) -> None:
        chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
        self.root = {
            "Values": values,
            "Release": {"Name": "infercost", "Namespace": "monitoring", "Service": "Helm"},
            "Chart": {"Name": chart["name"], "Version": chart["version"], "AppVersion": chart["appVersion"]},
        }
        self.defines: dict[str, list[Node]] = {}
        for tpl in (CHART / "templates").glob("*.tpl"):
            for n in parse(tpl.read_text()):
                if n.kind == "define":
                    self.defines[json.loads(n.arg)] = n.body
                elif n.kind != "text" or n.arg.strip():
                    raise TemplateError(f"{tpl.name}: only defines belong in a .tpl file")
        self.funcs: dict[str, Callable[..., Any]] = {
            "include": lambda name, dot: self.render_nodes(self.defines[name], dot),
            "toYaml": to_yaml,
            "nindent": lambda n, s: "\n" + _indent(n, s),
            "indent": _indent,
            "quote": lambda s: json.dumps(str(s)),
            "default": lambda d, v=None: v if truthy(v) else d,
            "printf": lambda fmt, *a: fmt % a,
            "trunc": lambda n, s: s[:n],
            "trimSuffix": lambda suf, s: s[: -len(suf)] if suf and s.endswith(suf) else s,
            "contains": lambda sub, s: sub in s,
            "sha256sum": lambda s: hashlib.sha256(s.encode()).hexdigest(),
            ".Files.Get": lambda path: (CHART / path).read_text(),
        }

    def render(self, name: str) -> str:
        return self.render_nodes(parse((CHART / "templates" / name).read_text()), self.root)

    def render_nodes(self, nodes: list[Node], dot: Any) -> str:
        out = []
        for n in nodes:
            if n.kind == "text":
                out.append(n.arg)
            elif n.kind == "expr":
                out.append(self.show(self.pipeline(tokenize(n.arg), dot)))
            elif n.kind == "if":
                branch = n.body if truthy(self.pipeline(tokenize(n.arg), dot)) else n.orelse
                out.append(self.render_nodes(branch, dot))
            elif n.kind == "with":
                v = self.pipeline(tokenize(n.arg), dot)
                out.append(self.render_nodes(n.body, v) if truthy(v) else self.render_nodes(n.orelse, dot))
            elif n.kind == "define":
                raise TemplateError("define outside a .tpl file")
        return "".join(out)

    @staticmethod
    def show(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str | int | float):
            return str(v)
        raise TemplateError(f"printing {type(v).__name__} {v!r}: use toYaml")

    def term(self, tok: str, dot: Any) -> Any:
        if tok.startswith('"'):
            return json.loads(tok)
        if re.fullmatch(r"-?\d+", tok):
            return int(tok)
        if tok in ("true", "false"):
            return tok == "true"
        if tok == ".":
            return dot
        if tok == "$":
            return self.root
        if tok.startswith(("$.", ".")):
            cur = self.root if tok.startswith("$") else dot
            for part in tok.lstrip("$").strip(".").split("."):
                if not isinstance(cur, dict) or part not in cur:
                    raise TemplateError(f"no value for {tok} (missing {part!r})")
                cur = cur[part]
            return cur
        raise TemplateError(f"unknown term {tok!r}")

    def pipeline(self, toks: list[str], dot: Any) -> Any:
        commands: list[list[Any]] = [[]]
        i = 0
        while i < len(toks):
            t = toks[i]
            if t == "|":
                commands.append([])
            elif t == "(":
                depth, j = 1, i + 1
                while depth:
                    depth += {"(": 1, ")": -1}.get(toks[j], 0)
                    j += 1
                commands[-1].append(("sub", toks[i + 1 : j - 1]))
                i = j - 1
            else:
                commands[-1].append(t)
            i += 1
        value: Any = None
        for k, cmd in enumerate(commands):
            head, args = cmd[0], cmd[1:]
            vals = [self.pipeline(a[1], dot) if isinstance(a, tuple) else self.term(a, dot) for a in args]
            if k > 0:
                vals.append(value)
            if isinstance(head, str) and head in self.funcs:
                value = self.funcs[head](*vals)
            elif isinstance(head, str) and re.fullmatch(r"[A-Za-z]\w*", head):
                raise TemplateError(f"unknown function {head!r}")
            else:
                if vals:
                    raise TemplateError(f"arguments to a non-function {head!r}")
                value = self.pipeline(head[1], dot) if isinstance(head, tuple) else self.term(head, dot)
        return value


def tokenize(expr: str) -> list[str]:
    toks, pos = [], 0
    expr = expr.strip()
    while pos < len(expr):
        m = TOKEN.match(expr, pos)
        if not m:
            raise TemplateError(f"cannot tokenize {expr[pos:]!r}")
        toks.append(m.group(1))
        pos = m.end()
    return toks


# ---------------------------------------------------------------------------------------------
# Values and rendering
# ---------------------------------------------------------------------------------------------


def default_values() -> dict[str, Any]:
    return dict(yaml.safe_load((CHART / "values.yaml").read_text()))


def full_values() -> dict[str, Any]:
    v = copy.deepcopy(default_values())
    v["serviceMonitor"].update(enabled=True, labels={"release": "kube-prometheus-stack"})
    v["prometheusRule"].update(enabled=True, labels={"release": "kube-prometheus-stack"})
    v["secrets"]["slack"]["existingSecret"] = "infercost-slack"
    v["secrets"]["pagerduty"]["existingSecret"] = "infercost-pagerduty"
    v["config"]["alerts"] = {
        "slack": {"webhook_url": {"env": "INFERCOST_SLACK_WEBHOOK_URL"}},
        "pagerduty": {"routing_key": {"env": "INFERCOST_PAGERDUTY_ROUTING_KEY"}},
    }
    v["config"]["engines"] = [
        {
            "name": "vllm-0",
            "kind": "vllm",
            "url": "http://127.0.0.1:8000/metrics",
            "gpus": [0, 1],
            "version_file": "/etc/podinfo/labels",
        }
    ]
    v["podLabels"] = {"team": "inference"}
    v["podAnnotations"] = {"example.com/owner": "ml-platform"}
    v["imagePullSecrets"] = [{"name": "regcred"}]
    v["priorityClassName"] = "system-node-critical"
    v["image"]["tag"] = "0.1.0-rc1"
    return v


def render_all(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{kind: object} of every rendered template (each kind appears once in this chart)."""
    r = Renderer(values)
    objs: dict[str, dict[str, Any]] = {}
    for tpl in sorted((CHART / "templates").glob("*.yaml")):
        text = r.render(tpl.name)
        for doc in yaml.safe_load_all(text):
            if doc is None:
                continue
            assert doc["kind"] not in objs, f"{tpl.name}: second {doc['kind']}"
            assert doc["apiVersion"] and doc["metadata"]["name"] == "infercost", tpl.name
            objs[doc["kind"]] = doc
    return objs


VALUE_SETS = {"defaults": default_values, "everything-on": full_values}


@pytest.fixture(params=list(VALUE_SETS))
def objs(request: pytest.FixtureRequest) -> dict[str, dict[str, Any]]:
    return render_all(VALUE_SETS[request.param]())


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "infercost"
    assert re.fullmatch(r"\d+\.\d+\.\d+", chart["version"])


def test_default_kinds() -> None:
    assert set(render_all(default_values())) == {"ConfigMap", "DaemonSet", "Service", "ServiceAccount"}
    assert set(render_all(full_values())) == {
        "ConfigMap",
        "DaemonSet",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
        "PrometheusRule",
    }


def test_daemonset(objs: dict[str, dict[str, Any]]) -> None:
    ds = objs["DaemonSet"]
    assert ds["apiVersion"] == "apps/v1"
    spec, pod = ds["spec"], ds["spec"]["template"]["spec"]
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    (c,) = pod["containers"]
    assert "nvidia.com/gpu" not in json.dumps(c["resources"]), "the agent must not take a GPU"
    assert c["resources"]["limits"]["memory"] and c["resources"]["requests"]["cpu"]
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert c["args"][-2:] == ["--config", "/etc/infercost/node.yaml"]
    env = {e["name"]: e for e in c["env"]}
    assert env["INFERCOST_NODE"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert c["ports"] == [{"name": "metrics", "containerPort": 9464, "protocol": "TCP"}]
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["state"]["hostPath"] == {"path": "/var/lib/infercost", "type": "DirectoryOrCreate"}
    assert vols["podinfo"]["downwardAPI"]["items"] == [
        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}
    ]
    assert vols["config"]["configMap"]["name"] == objs["ConfigMap"]["metadata"]["name"]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert set(mounts) <= set(vols)
    assert mounts["state"] == "/var/lib/infercost" and mounts["podinfo"] == "/etc/podinfo"
    annotations = ds["spec"]["template"]["metadata"]["annotations"]
    assert re.fullmatch(r"[0-9a-f]{64}", annotations["checksum/config"])


def test_secrets_come_from_secret_refs() -> None:
    ds = render_all(full_values())["DaemonSet"]
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert env["INFERCOST_SLACK_WEBHOOK_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "infercost-slack",
        "key": "webhook-url",
    }
    assert (
        env["INFERCOST_PAGERDUTY_ROUTING_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "infercost-pagerduty"
    )
    assert c["image"] == "ghcr.io/example/infercost:0.1.0-rc1"
    plain = render_all(default_values())["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]
    assert plain["image"] == "ghcr.io/example/infercost:0.1.0"
    assert "INFERCOST_SLACK_WEBHOOK_URL" not in {e["name"] for e in plain["env"]}


def test_configmap_validates_against_the_agent_schemas(objs: dict[str, dict[str, Any]]) -> None:
    data = objs["ConfigMap"]["data"]
    cfg = parse_config(yaml.safe_load(data["node.yaml"]), "configmap node.yaml", {"INFERCOST_NODE": "gpu-7"})
    assert cfg.node == "gpu-7"
    assert str(cfg.prices.book) == "/etc/infercost/prices.yaml"
    assert cfg.exporters.prometheus.host == "0.0.0.0" and cfg.exporters.prometheus.port == 9464
    book = parse_price_book(yaml.safe_load(data["prices.yaml"]), "configmap prices.yaml")
    assert book is not None


def test_configmap_alerts_and_engines() -> None:
    data = render_all(full_values())["ConfigMap"]["data"]
    cfg = parse_config(yaml.safe_load(data["node.yaml"]), "configmap", {})
    assert cfg.alerts.slack is not None and cfg.alerts.slack.webhook_url.env == "INFERCOST_SLACK_WEBHOOK_URL"
    assert cfg.alerts.pagerduty is not None
    assert [e.name for e in cfg.engines] == ["vllm-0"]
    assert str(cfg.engines[0].version_file) == "/etc/podinfo/labels"


def test_service_and_servicemonitor_match() -> None:
    objs = render_all(full_values())
    svc, sm, ds = objs["Service"], objs["ServiceMonitor"], objs["DaemonSet"]
    assert svc["spec"]["selector"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"] == "metrics"
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_prometheusrule_is_the_rules_file() -> None:
    rule = render_all(full_values())["PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())


def test_chart_copy_of_rules_is_current() -> None:
    copy_ = CHART / "files" / "infercost.rules.yml"
    assert copy_.read_text() == RULES.read_text(), f"cp {RULES.relative_to(ROOT)} {copy_.relative_to(ROOT)}"


def test_example_node_yaml_validates() -> None:
    raw = yaml.safe_load((ROOT / "deploy" / "examples" / "node.yaml").read_text())
    cfg = parse_config(raw, "deploy/examples/node.yaml", {})
    assert [e.kind for e in cfg.engines] == ["vllm", "sglang", "tgi"]
    assert cfg.engines[0].weights_bytes == 1.4e11


def test_renderer_is_strict() -> None:
    """The renderer fails on a typo'd value, an unknown function and a map printed raw."""
    r = Renderer(default_values())
    for bad in ("{{ .Values.imag.tag }}", "{{ .Values.image | toYml }}", "{{ .Values.image }}"):
        with pytest.raises(TemplateError):
            r.render_nodes(parse(bad), r.root)
    assert r.render_nodes(parse("a\n  {{- .Values.image.pullPolicy | quote }}"), r.root) == 'a"IfNotPresent"'
