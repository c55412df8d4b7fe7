"""Crash safety: an agent killed with SIGKILL while alerts are undelivered delivers them all after a
restart, and the resolves that follow carry the same keys (real subprocess, real receivers)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from receivers import Receiver

from agent.clock import SystemClock
from agent.config import parse_config
from agent.detect.pipeline import build_pipeline
from agent.sinks.delivery import Delivery
from agent.sinks.outbox import Outbox
from agent.store import Store

ROOT = Path(__file__).resolve().parent.parent
ROUTING_KEY = "0123456789abcdef0123456789abcdef"
RULE = {
    "id": "expensive",
    "signal": "usd_per_1m_output_tokens",
    "over": "1m",
    "op": ">",
    "threshold": 1.0,
    "for": "0s",
    "severity": "critical",
    "summary": "{model} costs ${value} per 1M output tokens",
}

CHILD = r"""
import asyncio, sys
from pathlib import Path
from agent.clock import SystemClock
from agent.config import parse_config
from agent.detect.pipeline import build_pipeline
from agent.samples import CostWindow, UsageWindow
from agent.sinks.delivery import Delivery
from agent.store import Store

state, t0, rules, pd_url = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
cfg = parse_config({"node": "n1", "state_dir": str(state), "alerts": {"rules_dirs": [rules],
    "pagerduty": {"routing_key": {"env": "T_PD_KEY"}, "url": pd_url},
    "slack": {"webhook_url": {"env": "T_SLACK_URL"}}}}, "child", environ={})
store = Store(state / "history.sqlite", 35, SystemClock())
delivery = Delivery.open(cfg.alerts, state / "outbox.sqlite", SystemClock())
pipeline = build_pipeline(cfg, store, SystemClock(), delivery)
store.write_windows([
    CostWindow(UsageWindow("n1", "vllm-a", f"m{i}", "v1", t0, t0 + 60, 0, 6000, 60, None),
               gpu_time_usd=0.05, energy_usd=0.0, usd_per_1m_output=8.3, usd_per_1m_total=8.3, idle_usd=0.0)
    for i in range(5)
])

async def main():
    events = pipeline.step(t0 + 60)
    print("QUEUED", sum(e.kind == "firing" for e in events), flush=True)
    await delivery.run(asyncio.Event())  # forever: the receivers are down

asyncio.run(main())
"""


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def attempts(db: Path) -> int:
    con = sqlite3.connect(db)
    try:
        return int(con.execute("SELECT COALESCE(SUM(attempts), 0) FROM outbox").fetchone()[0])
    except sqlite3.OperationalError:
        return 0
    finally:
        con.close()


async def wait_delivered(delivery: Delivery, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(delivery.pending().values()):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not delivered: {delivery.pending()}")


async def test_sigkill_with_undelivered_alerts_then_restart_delivers_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "r.yaml").write_text(yaml.safe_dump({"rules": [RULE]}))
    t0 = time.time() // 60 * 60 - 600
    dead = closed_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "T_PD_KEY": ROUTING_KEY,
        "T_SLACK_URL": f"http://127.0.0.1:{dead}/services/T0/B0/secret",
    }
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CHILD,
            str(state),
            repr(t0),
            str(rules),
            f"http://127.0.0.1:{dead}/v2/enqueue",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.strip() == "QUEUED 5", line + (child.stderr.read() if child.poll() is not None else "")
        deadline = time.monotonic() + 10
        while attempts(state / "outbox.sqlite") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # let it fail a delivery or two: it is mid-retry when killed
        assert attempts(state / "outbox.sqlite") >= 2
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    assert child.returncode == -signal.SIGKILL
    ob = Outbox(state / "outbox.sqlite")
    assert ob.pending() == 10  # 5 alerts × (slack, pagerduty), none delivered
    ob.close()

    # restart with the receivers up
    slack, pd = Receiver("slack", path="/services/T0/B0/secret"), Receiver("pagerduty", path="/v2/enqueue")
    await slack.start()
    await pd.start()
    monkeypatch.setenv("T_PD_KEY", ROUTING_KEY)
    monkeypatch.setenv("T_SLACK_URL", slack.url)
    cfg = parse_config(
        {
            "node": "n1",
            "state_dir": str(state),
            "alerts": {
                "rules_dirs": [str(rules)],
                "pagerduty": {"routing_key": {"env": "T_PD_KEY"}, "url": pd.url},
                # Slack's 1 message/s is tested elsewhere; 0.05 s keeps this test short
                "slack": {"webhook_url": {"env": "T_SLACK_URL"}, "min_interval_seconds": 0.05},
            },
        },
        "test",
        environ={},
    )
    store = Store(state / "history.sqlite", 35, SystemClock())
    delivery = Delivery.open(cfg.alerts, state / "outbox.sqlite", SystemClock())
    pipeline = build_pipeline(cfg, store, SystemClock(), delivery)
    stop = asyncio.Event()
    delivering = asyncio.create_task(delivery.run(stop))
    try:
        await wait_delivered(delivery)
        assert len(pd.received) == 5 and len(slack.received) == 5
        # the restarted agent remembers the 5 firing alerts; nothing new fires, and they resolve
        events = pipeline.step(t0 + 180)
        assert sorted(e.kind for e in events) == ["resolved"] * 5
        await wait_delivered(delivery)
    finally:
        stop.set()
        await delivering
        await delivery.close()
        store.close()
        await slack.stop()
        await pd.stop()
    assert pd.errors == [] and slack.errors == []
    got = [(b["event_action"], b["payload"]["component"]) for b in pd.received]
    assert got == [("trigger", f"m{i}") for i in range(5)] + [("resolve", f"m{i}") for i in range(5)]
    keys = [b["dedup_key"] for b in pd.received]
    assert keys[:5] == keys[5:] and len(set(keys)) == 5
    assert [b["attachments"][0]["color"] for b in slack.received] == ["danger"] * 5 + ["good"] * 5
