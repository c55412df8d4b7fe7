"""PagerDuty Events API v2: trigger and resolve with the alert's stable ``dedup_key``.

PagerDuty answers 202 when it accepted an event, 400 for an invalid one (not retried), 429 when
the routing key exceeds its rate (120 events/min; the notifier keeps under it and retries) and
5xx on its own trouble (retried). The routing key is read at send time and never logged.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import aiohttp

from agent.config import PagerDutyConfig
from agent.records import iso
from agent.sinks.notify import RateLimit, SendResult, post_json
from agent.sinks.outbox import OutboxItem
from agent.sinks.slack import title_line

logger = logging.getLogger(__name__)

# Our rule severities are PagerDuty's four; anything else maps to warning.
SEVERITY = {"critical": "critical", "error": "error", "warning": "warning", "info": "info"}
SUMMARY_MAX = 1024  # characters, PagerDuty's limit for payload.summary


def pagerduty_payload(
    kind: str, body: Mapping[str, Any], routing_key: str, external_url: str | None = None
) -> dict[str, Any]:
    """The Events API v2 body for one firing (trigger) / resolved (resolve) alert."""
    ann = body.get("annotations", {})
    labels = body.get("labels", {})
    summary = f"{title_line(kind, body)} {ann.get('summary', '')}".strip()[:SUMMARY_MAX]
    payload: dict[str, Any] = {
        "summary": summary,
        "source": labels.get("node") or "infercost",
        "severity": SEVERITY.get(str(body.get("severity")), "warning"),
        "timestamp": iso(float(body.get("active_since") or 0.0)),
        "class": body.get("rule_id"),
        "custom_details": {"labels": dict(labels), "annotations": dict(ann)},
    }
    if labels.get("model"):
        payload["component"] = labels["model"]
    if labels.get("engine"):
        payload["group"] = labels["engine"]
    out: dict[str, Any] = {
        "routing_key": routing_key,
        "dedup_key": body["dedup_key"],
        "event_action": "trigger" if kind == "firing" else "resolve",
        "payload": payload,
        "client": "infercost",
    }
    link = ann.get("link") or external_url
    if link:
        out["client_url"] = link
    if ann.get("runbook_url"):
        out["links"] = [{"href": ann["runbook_url"], "text": "Runbook"}]
    return out


class PagerDutySink:
    """Sends events to PagerDuty's Events API v2."""

    def __init__(
        self, cfg: PagerDutyConfig, external_url: str | None = None, name: str = "pagerduty"
    ) -> None:
        self.name = name
        self.cfg = cfg
        self.external_url = external_url
        self.limit = RateLimit(per_minute=cfg.max_events_per_minute)

    async def send(self, session: aiohttp.ClientSession, item: OutboxItem) -> SendResult:
        """Deliver one item (202 is success)."""
        key = self.cfg.routing_key.read()
        if key is None:
            return SendResult(False, error=f"no routing key in {self.cfg.routing_key.describe()}")
        body = pagerduty_payload(item.kind, item.body, key, self.external_url)
        return await post_json(session, self.cfg.url, body, (200, 201, 202), [key])
