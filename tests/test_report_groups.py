"""The weekly report's cost by group (``--group-by team``), its calendar days in a time zone and its
money axes, over a real store whose engines' cost labels change mid-week."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest

from agent.cli import main
from agent.clock import ManualClock
from agent.report.data import build_from_store, calendar_days, day_of
from agent.report.render import axis_usd, render_html
from agent.sinks.costlabels import CostLabelHistory
from agent.snapshot import EngineCostInfo
from agent.store import Store
from tests.test_report import HOUR, WEEK, T, windows


def _store(tmp_path: Path) -> Path:
    path = tmp_path / "history.sqlite"
    store = Store(path, retention_days=35, clock=ManualClock(start=T))
    store.write_windows(windows())
    store.close()
    labels = CostLabelHistory(path, 35)
    team = {"e1": "search", "e2": "chat", "e3": "chat"}
    for node, engine in (("node-a", "e1"), ("node-b", "e2"), ("node-b", "e3")):
        labels.note(
            node, [EngineCostInfo(engine, namespace="ns-" + team[engine], labels={"team": team[engine]})], T
        )
    # halfway through the week qwen's engine moves to team search (a relabelled pod)
    labels.note(
        "node-b", [EngineCostInfo("e3", namespace="ns-chat", labels={"team": "search"})], T - 84 * HOUR
    )
    labels.close()
    return path


def test_the_report_groups_the_week_by_team_as_each_minute_was_labelled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _store(tmp_path)
    rc = main(
        ["report", "--state-dir", str(tmp_path), "--end", str(T), "--format", "json", "--group-by", "team",
         "--timezone", "Asia/Kolkata"]
    )  # fmt: skip
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    groups = {g["group"]: g for g in data["groups"]}
    # e1 $2/h all week; e2 $2/h; e3 $1/h: chat until T − 84 h, search after
    assert groups["search"]["cost_usd"] == pytest.approx(2 * 168 + 84)
    assert groups["chat"]["cost_usd"] == pytest.approx(2 * 168 + 84)
    assert sum(g["cost_usd"] for g in data["groups"]) == pytest.approx(data["total_usd"])
    assert groups["search"]["output_tokens"] == pytest.approx(1000 * 168 * HOUR + 700 * 84 * HOUR)
    # calendar days in +05:30: a week ending on a UTC hour has partial first and last local days
    days = calendar_days(T - WEEK, T, "Asia/Kolkata")
    assert data["timezone"] == "Asia/Kolkata" and len(data["daily_usd"]) == len(days) == 8
    assert data["days"][0] < data["days"][-1]
    assert sum(v or 0 for v in data["daily_usd"]) == pytest.approx(data["total_usd"])


def test_calendar_days_follow_the_zone_and_its_daylight_saving() -> None:
    # 2026-03-29 is 23 hours long in Berlin (clocks go forward)
    start = 1774569600.0  # 2026-03-27T00:00:00Z
    days = calendar_days(start, start + 4 * 86400, "Europe/Berlin")
    lengths = [b - a for a, b in itertools.pairwise(days)]
    assert 23 * HOUR in lengths and all(x in (23 * HOUR, 24 * HOUR) for x in lengths)
    assert day_of(days[2] - 1, days) == 1 and day_of(days[2], days) == 2
    assert calendar_days(start, start + 86400, "UTC") == (start,)


def test_money_axes_show_cents_not_tenths_of_cents(tmp_path: Path) -> None:
    assert [axis_usd(v) for v in (10.0, 0.5, 1250.0, 0.025, 0.0)] == [
        "$10.00",
        "$0.50",
        "$1,250.00",
        "$0.025",
        "$0.00",
    ]
    html = render_html(build_from_store(_store(tmp_path), T))
    labels = re.findall(r'text-anchor="end">(\$[0-9.,]+)</text>', html)
    assert labels and not [
        x for x in labels if re.fullmatch(r"\$[0-9,]+\.\d{3,}", x) and float(x[1:].replace(",", "")) >= 0.1
    ]


def test_a_relabelling_storm_is_read_minute_by_minute_to_the_same_sums(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent.sinks import api

    path = _store(tmp_path)
    db = api.open_read_only(path)
    try:
        cut = api.read_sums(db, T - WEEK, T)
        monkeypatch.setattr(api, "MAX_SEGMENTS", 0)  # beyond it: one identity lookup per minute
        each = api.read_sums(db, T - WEEK, T)
    finally:
        db.close()

    def by_team(rows: list[api.MinuteSums]) -> dict[str, float]:
        return {it.key["team"]: it.cost_usd for it in api.allocate(rows, 0.0, ("team",), "allocation", False)}

    assert by_team(each) == pytest.approx(by_team(cut))
    assert by_team(cut) == pytest.approx({"search": 2 * 168 + 84, "chat": 2 * 168 + 84})
