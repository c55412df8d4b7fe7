"""``infercost report``: the weekly report from the local store or from Prometheus, written to a
file or returned as text. ``agent/cli.py`` parses argv and calls :func:`run_report`; this module
never exits or configures logging."""

from __future__ import annotations

import argparse
import logging
import sqlite3
from collections.abc import Iterable
from pathlib import Path

from agent.clock import Clock, SystemClock
from agent.detect.rules import MINUTE, MinuteRecord, window_from_record
from agent.report.data import (
    WEEK_SECONDS,
    ReportError,
    WeeklyReport,
    build_from_prometheus,
    build_from_windows,
)
from agent.report.render import render_csv, render_html, render_markdown
from agent.samples import CostWindow

logger = logging.getLogger(__name__)

RENDERERS = {"md": render_markdown, "csv": render_csv, "html": render_html}
STORE_FILE = "history.sqlite"  # the store's file name inside the state directory


def windows_from_records(records: Iterable[MinuteRecord]) -> list[CostWindow]:
    """The store's per-minute model rollups as CostWindows (one per minute and series)."""
    return [window_from_record(r) for r in records if r.kind == "model"]


def report_from_store(state_dir: Path, end: float) -> WeeklyReport:
    """The week ending at ``end`` from the store in ``state_dir``."""
    from agent.store import Store, StoreError  # sqlite only when this path is taken

    path = state_dir / STORE_FILE
    if not path.exists():
        raise ReportError(f"{path}: no store here; fix: pass the agent's state directory (--state-dir)")
    try:
        store = Store(path)
    except (StoreError, sqlite3.Error) as err:
        raise ReportError(f"{path}: cannot open the store: {err}") from None
    # Two weeks of minutes, plus the minute whose window ends exactly at `end - 2 weeks`.
    records = store.records(end - 2 * WEEK_SECONDS - MINUTE, end, kinds=("model",))
    return build_from_windows(windows_from_records(records), end)


def run_report(args: argparse.Namespace, clock: Clock | None = None) -> int:
    """Build and render the report named by ``args`` (state_dir | prometheus, format, end, output).

    Returns 0, or 1 when the data source fails (the error is logged)."""
    end = args.end if args.end is not None else (clock or SystemClock()).now()
    try:
        if args.prometheus:
            report = build_from_prometheus(args.prometheus, end)
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
