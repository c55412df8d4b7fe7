"""Alert lifecycle: pending → firing → resolved, dedup keys, annotations, snapshot/restore."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.detect.alerts import AlertManager
from agent.detect.evaluator import Finding
from agent.detect.rules import Rule, RuleSet, load_rules
from agent.records import DeployInfo, dedup_key

T0 = 1699833600.0
LABELS = (("node", "n1"), ("engine", "e"), ("model", "llama"), ("model_version", "v2"))


def rules(tmp_path: Path, **kw: Any) -> RuleSet:
    r: dict[str, Any] = {
        "id": "cost",
        "signal": "usd_per_1m_output_tokens",
        "op": ">",
        "baseline": {"window": "7d"},
        "factor": 1.5,
        "for": "3m",
        "keep_firing_for": "2m",
        "severity": "critical",
        "summary": "{model} {model_version}: ${value} ({change_pct}) since {since}",
        "description": "deploy: {deploy}",
        "runbook_url": "https://runbooks/cost",
    }
    r.update(kw)
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump({"rules": [r]}))
    return load_rules([p])


def finding(minute: int, value: float = 3.0, labels: Any = LABELS) -> Finding:
    return Finding("cost", labels, T0 + minute * 60, value, 3.0, 2.0, 500, 100.0)


def run(am: AlertManager, truth: str) -> list[tuple[int, str]]:
    """Step minute i with a finding where truth[i] == '1'; return (minute, event kind)."""
    out = []
    for i, c in enumerate(truth):
        fs = [finding(i, 3.0 + i)] if c == "1" else []
        out.extend((i, e.kind) for e in am.step(fs, T0 + i * 60))
    return out


def test_for_and_keep_firing_for(tmp_path: Path) -> None:
    am = AlertManager(rules(tmp_path))
    # true at 0..5, a one-minute gap at 6 (held by keep_firing_for), true 7, false from 8: resolved at 10.
    assert run(am, "111111010000") == [(0, "pending"), (3, "firing"), (10, "resolved")]
    assert am.active() == []


def test_pending_that_clears_never_fires(tmp_path: Path) -> None:
    am = AlertManager(rules(tmp_path))
    assert run(am, "1101100") == [(0, "pending"), (3, "pending")]


def test_for_zero_fires_at_once(tmp_path: Path) -> None:
    am = AlertManager(rules(tmp_path, **{"for": "0s", "keep_firing_for": "0s"}))
    assert run(am, "101") == [(0, "pending"), (0, "firing"), (1, "resolved"), (2, "pending"), (2, "firing")]


def test_dedup_key_is_stable_and_label_order_free() -> None:
    k = dedup_key("cost", LABELS)
    assert k == dedup_key("cost", tuple(reversed(LABELS)))
    assert len(k) == 64 and k != dedup_key("cost", (*LABELS[:3], ("model_version", "v3")))
    assert k != dedup_key("other", LABELS)
    # pinned: changing the formula would orphan open PagerDuty incidents after an upgrade
    assert k == "ad3009f0b1b985ae45ee666695c78d2a2e38b1edf8f22e08d6616e08080ec492"


def test_annotations_carry_the_context(tmp_path: Path) -> None:
    dep = DeployInfo("n1", "e", "llama", "v1", "v2", T0 - 600, previous_value=2.0, new_value=3.1)
    seen: list[tuple[Rule, Finding]] = []

    def lookup(rule: Rule, f: Finding) -> DeployInfo | None:
        seen.append((rule, f))
        return dep

    am = AlertManager(rules(tmp_path), external_url="http://grafana/d/x", deploy_lookup=lookup)
    events = [e for i in range(4) for e in am.step([finding(i)], T0 + i * 60)]
    firing = next(e for e in events if e.kind == "firing").alert
    assert len(seen) == 1  # looked up once, when the alert began
    assert firing.labels == {
        "node": "n1",
        "engine": "e",
        "model": "llama",
        "model_version": "v2",
        "alertname": "cost",
        "severity": "critical",
    }
    ann = firing.annotations
    assert ann["summary"] == "llama v2: $3 (+50.0 %) since 2023-11-13T00:00:00.000Z"
    assert ann["value"] == "3" and ann["baseline"] == "2" and ann["change_pct"] == "+50.0"
    assert ann["since"] == "2023-11-13T00:00:00.000Z" and ann["link"] == "http://grafana/d/x"
    assert ann["runbook_url"] == "https://runbooks/cost"
    assert (
        ann["deploy"]
        == "llama v1 → v2 at 2023-11-12T23:50:00.000Z (at like load: 2 before, 3.1 after, +55.0 %)"
    )
    assert ann["description"] == "deploy: " + ann["deploy"]
    assert firing.dedup_key == dedup_key("cost", LABELS) and firing.fired_at == T0 + 180


def test_snapshot_restore_resolves_after_restart(tmp_path: Path) -> None:
    rs = rules(tmp_path)
    am = AlertManager(rs)
    run(am, "1111")
    snap = am.snapshot()
    again = AlertManager(rs)
    again.restore(snap)
    assert [a.state for a in again.firing()] == ["firing"]
    # no new "firing" after the restart, and a resolve with the same key once it clears
    ev = [e for i in range(4, 8) for e in again.step([], T0 + i * 60)]
    assert [(e.kind, e.alert.dedup_key) for e in ev] == [("resolved", dedup_key("cost", LABELS))]


def test_deploy_tracker_attributes_recent_deploys(tmp_path: Path) -> None:
    from agent.detect.deploys import DeployTracker
    from agent.records import MinuteRecord

    rs = rules(tmp_path)
    v1 = (*LABELS[:3], ("model_version", "v1"))
    tracker = DeployTracker(window=3600, compare=lambda e, r, f: (2.0, f.value))
    assert tracker.observe([MinuteRecord("model", v1, T0 - 600)]) == []
    (dep,) = tracker.observe([MinuteRecord("model", LABELS, T0 - 540)])
    assert (dep.from_version, dep.to_version, dep.at) == ("v1", "v2", T0 - 540)
    rule = rs.rules[0]
    info = tracker.lookup(rule, finding(0))
    assert info is not None and info.previous_value == 2.0 and info.new_value == 3.0
    assert tracker.lookup(rule, finding(61)) is None  # more than an hour after the deploy
    assert tracker.lookup(rule, finding(0, labels=v1)) is None  # the old version is not the deploy


@pytest.mark.parametrize(
    ("runbook_base", "want"),
    [
        (
            "https://git.example/infercost/blob/main/",
            "https://git.example/infercost/blob/main/rules/agent/README.md#cost",
        ),
        (None, "rules/agent/README.md#cost"),  # left relative: each sink joins it to external_url
    ],
)
def test_relative_runbook_links_resolve_under_the_runbook_base_not_the_dashboard(
    tmp_path: Path, runbook_base: str | None, want: str
) -> None:
    rs = rules(tmp_path, runbook_url="rules/agent/README.md#cost", **{"for": "0s"})
    am = AlertManager(rs, external_url="https://grafana.example/d/fleet", runbook_base=runbook_base)
    (event,) = [e for e in am.step([finding(0)], T0) if e.kind == "firing"]
    assert event.alert.annotations["runbook_url"] == want
    assert event.alert.annotations["link"] == "https://grafana.example/d/fleet"  # the generatorURL
