"""The fleet Prometheus rules: promtool validates them and runs their unit tests, and every series
they read is one the agent exports (the catalogue)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from agent.catalog import CATALOG, HISTOGRAMS

ROOT = Path(__file__).resolve().parent.parent
RULES_DIR = ROOT / "rules" / "prometheus"
RULES = RULES_DIR / "infercost.rules.yml"
RULE_TESTS = sorted((RULES_DIR / "tests").glob("*_test.yml"))


def promtool() -> str:
    """The promtool binary; CI installs it, so its absence is a failure, not a skip."""
    path = shutil.which("promtool")
    assert path, "promtool not found: apt-get install prometheus (CI's .ci/run does)"
    return path


def _rules() -> list[dict[str, object]]:
    doc = yaml.safe_load(RULES.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def test_promtool_check_rules() -> None:
    out = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in out.stdout


@pytest.mark.parametrize("test_file", RULE_TESTS, ids=lambda p: p.name)
def test_promtool_unit_tests(test_file: Path) -> None:
    out = subprocess.run(
        [promtool(), "test", "rules", test_file.name],
        capture_output=True,
        text=True,
        cwd=test_file.parent,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_rule_tests_exist() -> None:
    assert {p.name for p in RULE_TESTS} >= {
        "infercost_test.yml",
        "infercost_regression_test.yml",
        "infercost_class_test.yml",
        "infercost_class_cost_test.yml",
    }


def test_every_alert_is_tested() -> None:
    tested = set()
    for p in RULE_TESTS:
        for t in yaml.safe_load(p.read_text())["tests"]:
            tested |= {a["alertname"] for a in t.get("alert_rule_test", []) if a.get("exp_alerts")}
    alerts = {r["alert"] for r in _rules() if "alert" in r}
    assert alerts - tested == set(), "alerts without a firing test case"


def test_rules_read_only_catalogued_series() -> None:
    exported = {m.full_name for m in CATALOG}
    exported |= {h.full_name + s for h in HISTOGRAMS for s in ("", "_bucket", "_sum", "_count")}
    used = set(re.findall(r"\binfercost_[a-z0-9_]+", RULES.read_text()))
    # Recorded names embed "infercost_…" after a level prefix ("model:infercost_cost_usd:rate1h").
    recorded = {r["record"] for r in _rules() if "record" in r}
    inner = {n.split(":")[1] for n in recorded}
    assert used - exported - inner == set()


RUNBOOK_BASE = "https://github.com/example/infercost/blob/main/rules/prometheus/RUNBOOKS.md"


def test_alerts_carry_severity_for_summary_and_an_absolute_runbook() -> None:
    runbooks = (RULES_DIR / "RUNBOOKS.md").read_text()
    anchors = {m.lower() for m in re.findall(r"^## (\w+)$", runbooks, re.M)}
    for rule in _rules():
        if "alert" not in rule:
            continue
        name = rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning"}, name  # the common convention
        assert rule.get("for"), f"{name}: a `for:` duration keeps one bad scrape from alerting"
        assert "summary" in rule["annotations"], name
        # absolute (it ends up in Slack and PagerDuty), and the runbook has that section
        assert rule["annotations"]["runbook_url"] == f"{RUNBOOK_BASE}#{name.lower()}", name
        assert name.lower() in anchors, f"RUNBOOKS.md has no '## {name}' section"


def test_agent_down_covers_a_failing_and_a_missing_agent() -> None:
    exprs = [str(r["expr"]) for r in _rules() if r.get("alert") == "InfercostAgentDown"]
    assert any("== 0" in e and e.startswith("up{") for e in exprs)
    assert any(e.startswith("absent(up{") for e in exprs)


def test_seven_day_baselines_need_six_days_of_history() -> None:
    for rule in _rules():
        if "alert" in rule and "ratio_7d" in str(rule["expr"]):
            # the guard at the alert's own level (model:… or class:…)
            level = re.findall(r"(\w+):infercost_usd_per_1m_output_tokens:ratio_7d", str(rule["expr"]))
            guard = f"{level[0]}:infercost_history_hours:count7d >= 144"
            assert guard in str(rule["expr"]), rule["alert"]


def test_helm_chart_ships_the_same_rules() -> None:
    chart_copy = ROOT / "deploy" / "helm" / "infercost" / "files" / "infercost.rules.yml"
    assert chart_copy.read_text() == RULES.read_text(), "copy rules/prometheus/infercost.rules.yml there"


def test_promtool_rejects_a_broken_rule(tmp_path: Path) -> None:
    """The check above is meaningful: a typo'd expression makes promtool fail."""
    bad = tmp_path / "bad.yml"
    text = RULES.read_text()
    bad.write_text(text.replace("sum by (model, model_version) (rate(", "sum by (model (rate(", 1))
    out = subprocess.run([promtool(), "check", "rules", str(bad)], capture_output=True, text=True)
    assert out.returncode != 0


def test_recorded_series_referenced_are_defined() -> None:
    recorded = {r["record"] for r in _rules() if "record" in r}
    exprs = " ".join(str(r["expr"]) for r in _rules())
    referenced = set(re.findall(r"\b[a-z_]+:infercost_[a-z0-9_]+:[a-z0-9_]+\b", exprs))
    assert referenced, "the alert rules build on recorded series"
    assert referenced - recorded == set()
