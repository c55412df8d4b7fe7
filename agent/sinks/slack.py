"""Slack incoming webhook: a readable message per alert, in the attachment shape Alertmanager uses.

The webhook URL is the secret (it embeds the token): it is read from the environment or a file at
send time and never logged. Slack allows about one message per second per webhook and answers
429 with Retry-After when exceeded; both are honoured by the notifier.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import aiohttp

from agent.config import SlackConfig
from agent.records import iso
from agent.sinks.notify import RateLimit, SendResult, post_json, url_secrets
from agent.sinks.outbox import OutboxItem

logger = logging.getLogger(__name__)

COLORS = {"critical": "danger", "error": "danger", "warning": "warning", "info": "#439FE0"}
SERIES_LABELS = ("node", "engine", "model", "model_version", "gpu")


def title_line(kind: str, body: Mapping[str, Any]) -> str:
    """``[FIRING] rule (label values)`` as Alertmanager's default title."""
    labels = body.get("labels", {})
    values = " ".join(str(labels[k]) for k in SERIES_LABELS if labels.get(k))
    return f"[{kind.upper()}] {body.get('rule_id')} ({values})"


def slack_payload(
    kind: str, body: Mapping[str, Any], channel: str | None = None, external_url: str | None = None
) -> dict[str, Any]:
    """The JSON body for one firing / resolved alert."""
    ann = body.get("annotations", {})
    link = ann.get("link") or external_url or ann.get("runbook_url") or ""
    fields = [{"title": "Value", "value": ann.get("value", ""), "short": True}]
    if "baseline" in ann:
        fields.append({"title": "Baseline", "value": ann["baseline"], "short": True})
    if "change_pct" in ann:
        fields.append({"title": "Change", "value": ann["change_pct"] + " %", "short": True})
    fields.append({"title": "Since", "value": ann.get("since", ""), "short": True})
    if "deploy" in ann:
        fields.append({"title": "Deploy", "value": ann["deploy"], "short": False})
    if ann.get("runbook_url"):
        fields.append({"title": "Runbook", "value": ann["runbook_url"], "short": False})
    text = ann.get("description", "")
    if kind == "resolved" and body.get("resolved_at"):
        text = f"Resolved at {iso(body['resolved_at'])}. {text}"
    title = title_line(kind, body)
    attachment: dict[str, Any] = {
        "title": ann.get("summary") or title,
        "title_link": link,
        "text": text,
        "fallback": f"{title} | {link}" if link else title,
        "color": "good" if kind == "resolved" else COLORS.get(str(body.get("severity")), "warning"),
        "fields": fields,
        "footer": f"infercost · {body.get('labels', {}).get('node', '')} · {body.get('severity')}",
        "mrkdwn_in": ["fallback", "pretext", "text"],
    }
    out: dict[str, Any] = {"username": "infercost", "text": title, "attachments": [attachment]}
    if channel:
        out["channel"] = channel
    return out


class SlackSink:
    """Posts to a Slack incoming webhook."""

    def __init__(self, cfg: SlackConfig, external_url: str | None = None, name: str = "slack") -> None:
        self.name = name
        self.cfg = cfg
        self.external_url = external_url
        self.limit = RateLimit(min_interval=cfg.min_interval_seconds)

    async def send(self, session: aiohttp.ClientSession, item: OutboxItem) -> SendResult:
        """Deliver one item (200 is success)."""
        url = self.cfg.webhook_url.read()
        if url is None:
            return SendResult(False, error=f"no webhook URL in {self.cfg.webhook_url.describe()}")
        body = slack_payload(item.kind, item.body, self.cfg.channel, self.external_url)
        return await post_json(session, url, body, (200,), url_secrets(url))
