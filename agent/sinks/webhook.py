"""A generic webhook in Alertmanager's JSON shape (version 4), one alert per message.

Any receiver built for Alertmanager's ``webhook_configs`` understands it. The URL is read from
the environment or a file at send time (it may carry a token) and never logged.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import aiohttp

from agent.config import WebhookConfig
from agent.records import iso
from agent.sinks.notify import RateLimit, SendResult, post_json, url_secrets
from agent.sinks.outbox import OutboxItem

logger = logging.getLogger(__name__)

ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's endsAt for a firing alert


def webhook_payload(
    kind: str, body: Mapping[str, Any], external_url: str | None = None, receiver: str = "infercost"
) -> dict[str, Any]:
    """The Alertmanager v4 webhook body for one firing / resolved alert."""
    labels = {k: str(v) for k, v in body.get("labels", {}).items()}
    ann = {k: str(v) for k, v in body.get("annotations", {}).items()}
    resolved_at = body.get("resolved_at")
    alert = {
        "status": kind,
        "labels": labels,
        "annotations": ann,
        "startsAt": iso(float(body.get("active_since") or 0.0)),
        "endsAt": iso(float(resolved_at)) if kind == "resolved" and resolved_at else ZERO_TIME,
        "generatorURL": ann.get("link") or external_url or "",
        "fingerprint": str(body["dedup_key"])[:16],
    }
    group = {"alertname": labels.get("alertname", str(body.get("rule_id")))}
    return {
        "receiver": receiver,
        "status": kind,
        "alerts": [alert],
        "groupLabels": group,
        "commonLabels": labels,
        "commonAnnotations": ann,
        "externalURL": external_url or "",
        "version": "4",
        "groupKey": "{}:{" + ", ".join(f'{k}="{v}"' for k, v in group.items()) + "}",
        "truncatedAlerts": 0,
    }


class WebhookSink:
    """Posts Alertmanager-shaped JSON to a URL."""

    def __init__(self, cfg: WebhookConfig, external_url: str | None = None, name: str = "webhook") -> None:
        self.name = name
        self.cfg = cfg
        self.external_url = external_url
        self.limit = RateLimit()

    async def send(self, session: aiohttp.ClientSession, item: OutboxItem) -> SendResult:
        """Deliver one item (any 2xx is success)."""
        url = self.cfg.url.read()
        if url is None:
            return SendResult(False, error=f"no webhook URL in {self.cfg.url.describe()}")
        body = webhook_payload(item.kind, item.body, self.external_url)
        return await post_json(session, url, body, tuple(range(200, 300)), url_secrets(url))
