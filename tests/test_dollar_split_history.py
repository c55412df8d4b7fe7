"""Where the dollars went, in history: prompt vs output, allocation vs usage, prefix-cache
savings and the cost floor are stored per model minute (schema 5), read back as the daemon wrote
them, and usable in agent rules. Every expected figure is computed by hand in the comments.

One minute of llama v1 on a $3/h GPU costs $0.05 and makes 6,000 output and 12,000 prompt tokens.
Prefill took 15 s and decode 45 s of request time: prompt $ = 0.05 × 15 / 60 = $0.0125, output
$0.0375. The GPU was 60 % busy: usage $0.03, allocation − usage $0.02. 3,000 of the prompt tokens
came from the prefix cache: 3,000 × 0.0125 / 9,000 = $0.0041667 saved. The floor at the running
batch is $2.00 per 1M output tokens (6,000 tokens → $0.012), at the largest batch $0.50 ($0.003).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from oldstore import old_store

from agent.clock import ManualClock
from agent.detect.evaluator import RuleEvaluator
from agent.detect.rules import load_rules
from agent.records import SIGNALS, SPLIT_SUMS, MinuteRecord, split_sums, window_from_record
from agent.samples import CostWindow, UsageWindow
from agent.store import MIGRATIONS, Store

T0 = 1699833600.0  # Monday 00:00 UTC
LABELS = (("node", "n1"), ("engine", "e1"), ("model", "llama"), ("model_version", "v1"))


def window(start: float, split: bool = True, usage: bool = True, floor: bool = True) -> CostWindow:
    u = UsageWindow(
        "n1",
        "e1",
        "llama",
        "v1",
        start,
        start + 60.0,
        prompt_tokens=12_000,
        generation_tokens=6_000,
        gpu_seconds=60.0,
        energy_joules=None,
        prefill_seconds=15.0 if split else None,
        decode_seconds=45.0 if split else None,
        cached_prompt_tokens=3_000 if split else None,
    )
    return CostWindow(
        u,
        gpu_time_usd=0.05,
        energy_usd=0.0,
        usd_per_1m_output=0.05 / 6_000 * 1e6,
        usd_per_1m_total=0.05 / 18_000 * 1e6,
        idle_usd=0.0,
        prompt_usd=0.0125 if split else None,
        usage_usd=0.03 if usage else None,
        prefix_cache_saved_usd=3_000 * 0.0125 / 9_000 if split else None,
        floor_usd_per_1m_output=2.0 if floor else None,
        floor_usd_per_1m_output_max_batch=0.5 if floor else None,
    )


def test_split_sums_of_one_window_by_hand() -> None:
    s = split_sums(window(T0))
    assert s["prompt_usd"] == pytest.approx(0.0125)
    assert s["split_usd"] == pytest.approx(0.05)
    assert s["split_prompt_tokens"] == 12_000 and s["split_generation_tokens"] == 6_000
    assert s["usage_usd"] == pytest.approx(0.03) and s["usage_alloc_usd"] == pytest.approx(0.05)
    assert s["cache_saved_usd"] == pytest.approx(0.0041667, rel=1e-4)
    assert s["floor_usd"] == pytest.approx(0.012) and s["floor_cost_usd"] == pytest.approx(0.05)
    assert s["floor_tokens"] == 6_000
    assert s["floor_max_usd"] == pytest.approx(0.003) and s["floor_max_tokens"] == 6_000
    # without phase times, usage or a floor: nothing is covered (no zero pretending to be a figure)
    bare = split_sums(window(T0, split=False, usage=False, floor=False))
    assert set(bare.values()) == {0.0}


def test_store_keeps_the_split_and_reads_it_back(tmp_path: Path) -> None:
    st = Store(tmp_path / "h.sqlite", 35, ManualClock(T0 + 3600))
    # a minute with every figure and one with none; the same windows again are not re-counted
    halves = [window(T0), window(T0 + 60.0, split=False, usage=False, floor=False)]
    assert st.write_windows(halves) == 2
    assert st.write_windows(halves) == 0
    recs = st.records(T0, T0 + 120, ("model",))
    assert [r.minute for r in recs] == [T0, T0 + 60]
    a, b = recs[0].sums, recs[1].sums
    assert a["prompt_usd"] == pytest.approx(0.0125) and a["usage_alloc_usd"] == pytest.approx(0.05)
    assert a["floor_usd"] == pytest.approx(0.012) and a["floor_max_usd"] == pytest.approx(0.003)
    assert b["split_usd"] == 0.0 and b["usage_alloc_usd"] == 0.0 and b["floor_tokens"] == 0.0
    # a stored minute as a window again: the split, usage and floor as the daemon priced them
    w = window_from_record(recs[0])
    assert w.prompt_usd == pytest.approx(0.0125) and w.output_usd == pytest.approx(0.0375)
    assert w.usage_usd == pytest.approx(0.03)
    assert w.prefix_cache_saved_usd == pytest.approx(0.0041667, rel=1e-4)
    assert w.floor_usd_per_1m_output == pytest.approx(2.0)
    assert w.floor_usd_per_1m_output_max_batch == pytest.approx(0.5)
    w2 = window_from_record(recs[1])  # the minute without: absent, not zero
    assert w2.prompt_usd is None and w2.usage_usd is None and w2.floor_usd_per_1m_output is None
    assert w2.prefix_cache_saved_usd is None and w2.output_usd == pytest.approx(0.05)
    # the hourly SQL sums the report reads, by name: both minutes
    ((_, _, sums),) = st.hourly_model_sums(T0, T0 + 3600)
    assert sums["cost_usd"] == pytest.approx(0.10)  # cost
    assert [sums[c] for c in SPLIT_SUMS] == pytest.approx(
        (0.0125, 0.05, 12_000, 6_000, 0.03, 0.05, 0.0041667, 0.012, 0.05, 6_000, 0.003, 0.05, 6_000), rel=1e-4
    )
    st.close()


def test_a_schema_4_store_is_migrated_and_keeps_its_minutes(tmp_path: Path) -> None:
    p = old_store(
        tmp_path / "h.sqlite",
        4,
        "INSERT INTO model_minutes (node, engine, model, model_version, minute, covered_until, seconds, "
        "generation_tokens, cost_usd) VALUES ('n1', 'e1', 'llama', 'v1', ?, ?, 60, 6000, 0.05)",
        (int(T0), T0 + 60),
    )
    st = Store(p, 35, ManualClock(T0 + 3600))
    assert st.schema_version() == len(MIGRATIONS)  # 4 → the latest (5 added these columns)
    (r,) = st.records(T0, T0 + 60, ("model",))
    assert r.sums["cost_usd"] == pytest.approx(0.05) and r.sums["prompt_usd"] == 0.0
    st.write_windows([window(T0 + 60)])  # the new columns take writes
    assert st.records(T0 + 60, T0 + 120, ("model",))[0].sums["prompt_usd"] == pytest.approx(0.0125)
    st.close()


def rec(minute: float, w: CostWindow) -> MinuteRecord:
    from agent.records import model_sums

    return MinuteRecord("model", LABELS, minute, model_sums(w))


@pytest.mark.parametrize(
    ("signal", "expected"),
    [
        # 5 minutes: prompt $0.0625 over 60,000 prompt tokens = $1.0417 per 1M
        ("usd_per_1m_prompt_tokens", 0.0625 / 60_000 * 1e6),
        # output share $0.1875 over 30,000 output tokens = $6.25 per 1M
        ("usd_per_1m_output_tokens_decode", 0.1875 / 30_000 * 1e6),
        ("prompt_cost_usd", 0.0625),
        ("usage_cost_usd", 0.15),
        ("allocation_waste_usd", 0.10),
        ("prefix_cache_saved_usd", 5 * 3_000 * 0.0125 / 9_000),
        ("usd_per_1m_output_tokens_floor", 2.0),
        ("usd_per_1m_output_tokens_floor_max_batch", 0.5),
    ],
)
def test_signals_over_five_minutes_by_hand(signal: str, expected: float) -> None:
    sig = SIGNALS[signal]
    recs = [rec(T0 + i * 60, window(T0 + i * 60)) for i in range(5)]
    sums = [sum(r.sums.get(k, 0.0) for r in recs) for k in sig.inputs]
    assert sig.fn(sums) == pytest.approx(expected)


def test_prompt_and_output_prices_cover_only_minutes_with_a_split() -> None:
    # 3 minutes with a split and 2 without: $/1M prompt is over the 3 (36,000 prompt tokens,
    # $0.0375 → $1.0417), not diluted by the 24,000 prompt tokens of minutes that have no split
    recs = [rec(T0 + i * 60, window(T0 + i * 60, split=i < 3)) for i in range(5)]
    for name, expected in (
        ("usd_per_1m_prompt_tokens", 0.0375 / 36_000 * 1e6),
        ("usd_per_1m_output_tokens_decode", 0.1125 / 18_000 * 1e6),
    ):
        sig = SIGNALS[name]
        assert sig.fn([sum(r.sums[k] for r in recs) for k in sig.inputs]) == pytest.approx(expected)


def _readme_rule(name: str) -> dict[str, object]:
    """The example rule ``name`` from the YAML blocks of rules/agent/README.md."""
    text = (Path(__file__).parent.parent / "rules" / "agent" / "README.md").read_text()
    for block in text.split("```yaml")[1:]:
        doc = yaml.safe_load(block.split("```")[0])
        for r in doc.get("rules", []):
            if r["id"] == name:
                return dict(r)
    raise AssertionError(f"rule {name} not in the README")


def test_the_documented_prompt_price_rule_loads_and_fires(tmp_path: Path) -> None:
    r = _readme_rule("prompt_cost_per_token_ceiling")
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump({"rules": [r]}))
    rules = load_rules([p])
    ev = RuleEvaluator(rules)
    # $1.0417 per 1M prompt tokens against the README's $1.00 ceiling: fires after its `for`
    threshold = rules.get("prompt_cost_per_token_ceiling").threshold  # type: ignore[union-attr]
    assert threshold == 1.0
    fired: list[str] = []
    for i in range(40):
        t = T0 + i * 60
        fired += [f.rule_id for f in ev.step(t + 60, [rec(t, window(t))])]
    assert "prompt_cost_per_token_ceiling" in fired
    # at $0.0100 of prefill a minute ($0.8333 per 1M) it stays quiet
    ev = RuleEvaluator(load_rules([p]))
    cheap = []
    for i in range(40):
        t = T0 + i * 60
        low = dataclasses.replace(window(t), prompt_usd=0.01)
        cheap += [f.rule_id for f in ev.step(t + 60, [rec(t, low)])]
    assert cheap == []


def test_the_documented_output_price_rule_loads(tmp_path: Path) -> None:
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump({"rules": [_readme_rule("output_cost_regression")]}))
    r = load_rules([p]).get("output_cost_regression")
    assert r is not None and r.signal == "usd_per_1m_output_tokens_decode" and r.factor == 1.3
