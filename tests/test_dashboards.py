"""The Grafana dashboards: generated JSON is current, type-checks against @grafana/schema (tsc),
is structurally sound, has a unit and thresholds on every panel, honours $node everywhere (and
$cluster on the cluster series), carries deploy and alert annotations (their shape and variables
are held against Grafana's own reading in test_dashboards_grafana.py); every PromQL expression
parses (promtool), and — against a real Prometheus scraping a real exporter of the catalogue's
series, with the fleet rules loaded — every panel, variable and annotation query returns at least
one series."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from promstack import (
    CatalogueCollector,
    CatalogueExporter,
    Prometheus,
    binary,
    scraped_by_prometheus,
    test_copy_of_rules,
)

from agent.catalog import CATALOG, HISTOGRAMS

ROOT = Path(__file__).resolve().parent.parent
DASH_DIR = ROOT / "dashboards"
DASHBOARDS = sorted(DASH_DIR.glob("infercost-*.json"))
RULES = ROOT / "rules" / "prometheus" / "infercost.rules.yml"

# Grafana's built-in interval variables → values valid in a test query. Template variables take
# their "All" value (the dashboards use them only as `label=~"$var"`).
SUBSTITUTIONS = {
    "$__rate_interval": "1m",
    "$__interval": "1s",
    "$__range": "1h",
    "$cluster": ".*",
    "$node": ".*",
    "$engine": ".*",
    "$namespace": ".*",
    "$team": ".*",
    "$model": ".*",
    "$model_version": ".*",
    # the comparison dashboard: two versions the catalogue exporter serves, and a load band that
    # holds its synthetic requests-in-flight values
    "$version_a": "v1",
    "$version_b": "v2",
    "$load_min": "0",
    "$load_max": "1e9",
}
SCHEMA_CHECK = DASH_DIR / "schema-check"


def load(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def walk_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    for p in panels:
        yield p
        yield from walk_panels(p.get("panels", []))


def substitute(expr: str, subs: dict[str, str] = SUBSTITUTIONS) -> str:
    for key in sorted(subs, key=len, reverse=True):
        expr = expr.replace(key, subs[key])
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


def all_queries(subs: dict[str, str] = SUBSTITUTIONS) -> list[tuple[str, str]]:
    """(dashboard / panel / refId, substituted PromQL) for every target, variable and annotation."""
    out = []
    for path in DASHBOARDS:
        dash = load(path)
        for p in walk_panels(dash["panels"]):
            for t in p.get("targets", []):
                out.append((f"{path.stem} / {p['title']} / {t['refId']}", substitute(t["expr"], subs)))
        for q in variable_queries(dash):
            out.append((f"{path.stem} / variable", substitute(q, subs)))
        for a in dash["annotations"]["list"]:
            out.append((f"{path.stem} / annotation {a['name']}", substitute(a["target"]["expr"], subs)))
    return out


def test_generated_json_is_current() -> None:
    spec = importlib.util.spec_from_file_location("dash_build", DASH_DIR / "build.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    assert mod.main(["--check"]) == 0, "run: python dashboards/build.py"
    assert [p.name for p in DASHBOARDS] == [
        "infercost-compare.json",
        "infercost-fleet.json",
        "infercost-node.json",
    ]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_structure(path: Path) -> None:
    dash = load(path)
    assert re.fullmatch(r"[a-z0-9-]{1,40}", dash["uid"])
    assert dash["title"] and dash["schemaVersion"] >= 39
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    if path.stem == "infercost-compare":
        assert {"cluster", "node", "model", "version_a", "version_b", "load_min", "load_max"} <= set(
            variables
        )
    else:
        assert {"node", "engine", "model", "model_version"} <= set(variables)
        assert ("cluster" in variables) == (path.stem == "infercost-fleet")
    ids: set[int] = set()
    cells: set[tuple[int, int]] = set()
    panels = list(walk_panels(dash["panels"]))
    assert len(panels) >= 10
    names = [a["name"] for a in dash["annotations"]["list"]]
    assert names == ["Deploys", "Fleet alerts", "Agent alerts"]
    deploys = dash["annotations"]["list"][0]  # the shape Grafana reads: tests/test_dashboards_grafana.py
    assert "infercost_deploy_timestamp_seconds" in deploys["target"]["expr"] and deploys["useValueForTime"]
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
    text = {p.stem: p.read_text() for p in DASHBOARDS if p.stem != "infercost-compare"}
    fleet, node = text["infercost-fleet"], text["infercost-node"]
    assert "$ per 1M output tokens" in fleet and "usd_per_1m_output_tokens" in node
    for needle in (
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


def _value_panels() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in DASHBOARDS:
        for p in walk_panels(load(path)["panels"]):
            if p["type"] != "row":
                yield f"{path.stem} / {p['title']}", p


def test_every_panel_has_a_unit_and_thresholds() -> None:
    for name, p in _value_panels():
        d = p["fieldConfig"]["defaults"]
        assert d.get("unit"), name
        th = d["thresholds"]
        assert th["mode"] == "absolute" and th["steps"][0]["value"] is None, name
        values = [s["value"] for s in th["steps"][1:]]
        assert values == sorted(values), name


def test_money_is_never_red_and_up_zero_is() -> None:
    for name, p in _value_panels():
        d = p["fieldConfig"]["defaults"]
        colours = [s["color"] for s in d["thresholds"]["steps"]]
        if d["unit"] == "currencyUSD":  # Grafana's default would colour $80/h red
            assert colours == ["text"], name
    panels = dict(_value_panels())
    for name in ("infercost-node / NVML up", "infercost-node / Engines up"):
        steps = panels[name]["fieldConfig"]["defaults"]["thresholds"]["steps"]
        assert steps == [{"value": None, "color": "red"}, {"value": 1, "color": "green"}], name
    for name in ("infercost-node / Alerts firing", "infercost-fleet / Alerts firing"):
        steps = panels[name]["fieldConfig"]["defaults"]["thresholds"]["steps"]
        assert steps == [{"value": None, "color": "green"}, {"value": 1, "color": "red"}], name


def test_token_rates_are_in_tokens_per_second() -> None:
    for name, p in _value_panels():
        exprs = " ".join(t["expr"] for t in p["targets"])
        if re.search(r"tokens_per_second|rate\(infercost_(generation|prompt)_tokens_total", exprs) and (
            "usd" not in exprs and "/" not in exprs
        ):
            assert p["fieldConfig"]["defaults"]["unit"] == "suffix: tok/s", name


def test_every_selector_honours_the_node_variable() -> None:
    """Every series a panel, variable or annotation reads is filtered by $node — recording rules
    only where they keep the node label (``node:`` level) — except Prometheus' own ALERTS regions,
    the variables that list the nodes and clusters, and the fleet rules' ``cluster_`` series
    (whole clusters, no node label), which are filtered by $cluster instead."""
    for name, q in all_queries_raw():
        for metric, labels in re.findall(r"\b([a-z_:]*infercost_[a-z0-9_:]+)\s*(\{[^}]*\})?", q):
            if name.endswith(("variable node", "variable cluster")):
                continue
            if metric.startswith("cluster_"):
                assert labels and 'cluster=~"$cluster"' in labels, f"{name}: {metric} ignores $cluster"
                continue
            assert labels and 'node=~"$node"' in labels, f"{name}: {metric} ignores $node"
            assert ":" not in metric or metric.startswith("node:"), f"{name}: {metric} has no node label"


def all_queries_raw() -> list[tuple[str, str]]:
    """(where, unsubstituted PromQL) of every target, variable and annotation."""
    out = []
    for path in DASHBOARDS:
        dash = load(path)
        for p in walk_panels(dash["panels"]):
            out += [(f"{path.stem} / {p['title']}", t["expr"]) for t in p.get("targets", [])]
        for v in dash["templating"]["list"]:
            if v["type"] == "query":
                out.append((f"{path.stem} / variable {v['name']}", v["query"]["query"]))
        out += [
            (f"{path.stem} / annotation {a['name']}", a["target"]["expr"])
            for a in dash["annotations"]["list"]
        ]
    return out


def _tsc() -> str:
    tsc = SCHEMA_CHECK / "node_modules" / ".bin" / "tsc"
    assert tsc.exists() and shutil.which("node"), (
        "run: (cd dashboards/schema-check && npm install --no-package-lock); .ci/run does"
    )
    return str(tsc)


def test_dashboards_type_check_against_grafana_schema() -> None:
    out = subprocess.run([_tsc(), "-p", str(SCHEMA_CHECK)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_type_check_catches_a_misspelt_field(tmp_path: Path) -> None:
    gen = (SCHEMA_CHECK / "dashboards.gen.ts").read_text()
    bad = SCHEMA_CHECK / "bad.gen.ts"
    config = SCHEMA_CHECK / "tsconfig.bad.json"
    bad.write_text(
        gen.replace('"fieldConfig"', '"fieldConfg"', 1).replace('"mode": "absolute"', '"mode": "absolut"')
    )
    config.write_text(json.dumps({"extends": "./tsconfig.json", "files": ["types.ts", "bad.gen.ts"]}))
    try:
        out = subprocess.run([_tsc(), "-p", str(config)], capture_output=True, text=True, timeout=300)
    finally:
        bad.unlink()
        config.unlink()
    assert out.returncode != 0
    assert "fieldConfg" in out.stdout and "absolut" in out.stdout


def test_the_type_check_catches_an_annotation_field_in_the_target() -> None:
    """The annotation types follow @grafana/prometheus: the old shape, with the annotation's own
    fields inside ``target`` (where Grafana never reads them), does not type-check."""
    gen = (SCHEMA_CHECK / "dashboards.gen.ts").read_text()
    old_shape, n = re.subn(
        r'"useValueForTime": (true|false),(\s*)"target": \{', r'"target": {\2"useValueForTime": \1,', gen
    )
    assert n == 9  # three annotations on each of the three dashboards
    bad = SCHEMA_CHECK / "bad_anno.gen.ts"
    config = SCHEMA_CHECK / "tsconfig.bad_anno.json"
    bad.write_text(old_shape)
    config.write_text(json.dumps({"extends": "./tsconfig.json", "files": ["types.ts", "bad_anno.gen.ts"]}))
    try:
        out = subprocess.run([_tsc(), "-p", str(config)], capture_output=True, text=True, timeout=300)
    finally:
        bad.unlink()
        config.unlink()
    assert out.returncode != 0
    assert out.stdout.count("'\"useValueForTime\"' does not exist in type") == n, out.stdout


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    work = tmp_path_factory.mktemp("dash_prom")
    # every GPU reads as lost, so a fleet alert (InfercostGpuLost, `for` 0 s here) fires and the
    # "Fleet alerts" annotation query has an ALERTS series to return
    exporter = CatalogueExporter({"infercost_gpu_up": 0.0})
    prom = None
    try:
        rules = test_copy_of_rules(RULES, work / "rules.yml", alert_for="0s")
        prom = Prometheus(work, targets=[exporter.target], rule_files=[rules])
        # Recording rules need two scrapes (rate) and one evaluation after them.
        for expr in (
            "model_version:infercost_usd_per_1m_output_tokens:ratio_rate5m",
            "gpu_model:infercost_gpu_dram_bandwidth_ratio:avg5m",
            "node:infercost_gpu_idle_cost_usd_per_hour:rate1h",
            'ALERTS{alertstate="firing"}',
        ):
            assert prom.wait_for(expr, timeout=30), f"{expr} never appeared; log: {prom.log}"
        yield prom
    finally:
        if prom:
            prom.close()
        exporter.close()


def empty_queries(prom: Prometheus, queries: list[tuple[str, str]], timeout: float = 30.0) -> list[str]:
    """Names of the queries that return no series, asking again for up to ``timeout`` seconds
    (a loaded machine scrapes late; subqueries need a few 1 s steps of data)."""
    deadline = time.monotonic() + timeout
    pending = list(queries)
    while True:
        pending = [(name, q) for name, q in pending if not prom.query(q)]
        if not pending or time.monotonic() > deadline:
            return [name for name, _ in pending]
        time.sleep(0.5)


def test_every_panel_query_returns_series(prometheus: Prometheus) -> None:
    assert empty_queries(prometheus, all_queries()) == []


def test_annotation_titles_and_tags_are_labels_of_their_series(prometheus: Prometheus) -> None:
    """Every label an annotation's title and tags name is on each series its query returns
    (Grafana would render a missing one empty, and drop the tag)."""
    for path in DASHBOARDS:
        for a in load(path)["annotations"]["list"]:
            named = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", a["titleFormat"])) | set(a["tagKeys"].split(","))
            result = prometheus.wait_for(substitute(a["target"]["expr"]))
            assert result, f"{path.stem} / {a['name']}: no series"
            for r in result:
                assert named <= set(r["metric"]), (path.stem, a["name"], r["metric"])


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


def _panel_exprs(dashboard: str, title: str) -> list[str]:
    dash = load(DASH_DIR / f"{dashboard}.json")
    (panel,) = [p for p in walk_panels(dash["panels"]) if p["title"] == title]
    return [substitute(t["expr"]) for t in panel["targets"]]


def _by_version(result: list[dict[str, Any]]) -> dict[tuple[str, str], float]:
    return {(r["metric"]["model"], r["metric"]["model_version"]): float(r["value"][1]) for r in result}


def test_prompt_plus_output_is_the_cost_and_waste_is_cost_less_usage(prometheus: Prometheus) -> None:
    """Conservation on the fleet dashboard: the prompt and output lines add up to each version's
    cost per hour from the raw counters, and the waste line is cost − usage (every query at the
    same instant, so the figures agree to float rounding)."""
    assert prometheus.wait_for("rate(infercost_prompt_cost_usd_total[1m])")  # two scrapes in
    at = float(prometheus.query("time()")[0])  # Prometheus' now (a scalar result: [time, value])

    def q(expr: str) -> dict[tuple[str, str], float]:
        return _by_version(prometheus.query(expr, at))

    prompt_q, output_q = _panel_exprs(
        "infercost-fleet", "Cost per hour: prompt vs output by model and version"
    )
    prompt, output = q(prompt_q), q(output_q)
    cost = q("sum by (model, model_version) (rate(infercost_cost_usd_total[1m])) * 3600")
    usage = q("sum by (model, model_version) (rate(infercost_usage_cost_usd_total[1m])) * 3600")
    assert prompt and set(output) == set(cost) and cost
    for key, c in cost.items():
        assert prompt.get(key, 0.0) + output[key] == pytest.approx(c, rel=1e-9, abs=1e-12), key
    (waste_q,) = _panel_exprs("infercost-fleet", "Waste per hour (allocation − usage) by model and version")
    waste = q(waste_q)
    assert waste and set(waste) <= set(usage)
    for key, w in waste.items():
        assert w == pytest.approx(cost[key] - usage[key], rel=1e-9, abs=1e-12), key


# Series a freshly started agent on the simulated node does not export (yet), with why; every
# other query of every dashboard must return data from the real agent.
ABSENT_FROM_A_FRESH_AGENT = {
    "infercost_anomaly_score": "the isolation forest needs two days of history",
    "ALERTS{": "no fleet alert fires on a healthy node",
    "(infercost_alerts_firing{node=~": "no agent alert fires in a minute of simulated time",
    "infercost_outbox_pending": "no Slack, PagerDuty or webhook sink is configured here",
}


@pytest.mark.slow
async def test_every_query_returns_data_from_a_real_agent(tmp_path: Path) -> None:
    """The real daemon (simulated 8-GPU node, fake NVML, accelerated clock, default rules) scraped
    by a real Prometheus with the fleet rules: each panel, variable and annotation query of the
    three dashboards returns series, except the few listed above (a deploy is made so the
    comparison dashboard and the deploy annotations have two versions to show)."""
    import asyncio

    from netutil import async_wait_until

    from agent.app import build_agent
    from agent.clock import AcceleratedClock
    from agent.config import Config, ExportersConfig, IntervalsConfig, NvmlConfig, PrometheusExporterConfig
    from agent.sources.prices import parse_price_book
    from infercost_sim.node import SimNode

    clock = AcceleratedClock(60.0)
    sim = SimNode(clock, tmp_path / "podinfo", target_page_bytes=None)
    await sim.start()
    cfg = Config(
        node="test-node",
        state_dir=tmp_path / "state",
        intervals=IntervalsConfig(nvml_seconds=5, scrape_seconds=10, window_seconds=60),
        nvml=NvmlConfig(backend="fake", fake_count=8),
        exporters=ExportersConfig(prometheus=PrometheusExporterConfig(port=0)),
    )
    book = parse_price_book({"gpus": [{"match": "H100", "usd_per_hour": 2.0}]}, "test-book")
    agent = await build_agent(cfg, clock=clock, book=book, load=sim.gpu_load, engines=sim.engine_configs())
    try:
        async with scraped_by_prometheus(agent, tmp_path, RULES) as p:

            async def has(expr: str) -> bool:
                return bool(await asyncio.to_thread(p.query, expr))

            await async_wait_until(lambda: has("infercost_usd_per_1m_output_tokens"), 60, what="first scrape")
            sim.rollout("llama-70b-canary", "2024-10", 0.65)
            await async_wait_until(
                lambda: has('infercost_deploy_timestamp_seconds{model_version="2024-10"}'), 60, what="deploy"
            )
            await async_wait_until(lambda: has("node:infercost_gpu_idle_cost_usd_per_hour:rate1h"), 60)
            await async_wait_until(
                lambda: has('rate(infercost_generation_tokens_total{model_version="2024-10"}[1m]) > 0'), 60
            )
            await asyncio.sleep(3)  # a few more scrapes for the like-load subqueries
            real = {**SUBSTITUTIONS, "$version_a": "2024-09", "$version_b": "2024-10"}
            queries = [
                (n, q) for n, q in all_queries(real) if not any(k in q for k in ABSENT_FROM_A_FRESH_AGENT)
            ]
            assert await asyncio.to_thread(empty_queries, p, queries) == []
    finally:
        await sim.stop()


def test_the_catalogue_exporter_serves_every_family() -> None:
    """The stand-in exporter of the Prometheus tests knows every label the catalogue uses: a family
    with a label it does not fill would make every scrape of it fail (HTTP 500)."""
    collector = CatalogueCollector({})
    names = {fam.name for fam in collector.collect()}
    assert len(names) == len(CATALOG) + len(HISTOGRAMS)  # the latency histograms too


def test_fleet_latency_quantiles_by_hand(prometheus: Prometheus) -> None:
    """The fleet latency panels interpolate within the summed buckets: the catalogue exporter puts a
    quarter of the requests under 0.1 s, half under 0.5 s, 95 % under 2 s and all under 10 s on
    every node, so p50 = 0.1 + 0.4 × (0.50 − 0.25) / (0.50 − 0.25) = 0.5 s and
    p99 = 2 + 8 × (0.99 − 0.95) / (1 − 0.95) = 8.4 s for every model version and family."""
    for title in (
        "Time to first token p50 and p99 by model and version",
        "Inter-token latency p50 and p99 by model and version",
        "End-to-end latency p50 and p99 by model and version",
    ):
        p50_q, p99_q = _panel_exprs("infercost-fleet", title)
        assert prometheus.wait_for(p99_q), title  # two scrapes in
        p50, p99 = _by_version(prometheus.query(p50_q)), _by_version(prometheus.query(p99_q))
        assert set(p50) == set(p99) == {("llama-3-70b", "v1"), ("llama-3-70b", "v2"), ("qwen2-7b", "2024-06")}
        assert all(v == pytest.approx(0.5) for v in p50.values()), (title, p50)
        assert all(v == pytest.approx(8.4) for v in p99.values()), (title, p99)


def test_fleet_bound_shares_sum_to_one(prometheus: Prometheus) -> None:
    """Each version's dollar shares by bound add up to 1 (the catalogue exporter has one bound per
    series, so each share is exactly 1); the fleet time shares likewise."""
    (q,) = _panel_exprs("infercost-fleet", "Share of GPU dollars by bound, by model and version")
    assert prometheus.wait_for(q)
    got = prometheus.query(q)
    sums: dict[tuple[str, str], float] = {}
    for r in got:
        key = (r["metric"]["model"], r["metric"]["model_version"])
        sums[key] = sums.get(key, 0.0) + float(r["value"][1])
    assert sums and all(v == pytest.approx(1.0) for v in sums.values()), sums
    (q,) = _panel_exprs("infercost-fleet", "Fleet GPU time by bound (share)")
    assert sum(float(r["value"][1]) for r in prometheus.query(q)) == pytest.approx(1.0)
