"""The report's budget section, hand-computed: the hours a forecast still has to cover, the forecast
itself (the same figure the promtool test of the budget rule gives), and the section in every
format the report renders."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace

import pytest

from agent.report.budget import BudgetLine, forecast, hours_left
from agent.report.data import build_from_windows
from agent.report.render import render_html, render_json, render_markdown


def utc(*args: int) -> float:
    return dt.datetime(*args, tzinfo=dt.UTC).timestamp()


@pytest.mark.parametrize(
    ("at", "hours"),
    [
        (utc(1970, 1, 12), 20 * 24),  # midnight: the whole of the 12th to the 31st
        (utc(1970, 1, 12, 0, 59, 59), 20 * 24),  # counted to the last whole hour
        (utc(1970, 1, 12, 1), 20 * 24 - 1),
        (utc(2026, 12, 31, 23, 30), 1),  # December's last hour: the year turns
        (utc(2024, 2, 29), 24),  # a leap day is February's last
        (utc(2026, 2, 1), 28 * 24),
    ],
)
def test_hours_left_in_the_month(at: float, hours: int) -> None:
    assert hours_left(at) == hours


def test_the_forecast_is_the_rules_figure() -> None:
    """infercost_budget_test.yml at 11 d: $1,728 so far, (24 × 12 + 145 × 6) / 169 dollars an hour
    over the last week, 480 hours left → $5,016.9941."""
    assert forecast(1728.0, (24 * 12 + 145 * 6) / 169, utc(1970, 1, 12)) == pytest.approx(5016.9941, abs=1e-4)


LINES = (
    BudgetLine("team", "search", 5000.0, 2016.0, 5529.0888),
    BudgetLine("namespace", "a|b<script>", 100000.0, 2016.0, 5529.0888),
    BudgetLine("model", "llama-70b", 20000.0, None, None),
)


def test_a_line_is_over_only_with_a_forecast_above_its_budget() -> None:
    over, under, unknown = LINES
    assert over.over and over.forecast_ratio == pytest.approx(1.10581776)
    assert not under.over and under.forecast_ratio == pytest.approx(0.055290888)
    assert not unknown.over and unknown.forecast_ratio is None


def test_every_format_carries_the_section_and_none_without_budgets() -> None:
    end = utc(2026, 12, 7, 9)
    empty = build_from_windows([], end)
    report = replace(empty, budgets=LINES)
    md = render_markdown(report)
    assert "## Budgets (this month)" in md
    assert "| team | search | $5,000.00 | $2,016.00 | $5,529.09 | 111% (over) |" in md
    assert "| model | llama-70b | $20,000.00 | — | — | — |" in md
    assert "a|b" not in md  # a cell's pipe escaped
    page = render_html(report)
    assert "<h2>Budgets (this month)</h2>" in page and "<script>" not in page
    assert json.loads(render_json(report))["budgets"][0] == {
        "scope": "team",
        "name": "search",
        "budget_usd": 5000.0,
        "spent_usd": 2016.0,
        "forecast_usd": 5529.0888,
        "forecast_ratio": pytest.approx(1.10581776),
        "over": True,
    }
    assert "Budgets" not in render_markdown(empty) and "Budgets" not in render_html(empty)
    assert json.loads(render_json(empty))["budgets"] == []
