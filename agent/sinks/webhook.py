"""A generic webhook in Alertmanager's JSON shape (version 4), one alert per message.

Any receiver built for Alertmanager's ``webhook_configs`` understands it. The URL is read from
the environment or a file at send time (it may carry a token) and never logged. Label and
annotation values are cleaned of control characters and bounded; the body is serialised with
ASCII escapes and no NaN (:func:`agent.sinks.notify.post_json`), so any JSON parser takes it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from agent.config import WebhookConfig
from agent.records import iso
from agent.sinks.escape import absolute_link, bounded_mapping, config_link
from agent.sinks.notify import HttpJsonSink, Policy, Request, url_secrets
from agent.sinks.outbox import OutboxItem

logger = logging.getLogger(__name__)

ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's endsAt for a firing alert
# Why 64 / 1024 / 4096: far above any real alert (a dozen labels, short values) and small enough
# that a hostile 10 kB name cannot make a message a receiver refuses.
MAX_ITEMS = 64
LABEL_VALUE_MAX = 1024
ANNOTATION_VALUE_MAX = 4096
NAME_MAX = 128


def bounded_labels(
    body: Mapping[str, Any], external_url: str | None = None
) -> tuple[dict[str, str], dict[str, str]]:
    """The alert's labels and annotations as bounded, cleaned strings; a relative ``runbook_url``
    is made absolute from ``external_url`` (or left out: a relative link is no link to a person)."""
    labels = bounded_mapping(body.get("labels", {}), MAX_ITEMS, NAME_MAX, LABEL_VALUE_MAX)
    ann = bounded_mapping(body.get("annotations", {}), MAX_ITEMS, NAME_MAX, ANNOTATION_VALUE_MAX, False)
    if "runbook_url" in ann:
        runbook = absolute_link(ann.pop("runbook_url"), external_url)
        if runbook:
            ann["runbook_url"] = runbook
    return labels, ann


def webhook_payload(
    kind: str, body: Mapping[str, Any], external_url: str | None = None, receiver: str = "infercost"
) -> dict[str, Any]:
    """The Alertmanager v4 webhook body for one firing / resolved alert."""
    labels, ann = bounded_labels(body, external_url)
    resolved_at = body.get("resolved_at")
    alert = {
        "status": kind,
        "labels": labels,
        "annotations": ann,
        "startsAt": iso(float(body.get("active_since") or 0.0)),
        "endsAt": iso(float(resolved_at)) if kind == "resolved" and resolved_at else ZERO_TIME,
        "generatorURL": config_link(ann.get("link"), external_url, external_url=external_url) or "",
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
        "externalURL": config_link(external_url) or "",
        "version": "4",
        "groupKey": "{}:{" + ", ".join(f"{k}={json.dumps(v)}" for k, v in group.items()) + "}",
        "truncatedAlerts": 0,
    }


def webhook_sink(cfg: WebhookConfig, external_url: str | None = None, name: str = "webhook") -> HttpJsonSink:
    """The webhook destination: any 2xx is success, no rate limit."""

    def payload(item: OutboxItem) -> Request | str:
        url = cfg.url.read()
        if url is None:
            return f"no webhook URL in {cfg.url.describe()}"
        return Request(url, webhook_payload(item.kind, item.body, external_url), url_secrets(url))

    return HttpJsonSink(name, "webhook", payload, Policy())
