"""`infercost demo` end to end, as a user runs it: the live numbers and the whole alert story.

The demo runs the real daemon against the simulated node on an accelerated clock: the canary of
Llama-3.1-70B gets a slower build, its cost per token rises, the regression rule fires and the
alert, naming the deploy, reaches the demo's local Slack-like receiver, whose messages it prints.
"""

from __future__ import annotations

import re
import subprocess
import sys


def test_demo_shows_costs_per_model_version_and_the_regression_alert_naming_the_deploy() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent.cli",
            "demo",
            "--seconds",
            "55",
            "--speed",
            "120",
            "--no-view",
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    # one row per model version with tokens/s and $ per 1M output and total tokens
    for engine, version in [
        ("llama-70b ", "2024-07"),
        ("llama-70b-canary", "2024-10"),
        ("mistral-7b", "v0.3"),
    ]:
        row = next(line for line in out.splitlines() if engine in line and version in line)
        numbers = re.findall(r"\d[\d,]*\.\d+|\d[\d,]*", row.split(version, 1)[1])
        assert len(numbers) >= 6, row
    assert re.search(r"GPU spend so far \$[\d,]+\.\d\d", out)
    # the story: the regression alert for the canary's new version, naming the deploy
    flat = " ".join(line.strip("│ ") for line in out.splitlines())
    assert "[FIRING] cost_per_token_regression (demo-node llama-70b-canary" in flat
    assert "2024-09 → 2024-10" in flat
    assert "cost_per_token_regression (demo-node llama-70b " not in flat  # the unchanged engine stays quiet
    # the cost floor of each served version: what it pays, the floor at this batch and at a full KV cache
    floors = re.findall(
        r"(\S+) (\S+): you pay \$([\d.]+) per 1M output tokens; the floor at this batch \(([\d,]+) running\) "
        r"is \$([\d.]+); at batch ([\d,]+) \(a full KV cache\) it would be \$([\d.]+)",
        flat,
    )
    assert {(e, v) for e, v, *_ in floors} >= {("llama-70b", "2024-07"), ("mistral-7b", "v0.3")}, flat[-3000:]
    for _, _, pay, running, floor, batch, at_max in floors:
        # the hardware bound is below what is paid, and a fuller batch is cheaper still
        assert float(at_max) < float(floor) < float(pay)
        assert int(batch.replace(",", "")) > int(running.replace(",", ""))


def test_the_floor_line_by_hand() -> None:
    from agent.snapshot import ModelState
    from infercost_sim.demo import floor_line, max_batch

    # 16 sequences fill a quarter of the KV cache: it holds 16 / 0.25 = 64 at this context
    assert max_batch(16.0, 0.25) == 64.0
    assert max_batch(None, 0.25) is None and max_batch(16.0, 0.0) is None
    m = ModelState(
        "llama-70b",
        "meta-llama/Llama-3.1-70B",
        "2024-07",
        usd_per_1m_output_tokens=2.0,
        usd_per_1m_output_tokens_floor=0.5,
        usd_per_1m_output_tokens_floor_max_batch=0.2,
        requests_running=16.0,
        kv_cache_usage_ratio=0.25,
    )
    assert floor_line(m) == (
        "llama-70b 2024-07: you pay $2.000 per 1M output tokens; the floor at this batch (16 running) "
        "is $0.500; at batch 64 (a full KV cache) it would be $0.200"
    )
    # no KV reading: the floor at this batch only; no floor (model size unknown): no line
    no_kv = ModelState("e", "m", "v", usd_per_1m_output_tokens=2.0, usd_per_1m_output_tokens_floor=0.5)
    assert floor_line(no_kv) == "e v: you pay $2.000 per 1M output tokens; the floor at this batch is $0.500"
    assert floor_line(ModelState("e", "m", "v", usd_per_1m_output_tokens=2.0)) is None


def _pty_demo(args: list[str], columns: int, until: bytes, then_signal: int | None, timeout: float = 150):
    """Run the demo on a real pseudo-terminal ``columns`` wide; read until ``until`` appears, then
    send ``then_signal`` (if any); return (exit code, everything printed)."""
    import fcntl
    import os
    import pty
    import select
    import struct
    import termios
    import time

    pid, fd = pty.fork()
    if pid == 0:  # the child: the demo on the pty
        os.execv(sys.executable, [sys.executable, "-m", "agent.cli", "demo", *args])
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    out = b""
    sent = False
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        r, _, _ = select.select([fd], [], [], 0.5)
        if r:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        if not sent and until in out and then_signal is not None:
            os.kill(pid, then_signal)
            sent = True
    try:
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


def test_the_live_view_fits_a_narrow_terminal_and_ctrl_c_stops_it() -> None:
    import signal

    code, out = _pty_demo(
        ["--seconds", "0", "--speed", "120", "--port", "0", "--history-hours", "2"],
        columns=90,
        until=b"2024-07 ",  # the production Llama's row
        then_signal=signal.SIGINT,
    )
    assert code == 0, out[-2000:]
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out)  # terminal control sequences
    # each table row, from its first border to its last (cursor moves of the live view are gone)
    rows = [
        line[line.index(c) : line.rindex(c) + 1]
        for line in text.replace("\r", "\n").splitlines()
        for c in ("│", "┃")
        if c in line
    ]
    assert rows and max(len(r) for r in rows) <= 90, max(rows, key=len)
    assert any("llama-70b" in r and "2024-07" in r for r in rows)


def test_sigterm_stops_the_demo() -> None:
    import signal

    code, out = _pty_demo(
        ["--seconds", "0", "--speed", "120", "--port", "0", "--history-hours", "2", "--no-view"],
        columns=120,
        until=b"Ctrl-C stops",
        then_signal=signal.SIGTERM,
    )
    assert code == 0, out[-2000:]
