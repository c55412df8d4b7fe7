"""The example Alertmanager routing: amtool validates it and unit-tests the routing tree, and a
real Alertmanager delivers a page to PagerDuty and Slack and a warning to Slack only (local
receivers stand in for the vendors)."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from promstack import Alertmanager, binary
from receivers import ThreadedReceiver as Receiver

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
ROUTING_KEY = "0123456789abcdef0123456789abcdef"


def amtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([binary("amtool"), *args], capture_output=True, text=True)


def routes_test(receivers: str, *labels: str) -> subprocess.CompletedProcess[str]:
    verify = f"--verify.receivers={receivers}"
    return amtool("config", "routes", "test", f"--config.file={CONFIG}", verify, *labels)


def test_check_config() -> None:
    out = amtool("check-config", str(CONFIG))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


@pytest.mark.parametrize(
    ("labels", "receivers"),
    [
        (["alertname=InfercostCostPerTokenRegression", "severity=page", "model=m"], "pagerduty,slack"),
        (["alertname=InfercostEngineDown", "severity=warning", "node=n1"], "slack"),
        (["alertname=SomethingElse"], "slack"),
    ],
)
def test_routes(labels: list[str], receivers: str) -> None:
    out = amtool(
        "config", "routes", "test", f"--config.file={CONFIG}", f"--verify.receivers={receivers}", *labels
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == receivers


def test_a_wrong_expectation_fails() -> None:
    """The routing test can fail: a warning does not reach PagerDuty."""
    out = amtool(
        "config",
        "routes",
        "test",
        f"--config.file={CONFIG}",
        "--verify.receivers=pagerduty",
        "severity=warning",
    )
    assert out.returncode != 0


def _local_copy(tmp: Path, receiver: Receiver) -> Path:
    """The example config with its secret files in tmp, vendors' URLs on the local receiver, and
    1 s grouping so the test does not wait 30 s."""
    cfg: dict[str, Any] = yaml.safe_load(CONFIG.read_text())
    slack_url = tmp / "slack-webhook-url"
    slack_url.write_text(f"{receiver.url}/slack\n")
    key = tmp / "pagerduty-routing-key"
    key.write_text(ROUTING_KEY + "\n")
    cfg["global"]["slack_api_url_file"] = str(slack_url)
    cfg["route"].update(group_wait="1s", group_interval="1s")
    for r in cfg["receivers"]:
        for pd in r.get("pagerduty_configs", []):
            pd["routing_key_file"] = str(key)
            pd["url"] = f"{receiver.url}/pagerduty"
    out = tmp / "alertmanager.yml"
    out.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return out


def _post_alerts(am: Alertmanager, alerts: list[dict[str, Any]]) -> None:
    req = urllib.request.Request(
        f"{am.url}/api/v2/alerts",
        data=json.dumps(alerts).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 200


def test_real_alertmanager_routes_page_and_warning(tmp_path: Path) -> None:
    receiver = Receiver()
    am = None
    try:
        am = Alertmanager(tmp_path, _local_copy(tmp_path, receiver))
        page_summary = "llama-70b v2: $3.10 per 1M output tokens, over 1.5 × the same hour last week"
        _post_alerts(
            am,
            [
                {
                    "labels": {
                        "alertname": "InfercostCostPerTokenRegression",
                        "severity": "page",
                        "model": "llama-70b",
                        "model_version": "v2",
                    },
                    "annotations": {"summary": page_summary, "description": "cost per token regressed"},
                },
                {
                    "labels": {"alertname": "InfercostEngineDown", "severity": "warning", "node": "n1"},
                    "annotations": {"summary": "engine vllm-0 (vllm) on n1 is down", "description": "d"},
                },
            ],
        )
        pd = receiver.wait("/pagerduty", lambda b: b["event_action"] == "trigger")
        assert len(pd) == 1
        assert pd[0]["routing_key"] == ROUTING_KEY
        assert pd[0]["payload"]["severity"] == "critical"
        assert pd[0]["payload"]["summary"] == page_summary
        assert "InfercostCostPerTokenRegression" in pd[0]["payload"]["custom_details"]["firing"]

        slack_page = receiver.wait("/slack", lambda b: page_summary in b["attachments"][0]["title"])
        slack_warn = receiver.wait("/slack", lambda b: "n1 is down" in b["attachments"][0]["title"])
        assert slack_page and slack_warn
        assert slack_page[0]["channel"] == "#llm-cost"
        assert slack_page[0]["attachments"][0]["title"].startswith("[FIRING:1] ")
        assert slack_page[0]["attachments"][0]["color"] == "danger"
        assert (
            "*InfercostEngineDown* (warning): engine vllm-0 (vllm) on n1 is down"
            in (slack_warn[0]["attachments"][0]["text"])
        )
        # Both groups were flushed together; give a stray warning page one more flush to show up.
        time.sleep(1.5)
        assert all("InfercostEngineDown" not in json.dumps(b) for b in receiver.bodies("/pagerduty"))
        assert receiver.errors == [], "what Alertmanager posted has the vendors' documented shape"
    finally:
        if am:
            am.close()
        receiver.close()
