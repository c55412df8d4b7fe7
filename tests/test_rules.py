"""Rule schema, loader and evaluator: values computed from 1-minute records (no I/O)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.detect.alerts import AlertManager
from agent.detect.evaluator import RuleEvaluator
from agent.detect.rules import RuleError, load_default_rules, load_rules, parse_duration, parse_rules
from agent.records import MinuteRecord, record_from_cost_window
from agent.samples import CostWindow, UsageWindow

MONDAY = 1699833600.0  # 2023-11-13 00:00 UTC, a Monday
LABELS = (("node", "n1"), ("engine", "vllm-a"), ("model", "llama"), ("model_version", "v1"))
PRICE_PER_MINUTE = 2.0 / 60.0  # dollars: a $2/h GPU


def rec(
    minute: float, tps: float, cost: float = PRICE_PER_MINUTE, labels: Any = LABELS, **gauges: float
) -> MinuteRecord:
    sums = {"seconds": 60.0, "generation_tokens": tps * 60.0, "prompt_tokens": 0.0, "cost_usd": cost}
    if tps == 0:
        sums["idle_usd"] = cost
    for name, v in gauges.items():
        sums[name + ".s"] = v * 60.0
        sums[name + ".w"] = 60.0
    return MinuteRecord("model", labels, minute, sums)


def rule(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": "r",
        "signal": "usd_per_1m_output_tokens",
        "op": ">",
        "severity": "warning",
        "summary": "s {value}",
    }
    base.update(kw)
    return base


def ruleset(tmp_path: Path, *rules: dict[str, Any]) -> Any:
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump({"rules": list(rules)}))
    return load_rules([p])


def test_default_rules_load_and_are_documented() -> None:
    rs = load_default_rules()
    ids = {r.id for r in rs}
    assert {
        "cost_per_token_regression",
        "cost_per_token_ceiling",
        "ttft_p99_high",
        "gpu_underutilised",
        "kv_cache_saturated",
        "idle_cost_budget",
        "engine_down",
        "nvml_down",
    } <= ids
    for r in rs:
        assert r.summary and r.description and r.runbook_url
    reg = rs.get("cost_per_token_regression")
    assert reg is not None and reg.factor is not None and reg.factor > 1.0 and reg.baseline is not None
    # compared like with like: a load band and a mix band of the model's own week
    assert reg.baseline.window == 7 * 86400 and reg.baseline.like_load is not None
    assert reg.baseline.like_mix is not None and reg.for_ == 1800


@pytest.mark.parametrize(
    ("item", "needle"),
    [
        (rule(signal="usd_per_token"), "unknown signal 'usd_per_token'"),
        (rule(threshold=1, colour="red"), "key 'colour': unknown key"),
        ({"id": "r", "signal": "engine_up", "op": "<", "threshold": 1, "summary": "x"}, "key 'severity'"),
        (rule(threshold=1, baseline={"window": "7d"}, factor=1.5), "exactly one of 'threshold'"),
        (rule(baseline={"window": "7d"}), "needs 'factor'"),
        (rule(threshold=1, **{"for": "15 minutes"}), "not a duration"),
        (rule(threshold=1, summary="{cost}"), "unknown placeholders ['cost']"),
        (rule(threshold=1, group_by=["gpu"]), "group_by ['gpu']"),
        (rule(threshold=1, where=[{"signal": "engine_up", "op": ">", "value": 0}]), "per engine"),
        (rule(threshold=1, match={"model": "("}), "not a valid regular expression"),
    ],
)
def test_bad_rule_names_file_rule_and_fix(tmp_path: Path, item: dict[str, Any], needle: str) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump({"rules": [item]}))
    with pytest.raises(RuleError) as err:
        load_rules([tmp_path])
    msg = str(err.value)
    assert str(p) in msg and "rule 'r'" in msg and "fix:" in msg and needle in msg, msg


def test_duplicate_ids_and_bad_yaml(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(yaml.safe_dump({"rules": [rule(threshold=1)]}))
    (tmp_path / "b.yaml").write_text(yaml.safe_dump({"rules": [rule(threshold=2)]}))
    with pytest.raises(RuleError, match=r"b\.yaml: rule 'r': the id is already used in .*a\.yaml"):
        load_rules([tmp_path])
    bad = tmp_path / "c.yml"
    bad.write_text("rules: [\n")
    with pytest.raises(RuleError, match=r"c\.yml: not valid YAML at line"):
        load_rules([bad])
    with pytest.raises(RuleError, match="top level"):
        parse_rules({"rule": []}, "x.yaml")


def test_durations() -> None:
    assert parse_duration("90s") == 90 and parse_duration("15m") == 900 and parse_duration("7d") == 604800
    assert parse_duration(30) == 30.0


def test_window_is_a_ratio_of_sums(tmp_path: Path) -> None:
    # minute 1: $1 for 1M tokens ($1/1M); minute 2: $1 for 0.25M tokens ($4/1M).
    # Ratio of sums over 2 minutes = $2 / 1.25M = $1.6/1M (a mean of ratios would say $2.5).
    rs = ruleset(tmp_path, rule(id="hi", threshold=2.0, over="2m"), rule(id="lo", threshold=1.5, over="2m"))
    ev = RuleEvaluator(rs)
    assert ev.step(MONDAY + 60, [rec(MONDAY, 1e6 / 60, cost=1.0)]) == []
    found = ev.step(MONDAY + 120, [rec(MONDAY + 60, 0.25e6 / 60, cost=1.0)])
    assert [f.rule_id for f in found] == ["lo"]
    assert found[0].value == pytest.approx(1.6)
    assert found[0].labels == LABELS and found[0].threshold == 1.5


def test_no_tokens_means_no_value(tmp_path: Path) -> None:
    ev = RuleEvaluator(ruleset(tmp_path, rule(threshold=0.0, over="1m")))
    assert ev.step(MONDAY + 60, [rec(MONDAY, 0.0)]) == []


def _diurnal(minute: float) -> float:
    hour = (minute - MONDAY) % 86400 / 3600
    return 100.0 if 8 <= hour < 20 else 10.0  # tokens/s: day and night


def test_like_load_baseline_ignores_nights_and_catches_a_regression(tmp_path: Path) -> None:
    literal = rule(
        id="literal", over="5m", baseline={"window": "7d", "min_minutes": 60}, factor=1.5, **{"for": "15m"}
    )
    like = rule(
        id="like",
        over="5m",
        factor=1.5,
        **{"for": "15m"},
        baseline={"window": "7d", "like_load": {"band_ratio": 2.0, "min_tokens_per_second": 1}},
    )
    rs = ruleset(tmp_path, literal, like)
    ev, am = RuleEvaluator(rs), AlertManager(rs)
    fired: dict[str, list[float]] = {"literal": [], "like": []}
    regression = (MONDAY + 8 * 86400 + 12 * 3600, MONDAY + 8 * 86400 + 14 * 3600)  # day 9, 12:00–14:00
    t = MONDAY
    while t < MONDAY + 9 * 86400:
        cost = PRICE_PER_MINUTE * (2.0 if regression[0] <= t < regression[1] else 1.0)
        for e in am.step(ev.step(t + 60, [rec(t, _diurnal(t), cost=cost)]), t + 60):
            if e.kind == "firing":
                fired[e.alert.rule_id].append(e.at)
        t += 60
    # The literal rule pages every night (cost per token is 10x higher at a tenth of the load) ...
    assert len(fired["literal"]) >= 7
    # ... the like-load rule once: pending after 3 doubled minutes (the 5m window is then 1.6x), firing
    # 15 minutes ("for") later.
    assert fired["like"] == [regression[0] + 18 * 60]


def test_like_load_rule_reports_baseline_and_change(tmp_path: Path) -> None:
    like = rule(over="1m", factor=1.5, baseline={"window": "1d", "min_minutes": 10, "like_load": {}})
    ev = RuleEvaluator(ruleset(tmp_path, like))
    t = MONDAY
    for _ in range(30):
        assert ev.step(t + 60, [rec(t, 100.0)]) == []
        t += 60
    (f,) = ev.step(t + 60, [rec(t, 100.0, cost=PRICE_PER_MINUTE * 2)])
    base = PRICE_PER_MINUTE / 6000 * 1e6
    assert f.baseline == pytest.approx(base) and f.value == pytest.approx(2 * base)
    assert f.threshold == pytest.approx(1.5 * base) and f.baseline_minutes == 30
    assert f.tokens_per_second == pytest.approx(100.0)


def test_baseline_spans_versions_so_a_deploy_is_compared_with_the_previous_one(tmp_path: Path) -> None:
    ev = RuleEvaluator(ruleset(tmp_path, rule(over="1m", factor=1.5, baseline={"min_minutes": 10})))
    v2 = (*LABELS[:3], ("model_version", "v2"))
    t = MONDAY
    for _ in range(20):
        ev.step(t + 60, [rec(t, 100.0)])
        t += 60
    (f,) = ev.step(t + 60, [rec(t, 100.0, cost=PRICE_PER_MINUTE * 2, labels=v2)])
    assert dict(f.labels)["model_version"] == "v2" and f.baseline_minutes == 20


def test_median_and_same_hour_of_week(tmp_path: Path) -> None:
    med = rule(id="med", over="1m", factor=1.2, baseline={"stat": "median", "min_minutes": 5})
    how = rule(
        id="how",
        over="1m",
        factor=1.2,
        baseline={"window": "14d", "same_hour_of_week": True, "min_minutes": 5},
    )
    ev = RuleEvaluator(ruleset(tmp_path, med, how))
    t = MONDAY
    # 10 minutes at 100 tok/s, then one outlier minute at 1 tok/s: the median ignores it.
    for i in range(11):
        ev.step(t + 60, [rec(t, 1.0 if i == 5 else 100.0)])
        t += 60
    (f,) = [f for f in ev.step(t + 60, [rec(t, 100.0, cost=PRICE_PER_MINUTE * 2)]) if f.rule_id == "med"]
    assert f.baseline == pytest.approx(PRICE_PER_MINUTE / 6000 * 1e6)
    # "how" has its baseline only from the same hour of the week: none yet for a new hour.
    t = MONDAY + 3600
    assert [
        f for f in ev.step(t + 60, [rec(t, 100.0, cost=PRICE_PER_MINUTE * 2)]) if f.rule_id == "how"
    ] == []


def test_group_by_sums_series_and_match_filters(tmp_path: Path) -> None:
    idle = rule(id="idle", signal="idle_cost_usd", over="1h", threshold=1.0, group_by=["node"])
    only = rule(
        id="only",
        signal="generation_tokens_per_second",
        over="1m",
        op="<",
        threshold=50,
        match={"model": "llama"},
    )
    ev = RuleEvaluator(ruleset(tmp_path, idle, only))
    other = (("node", "n1"), ("engine", "tgi"), ("model", "mistral"), ("model_version", "x"))
    t = MONDAY
    out = []
    for _ in range(20):  # two idle series at $1/h each: $2/h on the node, over budget after 30 min
        out = ev.step(t + 60, [rec(t, 0.0, cost=1 / 60), rec(t, 0.0, cost=1 / 60, labels=other)])
        t += 60
    assert [(f.rule_id, f.labels) for f in out] == [("only", LABELS)]
    for _ in range(11):
        out = ev.step(t + 60, [rec(t, 0.0, cost=1 / 60), rec(t, 0.0, cost=1 / 60, labels=other)])
        t += 60
    idle_f = [f for f in out if f.rule_id == "idle"]
    assert idle_f and idle_f[0].labels == (("node", "n1"),) and idle_f[0].value == pytest.approx(31 * 2 / 60)


def test_guards_and_other_kinds(tmp_path: Path) -> None:
    kv = rule(
        id="kv",
        signal="kv_cache_usage_ratio",
        over="1m",
        threshold=0.95,
        where=[{"signal": "preemptions_per_second", "op": ">", "value": 0}],
    )
    down = rule(id="down", signal="engine_up", over="2m", op="<", threshold=0.5)
    ev = RuleEvaluator(ruleset(tmp_path, kv, down))
    eng = MinuteRecord("engine", (("node", "n1"), ("engine", "vllm-a")), MONDAY, {"up.s": 0.0, "up.w": 12.0})
    full = rec(MONDAY, 100.0, kv=0.99)
    assert [f.rule_id for f in ev.step(MONDAY + 60, [full, eng])] == ["down"]
    sums = dict(rec(MONDAY + 60, 100.0, kv=0.99).sums, preemptions=3.0)
    found = ev.step(MONDAY + 120, [MinuteRecord("model", LABELS, MONDAY + 60, sums)])
    assert sorted(f.rule_id for f in found) == ["down", "kv"]  # engine window still holds minute 1


def test_record_from_cost_window() -> None:
    u = UsageWindow(
        "n1",
        "e",
        "m",
        "v1",
        MONDAY + 60,
        MONDAY + 120,
        prompt_tokens=10,
        generation_tokens=1000,
        gpu_seconds=60,
        energy_joules=None,
        gpu_util_ratio=0.5,
        ttft_p99_seconds=0.1,
    )
    r = record_from_cost_window(
        CostWindow(
            u, gpu_time_usd=0.05, energy_usd=0.01, usd_per_1m_output=60.0, usd_per_1m_total=59.4, idle_usd=0.0
        )
    )
    assert (
        r.minute == MONDAY + 60
        and r.kind == "model"
        and r.labels
        == (*LABELS[:0], ("node", "n1"), ("engine", "e"), ("model", "m"), ("model_version", "v1"))
    )
    assert r.sums["cost_usd"] == pytest.approx(0.06) and r.sums["gpu_util.s"] == pytest.approx(30.0)
    assert "power.s" not in r.sums and r.sums["energy_joules"] == 0.0


def test_baseline_holds_recent_minutes_back_so_a_regression_is_not_its_own_baseline() -> None:
    from agent.detect.baselines import TrailingBaseline

    def fn(v: Sequence[float]) -> float | None:
        return v[0] / v[1] if v[1] else None

    b = TrailingBaseline(3600 * 24, fn, 2, False, lag=1800)
    for i in range(120):  # two hours at 1.0
        b.add("k", i * 60.0, (1.0, 1.0), 1.0)
    for i in range(120, 150):  # then 30 minutes at 2.0
        b.add("k", i * 60.0, (2.0, 1.0), 2.0)
    value, n = b.mean("k", 150 * 60.0)
    assert value == 1.0 and n == 120  # the last 30 minutes are not in yet
    value, n = b.mean("k", 181 * 60.0)  # 31 minutes later they are
    assert n == 150 and value == (120 + 60) / 150


def test_a_template_with_a_format_spec_is_refused_at_load_time(tmp_path: Path) -> None:
    p = tmp_path / "r.yaml"
    rule = {"id": "x", "signal": "usd_per_1m_output_tokens", "op": ">", "threshold": 1, "severity": "warning",
            "summary": "cost is {value:.2f}"}  # fmt: skip
    p.write_text(yaml.safe_dump({"rules": [rule]}))
    with pytest.raises(RuleError, match="format spec"):
        load_rules([p])
