"""A replica that joins a model version on the node (an autoscaler's new pod) raises nothing while it
warms up: it loads its weights on paid GPUs making no tokens, then serves at a rising rate, so its
first minutes cost many times the version's usual dollars per token. The bundled rules judge a
series against its own history (a replica without any has no baseline) or hold a threshold for
longer than a warm-up lasts; the replica already serving keeps its alerts.

A week of one replica's minutes goes through the real store and pipeline with the bundled rules,
then a second replica of the same version appears and warms up beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.clock import ManualClock
from agent.config import parse_config
from agent.detect.deploys import record_deploy
from agent.detect.pipeline import build_pipeline
from agent.samples import CostWindow, UsageWindow
from agent.store import Store

T0 = 1_699_833_600.0  # epoch seconds, a minute boundary
MINUTE = 60.0
HISTORY_MINUTES = 7 * 1440  # a week of the first replica: every baseline of the bundled rules filled
USD_PER_MINUTE = 2 * 4.0 / 60  # two GPUs at $4 per GPU-hour
TOKENS_PER_MINUTE = 60 * 1500.0  # output tokens a warm replica makes per minute
LOADING_MINUTES = 4  # weights loading: GPUs held and paid, no tokens
RAMP_MINUTES = 12  # then serving at 1/12, 2/12, … of the warm rate
WATCH_MINUTES = 120  # minutes watched after the new replica appears


def window(engine: str, t: float, share: float, speed: float = 1.0) -> CostWindow:
    """One minute of a replica serving at ``share`` of the warm load (0: loading), its steps at
    ``speed`` (0.5: each sequence makes half its tokens, a slower build)."""
    out = TOKENS_PER_MINUTE * share * speed
    u = UsageWindow(
        "n1", engine, "llama", "v1", t, t + MINUTE, out * 2, out, 2 * MINUTE, None,
        gpu_util_ratio=0.05 + 0.85 * share, requests_running=24.0 * share, kv_cache_usage_ratio=0.5 * share,
        preemptions=0.0, decode_seconds=24.0 * share * MINUTE if share else None,
    )  # fmt: skip
    per_1m = USD_PER_MINUTE / out * 1e6 if out else None
    total = USD_PER_MINUTE / (3 * out) * 1e6 if out else None
    return CostWindow(u, USD_PER_MINUTE, 0.0, per_1m, total, 0.0 if out else USD_PER_MINUTE)


def watch(tmp_path: Path, serving_speed: float) -> list[tuple[str, str | None]]:
    """(rule, engine) of every alert that fires in the minutes after the new replica appears, the
    replica already serving at its usual load meanwhile, its steps at ``serving_speed``."""
    cfg = parse_config({"node": "n1", "state_dir": str(tmp_path)}, "test", environ={})
    clock = ManualClock(T0 + HISTORY_MINUTES * MINUTE)
    store = Store(tmp_path / "history.sqlite", 35, clock, deploys=record_deploy)
    store.write_windows([window("vllm-a", T0 + i * MINUTE, 1.0) for i in range(HISTORY_MINUTES)])
    pipeline = build_pipeline(cfg, store, clock)
    joined = T0 + HISTORY_MINUTES * MINUTE
    assert pipeline.step(joined) == []  # the week replayed: nothing fires
    firing = []
    for i in range(WATCH_MINUTES):
        t = joined + i * MINUTE
        share = 0.0 if i < LOADING_MINUTES else min(1.0, (i - LOADING_MINUTES + 1) / RAMP_MINUTES)
        store.write_windows([window("vllm-a", t, 1.0, serving_speed), window("vllm-b", t, share)])
        clock.advance(MINUTE)
        firing += [e for e in pipeline.step(t + MINUTE) if e.kind == "firing"]
    store.close()
    return [(e.alert.rule_id, dict(e.alert.labels).get("engine")) for e in firing]


def test_a_warming_replica_raises_nothing(tmp_path: Path) -> None:
    first = window("vllm-b", T0, 1 / RAMP_MINUTES).usd_per_1m_output
    warm = window("vllm-a", T0, 1.0).usd_per_1m_output
    assert first == pytest.approx(RAMP_MINUTES * warm)  # type: ignore[operator]  # 12 × the version's
    assert watch(tmp_path, serving_speed=1.0) == []


def test_the_serving_replica_keeps_its_alerts(tmp_path: Path) -> None:
    # the same minutes, the first replica now making half its tokens at the same load: it pages
    fired = watch(tmp_path, serving_speed=0.5)
    assert ("cost_per_token_regression", "vllm-a") in fired
    assert {engine for _, engine in fired} == {"vllm-a"}
