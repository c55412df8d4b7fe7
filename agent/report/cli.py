"""``infercost report``: the weekly report from the local store or from Prometheus, written to a
file or returned as text. ``agent/cli.py`` parses argv and calls :func:`run_report`; this module
never exits or configures logging."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import logging
import os
import urllib.error
import urllib.request
from pathlib import Path

from agent.clock import Clock, SystemClock
from agent.report.data import ReportError, WeeklyReport, build_from_store
from agent.report.prom import PromAuth, build_from_prometheus, parse_header
from agent.report.render import (
    render_csv,
    render_html,
    render_json,
    render_markdown,
    render_slack,
    slack_message,
)

logger = logging.getLogger(__name__)

RENDERERS = {
    "md": render_markdown,
    "csv": render_csv,
    "html": render_html,
    "json": render_json,
    "slack": lambda r: render_slack(r) + "\n",
}
STORE_FILE = "history.sqlite"  # the store's file name inside the state directory
SLACK_TIMEOUT_S = 10.0  # seconds; Slack answers a webhook in well under a second


def report_from_store(state_dir: Path, end: float, tz: str = "UTC") -> WeeklyReport:
    """The week ending at ``end`` from the store in ``state_dir``, in the calendar days of ``tz``."""
    return build_from_store(state_dir / STORE_FILE, end, tz)


def prom_auth(args: argparse.Namespace) -> PromAuth:
    """The Prometheus auth options of ``args`` (raises ReportError on a malformed header)."""
    return PromAuth(
        bearer_token_file=getattr(args, "bearer_token_file", None),
        basic_auth_user=getattr(args, "basic_auth_user", None),
        basic_auth_password_file=getattr(args, "basic_auth_password_file", None),
        ca_file=getattr(args, "ca_file", None),
        headers=tuple(parse_header(h) for h in getattr(args, "header", None) or ()),
    )


def run_report(args: argparse.Namespace, clock: Clock | None = None) -> int:
    """Build and render the report named by ``args`` (state_dir | prometheus, format, end, output).

    Returns 0, or 1 when the data source fails (the error is logged)."""
    end = args.end if args.end is not None else (clock or SystemClock()).now()
    tz = getattr(args, "timezone", None) or "UTC"
    by = getattr(args, "group_by", None)
    share = bool(getattr(args, "share_idle", False))
    try:
        if args.prometheus:
            report = build_from_prometheus(args.prometheus, end, auth=prom_auth(args), tz=tz)
            from agent.report.budget import budgets_from_prometheus
            from agent.report.prom import PromApi, http_fetcher

            budget_api = PromApi(args.prometheus, http_fetcher(prom_auth(args)))
            report = dataclasses.replace(report, budgets=budgets_from_prometheus(budget_api, report.end))
            if by:
                from agent.report.groups import groups_from_prometheus
                from agent.report.prom import PromApi, http_fetcher

                api = PromApi(args.prometheus, http_fetcher(prom_auth(args)))
                groups = groups_from_prometheus(api, report.start, report.end, by, share)
                report = dataclasses.replace(report, group_by=by, groups=groups)
        else:
            report = report_from_store(Path(args.state_dir), end, tz)
            if by:
                from agent.report.groups import groups_from_store

                groups = groups_from_store(
                    Path(args.state_dir) / STORE_FILE, report.start, report.end, by, share
                )
                report = dataclasses.replace(report, group_by=by, groups=groups)
    except ReportError as err:
        logger.error("report: %s", err)
        return 1
    text = RENDERERS[args.format](report)
    if args.output:
        # strftime fields take the week's end: /reports/fleet-%Y-%m-%d.html keeps one file a week
        out = Path(dt.datetime.fromtimestamp(end, dt.UTC).strftime(str(args.output)))
        out.write_text(text)
        logger.info("report written to %s", out)
    else:
        print(text, end="")
    slack_env = getattr(args, "slack_webhook_env", None)
    if slack_env:
        try:
            post_to_slack(report, slack_env)
        except ReportError as err:
            logger.error("report: %s", err)
            return 1
        logger.info("report summary posted to Slack (webhook from $%s)", slack_env)
    return 0


def post_to_slack(report: WeeklyReport, env: str) -> None:
    """Post the Slack summary to the incoming webhook whose URL is in the environment variable
    ``env`` (one try: a CronJob retries the job). The URL is a secret: never logged."""
    url = os.environ.get(env)
    if not url:
        raise ReportError(f"${env} is not set; fix: put the Slack webhook URL in it (from a Secret)")
    body = json.dumps(slack_message(report), ensure_ascii=True).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=SLACK_TIMEOUT_S) as resp:
            resp.read()
    except urllib.error.HTTPError as err:
        raise ReportError(f"Slack answered HTTP {err.code} to the webhook in ${env}") from None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise ReportError(f"cannot reach the Slack webhook in ${env}: {type(reason).__name__}") from None
