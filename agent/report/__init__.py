"""Weekly cost report: data (:mod:`agent.report.data`, from Prometheus or the local store) and
renderers (:mod:`agent.report.render`: Markdown, CSV, self-contained HTML)."""

from agent.report.data import ReportError, WeeklyReport, build_from_prometheus, build_from_windows
from agent.report.render import render_csv, render_html, render_markdown

__all__ = [
    "ReportError",
    "WeeklyReport",
    "build_from_prometheus",
    "build_from_windows",
    "render_csv",
    "render_html",
    "render_markdown",
]
