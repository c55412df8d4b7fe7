"""Text from whoever deploys an engine cannot act where a person reads it: invisible formatting
characters (bidirectional overrides, zero-width characters, the byte-order mark) reach no Slack,
PagerDuty, webhook or Alertmanager payload, no report file and no log line; a report CSV cell is
never a formula, while a number (a negative dollar figure too) stays a number; a secret comes out of
error text whatever its letter case."""

from __future__ import annotations

import csv
import datetime as dt
import json
import logging
import random
import re
import sqlite3
import subprocess
import sys
import unicodedata
from pathlib import Path
from typing import Any

import pytest
import test_escaping
import yaml
from receivers import Receiver
from test_escaping import deliver_hostile, strings
from test_report_like_load import DAY, T, scenario
from test_report_schedule import Daemon

from agent.clock import ManualClock
from agent.config import SecretRef, SlackConfig
from agent.report.escape import csv_cell
from agent.report.render import CSV_COLUMNS
from agent.samples import CostWindow, UsageWindow
from agent.sinks.escape import clean, escape_slack, redact, url_secrets
from agent.sinks.notify import Notifier
from agent.sinks.outbox import Outbox
from agent.sinks.slack import slack_sink
from agent.text import strip_invisible

WEEK = 7 * DAY
# every kind the red team used: overrides, isolates, marks, zero-width space / joiner / non-joiner,
# word joiner, byte-order mark, soft hyphen, a tag character
INVISIBLE = (
    "\u202e\u202a\u2066\u2067\u2068\u2069\u200e\u200f\u061c\u200b\u200c\u200d\u2060\ufeff\u00ad\U000e0041"
)
# the zero-width spaces our own neutralisers put in (a mention, a scheme, a www. host)
BREAKS = re.compile("@\u200b|:\u200b//|www\u200b\\.")


def invisible(text: str) -> list[str]:
    """The format (Cf) characters of ``text`` outside our own breaks, as U+ names."""
    return [f"U+{ord(c):04X}" for c in BREAKS.sub("", text) if unicodedata.category(c) == "Cf"]


def test_every_bidi_control_and_zero_width_character_is_format_and_is_stripped() -> None:
    named = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
    assert all(unicodedata.category(c) == "Cf" for c in named + INVISIBLE)
    assert strip_invisible(f"ev{named}{INVISIBLE}il") == "evil"
    assert strip_invisible("plain ascii") == "plain ascii"
    assert strip_invisible("café 東京 🙂") == "café 東京 🙂"  # visible non-ASCII stays
    assert clean(f"a{INVISIBLE}b", 100) == "ab"
    # our own breaks survive a second pass (the weekly summary is escaped before the sink sees it)
    assert escape_slack("@\u200bhere at https:\u200b//x and www\u200b.y", 100) == (
        "@\u200bhere at https:\u200b//x and www\u200b.y"
    )
    assert escape_slack("@\u200d\u200bhere", 100) == "@\u200bhere"  # a hidden joiner still goes


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        ("=1+1", "'=1+1"),
        ('=HYPERLINK("https://evil.example")', '\'=HYPERLINK("https://evil.example")'),
        ("+SUM(A1)", "'+SUM(A1)"),
        ("-2+3", "'-2+3"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\tx", "'\tx"),
        ("\rx", "'\rx"),
        ("a\r\nb,c", "a\r\nb,c"),  # exact: the writer quotes it (see the report test)
        ("\u202e=1+1", "'=1+1"),  # an invisible character cannot hide the formula from the check
        ("-12.5", "-12.5"),  # numbers stay numbers
        ("-1e-07", "-1e-07"),
        ("-0", "-0"),
        ("llama-70b", "llama-70b"),
        ("", ""),
    ],
)
def test_csv_cell(cell: str, expected: str) -> None:
    assert csv_cell(cell) == expected


HOSTILE_MODELS = (
    '=HYPERLINK("https://evil.example","x")',
    "+1+1",
    "-2+3",
    "@SUM(A1)",
    "\tTAB",
    "\rCR",
    f"ev{INVISIBLE}il @here",
    "ok\r=1+1",  # a bare carriage return must not start a row whose first cell is a formula
    "ok\n@SUM(A1)",
)


async def test_the_weekly_report_files_and_slack_post_hold_no_formula_and_no_invisible_character(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real reporter over a real store: the files it writes and what the Slack receiver gets."""
    slack = Receiver("slack", path="/services/T0/B0/secret")
    await slack.start()
    monkeypatch.setenv("HARDENING_SLACK", slack.url)
    clock = ManualClock(start=T - DAY)
    d = Daemon(tmp_path, clock, "HARDENING_SLACK")
    try:
        windows = scenario()
        node = windows[-1].usage.node
        for i, name in enumerate(HOSTILE_MODELS):
            # last week twice this week's tokens for the first, half for the second: one dearer, one
            # cheaper (a negative excess in dollars), the rest flat
            last, this = {0: (2e6, 1e6), 2: (1e6, 2e6)}.get(i, (1e6, 1e6))
            for start, gen in ((T - WEEK - 3600, last), (T - 3600, this)):
                u = UsageWindow(
                    node, f"e{i}", name, f"v\u2066{i}\u2069", start, start + 3600, gen, gen, 3600, None
                )
                windows.append(CostWindow(u, 1.0, 0.0, None, None, 0.0))
        d.store.write_windows(sorted(windows, key=lambda w: w.usage.start))
        assert await d.reporter.step() == []  # first start sets the cursor
        clock.advance(T + 60 - clock.now())
        assert await d.reporter.step() == [T]
        await d.notifier.deliver_once()
    finally:
        await d.close()
        await slack.stop()

    stem = dt.datetime.fromtimestamp(T, dt.UTC).strftime("%Y-%m-%d")
    reports = tmp_path / "reports"
    with (reports / f"{stem}.csv").open(newline="", encoding="utf-8") as f:  # keep a \r in a cell
        rows = list(csv.reader(f))
    assert tuple(rows[0]) == CSV_COLUMNS
    models = {r[0] for r in rows[1:]}
    for name in HOSTILE_MODELS:  # each hostile name is there, quoted when it could act
        shown = strip_invisible(name)
        assert (shown if name[0] not in "=+-@\t\r" else "'" + shown) in models, name
    # one header, the scenario's four versions, each hostile name's, the total: nothing split a row
    assert len(rows) == 1 + 4 + len(HOSTILE_MODELS) + 1
    assert all(len(row) == len(CSV_COLUMNS) for row in rows)
    numbers = 0
    for row in rows:
        for cell in row:
            assert not invisible(cell), cell
            assert cell[:1] not in ("=", "+", "@", "\t", "\r"), cell
            if cell.startswith("-"):
                float(cell)  # only a number may start with '-'
                numbers += 1
    assert numbers  # the cheaper model's excess dollars are negative, and written as a number
    for ext in ("html", "md"):
        assert not invisible((reports / f"{stem}.{ext}").read_text(encoding="utf-8")), ext
    # JSON is the data for programs: names exactly as reported, but ASCII-escaped, so nothing acts
    # where a person opens the file
    assert (reports / f"{stem}.json").read_text(encoding="utf-8").isascii()
    (msg,) = slack.received
    everything = strings(msg)
    assert not [s for s in everything if invisible(s)]
    assert not any(re.search(r"@(here|channel|everyone)", s) for s in everything)


async def test_alert_payloads_to_every_sink_hold_no_invisible_character(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slack, PagerDuty, webhook and Alertmanager receivers on 127.0.0.1, fed by the real
    lifecycle and outbox with names full of invisible characters."""
    hostile = {
        "node": f"node{INVISIBLE}-1",
        "engine": f"vllm\u202e{INVISIBLE}",
        "model": f"llama\u200b-70b{INVISIBLE}",
        "model_version": "v2\u2066\u202eevil\u2069@\u200dhere",
    }
    monkeypatch.setattr(test_escaping, "HOSTILE", hostile)
    rs = {
        "slack": Receiver("slack", path="/services/T0/B0/secret"),
        "pagerduty": Receiver("pagerduty", path="/v2/enqueue"),
        "webhook": Receiver("webhook"),
        "alertmanager": Receiver("alertmanager"),
    }
    for r in rs.values():
        await r.start()
    try:
        await deliver_hostile(tmp_path, rs, monkeypatch)
    finally:
        for r in rs.values():
            await r.stop()
    for name, r in rs.items():
        texts = [s for b in r.received for s in strings(b)]
        assert texts and not [s for s in texts if invisible(s)], name
    slack = [s for b in rs["slack"].received for s in strings(b)]
    assert not [s for s in slack if re.search(r"@(here|channel|everyone)", s)]  # the joiner hid none
    firing = rs["pagerduty"].received[0]["payload"]
    assert firing["component"] == "llama-70b" and firing["group"] == "vllm"


# ----------------------------------------------------------------------------------- redaction
def test_redaction_ignores_letter_case_and_takes_a_secret_host_out() -> None:
    url = "https://Tok3nAbCdEf.hooks.example/services/T0/B0/XyZsEcReT?Key=AbC123"
    secrets = url_secrets(url)
    for text in (
        "Cannot connect to host tok3nabcdef.hooks.example:443 ssl:default",  # yarl lower-cases hosts
        "HTTP 404: no route /SERVICES/T0/B0/XYZSECRET",  # a server that upper-cases what it echoes
        "error at https://tok3nabcdef.hooks.example/services/t0/b0/xyzsecret?key=abc123",
    ):
        out = redact(text, secrets)
        assert "***" in out
        for s in ("tok3nabcdef", "xyzsecret", "abc123"):
            assert s not in out.lower(), (text, out)
    user = url_secrets("https://bot:Pa55w0rd@127.0.0.1:9/hook")
    assert "Pa55w0rd" in user and "bot" in user
    assert redact("nothing to hide", ()) == "nothing to hide"


async def test_a_receiver_echoing_the_secret_path_in_another_case_leaves_it_in_no_log_and_no_outbox_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secret = "T0ABC/B0DEF/MiXeDcAsEsEcReT"
    slack = Receiver("slack", path=f"/services/{secret}")
    await slack.start()
    monkeypatch.setenv("HARDENING_SLACK", slack.url)
    for _ in range(2):  # a proxy that lower-cases the path it echoes, then one that upper-cases it
        slack.answer_next(500, body=f"no such hook /services/{secret}".lower())
    slack.answer_next(400, body=f"invalid_token /SERVICES/{secret.upper()}")
    clock = ManualClock(T - DAY)
    sink = slack_sink(SlackConfig(webhook_url=SecretRef(env="HARDENING_SLACK"), min_interval_seconds=0))
    n = Notifier(Outbox(tmp_path / "outbox.sqlite"), [sink], clock, rng=random.Random(1))
    try:
        from agent.sinks.slack import enqueue_slack_message

        assert enqueue_slack_message(n, "weekly cost report", key="r1", title="t") == 1
        for _ in range(6):
            await n.deliver_once()
            clock.advance(3600)
    finally:
        await n.close()
        await slack.stop()
    assert slack.requests == 3
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name != "aiohttp.access")
    errors = [
        e for (e,) in sqlite3.connect(tmp_path / "outbox.sqlite").execute("SELECT last_error FROM outbox")
    ]
    assert errors and all("***" in e for e in errors), errors
    assert "HTTP 400" in errors[0]  # the error is still there, only the secret is gone
    for text in (logged, *errors):
        assert "mixedcasesecret" not in text.lower(), text
    assert "***" in logged


# ----------------------------------------------------------------------------------- log lines
def test_log_lines_of_the_real_command_hold_no_invisible_character(tmp_path: Path) -> None:
    """``infercost check`` as a process: the price book's warning names a book whose file name
    carries bidi overrides and zero-width characters; stderr (text and JSON lines) carries none."""
    book = tmp_path / "pri\u202ece\u2066s\u200b.yaml"
    book.write_text(
        yaml.safe_dump({"gpus": [{"match": "H100", "usd_per_hour": 2.0, "effective_from": "2099-01-01"}]})
    )
    cfg = tmp_path / "node.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "state_dir": str(tmp_path / "state"),
                "prices": {"book": str(book)},
                "exporters": {"prometheus": {"enabled": False}},
            }
        )
    )
    for fmt in ("text", "json"):
        p = subprocess.run(
            [sys.executable, "-m", "agent.cli", "check", "--log-format", fmt, "--config", str(cfg)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=Path(__file__).resolve().parents[1],
        )
        assert p.returncode == 0, p.stderr
        lines = [ln for ln in p.stderr.splitlines() if "2099-01-01" in ln]
        assert len(lines) == 1, p.stderr
        line: Any = json.loads(lines[0])["msg"] if fmt == "json" else lines[0]
        assert "prices.yaml: no GPU price is in effect now" in line and not invisible(line), line
        if fmt == "json":
            assert not invisible(json.dumps(json.loads(lines[0]), ensure_ascii=False))
