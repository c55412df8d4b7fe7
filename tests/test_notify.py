"""Slack / PagerDuty / webhook delivery through the outbox, against local receivers that check the
vendors' documented shapes. Time is a ManualClock: retries and rate limits are asserted as values."""

from __future__ import annotations

import json
import logging
import random
from collections.abc import AsyncIterator
from dataclasses import asdict
from pathlib import Path

import pytest
from receivers import Receiver, validate_pagerduty, validate_slack, validate_webhook

from agent.clock import ManualClock
from agent.config import PagerDutyConfig, SecretRef, SlackConfig, WebhookConfig
from agent.records import Alert, AlertEvent, dedup_key
from agent.sinks.notify import Notifier
from agent.sinks.outbox import Outbox
from agent.sinks.pagerduty import pagerduty_payload, pagerduty_sink
from agent.sinks.slack import slack_payload, slack_sink
from agent.sinks.webhook import webhook_payload, webhook_sink

REF = Path("/work/shared/reference/payloads")
T0 = 1699833600.0
ROUTING_KEY = "0123456789abcdef0123456789abcdef"
SLACK_SECRET = "T000/B000/XXXXsecretXXXX"


def alert(i: int, state: str = "firing") -> Alert:
    labels = (("node", "n1"), ("engine", "vllm-a"), ("model", f"m{i}"), ("model_version", "v2"))
    return Alert(
        rule_id="cost_per_token_regression",
        dedup_key=dedup_key("cost_per_token_regression", labels),
        severity="warning",
        state=state,  # type: ignore[arg-type]
        labels={**dict(labels), "alertname": "cost_per_token_regression", "severity": "warning"},
        annotations={
            "summary": f"$/1M of m{i} is $3.1 (+55.0 % vs $2)",
            "description": "since then",
            "value": "3.1",
            "baseline": "2",
            "change_pct": "+55.0",
            "since": "2023-11-13T00:00:00.000Z",
            "deploy": f"m{i} v1 → v2",
            "runbook_url": "https://runbooks/cost",
            "link": "http://grafana",
        },
        active_since=T0,
        last_true_at=T0 + 900,
        value=3.1,
        threshold=3.0,
        baseline=2.0,
        fired_at=T0 + 900,
        resolved_at=T0 + 1800 if state == "resolved" else None,
    )


def events(n: int) -> list[AlertEvent]:
    out = [AlertEvent("firing", alert(i), T0 + 900) for i in range(n)]
    out += [AlertEvent("resolved", alert(i, "resolved"), T0 + 1800) for i in range(n)]
    return out


@pytest.fixture
async def receivers() -> AsyncIterator[dict[str, Receiver]]:
    rs = {
        "slack": Receiver("slack", path=f"/services/{SLACK_SECRET}"),
        "pagerduty": Receiver("pagerduty", path="/v2/enqueue"),
        "webhook": Receiver("webhook"),
    }
    for r in rs.values():
        await r.start()
    yield rs
    for r in rs.values():
        await r.stop()


def make_notifier(
    tmp_path: Path,
    rs: dict[str, Receiver],
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
    which: tuple[str, ...] = ("slack", "pagerduty", "webhook"),
) -> Notifier:
    monkeypatch.setenv("T_SLACK_URL", rs["slack"].url)
    monkeypatch.setenv("T_PD_KEY", ROUTING_KEY)
    secret_file = tmp_path / "webhook-url"
    secret_file.write_text(rs["webhook"].url + "\n")
    sinks = {
        "slack": slack_sink(SlackConfig(webhook_url=SecretRef(env="T_SLACK_URL"), channel="#costs")),
        "pagerduty": pagerduty_sink(
            PagerDutyConfig(routing_key=SecretRef(env="T_PD_KEY"), url=rs["pagerduty"].url)
        ),
        "webhook": webhook_sink(
            WebhookConfig(url=SecretRef(file=secret_file)), external_url="http://grafana"
        ),
    }
    return Notifier(
        Outbox(tmp_path / "outbox.sqlite"), [sinks[w] for w in which], clock, rng=random.Random(1)
    )


async def drain(n: Notifier, clock: ManualClock, max_rounds: int = 1000) -> None:
    for _ in range(max_rounds):
        if n.outbox.pending() == 0:
            return
        wait = await n.deliver_once()
        clock.advance(max(wait, 0.001))
    raise AssertionError(f"outbox not drained: {n.pending()}")


def test_reference_payloads_pass_the_validators() -> None:
    # the receivers' checks accept what Alertmanager really sends ...
    for name, check in (
        ("slack", validate_slack),
        ("pagerduty", validate_pagerduty),
        ("webhook", validate_webhook),
    ):
        for state in ("firing", "resolved"):
            assert check(json.loads((REF / f"{name}_{state}.json").read_text())) == []
    # ... and reject what the vendors would reject
    assert "event_action" in " ".join(
        validate_pagerduty({"routing_key": ROUTING_KEY, "event_action": "fire"})
    )
    assert validate_slack({"attachments": [{"color": "red"}]}) != []


@pytest.mark.parametrize("state", ["firing", "resolved"])
def test_payloads_have_the_vendor_shapes(state: str) -> None:
    a = alert(1, state)
    body = json.loads(json.dumps(asdict(a)))  # as stored in the outbox
    slack = slack_payload(state, body, "#costs")
    ref = json.loads((REF / f"slack_{state}.json").read_text())
    assert validate_slack(slack) == []
    assert set(ref["attachments"][0]) - {"callback_id"} <= set(slack["attachments"][0])
    assert slack["attachments"][0]["color"] == ("warning" if state == "firing" else "good")
    assert slack["attachments"][0]["fallback"].startswith(
        f"[{state.upper()}] cost_per_token_regression (n1 vllm-a m1 v2)"
    )
    pd = pagerduty_payload(state, body, ROUTING_KEY)
    ref = json.loads((REF / f"pagerduty_{state}.json").read_text())
    assert validate_pagerduty(pd) == [] and set(ref) <= set(pd)
    assert pd["event_action"] == ("trigger" if state == "firing" else "resolve")
    assert pd["dedup_key"] == a.dedup_key and pd["payload"]["severity"] == "warning"
    assert pd["payload"]["custom_details"]["annotations"]["deploy"] == "m1 v1 → v2"
    wh = webhook_payload(state, body, "http://grafana")
    ref = json.loads((REF / f"webhook_{state}.json").read_text())
    assert (
        validate_webhook(wh) == [] and set(ref) == set(wh) and set(ref["alerts"][0]) == set(wh["alerts"][0])
    )
    assert wh["alerts"][0]["endsAt"] == (
        "0001-01-01T00:00:00Z" if state == "firing" else "2023-11-13T00:30:00.000Z"
    )


async def test_every_alert_delivered_in_order_with_matching_keys(
    tmp_path: Path, receivers: dict[str, Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock(T0)
    n = make_notifier(tmp_path, receivers, clock, monkeypatch)
    assert n.enqueue(events(3)) == 18
    assert n.pending() == {"slack": 6, "pagerduty": 6, "webhook": 6}
    await drain(n, clock)
    await n.close()
    for r in receivers.values():
        assert r.errors == [] and len(r.received) == 6
    pd = receivers["pagerduty"].received
    assert [(b["event_action"], b["payload"]["component"]) for b in pd] == [
        ("trigger", "m0"),
        ("trigger", "m1"),
        ("trigger", "m2"),
        ("resolve", "m0"),
        ("resolve", "m1"),
        ("resolve", "m2"),
    ]
    assert [b["dedup_key"] for b in pd[:3]] == [b["dedup_key"] for b in pd[3:]]
    assert [b["channel"] for b in receivers["slack"].received] == ["#costs"] * 6
    assert [b["status"] for b in receivers["webhook"].received] == ["firing"] * 3 + ["resolved"] * 3


async def test_receiver_down_then_up_loses_nothing(
    tmp_path: Path, receivers: dict[str, Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock(T0)
    n = make_notifier(tmp_path, receivers, clock, monkeypatch, which=("pagerduty",))
    pd = receivers["pagerduty"]
    await pd.stop()
    n.enqueue(events(4))
    delays = []
    for _ in range(6):  # six failed tries while down: backoff grows (with jitter)
        head = n.outbox.head("pagerduty")
        assert head is not None
        clock.advance(max(0.0, head.next_attempt - clock.now()))
        await n.deliver_once()
        head2 = n.outbox.head("pagerduty")
        assert head2 is not None and head2.id == head.id and head2.attempts == head.attempts + 1
        delays.append(head2.next_attempt - clock.now())
    assert all(0.5 * 2**i <= d < 2**i for i, d in enumerate(delays)), delays
    await pd.start()
    await drain(n, clock)
    await n.close()
    assert pd.errors == [] and [(b["event_action"], b["payload"]["component"]) for b in pd.received] == [
        (a, f"m{i}") for a in ("trigger", "resolve") for i in range(4)
    ]


async def test_429_retry_after_is_respected(
    tmp_path: Path, receivers: dict[str, Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock(T0)
    n = make_notifier(tmp_path, receivers, clock, monkeypatch, which=("slack",))
    slack = receivers["slack"]
    slack.answer_next(429, {"Retry-After": "30"}, "rate_limited")
    n.enqueue(events(1)[:1])
    await n.deliver_once()
    assert slack.requests == 1 and slack.received == []
    head = n.outbox.head("slack")
    assert head is not None and head.next_attempt == pytest.approx(T0 + 30)
    clock.advance(29.9)
    await n.deliver_once()
    assert slack.requests == 1  # not before Retry-After
    clock.advance(0.2)
    await n.deliver_once()
    await n.close()
    assert slack.requests == 2 and len(slack.received) == 1 and n.outbox.pending() == 0


async def test_rate_limits_slack_one_per_second_pagerduty_120_per_minute(
    tmp_path: Path, receivers: dict[str, Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock(T0)
    n = make_notifier(tmp_path, receivers, clock, monkeypatch, which=("slack", "pagerduty"))
    n.enqueue(events(61))  # 122 notifications per sink
    for _ in range(130):  # many rounds at the same instant
        await n.deliver_once()
    assert len(receivers["slack"].received) == 1
    assert len(receivers["pagerduty"].received) == 120
    clock.advance(1.0)
    for _ in range(5):
        await n.deliver_once()
    assert len(receivers["slack"].received) == 2 and len(receivers["pagerduty"].received) == 120
    clock.advance(59.0)
    await n.deliver_once()
    await n.close()
    assert len(receivers["pagerduty"].received) == 121


async def test_5xx_retried_400_dropped_and_the_queue_moves_on(
    tmp_path: Path, receivers: dict[str, Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock(T0)
    n = make_notifier(tmp_path, receivers, clock, monkeypatch, which=("pagerduty",))
    pd = receivers["pagerduty"]
    pd.answer_next(503)
    pd.answer_next(502)
    pd.answer_next(400, {"Content-Type": "application/json"}, '{"status":"invalid event"}')
    n.enqueue(events(2)[:2])
    await drain(n, clock)
    await n.close()
    # first alert: 503, 502, then refused as invalid (dead); the second goes through
    assert pd.requests == 4 and [b["payload"]["component"] for b in pd.received] == ["m1"]
    states = [(item.body["labels"]["model"], state) for item, state in n.outbox.items("pagerduty")]
    assert states == [("m0", "dead"), ("m1", "delivered")]


async def test_secrets_never_reach_a_log_line(
    tmp_path: Path,
    receivers: dict[str, Receiver],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    clock = ManualClock(T0)
    n = make_notifier(tmp_path, receivers, clock, monkeypatch)
    for r in receivers.values():
        r.answer_next(500)  # the answer echoes the request path, which holds the Slack secret
    await receivers["pagerduty"].stop()
    n.enqueue(events(1))
    await n.deliver_once()
    await receivers["pagerduty"].start()
    await drain(n, clock)
    await n.close()
    # (aiohttp.access is the fake vendor's own access log, not ours)
    text = "\n".join(r.getMessage() for r in caplog.records if r.name != "aiohttp.access")
    assert "failed" in text and "delivered" in text
    assert SLACK_SECRET not in text and ROUTING_KEY not in text and receivers["webhook"].url not in text
    assert SLACK_SECRET not in (tmp_path / "outbox.sqlite").read_bytes().decode("latin-1")


async def test_a_hanging_sink_delays_no_other(
    tmp_path: Path, receivers: dict[str, Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The webhook never answers; Slack and PagerDuty still get everything, in real time."""
    import asyncio

    from agent.clock import SystemClock

    monkeypatch.setenv("T_SLACK_URL", receivers["slack"].url)
    monkeypatch.setenv("T_PD_KEY", ROUTING_KEY)
    monkeypatch.setenv("T_HOOK_URL", receivers["webhook"].url)
    receivers["webhook"].hang = True
    sinks = [
        webhook_sink(WebhookConfig(url=SecretRef(env="T_HOOK_URL"))),  # first, to be sure
        slack_sink(SlackConfig(webhook_url=SecretRef(env="T_SLACK_URL"), min_interval_seconds=0)),
        pagerduty_sink(
            PagerDutyConfig(routing_key=SecretRef(env="T_PD_KEY"), url=receivers["pagerduty"].url)
        ),
    ]
    n = Notifier(Outbox(tmp_path / "outbox.sqlite"), sinks, SystemClock())
    n.enqueue(events(3))
    stop = asyncio.Event()
    task = asyncio.create_task(n.run(stop))
    for _ in range(200):  # up to 10 s; the webhook's send timeout is 10 s, so it is still hanging
        if len(receivers["slack"].received) == 6 and len(receivers["pagerduty"].received) == 6:
            break
        await asyncio.sleep(0.05)
    stop.set()
    await task
    await n.close()
    assert len(receivers["slack"].received) == 6 and len(receivers["pagerduty"].received) == 6
    assert receivers["webhook"].requests == 1 and receivers["webhook"].received == []
    assert n.pending() == {"webhook": 6, "slack": 0, "pagerduty": 0}


async def test_pending_counts_follow_every_delivery(
    tmp_path: Path, receivers: dict[str, Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock(T0)
    n = make_notifier(tmp_path, receivers, clock, monkeypatch, which=("pagerduty", "webhook"))
    seen: list[dict[str, int]] = []
    n.on_change = lambda p: seen.append(dict(p))
    n.enqueue(events(1))  # a firing and a resolve for each sink
    assert seen == [{"pagerduty": 2, "webhook": 2}]
    await n.deliver_once()  # one item per sink
    assert n.pending() == {"pagerduty": 1, "webhook": 1}
    await n.deliver_once()
    await n.close()
    assert n.pending() == {"pagerduty": 0, "webhook": 0}
    assert seen[-1] == {"pagerduty": 0, "webhook": 0} and len(seen) == 5  # enqueue + 4 deliveries


async def test_a_slack_message_goes_through_the_outbox(
    tmp_path: Path, receivers: dict[str, Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The weekly report's path: text escaped, only the configured link, retried like alerts."""
    from agent.sinks.slack import enqueue_slack_message

    clock = ManualClock(T0)
    n = make_notifier(tmp_path, receivers, clock, monkeypatch, which=("slack", "pagerduty"))
    receivers["slack"].answer_next(503)
    rows = enqueue_slack_message(
        n,
        "*Week 48*: llama <!channel> costs $2 & more",
        key="weekly-2026-W48",
        title="Weekly cost report",
        link="https://grafana.example/d/cost",
    )
    assert rows == 1 and n.pending() == {"slack": 1, "pagerduty": 0}  # Slack only
    assert n.enqueue_message("pagerduty", "weekly-2026-W48", {"text": "x"}) == 0  # it would page
    await drain(n, clock)
    await n.close()
    [body] = receivers["slack"].received
    assert body["text"] == "*Week 48*: llama &lt;!channel&gt; costs $2 &amp; more"
    assert body["mrkdwn"] is True and body["channel"] == "#costs"
    assert body["attachments"][0]["title"] == "Weekly cost report"
    assert body["attachments"][0]["title_link"] == "https://grafana.example/d/cost"
    assert receivers["pagerduty"].received == [] and receivers["slack"].requests == 2


def test_a_pre_escaped_message_is_not_escaped_twice() -> None:
    from agent.sinks.slack import slack_payload

    body = {"text": "*Top* `m&amp;m` &lt;!here&gt; <!channel> @here", "escaped": True}
    got = slack_payload("message", body)["text"]
    assert got == "*Top* `m&amp;m` &lt;!here&gt; &lt;!channel&gt; @\u200bhere"
    plain = slack_payload("message", {**body, "escaped": False})["text"]
    assert plain.startswith("*Top* `m&amp;amp;m` &amp;lt;!here&amp;gt;")
