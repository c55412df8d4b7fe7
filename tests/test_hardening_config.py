"""Config that says what it does: a duration no store can ever evaluate is refused by ``infercost
check`` and at start-up (exit 2, naming the file, the rule, the key and the fix), and a price book
whose GPU prices only start in the future is a warning naming the entry."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.config import MAX_RETENTION_DAYS, ConfigError, parse_config
from agent.detect.rules import MAX_DURATION_SECONDS, RuleError, parse_rules
from agent.sources.prices import not_yet_priced, parse_price_book

ROOT = Path(__file__).resolve().parents[1]
RULE: dict[str, Any] = {
    "id": "slow",
    "signal": "usd_per_1m_output_tokens",
    "op": ">",
    "threshold": 1.0,
    "severity": "warning",
    "summary": "x",
}
NOW = dt.datetime(2026, 12, 1, 12, tzinfo=dt.UTC).timestamp()


def _rule(**kw: Any) -> dict[str, Any]:
    return {"rules": [{**RULE, **kw}]}


@pytest.mark.parametrize(
    ("where", "value", "message"),
    [
        ("for", "99999999999999999999d", "longer than the store can ever hold"),
        ("for", "3651d", "longer than the store can ever hold"),
        ("for", "522w", "longer than the store can ever hold"),
        ("keep_firing_for", 1e300, "longer than the store can ever hold"),
        ("over", "87601h", "longer than the store can ever hold"),
        ("baseline.window", "10000d", "longer than the store can ever hold"),
        ("baseline.exclude_recent", "99999999w", "longer than the store can ever hold"),
        ("baseline.min_age", "4000d", "longer than the store can ever hold"),
        ("for", float("inf"), "is not a duration"),  # YAML's .inf
        ("for", float("nan"), "is not a duration"),  # YAML's .nan
    ],
)
def test_a_duration_beyond_the_longest_retention_is_refused_naming_file_rule_key_and_fix(
    where: str, value: Any, message: str
) -> None:
    kw: dict[str, Any] = {}
    if where.startswith("baseline."):
        kw = {"op": ">", "threshold": None, "factor": 1.5, "baseline": {where.split(".")[1]: value}}
    else:
        kw = {where: value}
    with pytest.raises(RuleError) as err:
        parse_rules(_rule(**kw), "rules/slow.yaml")
    text = str(err.value)
    assert text.startswith(f"rules/slow.yaml: rule 'slow': key '{where}': "), text
    assert message in text and "; fix: " in text, text


def test_the_longest_duration_still_loads_and_the_bound_is_the_store_retention_bound() -> None:
    assert MAX_DURATION_SECONDS == MAX_RETENTION_DAYS * 86400
    (r,) = parse_rules(_rule(**{"for": f"{MAX_RETENTION_DAYS}d", "keep_firing_for": "1w"}), "r.yaml")
    assert r.for_ == MAX_DURATION_SECONDS and r.keep_firing_for == 7 * 86400
    with pytest.raises(ConfigError, match=r"store\.retention_days"):
        parse_config({"store": {"retention_days": MAX_RETENTION_DAYS + 1}}, "node.yaml")


def _write(tmp_path: Path, book: dict[str, Any] | None = None, rule: dict[str, Any] | None = None) -> Path:
    doc: dict[str, Any] = {
        "state_dir": str(tmp_path / "state"),
        "exporters": {"prometheus": {"enabled": False}},
        "nvml": {"backend": "fake", "fake_count": 1},
        "engines": [{"name": "e", "url": "http://127.0.0.1:9/metrics"}],  # nothing listens there
    }
    if book is not None:
        (tmp_path / "prices.yaml").write_text(yaml.safe_dump(book))
        doc["prices"] = {"book": str(tmp_path / "prices.yaml")}
    if rule is not None:
        (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule))
        doc["alerts"] = {"rules_dirs": [str(tmp_path / "rules.yaml")]}
    cfg = tmp_path / "node.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    return cfg


def _infercost(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )


@pytest.mark.parametrize("command", ["check", "run"])
def test_check_and_start_up_exit_2_on_a_for_no_store_can_hold(tmp_path: Path, command: str) -> None:
    cfg = _write(tmp_path, rule=_rule(**{"for": "99999999999999999999d"}))
    p = _infercost(command, "--config", str(cfg))
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert (
        f"{tmp_path / 'rules.yaml'}: rule 'slow': key 'for': '99999999999999999999d' is longer than "
        f"the store can ever hold ({MAX_RETENTION_DAYS}d, store.retention_days at its maximum)"
    ) in p.stderr
    assert f"fix: write a duration of at most {MAX_RETENTION_DAYS}d" in p.stderr
    assert "Traceback" not in p.stderr


def test_check_warns_on_a_price_book_with_no_price_in_effect_now(tmp_path: Path) -> None:
    future = {"gpus": [{"match": "H100", "usd_per_hour": 2.5, "effective_from": "2099-01-01"}]}
    p = _infercost("check", "--config", str(_write(tmp_path, book=future)))
    assert p.returncode == 0, p.stderr  # a warning: the book is valid, only not in effect yet
    (line,) = [ln for ln in p.stderr.splitlines() if "WARNING" in ln]
    assert f"{tmp_path / 'prices.yaml'}: no GPU price is in effect now" in line
    assert "gpus[0] (match 'H100'), takes effect on 2099-01-01" in line and "fix: " in line


def test_each_gpu_model_priced_only_from_the_future_is_named() -> None:
    book = parse_price_book(
        {
            "gpus": [
                {"match": "H100", "usd_per_hour": 2.0},
                {"match": "H100", "usd_per_hour": 1.8, "effective_from": "2027-01-01"},  # a cut ahead
                {"match": "A100", "usd_per_hour": 1.2, "effective_from": "2026-01-01"},
                {"match": "L40S", "usd_per_hour": 0.9, "effective_from": "2027-06-01"},
                {"match": "l40s", "usd_per_hour": 0.8, "effective_from": "2028-01-01"},
            ]
        },
        "prices.yaml",
    )
    (warning,) = not_yet_priced(book, NOW)
    assert warning.startswith("prices.yaml: gpus[3] (match 'L40S') takes effect on 2027-06-01")
    assert not_yet_priced(book, dt.datetime(2027, 7, 1, tzinfo=dt.UTC).timestamp()) == []
    assert not_yet_priced(parse_price_book({"gpus": []}, "empty.yaml"), NOW) == []
