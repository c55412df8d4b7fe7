"""Generate the infercost Grafana dashboards (``infercost-fleet.json``, ``infercost-node.json``,
``infercost-compare.json``) and their type-check file ``schema-check/dashboards.gen.ts``.

One table of panels per dashboard, one helper per panel kind, so every panel gets the same
datasource variable, filters, unit and thresholds. Run ``python dashboards/build.py`` after a change
and commit the output; ``--check`` exits 1 when the committed files are stale (the tests call it).
The generated TypeScript assigns each dashboard to ``@grafana/schema``'s ``Dashboard`` type, and
``tsc`` checks it (``.ci/run``; ``tests/test_dashboards.py``), so a misspelt or misplaced field fails.

PromQL conventions: every selector filters on the template variables with ``=~"$var"`` (the "All"
value is ``.*``), ``$node`` included — fleet panels read the raw counters (or ``node:`` recording
rules, which keep the node label), so picking nodes narrows every panel; the exception is the fleet
rules' ``cluster_model_version:`` series (whole clusters, no node label), which the fleet and
comparison panels reading them filter on ``$cluster`` instead. $ per token is always a ratio of sums.
Thresholds: each panel has a unit and a thresholds scale chosen for what it shows (``Scale``), with
the reason next to the scale; $ panels are neutral (no red at Grafana's default 80). Annotations are
in the shape Grafana's Prometheus data source reads (``_annotation``), filtered by the dashboard's
own variables.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCHEMA_VERSION = 39  # Grafana 10.3+; panels below use only fields stable since then
DS = {"type": "prometheus", "uid": "${datasource}"}
GRID_WIDTH = 24  # Grafana's grid is 24 columns wide

# The fleet rules' $ per 1M output tokens by (cluster, model, model_version), less its window (5m, 1h):
# whole clusters, so the node and engine selections cannot apply to them.
CLUSTER_USD_PER_1M = "cluster_model_version:infercost_usd_per_1m_output_tokens:ratio_rate"
F_CLUSTER = 'cluster=~"$cluster"'

# Label filters used by the panels (the variables are defined in _templating).
F_NODE = 'node=~"$node"'
F_ENGINE = 'node=~"$node", engine=~"$engine"'
F_MODEL = 'node=~"$node", engine=~"$engine", model=~"$model", model_version=~"$model_version"'
DEPLOYS_FILTER = 'node=~"$node", engine=~"$engine", model=~"$model"'
Q_CLUSTERS = f"label_values({CLUSTER_USD_PER_1M}1h, cluster)"
# Engines of the chosen namespaces and teams (infercost_engine_cost_info): every panel filters on
# $engine, so picking a namespace or a team narrows them all; a node without a team cost label
# matches the "All" value (.*) as well
F_OWNER = 'node=~"$node", engine_namespace=~"$namespace", label_team=~"$team"'
Q_NAMESPACES = 'label_values(infercost_engine_cost_info{node=~"$node"}, engine_namespace)'
Q_TEAMS = (
    'label_values(infercost_engine_cost_info{node=~"$node", engine_namespace=~"$namespace"}, label_team)'
)
Q_ENGINES = f"label_values(infercost_engine_cost_info{{{F_OWNER}}}, engine)"
Q_MODELS = 'label_values(infercost_generation_tokens_total{node=~"$node", engine=~"$engine"}, model)'
Q_VERSIONS = (
    'label_values(infercost_generation_tokens_total{node=~"$node", engine=~"$engine", model=~"$model"}, '
    "model_version)"
)

Panel = dict[str, Any]

# Colours (Grafana named colours).
GREEN, ORANGE, RED, BLUE, TEXT = "green", "orange", "red", "blue", "text"


@dataclass(frozen=True, slots=True)
class Scale:
    """A unit and a thresholds scale: ``steps`` are (from value, colour), the first from -∞."""

    unit: str
    steps: tuple[tuple[float | None, str], ...] = ((None, TEXT),)
    mappings: tuple[dict[str, Any], ...] = ()
    min: float | None = None
    max: float | None = None
    show_thresholds: bool = False  # draw the threshold lines on time series
    extra: dict[str, Any] = field(default_factory=dict)

    def field_defaults(self) -> dict[str, Any]:
        """``fieldConfig.defaults`` for this scale."""
        out: dict[str, Any] = {
            "unit": self.unit,
            "thresholds": {
                "mode": "absolute",
                "steps": [{"value": v, "color": c} for v, c in self.steps],
            },
        }
        if self.mappings:
            out["mappings"] = list(self.mappings)
        if self.min is not None:
            out["min"] = self.min
        if self.max is not None:
            out["max"] = self.max
        out.update(self.extra)
        return out


def _up_mapping() -> tuple[dict[str, Any], ...]:
    return (
        {
            "type": "value",
            "options": {
                "0": {"text": "down", "color": RED, "index": 0},
                "1": {"text": "up", "color": GREEN, "index": 1},
            },
        },
    )


# $: neutral — a bill is not good or bad by size (Grafana's default would colour $80/h red).
USD = Scale("currencyUSD")
# $ per 1M tokens: neutral too; regressions are relative and the alert rules judge them.
USD_PER_1M = Scale("currencyUSD")
# 1 = up (green), 0 = down (red): a source not answering is the one thing that must stand out.
UP = Scale("none", ((None, RED), (1, GREEN)), _up_mapping(), min=0, max=1)
# Engines up is a count: red at 0 (nothing scraped), green from 1.
COUNT_UP = Scale("none", ((None, RED), (1, GREEN)), min=0)
# Alerts firing: 0 green, any firing red.
ALERTS = Scale("none", ((None, GREEN), (1, RED)), min=0)
# GPU utilisation: continuous batching keeps busy GPUs at 85–95 %; under 60 % at steady traffic is a
# cost finding (DESIGN.md), so orange below 0.6.
UTIL = Scale("percentunit", ((None, ORANGE), (0.6, GREEN)), min=0, max=1, show_thresholds=True)
# Plain fractions without a good or bad level (bandwidth share, SM activity, memory in use).
RATIO = Scale("percentunit", min=0, max=1)
# Idle share of cost: InfercostGpuIdleCostBurn fires above 50 %.
IDLE_SHARE = Scale("percentunit", ((None, GREEN), (0.5, ORANGE)), min=0, max=1, show_thresholds=True)
# KV cache: the agent's kv_cache_pressure rule fires above 95 % (with preemptions).
KV = Scale("percentunit", ((None, GREEN), (0.95, RED)), min=0, max=1, show_thresholds=True)
# Roofline efficiency: judged against the model's own 7-day p75 by the agent, so no fixed level.
ROOFLINE = Scale("percentunit", min=0)
# Anomaly score: normalised so that above 1 is anomalous.
ANOMALY = Scale("none", ((None, GREEN), (1, RED)), min=0, show_thresholds=True)
TOKENS_PER_S = Scale("suffix: tok/s", min=0)  # throughput: more is neither good nor bad by itself
REQUESTS = Scale("suffix: req", min=0)
SECONDS = Scale("s", min=0)  # latency levels are SLOs of their own; the rules compare with baselines
WATTS = Scale("watt", min=0)
PENDING = Scale("none", min=0)  # transient backlogs are normal; InfercostOutbox rules judge a stuck one


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
    title: str, queries: Sequence[tuple[str, str]], scale: Scale, w: int = 12, h: int = 8, desc: str = ""
) -> Panel:
    """A time-series panel."""
    defaults = scale.field_defaults()
    defaults["custom"] = {
        "drawStyle": "line",
        "lineWidth": 1,
        "fillOpacity": 10,
        "spanNulls": False,
        "thresholdsStyle": {"mode": "dashed" if scale.show_thresholds else "off"},
    }
    return {
        "type": "timeseries",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": _targets(queries),
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["mean", "lastNotNull"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "_size": (w, h),
    }


def stat(title: str, expr: str, scale: Scale, w: int = 6, h: int = 4, desc: str = "") -> Panel:
    """A single-value panel, coloured by its thresholds (neutral ones show plain text)."""
    defaults = scale.field_defaults()
    defaults["decimals"] = 2 if scale.unit == "currencyUSD" else 0 if scale.unit == "none" else 3
    return {
        "type": "stat",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": _targets([(expr, "")]),
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value" if len(scale.steps) > 1 else "none",
            "graphMode": "none",
        },
        "_size": (w, h),
    }


def table(title: str, expr: str, scale: Scale, w: int = 12, h: int = 8, desc: str = "") -> Panel:
    """An instant-query table (the value column coloured by the scale)."""
    defaults = scale.field_defaults()
    if len(scale.steps) > 1:
        defaults["custom"] = {"cellOptions": {"type": "color-text"}}
    return {
        "type": "table",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": _targets([(expr, "")], instant=True),
        "fieldConfig": {"defaults": defaults, "overrides": []},
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
        "query": {"qryType": 1, "query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "refresh": 2,  # on time-range change: new nodes and versions appear without a reload
        "includeAll": multi,
        "allValue": ".*",
        "multi": multi,
        "sort": 1,
        "hide": 0,
    } | ({"current": {"selected": True, "text": ["All"], "value": ["$__all"]}} if multi else {})


def _textbox(name: str, label: str, default: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "textbox",
        "query": default,
        "current": {"selected": False, "text": default, "value": default},
        "hide": 0,
    }


def _cluster_var() -> dict[str, Any]:
    """The clusters the fleet recording rules name (they keep a ``cluster`` label where the scrape
    sets one): it filters the panels that read those ``cluster_model_version:`` series."""
    return _query_var("cluster", "Cluster", Q_CLUSTERS)


def _datasource_var() -> dict[str, Any]:
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "hide": 0,
        "refresh": 1,
        "regex": "",
    }


def _templating(cluster: bool) -> dict[str, Any]:
    return {
        "list": [
            _datasource_var(),
            *([_cluster_var()] if cluster else []),
            _query_var("node", "Node", "label_values(infercost_gpu_info, node)"),
            _query_var("namespace", "Namespace", Q_NAMESPACES),
            _query_var("team", "Team", Q_TEAMS),
            _query_var("engine", "Engine", Q_ENGINES),
            _query_var("model", "Model", Q_MODELS),
            _query_var("model_version", "Model version", Q_VERSIONS),
        ]
    }


# Where Grafana's Prometheus annotation support reads each field (@grafana/prometheus
# src/annotations.ts; tests/test_dashboards_grafana.py holds the key lists): ``processEvents`` reads
# the title, text, tag keys and "series value as timestamp" from the annotation itself, and
# ``prepareAnnotation`` keeps the query and its minimum step under ``target`` (as ``expr`` and
# ``interval``; a top-level ``expr`` or ``step`` is moved there).
# Why 60 s: Grafana joins active samples no more than one step apart into one region, and a
# minute is the agent's window (and Grafana's default annotation step).
ANNOTATION_STEP = "60s"


def _annotation(
    name: str, color: str, expr: str, title: str, text: str, tags: str, value_time: bool
) -> Panel:
    """A Prometheus annotation query, in the shape Grafana's Prometheus data source reads."""
    return {
        "name": name,
        "datasource": DS,
        "enable": True,
        "iconColor": color,
        "titleFormat": title,
        "textFormat": text,
        "tagKeys": tags,
        "useValueForTime": value_time,
        "target": {"refId": "Anno", "expr": expr, "interval": ANNOTATION_STEP},
    }


def prometheus_annotations(deploys: str, nodes: str) -> list[Panel]:
    """Deploy markers and alert regions; ``deploys`` and ``nodes`` are the label filters (from the
    dashboard's own variables) for the deploy markers and the agents' alerts."""
    return [
        # Deploys: the agent exports when it saw a model version replace another (epoch seconds);
        # Grafana places each marker at that value (×1000: milliseconds).
        _annotation(
            "Deploys",
            BLUE,
            "max by (node, engine, model, model_version) "
            f"(infercost_deploy_timestamp_seconds{{{deploys}}}) * 1000",
            "deploy {{model}} {{model_version}}",
            "{{engine}} on {{node}}",
            "engine,model,model_version",
            True,
        ),
        # Fleet alerts (Prometheus' own ALERTS series) and the agents' alerts, as regions while firing.
        _annotation(
            "Fleet alerts",
            RED,
            'ALERTS{alertstate="firing", alertname=~"Infercost.*"}',
            "{{alertname}}",
            "{{severity}} {{model}} {{model_version}} {{node}}",
            "alertname,severity",
            False,
        ),
        _annotation(
            "Agent alerts",
            ORANGE,
            f"sum by (node, rule, severity) (infercost_alerts_firing{{{nodes}}}) > 0",
            "{{rule}}",
            "{{severity}} on {{node}}",
            "rule,severity",
            False,
        ),
    ]


def dashboard(
    uid: str,
    title: str,
    description: str,
    panels: Sequence[Panel],
    templating: dict[str, Any],
    annotation_list: Sequence[Panel],
    time_from: str = "now-24h",
) -> dict[str, Any]:
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
        "time": {"from": time_from, "to": "now"},
        "templating": templating,
        "annotations": {"list": list(annotation_list)},
        "links": [
            {
                "title": "infercost dashboards",
                "type": "dashboards",
                "tags": ["infercost"],
                "asDropdown": True,
                "includeVars": True,
                "keepTime": True,
                "icon": "external link",
                "targetBlank": False,
                "tooltip": "",
            }
        ],
        "panels": _layout(panels),
    }


def _sum_rate(metric: str, filters: str, by: str, window: str = "$__rate_interval") -> str:
    grouping = f"sum by ({by}) " if by else "sum "
    return f"{grouping}(rate({metric}{{{filters}}}[{window}]))"


def _by_owner(metric: str, filters: str, label: str) -> str:
    """Σ rate of a model-version counter per hour by one label of its engine's cost identity."""
    info = f"max by (node, engine, {label}) (infercost_engine_cost_info{{{F_OWNER}}})"
    return (
        f"sum by ({label}) (rate({metric}{{{filters}}}[$__rate_interval])\n"
        f"  * on (node, engine) group_left ({label}) {info}) * 3600"
    )


def _per_1m(cost: str, tokens: str, filters: str, by: str, window: str) -> str:
    """$ per 1M tokens as a ratio of sums; absent where no tokens were made."""
    return f"{_sum_rate(cost, filters, by, window)}\n  / ({_sum_rate(tokens, filters, by, window)} > 0) * 1e6"


SERIES_ON = "on (node, engine, model, model_version)"  # one model version's series on one node


def _sum_rate_where(metric: str, filters: str, by: str, has: str, window: str) -> str:
    """Σ rate of ``metric`` over only the series that also export ``has`` (e.g. the tokens of the
    model versions whose engine reports phase times), so a ratio covers the same series."""
    grouping = f"sum by ({by}) " if by else "sum "
    return f"{grouping}(rate({metric}{{{filters}}}[{window}])\n    and {SERIES_ON} {has}{{{filters}}})"


def dollar_panels_fleet(m: str, mv: str, by_mv: str) -> list[Panel]:
    """Where the dollars went, fleet-wide: prompt vs output, allocation − usage (waste), the cost
    floor, prefix-cache savings (raw counters: ratios of sums over the selection)."""
    cost, gen = "infercost_cost_usd_total", "infercost_generation_tokens_total"
    prompt, pcost = "infercost_prompt_tokens_total", "infercost_prompt_cost_usd_total"
    usage = "infercost_usage_cost_usd_total"
    floor = "infercost_usd_per_1m_output_tokens_floor"
    floor_max = "infercost_usd_per_1m_output_tokens_floor_max_batch"
    w = "1h"

    def floor_weighted(gauge: str) -> str:  # the floor weighted by each series' output tokens
        return (
            f"sum by ({mv}) ({gauge}{{{m}}} * {SERIES_ON} rate({gen}{{{m}}}[{w}]))\n"
            f"  / ({_sum_rate_where(gen, m, mv, gauge, w)} > 0)"
        )

    return [
        row("Where the dollars went"),
        timeseries(
            "$ per 1M prompt tokens and output tokens (decode share) by model and version (1h)",
            [
                (
                    f"{_sum_rate(pcost, m, mv, w)}\n"
                    f"  / ({_sum_rate_where(prompt, m, mv, pcost, w)} > 0) * 1e6",
                    "prompt " + by_mv,
                ),
                (
                    f"({_sum_rate_where(cost, m, mv, pcost, w)} - {_sum_rate(pcost, m, mv, w)})\n"
                    f"  / ({_sum_rate_where(gen, m, mv, pcost, w)} > 0) * 1e6",
                    "output " + by_mv,
                ),
            ],
            USD_PER_1M,
            desc="Cost split by prefill vs decode request time, over the model versions whose engine "
            "reports both (absent otherwise); the all-in $ per 1M output tokens is above.",
        ),
        timeseries(
            "Cost per hour: prompt vs output by model and version",
            [
                (f"{_sum_rate(pcost, m, mv)} * 3600", "prompt " + by_mv),
                (
                    f"({_sum_rate(cost, m, mv)}\n"
                    f"  - ({_sum_rate(pcost, m, mv)} or {_sum_rate(cost, m, mv)} * 0)) * 3600",
                    "output " + by_mv,
                ),
            ],
            USD,
            desc="prompt + output = the model's cost; without phase times all of it is output.",
        ),
        stat(
            "Waste per hour (allocation − usage)",
            f"({_sum_rate_where(cost, m, '', usage, w)}\n  - {_sum_rate(usage, m, '', w)}) * 3600",
            USD,
            desc="Dollars of GPU time held while no kernel ran (NVML busy time), over the last hour.",
        ),
        timeseries(
            "Waste per hour (allocation − usage) by model and version",
            [
                (
                    f"({_sum_rate_where(cost, m, mv, usage, '$__rate_interval')}\n"
                    f"  - {_sum_rate(usage, m, mv)}) * 3600",
                    by_mv,
                )
            ],
            USD,
            w=18,
        ),
        timeseries(
            "You pay vs the cost floor: $ per 1M output tokens (1h)",
            [
                (_per_1m(cost, gen, m, mv, w), "pay " + by_mv),
                (floor_weighted(floor), "floor at this batch " + by_mv),
                (floor_weighted(floor_max), "floor at the largest batch " + by_mv),
            ],
            USD_PER_1M,
            desc="The floor: the same dollars per second at the bandwidth roofline's tokens/s, for the "
            "running batch and for the largest batch the KV cache holds (weighted by output tokens).",
        ),
        timeseries(
            "Prefix-cache savings per hour by model and version",
            [(f"{_sum_rate('infercost_prefix_cache_saved_usd_total', m, mv)} * 3600", by_mv)],
            USD,
            desc="What the prompt tokens served from the prefix cache would have cost to compute.",
        ),
    ]


def dollar_panels_node(m: str, by_model: str) -> list[Panel]:
    """Where the dollars went on one node: the agent's trailing gauges and counters."""
    floor_max = "infercost_usd_per_1m_output_tokens_floor_max_batch"
    return [
        row("Where the dollars went"),
        timeseries(
            "$ per 1M: prompt, output (decode share), all-in output",
            [
                (f"infercost_usd_per_1m_prompt_tokens{m}", "prompt " + by_model),
                (f"infercost_usd_per_1m_output_tokens_decode{m}", "output (decode) " + by_model),
                (f"infercost_usd_per_1m_output_tokens{m}", "output all-in " + by_model),
            ],
            USD_PER_1M,
            w=8,
        ),
        timeseries(
            "You pay vs the cost floor ($ per 1M output tokens)",
            [
                (f"infercost_usd_per_1m_output_tokens{m}", "pay " + by_model),
                (f"infercost_usd_per_1m_output_tokens_floor{m}", "floor at this batch " + by_model),
                (f"{floor_max}{m}", "floor at the largest batch " + by_model),
            ],
            USD_PER_1M,
            w=8,
        ),
        timeseries(
            "Waste per hour (allocation − usage)",
            [
                (
                    f"(rate(infercost_cost_usd_total{m}[$__rate_interval])\n"
                    f"  - rate(infercost_usage_cost_usd_total{m}[$__rate_interval])) * 3600",
                    by_model,
                )
            ],
            USD,
            w=8,
        ),
    ]


BYTES_PER_S = Scale("Bps", min=0)  # link throughput: its share of the peak is judged by the bound split


FACTOR = Scale("suffix: ×", min=0)  # how many times the ideal a factor costs (1 = none of it)


def factor_panels_node(m: str, by_model: str) -> list[Panel]:
    """Why cost per token moves (docs/cost-model.md, the factor waterfall): each factor from its own
    series, ratios of rates (``infercost explain`` splits a change into them)."""

    def r(metric: str) -> str:
        return f"rate({metric}{m}[$__rate_interval])"

    cost = r("infercost_cost_usd_total")
    return [
        row("Why cost per token moves (factors)"),
        timeseries(
            "Price: $ per allocated GPU-hour",
            [(f"{cost} / {r('infercost_gpu_seconds_total')} * 3600", by_model)],
            USD,
            w=12,
        ),
        timeseries(
            "Idle, mix and step efficiency (× the ideal)",
            [
                (f"{cost} / {r('infercost_usage_cost_usd_total')}", "idle (allocated ÷ busy) " + by_model),
                (
                    f"{cost} / ({cost} - {r('infercost_prompt_cost_usd_total')})",
                    "mix (busy ÷ decode) " + by_model,
                ),
                (f"1 / infercost_roofline_efficiency_ratio{m}", "step ÷ roofline step " + by_model),
            ],
            FACTOR,
            w=12,
        ),
    ]


def bound_panels_node(m: str, g: str, by_model: str, by_gpu: str) -> list[Panel]:
    """Where GPU time goes on one node (agent/cost/bound.py): each model version's GPU time and
    dollars by what bound them, and the GPM readings the split is made from."""
    by = "node, engine, model, model_version"
    secs = f"sum by ({by}, bound) (rate(infercost_gpu_time_bound_seconds_total{m}[$__rate_interval]))"
    total = f"sum by ({by}) (rate(infercost_gpu_time_bound_seconds_total{m}[$__rate_interval]))"
    usd = f"sum by ({by}, bound) (rate(infercost_cost_bound_usd_total{m}[$__rate_interval]))"
    absent = "Absent where GPM cannot measure every GPU of the version (pre-Hopper, MIG, NotSupported)."
    return [
        row("Where GPU time goes"),
        timeseries(
            "GPU time by bound (share)",
            [(f"{secs}\n  / ignoring (bound) group_left\n  {total}", "{{bound}} " + by_model)],
            RATIO,
            desc="Compute (tensor cores), memory (DRAM bandwidth), communication (PCIe/NVLink) or idle "
            "(no SM activity), from NVML GPM. " + absent,
        ),
        timeseries(
            "Dollars per hour by bound",
            [(f"{usd} * 3600", "{{bound}} " + by_model)],
            USD,
            desc=absent,
        ),
        timeseries(
            "Tensor cores and SM occupancy (GPM)",
            [
                (f"infercost_gpu_tensor_active_ratio{g}", "tensor " + by_gpu),
                (f"infercost_gpu_sm_occupancy_ratio{g}", "occupancy " + by_gpu),
            ],
            RATIO,
        ),
        timeseries(
            "PCIe and NVLink throughput (GPM)",
            [
                (f"infercost_gpu_pcie_rx_bytes_per_second{g}", "PCIe rx " + by_gpu),
                (f"infercost_gpu_pcie_tx_bytes_per_second{g}", "PCIe tx " + by_gpu),
                (f"infercost_gpu_nvlink_rx_bytes_per_second{g}", "NVLink rx " + by_gpu),
                (f"infercost_gpu_nvlink_tx_bytes_per_second{g}", "NVLink tx " + by_gpu),
            ],
            BYTES_PER_S,
        ),
    ]


def bound_panels_fleet(m: str, mv: str, by_mv: str) -> list[Panel]:
    """Where GPU time goes across the fleet (agent/cost/bound.py): the selection's GPU time and
    dollars by bound, each version's dollar shares, and how much of the cost has a split at all."""
    secs, usd = "infercost_gpu_time_bound_seconds_total", "infercost_cost_bound_usd_total"
    absent = (
        "Shares are of the GPU time (dollars) that has a split: GPUs without NVML GPM (pre-Hopper, "
        "MIG, NotSupported) export none, so they count as no bound rather than as idle."
    )
    return [
        row("Where GPU time goes"),
        stat(
            "Share of cost with a bound split (1h)",
            f"{_sum_rate(usd, m, '', '1h')}\n  / ({_sum_rate('infercost_cost_usd_total', m, '', '1h')} > 0)",
            RATIO,
            w=6,
            desc="Σ bound dollars ÷ Σ cost over the selection: how much of the cost the panels beside "
            "it explain. " + absent,
        ),
        timeseries(
            "Fleet GPU time by bound (share)",
            [
                (
                    f"{_sum_rate(secs, m, 'bound')}\n  / ignoring (bound) group_left\n  "
                    f"{_sum_rate(secs, m, '')}",
                    "{{bound}}",
                )
            ],
            RATIO,
            w=9,
            desc="Compute (tensor cores), memory (DRAM bandwidth), communication (PCIe/NVLink) or idle "
            "(no SM activity), from NVML GPM. " + absent,
        ),
        timeseries(
            "Fleet dollars per hour by bound",
            [(f"{_sum_rate(usd, m, 'bound')} * 3600", "{{bound}}")],
            USD,
            w=9,
            desc=absent,
        ),
        timeseries(
            "Share of GPU dollars by bound, by model and version",
            [
                (
                    f"{_sum_rate(usd, m, mv + ', bound')}\n  / ignoring (bound) group_left ()\n  "
                    f"({_sum_rate(usd, m, mv)} > 0)",
                    "{{bound}} " + by_mv,
                )
            ],
            RATIO,
            w=24,
            desc="Which versions pay for memory-bound or idle time. " + absent,
        ),
    ]


def _quantile(q: float, family: str, m: str, mv: str) -> str:
    """The q-quantile of a re-based latency histogram, from the buckets' rates summed across nodes."""
    return (
        f"histogram_quantile({q:g}, sum by ({mv}, le) "
        f"(rate(infercost_{family}_seconds_bucket{{{m}}}[$__rate_interval])))"
    )


def latency_panels_fleet(m: str, mv: str, by_mv: str) -> list[Panel]:
    """Latency per model version across the fleet: p50 and p99 from the engines' histograms as the
    agents re-base them (summed bucket rates, so nodes aggregate correctly; the per-node p99 gauges
    cannot be averaged into a fleet p99)."""
    out = [row("Latency")]
    for family, title in (
        ("ttft", "Time to first token"),
        ("itl", "Inter-token latency"),
        ("e2e", "End-to-end latency"),
    ):
        out.append(
            timeseries(
                f"{title} p50 and p99 by model and version",
                [
                    (_quantile(0.5, family, m, mv), "p50 " + by_mv),
                    (_quantile(0.99, family, m, mv), "p99 " + by_mv),
                ],
                SECONDS,
                w=8,
                desc="Interpolated within the engine's own buckets: a quantile is only as fine as they are, "
                "and a version served by engines with different bucket layouts mixes them. Absent for "
                "engines that expose no such histogram (llama.cpp none, TGI no TTFT, Triton TTFT only).",
            )
        )
    return out


CLUSTER_DESC = (
    "From the fleet recording rules, which keep the cluster label (empty where the scrape sets "
    "none): whole clusters, so the node and engine selections do not apply."
)


def cluster_panels_fleet() -> list[Panel]:
    """$ per 1M output tokens by cluster, model and version, from the fleet recording rules."""
    sel = f'{F_CLUSTER}, model=~"$model", model_version=~"$model_version"'
    return [
        timeseries(
            f"$ per 1M output tokens by cluster, model and version ({window})",
            [(f"{CLUSTER_USD_PER_1M}{window}{{{sel}}}", "{{cluster}} {{model}} {{model_version}}")],
            USD_PER_1M,
            desc=CLUSTER_DESC,
        )
        for window in ("5m", "1h")
    ]


def fleet() -> dict[str, Any]:
    """The fleet dashboard: $ per token by model and version, idle cost, GPU use, alerts."""
    m = F_MODEL
    mv = "model, model_version"
    by_mv = "{{model}} {{model_version}}"
    gpu_model_join = (
        "* on (node, gpu) group_left (gpu_model)"
        f" max by (node, gpu, gpu_model) (infercost_gpu_info{{{F_NODE}}})"
    )
    panels: list[Panel] = [
        row("Cost"),
        stat(
            "Fleet $ per 1M output tokens (1h)",
            _per_1m("infercost_cost_usd_total", "infercost_generation_tokens_total", m, "", "1h"),
            USD_PER_1M,
            desc="Ratio of sums over the selection: Σ cost / Σ output tokens.",
        ),
        stat("Fleet cost per hour", f"{_sum_rate('infercost_gpu_cost_usd_total', F_NODE, '')} * 3600", USD),
        stat(
            "Idle GPU cost per hour",
            f"sum(node:infercost_gpu_idle_cost_usd_per_hour:rate1h{{{F_NODE}}})",
            USD,
            desc="GPU time not used by any engine, or used with no tokens.",
        ),
        stat(
            "Alerts firing",
            f'sum(infercost_alerts_firing{{{F_NODE}}}) + (sum(ALERTS{{alertstate="firing", '
            f'alertname=~"Infercost.*", node=~"$node"}}) or vector(0))',
            ALERTS,
            desc="The agents' alerts plus the fleet rules' alerts; 0 when nothing fires.",
        ),
        timeseries(
            "$ per 1M output tokens by model and version (5m)",
            [(_per_1m("infercost_cost_usd_total", "infercost_generation_tokens_total", m, mv, "5m"), by_mv)],
            USD_PER_1M,
            desc="Ratio of sums over the selected nodes. A gap means the version produced no tokens.",
        ),
        timeseries(
            "$ per 1M output tokens by model and version (1h)",
            [(_per_1m("infercost_cost_usd_total", "infercost_generation_tokens_total", m, mv, "1h"), by_mv)],
            USD_PER_1M,
        ),
        *cluster_panels_fleet(),
        timeseries(
            "$ per 1M tokens (prompt + output) by model and version",
            [
                (
                    f"{_sum_rate('infercost_cost_usd_total', m, mv)}\n"
                    f"  / ({_sum_rate('infercost_generation_tokens_total', m, mv)}\n"
                    f"     + {_sum_rate('infercost_prompt_tokens_total', m, mv)} > 0) * 1e6",
                    by_mv,
                )
            ],
            USD_PER_1M,
        ),
        timeseries(
            "Cost per hour by model and version",
            [(f"{_sum_rate('infercost_cost_usd_total', m, mv)} * 3600", by_mv)],
            USD,
        ),
        *(
            timeseries(
                f"Cost per hour by {what}",
                [(_by_owner("infercost_cost_usd_total", m, label), f"{{{{{label}}}}}")],
                USD,
                desc=f"Each engine's dollars under its {what} (infercost_engine_cost_info; the agent's "
                "/api/v1/cost answers the same by any cost label).",
            )
            for what, label in (("namespace", "engine_namespace"), ("team", "label_team"))
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
            IDLE_SHARE,
        ),
        *dollar_panels_fleet(m, mv, by_mv),
        *bound_panels_fleet(m, mv, by_mv),
        *latency_panels_fleet(m, mv, by_mv),
        row("Throughput"),
        timeseries(
            "Output tokens per second by model",
            [(_sum_rate("infercost_generation_tokens_total", m, "model"), "{{model}}")],
            TOKENS_PER_S,
        ),
        timeseries(
            "Prompt tokens per second by model",
            [(_sum_rate("infercost_prompt_tokens_total", m, "model"), "{{model}}")],
            TOKENS_PER_S,
        ),
        row("GPUs"),
        timeseries(
            "GPU utilisation by GPU model",
            [
                (
                    "avg by (gpu_model) (\n"
                    f"  avg_over_time(infercost_gpu_utilization_ratio{{{F_NODE}}}[5m])\n"
                    f"    {gpu_model_join}\n)",
                    "{{gpu_model}}",
                )
            ],
            UTIL,
            w=8,
        ),
        timeseries(
            "DRAM bandwidth by GPU model (GPM)",
            [
                (
                    "avg by (gpu_model) (\n"
                    f"  avg_over_time(infercost_gpu_dram_bandwidth_ratio{{{F_NODE}}}[5m])\n"
                    f"    {gpu_model_join}\n)",
                    "{{gpu_model}}",
                )
            ],
            RATIO,
            w=8,
            desc="Real DRAM bandwidth from NVML GPM (Hopper and newer); absent on older GPUs.",
        ),
        timeseries(
            "GPU power by node",
            [(f"sum by (node) (infercost_gpu_power_watts{{{F_NODE}}})", "{{node}}")],
            WATTS,
            w=8,
        ),
        timeseries(
            "Roofline efficiency by model and version",
            [(f"avg by ({mv}) (infercost_roofline_efficiency_ratio{{{m}}})", by_mv)],
            ROOFLINE,
            desc="Observed decode tokens/s ÷ the memory-bandwidth ceiling.",
        ),
        timeseries(
            "Model GPU utilisation and memory bandwidth",
            [
                (f"avg by ({mv}) (infercost_model_gpu_utilization_ratio{{{m}}})", "util " + by_mv),
                (f"avg by ({mv}) (infercost_model_memory_bandwidth_ratio{{{m}}})", "bandwidth " + by_mv),
            ],
            UTIL,
        ),
        row("Alerts and delivery"),
        table(
            "Agent alerts firing",
            f"sum by (node, rule, severity) (infercost_alerts_firing{{{F_NODE}}})",
            ALERTS,
        ),
        table(
            "Notifications pending delivery",
            f"sum by (node, sink) (infercost_outbox_pending{{{F_NODE}}})",
            PENDING,
        ),
    ]
    return dashboard(
        "infercost-fleet",
        "infercost / Fleet",
        "What every token costs across the fleet: $ per 1M tokens by model and version, idle cost, GPU use.",
        panels,
        _templating(cluster=True),
        prometheus_annotations(DEPLOYS_FILTER, F_NODE),
    )


def node() -> dict[str, Any]:
    """The node dashboard: one node's GPUs, engines and models."""
    g = f"{{{F_NODE}}}"
    e = f"{{{F_ENGINE}}}"
    m = f"{{{F_MODEL}}}"
    by_model = "{{engine}} {{model}} {{model_version}}"
    by_gpu = "{{node}} gpu {{gpu}}"
    panels: list[Panel] = [
        row("Cost"),
        stat("NVML up", f"min(infercost_nvml_up{g})", UP),
        stat("Engines up", f"sum(infercost_engine_up{e})", COUNT_UP),
        stat(
            "Cost per hour",
            f"sum(rate(infercost_gpu_cost_usd_total{g}[$__rate_interval])) * 3600",
            USD,
        ),
        stat("Alerts firing", f"sum(infercost_alerts_firing{g})", ALERTS),
        timeseries(
            "$ per 1M output tokens", [(f"infercost_usd_per_1m_output_tokens{m}", by_model)], USD_PER_1M
        ),
        timeseries("$ per 1M tokens", [(f"infercost_usd_per_1m_tokens{m}", by_model)], USD_PER_1M),
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
        *dollar_panels_node(m, by_model),
        *factor_panels_node(m, by_model),
        *bound_panels_node(m, g, by_model, by_gpu),
        row("Throughput and latency"),
        timeseries(
            "Tokens per second",
            [
                (f"infercost_generation_tokens_per_second{m}", "output " + by_model),
                (f"infercost_prompt_tokens_per_second{m}", "prompt " + by_model),
            ],
            TOKENS_PER_S,
        ),
        timeseries(
            "Latency p99",
            [
                (f"infercost_ttft_p99_seconds{m}", "TTFT " + by_model),
                (f"infercost_itl_p99_seconds{m}", "ITL " + by_model),
            ],
            SECONDS,
        ),
        timeseries("Requests running", [(f"infercost_requests_running{m}", by_model)], REQUESTS, w=8),
        timeseries("KV cache usage", [(f"infercost_kv_cache_usage_ratio{m}", by_model)], KV, w=8),
        timeseries("Anomaly score", [(f"infercost_anomaly_score{m}", by_model)], ANOMALY, w=8),
        row("GPUs"),
        timeseries("GPU utilisation", [(f"infercost_gpu_utilization_ratio{g}", by_gpu)], UTIL, w=8),
        timeseries(
            "DRAM bandwidth (GPM) and memory busy",
            [
                (f"infercost_gpu_dram_bandwidth_ratio{g}", "bandwidth " + by_gpu),
                (f"infercost_gpu_memory_busy_ratio{g}", "busy " + by_gpu),
            ],
            RATIO,
            w=8,
        ),
        timeseries("SM active (GPM)", [(f"infercost_gpu_sm_active_ratio{g}", by_gpu)], RATIO, w=8),
        timeseries(
            "Power",
            [
                (f"infercost_gpu_power_watts{g}", by_gpu),
                (f"rate(infercost_gpu_energy_joules_total{g}[$__rate_interval])", "from energy " + by_gpu),
            ],
            WATTS,
            w=8,
        ),
        timeseries(
            "Memory used of total",
            [(f"infercost_gpu_memory_used_bytes{g} / infercost_gpu_memory_total_bytes{g}", by_gpu)],
            RATIO,
            w=8,
        ),
        timeseries("Price per GPU-hour", [(f"infercost_gpu_price_usd_per_hour{g}", by_gpu)], USD, w=8),
        row("Models on the GPUs"),
        timeseries(
            "Roofline efficiency", [(f"infercost_roofline_efficiency_ratio{m}", by_model)], ROOFLINE, w=8
        ),
        timeseries(
            "Model GPU utilisation and bandwidth",
            [
                (f"infercost_model_gpu_utilization_ratio{m}", "util " + by_model),
                (f"infercost_model_memory_bandwidth_ratio{m}", "bandwidth " + by_model),
            ],
            UTIL,
            w=8,
        ),
        timeseries("Model power", [(f"infercost_model_power_watts{m}", by_model)], WATTS, w=8),
        row("Engines and delivery"),
        table("Engines", f"max by (node, engine, kind) (infercost_engine_up{e})", UP, w=8),
        timeseries(
            "Scrape duration",
            [(f"infercost_engine_scrape_duration_seconds{e}", "{{node}} {{engine}}")],
            SECONDS,
            w=8,
        ),
        table("Alerts firing", f"sum by (node, rule, severity) (infercost_alerts_firing{g})", ALERTS, w=4),
        table("Outbox", f"sum by (node, sink) (infercost_outbox_pending{g})", PENDING, w=4),
    ]
    return dashboard(
        "infercost-node",
        "infercost / Node",
        "One node: GPUs, engines and the cost of each model version they serve.",
        panels,
        _templating(cluster=False),
        prometheus_annotations(DEPLOYS_FILTER, F_NODE),
    )


def _sel(version: str) -> str:
    """The comparison dashboard's selector for version variable ``version``."""
    return f'node=~"$node", model=~"$model", model_version=~"${version}"'


def _like_load(metric: str, version: str) -> str:
    """Per-series rate of a counter, kept only where the series' engine ran at like load: its
    mean requests in flight over the window inside [$load_min, $load_max)."""
    sel = f'node=~"$node", model=~"$model", model_version=~"${version}"'
    return (
        f"(rate({metric}{{{sel}}}[5m])\n"
        f"   and on (node, engine, model, model_version)\n"
        f"   (avg_over_time(infercost_requests_running{{{sel}}}[5m]) >= $load_min < $load_max))"
    )


def _ratio_at_like_load(num: str, den: str, version: str, scale: str, over_range: bool) -> str:
    n, d = _like_load(num, version), _like_load(den, version)
    if over_range:  # Σ over the dashboard's range (at the panel's interval), then the ratio
        return (
            f"sum(sum_over_time((sum({n}))[$__range:$__interval]))\n"
            f"  / (sum(sum_over_time((sum({d}))[$__range:$__interval])) > 0) * {scale}"
        )
    return f"sum({n})\n  / (sum({d}) > 0) * {scale}"


def compare() -> dict[str, Any]:
    """Model-version comparison: the version before a deploy (A) and after it (B), side by side,
    each counted only while its engines ran at a like load (requests in flight in a chosen band),
    so a quiet night on one side cannot pass for a cheaper build."""
    cost, gen = "infercost_cost_usd_total", "infercost_generation_tokens_total"
    secs = "infercost_gpu_seconds_total"
    joules = "infercost_energy_joules_total"
    panels: list[Panel] = [row("Cost at like load (requests in flight within [$load_min, $load_max))")]
    for v, label in (("version_a", "A (before)"), ("version_b", "B (after)")):
        panels.append(
            stat(
                f"$ per 1M output tokens, {label} ${v}",
                _ratio_at_like_load(cost, gen, v, "1e6", over_range=True),
                USD_PER_1M,
                w=8,
                desc="Σ cost / Σ output tokens over the dashboard's time range, like-load windows only.",
            )
        )
    panels.append(
        stat(
            "B vs A",
            f"({_ratio_at_like_load(cost, gen, 'version_b', '1e6', True)})\n"
            f"/ ({_ratio_at_like_load(cost, gen, 'version_a', '1e6', True)}) - 1",
            # 1.5× is the fleet regression threshold; +20 % already deserves a look
            Scale("percentunit", ((None, GREEN), (0.2, ORANGE), (0.5, RED))),
            w=8,
            desc="Change of B's $ per 1M output tokens against A's at like load "
            "(+50 % = the regression alert).",
        )
    )
    pairs = (
        ("$ per 1M output tokens", cost, gen, "1e6", USD_PER_1M),
        ("Output tokens per GPU-second", gen, secs, "1", Scale("suffix: tok/GPU·s", min=0)),
        ("Energy per 1k output tokens", joules, gen, "1e3", Scale("joule", min=0)),
    )
    for title, num, den, scale, sc in pairs:
        panels.append(
            timeseries(
                f"{title} at like load: A vs B",
                [
                    (_ratio_at_like_load(num, den, "version_a", scale, False), "A $version_a"),
                    (_ratio_at_like_load(num, den, "version_b", scale, False), "B $version_b"),
                ],
                sc,
                w=12 if title.startswith("$") else 6,
            )
        )
    gauges = (
        ("Roofline efficiency", "infercost_roofline_efficiency_ratio", ROOFLINE),
        ("TTFT p99", "infercost_ttft_p99_seconds", SECONDS),
        ("GPU utilisation", "infercost_model_gpu_utilization_ratio", UTIL),
    )
    panels.append(row("Efficiency and latency"))
    for title, metric, sc in gauges:
        panels.append(
            timeseries(
                f"{title}: A vs B",
                [
                    (f'avg({metric}{{node=~"$node", model=~"$model", model_version=~"$version_a"}})', "A"),
                    (f'avg({metric}{{node=~"$node", model=~"$model", model_version=~"$version_b"}})', "B"),
                ],
                sc,
                w=8,
            )
        )
    panels.append(row("By cluster (the fleet rules' 1h series, at any load)"))
    panels.append(
        timeseries(
            "$ per 1M output tokens by cluster: A vs B (1h)",
            [
                (
                    f'{CLUSTER_USD_PER_1M}1h{{{F_CLUSTER}, model=~"$model", model_version=~"${v}"}}',
                    f"{n} {{{{cluster}}}}",
                )
                for v, n in (("version_a", "A"), ("version_b", "B"))
            ],
            USD_PER_1M,
            w=24,
            desc=CLUSTER_DESC + " Not filtered to like load: a busier cluster reads cheaper.",
        )
    )
    panels.append(row("Load (the band above selects like-load windows)"))
    panels.append(
        timeseries(
            "Requests in flight: A vs B",
            [
                (f"sum(infercost_requests_running{{{_sel(v)}}})", n)
                for v, n in (("version_a", "A"), ("version_b", "B"))
            ],
            REQUESTS,
        )
    )
    panels.append(
        timeseries(
            "Output tokens per second: A vs B",
            [
                (
                    f'sum(rate(infercost_generation_tokens_total{{node=~"$node", model=~"$model", '
                    f'model_version=~"${v}"}}[$__rate_interval]))',
                    n,
                )
                for v, n in (("version_a", "A"), ("version_b", "B"))
            ],
            TOKENS_PER_S,
        )
    )
    versions = (
        'label_values(infercost_generation_tokens_total{node=~"$node", model=~"$model"}, model_version)'
    )
    templating = {
        "list": [
            _datasource_var(),
            _cluster_var(),
            _query_var("node", "Node", "label_values(infercost_gpu_info, node)"),
            _query_var(
                "model",
                "Model",
                'label_values(infercost_generation_tokens_total{node=~"$node"}, model)',
                False,
            ),
            _query_var("version_a", "Version A (before)", versions, False),
            _query_var("version_b", "Version B (after)", versions, False),
            # why 1–64: from a lightly loaded engine to a busy batch; narrow it to compare like with like
            _textbox("load_min", "Requests in flight from", "1"),
            _textbox("load_max", "to (exclusive)", "64"),
        ]
    }
    return dashboard(
        "infercost-compare",
        "infercost / Model version comparison",
        "Two versions of one model side by side (before and after a deploy), each at a like load: "
        "$ per 1M tokens, tokens per GPU-second, energy, roofline efficiency, latency.",
        panels,
        templating,
        # the deploys of the two versions compared (the dashboard has no engine variable)
        prometheus_annotations(
            'node=~"$node", model=~"$model", model_version=~"$version_a|$version_b"', F_NODE
        ),
        time_from="now-7d",
    )


DASHBOARDS = {"infercost-fleet.json": fleet, "infercost-node.json": node, "infercost-compare.json": compare}
TS_FILE = HERE / "schema-check" / "dashboards.gen.ts"


def render(build: Any) -> str:
    """A dashboard as committed: indented JSON with a trailing newline."""
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def render_ts() -> str:
    """The type-check file: every dashboard assigned to @grafana/schema's Dashboard (enum-valued
    fields may be written as their string values, as in the JSON Grafana stores)."""
    lines = [
        "// Generated by dashboards/build.py: do not edit. Checked by `tsc -p dashboards/schema-check`.",
        'import type { Dashboard, AnnotationQuery } from "@grafana/schema";',
        'import type { PromAnnotationFields, PromAnnotationTarget, Loose } from "./types";',
        "",
        'type Checked = Loose<Omit<Dashboard, "annotations">> & {',
        "  annotations: {",
        "    list: Array<Loose<AnnotationQuery<PromAnnotationTarget>> & PromAnnotationFields>;",
        "  };",
        "};",
        "",
    ]
    for name, build in DASHBOARDS.items():
        ident = name.removesuffix(".json").replace("-", "_")
        lines.append(f"export const {ident}: Checked = {json.dumps(build(), indent=2, ensure_ascii=False)};")
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Write the dashboards (or, with --check, report stale ones)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a committed dashboard is stale")
    args = ap.parse_args(argv)
    outputs = {HERE / name: render(build) for name, build in DASHBOARDS.items()}
    outputs[TS_FILE] = render_ts()
    stale = []
    for path, text in outputs.items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
    if stale:
        print("stale (run python dashboards/build.py):", ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
