"""Hostile names (from whoever deploys an engine) through every rendering of the weekly report:
nothing they hold may mention, link, format, inject markup or break a line where a person reads it."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest

from agent.report.data import WeeklyReport, build_from_windows
from agent.report.escape import ZWSP
from agent.report.render import render_csv, render_html, render_json, render_markdown, slack_message
from agent.samples import CostWindow, UsageWindow

T = 1_790_000_000.0  # an hour boundary
LONG = "A" * 10_000 + "-v9"  # a 10 kB name whose version sits at its end
HOSTILE = (
    "<!channel>",
    "<https://evil.example|runbook>",
    "@here please",
    "**bold** _it_ ~s~ `code` [click](https://evil.example) | pipe # h",
    "<script>alert(1)</script><img src=x onerror=alert(1)>",
    "ctl\x1b[31m\nnew line\r\x00\x7f\u2028end",
    '=HYPERLINK("https://evil.example")',
    LONG,
)


def report() -> WeeklyReport:
    ws = []
    for i, name in enumerate(HOSTILE):
        for h in range(0, 336, 24):  # both weeks, one hour a day, so every name regresses or not
            start = T - 14 * 86400 + h * 3600
            gen = 1e6 * (1 if h < 168 else 0.5)  # this week half the tokens: a regression
            u = UsageWindow(
                f"node-{name}", f"engine-{name}", name, f"v-{name}", start, start + 3600,
                gen, gen, 3600.0, None, gpu_util_ratio=0.2, requests_running=4.0 + i,
            )  # fmt: skip
            ws.append(CostWindow(u, 10.0, 0.0, None, None, 0.0))
        idle = UsageWindow(
            f"node-{name}", f"engine-{name}", name, f"v-{name}", T - 1800, T, 0.0, 0.0, 1800.0, None
        )
        ws.append(CostWindow(idle, 6.0, 0.0, None, None, 6.0))  # $6 idle: an idle-GPU saving per name
    return build_from_windows(ws, end=T)


def test_slack_summary_neutralises_every_name() -> None:
    rep = report()
    assert len(rep.regressions) == 5 and rep.savings  # names reach the regression and savings lines
    body = slack_message(rep, channel="#cost")
    text = body["text"]
    assert "<" not in text and ">" not in text  # no <!channel>, no <url|text>, no markup
    assert "&lt;!channel&gt;" in text
    assert "@here" not in text
    assert f"@{ZWSP}here" in slack_message(report_of("@here please"))["text"]
    assert "https://evil" not in text
    assert "\x1b" not in text and "\r" not in text and "\x00" not in text and "\u2028" not in text
    long_text = slack_message(report_of(LONG))["text"]
    assert len(long_text) < 3000 and re.search("A…A+-v9`", long_text)  # 10 kB name: head … tail
    # ... and every line of the summary is one of ours (names cannot add lines)
    assert all(line.startswith(("*", "•", "Total", "No cost")) for line in text.splitlines())
    json.dumps(body)  # serialisable as sent


def test_markdown_neutralises_every_name() -> None:
    md = render_markdown(report())
    assert "<script" not in md and "<img" not in md and "<!channel>" not in md
    assert "https://evil" not in md and "@here" not in md
    assert "\x1b" not in md and "\x00" not in md
    # the version table keeps its 9 columns on every row: names hold no unescaped pipe or newline
    lines = md.splitlines()
    top = lines.index("## $ per 1M output tokens by model and version") + 2
    table = lines[top : top + 2 + len(HOSTILE)]
    assert table[-1].startswith("| ") and lines[top + 2 + len(HOSTILE)] == ""
    assert {len(re.findall(r"(?<!\\)\|", row)) for row in table} == {10}
    assert r"\*\*bold\*\*" in md and r"\| pipe" in md


def test_html_escapes_and_keeps_full_labels() -> None:
    page = render_html(report())
    assert "<script" not in page and "<img" not in page and "onerror=alert(1)>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;!channel&gt;" in page
    assert "\x1b" not in page and "\x00" not in page
    assert LONG in page  # full labels: the version at the end of a 10 kB name is not cut off


def test_csv_and_json_keep_the_exact_names() -> None:
    rep = report()
    rows = list(csv.DictReader(io.StringIO(render_csv(rep))))
    models = {r["model"] for r in rows} - {"(all)"}
    # a formula (or a leading @) is quoted for spreadsheets; every other name is exact
    assert '\'=HYPERLINK("https://evil.example")' in models and "'@here please" in models
    assert {m for m in models if not m.startswith("'")} == set(HOSTILE) - {HOSTILE[2], HOSTILE[6]}
    data = json.loads(render_json(rep))
    assert {m["model"] for m in data["models"]} == set(HOSTILE)


def report_of(name: str) -> WeeklyReport:
    """One version named ``name`` that regressed (+100 %) and idled ($6)."""
    ws = []
    for start, gen in ((T - 8 * 86400, 2e6), (T - 3600, 1e6)):
        ws.append(
            CostWindow(
                UsageWindow(name, name, name, name, start, start + 3600, gen, gen, 3600.0, None),
                10.0,
                0,
                None,
                None,
                0,
            )
        )
    idle = UsageWindow(name, name, name, name, T - 7200, T - 3600, 0.0, 0.0, 3600.0, None)
    ws.append(CostWindow(idle, 6.0, 0.0, None, None, 6.0))
    return build_from_windows(ws, end=T)


@pytest.mark.parametrize("name", HOSTILE)
def test_each_name_alone_renders(name: str) -> None:
    rep = report_of(name)
    assert rep.regressions and rep.savings
    for out in (render_markdown(rep), render_html(rep), slack_message(rep)["text"]):
        assert "<!channel>" not in out and "<https://evil" not in out
