"""Alertmanager API v2: the agent's alerts posted to ``/api/v2/alerts`` like Prometheus posts them.

Recommended for fleets: Alertmanager then groups, inhibits, silences and routes the agent's
alerts with everything else (Slack, PagerDuty, ...), and the agents need no vendor secrets.

Alertmanager's contract (as Prometheus keeps it): a firing alert carries ``startsAt`` and an
``endsAt`` in the near future, and is re-sent before that time while it fires; otherwise
Alertmanager resolves it at ``endsAt``. So a firing alert is posted with ``endsAt = now + 4 ×
resend_seconds`` and re-sent every ``resend_seconds`` (the notifier's resend policy, from the
outbox's durable firing set, so a restart keeps re-sending); a resolve is posted with ``endsAt``
= the time it resolved. If the agent dies, its alerts resolve by themselves at ``endsAt``.

Labels are Alertmanager label names (``[a-zA-Z_][a-zA-Z0-9_]*``; anything else becomes ``_``),
values and annotations cleaned and bounded (:mod:`agent.sinks.webhook`); ``generatorURL`` is
``alerts.external_url`` only, and a relative ``runbook_url`` is made absolute from it. A 400
(Alertmanager refuses the alert) is not retried; 5xx and network errors are.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from agent.clock import Clock
from agent.config import AlertmanagerConfig
from agent.records import iso
from agent.sinks.escape import config_link
from agent.sinks.notify import HttpJsonSink, Policy, Request
from agent.sinks.outbox import OutboxItem
from agent.sinks.webhook import bounded_labels

logger = logging.getLogger(__name__)

API_PATH = "/api/v2/alerts"
# Why 4: Prometheus sets endsAt 4 re-send intervals ahead, so three lost posts in a row still do
# not resolve an alert that is firing.
ENDS_AFTER_RESENDS = 4
_BAD_NAME_CHAR = re.compile(r"[^a-zA-Z0-9_]")


def label_name(name: str) -> str:
    """A valid Alertmanager label name for ``name`` (invalid characters → ``_``)."""
    out = _BAD_NAME_CHAR.sub("_", name) or "_"
    return "_" + out if out[0].isdigit() else out


def alertmanager_alert(
    kind: str, body: Mapping[str, Any], now: float, ttl: float, external_url: str | None = None
) -> dict[str, Any]:
    """One postable alert: firing ends ``ttl`` seconds after ``now`` (epoch seconds) unless re-sent;
    resolved ends when it resolved."""
    labels, ann = bounded_labels(body, external_url)
    ends = float(body.get("resolved_at") or now) if kind == "resolved" else now + ttl
    alert: dict[str, Any] = {
        "labels": {label_name(k): v for k, v in labels.items() if v != ""},
        "annotations": {label_name(k): v for k, v in ann.items()},
        "startsAt": iso(float(body.get("active_since") or now)),
        "endsAt": iso(ends),
    }
    link = config_link(ann.get("link"), external_url, external_url=external_url)
    if link:
        alert["generatorURL"] = link
    return alert


def alertmanager_sink(
    cfg: AlertmanagerConfig, clock: Clock, external_url: str | None = None, name: str = "alertmanager"
) -> HttpJsonSink:
    """The Alertmanager destination: 200 is success; each firing alert re-sent every
    ``resend_seconds`` while it fires."""
    ttl = ENDS_AFTER_RESENDS * cfg.resend_seconds
    url = cfg.url + API_PATH

    def payload(item: OutboxItem) -> Request:
        return Request(url, [alertmanager_alert(item.kind, item.body, clock.now(), ttl, external_url)])

    policy = Policy(ok_statuses=frozenset({200}), resend_seconds=cfg.resend_seconds)
    return HttpJsonSink(name, "alertmanager", payload, policy)
