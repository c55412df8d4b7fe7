"""Rule regexes run in linear time (RE2) on bounded label values; what RE2 cannot run is refused by
``infercost check``, naming the file and the rule."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agent.detect.rules import RuleError, load_rules
from agent.safe_regex import MAX_SUBJECT_CHARS, UnsafeRegexError, compile_safe

RULE = {
    "id": "llama_only",
    "signal": "usd_per_1m_output_tokens",
    "over": "1m",
    "op": ">",
    "threshold": 1.0,
    "severity": "warning",
    "summary": "{model}",
}


@pytest.mark.parametrize(
    ("pattern", "value", "expected"),
    [
        ("llama-.*", "llama-3-70b", True),
        ("llama-.*", "xllama-3", False),  # a full match, not a search
        ("llama-[0-9]+", "llama-3-70b", False),
        ("(?i)QWEN.*", "qwen2-7b", True),
        (r"(a+)+$", "a" * 30, True),
        # the classic ReDoS subject: Python's re would backtrack 2^30 times here; RE2 is linear
        (r"(a+)+$", "a" * 30 + "!", False),
        (r"(a|aa)*b", "a" * 1000, False),
    ],
)
def test_linear_time_full_match(pattern: str, value: str, expected: bool) -> None:
    assert compile_safe(pattern).fullmatch(value) is expected


def test_values_over_the_limit_never_match() -> None:
    rx = compile_safe(".*")
    assert rx.fullmatch("m" * MAX_SUBJECT_CHARS) is True
    assert rx.fullmatch("m" * (MAX_SUBJECT_CHARS + 1)) is False
    assert rx.fullmatch("m" * 10_000_000) is False


@pytest.mark.parametrize(
    ("pattern", "needle"),
    [
        (r"(a+)\1", "cannot run in linear time"),  # backreference
        (r"llama(?=-3)", "cannot run in linear time"),  # lookahead
        (r"(?<!x)llama", "cannot run in linear time"),  # lookbehind
        ("(", "not a valid regular expression"),
        ("a" * 2000, "limit 1024"),
    ],
)
def test_refused_patterns_say_why(pattern: str, needle: str) -> None:
    with pytest.raises(UnsafeRegexError, match=re.escape(needle)):
        compile_safe(pattern)


def test_rule_file_with_a_backreference_is_refused_naming_the_rule(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text(yaml.safe_dump({"rules": [{**RULE, "match": {"model": r"(l+)\1"}}]}))
    with pytest.raises(RuleError) as err:
        load_rules([tmp_path])
    text = str(err.value)
    assert "r.yaml" in text and "rule 'llama_only'" in text and "match.model" in text
    assert "linear time" in text


def test_check_exits_2_naming_the_refused_rule(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "evil.yaml").write_text(
        yaml.safe_dump({"rules": [RULE, {**RULE, "id": "evil", "match": {"model": r"(?=x)(a+)+"}}]})
    )
    cfg = tmp_path / "node.yaml"
    cfg.write_text(yaml.safe_dump({"alerts": {"rules_dirs": [str(rules)]}}))
    out = subprocess.run(
        [sys.executable, "-m", "agent.cli", "check", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "evil.yaml" in out.stderr and "rule 'evil'" in out.stderr and "linear time" in out.stderr
    assert "Traceback" not in out.stderr
