"""Slack incoming webhook: a readable message per alert, in the attachment shape Alertmanager uses,
and free-form messages (the weekly report) through the same outbox.

Every text from data (model, engine and version names, summaries built from them) is escaped for
Slack (:func:`agent.sinks.escape.escape_slack`): ``<!channel>`` and ``<url|text>`` arrive as
inert text, ``@here`` cannot mention. Alert attachments are sent with mrkdwn off, so Markdown in a
name shows as typed. Links come only from our own configuration (``alerts.external_url``, a
rule's ``runbook_url``), never from data.

The webhook URL is the secret (it embeds the token): it is read from the environment or a file at
send time and never logged. Slack allows about one message per second per webhook and answers
429 with Retry-After when exceeded; both are honoured by the notifier.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from agent.config import SlackConfig
from agent.records import iso
from agent.sinks.escape import absolute_link, clean, config_link, escape_slack
from agent.sinks.notify import (
    ALERT_KINDS,
    MESSAGE_KIND,
    HttpJsonSink,
    Notifier,
    Policy,
    RateLimit,
    Request,
    url_secrets,
)
from agent.sinks.outbox import OutboxItem

logger = logging.getLogger(__name__)

COLORS = {"critical": "danger", "error": "danger", "warning": "warning", "info": "#439FE0"}
SERIES_LABELS = ("node", "engine", "model", "model_version", "gpu")
# Lengths (characters, after escaping). Why: Slack cuts a message at 40,000 characters and a
# section at 3,000; an alert should fit a phone screen, so names are cut well before that.
LABEL_CHARS = 128  # one label value in the title line (the edge already cuts labels to 128)
TITLE_CHARS = 512
TEXT_CHARS = 3000
FIELD_CHARS = 1000
MESSAGE_CHARS = 39000  # a free-form message (the weekly report summary)


def title_line(kind: str, body: Mapping[str, Any]) -> str:
    """``[FIRING] rule (label values)`` as Alertmanager's default title (raw text, not escaped)."""
    labels = body.get("labels", {})
    values = " ".join(clean(labels[k], LABEL_CHARS) for k in SERIES_LABELS if labels.get(k))
    return f"[{kind.upper()}] {clean(body.get('rule_id'), LABEL_CHARS)} ({values})"


def _field(title: str, value: Any, short: bool) -> dict[str, Any]:
    return {"title": title, "value": escape_slack(value, FIELD_CHARS, one_line=True), "short": short}


def slack_payload(
    kind: str, body: Mapping[str, Any], channel: str | None = None, external_url: str | None = None
) -> dict[str, Any]:
    """The JSON body for one firing / resolved alert, or one ``message``."""
    if kind == MESSAGE_KIND:
        return slack_message_payload(body, channel, external_url)
    ann = body.get("annotations", {})
    link = config_link(ann.get("link"), external_url, external_url=external_url)
    runbook = absolute_link(ann.get("runbook_url"), external_url)
    fields = [_field("Value", ann.get("value", ""), True)]
    if "baseline" in ann:
        fields.append(_field("Baseline", ann["baseline"], True))
    if "change_pct" in ann:
        fields.append(_field("Change", f"{ann['change_pct']} %", True))
    fields.append(_field("Since", ann.get("since", ""), True))
    if "deploy" in ann:
        fields.append(_field("Deploy", ann["deploy"], False))
    if "why" in ann:  # the change in $/1M split by factor
        fields.append(_field("Why", ann["why"], False))
    if runbook:
        fields.append({"title": "Runbook", "value": runbook, "short": False})
    text = str(ann.get("description", ""))
    if kind == "resolved" and body.get("resolved_at"):
        text = f"Resolved at {iso(body['resolved_at'])}. {text}"
    title = escape_slack(title_line(kind, body), TITLE_CHARS, one_line=True)
    labels = body.get("labels", {})
    attachment: dict[str, Any] = {
        "title": escape_slack(ann.get("summary") or title_line(kind, body), TITLE_CHARS, one_line=True),
        "text": escape_slack(text, TEXT_CHARS),
        "fallback": f"{title} | {link}" if link else title,
        "color": "good" if kind == "resolved" else COLORS.get(str(body.get("severity")), "warning"),
        "fields": fields,
        "footer": escape_slack(
            f"infercost · {clean(labels.get('node', ''), LABEL_CHARS)} · {body.get('severity')}",
            TITLE_CHARS,
            one_line=True,
        ),
        "mrkdwn_in": [],  # names are shown as typed: no Markdown from data
    }
    if link:
        attachment["title_link"] = link
    out: dict[str, Any] = {
        "username": "infercost",
        "text": title,
        "mrkdwn": False,
        "attachments": [attachment],
    }
    if channel:
        out["channel"] = channel
    return out


def slack_message_payload(
    body: Mapping[str, Any], channel: str | None = None, external_url: str | None = None
) -> dict[str, Any]:
    """A free-form message: its text (Slack mrkdwn allowed, but escaped: no mentions, no links
    from the text) and an optional link from our configuration as the attachment title."""
    text = escape_slack(body.get("text", ""), MESSAGE_CHARS, keep_entities=bool(body.get("escaped")))
    out: dict[str, Any] = {"username": "infercost", "text": text, "mrkdwn": True}
    link = absolute_link(body.get("link"), external_url)
    if body.get("title") or link:
        title = escape_slack(body.get("title") or link, TITLE_CHARS, one_line=True)
        attachment: dict[str, Any] = {"title": title, "fallback": title, "mrkdwn_in": []}
        if link:
            attachment["title_link"] = link
        out["attachments"] = [attachment]
    if channel:
        out["channel"] = channel
    return out


def slack_sink(cfg: SlackConfig, external_url: str | None = None, name: str = "slack") -> HttpJsonSink:
    """The Slack destination: 200 is success; at most one message per ``min_interval_seconds``."""

    def payload(item: OutboxItem) -> Request | str:
        url = cfg.webhook_url.read()
        if url is None:
            return f"no webhook URL in {cfg.webhook_url.describe()}"
        body = slack_payload(item.kind, item.body, cfg.channel, external_url)
        return Request(url, body, url_secrets(url))

    policy = Policy(
        limit=RateLimit(min_interval=cfg.min_interval_seconds),
        ok_statuses=frozenset({200}),
        kinds=frozenset({*ALERT_KINDS, MESSAGE_KIND}),
    )
    return HttpJsonSink(name, "slack", payload, policy)


def enqueue_slack_message(
    notifier: Notifier,
    text: str,
    *,
    key: str,
    title: str | None = None,
    link: str | None = None,
    escaped: bool = False,
) -> int:
    """Queue a message for every configured Slack sink (durable, retried, rate-limited like
    alerts); returns the rows added (0 when no Slack sink is configured).

    ``text`` is Slack mrkdwn (``*bold*``, ``_italic_``). By default it is escaped here (``&``,
    ``<``, ``>``, mentions). With ``escaped=True`` its author escaped every name already (e.g.
    :func:`agent.report.escape.slack`): entities are kept as written, while raw ``<``/``>`` and
    mentions are still disarmed. Either way it cannot mention anyone or carry ``<url|text>``
    links. ``link`` (absolute, or relative to ``alerts.external_url``) must come from
    configuration, not data. ``key`` names the message (e.g. ``weekly-report-2026-W48``)."""
    body = {"text": text, "title": title, "link": link, "escaped": escaped}
    return sum(
        notifier.enqueue_message(s.name, key, body)
        for s in notifier.sinks
        if getattr(s, "destination", None) == "slack"
    )
