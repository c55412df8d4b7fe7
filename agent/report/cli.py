"""``infercost report``: the weekly report from the local store or from Prometheus, written to a
file or returned as text. ``agent/cli.py`` parses argv and calls :func:`run_report`; this module
never exits or configures logging."""

from __future__ import annotations

import argparse
import logging
import sqlite3
from collections.abc import Iterable, Mapping
from pathlib import Path

from agent.clock import Clock, SystemClock
from agent.detect.rules import MINUTE, MinuteRecord
from agent.report.data import (
    WEEK_SECONDS,
    ReportError,
    WeeklyReport,
    build_from_prometheus,
    build_from_windows,
)
from agent.report.render import render_csv, render_html, render_markdown
from agent.samples import CostWindow, UsageWindow

logger = logging.getLogger(__name__)

RENDERERS = {"md": render_markdown, "csv": render_csv, "html": render_html}
STORE_FILE = "history.sqlite"  # the store's file name inside the state directory


def _gauge(sums: Mapping[str, float], name: str) -> float | None:
    """A time-weighted gauge from its (value × seconds, seconds) pair; None without weight."""
    weight = sums.get(name + ".w") or 0.0
    return sums.get(name + ".s", 0.0) / weight if weight > 0 else None


def windows_from_records(records: Iterable[MinuteRecord]) -> list[CostWindow]:
    """The store's per-minute model rollups as CostWindows (one per minute and series).

    A rollup covers the minute it starts in, so its window is [minute, minute + 60 s)."""
    out = []
    for r in records:
        if r.kind != "model":
            continue
        s = dict(r.sums)
        gen, prompt = s.get("generation_tokens", 0.0), s.get("prompt_tokens", 0.0)
        cost = s.get("cost_usd", 0.0)
        usage = UsageWindow(
            node=r.label("node"),
            engine=r.label("engine"),
            model=r.label("model"),
            model_version=r.label("model_version") or "unknown",
            start=r.minute,
            end=r.minute + MINUTE,
            prompt_tokens=prompt,
            generation_tokens=gen,
            gpu_seconds=s.get("gpu_seconds", 0.0),
            energy_joules=s.get("energy_joules"),
            gpu_util_ratio=_gauge(s, "gpu_util"),
        )
        out.append(
            CostWindow(
                usage=usage,
                gpu_time_usd=s.get("gpu_time_usd", cost - s.get("energy_usd", 0.0)),
                energy_usd=s.get("energy_usd", 0.0),
                usd_per_1m_output=cost / gen * 1e6 if gen > 0 else None,
                usd_per_1m_total=cost / (gen + prompt) * 1e6 if gen + prompt > 0 else None,
                idle_usd=s.get("idle_usd", 0.0),
            )
        )
    return out


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
