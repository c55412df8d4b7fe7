"""The alert destinations, by their key under ``alerts:`` in the config, and their checks.

Each destination is a builder ``(its config section, alerts config, clock) → sink`` (a payload
function plus its policy, see :class:`agent.sinks.notify.HttpJsonSink`). :func:`sinks_from_config`
builds every configured one; the composition root hands them to the delivery
(:class:`agent.sinks.delivery.Delivery`).
A new destination is one module with a payload function and one line here.

:func:`check_links` is what ``infercost check`` runs: a relative ``runbook_url`` cannot be a link
in Slack or PagerDuty, so it is refused when a destination is configured and
``alerts.external_url`` (which absolute links are built from) is not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from agent.clock import Clock
from agent.config import AlertsConfig
from agent.sinks.alertmanager import alertmanager_sink
from agent.sinks.escape import absolute_link
from agent.sinks.notify import Sink
from agent.sinks.pagerduty import pagerduty_sink
from agent.sinks.slack import slack_sink
from agent.sinks.webhook import webhook_sink

Builder = Callable[[Any, AlertsConfig, Clock], Sink]

DESTINATIONS: Mapping[str, Builder] = {
    "slack": lambda c, a, clock: slack_sink(c, a.external_url),
    "pagerduty": lambda c, a, clock: pagerduty_sink(c, a.external_url),
    "webhook": lambda c, a, clock: webhook_sink(c, a.external_url),
    "alertmanager": lambda c, a, clock: alertmanager_sink(c, clock, a.external_url),
}


def sinks_from_config(alerts: AlertsConfig, clock: Clock) -> list[Sink]:
    """The configured destinations (none: alerts still reach /metrics and the log)."""
    return [
        build(section, alerts, clock)
        for key, build in DESTINATIONS.items()
        if (section := getattr(alerts, key, None)) is not None
    ]


def configured(alerts: AlertsConfig) -> list[str]:
    """The keys of the configured destinations."""
    return [key for key in DESTINATIONS if getattr(alerts, key, None) is not None]


def check_links(
    alerts: AlertsConfig, runbooks: Iterable[tuple[str, str | None]], sources: Mapping[str, str]
) -> list[str]:
    """Problems with the links alerts would carry: one line per rule whose ``runbook_url`` cannot
    be made absolute. ``runbooks`` is (rule id, runbook_url); ``sources`` rule id → file."""
    if not configured(alerts):
        return []  # links never leave the agent
    problems = []
    for rule_id, url in runbooks:
        if url and absolute_link(url, alerts.runbook_base) is None:
            where = sources.get(rule_id, "rules")
            problems.append(
                f"{where}: rule '{rule_id}': runbook_url {url!r} is relative and cannot be a link in "
                f"{', '.join(configured(alerts))}; fix: set alerts.runbook_base_url (relative runbook "
                "links are built from it) or give an absolute https:// runbook_url"
            )
    return problems


def runbooks_into_a_dashboard(alerts: AlertsConfig) -> str | None:
    """A warning when relative runbook links would resolve under a Grafana dashboard URL (``/d/``:
    ``…/d/infercost-fleet/rules/agent/README.md`` is no page), else None."""
    if alerts.runbook_base_url or not alerts.external_url or "/d/" not in alerts.external_url:
        return None
    return (
        f"alerts.external_url {alerts.external_url!r} looks like a dashboard, and relative runbook links "
        "are built from it while alerts.runbook_base_url is unset; fix: set alerts.runbook_base_url to "
        "where the runbooks are (e.g. the repository's URL)"
    )


__all__ = ["DESTINATIONS", "check_links", "configured", "runbooks_into_a_dashboard", "sinks_from_config"]
