"""A price-book change: the cost alert names it (not a deploy), from the records' $ per GPU-second."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agent.detect.alerts import AlertManager
from agent.detect.deploys import PriceTracker
from agent.detect.evaluator import RuleEvaluator
from agent.detect.rules import load_default_rules, load_rules
from agent.records import MinuteRecord

MONDAY = 1699833600.0  # 2023-11-13 00:00 UTC, a Monday
LABELS = (("node", "n1"), ("engine", "vllm-a"), ("model", "llama"), ("model_version", "v1"))


def _minute(t: float, usd_per_gpu_hour: float) -> MinuteRecord:
    cost = 8 * 60.0 * usd_per_gpu_hour / 3600.0  # 8 GPUs for a minute
    sums = {
        "seconds": 60.0,
        "generation_tokens": 60_000.0,
        "prompt_tokens": 240_000.0,
        "cost_usd": cost,
        "gpu_time_usd": cost,
        "gpu_seconds": 480.0,
    }
    return MinuteRecord("model", LABELS, t, sums)


def test_the_tracker_sees_the_price_per_gpu_hour_change() -> None:
    tracker = PriceTracker()
    assert tracker.observe([_minute(MONDAY, 2.0)]) == []
    assert tracker.observe([_minute(MONDAY + 60, 2.0)]) == []
    (change,) = tracker.observe([_minute(MONDAY + 120, 2.5)])
    assert (change.from_usd_per_gpu_hour, change.to_usd_per_gpu_hour) == pytest.approx((2.0, 2.5))
    assert change.at == MONDAY + 120
    assert "$2 → $2.5 per GPU-hour (+25.0 %)" in change.describe()


def test_a_cost_alert_after_a_price_change_names_it(tmp_path: Path) -> None:
    rule = {
        "id": "cost",
        "signal": "usd_per_1m_output_tokens",
        "over": "5m",
        "op": ">",
        "baseline": {"window": "1d", "min_minutes": 30},
        "factor": 1.2,
        "for": "10m",
        "severity": "warning",
        "summary": "s {value}",
        "description": "Deploy: {deploy}. Price change: {price_change}.",
    }
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump({"rules": [rule]}))
    rules = load_rules([p])
    tracker = PriceTracker()
    ev = RuleEvaluator(rules)
    am = AlertManager(rules, price_lookup=lambda r, f: c.describe() if (c := tracker.lookup(r, f)) else None)
    fired = []
    for i in range(180):
        t = MONDAY + 60 * i
        rec = [_minute(t, 2.0 if i < 120 else 3.0)]  # +50 % from minute 120
        tracker.observe(rec)
        fired += [e for e in am.step(ev.step(t + 60, rec), t + 60) if e.kind == "firing"]
    (alert,) = [e.alert for e in fired]
    assert alert.deploy is None
    assert "price of its GPUs $2 → $3 per GPU-hour (+50.0 %)" in alert.annotations["price_change"]
    assert alert.annotations["description"].startswith(
        "Deploy: none. Price change: price of its GPUs $2 → $3"
    )


def _run_default_price_rule(prices: list[float]) -> list[tuple[str, float, dict[str, str]]]:
    """Feed one minute per price through the shipped price_increase rule; (event, minute, annotations)."""
    rule = load_default_rules().get("price_increase")
    assert rule is not None
    rules = [rule]
    tracker = PriceTracker()
    ev = RuleEvaluator(rules)
    am = AlertManager(rules, price_lookup=lambda r, f: c.describe() if (c := tracker.lookup(r, f)) else None)
    out = []
    for i, price in enumerate(prices):
        t = MONDAY + 60 * i
        rec = [_minute(t, price)]
        tracker.observe(rec)
        out += [(e.kind, i, dict(e.alert.annotations)) for e in am.step(ev.step(t + 60, rec), t + 60)]
    return [(k, i, a) for k, i, a in out if k in ("firing", "resolved")]


def test_the_default_price_rule_says_so_minutes_after_the_book_changes_and_names_it() -> None:
    events = _run_default_price_rule([2.0] * 240 + [2.5] * 480)  # +25 % at minute 240
    (fired, at, notes), (resolved, end, _) = events
    assert fired == "firing" and 240 + 5 <= at <= 240 + 12  # its 5-minute window, held 5 minutes
    assert "$2 → $2.5 per GPU-hour (+25.0 %)" in notes["price_change"]
    assert "+25.0 %" in notes["summary"]
    # said once: it resolves when the new price is most of the 3 hours it compares with
    assert resolved == "resolved" and 240 + 80 <= end <= 240 + 120


def test_the_default_price_rule_is_quiet_on_a_price_cut_and_on_a_flat_book() -> None:
    assert _run_default_price_rule([2.0] * 240 + [1.6] * 240) == []
    assert _run_default_price_rule([2.0] * 480) == []
    # +5 % is under its 1.1 factor
    assert _run_default_price_rule([2.0] * 240 + [2.1] * 240) == []
