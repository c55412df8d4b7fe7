"""The generated dashboards against what Grafana itself reads: every Prometheus annotation has the
fields Grafana's Prometheus data source reads, at the level it reads them, and every variable a
dashboard refers to is defined on it (or is one of Grafana's built-ins), and every one it defines
is used. ``@grafana/schema`` types neither (``AnnotationQuery`` has no plugin keys, and a ``$var``
is just text), so ``tsc`` cannot catch these."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

DASH_DIR = Path(__file__).resolve().parent.parent / "dashboards"
DASHBOARDS = sorted(DASH_DIR.glob("infercost-*.json"))

# Read from @grafana/prometheus 13.2.3 (the version of @grafana/schema that schema-check pins),
# src/annotations.ts, `PrometheusAnnotationSupport` (the same code as grafana/grafana's
# packages/grafana-prometheus/src/annotations.ts at commit 812f4677):
#   - `processEvents(anno, frames)` takes `tagKeys`, `titleFormat` and `textFormat` from `anno` and
#     tests `anno.useValueForTime`: the annotation's top level, beside `target`;
#   - `prepareAnnotation(json)` rebuilds `json.target` as `{...target, refId, expr, interval}`, the
#     interval from `target.interval` or else a top-level `step`, then deletes `json.expr` and
#     `json.step`: the query and its minimum step live in the target.
# So a `titleFormat` inside the target is never read (an untitled event), and without a top-level
# `useValueForTime` each sample of a timestamp series counts as an event at its own time (a long
# region instead of a marker).
PROM_ANNOTATION_KEYS = frozenset({"titleFormat", "textFormat", "tagKeys", "useValueForTime"})
PROM_TARGET_KEYS = frozenset({"refId", "expr", "interval"})
PROM_MOVED_TO_TARGET = frozenset({"expr", "step"})  # top-level keys prepareAnnotation moves and drops
# @grafana/schema 13.2.3 `AnnotationQuery` (raw/dashboard/x/types.gen.ts): the generic fields our
# annotations set (name, datasource, enable and iconColor are required there).
SCHEMA_ANNOTATION_KEYS = frozenset({"name", "datasource", "enable", "iconColor", "target"})

# Grafana's variable syntax (`variableRegex`, public/app/features/variables/utils.ts): $var,
# [[var]] or [[var:format]], ${var}, ${var.field} or ${var:format}.
VARIABLE_REF = re.compile(r"\$(\w+)|\[\[([\s\S]+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^}]+))?(?::(\w+))?\}")
# Grafana's global variables (docs: "Global variables"), plus `__all`, the stored value of "All".
BUILT_INS = frozenset(
    {
        "__all",
        "__dashboard",
        "__from",
        "__to",
        "__interval",
        "__interval_ms",
        "__name",
        "__org",
        "__user",
        "__range",
        "__range_s",
        "__range_ms",
        "__rate_interval",
        "__rate_interval_ms",
        "__timeFilter",
        "__timezone",
    }
)
LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")  # Grafana's legend format: {{label}}
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
DURATION = re.compile(r"[0-9]+(ms|s|m|h|d|w|y)")


def load(path: Path) -> dict[str, Any]:
    """A dashboard as committed."""
    return dict(json.loads(path.read_text()))


def strings(node: Any, where: str = "") -> Iterator[tuple[str, str]]:
    """(JSON path, value) of every string in a dashboard, keys excluded."""
    if isinstance(node, str):
        yield where, node
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from strings(v, f"{where}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from strings(v, f"{where}[{i}]")


def references(text: str) -> set[str]:
    """The variable names ``text`` refers to, in any of Grafana's three syntaxes."""
    return {next(g for g in (m[1], m[2], m[4]) if g) for m in VARIABLE_REF.finditer(text)}


def prom_annotations() -> list[tuple[str, dict[str, Any]]]:
    """("dashboard / name", annotation) of every Prometheus annotation of every dashboard."""
    out = []
    for path in DASHBOARDS:
        for a in load(path)["annotations"]["list"]:
            if a["datasource"]["type"] == "prometheus":
                out.append((f"{path.stem} / {a['name']}", a))
    return out


def test_every_dashboard_has_prometheus_annotations() -> None:
    """The checks below see something: each dashboard's deploy and alert annotations."""
    names = [name for name, _ in prom_annotations()]
    assert len(names) == 3 * len(DASHBOARDS) and len(DASHBOARDS) == 3, names


@pytest.mark.parametrize("name, anno", prom_annotations(), ids=lambda x: x if isinstance(x, str) else "")
def test_prometheus_annotation_fields_are_where_grafana_reads_them(name: str, anno: dict[str, Any]) -> None:
    assert set(anno) == SCHEMA_ANNOTATION_KEYS | PROM_ANNOTATION_KEYS, name
    assert not set(anno) & PROM_MOVED_TO_TARGET, name
    target = anno["target"]
    assert set(target) == PROM_TARGET_KEYS, name
    assert target["refId"] and target["expr"].strip(), name
    assert DURATION.fullmatch(target["interval"]), name  # Grafana's min step: a Prometheus duration
    assert isinstance(anno["useValueForTime"], bool), name
    assert all(isinstance(anno[k], str) for k in PROM_ANNOTATION_KEYS - {"useValueForTime"}), name
    # Grafana splits tagKeys on "," and matches each piece to a label name exactly: no spaces
    assert all(LABEL_NAME.fullmatch(k) for k in anno["tagKeys"].split(",")), name


@pytest.mark.parametrize("name, anno", prom_annotations(), ids=lambda x: x if isinstance(x, str) else "")
def test_annotation_titles_and_tags_name_labels_the_query_keeps(name: str, anno: dict[str, Any]) -> None:
    """Where the query aggregates (``sum by (...)``), every label the title, text and tags name
    is one it keeps; otherwise Grafana renders it empty and the tag is missing."""
    used = set(LEGEND_LABEL.findall(anno["titleFormat"] + anno["textFormat"])) | set(
        anno["tagKeys"].split(",")
    )
    assert LEGEND_LABEL.search(anno["titleFormat"]), f"{name}: an untitled annotation"
    kept = re.match(r"\s*\w+\s+by\s*\(([^)]*)\)", anno["target"]["expr"])
    if kept:
        assert used <= {label.strip() for label in kept.group(1).split(",")}, name


def test_deploy_markers_are_points_at_the_deploy_time() -> None:
    """The deploy gauge holds a timestamp (ms): Grafana must place the marker at that value."""
    deploys = [a for name, a in prom_annotations() if name.endswith("/ Deploys")]
    assert len(deploys) == len(DASHBOARDS)
    for a in deploys:
        assert a["useValueForTime"] is True
        assert "infercost_deploy_timestamp_seconds" in a["target"]["expr"]
        assert a["target"]["expr"].rstrip().endswith("* 1000")  # seconds → milliseconds


def test_the_reference_extraction_sees_every_syntax() -> None:
    """The check below can fail: all three syntaxes are found, legends and dollar amounts are not."""
    text = 'x{a=~"$node", b="${model:regex}", c="[[engine]]"} [$__rate_interval] {{gpu}} $ per 1M'
    assert references(text) == {"node", "model", "engine", "__rate_interval"}


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_variable_referenced_is_defined(path: Path) -> None:
    """Every $var in every query, legend, title, description, annotation and link of the dashboard
    is one of its own template variables or a Grafana built-in."""
    dash = load(path)
    defined = {v["name"] for v in dash["templating"]["list"]}
    undefined = [
        (where, name)
        for where, text in strings(dash)
        for name in sorted(references(text) - defined - BUILT_INS)
    ]
    assert undefined == [], f"{path.stem}: undefined variables"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_variable_defined_is_used(path: Path) -> None:
    """Each template variable filters something: a query, legend, title or another variable."""
    dash = load(path)
    for i, var in enumerate(dash["templating"]["list"]):
        others = {
            **dash,
            "templating": {"list": [v for j, v in enumerate(dash["templating"]["list"]) if j != i]},
        }
        assert any(var["name"] in references(text) for _, text in strings(others)), (path.stem, var["name"])


CLUSTER_SERIES = re.compile(r"\bcluster_[a-z_]*:[a-z0-9_:]+\s*(\{[^}]*\})?")


def test_the_cluster_series_are_read_and_filtered_by_cluster() -> None:
    """The fleet rules' ``cluster_model_version:`` series: the fleet and compare dashboards read
    them, each selector filtered by their ``cluster`` variable (listed from the same series)."""
    for path in DASHBOARDS:
        dash = load(path)
        selectors = [m for _, text in strings(dash["panels"]) for m in CLUSTER_SERIES.finditer(text)]
        variables = {v["name"]: v for v in dash["templating"]["list"]}
        if path.stem == "infercost-node":
            assert not selectors and "cluster" not in variables
            continue
        assert selectors, path.stem
        assert all(m[1] and 'cluster=~"$cluster"' in m[1] for m in selectors), path.stem
        cluster = variables["cluster"]
        assert cluster["type"] == "query" and cluster["includeAll"] and cluster["allValue"] == ".*"
        assert re.fullmatch(r"label_values\(cluster_model_version:\S+, cluster\)", cluster["query"]["query"])
