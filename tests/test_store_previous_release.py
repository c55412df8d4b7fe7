"""A history file written by the previous release (schema 8, tests/fixtures/stores/history-v8.sqlite)
opens with this agent, migrates in place and reads the same sums.

The fixture was written by the schema-8 store from known windows (one priced minute of llama v1 with
every split, a two-minute v2 window spread over its minutes, one NVML round, one scrape, an anomaly
score); the figures below are those inputs, hand-checked. The migration policy (agent/store.py)
says a released store column is never renamed or dropped: the last test holds every column of the
fixture against the columns this agent declares.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from agent.records import SIGNALS
from agent.store import SCHEMA_VERSION, TABLES, Store

FIXTURE = Path(__file__).parent / "fixtures" / "stores" / "history-v8.sqlite"
T0 = 1699833600.0  # the fixture's first minute (Monday 00:00 UTC)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    path = tmp_path / "history.sqlite"
    shutil.copy(FIXTURE, path)
    st = Store(path, retention_days=36500)
    yield st
    st.close()


def _value(st: Store, signal: str, version: str) -> float | None:
    (rec,) = st.series("model", {"model_version": version}, T0, T0 + 60)
    sig = SIGNALS[signal]
    return sig.fn([rec.sums.get(n, 0.0) for n in sig.inputs])


def test_the_previous_release_store_opens_at_this_schema(store: Store) -> None:
    assert store.schema_version() == SCHEMA_VERSION >= 8
    assert store.get_meta("last_evaluated") == str(T0)


def test_its_model_minutes_read_the_same_sums(store: Store) -> None:
    v1 = store.series("model", {"model_version": "v1"}, T0, T0 + 3600)
    assert len(v1) == 1
    s = v1[0].sums
    # 6000 output tokens, 3000 prompt, $0.03 GPU time + $0.01 energy, 60 GPU-s, 18 kJ, 2 preemptions
    assert (s["generation_tokens"], s["prompt_tokens"], s["seconds"]) == (6000.0, 3000.0, 60.0)
    assert s["cost_usd"] == pytest.approx(0.04) and s["energy_usd"] == pytest.approx(0.01)
    assert (s["gpu_seconds"], s["energy_joules"], s["preemptions"]) == (60.0, 18000.0, 2.0)
    # gauges as value × seconds: utilisation 0.8, KV cache 0.4, 12 requests running, score 1.5
    assert s["gpu_util.s"] == pytest.approx(48.0) and s["kv.s"] == pytest.approx(24.0)
    assert s["running.s"] == pytest.approx(720.0) and s["anomaly.s"] == pytest.approx(90.0)
    assert s["anomalous_seconds"] == 60.0  # the score was above 1 for the whole minute
    # the floor: $1.50 per 1M at the running batch × 6000 tokens
    assert s["floor_usd"] == pytest.approx(0.009) and s["bound_memory_usd"] == pytest.approx(0.02)
    # v2's 120 s window was spread over its two minutes: half of it in each, marked estimated
    v2 = store.series("model", {"model_version": "v2"}, T0, T0 + 3600)
    assert [r.sums["generation_tokens"] for r in v2] == [1000.0, 1000.0]
    assert [r.sums["estimated_seconds"] for r in v2] == [60.0, 60.0]
    assert "kv.s" not in v2[0].sums  # never reported: absent, not zero


def test_its_rule_signals_read_as_before(store: Store) -> None:
    assert _value(store, "usd_per_1m_output_tokens", "v1") == pytest.approx(0.04 / 6000 * 1e6)
    assert _value(store, "kv_cache_usage_ratio", "v1") == pytest.approx(0.4)
    assert _value(store, "preemptions", "v1") == 2.0
    assert _value(store, "usd_per_1m_output_tokens_decode", "v1") == pytest.approx(0.03 / 6000 * 1e6)


def test_its_other_tables_and_deploys_read_as_before(store: Store) -> None:
    (gpu,) = store.records(T0, T0 + 60, ("gpu",))
    assert gpu.label("gpu") == "0" and gpu.sums["power.s"] == 350.0 and gpu.sums["energy_last"] == 1000.0
    (engine,) = store.records(T0, T0 + 60, ("engine",))
    assert engine.sums["scrape.s"] == pytest.approx(0.01) and engine.sums["up.s"] == 1.0
    (node,) = store.records(T0, T0 + 60, ("node",))
    assert node.sums["nvml_up.s"] == 1.0
    (deploy,) = store.deploys()
    assert (deploy.from_version, deploy.to_version, deploy.at) == ("v1", "v2", T0 + 60)
    assert store.load_alert_state() == [{"dedup_key": "k1", "state": "firing"}]


def test_no_released_column_was_renamed_or_dropped() -> None:
    db = sqlite3.connect(f"file:{FIXTURE}?mode=ro", uri=True)
    try:
        for t in TABLES.values():
            released = {row[1] for row in db.execute(f"PRAGMA table_info({t.name})")}
            declared = {*t.keys, "minute", "covered_until", *t.cols}
            missing = released - declared - {"uuid", "gpu_model", "engine_kind", "cost_covered_until"}
            assert not missing, f"{t.name}: released columns no longer declared: {sorted(missing)}"
    finally:
        db.close()
