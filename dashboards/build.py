"""Generate the infercost Grafana dashboards (``infercost-fleet.json``, ``infercost-node.json``).

One table of panels per dashboard, one helper per panel kind, so every panel gets the same
datasource variable, filters and units. Run ``python dashboards/build.py`` after a change and
commit the JSON; ``--check`` exits 1 when the committed JSON is stale (the tests call it too).

PromQL conventions: every selector filters on the template variables with ``=~"$var"`` (the
"All" value is ``.*``); fleet panels read the recording rules of ``rules/prometheus/``; $ per
token is always a ratio of sums.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCHEMA_VERSION = 39  # Grafana 10.3+; panels below use only fields stable since then
DS = {"type": "prometheus", "uid": "${datasource}"}
GRID_WIDTH = 24  # Grafana's grid is 24 columns wide

# Label filters used by the panels (the variables are defined in _templating).
F_NODE = 'node=~"$node"'
F_MODEL = 'node=~"$node", model=~"$model", model_version=~"$model_version"'
F_FLEET_MODEL = 'model=~"$model", model_version=~"$model_version"'
USD = "currencyUSD"  # Grafana unit id
Q_MODELS = 'label_values(infercost_generation_tokens_total{node=~"$node"}, model)'
Q_VERSIONS = 'label_values(infercost_generation_tokens_total{node=~"$node", model=~"$model"}, model_version)'

Panel = dict[str, Any]


def _target(expr: str, legend: str, ref: str, instant: bool = False) -> dict[str, Any]:
    t: dict[str, Any] = {"datasource": DS, "refId": ref, "expr": expr, "legendFormat": legend}
    if instant:
        t["instant"] = True
        t["range"] = False
        t["format"] = "table"
    else:
        t["range"] = True
    return t


def _targets(queries: Sequence[tuple[str, str]], instant: bool = False) -> list[dict[str, Any]]:
    return [_target(e, lg, chr(ord("A") + i), instant) for i, (e, lg) in enumerate(queries)]


def timeseries(
    title: str, queries: Sequence[tuple[str, str]], unit: str, w: int = 12, h: int = 8, desc: str = ""
) -> Panel:
    """A time-series panel."""
    return {
        "type": "timeseries",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": _targets(queries),
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "custom": {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "spanNulls": False},
            },
            "overrides": [],
        },
        "options": {
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["mean", "lastNotNull"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "_size": (w, h),
    }


def stat(title: str, expr: str, unit: str, w: int = 6, h: int = 4, desc: str = "") -> Panel:
    """A single-value panel."""
    return {
        "type": "stat",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": _targets([(expr, "")]),
        "fieldConfig": {"defaults": {"unit": unit, "decimals": 2}, "overrides": []},
        "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}},
        "_size": (w, h),
    }


def table(title: str, expr: str, w: int = 12, h: int = 8, desc: str = "") -> Panel:
    """An instant-query table."""
    return {
        "type": "table",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": _targets([(expr, "")], instant=True),
        "fieldConfig": {"defaults": {}, "overrides": []},
        "options": {"showHeader": True},
        "transformations": [{"id": "organize", "options": {"excludeByName": {"Time": True}}}],
        "_size": (w, h),
    }


def row(title: str) -> Panel:
    """A row header (expanded; the panels after it belong to it)."""
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "_size": (GRID_WIDTH, 1)}


def _layout(panels: Sequence[Panel]) -> list[Panel]:
    """Assign ids and gridPos left to right, wrapping at the grid width."""
    out: list[Panel] = []
    x = y = row_h = 0
    for i, p in enumerate(panels, start=1):
        p = dict(p)
        w, h = p.pop("_size")
        if p["type"] == "row" or x + w > GRID_WIDTH:
            x, y, row_h = 0, y + row_h, 0
        p["id"] = i
        p["gridPos"] = {"h": h, "w": w, "x": x, "y": y}
        x += w
        row_h = max(row_h, h)
        if p["type"] == "row":
            x, y, row_h = 0, y + h, 0
        out.append(p)
    return out


def _query_var(name: str, label: str, query: str, multi: bool = True) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "definition": query,
        "query": {"qryType": 1, "query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "refresh": 2,  # on time-range change: new nodes and versions appear without a reload
        "includeAll": True,
        "allValue": ".*",
        "multi": multi,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
        "hide": 0,
    }


def _templating() -> dict[str, Any]:
    return {
        "list": [
            {
                "name": "datasource",
                "label": "Data source",
                "type": "datasource",
                "query": "prometheus",
                "current": {},
                "hide": 0,
                "refresh": 1,
                "regex": "",
            },
            _query_var("node", "Node", "label_values(infercost_gpu_info, node)"),
            _query_var("model", "Model", Q_MODELS),
            _query_var("model_version", "Model version", Q_VERSIONS),
        ]
    }


def dashboard(uid: str, title: str, description: str, panels: Sequence[Panel]) -> dict[str, Any]:
    """The dashboard envelope."""
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["infercost", "llm", "cost"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "refresh": "1m",
        "time": {"from": "now-24h", "to": "now"},
        "templating": _templating(),
        "annotations": {"list": []},
        "links": [
            {
                "title": "infercost dashboards",
                "type": "dashboards",
                "tags": ["infercost"],
                "asDropdown": True,
                "includeVars": True,
                "keepTime": True,
            }
        ],
        "panels": _layout(panels),
    }


def _ratio(num: str, den: str, by: str, window: str, scale: str = "1e6") -> str:
    """Ratio of sums of two counters' rates, absent where the denominator is 0."""
    return f"sum by ({by}) (rate({num}[{window}]))\n  / (sum by ({by}) (rate({den}[{window}])) > 0) * {scale}"


def fleet() -> dict[str, Any]:
    """The fleet dashboard: $ per token by model and version, idle cost, GPU use, alerts."""
    cost = f"infercost_cost_usd_total{{{F_MODEL}}}"
    gen = f"infercost_generation_tokens_total{{{F_MODEL}}}"
    prompt = f"infercost_prompt_tokens_total{{{F_MODEL}}}"
    panels: list[Panel] = [
        row("Cost"),
        stat(
            "Fleet $ per 1M output tokens (1h)",
            f"sum(rate({cost}[1h])) / (sum(rate({gen}[1h])) > 0) * 1e6",
            USD,
            desc="Ratio of sums over the selection: Σ cost / Σ output tokens.",
        ),
        stat("Fleet cost per hour", f"sum(rate({cost}[$__rate_interval])) * 3600", USD),
        stat(
            "Idle GPU cost per hour",
            f"sum(node:infercost_gpu_idle_cost_usd_per_hour:rate1h{{{F_NODE}}})",
            USD,
            desc="GPU time not used by any engine, or used with no tokens.",
        ),
        stat("Alerts firing", f"sum(infercost_alerts_firing{{{F_NODE}}})", "none"),
        timeseries(
            "$ per 1M output tokens by model and version (5m)",
            [
                (
                    f"model_version:infercost_usd_per_1m_output_tokens:ratio_rate5m{{{F_FLEET_MODEL}}}",
                    "{{model}} {{model_version}}",
                )
            ],
            USD,
            desc="Fleet-wide ratio of sums (recording rule). A gap means the version produced no tokens.",
        ),
        timeseries(
            "$ per 1M output tokens by model and version (1h)",
            [
                (
                    f"model_version:infercost_usd_per_1m_output_tokens:ratio_rate1h{{{F_FLEET_MODEL}}}",
                    "{{model}} {{model_version}}",
                )
            ],
            USD,
        ),
        timeseries(
            "$ per 1M tokens (prompt + output) by model and version",
            [
                (
                    f"sum by (model, model_version) (rate({cost}[$__rate_interval]))\n"
                    f"  / (sum by (model, model_version) (rate({gen}[$__rate_interval]))\n"
                    f"     + sum by (model, model_version) (rate({prompt}[$__rate_interval])) > 0) * 1e6",
                    "{{model}} {{model_version}}",
                )
            ],
            USD,
        ),
        timeseries(
            "Cost per hour by model and version",
            [
                (
                    f"sum by (model, model_version) (rate({cost}[$__rate_interval])) * 3600",
                    "{{model}} {{model_version}}",
                )
            ],
            USD,
        ),
        timeseries(
            "Idle GPU cost per hour by node",
            [(f"node:infercost_gpu_idle_cost_usd_per_hour:rate1h{{{F_NODE}}}", "{{node}}")],
            USD,
        ),
        timeseries(
            "Idle share of GPU cost by node",
            [
                (
                    f"node:infercost_gpu_idle_cost_usd_per_hour:rate1h{{{F_NODE}}}\n"
                    f"  / (node:infercost_gpu_cost_usd_per_hour:rate1h{{{F_NODE}}} > 0)",
                    "{{node}}",
                )
            ],
            "percentunit",
        ),
        row("Throughput"),
        timeseries(
            "Output tokens per second by model",
            [('model:infercost_generation_tokens:rate5m{model=~"$model"}', "{{model}}")],
            "short",
        ),
        timeseries(
            "Prompt tokens per second by model",
            [('model:infercost_prompt_tokens:rate5m{model=~"$model"}', "{{model}}")],
            "short",
        ),
        row("GPUs"),
        timeseries(
            "GPU utilisation by GPU model",
            [("gpu_model:infercost_gpu_utilization_ratio:avg5m", "{{gpu_model}}")],
            "percentunit",
            w=8,
        ),
        timeseries(
            "DRAM bandwidth by GPU model (GPM)",
            [("gpu_model:infercost_gpu_dram_bandwidth_ratio:avg5m", "{{gpu_model}}")],
            "percentunit",
            w=8,
            desc="Real DRAM bandwidth from NVML GPM (Hopper and newer); absent on older GPUs.",
        ),
        timeseries(
            "GPU power by node",
            [(f"sum by (node) (infercost_gpu_power_watts{{{F_NODE}}})", "{{node}}")],
            "watt",
            w=8,
        ),
        timeseries(
            "Roofline efficiency by model and version",
            [
                (
                    f"avg by (model, model_version) (infercost_roofline_efficiency_ratio{{{F_MODEL}}})",
                    "{{model}} {{model_version}}",
                )
            ],
            "percentunit",
            desc="Observed decode tokens/s ÷ the memory-bandwidth ceiling.",
        ),
        timeseries(
            "Model GPU utilisation and memory bandwidth",
            [
                (
                    f"avg by (model, model_version) (infercost_model_gpu_utilization_ratio{{{F_MODEL}}})",
                    "util {{model}} {{model_version}}",
                ),
                (
                    f"avg by (model, model_version) (infercost_model_memory_bandwidth_ratio{{{F_MODEL}}})",
                    "bandwidth {{model}} {{model_version}}",
                ),
            ],
            "percentunit",
        ),
        row("Alerts and delivery"),
        table(
            "Agent alerts firing",
            f"sum by (node, rule, severity) (infercost_alerts_firing{{{F_NODE}}})",
        ),
        table(
            "Notifications pending delivery", f"sum by (node, sink) (infercost_outbox_pending{{{F_NODE}}})"
        ),
    ]
    return dashboard(
        "infercost-fleet",
        "infercost / Fleet",
        "What every token costs across the fleet: $ per 1M tokens by model and version, idle cost, GPU use.",
        panels,
    )


def node() -> dict[str, Any]:
    """The node dashboard: one node's GPUs, engines and models."""
    g = f"{{{F_NODE}}}"
    m = f"{{{F_MODEL}}}"
    by_model = "{{engine}} {{model}} {{model_version}}"
    by_gpu = "{{node}} gpu {{gpu}}"
    panels: list[Panel] = [
        row("Cost"),
        stat("NVML up", f"min(infercost_nvml_up{g})", "none"),
        stat("Engines up", f"sum(infercost_engine_up{g})", "none"),
        stat(
            "Cost per hour",
            f"sum(rate(infercost_gpu_cost_usd_total{g}[$__rate_interval])) * 3600",
            USD,
        ),
        stat("Alerts firing", f"sum(infercost_alerts_firing{g})", "none"),
        timeseries("$ per 1M output tokens", [(f"infercost_usd_per_1m_output_tokens{m}", by_model)], USD),
        timeseries("$ per 1M tokens", [(f"infercost_usd_per_1m_tokens{m}", by_model)], USD),
        timeseries(
            "Cost and idle cost per hour by model",
            [
                (f"rate(infercost_cost_usd_total{m}[$__rate_interval]) * 3600", "cost " + by_model),
                (f"rate(infercost_idle_cost_usd_total{m}[$__rate_interval]) * 3600", "idle " + by_model),
            ],
            USD,
        ),
        timeseries(
            "Idle GPU cost per hour by GPU",
            [(f"rate(infercost_gpu_idle_cost_usd_total{g}[$__rate_interval]) * 3600", by_gpu)],
            USD,
        ),
        row("Throughput and latency"),
        timeseries(
            "Tokens per second",
            [
                (f"infercost_generation_tokens_per_second{m}", "output " + by_model),
                (f"infercost_prompt_tokens_per_second{m}", "prompt " + by_model),
            ],
            "short",
        ),
        timeseries(
            "Latency p99",
            [
                (f"infercost_ttft_p99_seconds{m}", "TTFT " + by_model),
                (f"infercost_itl_p99_seconds{m}", "ITL " + by_model),
            ],
            "s",
        ),
        timeseries(
            "Requests running",
            [(f"infercost_requests_running{m}", by_model)],
            "short",
            w=8,
        ),
        timeseries("KV cache usage", [(f"infercost_kv_cache_usage_ratio{m}", by_model)], "percentunit", w=8),
        timeseries("Anomaly score", [(f"infercost_anomaly_score{m}", by_model)], "short", w=8),
        row("GPUs"),
        timeseries("GPU utilisation", [(f"infercost_gpu_utilization_ratio{g}", by_gpu)], "percentunit", w=8),
        timeseries(
            "DRAM bandwidth (GPM) and memory busy",
            [
                (f"infercost_gpu_dram_bandwidth_ratio{g}", "bandwidth " + by_gpu),
                (f"infercost_gpu_memory_busy_ratio{g}", "busy " + by_gpu),
            ],
            "percentunit",
            w=8,
        ),
        timeseries("SM active (GPM)", [(f"infercost_gpu_sm_active_ratio{g}", by_gpu)], "percentunit", w=8),
        timeseries(
            "Power",
            [
                (f"infercost_gpu_power_watts{g}", by_gpu),
                (f"rate(infercost_gpu_energy_joules_total{g}[$__rate_interval])", "from energy " + by_gpu),
            ],
            "watt",
            w=8,
        ),
        timeseries(
            "Memory used of total",
            [(f"infercost_gpu_memory_used_bytes{g} / infercost_gpu_memory_total_bytes{g}", by_gpu)],
            "percentunit",
            w=8,
        ),
        timeseries("Price per GPU-hour", [(f"infercost_gpu_price_usd_per_hour{g}", by_gpu)], USD, w=8),
        row("Models on the GPUs"),
        timeseries(
            "Roofline efficiency",
            [(f"infercost_roofline_efficiency_ratio{m}", by_model)],
            "percentunit",
            w=8,
        ),
        timeseries(
            "Model GPU utilisation and bandwidth",
            [
                (f"infercost_model_gpu_utilization_ratio{m}", "util " + by_model),
                (f"infercost_model_memory_bandwidth_ratio{m}", "bandwidth " + by_model),
            ],
            "percentunit",
            w=8,
        ),
        timeseries("Model power", [(f"infercost_model_power_watts{m}", by_model)], "watt", w=8),
        row("Engines and delivery"),
        table(
            "Engines",
            f"max by (node, engine, kind) (infercost_engine_up{g})",
            w=8,
        ),
        timeseries(
            "Scrape duration",
            [(f"infercost_engine_scrape_duration_seconds{g}", "{{node}} {{engine}}")],
            "s",
            w=8,
        ),
        table("Alerts firing", f"sum by (node, rule, severity) (infercost_alerts_firing{g})", w=4),
        table("Outbox", f"sum by (node, sink) (infercost_outbox_pending{g})", w=4),
    ]
    return dashboard(
        "infercost-node",
        "infercost / Node",
        "One node: GPUs, engines and the cost of each model version they serve.",
        panels,
    )


DASHBOARDS = {"infercost-fleet.json": fleet, "infercost-node.json": node}


def render(build: Any) -> str:
    """A dashboard as committed: indented JSON with a trailing newline."""
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Write the dashboards (or, with --check, report stale ones)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a committed dashboard is stale")
    args = ap.parse_args(argv)
    stale = []
    for name, build in DASHBOARDS.items():
        path = HERE / name
        text = render(build)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print("stale (run python dashboards/build.py):", ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
