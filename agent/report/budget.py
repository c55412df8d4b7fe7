"""The fleet report's budget section: each monthly budget with the month's spend so far and a
month-end forecast (docs/fleet.md#budgets).

Read from the fleet rules' records in Prometheus at the report's end, so the report says what the
budget alert sees: ``budget_scope:infercost_budget_usd:max`` (the config's ``budgets:``, exported
by every agent), ``…:infercost_cost_usd:month_to_date`` and ``…:forecast_month``. The method, the
rules' and :func:`forecast`'s: spend so far this calendar month (UTC, to the last whole hour) + the
last 7 days' mean hourly spend × the hours left in the month. A node's own report has no budget
section: a budget is the fleet's, and one node sees only its share of it.
"""

from __future__ import annotations

import datetime as dt
import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agent.report import escape as esc

HOUR_SECONDS = 3600.0
BUDGET = "budget_scope:infercost_budget_usd:max"
SPENT = "budget_scope:infercost_cost_usd:month_to_date"
FORECAST = "budget_scope:infercost_cost_usd:forecast_month"


@dataclass(frozen=True, slots=True)
class BudgetLine:
    """One budget at the report's end."""

    scope: str  # model, namespace or team
    name: str
    budget_usd: float  # dollars per calendar month
    spent_usd: float | None  # dollars this month so far; None: no spend recorded
    forecast_usd: float | None  # dollars by the month's end; None: not forecast yet

    @property
    def forecast_ratio(self) -> float | None:
        """The forecast as a fraction of the budget (over 1: the budget will not last the month)."""
        return None if self.forecast_usd is None else self.forecast_usd / self.budget_usd

    @property
    def over(self) -> bool:
        """Whether the forecast exceeds the budget."""
        return self.forecast_usd is not None and self.forecast_usd > self.budget_usd


def hours_left(at: float) -> int:
    """Whole hours from the last whole hour at or before ``at`` (epoch seconds) to the end of its
    calendar month in UTC: what the month-to-date has not yet counted."""
    t = dt.datetime.fromtimestamp(math.floor(at / HOUR_SECONDS) * HOUR_SECONDS, dt.UTC)
    nxt = dt.datetime(t.year + (t.month == 12), t.month % 12 + 1, 1, tzinfo=dt.UTC)
    return round((nxt - t).total_seconds() / HOUR_SECONDS)


def forecast(spent_usd: float, mean_hourly_usd: float, at: float) -> float:
    """Month-end dollars: spent so far + the mean hourly spend (dollars per hour) × :func:`hours_left`."""
    return spent_usd + mean_hourly_usd * hours_left(at)


class QueryApi(Protocol):
    """What the section needs of Prometheus' HTTP API (agent.report.prom.PromApi)."""

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        """Instant vector at ``at``."""
        ...


def _by_key(api: QueryApi, expr: str, at: float) -> dict[tuple[str, str], float]:
    out = {}
    for s in api.query(expr, at):
        v = float(s["value"][1])
        if math.isfinite(v):
            out[(str(s["metric"].get("scope", "")), str(s["metric"].get("name", "")))] = v
    return out


def budgets_from_prometheus(api: QueryApi, at: float) -> tuple[BudgetLine, ...]:
    """Every budget Prometheus holds at ``at``, the nearest to overrun first; empty where the rules
    are not installed."""
    budgets = {k: v for k, v in _by_key(api, BUDGET, at).items() if v > 0}
    spent, fc = _by_key(api, SPENT, at), _by_key(api, FORECAST, at)
    lines = [BudgetLine(s, n, b, spent.get((s, n)), fc.get((s, n))) for (s, n), b in budgets.items()]
    return tuple(sorted(lines, key=lambda b: (-(b.forecast_ratio or 0.0), b.scope, b.name)))


def _usd(v: float | None) -> str:
    return "—" if v is None else f"${v:,.2f}"


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{v:.0%}"


HEAD = ("scope", "name", "monthly budget", "spent so far", "month-end forecast", "forecast / budget")
NOTE = (
    "Calendar month in UTC. Forecast: spent so far + the last 7 days' mean hourly spend × the hours "
    "left in the month (the same as the budget alert's)."
)


def _cells(b: BudgetLine) -> list[str]:
    flag = " (over)" if b.over else ""
    return [
        b.scope,
        b.name,
        _usd(b.budget_usd),
        _usd(b.spent_usd),
        _usd(b.forecast_usd),
        _pct(b.forecast_ratio) + flag,
    ]


def budget_markdown(lines: Sequence[BudgetLine]) -> list[str]:
    """The section as Markdown lines; nothing without budgets."""
    if not lines:
        return []
    out = [
        "",
        "## Budgets (this month)",
        "",
        NOTE,
        "",
        "| " + " | ".join(HEAD) + " |",
        "|---|---|---:|---:|---:|---:|",
    ]
    out += ["| " + " | ".join(esc.md(c) for c in _cells(b)) + " |" for b in lines]
    return out


def budget_html(lines: Sequence[BudgetLine]) -> list[str]:
    """The section as HTML lines; nothing without budgets."""
    if not lines:
        return []
    h = ["<h2>Budgets (this month)</h2>", f'<p class="muted">{html.escape(NOTE)}</p>']
    h.append("<table><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in HEAD) + "</tr>")
    for b in lines:
        c = [html.escape(x) for x in _cells(b)]
        h.append(
            f"<tr><td>{c[0]}</td><td>{c[1]}</td>"
            + "".join(f'<td class="n">{x}</td>' for x in c[2:])
            + "</tr>"
        )
    h.append("</table>")
    return h


def budget_dicts(lines: Sequence[BudgetLine]) -> list[dict[str, Any]]:
    """The section for the JSON report."""
    return [
        {
            "scope": b.scope,
            "name": b.name,
            "budget_usd": b.budget_usd,
            "spent_usd": b.spent_usd,
            "forecast_usd": b.forecast_usd,
            "forecast_ratio": b.forecast_ratio,
            "over": b.over,
        }
        for b in lines
    ]
