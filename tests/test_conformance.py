"""The fast parser against prometheus_client on both public conformance suites.

The cases (``tests/fixtures/conformance/``, see ``SOURCE.json`` for the upstream commits and the
licences beside it): the OpenMetrics repository's ``tests/testdata/parsers`` and every input of
prometheus/client_python's ``tests/test_parser.py`` (text format) and
``tests/openmetrics/test_parser.py`` (OpenMetrics). Each case goes through the matching
prometheus_client parser and through ours, asked for every sample name prometheus_client found
(every name-like token on the page when prometheus_client refuses it). A case differs when one
refuses and the other does not, or when the samples (name, labels, value, timestamp) differ.

Every difference must be on the written list ``DIFFERENCES.yaml`` under a reason that says why it
is safe and which kind of difference it may be; a listed case that no longer differs fails too,
so the list stays exact.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_oracle
from prometheus_client.parser import text_string_to_metric_families as text_oracle

from agent.sources.engines.parser import FamilyParser, ParseError, parse

HERE = Path(__file__).parent / "fixtures" / "conformance"
_NAME_LIKE = re.compile(r'(?m)^[ \t]*([a-zA-Z_:][a-zA-Z0-9_:]*)|^[ \t]*\{[ \t]*"((?:[^"\\\n]|\\.)*)"')
Key = tuple[str, tuple[tuple[str, str], ...], object, object]


@dataclass(frozen=True)
class Case:
    """One conformance input."""

    id: str
    text: str
    openmetrics: bool  # which prometheus_client parser is the oracle, and our mode


def _cases() -> list[Case]:
    out = []
    for d in sorted((HERE / "openmetrics").iterdir()):
        spec = json.loads((d / "test.json").read_text())
        out.append(Case(f"om/{d.name}", (d / spec["file"]).read_bytes().decode("utf-8"), True))
    for stem, om in (("text", False), ("openmetrics", True)):
        doc = json.loads((HERE / "client_python" / f"{stem}_parser_inputs.json").read_text())
        out.extend(Case(f"cp-{stem}/{c['id']}", c["text"], om) for c in doc["cases"])
    return out


CASES = _cases()
ORACLE_VERSION = version("prometheus-client")
DIFFERENCES = yaml.safe_load((HERE / "DIFFERENCES.yaml").read_text())


def _key(name: str, labels: dict[str, str], value: float, ts: object) -> Key:
    # Normalisation "counter_total" (DIFFERENCES.yaml): compare names without "_total".
    v = "NaN" if math.isnan(value) else float(value)
    return (
        name.removesuffix("_total"),
        tuple(sorted(labels.items())),
        v,
        None if ts is None else round(float(ts), 6),
    )  # type: ignore[arg-type]


def oracle(case: Case) -> tuple[list[Key], set[str]] | str:
    """prometheus_client's samples and sample names, or its error."""
    try:
        keys, names = [], set()
        for fam in (om_oracle if case.openmetrics else text_oracle)(case.text):
            for s in fam.samples:
                if s.native_histogram is not None:  # normalisation "native_histogram"
                    continue
                names.update((s.name, s.name.removesuffix("_total")))
                keys.append(_key(s.name, s.labels, s.value, s.timestamp))
        return sorted(keys, key=repr), names
    except Exception as err:  # the oracle's refusal is what we compare
        return f"{type(err).__name__}: {err}"


def _read(parser: FamilyParser, case: Case) -> list[Key] | str:
    try:
        page = parser.parse(case.text, openmetrics=case.openmetrics)
    except ParseError as err:
        return f"ParseError: {err}"
    return sorted((_key(s.name, s.labels, s.value, s.timestamp) for v in page.values() for s in v), key=repr)


def ours(case: Case, names: Iterable[str]) -> list[Key] | str:
    """Our samples for ``names``, or our ParseError (anything else is a crash and fails). The
    page is read twice by one parser, as scrapes come: line by line, then from its layout where
    the first read kept one; both reads must agree."""
    parser = FamilyParser(names)
    first = _read(parser, case)
    assert _read(parser, case) == first, f"{case.id}: the second read differs from the first"
    return first


def difference(case: Case) -> str | None:
    """None when both agree, else the kind: accepted | rejected | samples."""
    theirs = oracle(case)
    if isinstance(theirs, str):
        asked = {a or b.replace('\\"', '"') for a, b in _NAME_LIKE.findall(case.text)}
        return "accepted" if not isinstance(ours(case, asked), str) else None
    keys, names = theirs
    mine = ours(case, names)
    if isinstance(mine, str):
        return "rejected"
    return None if mine == keys else "samples"


def _listed() -> dict[str, tuple[str, list[str]]]:
    """case id → (reason, allowed kinds)."""
    out: dict[str, tuple[str, list[str]]] = {}
    for reason, entry in DIFFERENCES["reasons"].items():
        for case_id in entry["cases"]:
            assert case_id not in out, f"{case_id} listed twice"
            out[case_id] = (reason, entry["kinds"])
    return out


def test_the_suites_are_all_there() -> None:
    source = json.loads((HERE / "SOURCE.json").read_text())
    assert set(source) >= {"prometheus/OpenMetrics", "prometheus/client_python"}
    assert all(len(v["commit"]) == 40 for k, v in source.items() if k.startswith("prometheus/"))
    assert (HERE / "LICENSE.OpenMetrics").is_file() and (HERE / "LICENSE.client_python").is_file()
    assert sum(c.id.startswith("om/") for c in CASES) == 211
    assert sum(c.id.startswith("cp-") for c in CASES) >= 290


def test_every_reason_says_why_it_is_safe() -> None:
    for reason, entry in DIFFERENCES["reasons"].items():
        assert len(entry["why"]) > 80, reason
        assert set(entry["kinds"]) <= {"accepted", "rejected", "samples"}, reason


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_agrees_with_prometheus_client_or_is_a_listed_difference(case: Case) -> None:
    got = difference(case)
    listed = _listed().get(case.id)
    if got is None:
        assert listed is None, f"{case.id} agrees now: remove it from DIFFERENCES.yaml ({listed})"
        return
    assert listed is not None, (
        f"{case.id}: unlisted difference ({got}) with prometheus_client {ORACLE_VERSION} "
        f"(DIFFERENCES.yaml was written against 0.26.0): {case.text[:300]!r}"
    )
    reason, kinds = listed
    assert got in kinds, f"{case.id}: a {got} difference, but reason {reason} allows {kinds}"


def test_the_issue_14_cases_are_read() -> None:
    """The lines once found refused or absent, each read as prometheus_client reads it."""
    page = parse('a_total 0 123 # {a="b"} 0.5\n', ["a_total"], openmetrics=True)
    assert page["a_total"][0].value == 0.0 and page["a_total"][0].timestamp == 123.0
    page = parse("a_total 0 123\n", ["a_total"])
    assert page["a_total"][0].timestamp == pytest.approx(0.123)
    page = parse('{"vllm:generation_tokens_total", model_name="m"} 7\n', ["vllm:generation_tokens_total"])
    assert page["vllm:generation_tokens_total"][0].labels == {"model_name": "m"}
    assert parse("b{,} 2\nc{ , } 3\n", ["b", "c"])["c"][0].value == 3.0
    assert parse("a 1 2 3\n", ["a"])["a"][0].value == 1.0
    assert parse("a\x00 1\na 2\n# HELP x \x00\n", ["a"])["a"][0].value == 2.0
    with pytest.raises(ParseError):
        parse("a\n", ["a"])
    assert parse("a 1\n# EOF\nb 2\n", ["a", "b"])["b"] == [("b", {}, 2.0, None)]  # text: a comment
    assert parse("a 1\n# EOF\nb 2\n", ["a", "b"], openmetrics=True) == {"a": [("a", {}, 1.0, None)]}
    twice = parse('a{x="1",y="2"} 8\nb 1\na{y="2", x="1"} 8\n', ["a"])["a"]  # one series, one value
    assert twice == [("a", {"y": "2", "x": "1"}, 8.0, None)]
    assert "a" not in parse('a{x="1",y="2"} 8\nb 1\na{y="2", x="1"} 5\n', ["a"])  # two values: none
