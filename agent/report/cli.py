"""``infercost report``: the weekly report from the local store or from Prometheus, written to a
file or returned as text. ``agent/cli.py`` parses argv and calls :func:`run_report`; this module
never exits or configures logging."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from agent.clock import Clock, SystemClock
from agent.report.data import ReportError, WeeklyReport, build_from_store
from agent.report.prom import PromAuth, build_from_prometheus, parse_header
from agent.report.render import render_csv, render_html, render_json, render_markdown, render_slack

logger = logging.getLogger(__name__)

RENDERERS = {
    "md": render_markdown,
    "csv": render_csv,
    "html": render_html,
    "json": render_json,
    "slack": lambda r: render_slack(r) + "\n",
}
STORE_FILE = "history.sqlite"  # the store's file name inside the state directory


def report_from_store(state_dir: Path, end: float) -> WeeklyReport:
    """The week ending at ``end`` from the store in ``state_dir``."""
    return build_from_store(state_dir / STORE_FILE, end)


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
    try:
        if args.prometheus:
            report = build_from_prometheus(args.prometheus, end, auth=prom_auth(args))
        else:
            report = report_from_store(Path(args.state_dir), end)
    except ReportError as err:
        logger.error("report: %s", err)
        return 1
    text = RENDERERS[args.format](report)
    if args.output:
        Path(args.output).write_text(text)
        logger.info("report written to %s", args.output)
    else:
        print(text, end="")
    return 0
