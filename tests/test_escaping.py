"""Hostile names (from engine pages and deployment metadata) through every real sink to local
receivers: nothing in a payload can mention, link, format, hide text or exceed a vendor limit.

The alert is built by the real lifecycle (AlertManager and its annotator) from a finding whose
labels are the hostile values, stored in the outbox as JSON and delivered over HTTP."""

from __future__ import annotations

import json
import random
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from receivers import Receiver

from agent.clock import ManualClock
from agent.config import AlertmanagerConfig, PagerDutyConfig, SecretRef, SlackConfig, WebhookConfig
from agent.detect.alerts import AlertManager
from agent.detect.evaluator import Finding
from agent.detect.rules import load_rules
from agent.sinks.alertmanager import alertmanager_sink
from agent.sinks.escape import escape_slack
from agent.sinks.notify import Notifier
from agent.sinks.outbox import Outbox
from agent.sinks.pagerduty import pagerduty_sink
from agent.sinks.slack import slack_sink
from agent.sinks.webhook import webhook_sink

T0 = 1699833600.0
ROUTING_KEY = "0123456789abcdef0123456789abcdef"
EXTERNAL = "https://grafana.example/d/infercost"
HOSTILE = {
    "node": "n" * 10_000,  # a 10 kB name
    "engine": "<https://evil.example|runbook>",
    "model": "<!channel> *urgent* _now_ `x` ~y~ <b>html</b> <@U024BE7LH>",
    "model_version": "@here v2\x00\x07\x1b[31m\u202eevil\u2028\r\n@channel @everyone",
}
RULE = {
    "id": "cost_regression",
    "signal": "usd_per_1m_output_tokens",
    "over": "1m",
    "op": ">",
    "threshold": 1.0,
    "for": "0s",
    "severity": "critical",
    "summary": "{model} {model_version} on {engine} costs ${value}/1M",
    "description": "Deploy: {deploy}. Node {node}.",
    "runbook_url": "rules/agent/README.md#cost_regression",  # relative: built from external_url
}
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# A name must not start a line of its own in a title (a fake "RESOLVED" line).


def strings(x: Any) -> list[str]:
    """Every string (keys and values) in a JSON document."""
    if isinstance(x, str):
        return [x]
    if isinstance(x, dict):
        return [s for k, v in x.items() for s in (k, *strings(v))]
    if isinstance(x, list):
        return [s for v in x for s in strings(v)]
    return []


@pytest.fixture
async def receivers() -> AsyncIterator[dict[str, Receiver]]:
    rs = {
        "slack": Receiver("slack", path="/services/T0/B0/secret"),
        "pagerduty": Receiver("pagerduty", path="/v2/enqueue"),
        "webhook": Receiver("webhook"),
        "alertmanager": Receiver("alertmanager"),
    }
    for r in rs.values():
        await r.start()
    yield rs
    for r in rs.values():
        await r.stop()


async def deliver_hostile(tmp_path: Path, rs: dict[str, Receiver], monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "r.yaml").write_text(yaml.safe_dump({"rules": [RULE]}))
    rules = load_rules([tmp_path / "r.yaml"])
    labels = tuple(sorted(HOSTILE.items()))
    am = AlertManager(rules, EXTERNAL)
    finding = Finding("cost_regression", labels, T0, 3.1, 1.0)
    events = am.step([finding], T0 + 60) + am.step([], T0 + 120)  # firing, then resolved
    assert [e.kind for e in events] == ["pending", "firing", "resolved"]
    monkeypatch.setenv("T_SLACK_URL", rs["slack"].url)
    monkeypatch.setenv("T_PD_KEY", ROUTING_KEY)
    monkeypatch.setenv("T_HOOK_URL", rs["webhook"].url)
    sinks = [
        slack_sink(SlackConfig(webhook_url=SecretRef(env="T_SLACK_URL"), min_interval_seconds=0), EXTERNAL),
        pagerduty_sink(
            PagerDutyConfig(routing_key=SecretRef(env="T_PD_KEY"), url=rs["pagerduty"].url), EXTERNAL
        ),
        webhook_sink(WebhookConfig(url=SecretRef(env="T_HOOK_URL")), EXTERNAL),
        alertmanager_sink(AlertmanagerConfig(url=rs["alertmanager"].url), ManualClock(T0 + 120), EXTERNAL),
    ]
    clock = ManualClock(T0 + 120)
    n = Notifier(Outbox(tmp_path / "outbox.sqlite"), sinks, clock, rng=random.Random(1))
    assert n.enqueue(events) == 8
    for _ in range(10):
        await n.deliver_once()
        clock.advance(1.0)
    await n.close()
    for name, r in rs.items():
        assert r.errors == [], (name, r.errors)
        assert len(r.received) == 2, name  # firing and resolved, both accepted by the vendor checks


async def test_hostile_names_reach_no_one_unescaped(
    tmp_path: Path, receivers: dict[str, Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    await deliver_hostile(tmp_path, receivers, monkeypatch)
    everything = [s for r in receivers.values() for b in r.received for s in strings(b)]
    assert not any(CONTROL.search(s) for s in everything)  # no control, bidi or separator characters

    # Slack: &, <, > escaped (no mention, no link from data), @-mentions broken, no mrkdwn.
    for body in receivers["slack"].received:
        texts = strings(body)
        assert not any(
            t for t in texts if ("<" in t or ">" in t) and not t.startswith("https://grafana.example/")
        )
        assert not any(re.search(r"@(here|channel|everyone)", t) for t in texts)
        assert body["mrkdwn"] is False and body["attachments"][0]["mrkdwn_in"] == []
        assert body["attachments"][0]["title_link"] == EXTERNAL  # only our configured link
        assert len(json.dumps(body)) < 40_000  # Slack's message limit
    firing = receivers["slack"].received[0]["attachments"][0]
    # the summary template "{model} {model_version} on {engine} costs ${value}/1M", escaped by hand:
    assert firing["title"].startswith(
        "&lt;!channel&gt; *urgent* _now_ `x` ~y~ &lt;b&gt;html&lt;/b&gt; &lt;@\u200bU024BE7LH&gt; "
        "@\u200bhere v2[31mevil @\u200bchannel @\u200beveryone on &lt;https://evil.example|runbook&gt; "
        "costs $3.1/1M"
    )
    fields = {f["title"]: f["value"] for f in firing["fields"]}
    assert fields["Runbook"] == "https://grafana.example/d/infercost/rules/agent/README.md#cost_regression"
    assert len(receivers["slack"].received[0]["attachments"][0]["text"]) <= 3000

    # PagerDuty: documented limits held; links only from config.
    for body in receivers["pagerduty"].received:
        assert len(body["payload"]["summary"]) <= 1024 and len(body["dedup_key"]) <= 255
        assert len(body["payload"]["source"]) <= 255
        details = body["payload"]["custom_details"]
        assert all(len(v) <= 1024 for part in details.values() for v in part.values())
        assert body["client_url"] == EXTERNAL
        assert [link["href"] for link in body["links"]] == [
            "https://grafana.example/d/infercost/rules/agent/README.md#cost_regression"
        ]
    trig = receivers["pagerduty"].received[0]["payload"]
    assert trig["source"] == "n" * 254 + "…"  # the 10 kB node name cut to 255
    assert trig["component"] == HOSTILE["model"]  # plain text (PagerDuty renders no markup)

    # Webhook and Alertmanager: plain JSON, ASCII-escaped on the wire, values bounded.
    for r in (receivers["webhook"], receivers["alertmanager"]):
        for raw in r.raw:
            assert raw.isascii()
    for body in receivers["webhook"].received:
        assert all(len(s) <= 4096 for s in strings(body))
        assert body["alerts"][0]["labels"]["node"] == "n" * 1023 + "…"
    for body in receivers["alertmanager"].received:
        [alert] = body
        assert alert["labels"]["node"] == "n" * 1023 + "…"
        assert alert["labels"]["engine"] == "<https://evil.example|runbook>"  # data, not a link
        assert alert["generatorURL"] == EXTERNAL


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        ("a & b", 100, "a &amp; b"),
        ("<!here> <@U1|bob>", 100, "&lt;!here&gt; &lt;@\u200bU1|bob&gt;"),
        ("mail ops@example.com", 100, "mail ops@\u200bexample.com"),
        ("x\x00y\u202ez\n", 100, "xyz\n"),
        ("&&&&", 10, "&amp;…"),  # never half an entity: "&amp;&amp;" is 10 but there is more
        ("&&", 10, "&amp;&amp;"),
    ],
)
def test_escape_slack_table(text: str, limit: int, expected: str) -> None:
    assert escape_slack(text, limit) == expected
