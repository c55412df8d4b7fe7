"""A cost alert carries its factor split in one line, to every sink: the history of
tests/test_explain_cli.py (through the real window join into the real store: v1, then a v2 build
whose decode steps are 1.8× longer at the same load), the real detection pipeline with a
cost-per-token rule, and Slack, PagerDuty, webhook and Alertmanager receivers on 127.0.0.1."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from receivers import Receiver
from test_explain_cli import PHASES, phase_start, write_history

from agent.clock import ManualClock
from agent.config import (
    AlertmanagerConfig,
    PagerDutyConfig,
    SecretRef,
    SlackConfig,
    WebhookConfig,
    parse_config,
)
from agent.detect.alerts import AlertManager
from agent.detect.deploys import record_deploy
from agent.detect.explain import AlertExplainer
from agent.detect.pipeline import build_pipeline
from agent.detect.rules import load_rules
from agent.records import MINUTE, AlertEvent, MinuteRecord
from agent.sinks.alertmanager import alertmanager_sink
from agent.sinks.delivery import Delivery
from agent.sinks.pagerduty import pagerduty_sink
from agent.sinks.slack import slack_sink
from agent.sinks.webhook import webhook_sink
from agent.store import Store

RULE = {
    "id": "cost_per_token_regression",
    "signal": "usd_per_1m_output_tokens",
    "over": "15m",
    "op": ">",
    "factor": 1.3,
    "baseline": {
        "window": "3h",
        "like_load": {"signal": "requests_running", "band_ratio": 1.5, "min_tokens_per_second": 1},
        "across_versions": True,
        "min_minutes": 30,
    },
    "for": "5m",
    "severity": "warning",
    "summary": "{model} {model_version}: ${value}/1M ({change_pct})",
    "description": "Deploy: {deploy}",
}


@pytest.fixture
async def receivers() -> AsyncIterator[dict[str, Receiver]]:
    rs = {
        "slack": Receiver("slack", path="/services/T0/B0/secret"),
        "pagerduty": Receiver("pagerduty", path="/v2/enqueue"),
        "webhook": Receiver("webhook"),
        "alertmanager": Receiver("alertmanager", path="/api/v2/alerts"),
    }
    for r in rs.values():
        await r.start()
    yield rs
    for r in rs.values():
        await r.stop()


async def test_the_alert_names_step_efficiency_in_every_sink(
    tmp_path: Path, receivers: dict[str, Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    write_history(tmp_path)
    end = phase_start(len(PHASES))
    clock = ManualClock(phase_start(1))
    store = Store(tmp_path / "history.sqlite", 35, clock, deploys=record_deploy)
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(yaml.safe_dump({"rules": [RULE]}))
    monkeypatch.setenv("T_SLACK_URL", receivers["slack"].url)
    monkeypatch.setenv("T_PD_KEY", "0123456789abcdef0123456789abcdef")
    hook = tmp_path / "hook-url"
    hook.write_text(receivers["webhook"].url)
    am_base = receivers["alertmanager"].url.removesuffix("/api/v2/alerts")
    sinks = [
        slack_sink(SlackConfig(webhook_url=SecretRef(env="T_SLACK_URL"))),
        pagerduty_sink(
            PagerDutyConfig(routing_key=SecretRef(env="T_PD_KEY"), url=receivers["pagerduty"].url)
        ),
        webhook_sink(WebhookConfig(url=SecretRef(file=hook))),
        alertmanager_sink(AlertmanagerConfig(url=am_base), clock),
    ]
    cfg = parse_config({"node": "n1", "state_dir": str(tmp_path)}, "test", environ={})
    delivery = Delivery.open(cfg.alerts, tmp_path / "outbox.sqlite", clock, sinks, rng=random.Random(1))
    pipeline = build_pipeline(cfg, store, clock, delivery, rules=load_rules([rules_file]))
    firing: list[AlertEvent] = []
    t = phase_start(1)
    pipeline.step(t)  # warm-up: v1's three hours replayed
    while t < phase_start(2) and not firing:
        t += MINUTE
        clock.advance(MINUTE)
        firing = [e for e in pipeline.step(t) if e.kind == "firing"]
    assert firing, "the slower build raised no cost alert"
    why = firing[0].alert.annotations["why"]
    # +80 % at like load, all of it step efficiency, named with the deploy
    assert why.startswith("+$") and why.split(": ", 1)[1].startswith("step efficiency +$")
    assert "(deploy v2)" in why
    for _ in range(200):
        if delivery.outbox.pending() == 0:
            break
        clock.advance(max(await delivery.deliver_once(), 0.001))
    await delivery.close()
    store.close()
    assert end > t
    slack = receivers["slack"].received[0]
    assert {"title": "Why", "value": why, "short": False} in slack["attachments"][0]["fields"]
    assert receivers["pagerduty"].received[0]["payload"]["custom_details"]["annotations"]["why"] == why
    assert receivers["webhook"].received[0]["alerts"][0]["annotations"]["why"] == why
    (posted,) = receivers["alertmanager"].raw[:1]
    assert json.loads(posted)[0]["annotations"]["why"] == why
    for r in receivers.values():
        assert r.errors == []


def test_only_cost_alerts_are_explained_and_a_failing_hook_costs_only_the_line(tmp_path: Path) -> None:
    rule = {**RULE, "id": "ttft", "signal": "ttft_p99_seconds", "summary": "slow"}
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(yaml.safe_dump({"rules": [rule]}))
    (ttft,) = load_rules([rules_file])
    from agent.detect.evaluator import Finding

    f = Finding(
        "ttft", (("node", "n1"), ("engine", "e"), ("model", "m"), ("model_version", "v")), 1e9, 2.0, 1.0
    )
    called: list[object] = []

    def series(*a: object) -> list[MinuteRecord]:
        called.append(a)
        return []

    assert AlertExplainer(series)(ttft, f, None) is None and called == []

    def broken(*_: object) -> str:
        raise RuntimeError("store gone")

    am = AlertManager([ttft], explain_lookup=broken)
    (ev,) = am.step([f], 1e9)
    assert "why" not in ev.alert.annotations
