"""PagerDuty Events API v2: trigger and resolve with the alert's stable ``dedup_key``.

PagerDuty answers 202 when it accepted an event, 400 for an invalid one (not retried), 429 when
the routing key exceeds its rate (120 events/min; the notifier keeps under it and retries) and
5xx on its own trouble (retried). The routing key is read at send time and never logged.

Every field is held to PagerDuty's limits (summary ≤ 1024 characters, dedup_key ≤ 255) and
``custom_details`` is bounded, so a 10 kB model name cannot get an event refused (and the page
lost); control characters are dropped. Links come only from configuration.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from agent.config import PagerDutyConfig
from agent.records import iso
from agent.sinks.escape import absolute_link, bounded_mapping, clean, config_link
from agent.sinks.notify import HttpJsonSink, Policy, RateLimit, Request
from agent.sinks.outbox import OutboxItem
from agent.sinks.slack import title_line

logger = logging.getLogger(__name__)

# Our rule severities are PagerDuty's four; anything else maps to warning.
SEVERITY = {"critical": "critical", "error": "error", "warning": "warning", "info": "info"}
SUMMARY_MAX = 1024  # characters, PagerDuty's limit for payload.summary
DEDUP_KEY_MAX = 255  # characters, PagerDuty's limit for dedup_key
# Why 255 / 32 / 1024: PagerDuty documents no limit for these beyond the 512 KB event; these keep
# an event small (≈ 70 KB at most) while no real label or annotation comes near them.
FIELD_MAX = 255  # source, component, group, class
DETAILS_ITEMS = 32  # entries per custom_details mapping
DETAILS_VALUE_MAX = 1024  # characters per custom_details value


def pagerduty_payload(
    kind: str, body: Mapping[str, Any], routing_key: str, external_url: str | None = None
) -> dict[str, Any]:
    """The Events API v2 body for one firing (trigger) / resolved (resolve) alert."""
    ann = body.get("annotations", {})
    labels = body.get("labels", {})
    summary = clean(f"{title_line(kind, body)} {ann.get('summary', '')}".strip(), SUMMARY_MAX)
    payload: dict[str, Any] = {
        "summary": summary,
        "source": clean(labels.get("node") or "infercost", FIELD_MAX),
        "severity": SEVERITY.get(str(body.get("severity")), "warning"),
        "timestamp": iso(float(body.get("active_since") or 0.0)),
        "class": clean(body.get("rule_id"), FIELD_MAX),
        "custom_details": {
            "labels": bounded_mapping(labels, DETAILS_ITEMS, FIELD_MAX, DETAILS_VALUE_MAX),
            "annotations": bounded_mapping(ann, DETAILS_ITEMS, FIELD_MAX, DETAILS_VALUE_MAX, False),
        },
    }
    if labels.get("model"):
        payload["component"] = clean(labels["model"], FIELD_MAX)
    if labels.get("engine"):
        payload["group"] = clean(labels["engine"], FIELD_MAX)
    out: dict[str, Any] = {
        "routing_key": routing_key,
        "dedup_key": clean(body["dedup_key"], DEDUP_KEY_MAX),
        "event_action": "trigger" if kind == "firing" else "resolve",
        "payload": payload,
        "client": "infercost",
    }
    link = config_link(ann.get("link"), external_url, external_url=external_url)
    if link:
        out["client_url"] = link
    runbook = absolute_link(ann.get("runbook_url"), external_url)
    if runbook:
        out["links"] = [{"href": runbook, "text": "Runbook"}]
    return out


def pagerduty_sink(
    cfg: PagerDutyConfig, external_url: str | None = None, name: str = "pagerduty"
) -> HttpJsonSink:
    """The PagerDuty destination: 200/201/202 are success; ``max_events_per_minute`` per key."""

    def payload(item: OutboxItem) -> Request | str:
        key = cfg.routing_key.read()
        if key is None:
            return f"no routing key in {cfg.routing_key.describe()}"
        return Request(cfg.url, pagerduty_payload(item.kind, item.body, key, external_url), (key,))

    policy = Policy(
        limit=RateLimit(per_minute=cfg.max_events_per_minute), ok_statuses=frozenset({200, 201, 202})
    )
    return HttpJsonSink(name, "pagerduty", payload, policy)
