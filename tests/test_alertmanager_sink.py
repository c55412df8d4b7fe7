"""Agent alerts through Alertmanager's API v2: the payload and the re-send contract against a local
receiver (ManualClock: times are asserted as values), then the REAL Alertmanager 0.25 routing the
agent's alerts to local Slack and PagerDuty receivers, with an active silence created through its
API suppressing one alert, and a resolve."""

from __future__ import annotations

import asyncio
import json
import random
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from promstack import Alertmanager
from receivers import Receiver
from receivers import ThreadedReceiver as VendorReceiver

from agent.clock import ManualClock, SystemClock
from agent.config import AlertmanagerConfig, parse_config
from agent.records import Alert, AlertEvent, dedup_key, iso
from agent.sinks.alertmanager import alertmanager_alert, alertmanager_sink, label_name
from agent.sinks.notify import Notifier
from agent.sinks.outbox import Outbox
from agent.sinks.registry import sinks_from_config

T0 = 1699833600.0
EXTERNAL = "https://grafana.example/d/infercost"
ROUTING_KEY = "0123456789abcdef0123456789abcdef"


def alert(model: str, severity: str = "warning", at: float = T0, resolved_at: float | None = None) -> Alert:
    labels = (("node", "n1"), ("engine", "vllm-a"), ("model", model), ("model_version", "v2"))
    rule = "cost_per_token_regression"
    return Alert(
        rule_id=rule,
        dedup_key=dedup_key(rule, labels),
        severity=severity,
        state="resolved" if resolved_at else "firing",
        labels={**dict(labels), "alertname": rule, "severity": severity},
        annotations={
            "summary": f"$/1M of {model} is $3.1 (+55.0 % vs $2)",
            "description": "since the deploy",
            "runbook_url": "rules/agent/README.md#cost_per_token_regression",
            "link": EXTERNAL,
        },
        active_since=at,
        last_true_at=at,
        value=3.1,
        threshold=3.0,
        baseline=2.0,
        fired_at=at,
        resolved_at=resolved_at,
    )


def firing(a: Alert) -> AlertEvent:
    return AlertEvent("firing", a, a.active_since)


def resolved(a: Alert, at: float) -> AlertEvent:
    from dataclasses import replace

    return AlertEvent("resolved", replace(a, state="resolved", resolved_at=at), at)


@pytest.fixture
async def am_receiver() -> AsyncIterator[Receiver]:
    r = Receiver("alertmanager", path="/api/v2/alerts")
    await r.start()
    yield r
    await r.stop()


def test_postable_alert_shape() -> None:
    body = json.loads(json.dumps(_asdict(alert("m1"))))
    got = alertmanager_alert("firing", body, now=T0 + 600, ttl=240.0, external_url=EXTERNAL)
    assert got == {
        "labels": {
            "node": "n1",
            "engine": "vllm-a",
            "model": "m1",
            "model_version": "v2",
            "alertname": "cost_per_token_regression",
            "severity": "warning",
        },
        "annotations": {
            "summary": "$/1M of m1 is $3.1 (+55.0 % vs $2)",
            "description": "since the deploy",
            "runbook_url": "https://grafana.example/d/infercost/rules/agent/README.md#cost_per_token_regression",
            "link": EXTERNAL,
        },
        "startsAt": "2023-11-13T00:00:00.000Z",
        "endsAt": "2023-11-13T00:14:00.000Z",  # T0 + 600 s + 240 s
        "generatorURL": EXTERNAL,
    }
    # without external_url: no generatorURL, and the relative runbook link is left out
    body["annotations"].pop("link")
    done = alertmanager_alert("resolved", {**body, "resolved_at": T0 + 900}, now=T0 + 960, ttl=240.0)
    assert done["endsAt"] == "2023-11-13T00:15:00.000Z" and "generatorURL" not in done
    assert set(done["annotations"]) == {"summary", "description"}
    assert [label_name(n) for n in ("app.kubernetes.io/name", "9lives", "ok_1")] == [
        "app_kubernetes_io_name",
        "_9lives",
        "ok_1",
    ]


def _asdict(a: Alert) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(a)


async def test_firing_is_resent_before_ends_at_until_resolved(tmp_path: Path, am_receiver: Receiver) -> None:
    clock = ManualClock(T0)
    sink = alertmanager_sink(AlertmanagerConfig(url=am_receiver.url.removesuffix("/api/v2/alerts")), clock)
    outbox = Outbox(tmp_path / "outbox.sqlite")
    n = Notifier(outbox, [sink], clock, rng=random.Random(1))
    a = alert("m1")
    n.enqueue([firing(a)])
    await n.deliver_once()
    clock.advance(30)
    await n.deliver_once()  # not due yet: nothing re-sent
    clock.advance(30)
    await n.deliver_once()  # 60 s: queued again ...
    await n.deliver_once()  # ... and sent
    sent = [(b[0]["startsAt"], b[0]["endsAt"]) for b in am_receiver.received]
    assert sent == [
        ("2023-11-13T00:00:00.000Z", "2023-11-13T00:04:00.000Z"),  # T0 + 4 × 60 s
        ("2023-11-13T00:00:00.000Z", "2023-11-13T00:05:00.000Z"),  # re-sent at T0 + 60 s
    ]
    await n.close()

    # a restarted agent keeps re-sending what still fires (the firing set is in the outbox file)
    outbox.close()
    outbox = Outbox(tmp_path / "outbox.sqlite")
    n = Notifier(outbox, [sink], clock, rng=random.Random(1))
    clock.advance(60)
    await n.deliver_once()  # the first round after a start only schedules the re-send
    clock.advance(60)
    await n.deliver_once()
    await n.deliver_once()
    assert am_receiver.received[-1][0]["endsAt"] == "2023-11-13T00:07:00.000Z"  # T0 + 180 s + 240 s

    n.enqueue([resolved(a, T0 + 200)])
    clock.advance(20)
    await n.deliver_once()
    assert am_receiver.received[-1][0]["endsAt"] == "2023-11-13T00:03:20.000Z"  # when it resolved
    count = len(am_receiver.received)
    for _ in range(5):  # resolved: never re-sent
        clock.advance(60)
        await n.deliver_once()
        await n.deliver_once()
    await n.close()
    assert len(am_receiver.received) == count == 4 and am_receiver.errors == []
    assert outbox.active(sink.name) == []


async def test_alertmanager_down_is_retried_from_the_outbox(tmp_path: Path, am_receiver: Receiver) -> None:
    clock = ManualClock(T0)
    base = am_receiver.url.removesuffix("/api/v2/alerts")
    n = Notifier(
        Outbox(tmp_path / "o.sqlite"), [alertmanager_sink(AlertmanagerConfig(url=base), clock)], clock
    )
    await am_receiver.stop()
    n.enqueue([firing(alert("m1"))])
    await n.deliver_once()
    assert n.pending() == {"alertmanager": 1}
    await am_receiver.start()
    am_receiver.answer_next(503)
    for _ in range(20):
        head = n.outbox.head("alertmanager")
        if head is None:
            break
        clock.advance(max(0.0, head.next_attempt - clock.now()))
        await n.deliver_once()
    await n.close()
    assert n.pending() == {"alertmanager": 0} and len(am_receiver.received) == 1
    assert am_receiver.requests == 2  # the 503, then the delivery


def test_config_builds_the_alertmanager_sink() -> None:
    cfg = parse_config(
        {"alerts": {"alertmanager": {"url": "http://am.monitoring:9093/", "resend_seconds": 30}}},
        "test",
        environ={},
    )
    [sink] = sinks_from_config(cfg.alerts, SystemClock())
    assert sink.name == "alertmanager"
    assert cfg.alerts.alertmanager is not None and cfg.alerts.alertmanager.url == "http://am.monitoring:9093"


# ---------------------------------------------------------------------------------------------
# The real Alertmanager
# ---------------------------------------------------------------------------------------------


def _am_config(tmp: Path, vendor: VendorReceiver) -> Path:
    """Route critical → PagerDuty and Slack, everything → Slack (as deploy/alertmanager/ does), with
    1 s grouping so the test does not wait 30 s."""
    key = tmp / "pagerduty-routing-key"
    key.write_text(ROUTING_KEY + "\n")
    cfg = {
        "route": {
            "receiver": "slack",
            "group_by": ["alertname", "model", "model_version", "node"],
            "group_wait": "1s",
            "group_interval": "1s",
            "repeat_interval": "4h",
            "routes": [
                {"receiver": "pagerduty", "matchers": ['severity="critical"'], "continue": True},
                {"receiver": "slack", "matchers": ['severity=~".*"']},
            ],
        },
        "receivers": [
            {
                "name": "slack",
                "slack_configs": [
                    {"api_url": f"{vendor.url}/slack", "channel": "#llm-cost", "send_resolved": True}
                ],
            },
            {
                "name": "pagerduty",
                "pagerduty_configs": [
                    {"routing_key_file": str(key), "url": f"{vendor.url}/pagerduty", "send_resolved": True}
                ],
            },
        ],
    }
    path = tmp / "alertmanager.yml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _api(am: Alertmanager, path: str, body: Any = None) -> Any:
    req = urllib.request.Request(
        f"{am.url}{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="GET" if body is None else "POST",
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def _model_in(body: Any, model: str) -> bool:
    return model in json.dumps(body)  # the model names here are not substrings of each other


@pytest.mark.slow
async def test_real_alertmanager_routes_silences_and_resolves_agent_alerts(tmp_path: Path) -> None:
    vendor = VendorReceiver()
    am = Alertmanager(tmp_path, _am_config(tmp_path, vendor))
    stop = asyncio.Event()
    delivery: asyncio.Task[None] | None = None
    n: Notifier | None = None
    try:
        now = time.time()
        silence = _api(
            am,
            "/api/v2/silences",
            {
                "matchers": [{"name": "model", "value": "m-silenced", "isRegex": False, "isEqual": True}],
                "startsAt": iso(now - 60),
                "endsAt": iso(now + 3600),
                "createdBy": "infercost tests",
                "comment": "maintenance of m-silenced",
            },
        )
        clock = SystemClock()
        cfg = parse_config(
            {"alerts": {"external_url": EXTERNAL, "alertmanager": {"url": am.url, "resend_seconds": 1}}},
            "test",
            environ={},
        )
        n = Notifier(Outbox(tmp_path / "outbox.sqlite"), sinks_from_config(cfg.alerts, clock), clock)
        delivery = asyncio.create_task(n.run(stop))
        page, warn, muted = (
            alert("m-page", "critical", now - 120),
            alert("m-warn", "warning", now - 120),
            alert("m-silenced", "critical", now - 120),
        )
        n.enqueue([firing(page), firing(warn), firing(muted)])

        pd = await asyncio.to_thread(vendor.wait, "/pagerduty", lambda b: _model_in(b, "m-page"))
        slack_page = await asyncio.to_thread(vendor.wait, "/slack", lambda b: _model_in(b, "m-page"))
        slack_warn = await asyncio.to_thread(vendor.wait, "/slack", lambda b: _model_in(b, "m-warn"))
        assert len(pd) == 1 and pd[0]["event_action"] == "trigger" and pd[0]["routing_key"] == ROUTING_KEY
        assert slack_page and slack_warn
        assert slack_page[0]["attachments"][0]["title"].startswith("[FIRING:1] cost_per_token_regression")

        # The silenced alert reached Alertmanager and is held there by our silence.
        alerts = {a["labels"]["model"]: a for a in _api(am, "/api/v2/alerts")}
        assert set(alerts) == {"m-page", "m-warn", "m-silenced"}
        assert alerts["m-silenced"]["status"]["state"] == "suppressed"
        assert alerts["m-silenced"]["status"]["silencedBy"] == [silence["silenceID"]]
        assert alerts["m-page"]["status"]["state"] == "active"
        assert alerts["m-page"]["generatorURL"] == EXTERNAL
        assert alerts["m-page"]["annotations"]["summary"] == "$/1M of m-page is $3.1 (+55.0 % vs $2)"

        # Re-sent every second, so Alertmanager keeps them firing; wait a few group flushes and
        # check the silenced alert never went out.
        first_ends = alerts["m-warn"]["endsAt"]
        await asyncio.sleep(2.5)
        alerts = {a["labels"]["model"]: a for a in _api(am, "/api/v2/alerts")}
        assert alerts["m-warn"]["endsAt"] > first_ends
        assert not any(_model_in(b, "m-silenced") for p in ("/slack", "/pagerduty") for b in vendor.bodies(p))

        # The page resolves: Alertmanager tells PagerDuty and Slack.
        n.enqueue([resolved(page, time.time())])
        pd_resolve = await asyncio.to_thread(
            vendor.wait, "/pagerduty", lambda b: b["event_action"] == "resolve" and _model_in(b, "m-page")
        )
        slack_resolve = await asyncio.to_thread(
            vendor.wait, "/slack", lambda b: b["attachments"][0]["title"].startswith("[RESOLVED]")
        )
        assert pd_resolve and pd_resolve[0]["dedup_key"] == pd[0]["dedup_key"]
        assert slack_resolve and _model_in(slack_resolve[0], "m-page")
        assert n.pending() == {"alertmanager": 0}
        assert not any(_model_in(b, "m-silenced") for p in ("/slack", "/pagerduty") for b in vendor.bodies(p))
    finally:
        stop.set()
        if delivery is not None:
            await delivery
        if n is not None:
            await n.close()
        am.close()
        vendor.close()


def _check(tmp_path: Path, alerts: dict[str, Any]) -> Any:
    import subprocess
    import sys

    cfg = tmp_path / "node.yaml"
    tree = {
        "state_dir": str(tmp_path / "state"),
        "exporters": {"prometheus": {"enabled": False}},
        "alerts": alerts,
    }
    cfg.write_text(yaml.safe_dump(tree))
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", "check", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_check_refuses_relative_runbook_links_without_external_url(tmp_path: Path) -> None:
    """The bundled rules link to rules/agent/README.md#...: fine while alerts stay in the agent,
    refused once they go to a person, accepted again with alerts.external_url to build links from."""
    am = {"alertmanager": {"url": "http://am:9093"}}
    assert _check(tmp_path, {}).returncode == 0
    bad = _check(tmp_path, am)
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert "rule 'cost_per_token_regression'" in bad.stderr and "default.yaml" in bad.stderr
    assert "rules/agent/README.md#cost_per_token_regression" in bad.stderr
    assert "alerts.runbook_base_url" in bad.stderr and "Traceback" not in bad.stderr
    good = _check(tmp_path, {**am, "external_url": "https://github.com/acme/infercost/blob/main/"})
    assert good.returncode == 0, good.stderr
    assert "alerts: ok — alertmanager" in good.stdout and "warning" not in good.stdout


def test_check_warns_when_runbook_links_would_point_into_a_dashboard(tmp_path: Path) -> None:
    am = {"alertmanager": {"url": "http://am:9093"}, "external_url": "https://grafana.example.com/d/fleet"}
    into = _check(tmp_path, am)
    assert into.returncode == 0, into.stderr
    assert "looks like a dashboard" in into.stdout and "alerts.runbook_base_url" in into.stdout
    apart = _check(tmp_path, {**am, "runbook_base_url": "https://git.example/infercost/blob/main/"})
    assert apart.returncode == 0 and "looks like a dashboard" not in apart.stdout


SHIPPED = Path(__file__).resolve().parent.parent / "deploy" / "alertmanager" / "alertmanager.yml"


@pytest.mark.slow
async def test_shipped_alertmanager_config_escapes_hostile_names_for_slack(tmp_path: Path) -> None:
    """Alertmanager's default Slack templates pass `<!channel>` through; the shipped config's
    templates escape every value (checked on what the real Alertmanager posts)."""
    vendor = VendorReceiver()
    cfg: dict[str, Any] = yaml.safe_load(SHIPPED.read_text())
    url_file = tmp_path / "slack-url"
    url_file.write_text(f"{vendor.url}/slack\n")
    cfg["global"]["slack_api_url_file"] = str(url_file)
    cfg["route"].update(group_wait="1s", group_interval="1s")
    for r in cfg["receivers"]:
        for pd in r.get("pagerduty_configs", []):
            (tmp_path / "key").write_text(ROUTING_KEY)
            pd.update(routing_key_file=str(tmp_path / "key"), url=f"{vendor.url}/pagerduty")
    (tmp_path / "am.yml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    am = Alertmanager(tmp_path, tmp_path / "am.yml")
    stop = asyncio.Event()
    n = Notifier(
        Outbox(tmp_path / "outbox.sqlite"),
        [alertmanager_sink(AlertmanagerConfig(url=am.url), SystemClock())],
        SystemClock(),
    )
    delivery = asyncio.create_task(n.run(stop))
    try:
        from dataclasses import replace

        a = alert("<!channel>", "warning", time.time() - 60)
        a = replace(
            a,
            labels={**a.labels, "node": "@here&<b>"},
            annotations={"summary": "<!channel> costs more, see <https://evil.example|runbook> @here"},
        )
        n.enqueue([firing(a)])
        [body] = await asyncio.to_thread(vendor.wait, "/slack", lambda b: True)
        att = body["attachments"][0]
        for field in ("title", "text", "fallback"):
            assert "<!channel>" not in att[field] and "<https://evil" not in att[field], (field, att[field])
            assert "@here" not in att[field], (field, att[field])
        assert att["title"] == (
            "[FIRING:1] &lt;!channel&gt; costs more, see &lt;https://evil.example|runbook&gt; @\u200bhere"
        )
        assert att["fallback"] == "[FIRING:1] cost_per_token_regression"
    finally:
        stop.set()
        await delivery
        await n.close()
        am.close()
        vendor.close()
