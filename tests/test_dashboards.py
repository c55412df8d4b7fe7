"""The Grafana dashboards: generated JSON is current, structurally sound, every PromQL expression
parses (promtool), and — against a real Prometheus scraping a real exporter of the catalogue's
series, with the fleet recording rules loaded — every panel query returns at least one series."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from promstack import CatalogueExporter, Prometheus, binary, test_copy_of_rules

ROOT = Path(__file__).resolve().parent.parent
DASH_DIR = ROOT / "dashboards"
DASHBOARDS = sorted(DASH_DIR.glob("infercost-*.json"))
RULES = ROOT / "rules" / "prometheus" / "infercost.rules.yml"

# Grafana's built-in interval variables → values valid in a test query. Template variables take
# their "All" value (the dashboards use them only as `label=~"$var"`).
SUBSTITUTIONS = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "1h",
    "$node": ".*",
    "$model": ".*",
    "$model_version": ".*",
}


def load(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def walk_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    for p in panels:
        yield p
        yield from walk_panels(p.get("panels", []))


def substitute(expr: str) -> str:
    for key in sorted(SUBSTITUTIONS, key=len, reverse=True):
        expr = expr.replace(key, SUBSTITUTIONS[key])
    assert "$" not in expr.replace("$__", ""), f"unsubstituted variable in {expr!r}"
    return expr


def variable_queries(dash: dict[str, Any]) -> list[str]:
    """label_values(selector, label) variables as `count by (label) (selector)` queries."""
    out = []
    for v in dash["templating"]["list"]:
        if v["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", v["query"]["query"])
        assert m, v
        out.append(f"count by ({m.group(2)}) ({m.group(1)})")
    return out


def all_queries() -> list[tuple[str, str]]:
    """(dashboard / panel / refId, substituted PromQL) for every target and variable."""
    out = []
    for path in DASHBOARDS:
        dash = load(path)
        for p in walk_panels(dash["panels"]):
            for t in p.get("targets", []):
                out.append((f"{path.stem} / {p['title']} / {t['refId']}", substitute(t["expr"])))
        for q in variable_queries(dash):
            out.append((f"{path.stem} / variable", substitute(q)))
    return out


def test_generated_json_is_current() -> None:
    spec = importlib.util.spec_from_file_location("dash_build", DASH_DIR / "build.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--check"]) == 0, "run: python dashboards/build.py"
    assert [p.name for p in DASHBOARDS] == ["infercost-fleet.json", "infercost-node.json"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_structure(path: Path) -> None:
    dash = load(path)
    assert re.fullmatch(r"[a-z0-9-]{1,40}", dash["uid"])
    assert dash["title"] and dash["schemaVersion"] >= 39
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert {"node", "model", "model_version"} <= set(variables)
    ids: set[int] = set()
    cells: set[tuple[int, int]] = set()
    panels = list(walk_panels(dash["panels"]))
    assert len(panels) >= 10
    for p in panels:
        assert isinstance(p["id"], int) and p["id"] not in ids, p["title"]
        ids.add(p["id"])
        assert p["type"] in {"row", "timeseries", "stat", "table", "bargauge", "gauge"}
        assert p["title"]
        pos = p["gridPos"]
        assert all(isinstance(pos[k], int) for k in ("h", "w", "x", "y")), p["title"]
        assert pos["w"] > 0 and pos["h"] > 0 and pos["x"] + pos["w"] <= 24, p["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):  # no two panels overlap
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps another panel at {x},{y}"
                cells.add((x, y))
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert refs and all(refs) and len(set(refs)) == len(refs), p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}" and t["expr"].strip()
            assert '"$' not in t["expr"].replace('=~"$', ""), f"{p['title']}: use =~ with variables"


def test_required_views_present() -> None:
    text = {p.stem: p.read_text() for p in DASHBOARDS}
    fleet, node = text["infercost-fleet"], text["infercost-node"]
    for needle in (
        "usd_per_1m_output_tokens",
        "idle_cost",
        "gpu_utilization_ratio",
        "dram_bandwidth_ratio",
        "power_watts",
        "roofline_efficiency_ratio",
        "tokens",
        "alerts_firing",
    ):
        assert needle in fleet and needle in node, needle


def test_every_expression_parses(tmp_path: Path) -> None:
    queries = all_queries()
    records = [{"record": f"dash:q{i}", "expr": q} for i, (_, q) in enumerate(queries)]
    rules = {"groups": [{"name": "dash", "rules": records}]}
    f = tmp_path / "dash_rules.yml"
    f.write_text(yaml.safe_dump(rules))
    out = subprocess.run([binary("promtool"), "check", "rules", str(f)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(queries)} rules found" in out.stdout


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    work = tmp_path_factory.mktemp("dash_prom")
    exporter = CatalogueExporter()
    prom = None
    try:
        rules = test_copy_of_rules(RULES, work / "rules.yml")
        prom = Prometheus(work, targets=[exporter.target], rule_files=[rules])
        # Recording rules need two scrapes (rate) and one evaluation after them.
        for expr in (
            "model_version:infercost_usd_per_1m_output_tokens:ratio_rate5m",
            "gpu_model:infercost_gpu_dram_bandwidth_ratio:avg5m",
            "node:infercost_gpu_idle_cost_usd_per_hour:rate1h",
        ):
            assert prom.wait_for(expr, timeout=30), f"{expr} never appeared; log: {prom.log}"
        yield prom
    finally:
        if prom:
            prom.close()
        exporter.close()


def test_every_panel_query_returns_series(prometheus: Prometheus) -> None:
    empty = [name for name, q in all_queries() if not prometheus.query(q)]
    assert empty == []


def test_a_typo_returns_nothing(prometheus: Prometheus) -> None:
    """The check above can fail: a misspelt metric returns no series."""
    assert prometheus.query("sum by (model) (rate(infercost_cost_usd_totl[1m]))") == []
    assert prometheus.query("sum by (model) (rate(infercost_cost_usd_total[1m]))")


def test_fleet_ratio_is_a_ratio_of_sums(prometheus: Prometheus) -> None:
    """The panel's fleet $/1M equals Σcost/Σtokens of the raw counters at the same instant."""
    rec = prometheus.query("model_version:infercost_usd_per_1m_output_tokens:ratio_rate5m")
    raw = prometheus.query(
        "sum by (model, model_version) (rate(infercost_cost_usd_total[5m]))"
        " / sum by (model, model_version) (rate(infercost_generation_tokens_total[5m])) * 1e6"
    )
    got = {(r["metric"]["model"], r["metric"]["model_version"]): float(r["value"][1]) for r in rec}
    want = {(r["metric"]["model"], r["metric"]["model_version"]): float(r["value"][1]) for r in raw}
    assert set(got) == {("llama-3-70b", "v1"), ("llama-3-70b", "v2"), ("qwen2-7b", "2024-06")}
    for key, value in want.items():
        # the exporter's counters grow linearly, so the two agree to the rounding of rate()
        assert got[key] == pytest.approx(value, rel=0.02), key
