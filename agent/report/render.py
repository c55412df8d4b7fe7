"""Weekly cost report: renderers, all pure functions of a :class:`WeeklyReport`.

- :func:`render_html`: one self-contained page (inline CSS and SVG, no external assets, so it can
  be mailed or opened from disk): summary cards, week over week at like load, regressions and
  savings in dollars, and per model version line charts over the week ($ per 1M output tokens
  against its baseline band at like load, spend per day, idle per day) with deploy markers. Hours
  and days without data are gaps in the lines, never $0.00; where the dollars went and where GPU
  time went (by bound, with the share of the dollars the split covers).
- :func:`render_markdown` (tickets, GitHub) and :func:`render_slack` (the summary posted to Slack).
- :func:`render_csv` and :func:`render_json`: the numbers.

Every name is escaped for its destination (:mod:`agent.report.escape`).
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from agent.cost.bound import BOUNDS
from agent.report import escape as esc
from agent.report.budget import budget_dicts, budget_html, budget_markdown
from agent.report.data import (
    DAY_SECONDS,
    HOUR_SECONDS,
    REGRESSION_RATIO,
    ModelWeek,
    Saving,
    WeeklyReport,
    WhereDollarsWent,
    WhereGpuTimeWent,
)
from agent.report.waterfall import markdown as waterfall_markdown

CSV_COLUMNS = (
    "model",
    "model_version",
    "cost_usd",
    "output_tokens",
    "prompt_tokens",
    "idle_usd",
    "usd_per_1m_output",
    "usd_per_1m_total",
    "last_usd_per_1m_output",
    "change_ratio",
    "baseline",
    "like_load_change_ratio",
    "like_load_baseline",
    "like_load_share",
    "excess_usd",
    "idle_gpu_hours",
    "gpu_util_ratio",
    "cost_floor_usd_per_1m_output",
    # where the dollars went (agent.report.data.WhereDollarsWent)
    "prompt_usd",
    "output_usd",
    "idle_usd",
    "usd_per_1m_prompt",
    "usd_per_1m_output_decode",
    "usage_usd",
    "waste_usd",
    "prefix_cache_saved_usd",
    "cost_floor_max_batch_usd_per_1m_output",
    "floor_saving_usd",
    "floor_max_batch_saving_usd",
    # where GPU time went (agent.report.data.WhereGpuTimeWent)
    "bound_usd_coverage",
    *(f"{b}_bound_time_share" for b in BOUNDS),
    *(f"{b}_bound_usd" for b in BOUNDS),
)
MAX_CHARTS = 12  # model versions charted (by cost); the tables list every version
SLACK_MAX_LINES = 5  # regressions and savings listed in the Slack summary


def escape(text: str) -> str:
    """Text for HTML: control characters replaced (one visible line), then entity-escaped."""
    return html.escape(esc.clean(text))


def _day(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def usd(v: float | None, digits: int = 2) -> str:
    """Dollars, e.g. ``$1,234.50``; an em dash when absent."""
    return "—" if v is None else f"${v:,.{digits}f}"


def axis_usd(v: float) -> str:
    """A money axis label: cents (``$10.00``, never ``$10.000``); below $0.10 the digits that show
    two significant figures (``$0.025``), since a round axis top there has no cents to show."""
    if v <= 0 or v >= 0.1:
        return usd(v)
    return usd(v, min(8, 1 - math.floor(math.log10(v))))


def day_labels(r: WeeklyReport, fmt: str = "%Y-%m-%d") -> list[str]:
    """The report's calendar days as local dates in its time zone (``day_starts``); rolling 24 h
    days from the start for a report made without them."""
    import zoneinfo

    zone = zoneinfo.ZoneInfo(r.timezone)
    starts = r.day_starts or tuple(r.start + i * DAY_SECONDS for i in range(len(r.daily_usd)))
    return [datetime.fromtimestamp(t, zone).strftime(fmt) for t in starts]


def day_ticks(r: WeeklyReport, slots: int) -> list[tuple[float, str]]:
    """Chart ticks (fraction of the width, label) at each calendar day's start: over the week's
    hours (``slots`` 168) at local midnight, over its days (one slot a day) at each slot."""
    labels = day_labels(r, "%a %d")
    if slots == len(labels):
        return [(i / slots, label) for i, label in enumerate(labels)]
    starts = r.day_starts or tuple(r.start + i * DAY_SECONDS for i in range(len(labels)))
    span = r.end - r.start
    return [((t - r.start) / span, lab) for t, lab in zip(starts, labels, strict=True) if t >= r.start]


def tokens(v: float) -> str:
    """A token count with a unit suffix, e.g. ``1.25 B``."""
    for div, suffix in ((1e9, " B"), (1e6, " M"), (1e3, " k")):
        if abs(v) >= div:
            return f"{v / div:,.2f}{suffix}"
    return f"{v:,.0f}"


def _tokens_of(m: ModelWeek, v: float) -> str:
    """A model version's token count, or an em dash where its engine counts no tokens."""
    return tokens(v) if m.tokens_counted else "—"


def change(ratio: float | None) -> str:
    """A week-over-week change, e.g. ``+52.0 %``; an em dash when absent."""
    return "—" if ratio is None else f"{(ratio - 1) * 100:+.1f} %"


def ratio(v: float | None) -> str:
    """A 0–1 ratio as a percentage."""
    return "—" if v is None else f"{v * 100:.1f} %"


def _title(r: WeeklyReport) -> str:
    return f"infercost weekly cost report: {_day(r.start)} – {_day(r.end)}"


BASELINES = {
    "version": "same version last week",
    "replaced": "the version it replaced on the same engine",
    "model": "the model's other versions",
}


def _baseline(m: ModelWeek) -> str:
    return {"version": "same version", "model": "model, all versions"}.get(m.baseline or "", "—")


def _like(m: ModelWeek) -> str:
    if m.like_change_ratio is None:
        return "—"
    return f"{change(m.like_change_ratio)} vs {BASELINES.get(m.like_baseline or '', '')}"


def _regression_line(m: ModelWeek) -> tuple[str, str]:
    """(how it changed, against what) for a regression."""
    if m.like_change_ratio is not None:
        return (
            f"{change(m.like_change_ratio)} at like load",
            f"{BASELINES.get(m.like_baseline or '', '')} ({m.like_share * 100:.0f} % of tokens compared)",
        )
    return (
        f"{change(m.change_ratio)} (not at like load: no common load band)",
        f"{_baseline(m)} last week ({usd(m.last_usd_per_1m_output, 4)})",
    )


SAVING_KINDS = {
    "idle": "idle GPUs",
    "low_utilization": "low utilisation at steady load",
    "cheaper_version": "a cheaper version of the same model",
    "unused_gpus": "GPUs no engine uses",
}


def _daily_cells(values: Sequence[float | None]) -> list[str]:
    return [usd(v) for v in values]


# ---------------------------------------------------------------------------------------------
# Markdown (GitHub)
# ---------------------------------------------------------------------------------------------


def render_markdown(r: WeeklyReport) -> str:
    """The report as GitHub-flavoured Markdown (every name escaped)."""
    out = [f"# {_title(r)}", "", f"Source: {esc.md(r.source)}", ""]
    last_total = r.last_total_usd
    out += [
        "| | this week | last week | change |",
        "|---|---:|---:|---:|",
        f"| Total cost | {usd(r.total_usd)} | {usd(last_total)} | "
        f"{change(r.total_usd / last_total if last_total else None)} |",
        f"| Idle GPU cost | {usd(r.idle_usd)} | {usd(r.last_idle_usd)} | "
        f"{change(r.idle_usd / r.last_idle_usd if r.last_idle_usd else None)} |",
        f"| $ per 1M output tokens | {usd(r.usd_per_1m_output, 4)} | | |",
        f"| Output tokens | {tokens(r.output_tokens)} | | |",
        "",
        "## $ per 1M output tokens by model and version",
        "",
        "| model | version | cost | output tokens | $/1M output | last week | change | baseline "
        "| at like load |",
        "|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for m in r.models:
        out.append(
            f"| {esc.md(m.model)} | {esc.md(m.model_version)} | {usd(m.cost_usd)} | "
            f"{_tokens_of(m, m.output_tokens)} | {usd(m.usd_per_1m_output, 4)} | "
            f"{usd(m.last_usd_per_1m_output, 4)} | "
            f"{change(m.change_ratio)} | {_baseline(m)} | {_like(m)} |"
        )
    out += waterfall_markdown(r.waterfalls, esc)
    out += ["", f"## Top regressions (≥ {REGRESSION_RATIO:g} × baseline)", ""]
    if r.regressions:
        for m in r.regressions:
            how, against = _regression_line(m)
            out.append(
                f"- **{esc.md(m.model)} {esc.md(m.model_version)}**: {usd(m.usd_per_1m_output, 4)} per 1M "
                f"output tokens, {how} vs {against}; {usd(m.excess_usd)} more this week"
            )
    else:
        out.append("None.")
    out += ["", "## Savings opportunities", ""]
    if r.savings:
        out += ["| opportunity | where | $ a week | how |", "|---|---|---:|---|"]
        out += [
            f"| {SAVING_KINDS.get(s.kind, s.kind)} | {esc.md(s.subject)} | {usd(s.usd_per_week)} | "
            f"{esc.md(s.detail, 400)} |"
            for s in r.savings
        ]
    else:
        out.append("None found in this week's data.")
    out += _table_markdown(_dollars_table(r))
    out += _table_markdown(_bound_table(r))
    out += budget_markdown(r.budgets)
    days = day_labels(r)
    out += _groups_markdown(r)
    out += ["", f"## Cost per day ({esc.md(r.timezone)})", "", "| day | cost | idle |", "|---|---:|---:|"]
    idle = list(r.daily_idle_usd) or [None] * len(days)
    out += [f"| {d} | {usd(c)} | {usd(i)} |" for d, c, i in zip(days, r.daily_usd, idle, strict=False)]
    out += ["", "## Idle GPU cost by node", "", "| node | idle cost |", "|---|---:|"]
    out += [f"| {esc.md(n.node)} | {usd(n.idle_usd)} |" for n in r.idle_by_node]
    out += [
        "",
        f"## GPU utilisation by {r.utilization_by}",
        "",
        f"| {r.utilization_by} | utilisation | GPU cost |",
    ]
    out += ["|---|---:|---:|"]
    out += [f"| {esc.md(u.group)} | {ratio(u.gpu_util_ratio)} | {usd(u.cost_usd)} |" for u in r.utilization]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# Where the dollars went: prompt vs output, allocation − usage (waste), the cost floor
# ---------------------------------------------------------------------------------------------

DOLLARS_TITLE = "Where the dollars went"
DOLLARS_NOTE = (
    "Prompt vs output by prefill vs decode request time (engines without phase times count as output); "
    "idle = dollars of windows without tokens (never part of output: prompt + output + idle = cost); "
    "waste = allocation − usage: dollars of GPU time held while no kernel ran (NVML busy time); "
    "the cost floor prices the same output tokens at the bandwidth roofline, so 'saving at the floor' "
    "is the most faster kernels or bigger batches could save on this hardware (a bound that overlaps "
    "the savings above, not added to them)."
)
DOLLARS_HEAD = (
    "model",
    "version",
    "cost",
    "prompt",
    "output",
    "idle",
    "$/1M prompt",
    "$/1M output (decode)",
    "waste (alloc − usage)",
    "$/1M output",
    "floor $/1M",
    "floor at max batch $/1M",
    "saving at the floor",
    "at max batch",
)


def _dollars_row(d: WhereDollarsWent, usd_per_1m_output: float | None, floor: float | None) -> list[str]:
    return [
        usd(d.cost_usd),
        usd(d.prompt_usd),
        usd(d.output_usd),
        usd(d.idle_usd),
        usd(d.usd_per_1m_prompt, 4),
        usd(d.usd_per_1m_output_decode, 4),
        usd(d.waste_usd),
        usd(usd_per_1m_output, 4),
        usd(floor, 4),
        usd(d.floor_max_batch_usd_per_1m, 4),
        usd(d.floor_saving_usd),
        usd(d.floor_max_batch_saving_usd),
    ]


def _has_dollar_split(r: WeeklyReport) -> bool:
    """Whether any version had a prompt split, a usage figure or a floor this week."""
    d = r.dollars
    return (
        (d.split_share is not None and d.split_share > 0)
        or d.waste_usd is not None
        or d.floor_saving_usd is not None
    )


def _dollars_summary(r: WeeklyReport) -> str:
    d = r.dollars
    share = f" ({d.prompt_usd / d.cost_usd * 100:.1f} %)" if d.cost_usd > 0 else ""
    text = f"Prompt {usd(d.prompt_usd)}{share}, output {usd(d.output_usd)}, idle {usd(d.idle_usd)}"
    if d.waste_usd is not None:
        text += f"; waste (allocation − usage) {usd(d.waste_usd)}"
    if d.cache_saved_usd > 0:
        text += f"; the prefix cache saved {usd(d.cache_saved_usd)}"
    if d.floor_saving_usd is not None:
        text += f"; at the cost floor the same output tokens would cost {usd(d.floor_saving_usd)} less"
        if d.floor_max_batch_saving_usd is not None:
            text += f" ({usd(d.floor_max_batch_saving_usd)} less at the largest batch the KV cache holds)"
    return text + "."


@dataclass(frozen=True, slots=True)
class _Table:
    """One section of the report: a title, a summary line, a note, and a table of model versions."""

    title: str
    summary: str
    note: str
    head: Sequence[str]
    rows: Sequence[tuple[ModelWeek, list[str]]]  # each version and its cells after the two names
    total: list[str]  # the cells of the "all" row


def _table_markdown(t: _Table) -> list[str]:
    """A section as Markdown lines."""
    out = ["", f"## {t.title}", "", t.summary, "", t.note, ""]
    out.append("| " + " | ".join(t.head) + " |")
    out.append("|---|---|" + "---:|" * (len(t.head) - 2))
    for m, cells in t.rows:
        out.append(f"| {esc.md(m.model)} | {esc.md(m.model_version)} | " + " | ".join(cells) + " |")
    out.append("| (all) | | " + " | ".join(t.total) + " |")
    return out


def _table_html(t: _Table) -> list[str]:
    """A section as HTML lines."""
    h = [
        f"<h2>{escape(t.title)}</h2>",
        f"<p>{escape(t.summary)}</p>",
        f'<p class="muted">{escape(t.note)}</p>',
        "<table><tr>" + "".join(f"<th>{escape(c)}</th>" for c in t.head) + "</tr>",
    ]
    for m, cells in t.rows:
        h.append(
            f"<tr><td{_nw(m.model)}>{escape(m.model)}</td><td{_nw(m.model_version)}>{escape(m.model_version)}</td>"
            + "".join(f'<td class="n">{escape(c)}</td>' for c in cells)
            + "</tr>"
        )
    h.append("<tr><td><b>all</b></td><td></td>" + "".join(f'<td class="n">{escape(c)}</td>' for c in t.total))
    h.append("</tr></table>")
    return h


def _dollars_table(r: WeeklyReport) -> _Table:
    """The "where the dollars went" section."""
    rows = [(m, _dollars_row(m.dollars, m.usd_per_1m_output, m.dollars.floor_usd_per_1m)) for m in r.models]
    total = _dollars_row(r.dollars, r.usd_per_1m_output, r.dollars.floor_usd_per_1m)
    return _Table(DOLLARS_TITLE, _dollars_summary(r), DOLLARS_NOTE, DOLLARS_HEAD, rows, total)


# ---------------------------------------------------------------------------------------------
# Where GPU time goes: compute, memory, communication, idle (NVML GPM)
# ---------------------------------------------------------------------------------------------

BOUND_TITLE = "Where GPU time goes"
BOUND_NOTE = (
    "Each GPU-second split by NVML GPM: idle = SMs without work; the busy rest in proportion to "
    "tensor-core activity (compute), DRAM bandwidth (memory) and the busier of PCIe and NVLink "
    "(communication), each against its peak. Shares are of the GPU time and dollars that had a "
    "split; 'split covers' is that part of the dollars. GPUs without GPM (before Hopper, MIG "
    "instances) have no split: unknown, not counted as any bound."
)
BOUND_HEAD = (
    "model",
    "version",
    "cost",
    "split covers",
    *(f"{b} time" for b in BOUNDS),
    *(f"{b} $" for b in BOUNDS),
)


def _bound_row(g: WhereGpuTimeWent) -> list[str]:
    return [
        usd(g.cost_usd),
        ratio(g.usd_coverage),
        *(ratio(None if g.time_share is None else g.time_share[b]) for b in BOUNDS),
        *(usd(None if g.usd is None else g.usd[b]) for b in BOUNDS),
    ]


def _bound_summary(r: WeeklyReport) -> str:
    g = r.gpu_time
    if g.time_share is None or g.usd is None:
        return (
            "No GPU time had a split this week (NVML GPM unsupported or absent on every GPU): "
            "where it went is unknown."
        )
    time = ", ".join(f"{b} {g.time_share[b] * 100:.1f} %" for b in BOUNDS)
    share = g.usd_share or {}
    money = ", ".join(f"{b} {usd(g.usd[b])} ({share.get(b, 0.0) * 100:.1f} %)" for b in BOUNDS)
    return (
        f"GPU time: {time}; dollars: {money}; the split covers {ratio(g.usd_coverage)} of the "
        f"{usd(g.cost_usd)}."
    )


def _bound_table(r: WeeklyReport) -> _Table:
    """The "where GPU time goes" section."""
    rows = [(m, _bound_row(m.gpu_time)) for m in r.models]
    return _Table(BOUND_TITLE, _bound_summary(r), BOUND_NOTE, BOUND_HEAD, rows, _bound_row(r.gpu_time))


# ---------------------------------------------------------------------------------------------
# Slack (mrkdwn summary)
# ---------------------------------------------------------------------------------------------


def render_slack(r: WeeklyReport, link: str | None = None, entities: bool = True) -> str:
    """A short Slack mrkdwn summary: totals, regressions and savings in dollars (names escaped;
    ``entities=False`` for a sender that entity-escapes the whole text itself)."""

    def txt(text: str, limit: int = esc.MAX_NAME_CHARS) -> str:
        return esc.slack(text, limit, entities)

    def code(text: str) -> str:
        return esc.slack_code(text, esc.MAX_NAME_CHARS, entities)

    last = r.last_total_usd
    lines = [
        f"*infercost weekly cost report* {_day(r.start)[:10]} – {_day(r.end)[:10]} ({txt(r.source, 80)})",
        f"Total {usd(r.total_usd)} (last week {usd(last)}, {change(r.total_usd / last if last else None)}) · "
        f"idle {usd(r.idle_usd)} · {usd(r.usd_per_1m_output, 4)} per 1M output tokens",
    ]
    if _has_dollar_split(r):
        lines.append(txt(_dollars_summary(r), 400))
    if r.gpu_time.usd_share is not None:
        lines.append(txt(_bound_summary(r), 400))
    if r.regressions:
        lines.append("*Top regressions*")
        for m in r.regressions[:SLACK_MAX_LINES]:
            how, against = _regression_line(m)
            lines.append(
                f"• {code(m.model)} {code(m.model_version)}: {usd(m.usd_per_1m_output, 4)}/1M, "
                f"{txt(how, 200)} vs {txt(against, 200)}, {usd(m.excess_usd)} more"
            )
    else:
        lines.append("No cost regression this week.")
    if r.savings:
        total = sum(s.usd_per_week for s in r.savings)
        lines.append(f"*Savings opportunities* (up to {usd(total)} a week)")
        for s in r.savings[:SLACK_MAX_LINES]:
            lines.append(
                f"• {usd(s.usd_per_week)}/week: {SAVING_KINDS.get(s.kind, s.kind)}, "
                f"{code(s.subject)}: {txt(s.detail, 300)}"
            )
    if link:
        lines.append(f"Full report: {txt(link, 500)}")
    return "\n".join(lines)


def slack_message(r: WeeklyReport, channel: str | None = None, link: str | None = None) -> dict[str, Any]:
    """The incoming-webhook JSON body of the weekly summary."""
    body: dict[str, Any] = {"username": "infercost", "text": render_slack(r, link), "mrkdwn": True}
    if channel:
        body["channel"] = channel
    return body


# ---------------------------------------------------------------------------------------------
# CSV and JSON
# ---------------------------------------------------------------------------------------------


def _num(v: float | None) -> str:
    return "" if v is None else f"{v:.6g}"


def _csv_row(cells: Sequence[str]) -> list[str]:
    """Every cell of a row through :func:`agent.report.escape.csv_cell` (text cannot act)."""
    return [esc.csv_cell(c) for c in cells]


def _groups_markdown(r: WeeklyReport) -> list[str]:
    """The cost-by-group section (``--group-by``), absent without one."""
    if not r.group_by:
        return []
    out = ["", f"## Cost by {esc.md(r.group_by)}", "", f"| {esc.md(r.group_by)} | cost | idle | output tokens"
           " | $/1M output |", "|---|---:|---:|---:|---:|"]  # fmt: skip
    out += [
        f"| {esc.md(g.group)} | {usd(g.cost_usd)} | {usd(g.idle_usd)} | {tokens(g.output_tokens)} | "
        f"{usd(g.usd_per_1m_output, 4)} |"
        for g in r.groups
    ]
    return out


def _groups_html(r: WeeklyReport) -> list[str]:
    """The cost-by-group section as HTML."""
    if not r.group_by:
        return []
    h = [
        f"<h2>Cost by {escape(r.group_by)}</h2>",
        f"<table><tr><th>{escape(r.group_by)}</th><th>cost</th><th>idle</th><th>output tokens</th>"
        "<th>$/1M output</th></tr>",
    ]
    h += [
        f'<tr><td{_nw(g.group)}>{escape(g.group)}</td><td class="n">{usd(g.cost_usd)}</td>'
        f'<td class="n">{usd(g.idle_usd)}</td><td class="n">{tokens(g.output_tokens)}</td>'
        f'<td class="n">{usd(g.usd_per_1m_output, 4)}</td></tr>'
        for g in r.groups
    ]
    h.append("</table>")
    return h


def render_csv(r: WeeklyReport) -> str:
    """One row per model version plus an ``(all)`` total row; empty cells where absent. Rows end
    with CRLF (RFC 4180): the writer then quotes every cell holding a CR or an LF, so a name with a
    bare carriage return cannot start a row of its own (whose first cell could be a formula)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\r\n")
    w.writerow(_csv_row(CSV_COLUMNS))
    for m in r.models:
        w.writerow(
            _csv_row(
                [
                    m.model,
                    m.model_version,
                    f"{m.cost_usd:.6f}",
                    f"{m.output_tokens:.0f}" if m.tokens_counted else "",
                    f"{m.prompt_tokens:.0f}" if m.tokens_counted else "",
                    f"{m.idle_usd:.6f}",
                    _num(m.usd_per_1m_output),
                    _num(m.usd_per_1m_total),
                    _num(m.last_usd_per_1m_output),
                    _num(m.change_ratio),
                    m.baseline or "",
                    _num(m.like_change_ratio),
                    m.like_baseline or "",
                    _num(m.like_share),
                    _num(m.excess_usd),
                    _num(m.idle_gpu_hours),
                    _num(m.gpu_util_ratio),
                    _num(m.cost_floor_usd_per_1m),
                    *_dollar_cells(m.dollars),
                    *_bound_cells(m.gpu_time),
                ]
            )
        )
    prompt = sum(m.prompt_tokens for m in r.models)
    total_tokens = r.output_tokens + prompt
    w.writerow(
        _csv_row(
            [
                "(all)",
                "",
                f"{r.total_usd:.6f}",
                f"{r.output_tokens:.0f}",
                f"{prompt:.0f}",
                f"{r.idle_usd:.6f}",
                _num(r.usd_per_1m_output),
                _num(r.total_usd / total_tokens * 1e6 if total_tokens > 0 else None),
                *[""] * (len(CSV_COLUMNS) - 8 - len(_DOLLAR_CSV) - len(_BOUND_CSV)),
                *_dollar_cells(r.dollars),
                *_bound_cells(r.gpu_time),
            ]
        )
    )
    return buf.getvalue()


_DOLLAR_CSV = CSV_COLUMNS[CSV_COLUMNS.index("prompt_usd") : CSV_COLUMNS.index("bound_usd_coverage")]
_BOUND_CSV = CSV_COLUMNS[CSV_COLUMNS.index("bound_usd_coverage") :]


def _bound_cells(g: WhereGpuTimeWent) -> list[str]:
    """The CSV cells of :data:`_BOUND_CSV` (empty where absent)."""
    return [
        _num(g.usd_coverage),
        *(_num(None if g.time_share is None else g.time_share[b]) for b in BOUNDS),
        *(_num(None if g.usd is None else g.usd[b]) for b in BOUNDS),
    ]


def _dollar_cells(d: WhereDollarsWent) -> list[str]:
    """The CSV cells of :data:`_DOLLAR_CSV` (empty where absent)."""
    return [
        _num(d.prompt_usd),
        _num(d.output_usd),
        _num(d.idle_usd),
        _num(d.usd_per_1m_prompt),
        _num(d.usd_per_1m_output_decode),
        _num(d.usage_usd),
        _num(d.waste_usd),
        _num(d.cache_saved_usd),
        _num(d.floor_max_batch_usd_per_1m),
        _num(d.floor_saving_usd),
        _num(d.floor_max_batch_saving_usd),
    ]


def report_dict(r: WeeklyReport) -> dict[str, Any]:
    """Every number of the report as plain data (absent = null), for JSON."""
    models = []
    for m in r.models:
        d = asdict(m)
        d.update(
            usd_per_1m_output=m.usd_per_1m_output,
            usd_per_1m_total=m.usd_per_1m_total,
            change_ratio=m.change_ratio,
            cost_floor_usd_per_1m_output=m.cost_floor_usd_per_1m,
            dollars=asdict(m.dollars),
            gpu_time=asdict(m.gpu_time),
        )
        if not m.tokens_counted:  # an engine that counts no tokens: absent, not 0
            d.update(output_tokens=None, prompt_tokens=None)
        models.append(d)
    return {
        "start": r.start,
        "end": r.end,
        "source": r.source,
        "total_usd": r.total_usd,
        "last_total_usd": r.last_total_usd,
        "idle_usd": r.idle_usd,
        "last_idle_usd": r.last_idle_usd,
        "usd_per_1m_output": r.usd_per_1m_output,
        "output_tokens": r.output_tokens,
        "dollars": asdict(r.dollars),
        "gpu_time": asdict(r.gpu_time),
        "daily_usd": list(r.daily_usd),
        "daily_idle_usd": list(r.daily_idle_usd),
        "timezone": r.timezone,
        "days": day_labels(r),
        "group_by": r.group_by or None,
        "groups": [{**asdict(g), "usd_per_1m_output": g.usd_per_1m_output} for g in r.groups],
        "models": models,
        "budgets": budget_dicts(r.budgets),
        "regressions": [[m.model, m.model_version] for m in r.regressions],
        "savings": [asdict(s) for s in r.savings],
        "deploys": [asdict(d) for d in r.deploys],
        "idle_by_node": [asdict(n) for n in r.idle_by_node],
        "utilization_by": r.utilization_by,
        "utilization": [asdict(u) for u in r.utilization],
    }


def render_json(r: WeeklyReport) -> str:
    """The numbers as JSON (absent values are ``null``, never 0)."""
    return json.dumps(report_dict(r), indent=1, allow_nan=False) + "\n"


# ---------------------------------------------------------------------------------------------
# HTML and SVG charts
# ---------------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#1f2328;
max-width:1200px}
h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
h3{font-size:14px;margin:18px 0 4px;overflow-wrap:anywhere}
table{border-collapse:collapse;font-size:13px}th,td{padding:4px 8px;border-bottom:1px solid #eaeef2;
vertical-align:top}td{overflow-wrap:anywhere;max-width:420px}
th{text-align:left;background:#f6f8fa}td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.cards{display:flex;gap:16px;flex-wrap:wrap}
.card{border:1px solid #d0d7de;border-radius:6px;padding:10px 16px}
.card .v{font-size:22px;font-weight:600}.card .l{font-size:12px;color:#59636e}
.up{color:#cf222e}.down{color:#1a7f37}.muted{color:#59636e;font-size:12px}
.charts{display:flex;gap:12px;flex-wrap:wrap}.chart{font-size:12px;width:360px}.nw{white-space:nowrap}
li{overflow-wrap:anywhere}
"""

CHART_W, CHART_H = 360, 150  # pixels of one chart
PAD_L, PAD_R, PAD_T, PAD_B = 58, 8, 10, 22  # pixels around the plot area
LINE = "#0969da"
BAND = "#afb8c1"
IDLE = "#bc4c00"
DEPLOY = "#8250df"
NOWRAP_CHARS = 40  # names up to this many characters are kept on one line in tables
CLIP = "#cf222e"
# Why 2×: a chart whose axis a single near-idle hour sets is flat everywhere else; values above
# twice the 95th percentile are drawn at the top edge with a marker instead.
OUTLIER_FACTOR = 2.0
BAND_MIN_PX = 4.0  # pixels: the thinnest baseline band drawn


def axis_max(values: Sequence[float]) -> float:
    """The y-axis maximum: the largest value, unless a few outliers (an hour with a handful of
    tokens has an enormous $/1M) exceed :data:`OUTLIER_FACTOR` × the 95th percentile; then that."""
    if not values:
        return 0.0
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return min(ordered[-1], OUTLIER_FACTOR * p95) if p95 > 0 else ordered[-1]


def _nice_top(v: float) -> float:
    """A round axis maximum ≥ v."""
    if v <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if m * exp >= v:
            return m * exp
    return 10 * exp


def _path(points: Sequence[tuple[float, float] | None]) -> tuple[list[str], list[tuple[float, float]]]:
    """SVG path segments through consecutive points (a None breaks the line: a gap) and the lone
    points (a segment of one point, drawn as a dot)."""
    segs: list[list[tuple[float, float]]] = [[]]
    for p in points:
        if p is None:
            if segs[-1]:
                segs.append([])
        else:
            segs[-1].append(p)
    paths, dots = [], []
    for s in segs:
        if len(s) == 1:
            dots.append(s[0])
        elif s:
            paths.append("M" + " L".join(f"{x:.1f},{y:.1f}" for x, y in s))
    return paths, dots


def _band_polygons(
    pts: Sequence[tuple[tuple[float, float], tuple[float, float]] | None], half: float
) -> list[str]:
    """The shaded band as one polygon per run of slots that have both edges (``pts``: per slot the
    low and high points, None for a gap), ``half`` a slot's half width in pixels."""
    out: list[str] = []
    run: list[tuple[tuple[float, float], tuple[float, float]]] = []
    for q in [*pts, None]:
        if q is not None:
            run.append(q)
            continue
        if run:
            # at least BAND_MIN_PX tall, so a flat baseline (every hour alike) still shows
            hi_pts = [(b[0], min(b[1], a[1] - BAND_MIN_PX / 2)) for a, b in run]
            lo_pts = [(a[0], max(a[1], b[1] + BAND_MIN_PX / 2)) for a, b in run]
            upper = [(hi_pts[0][0] - half, hi_pts[0][1]), *hi_pts, (hi_pts[-1][0] + half, hi_pts[-1][1])]
            lower = [
                (lo_pts[-1][0] + half, lo_pts[-1][1]),
                *reversed(lo_pts),
                (lo_pts[0][0] - half, lo_pts[0][1]),
            ]
            poly = " ".join(f"{x:.1f},{y:.1f}" for x, y in upper + lower)
            out.append(f'<polygon points="{poly}" fill="{BAND}" fill-opacity="0.45" stroke="none"/>')
            run = []
    return out


def line_chart(
    title: str,
    lines: Sequence[tuple[Sequence[float | None], str, str]],
    x_slots: int,
    day_start: float,
    band: tuple[Sequence[float | None], Sequence[float | None]] | None = None,
    markers: Sequence[tuple[float, str]] = (),
    digits: int = 2,
    ticks: Sequence[tuple[float, str]] | None = None,
) -> str:
    """One SVG line chart over the week: ``lines`` of (values per slot, colour, label), ``x_slots``
    slots (168 hours or 7 days) from ``day_start``; None values are gaps; an optional shaded
    ``band`` (low, high per slot); ``markers`` (fraction 0–1 of the week, label) as dashed lines."""
    vals = [v for vs, _, _ in lines for v in vs if v is not None]
    if band is not None:
        vals += [v for v in band[1] if v is not None]
    top = _nice_top(axis_max(vals))
    pw, ph = CHART_W - PAD_L - PAD_R, CHART_H - PAD_T - PAD_B
    clipped: list[tuple[float, float]] = []

    def xy(i: int, v: float) -> tuple[float, float]:
        x = PAD_L + (i + 0.5) / x_slots * pw
        if v > top:  # an outlier hour: drawn at the top edge and marked, not scaling the chart
            clipped.append((x, PAD_T))
            v = top
        return x, PAD_T + ph - v / top * ph

    p = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{CHART_W}" height="{CHART_H}" role="img" '
        f'font-size="10" font-family="system-ui,sans-serif"><title>{escape(title)}</title>',
        f'<rect x="{PAD_L}" y="{PAD_T}" width="{pw}" height="{ph}" fill="#fff" stroke="#d0d7de"/>',
    ]
    for frac in (0.5, 1.0):  # y gridlines and labels
        y = PAD_T + ph - frac * ph
        p.append(f'<line x1="{PAD_L}" x2="{PAD_L + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eaeef2"/>')
        p.append(f'<text x="{PAD_L - 4}" y="{y + 3:.1f}" text-anchor="end">{axis_usd(top * frac)}</text>')
    p.append(f'<text x="{PAD_L - 4}" y="{PAD_T + ph + 3}" text-anchor="end">$0</text>')
    if ticks is None:  # rolling days from day_start, in UTC
        ticks = [
            (d / 7, datetime.fromtimestamp(day_start + d * DAY_SECONDS, UTC).strftime("%a %d"))
            for d in range(7)
        ]
    for frac, label in ticks:  # day ticks
        x = PAD_L + frac * pw
        p.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{PAD_T}" y2="{PAD_T + ph}" stroke="#f0f2f4"/>')
        p.append(f'<text x="{x + 2:.1f}" y="{CHART_H - 8}">{escape(label)}</text>')
    if band is not None:
        lo, hi = band
        pts = [
            (xy(i, a), xy(i, b)) if a is not None and b is not None else None
            for i, (a, b) in enumerate(zip(lo, hi, strict=True))
        ]
        p.extend(_band_polygons(pts, pw / x_slots / 2))
    for frac, label in markers:
        x = PAD_L + frac * pw
        p.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{PAD_T}" y2="{PAD_T + ph}" stroke="{DEPLOY}" '
            f'stroke-dasharray="4 3" stroke-width="1.5"><title>{escape(label)}</title></line>'
        )
        # near the right edge the label goes left of the line, so it is not cut off
        tx, anchor = (x - 3, "end") if x > PAD_L + pw - 40 else (x + 3, "start")
        p.append(f'<text x="{tx:.1f}" y="{PAD_T + 10}" fill="{DEPLOY}" text-anchor="{anchor}">deploy</text>')
    for values, colour, label in lines:
        paths, dots = _path([xy(i, v) if v is not None else None for i, v in enumerate(values)])
        for seg in paths:
            p.append(
                f'<path d="{seg}" fill="none" stroke="{colour}" stroke-width="1.6">'
                f"<title>{escape(label)}</title></path>"
            )
        for x, y in dots:
            p.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{colour}"/>')
    for x, y in clipped:
        p.append(
            f'<path d="M{x - 4:.1f},{y + 6:.1f} L{x:.1f},{y:.1f} L{x + 4:.1f},{y + 6:.1f}" fill="{CLIP}">'
            "<title>above the axis (an hour with very few tokens)</title></path>"
        )
    p.append("</svg>")
    return "".join(p)


def _legend(items: Sequence[tuple[str, str]]) -> str:
    return " ".join(
        f'<span style="display:inline-block;width:10px;height:10px;background:{c};margin:0 3px 0 8px"></span>'
        f"{escape(label)}"
        for c, label in items
    )


def _version_charts(r: WeeklyReport, m: ModelWeek) -> str:
    t = m.trend
    if t is None:
        return ""
    markers = [
        (
            (d.at - r.start) / (r.end - r.start),
            f"{d.node}/{d.engine}: {d.from_version} → {d.to_version} at {_day(d.at)}",
        )
        for d in r.deploys
        if d.model == m.model and m.model_version in (d.from_version, d.to_version)
    ]
    has_band = any(v is not None for v in t.baseline_high)
    base = BASELINES.get(m.like_baseline or "", "")
    c1 = line_chart(
        f"$ per 1M output tokens, hourly: {m.model} {m.model_version}",
        [(t.usd_per_1m_output, LINE, "$ per 1M output tokens")],
        168,
        r.start,
        band=(t.baseline_low, t.baseline_high) if has_band else None,
        markers=markers,
        digits=3,
        ticks=day_ticks(r, 168),
    )
    c2 = line_chart(
        f"spend per day: {m.model} {m.model_version}",
        [(t.daily_usd, LINE, "spend per day")],
        len(t.daily_usd),
        r.start,
        markers=markers,
        ticks=day_ticks(r, len(t.daily_usd)),
    )
    c3 = line_chart(
        f"idle per day: {m.model} {m.model_version}",
        [(t.daily_idle_usd, IDLE, "idle per day")],
        len(t.daily_idle_usd),
        r.start,
        markers=markers,
        ticks=day_ticks(r, len(t.daily_idle_usd)),
    )
    legend1 = [(LINE, "$ per 1M output tokens (hourly)")]
    if has_band:
        legend1.append((BAND, f"baseline at like load, 25–75 % ({base or 'none'})"))
    return (
        f"<h3>{escape(m.model)} <span style='color:#0969da'>{escape(m.model_version)}</span></h3>"
        f'<div class="muted">{_like_html(m)}</div>'
        '<div class="charts">'
        f'<div class="chart">{c1}<div>{_legend(legend1)}</div></div>'
        f'<div class="chart">{c2}<div>{_legend([(LINE, "spend per day")])}</div></div>'
        f'<div class="chart">{c3}<div>{_legend([(IDLE, "idle per day")])}</div></div>'
        "</div>"
    )


def _like_html(m: ModelWeek) -> str:
    if m.like_change_ratio is not None:
        return escape(
            f"{change(m.like_change_ratio)} at like load vs {BASELINES.get(m.like_baseline or '', '')} "
            f"({m.like_share * 100:.0f} % of this week's tokens in common load bands)"
        )
    return escape("no like-load comparison (no common load band with a baseline)")


def _nw(name: str) -> str:
    """Keep a short name on one line (a version must not wrap at its hyphen); long ones wrap."""
    return ' class="nw"' if len(name) <= NOWRAP_CHARS else ""


def _card(label: str, value: str, sub: str = "") -> str:
    return (
        f'<div class="card"><div class="l">{escape(label)}</div><div class="v">{escape(value)}</div>'
        f'<div class="muted">{escape(sub)}</div></div>'
    )


def _change_cell(ratio_: float | None) -> str:
    # Within ±0.5 % is "unchanged" (rounding of the displayed figures): no colour.
    cls = "" if ratio_ is None or abs(ratio_ - 1) < 0.005 else ("up" if ratio_ > 1 else "down")
    return f'<td class="n {cls}">{escape(change(ratio_))}</td>'


def _saving_row(s: Saving) -> str:
    return (
        f"<tr><td>{escape(SAVING_KINDS.get(s.kind, s.kind))}</td><td>{escape(s.subject)}</td>"
        f'<td class="n">{usd(s.usd_per_week)}</td><td>{escape(s.detail)}</td></tr>'
    )


def render_html(r: WeeklyReport) -> str:
    """A self-contained HTML page: summary cards, tables, SVG line charts (every name escaped)."""
    last = r.last_total_usd
    total_change = r.total_usd / last if last else None
    h = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(_title(r))}</title><style>{_CSS}</style></head><body>",
        f"<h1>{escape(_title(r))}</h1>",
        f'<p class="muted">Source: {escape(r.source)}. $/token figures are ratios of sums; "at like load" '
        "compares hours in the same load band (requests running, else output tokens/s). Gaps in a line "
        "are hours or days without data.</p>",
        '<div class="cards">',
        _card(
            "Total cost",
            usd(r.total_usd),
            f"last week {usd(last)} ({change(total_change)})" if last is not None else "no data last week",
        ),
        _card(
            "Idle GPU cost",
            usd(r.idle_usd),
            f"last week {usd(r.last_idle_usd)}" if r.last_idle_usd is not None else "no data last week",
        ),
        _card("$ per 1M output tokens", usd(r.usd_per_1m_output, 4), "all models"),
        _card("Output tokens", tokens(r.output_tokens), ""),
        _card(
            "Savings opportunities",
            usd(sum(s.usd_per_week for s in r.savings)),
            f"{len(r.savings)} found, per week",
        ),
        "</div>",
        f"<h2>Top regressions (≥ {REGRESSION_RATIO:g} × baseline)</h2>",
    ]
    if r.regressions:
        h.append("<ul>")
        for m in r.regressions:
            how, against = _regression_line(m)
            h.append(
                f"<li><b>{escape(m.model)} {escape(m.model_version)}</b>: "
                f"{usd(m.usd_per_1m_output, 4)} per 1M output tokens, "
                f"<span class=up>{escape(how)}</span> vs {escape(against)}; "
                f"<b>{usd(m.excess_usd)}</b> more this week</li>"
            )
        h.append("</ul>")
    else:
        h.append("<p>None.</p>")
    h.append("<h2>Savings opportunities</h2>")
    if r.savings:
        h.append("<table><tr><th>opportunity</th><th>where</th><th>$ a week</th><th>how</th></tr>")
        h += [_saving_row(s) for s in r.savings]
        h.append("</table>")
    else:
        h.append("<p>None found in this week's data.</p>")
    h += _table_html(_dollars_table(r))
    h += _table_html(_bound_table(r))
    h += budget_html(r.budgets)
    h += [
        "<h2>Week over week by model and version</h2>",
        "<table><tr><th>model</th><th>version</th><th>cost</th><th>output tokens</th><th>$/1M output</th>"
        "<th>last week</th><th>change</th><th>baseline</th><th>at like load</th><th>like-load baseline</th>"
        "<th>GPU util</th>"
        "<th>cost floor $/1M</th></tr>",
    ]
    for m in r.models:
        h.append(
            f"<tr><td{_nw(m.model)}>{escape(m.model)}</td><td{_nw(m.model_version)}>{escape(m.model_version)}</td>"
            f'<td class="n">{usd(m.cost_usd)}</td><td class="n">{_tokens_of(m, m.output_tokens)}</td>'
            f'<td class="n">{usd(m.usd_per_1m_output, 4)}</td>'
            f'<td class="n">{usd(m.last_usd_per_1m_output, 4)}</td>'
            f"{_change_cell(m.change_ratio)}<td>{escape(_baseline(m))}</td>"
            f"{_change_cell(m.like_change_ratio)}<td>{escape(BASELINES.get(m.like_baseline or '', ''))}</td>"
            f'<td class="n">{ratio(m.gpu_util_ratio)}</td>'
            f'<td class="n">{usd(m.cost_floor_usd_per_1m, 4)}</td></tr>'
        )
    h.append("</table>")
    h += _groups_html(r)
    h.append(f"<h2>Fleet cost per day ({escape(r.timezone)})</h2>")
    h.append(
        '<div class="chart">'
        + line_chart(
            "cost and idle per day",
            [(r.daily_usd, LINE, "cost per day"), (r.daily_idle_usd, IDLE, "idle per day")],
            len(r.daily_usd),
            r.start,
            ticks=day_ticks(r, len(r.daily_usd)),
            markers=[((d.at - r.start) / (r.end - r.start), f"{d.model} {d.to_version}") for d in r.deploys],
        )
        + f"<div>{_legend([(LINE, 'cost per day'), (IDLE, 'idle per day'), (DEPLOY, 'deploy')])}</div></div>"
    )
    h.append("<h2>By model version over the week</h2>")
    charted = r.models[:MAX_CHARTS]
    if len(r.models) > MAX_CHARTS:
        h.append(
            f'<p class="muted">The {MAX_CHARTS} versions with the highest cost; the table lists all.</p>'
        )
    h += [_version_charts(r, m) for m in charted]
    if r.deploys:
        h.append("<h2>Deploys this week</h2><ul>")
        h += [
            f"<li>{escape(_day(d.at))}: {escape(d.node)}/{escape(d.engine)} {escape(d.model)} "
            f"{escape(d.from_version)} → {escape(d.to_version)}</li>"
            for d in r.deploys
        ]
        h.append("</ul>")
    h.append("<h2>Idle GPU cost by node</h2>")
    if r.idle_by_node:
        h.append("<table><tr><th>node</th><th>idle cost</th></tr>")
        h += [
            f'<tr><td>{escape(n.node)}</td><td class="n">{usd(n.idle_usd)}</td></tr>' for n in r.idle_by_node
        ]
        h.append("</table>")
    else:
        h.append("<p>None.</p>")
    h.append(f"<h2>GPU utilisation by {escape(r.utilization_by)}</h2>")
    h.append(f"<table><tr><th>{escape(r.utilization_by)}</th><th>utilisation</th><th>GPU cost</th></tr>")
    for u in r.utilization:
        h.append(
            f'<tr><td>{escape(u.group)}</td><td class="n">{ratio(u.gpu_util_ratio)}</td>'
            f'<td class="n">{usd(u.cost_usd)}</td></tr>'
        )
    h.append("</table>")
    h.append(
        f'<p class="muted">Hours are counted from {escape(_day(r.start))}; one hour is '
        f"{HOUR_SECONDS:.0f} s of data per series.</p></body></html>"
    )
    return "\n".join(h) + "\n"
