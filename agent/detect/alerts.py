"""Alert lifecycle: findings → pending → firing → resolved, with stable dedup keys (pure).

``AlertManager(rules).step(findings, now) -> list[AlertEvent]`` is called once per evaluated
minute with every finding of that minute (a rule/series without a finding is "false"):

- false → true: the alert is *pending* from that minute (event ``pending``);
- true for ``for`` seconds (``now - active_since >= for``): *firing* (event ``firing``);
- pending and false again: dropped silently;
- firing and false for longer than ``keep_firing_for`` seconds after the last true minute:
  *resolved* (event ``resolved``), then dropped.

The dedup key is a hash of the rule id and the series labels only, so it is stable across
restarts, severity edits and annotation changes; PagerDuty's ``dedup_key`` and Alertmanager's
``fingerprint`` come from it, which makes duplicate deliveries harmless. The state can be
snapshotted and restored (the pipeline keeps it in the store), so a restart neither re-pages nor
forgets to resolve.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from agent.detect.evaluator import Finding
from agent.detect.rules import Rule, RuleSet
from agent.records import SIGNALS, Alert, AlertEvent, DeployInfo, dedup_key, iso
from agent.sinks.escape import absolute_link

logger = logging.getLogger(__name__)

# A hook the pipeline provides: (rule, finding) → the deploy the alert follows, if any.
DeployLookup = Callable[[Rule, Finding], DeployInfo | None]
# Another: (rule, finding) → a one-line description of a price change the alert follows, if any.
PriceLookup = Callable[[Rule, Finding], "str | None"]
# Another: (rule, finding, deploy) → why a cost alert's cost per token moved, the change split by
# factor in one line ("+$0.88/1M: step efficiency +$0.79, batch +$0.11, idle −$0.02"), if known
# (agent.detect.explain.AlertExplainer).
ExplainLookup = Callable[[Rule, Finding, "DeployInfo | None"], "str | None"]


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4g}"


@dataclass(slots=True)
class _Annotator:
    external_url: str | None = None
    runbook_base: str | None = None  # relative runbook links are made absolute from it, when set

    def annotate(
        self,
        rule: Rule,
        f: Finding,
        since: float,
        deploy: DeployInfo | None,
        price: str | None = None,
        why: str | None = None,
    ) -> dict[str, str]:
        labels = dict(f.labels)
        change = None
        if f.baseline is not None and f.baseline != 0:
            change = (f.value / f.baseline - 1.0) * 100.0
        ctx: dict[str, str] = {k: "" for k in ("node", "engine", "model", "model_version", "gpu")}
        ctx.update(labels)
        ctx.update(
            value=_fmt(f.value),
            baseline=_fmt(f.baseline),
            threshold=_fmt(f.threshold),
            change_pct="n/a" if change is None else f"{change:+.1f} %",
            since=iso(since),
            deploy=deploy.describe() if deploy else "none",
            price_change=price or "none",
            why=why or "n/a",
            rule_id=rule.id,
            severity=rule.severity,
            unit=SIGNALS[rule.signal].unit,
        )
        ann = {
            "summary": rule.summary.format_map(ctx),
            "description": rule.description.format_map(ctx),
            "value": _fmt(f.value),
            "threshold": _fmt(f.threshold),
            "since": iso(since),
        }
        if f.baseline is not None:
            ann["baseline"] = _fmt(f.baseline)
            ann["baseline_minutes"] = str(f.baseline_minutes)
        if change is not None:
            ann["change_pct"] = f"{change:+.1f}"
        if deploy is not None:
            ann["deploy"] = deploy.describe()
        if price is not None:
            ann["price_change"] = price
        if why is not None:
            ann["why"] = why
        if rule.runbook_url:
            ann["runbook_url"] = absolute_link(rule.runbook_url, self.runbook_base) or rule.runbook_url
        if self.external_url:
            ann["link"] = self.external_url
        return ann


class AlertManager:
    """The pending → firing → resolved state machine over findings (see the module docstring)."""

    def __init__(
        self,
        rules: RuleSet | Iterable[Rule],
        external_url: str | None = None,
        deploy_lookup: DeployLookup | None = None,
        price_lookup: PriceLookup | None = None,
        runbook_base: str | None = None,
        explain_lookup: ExplainLookup | None = None,
    ) -> None:
        self._rules = {r.id: r for r in rules}
        self._annotator = _Annotator(external_url, runbook_base)
        self._deploy_lookup = deploy_lookup
        self._price_lookup = price_lookup
        self.explain_lookup = explain_lookup
        self._alerts: dict[str, Alert] = {}

    def step(self, findings: Iterable[Finding], now: float) -> list[AlertEvent]:
        """Advance every alert to ``now`` (epoch seconds) given this minute's findings."""
        events: list[AlertEvent] = []
        seen: set[str] = set()
        for f in findings:
            rule = self._rules.get(f.rule_id)
            if rule is None:
                continue
            key = dedup_key(rule.id, f.labels)
            seen.add(key)
            cur = self._alerts.get(key)
            if cur is None:
                deploy = self._deploy_lookup(rule, f) if self._deploy_lookup else None
                price = self._price_lookup(rule, f) if self._price_lookup else None
                # the factor split reads the comparison's history: asked for when the alert fires (a
                # pending alert that clears is never sent), or at once when it fires at once
                why = self._why(rule, f, deploy) if rule.for_ <= 0 else None
                cur = Alert(
                    rule_id=rule.id,
                    dedup_key=key,
                    severity=rule.severity,
                    state="pending",
                    labels={**dict(f.labels), **rule.labels, **rule.alert_labels()},
                    annotations=self._annotator.annotate(rule, f, f.at, deploy, price, why),
                    active_since=f.at,
                    last_true_at=now,
                    value=f.value,
                    threshold=f.threshold,
                    baseline=f.baseline,
                    deploy=deploy,
                )
                events.append(AlertEvent("pending", cur, now))
            else:
                cur = replace(
                    cur,
                    last_true_at=now,
                    value=f.value,
                    threshold=f.threshold,
                    baseline=f.baseline,
                    annotations=self._annotator.annotate(
                        rule,
                        f,
                        cur.active_since,
                        cur.deploy,
                        cur.annotations.get("price_change"),
                        cur.annotations.get("why"),
                    )
                    if cur.state == "pending"
                    else cur.annotations,
                )
            if cur.state == "pending" and now - cur.active_since >= rule.for_:
                why = cur.annotations.get("why") if rule.for_ <= 0 else self._why(rule, f, cur.deploy)
                annotations = self._annotator.annotate(
                    rule, f, cur.active_since, cur.deploy, cur.annotations.get("price_change"), why
                )
                cur = replace(cur, state="firing", fired_at=now, annotations=annotations)
                events.append(AlertEvent("firing", cur, now))
            self._alerts[key] = cur
        for key in list(self._alerts):
            if key in seen:
                continue
            cur = self._alerts[key]
            rule = self._rules.get(cur.rule_id)
            keep = rule.keep_firing_for if rule is not None else 0.0
            if cur.state == "pending":
                del self._alerts[key]
            elif cur.state == "firing" and now - cur.last_true_at > keep:
                done = replace(cur, state="resolved", resolved_at=now)
                events.append(AlertEvent("resolved", done, now))
                del self._alerts[key]
        return events

    def _why(self, rule: Rule, f: Finding, deploy: DeployInfo | None) -> str | None:
        """The explain hook's line; a failing hook costs the alert its line, never the alert."""
        if self.explain_lookup is None:
            return None
        try:
            return self.explain_lookup(rule, f, deploy)
        except Exception:  # the split is a courtesy: the alert goes out without it
            logger.exception("explaining alert %s failed; sent without the factor split", rule.id)
            return None

    def active(self) -> list[Alert]:
        """Pending and firing alerts."""
        return list(self._alerts.values())

    def firing(self) -> list[Alert]:
        """Firing alerts (including those held by keep_firing_for)."""
        return [a for a in self._alerts.values() if a.state == "firing"]

    def snapshot(self) -> list[dict[str, Any]]:
        """The state as JSON-able dicts (for the store)."""
        return [asdict(a) for a in self._alerts.values()]

    def restore(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Replace the state with a snapshot taken earlier."""
        self._alerts.clear()
        for row in rows:
            a = alert_from_dict(row)
            self._alerts[a.dedup_key] = a


def alert_from_dict(d: Mapping[str, Any]) -> Alert:
    """An Alert from :func:`dataclasses.asdict` output (outbox payloads)."""
    x = dict(d)
    dep = x.get("deploy")
    x["deploy"] = DeployInfo(**dep) if isinstance(dep, Mapping) else None
    return Alert(**x)


__all__ = [
    "Alert",
    "AlertEvent",
    "AlertManager",
    "DeployInfo",
    "DeployLookup",
    "ExplainLookup",
    "PriceLookup",
    "alert_from_dict",
    "dedup_key",
    "iso",
]
