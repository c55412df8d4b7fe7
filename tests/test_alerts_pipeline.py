"""The daemon-side pipeline over a real store: a deploy that doubles cost per token pages, names the
deploy and compares the versions at like load; a restarted pipeline keeps its baselines."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.clock import ManualClock
from agent.config import parse_config
from agent.detect.deploys import record_deploy
from agent.detect.pipeline import build_pipeline
from agent.detect.rules import load_rules
from agent.samples import CostWindow, UsageWindow
from agent.store import Store

T0 = 1699833600.0
RULE = {
    "id": "regression",
    "signal": "usd_per_1m_output_tokens",
    "over": "5m",
    "op": ">",
    "factor": 1.5,
    "baseline": {"window": "1d", "like_load": {"band_ratio": 2.0, "min_tokens_per_second": 1}},
    "for": "15m",
    "keep_firing_for": "5m",
    "severity": "warning",
    "summary": "{model} {model_version}: ${value}/1M ({change_pct})",
    "description": "Deploy: {deploy}",
}


def window(t: float, version: str, usd: float) -> CostWindow:
    u = UsageWindow("n1", "vllm-a", "llama", version, t, t + 60, 3000, 6000, 60, None)
    return CostWindow(u, usd, 0.0, usd / 6000 * 1e6, usd / 9000 * 1e6, 0.0)


async def test_deploy_regression_pages_with_the_deploy_and_survives_restart(tmp_path: Path) -> None:
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump({"rules": [RULE]}))
    rules = load_rules([p])
    cfg = parse_config({"node": "n1", "state_dir": str(tmp_path)}, "test", environ={})
    clock = ManualClock(T0)
    store = Store(tmp_path / "history.sqlite", 35, clock, deploys=record_deploy)
    store.write_windows([window(T0 + i * 60, "v1", 0.03) for i in range(1440)])  # a day of v1 at $5/1M
    deploy_at = T0 + 1440 * 60
    clock.advance(1440 * 60)
    pipeline = build_pipeline(cfg, store, clock, rules=rules)
    assert pipeline.step(deploy_at) == []  # warm-up: a day of history replayed, nothing fires
    fired = None
    for i in range(25):  # v2 costs twice as much per token at the same load
        t = deploy_at + i * 60
        store.write_windows([window(t, "v2", 0.06)])
        clock.advance(60)
        for e in pipeline.step(t + 60):
            if e.kind == "firing":
                fired = e
    # v2 is its own series: 2x from its first minute (pending at +1m), firing 15 minutes later
    assert fired is not None and fired.at == deploy_at + 16 * 60
    a = fired.alert
    # the trailing day at firing time holds only v1: v2's minutes are held back from the baseline
    # for the rule's over + for, so a regression is not averaged into its own baseline
    assert a.labels["model_version"] == "v2" and a.baseline == pytest.approx(5.0)
    assert a.annotations["summary"].startswith("llama v2: $") and a.annotations["change_pct"].startswith("+")
    assert a.deploy is not None and (a.deploy.from_version, a.deploy.to_version) == ("v1", "v2")
    assert a.deploy.previous_value == pytest.approx(5.0) and a.deploy.new_value == pytest.approx(10.0)
    assert "llama v1 → v2" in a.annotations["deploy"] and "+100.0 %" in a.annotations["deploy"]
    assert pipeline.firing_counts() == {("regression", "warning"): 1}
    store.close()

    # restart: the alert is still firing (no second page), and clears when v2 is fixed
    store = Store(tmp_path / "history.sqlite", 35, clock, deploys=record_deploy)
    again = build_pipeline(cfg, store, clock, rules=rules)
    t = deploy_at + 25 * 60
    events = []
    for i in range(12):
        store.write_windows([window(t + i * 60, "v2", 0.03)])
        clock.advance(60)
        events += again.step(t + (i + 1) * 60)
    assert [e.kind for e in events] == ["resolved"]
    assert events[0].alert.dedup_key == a.dedup_key
    store.close()


async def test_alerts_after_one_deploy_read_the_previous_versions_week_once(tmp_path: Path) -> None:
    """Two rules on the same signal turn pending after one deploy: both name the deploy with the
    previous version's figure, read from the store once (a week of minutes per alert was most of
    the rules' time after a deploy)."""
    second = {**RULE, "id": "regression_fast", "for": "5m"}
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump({"rules": [RULE, second]}))
    rules = load_rules([p])
    cfg = parse_config({"node": "n1", "state_dir": str(tmp_path)}, "test", environ={})
    clock = ManualClock(T0)
    store = Store(tmp_path / "history.sqlite", 35, clock, deploys=record_deploy)
    store.write_windows([window(T0 + i * 60, "v1", 0.03) for i in range(1440)])
    deploy_at = T0 + 1440 * 60
    clock.advance(1440 * 60)
    pipeline = build_pipeline(cfg, store, clock, rules=rules)
    pipeline.step(deploy_at)
    reads: list[str] = []
    series = store.series

    def counted(kind: Any, labels: Mapping[str, str], start: float, end: float) -> Any:
        reads.append(labels.get("model_version", ""))
        return series(kind, labels, start, end)

    store.series = counted  # type: ignore[method-assign]
    fired = {}
    for i in range(25):
        t = deploy_at + i * 60
        store.write_windows([window(t, "v2", 0.06)])
        clock.advance(60)
        fired.update({e.alert.rule_id: e.alert for e in pipeline.step(t + 60) if e.kind == "firing"})
    assert set(fired) == {"regression", "regression_fast"}
    for a in fired.values():
        assert a.deploy is not None and a.deploy.previous_value == pytest.approx(5.0)
    # once for the deploy's figure, once for the alerts' factor split (agent.detect.explain)
    assert reads.count("v1") == 2 and reads.count("v2") >= 2
    store.close()
