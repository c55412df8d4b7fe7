"""The forest rule reads how much of its window was judged and how much of that was anomalous.

The isolation forest abstains on a request mix it was not trained on, and its score is heavy-tailed
(a scale-up's warm-up minute can score 26). A rule over the score's 1-hour *mean* then spoke for
an hour from a handful of judged minutes, or from a few extreme ones. The store keeps, per scored
minute, the seconds whose score was above 1 (schema 7), and two signals read it:
``anomaly_judged_ratio`` (judged seconds ÷ seconds) and ``anomalous_ratio`` (anomalous ÷ judged).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from oldstore import old_store
from synthetic_history import backfill_simulated

from agent.clock import ManualClock
from agent.detect.evaluator import RuleEvaluator
from agent.detect.rules import load_default_rules
from agent.records import MINUTE, SIGNALS, MinuteRecord
from agent.store import MIGRATIONS, SCHEMA_VERSION, Store

T0 = 1_780_000_000.0 // 86400 * 86400 + 14 * 3600  # 14:00 UTC
SERIES = [("n1", "eng", "m", "v1")]
LABELS = (("node", "n1"), ("engine", "eng"), ("model", "m"), ("model_version", "v1"))


def _signal(name: str, sums: dict[str, float]) -> float | None:
    sig = SIGNALS[name]
    return sig.fn([sums.get(i, 0.0) for i in sig.inputs])


def test_the_store_keeps_the_anomalous_seconds_of_each_scored_minute(tmp_path: Path) -> None:
    store = Store(tmp_path / "h.sqlite", 35, ManualClock(T0 + 3600))
    backfill_simulated(store, SERIES, T0, T0 + 4 * MINUTE)
    # minute 0 normal, 1 anomalous, 2 not judged (the forest abstained), 3 extreme
    for i, score in ((0, 0.5), (1, 3.0), (3, 26.0)):
        store.write_anomaly_score("n1", "eng", "m", "v1", T0 + i * MINUTE, score)
    recs = store.records(T0, T0 + 4 * MINUTE, ("model",))
    assert [r.sums["anomalous_seconds"] for r in recs] == [0.0, 60.0, 0.0, 60.0]
    total: dict[str, float] = {}
    for r in recs:
        for k, v in r.sums.items():
            total[k] = total.get(k, 0.0) + v
    assert _signal("anomaly_judged_ratio", total) == pytest.approx(3 / 4)
    assert _signal("anomalous_ratio", total) == pytest.approx(2 / 3)
    # the mean the old rule read: carried by the one extreme minute
    assert _signal("anomaly_score", total) == pytest.approx((0.5 + 3.0 + 26.0) / 3)
    # a re-score of the same minute replaces, never adds
    store.write_anomaly_score("n1", "eng", "m", "v1", T0 + MINUTE, 0.2)
    (r,) = store.records(T0 + MINUTE, T0 + 2 * MINUTE, ("model",))
    assert r.sums["anomalous_seconds"] == 0.0 and r.sums["anomaly.w"] == 60.0
    store.close()


def test_a_schema_6_file_migrates_and_keeps_its_scores(tmp_path: Path) -> None:
    p = old_store(
        tmp_path / "old.sqlite",
        6,
        "INSERT INTO model_minutes (node, engine, model, model_version, minute, covered_until, seconds, "
        "generation_tokens, cost_usd, anomaly_s, anomaly_w) "
        "VALUES ('n1', 'eng', 'm', 'v1', ?, ?, 60, 6000, 0.05, 150, 60)",
        (int(T0), T0 + 60),
    )
    st = Store(p, 35, ManualClock(T0 + 3600))
    assert st.schema_version() == SCHEMA_VERSION == len(MIGRATIONS)
    (r,) = st.records(T0, T0 + 60, ("model",))
    # the old score is kept; its anomalous seconds read 0 (unknown before schema 7)
    assert r.sums["anomaly.s"] == 150.0 and r.sums["anomalous_seconds"] == 0.0
    st.write_anomaly_score("n1", "eng", "m", "v1", T0, 4.0)
    (r,) = st.records(T0, T0 + 60, ("model",))
    assert r.sums["anomalous_seconds"] == 60.0
    st.close()


def _minute(t: float, score: float | None) -> MinuteRecord:
    sums = {"seconds": 60.0, "generation_tokens": 6000.0, "prompt_tokens": 12000.0}
    if score is not None:
        sums.update({"anomaly.s": score * 60.0, "anomaly.w": 60.0, "anomalous_seconds": 60.0 * (score > 1)})
    return MinuteRecord("model", LABELS, t, sums)


def _findings(scores: list[float | None]) -> list[int]:
    """Minutes (from 0) at which the shipped forest rule's condition holds."""
    rule = next(r for r in load_default_rules().rules if r.id == "cost_anomaly")
    ev = RuleEvaluator([rule])
    out = []
    for i, s in enumerate(scores):
        t = T0 + i * MINUTE
        if ev.step(t + MINUTE, [_minute(t, s)]):
            out.append(i)
    return out


def test_the_forest_rule_does_not_speak_for_an_hour_from_a_few_judged_minutes() -> None:
    # an hour as usual, then 3 hours in which the forest judges only 1 minute in 6 (a mix at the edge
    # of what it has seen), all of them anomalous
    scores: list[float | None] = [0.3] * 60 + [5.0 if i % 6 == 0 else None for i in range(180)]
    assert _findings(scores) == []
    # the same minutes, all judged: the rule fires
    assert _findings([0.3] * 60 + [5.0] * 180)


def test_a_few_extreme_minutes_do_not_carry_the_hour() -> None:
    # every minute judged, 0.3 as usual, but ten minutes of a warm-up scoring 26: the old rule's
    # 1-hour mean was (10 × 26 + 50 × 0.3) / 60 ≈ 4.6 > 1
    scores: list[float | None] = [0.3] * 180
    scores[60:70] = [26.0] * 10
    assert _findings(scores) == []


def test_a_regime_of_anomalous_minutes_fires() -> None:
    # from minute 60 on, every minute scores 9 (a 1.2× step): the condition holds once more than
    # 60 % of the hour has (37 minutes in), not before
    scores: list[float | None] = [0.3] * 60 + [9.0] * 120
    found = _findings(scores)
    assert found and found[0] == 60 + 37 - 1
    assert found == list(range(found[0], 180))  # and keeps holding while the regression lasts
