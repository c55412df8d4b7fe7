"""Weekly cost report: data (:mod:`agent.report.data`, from the local store in SQL or from
Prometheus in :mod:`agent.report.prom`), renderers (:mod:`agent.report.render`: Markdown, Slack,
CSV, JSON, self-contained HTML with SVG charts) and weekly delivery (:mod:`agent.report.schedule`)."""

from agent.report.data import (
    ReportError,
    WeeklyReport,
    build_from_store,
    build_from_windows,
)
from agent.report.prom import PromAuth, build_from_prometheus
from agent.report.render import render_csv, render_html, render_json, render_markdown, render_slack

__all__ = [
    "PromAuth",
    "ReportError",
    "WeeklyReport",
    "build_from_prometheus",
    "build_from_store",
    "build_from_windows",
    "render_csv",
    "render_html",
    "render_json",
    "render_markdown",
    "render_slack",
]
