"""The weekly report is posted on schedule through the real outbox and Slack sink to a local
Slack receiver; the store remembers what was sent, so a restart neither resends nor skips a week."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from receivers import Receiver
from test_report_like_load import DAY, T, scenario

from agent.clock import ManualClock
from agent.config import ConfigError, ReportConfig, SecretRef, SlackConfig, load_config
from agent.report.schedule import SENT_KEY, WeeklyReporter, due_weeks, report_key, scheduled_before
from agent.samples import CostWindow, UsageWindow
from agent.sinks.notify import Notifier
from agent.sinks.outbox import Outbox
from agent.sinks.slack import slack_sink
from agent.store import Store

WEEK = 7 * DAY


def utc(*args: int) -> float:
    return dt.datetime(*args, tzinfo=dt.UTC).timestamp()


def test_scheduled_before_in_a_time_zone() -> None:
    # Monday 2026-11-30; Berlin is UTC+1 in winter, UTC+2 in summer
    assert scheduled_before(utc(2026, 11, 30, 10), "monday", 9, "Europe/Berlin") == utc(2026, 11, 30, 8)
    assert scheduled_before(utc(2026, 11, 30, 7, 59), "monday", 9, "Europe/Berlin") == utc(2026, 11, 23, 8)
    assert scheduled_before(utc(2026, 6, 3), "monday", 9, "Europe/Berlin") == utc(2026, 6, 1, 7)
    assert scheduled_before(utc(2026, 12, 2, 12), "friday", 17, "UTC") == utc(2026, 11, 27, 17)
    # New York, Sunday 18:00 EST = 23:00 UTC
    assert scheduled_before(utc(2026, 11, 30, 1), "sunday", 18, "America/New_York") == utc(2026, 11, 29, 23)


def test_due_weeks() -> None:
    cfg = ReportConfig(enabled=True, weekday="monday", hour=9, timezone="UTC")
    s = utc(2026, 11, 30, 9)
    assert due_weeks(s + 60, None, cfg) == []  # first start: nothing old is posted
    assert due_weeks(s + 60, s - WEEK, cfg) == [s]
    assert due_weeks(s + 60, s, cfg) == []  # sent: not again
    assert due_weeks(s - 60, s - WEEK, cfg) == []  # not yet time
    assert due_weeks(s + 60, s - 3 * WEEK, cfg) == [s - 2 * WEEK, s - WEEK, s]  # none skipped
    assert due_weeks(s + 60, s - 10 * WEEK, cfg) == [s - 3 * WEEK, s - 2 * WEEK, s - WEEK, s]  # at most 4


def test_report_config_refuses_an_unknown_zone(tmp_path: Path) -> None:
    bad = tmp_path / "node.yaml"
    bad.write_text("report:\n  enabled: true\n  timezone: Mars/Olympus\n")
    with pytest.raises(ConfigError, match="Mars/Olympus"):
        load_config(bad)
    ok = tmp_path / "ok.yaml"
    ok.write_text("report:\n  enabled: true\n  weekday: friday\n  hour: 17\n  timezone: Asia/Tokyo\n")
    assert load_config(ok).report == ReportConfig(
        enabled=True, weekday="friday", hour=17, timezone="Asia/Tokyo"
    )


class Daemon:
    """What the agent wires for the report: its store connection, the outbox, the Slack sink."""

    def __init__(self, state: Path, clock: ManualClock, slack_url_env: str) -> None:
        self.store = Store(state / "history.sqlite", retention_days=35, clock=clock)
        sink = slack_sink(SlackConfig(webhook_url=SecretRef(env=slack_url_env), min_interval_seconds=0))
        self.notifier = Notifier(Outbox(state / "outbox.sqlite"), [sink], clock)
        cfg = ReportConfig(enabled=True, weekday=WEEKDAY_OF_T, hour=0, timezone="UTC")
        self.reporter = WeeklyReporter(
            cfg, self.store, self.store.path, self.notifier, clock, state / "reports"
        )

    async def close(self) -> None:
        await self.notifier.close()
        self.notifier.outbox.close()
        self.store.close()


WEEKDAY_OF_T = dt.datetime.fromtimestamp(T, dt.UTC).strftime("%A").lower()  # the scenario ends at 00:00


async def test_posted_once_per_week_across_restarts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slack = Receiver("slack", path="/services/T0/B0/secret")
    await slack.start()
    monkeypatch.setenv("REPORT_TEST_SLACK", slack.url)
    clock = ManualClock(start=T - DAY)
    d = Daemon(tmp_path, clock, "REPORT_TEST_SLACK")
    try:
        windows = scenario()
        hostile = windows[-1].usage  # a version named to page everyone, served an hour before T
        evil = UsageWindow(
            hostile.node, "evil", "<!channel> @here", "v<1>", T - 3600, T, 1e6, 1e6, 3600, None
        )
        before = UsageWindow(
            hostile.node, "evil", "<!channel> @here", "v<1>", T - WEEK - 3600, T - WEEK, 2e6, 2e6, 3600, None
        )  # last week twice the tokens for the same dollar: a +100 % regression this week
        windows += [
            CostWindow(before, 1.0, 0.0, None, None, 0.0),
            CostWindow(evil, 1.0, 0.0, None, None, 0.0),
        ]
        d.store.write_windows(sorted(windows, key=lambda w: w.usage.start))
        # first start, a day before the scheduled time: the cursor is set, nothing is sent
        assert await d.reporter.step() == []
        assert d.store.get_meta(SENT_KEY) == repr(T - WEEK)
        # the scheduled time passes: the week ending at T is queued, remembered and delivered
        clock.advance(T + 60 - clock.now())
        assert await d.reporter.step() == [T]
        assert d.store.get_meta(SENT_KEY) == repr(T)
        assert await d.reporter.step() == []  # a minute later: not again
        await d.notifier.deliver_once()
        (msg,) = slack.received
        text = msg["text"]
        assert "+75.0 % at like load" in text and "$144.00 more" in text  # the canary regression
        assert "&lt;!channel&gt;" in text and "&amp;lt;" not in text  # escaped once, by the sink
        assert "<!channel>" not in slack.raw[0].decode() and "@here" not in text
        assert msg["attachments"][0]["title"].startswith("infercost weekly cost report, week ending")
        stem = dt.datetime.fromtimestamp(T, dt.UTC).strftime("%Y-%m-%d")
        assert (tmp_path / "reports" / f"{stem}.html").read_text().startswith("<!DOCTYPE html>")
        assert (tmp_path / "reports" / f"{stem}.json").exists()
        await d.close()

        # restart two hours later: nothing is resent
        clock.advance(T + 7200 - clock.now())
        d = Daemon(tmp_path, clock, "REPORT_TEST_SLACK")
        assert await d.reporter.step() == []
        # a crash after queueing but before remembering: the outbox already holds the week
        d.store.set_meta(SENT_KEY, repr(T - WEEK))
        assert await d.reporter.step() == [T]
        assert [item.dedup_key for item, _ in d.notifier.outbox.items()] == [report_key(T)]
        await d.close()

        # down over the next scheduled time, back 3 hours later: that week is sent, not skipped
        clock.advance(T + WEEK + 3 * 3600 - clock.now())
        d = Daemon(tmp_path, clock, "REPORT_TEST_SLACK")
        assert await d.reporter.step() == [T + WEEK]
        await d.notifier.deliver_once()
        assert len(slack.received) == 2
        assert slack.received[1]["text"].startswith("*infercost weekly cost report*")
    finally:
        await d.close()
        await slack.stop()


async def test_the_daemon_runs_the_reporter(tmp_path: Path) -> None:
    """`infercost run` with `report.enabled` runs the reporter in its task group (first start:
    the cursor is set to the last scheduled time)."""
    import asyncio
    import time

    from agent.app import build_agent
    from agent.config import Config, ExportersConfig, NvmlConfig, PrometheusExporterConfig

    cfg = Config(
        node="n",
        state_dir=tmp_path,
        nvml=NvmlConfig(backend="none"),
        exporters=ExportersConfig(prometheus=PrometheusExporterConfig(port=0)),
        report=ReportConfig(enabled=True, weekday="wednesday", hour=6, timezone="Asia/Kolkata"),
    )
    agent = await build_agent(cfg, backend=None, engines=[], discover=False, scorer=False)
    assert [loop.name for loop in agent.hooks.loops] == ["weekly report"]
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await agent.started.wait()
        store = agent.hooks.store
        assert store is not None
        for _ in range(200):
            if store.get_meta(SENT_KEY) is not None:
                break
            await asyncio.sleep(0.05)
        expected = scheduled_before(time.time(), "wednesday", 6, "Asia/Kolkata")
        assert store.get_meta(SENT_KEY) == repr(expected)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


def test_check_says_when_and_where_the_report_goes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from agent.cli import main

    cfg = tmp_path / "node.yaml"
    cfg.write_text(
        f"state_dir: {tmp_path / 'state'}\nexporters: {{prometheus: {{port: 0}}}}\n"
        "report: {enabled: true, weekday: friday, hour: 17, timezone: Europe/Berlin}\n"
    )
    assert main(["check", "--config", str(cfg)]) == 0
    assert (
        "weekly report: ok — fridays 17:00 Europe/Berlin, to state_dir/reports only"
        in capsys.readouterr().out
    )
    cfg.write_text(cfg.read_text().replace("Europe/Berlin", "Europe/Atlantis"))
    assert main(["check", "--config", str(cfg)]) == 2  # a user error, named
    assert "Europe/Atlantis" in capsys.readouterr().err
