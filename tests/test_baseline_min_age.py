"""A like-for-like baseline bucket counts only once its oldest minute is ``min_age`` old.

Why: on a day of a new request mix, the decode-efficiency rule's baseline for that mix band filled
with the same day's first hour and then compared the afternoon with the morning (the benchmark's
long-prompt day: 12 false alarms on seeds 41–45, 3.5–23.6 h into the day)."""

from __future__ import annotations

from collections.abc import Sequence

from agent.detect.baselines import TrailingBaseline
from agent.detect.evaluator import RuleEvaluator
from agent.detect.rules import parse_rules
from agent.records import MINUTE, MinuteRecord

T0 = 1699833600.0  # Monday 2023-11-13 00:00 UTC
DAY = 86400.0
LABELS = (("node", "n1"), ("engine", "e"), ("model", "m"), ("model_version", "v1"))


def ratio(v: Sequence[float]) -> float | None:
    return v[0] / v[1] if v[1] else None


def test_oldest_is_the_first_minute_held_in_the_window() -> None:
    b = TrailingBaseline(180.0, ratio, 2, False, lag=60.0)
    assert b.oldest("k", 0.0) is None
    b.add("k", 0.0, (1.0, 1.0), 1.0)
    assert b.oldest("k", 30.0) is None  # still held back by the lag
    b.add("k", 60.0, (1.0, 1.0), 1.0)
    b.add("k", 180.0, (1.0, 1.0), 1.0)  # a gap: a second run of minutes
    assert b.oldest("k", 61.0) == 0.0
    assert b.oldest("k", 180.0) == 0.0  # the window [0, 180) still holds minute 0
    assert b.oldest("k", 181.0) == 60.0  # minute 0 has expired: the run's second minute is the oldest
    assert b.oldest("k", 241.0) == 180.0  # the first run has gone: the second run's minute
    assert b.oldest("k", 1000.0) is None  # all expired
    assert b.oldest("other", 60.0) is None


def _rule(min_age: str) -> RuleEvaluator:
    rules = parse_rules(
        {
            "rules": [
                {
                    "id": "eff",
                    "signal": "generation_tokens_per_second",
                    "over": "5m",
                    "op": "<",
                    "baseline": {"window": "7d", "stat": "median", "min_minutes": 60, "min_age": min_age},
                    "factor": 0.5,
                    "for": "0s",
                    "severity": "warning",
                    "summary": "x",
                }
            ]
        },
        "test",
    )
    return RuleEvaluator(rules)


def _minute(t: float, tps: float) -> MinuteRecord:
    return MinuteRecord("model", LABELS, t, {"generation_tokens": tps * 60.0, "seconds": 60.0})


def _fires(ev: RuleEvaluator, start: float, minutes: int, tps: float) -> bool:
    found = False
    for i in range(minutes):
        t = start + i * MINUTE
        found |= bool(ev.step(t + MINUTE, [_minute(t, tps)]))
    return found


def test_a_baseline_younger_than_min_age_does_not_judge() -> None:
    # 3 hours at 100 tokens/s, then a drop to 10: with min_age 1d the 3-hour-old bucket is no baseline
    young = _rule("1d")
    assert not _fires(young, T0, 180, 100.0)
    assert not _fires(young, T0 + 180 * MINUTE, 30, 10.0)
    # without it (min_age 0), the same minutes fire
    plain = _rule("0s")
    assert not _fires(plain, T0, 180, 100.0)
    assert _fires(plain, T0 + 180 * MINUTE, 30, 10.0)


def test_a_baseline_a_day_old_judges() -> None:
    ev = _rule("1d")
    assert not _fires(ev, T0, 120, 100.0)  # day 0: two hours
    assert not _fires(ev, T0 + DAY, 60, 100.0)  # a day later: the bucket's oldest minute is a day old
    assert _fires(ev, T0 + DAY + 60 * MINUTE, 30, 10.0)


def test_min_age_is_a_duration_in_the_rule_file() -> None:
    (r,) = _rule("1d").rules
    assert r.baseline is not None and r.baseline.min_age == DAY
