"""The isolation forest in the daemon: fitted from the store, scores land in the store and on /metrics."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from synthetic_history import backfill_simulated

from agent.clock import ManualClock
from agent.detect.forest import STATE_FILE
from agent.detect.scoring import AnomalyScorer, ForestScoring
from agent.records import MINUTE, window_from_record
from agent.store import Store

SERIES = [("n1", "eng", "m", "v1")]
DAY = 86400.0


def _store(tmp_path: Path, end: float) -> Store:
    store = Store(tmp_path / "h.sqlite", 35, ManualClock(end))
    backfill_simulated(store, SERIES, end - 3 * DAY, end)
    return store


def test_a_costly_minute_scores_above_one_and_a_normal_one_below(tmp_path: Path) -> None:
    end = 1_780_000_000.0 // DAY * DAY + 14 * 3600  # 14:00 UTC: the simulated daily peak
    store = _store(tmp_path, end)
    last = store.records(end - 2 * MINUTE, end - MINUTE, kinds=("model",))[0]
    normal = window_from_record(last)
    # the same minute again, one minute later, with triple the cost per token
    bad = replace(
        normal, gpu_time_usd=normal.gpu_time_usd * 3, usage=replace(normal.usage, start=end, end=end + MINUTE)
    )
    store.write_windows([bad])
    scorer = ForestScoring(store, tmp_path)
    scores = scorer.step(end + MINUTE)  # scores the minute [end, end + 1 min)
    assert scorer.forest.fitted("eng", "m")
    (score,) = scores.values()
    assert score is not None and score > 1
    # the score is in the store for rules to read as anomaly_score
    rec = store.records(end, end + MINUTE, kinds=("model",))[0]
    # stored as score × seconds and read back divided: equal up to rounding
    stored = rec.sums["anomaly.s"] / rec.sums["anomaly.w"]
    assert rec.sums["anomaly.w"] > 0 and stored == pytest.approx(score, rel=1e-12)
    # normal minutes of the last day: almost all below 1 (the forest is calibrated on its training week)
    day = [window_from_record(r) for r in store.records(end - DAY, end, kinds=("model",))]
    normal_scores = [x for x in scorer.forest.score_many(day) if x is not None]
    assert len(normal_scores) > 1000
    assert sum(x > 1 for x in normal_scores) / len(normal_scores) < 0.02
    assert score > max(sorted(normal_scores)[: int(len(normal_scores) * 0.98)])
    # persisted: a restarted agent loads it instead of refitting
    again = ForestScoring(store, tmp_path)
    assert again.forest.fitted("eng", "m")


async def test_the_daemon_scores_with_numpy_after_a_short_lived_fitting_process(tmp_path: Path) -> None:
    """The daemon's side never imports scikit-learn: a process fits, writes the arrays and exits."""
    end = 1_780_000_000.0 // DAY * DAY + 14 * 3600
    store = _store(tmp_path, end)
    store.close()
    scorer = AnomalyScorer(tmp_path / "h.sqlite", tmp_path)
    try:
        first = await scorer.step(end)
        assert scorer.pid is not None  # the fitting process runs ...
        assert first == {("eng", "m", "v1"): None}  # ... and nothing is scored without a forest yet
        await scorer.wait_fit()
        assert scorer.pid is None and (tmp_path / STATE_FILE).exists()  # it exited after writing the arrays
        ((key, score),) = (await scorer.step(end)).items()
        # a usual minute: scored (not None), and not anomalous
        assert key == ("eng", "m", "v1") and score is not None and 0.0 <= score < 1.0
        assert scorer.pid is None  # fitted today: no new fit
    finally:
        await scorer.close()


async def test_the_scorer_on_the_daemons_connection_writes_through_it_and_leaves_it_open(
    tmp_path: Path,
) -> None:
    end = 1_780_000_000.0 // DAY * DAY + 14 * 3600
    store = _store(tmp_path, end)
    scorer = AnomalyScorer(store.path, tmp_path, store)
    try:
        await scorer.step(end)
        await scorer.wait_fit()
        ((_, score),) = (await scorer.step(end)).items()
    finally:
        await scorer.close()
    assert score is not None
    # closed the scorer, not the daemon's connection: the score reads back through it
    rec = store.records(end - MINUTE, end, kinds=("model",))[0]  # the minute scored at ``end``
    assert rec.sums["anomaly.s"] / rec.sums["anomaly.w"] == pytest.approx(score, rel=1e-12)
    store.close()


def test_the_daemon_never_imports_scikit_learn() -> None:
    modules = "agent.cli, agent.supervisor, agent.detect.scoring, infercost_sim.demo"
    code = f"import sys, {modules}; print('sklearn' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"
