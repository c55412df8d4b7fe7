"""Weekly cost report: renderers. Markdown (chat, tickets), CSV (spreadsheets) and one
self-contained HTML page (inline CSS and SVG bars, no external assets, so it can be mailed or
opened from disk). All three are pure functions of a :class:`WeeklyReport`."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from datetime import UTC, datetime
from html import escape

from agent.report.data import REGRESSION_RATIO, ModelWeek, WeeklyReport

BAR_WIDTH_PX = 320  # width of the longest SVG bar
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
)


def _day(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def usd(v: float | None, digits: int = 2) -> str:
    """Dollars, e.g. ``$1,234.50``; an em dash when absent."""
    return "—" if v is None else f"${v:,.{digits}f}"


def tokens(v: float) -> str:
    """A token count with a unit suffix, e.g. ``1.25 B``."""
    for div, suffix in ((1e9, " B"), (1e6, " M"), (1e3, " k")):
        if abs(v) >= div:
            return f"{v / div:,.2f}{suffix}"
    return f"{v:,.0f}"


def change(ratio: float | None) -> str:
    """A week-over-week change, e.g. ``+52.0 %``; an em dash when absent."""
    return "—" if ratio is None else f"{(ratio - 1) * 100:+.1f} %"


def ratio(v: float | None) -> str:
    """A 0–1 ratio as a percentage."""
    return "—" if v is None else f"{v * 100:.1f} %"


def _title(r: WeeklyReport) -> str:
    return f"infercost weekly cost report: {_day(r.start)} – {_day(r.end)}"


def _baseline(m: ModelWeek) -> str:
    return {"version": "same version", "model": "model, all versions"}.get(m.baseline or "", "—")


# ---------------------------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------------------------


def render_markdown(r: WeeklyReport) -> str:
    """The report as GitHub-flavoured Markdown."""
    out = [f"# {_title(r)}", "", f"Source: {r.source}", ""]
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
        "| model | version | cost | output tokens | $/1M output | last week | change | baseline |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for m in r.models:
        out.append(
            f"| {m.model} | {m.model_version} | {usd(m.cost_usd)} | {tokens(m.output_tokens)} | "
            f"{usd(m.usd_per_1m_output, 4)} | {usd(m.last_usd_per_1m_output, 4)} | "
            f"{change(m.change_ratio)} | {_baseline(m)} |"
        )
    out += ["", f"## Top regressions (≥ {REGRESSION_RATIO:g} × baseline)", ""]
    if r.regressions:
        for m in r.regressions:
            out.append(
                f"- **{m.model} {m.model_version}**: {usd(m.usd_per_1m_output, 4)} per 1M output tokens, "
                f"{change(m.change_ratio)} vs {_baseline(m)} last week ({usd(m.last_usd_per_1m_output, 4)})"
            )
    else:
        out.append("None.")
    out += ["", "## Idle GPU cost by node", "", "| node | idle cost |", "|---|---:|"]
    out += [f"| {n.node} | {usd(n.idle_usd)} |" for n in r.idle_by_node]
    out += [
        "",
        f"## GPU utilisation by {r.utilization_by}",
        "",
        f"| {r.utilization_by} | utilisation | GPU cost |",
    ]
    out += ["|---|---:|---:|"]
    out += [f"| {u.group} | {ratio(u.gpu_util_ratio)} | {usd(u.cost_usd)} |" for u in r.utilization]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# CSV
# ---------------------------------------------------------------------------------------------


def _num(v: float | None) -> str:
    return "" if v is None else f"{v:.6g}"


def render_csv(r: WeeklyReport) -> str:
    """One row per model version plus an ``(all)`` total row; empty cells where absent."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for m in r.models:
        w.writerow(
            [
                m.model,
                m.model_version,
                f"{m.cost_usd:.6f}",
                f"{m.output_tokens:.0f}",
                f"{m.prompt_tokens:.0f}",
                f"{m.idle_usd:.6f}",
                _num(m.usd_per_1m_output),
                _num(m.usd_per_1m_total),
                _num(m.last_usd_per_1m_output),
                _num(m.change_ratio),
                m.baseline or "",
            ]
        )
    prompt = sum(m.prompt_tokens for m in r.models)
    total_tokens = r.output_tokens + prompt
    w.writerow(
        [
            "(all)",
            "",
            f"{r.total_usd:.6f}",
            f"{r.output_tokens:.0f}",
            f"{prompt:.0f}",
            f"{r.idle_usd:.6f}",
            _num(r.usd_per_1m_output),
            _num(r.total_usd / total_tokens * 1e6 if total_tokens > 0 else None),
            "",
            "",
            "",
        ]
    )
    return buf.getvalue()


# ---------------------------------------------------------------------------------------------
# HTML
# ---------------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#1f2328}
h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
table{border-collapse:collapse;font-size:14px}th,td{padding:4px 10px;border-bottom:1px solid #eaeef2}
th{text-align:left;background:#f6f8fa}td.n{text-align:right;font-variant-numeric:tabular-nums}
.cards{display:flex;gap:16px;flex-wrap:wrap}
.card{border:1px solid #d0d7de;border-radius:6px;padding:10px 16px}
.card .v{font-size:22px;font-weight:600}.card .l{font-size:12px;color:#59636e}
.up{color:#cf222e}.down{color:#1a7f37}.muted{color:#59636e;font-size:12px}
"""


def _bars(rows: Sequence[tuple[str, float, float | None]], unit_digits: int = 2) -> str:
    """Horizontal SVG bars: (label, this week, last week or None) per row."""
    top = max([v for _, a, b in rows for v in (a, b) if v is not None] or [1.0]) or 1.0
    row_h, label_w = 34, 260
    height = row_h * len(rows) + 8
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + BAR_WIDTH_PX + 120}" '
        f'height="{height}" role="img">'
    ]
    for i, (label, now, before) in enumerate(rows):
        y = i * row_h + 4
        parts.append(f'<text x="0" y="{y + 14}" font-size="13">{escape(label)}</text>')
        w_now = max(1.0, now / top * BAR_WIDTH_PX)
        parts.append(f'<rect x="{label_w}" y="{y}" width="{w_now:.1f}" height="14" fill="#0969da"/>')
        parts.append(
            f'<text x="{label_w + w_now + 6:.1f}" y="{y + 12}" font-size="12">{usd(now, unit_digits)}</text>'
        )
        if before is not None:
            w_b = max(1.0, before / top * BAR_WIDTH_PX)
            parts.append(f'<rect x="{label_w}" y="{y + 16}" width="{w_b:.1f}" height="10" fill="#afb8c1"/>')
            parts.append(
                f'<text x="{label_w + w_b + 6:.1f}" y="{y + 25}" font-size="11" fill="#59636e">'
                f"{usd(before, unit_digits)} last week</text>"
            )
    parts.append("</svg>")
    return "".join(parts)


def _card(label: str, value: str, sub: str = "") -> str:
    return (
        f'<div class="card"><div class="l">{escape(label)}</div><div class="v">{escape(value)}</div>'
        f'<div class="muted">{escape(sub)}</div></div>'
    )


def _change_cell(ratio_: float | None) -> str:
    # Within ±0.5 % is "unchanged" (rounding of the displayed figures): no colour.
    cls = "" if ratio_ is None or abs(ratio_ - 1) < 0.005 else ("up" if ratio_ > 1 else "down")
    return f'<td class="n {cls}">{escape(change(ratio_))}</td>'


def render_html(r: WeeklyReport) -> str:
    """A self-contained HTML page: summary cards, SVG bars, tables."""
    last = r.last_total_usd
    total_change = r.total_usd / last if last else None
    h = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(_title(r))}</title><style>{_CSS}</style></head><body>",
        f"<h1>{escape(_title(r))}</h1>",
        f'<p class="muted">Source: {escape(r.source)}. $/token figures are ratios of sums over the week.</p>',
        '<div class="cards">',
        _card(
            "Total cost",
            usd(r.total_usd),
            f"last week {usd(last)} ({change(total_change)})",
        ),
        _card("Idle GPU cost", usd(r.idle_usd), f"last week {usd(r.last_idle_usd)}"),
        _card("$ per 1M output tokens", usd(r.usd_per_1m_output, 4), "all models"),
        _card("Output tokens", tokens(r.output_tokens), ""),
        "</div>",
        "<h2>$ per 1M output tokens by model and version</h2>",
    ]
    priced = [m for m in r.models if m.usd_per_1m_output is not None]
    if priced:
        h.append(
            _bars(
                [
                    (f"{m.model} {m.model_version}", m.usd_per_1m_output or 0.0, m.last_usd_per_1m_output)
                    for m in priced
                ],
                4,
            )
        )
    h += [
        "<table><tr><th>model</th><th>version</th><th>cost</th><th>output tokens</th><th>$/1M output</th>"
        "<th>last week</th><th>change</th><th>baseline</th></tr>"
    ]
    for m in r.models:
        h.append(
            f"<tr><td>{escape(m.model)}</td><td>{escape(m.model_version)}</td>"
            f'<td class="n">{usd(m.cost_usd)}</td><td class="n">{tokens(m.output_tokens)}</td>'
            f'<td class="n">{usd(m.usd_per_1m_output, 4)}</td>'
            f'<td class="n">{usd(m.last_usd_per_1m_output, 4)}</td>'
            f"{_change_cell(m.change_ratio)}<td>{escape(_baseline(m))}</td></tr>"
        )
    h.append("</table>")
    h.append(f"<h2>Top regressions (≥ {REGRESSION_RATIO:g} × baseline)</h2>")
    if r.regressions:
        h.append("<ul>")
        for m in r.regressions:
            h.append(
                f"<li><b>{escape(m.model)} {escape(m.model_version)}</b>: "
                f"{usd(m.usd_per_1m_output, 4)} per 1M output tokens, "
                f"<span class=up>{escape(change(m.change_ratio))}</span> vs "
                f"{escape(_baseline(m))} last week ({usd(m.last_usd_per_1m_output, 4)})</li>"
            )
        h.append("</ul>")
    else:
        h.append("<p>None.</p>")
    if any(r.daily_usd):
        h.append("<h2>Cost per day</h2>")
        days = [(_day(r.start + (i + 1) * 86_400.0)[:10], v, None) for i, v in enumerate(r.daily_usd)]
        h.append(_bars(days))
    h.append("<h2>Idle GPU cost by node</h2>")
    if r.idle_by_node:
        h.append(_bars([(n.node, n.idle_usd, None) for n in r.idle_by_node]))
    else:
        h.append("<p>None.</p>")
    h.append(f"<h2>GPU utilisation by {escape(r.utilization_by)}</h2>")
    h.append(f"<table><tr><th>{escape(r.utilization_by)}</th><th>utilisation</th><th>GPU cost</th></tr>")
    for u in r.utilization:
        h.append(
            f'<tr><td>{escape(u.group)}</td><td class="n">{ratio(u.gpu_util_ratio)}</td>'
            f'<td class="n">{usd(u.cost_usd)}</td></tr>'
        )
    h.append("</table></body></html>")
    return "\n".join(h) + "\n"
