"""Budgets end to end with the real Prometheus: five weeks of hourly spend backfilled into its TSDB
(``promtool tsdb create-blocks-from openmetrics``), the budgets exported by the agent's own
``/metrics`` writer from a config's ``budgets:``, the shipped rules evaluated live. The month to
date, the forecast and the alert must be what the stated method gives on the same data, and the
fleet report's budget section must say the same to the cent.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from promstack import Prometheus, backfill, test_copy_of_rules

from agent.cli import main
from agent.config import load_config
from agent.report.budget import budget_markdown, budgets_from_prometheus, forecast
from agent.report.prom import PromApi, http_fetcher
from agent.sinks.prometheus import render
from agent.snapshot import Ledger

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "rules" / "prometheus" / "infercost.rules.yml"
HOUR = 3600.0
RECORD = "budget_scope:infercost_cost_usd:rate1h"
# $ per hour: team search spends $6 an hour, then $12 from ten days ago; team chat $2 throughout
SPEND = {"search": lambda age_h: 12.0 if age_h < 240 else 6.0, "chat": lambda age_h: 2.0}


def hourly(now: float) -> dict[str, dict[float, float]]:
    """Each team's hourly record (dollars per second) at every whole hour of the last 35 days."""
    last = math.floor(now / HOUR) * HOUR
    hours = [last - k * HOUR for k in range(35 * 24, -1, -1)]
    return {team: {t: f((last - t) / HOUR) / HOUR for t in hours} for team, f in SPEND.items()}


def expected(values: dict[float, float], at: float) -> tuple[float, float]:
    """(month to date, forecast) at ``at`` by the stated method, over the samples a 1-hour-step
    subquery finds (the whole hours in [at − range, at])."""
    month = dt.datetime.fromtimestamp(at, dt.UTC).month

    def steps(span: float) -> list[float]:
        first, last = math.ceil((at - span) / HOUR), math.floor(at / HOUR)
        return [k * HOUR for k in range(first, last + 1) if k * HOUR in values]

    mtd = sum(
        values[t] * HOUR for t in steps(31 * 86400) if dt.datetime.fromtimestamp(t - 1, dt.UTC).month == month
    )
    week = [values[t] for t in steps(7 * 86400)]
    return mtd, forecast(mtd, sum(week) / len(week) * HOUR, at)


class Exposition(BaseHTTPRequestHandler):
    """Serves one agent snapshot as the agent's /metrics does."""

    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def root_logger_restored() -> Iterator[None]:
    """``main`` configures the root logger (as the command does); later tests get it back as it was."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def agent_budgets(tmp_path: Path) -> Iterator[tuple[str, dict[str, float]]]:
    """An agent exposition with budgets: search at 90 % of its forecast (the alert fires), chat at
    twice its forecast (it does not)."""
    now = time.time()
    data = hourly(now)
    budgets = {
        team: round(expected(data[team], now)[1] * k, 2) for team, k in (("search", 0.9), ("chat", 2.0))
    }
    cfg = tmp_path / "node.yaml"
    lines = [f"  - {{scope: team, name: {t}, monthly_usd: {usd}}}" for t, usd in budgets.items()]
    cfg.write_text("node: n1\nbudgets:\n" + "\n".join(lines) + "\n")
    c = load_config(cfg)
    snap = replace(
        Ledger("n1", "test").snapshot(), budgets=tuple((b.scope, b.name, b.monthly_usd) for b in c.budgets)
    )
    handler = type("Agent", (Exposition,), {"body": render(snap, process=False)})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", budgets
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.mark.slow
def test_month_to_date_forecast_alert_and_report_agree(
    tmp_path: Path, agent_budgets: tuple[str, dict[str, float]], root_logger_restored: None
) -> None:
    target, budgets = agent_budgets
    data = hourly(time.time())
    om = [f"# TYPE {RECORD} gauge"]
    for team, values in data.items():
        om += [f'{RECORD}{{name="{team}",scope="team"}} {v!r} {t:.0f}' for t, v in sorted(values.items())]
    blocks = backfill("\n".join(om) + "\n# EOF\n", tmp_path / "tsdb", max_block="1000h")
    rules = test_copy_of_rules(RULES, tmp_path / "rules.yml", alert_for="0s")
    prom = Prometheus(tmp_path / "prom", [target], [rules], data_dir=blocks)
    try:
        prom.wait_for('ALERTS{alertname="InfercostBudgetForecastOverrun", alertstate="firing"}', timeout=120)
        # the records at one evaluation: the time it ran, then what the method gives then
        [stamp] = prom.query('timestamp(budget_scope:infercost_cost_usd:forecast_month{name="search"})')
        at = float(stamp["value"][1])
        got = {
            (s["metric"]["name"], name): float(s["value"][1])
            for name in ("month_to_date", "forecast_month")
            for s in prom.query(f"budget_scope:infercost_cost_usd:{name}", at)
        }
        for team, values in data.items():
            mtd, fc = expected(values, at)
            assert got[(team, "month_to_date")] == pytest.approx(mtd, rel=1e-9, abs=1e-6)
            assert got[(team, "forecast_month")] == pytest.approx(fc, rel=1e-9)
        firing = prom.query('ALERTS{alertname="InfercostBudgetForecastOverrun", alertstate="firing"}')
        assert [(a["metric"]["scope"], a["metric"]["name"]) for a in firing] == [("team", "search")]
        # the fleet report's section: the same figures, the nearest to overrun first
        lines = budgets_from_prometheus(PromApi(prom.url, http_fetcher()), at)
        assert [(b.name, b.budget_usd) for b in lines] == [
            ("search", budgets["search"]),
            ("chat", budgets["chat"]),
        ]
        for b in lines:
            assert round(b.spent_usd or 0.0, 2) == round(got[(b.name, "month_to_date")], 2)
            assert round(b.forecast_usd or 0.0, 2) == round(got[(b.name, "forecast_month")], 2)
        assert lines[0].over and not lines[1].over
        text = "\n".join(budget_markdown(lines))
        assert f"| team | search | ${budgets['search']:,.2f} |" in text and "(over)" in text
        # and through `infercost report --prometheus`: the JSON and Markdown reports carry the section
        out = tmp_path / "fleet.json"
        argv = ["report", "--prometheus", prom.url, "--end", f"{at:.3f}"]
        assert main([*argv, "--format", "json", "--output", str(out)]) == 0
        assert [(b["name"], b["over"]) for b in json.loads(out.read_text())["budgets"]] == [
            ("search", True),
            ("chat", False),
        ]
        assert main([*argv, "--format", "md", "--output", str(tmp_path / "fleet.md")]) == 0
        assert "## Budgets (this month)" in (tmp_path / "fleet.md").read_text()
    finally:
        prom.close()
