"""The weekly report, delivered: ``infercost run`` posts it to Slack on a configured weekday, hour
and time zone (the ``report:`` config section).

The week ends at the scheduled instant (e.g. Monday 09:00 Europe/Berlin) and covers the seven days
before it. Delivery goes through the alerts' durable outbox and Slack sinks
(:func:`agent.sinks.slack.enqueue_slack_message`): retried, rate-limited, surviving restarts.

What was sent is remembered in the store (meta key :data:`SENT_KEY`: the end of the last week
queued), so a restart neither resends nor skips a week:

- after a restart past a scheduled time, every week not yet queued is built and queued, oldest
  first (at most :data:`MAX_CATCH_UP_WEEKS`: older weeks are past what the store can rebuild);
- a week is queued under a stable key (``weekly-report-<end>``) and not queued again if the outbox
  already holds it (a crash between queueing and remembering);
- on the very first start the cursor is set to the last scheduled time: the first report is the
  next scheduled one (an agent installed on Tuesday does not post last Monday's week).

With ``keep_files`` the report is also written to ``state_dir/reports/<date>.{html,csv,json,md}``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import zoneinfo
from pathlib import Path
from typing import TYPE_CHECKING

from agent.clock import Clock
from agent.config import WEEKDAYS, ReportConfig
from agent.report.data import ReportError, WeeklyReport, build_from_store
from agent.report.render import render_csv, render_html, render_json, render_markdown, render_slack

if TYPE_CHECKING:
    from agent.sinks.notify import Notifier
    from agent.store import Store

logger = logging.getLogger(__name__)

SENT_KEY = "report.last_week_end"  # meta key: epoch seconds of the end of the last week queued
# Why 4: the store keeps 35 days and a week's report needs the week before it as a baseline.
MAX_CATCH_UP_WEEKS = 4
CHECK_EVERY_SECONDS = 60.0  # why a minute: the schedule has an hour's granularity
RETRY_SECONDS = 600.0  # after a failed build (store busy or damaged), try again in 10 minutes


def scheduled_before(now: float, weekday: str, hour: int, tz: str) -> float:
    """The latest scheduled instant (``weekday`` at ``hour``:00 local time in ``tz``) ≤ ``now``."""
    zone = zoneinfo.ZoneInfo(tz)
    local = dt.datetime.fromtimestamp(now, zone)
    day = local.date() - dt.timedelta(days=(local.weekday() - WEEKDAYS.index(weekday)) % 7)
    for _ in range(3):
        at = dt.datetime.combine(day, dt.time(hour), tzinfo=zone).timestamp()
        if at <= now:
            return at
        day -= dt.timedelta(days=7)
    raise AssertionError("unreachable: a week earlier is always in the past")


def due_weeks(now: float, last_sent: float | None, cfg: ReportConfig) -> list[float]:
    """Ends of the weeks to queue now, oldest first (see the module docstring)."""
    latest = scheduled_before(now, cfg.weekday, cfg.hour, cfg.timezone)
    if last_sent is None:
        return []
    out: list[float] = []
    at = latest
    while at > last_sent + 1.0 and len(out) < MAX_CATCH_UP_WEEKS:
        out.append(at)
        at = scheduled_before(at - 1.0, cfg.weekday, cfg.hour, cfg.timezone)
    return sorted(out)


def report_key(end: float) -> str:
    """The outbox key of the week ending at ``end``."""
    return "weekly-report-" + dt.datetime.fromtimestamp(end, dt.UTC).strftime("%Y-%m-%dT%H%MZ")


class WeeklyReporter:
    """Builds and queues the weekly report on schedule (one task of the daemon)."""

    def __init__(
        self,
        cfg: ReportConfig,
        store: Store,
        history: Path,
        notifier: Notifier,
        clock: Clock,
        reports_dir: Path | None = None,
    ) -> None:
        self.cfg = cfg
        self.store = store  # the daemon's connection: meta reads and writes only
        self.history = history  # the store file, read by the report on its own connection
        self.notifier = notifier
        self.clock = clock
        self.reports_dir = reports_dir if cfg.keep_files else None

    def last_sent(self) -> float | None:
        """End of the last week queued (None before the first start)."""
        v = self.store.get_meta(SENT_KEY)
        return float(v) if v is not None else None

    async def step(self) -> list[float]:
        """Queue every due week; returns the week ends queued. Raises ReportError when a report
        cannot be built (the week stays due)."""
        now = self.clock.now()
        last = self.last_sent()
        if last is None:
            first = scheduled_before(now, self.cfg.weekday, self.cfg.hour, self.cfg.timezone)
            self.store.set_meta(SENT_KEY, repr(first))
            logger.info(
                "weekly report: first start; the first report is for the week ending at the next "
                "%s %02d:00 %s",
                self.cfg.weekday,
                self.cfg.hour,
                self.cfg.timezone,
            )
            return []
        sent = []
        for end in due_weeks(now, last, self.cfg):
            report = await asyncio.to_thread(build_from_store, self.history, end, self.cfg.timezone)
            if self.reports_dir is not None:
                await asyncio.to_thread(self._write_files, report)
            key = report_key(end)
            if any(item.dedup_key == key for item, _ in self.notifier.outbox.items()):
                logger.info("weekly report %s already queued; not again", key)
            else:
                from agent.sinks.slack import enqueue_slack_message

                title = f"infercost weekly cost report, week ending {report_key(end)[14:]}"
                text = render_slack(report, entities=False)
                n = enqueue_slack_message(self.notifier, text, key=key, title=title, link=self.cfg.link)
                if n == 0:
                    logger.warning(
                        "weekly report %s: no Slack destination configured (alerts.slack); %s",
                        key,
                        "kept in state_dir/reports" if self.reports_dir else "not sent",
                    )
                else:
                    logger.info("weekly report %s queued for Slack", key)
            self.store.set_meta(SENT_KEY, repr(end))
            sent.append(end)
        return sent

    def _write_files(self, report: WeeklyReport) -> None:
        assert self.reports_dir is not None
        self.reports_dir.mkdir(parents=True, exist_ok=True)
        stem = dt.datetime.fromtimestamp(report.end, dt.UTC).strftime("%Y-%m-%d")
        for ext, render in (
            ("html", render_html),
            ("csv", render_csv),
            ("json", render_json),
            ("md", render_markdown),
        ):
            path = self.reports_dir / f"{stem}.{ext}"
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(render(report))
            tmp.replace(path)

    async def run(self, stop: asyncio.Event) -> None:
        """Check the schedule every minute until ``stop`` (failures are logged and retried)."""
        while not stop.is_set():
            wait = CHECK_EVERY_SECONDS
            try:
                await self.step()
            except ReportError as err:
                logger.error("weekly report: %s; trying again in %.0f s", err, RETRY_SECONDS)
                wait = RETRY_SECONDS
            except Exception:  # a bug must not stop the agent; log and retry later
                logger.exception("weekly report failed; trying again in %.0f s", RETRY_SECONDS)
                wait = RETRY_SECONDS
            sleeper = asyncio.ensure_future(self.clock.sleep(wait))
            stopper = asyncio.ensure_future(stop.wait())
            await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
            for t in (sleeper, stopper):
                t.cancel()
