"""The report's cost by group (``infercost report --group-by namespace|team|<label>``): the week's
dollars and tokens per namespace, team or any cost label, computed as the cost API computes them
(:func:`agent.sinks.api.allocate`, allocation basis) so the report and ``/api/v1/cost`` agree.

- local store: each minute grouped by the identity its engine had then (agent.sinks.costlabels);
- Prometheus: each series' ``increase`` over the week joined with the last
  ``infercost_engine_cost_info`` of its engine (:func:`prometheus_rows`, also ``infercost query``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent.report.data import GroupRow, ReportError
from agent.report.prom import PromApi
from agent.sinks.api import (
    BadRequest,
    Item,
    MinuteSums,
    QueryTooLong,
    allocate,
    open_read_only,
    parse_aggregate,
    read_sums,
    read_unallocated,
)

# increase() of these per series (node, engine, model, model_version) over the window
PROM_SUMS: Mapping[str, str] = {
    "cost_usd": "infercost_cost_usd_total",
    "idle_usd": "infercost_idle_cost_usd_total",
    "prompt_tokens": "infercost_prompt_tokens_total",
    "generation_tokens": "infercost_generation_tokens_total",
    "prompt_usd": "infercost_prompt_cost_usd_total",
    "usage_usd": "infercost_usage_cost_usd_total",
}
_SERIES = ("node", "engine", "model", "model_version")
_INFO_FIXED = {
    "engine_namespace": "namespace",
    "engine_pod": "pod",
    "engine_role": "role",
    "engine_group": "group",
    "engine_group_leader": "group_leader",
}


def _range(seconds: float) -> str:
    """A PromQL range of whole seconds (at least one)."""
    return f"{max(1, round(seconds))}s"


def prometheus_rows(api: PromApi, start: float, end: float) -> tuple[list[MinuteSums], float]:
    """Per series sums over [start, end) and the idle dollars (the GPUs' dollars no model version
    was charged, per node), from the fleet's Prometheus."""
    rng = _range(end - start)
    by = ", ".join(_SERIES)
    sums: dict[tuple[str, ...], dict[str, float]] = {}
    for name, metric in PROM_SUMS.items():
        for r in api.query(f"sum by ({by}) (increase({metric}[{rng}]))", end):
            key = tuple(str(r["metric"].get(k, "")) for k in _SERIES)
            sums.setdefault(key, {})[name] = float(r["value"][1])
    info: dict[tuple[str, str], dict[str, Any]] = {}
    for r in api.query(f"last_over_time(infercost_engine_cost_info[{rng}])", end):
        m = r["metric"]
        ident: dict[str, Any] = {"labels": {}}
        for k, v in m.items():
            if k in _INFO_FIXED:
                ident[_INFO_FIXED[k]] = v
            elif k.startswith("label_") and v:
                ident["labels"][k] = v
        info[(str(m.get("node", "")), str(m.get("engine", "")))] = ident
    rows = []
    for key, f in sums.items():
        cost = f.get("cost_usd", 0.0)
        rows.append(
            MinuteSums(
                key[0],
                key[1],
                key[2],
                key[3],
                info=info.get((key[0], key[1]), {}),
                prompt_tokens=f.get("prompt_tokens", 0.0),
                generation_tokens=f.get("generation_tokens", 0.0),
                cost_usd=cost,
                idle_usd=f.get("idle_usd", 0.0),
                prompt_usd=f.get("prompt_usd", 0.0),
                split_usd=cost if "prompt_usd" in f else 0.0,
                usage_usd=f.get("usage_usd", 0.0),
                usage_alloc_usd=cost if "usage_usd" in f else 0.0,
                # no token series at all over the window: its engine counts none (absent, not 0)
                seconds=end - start,
                tokenless_seconds=0.0 if "prompt_tokens" in f or "generation_tokens" in f else end - start,
            )
        )
    expr = (
        f"sum by (node) (increase(infercost_gpu_cost_usd_total[{rng}])) - "
        f"sum by (node) (increase(infercost_cost_usd_total[{rng}]))"
    )
    idle = sum(max(0.0, float(r["value"][1])) for r in api.query(expr, end))
    return rows, idle


def _rows(items: list[Item], by: str) -> tuple[GroupRow, ...]:
    return tuple(
        GroupRow(it.key[by], it.cost_usd, it.idle_usd, it.prompt_tokens, it.output_tokens) for it in items
    )


def _by(group_by: str) -> str:
    try:
        (by,) = parse_aggregate(group_by)
    except (BadRequest, ValueError):
        raise ReportError(
            f"--group-by {group_by!r}: give one property: namespace, team or another cost label key"
        ) from None
    return by


def groups_from_store(
    path: Path, start: float, end: float, group_by: str, share_idle: bool
) -> tuple[GroupRow, ...]:
    """The groups of [start, end) from the store file at ``path``."""
    by = _by(group_by)
    try:
        db = open_read_only(path)
    except sqlite3.Error as err:
        raise ReportError(f"{path}: cannot open the store: {err}") from None
    try:
        rows = read_sums(db, start, end)
        idle = read_unallocated(db, start, end)
    except (sqlite3.Error, QueryTooLong) as err:
        raise ReportError(f"{path}: cannot read the store's groups: {err or 'too slow'}") from None
    finally:
        db.close()
    return _rows(allocate(rows, idle, (by,), "allocation", share_idle), by)


def groups_from_prometheus(
    api: PromApi, start: float, end: float, group_by: str, share_idle: bool
) -> tuple[GroupRow, ...]:
    """The groups of [start, end) from the fleet's Prometheus."""
    by = _by(group_by)
    rows, idle = prometheus_rows(api, start, end)
    return _rows(allocate(rows, idle, (by,), "allocation", share_idle), by)
