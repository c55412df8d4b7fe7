"""The fast family parser against its oracle, prometheus_client's text parser.

For the wanted families, both must produce the same samples (name, labels, value, timestamp) on
every recorded exposition and on generated vLLM pages; the edge cases of the format are checked
line by line.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.sources.engines import ADAPTERS
from agent.sources.engines.parser import FamilyParser, ParseError, expand_families, parse
from infercost_sim.pagegen import make_vllm_page

FIXTURES = Path(__file__).parent / "fixtures" / "expositions"
REFERENCE = Path("/work/shared/reference/expositions")  # the project's shared captures, when present
PAGES = sorted(FIXTURES.glob("*.txt")) + (sorted(REFERENCE.glob("*.txt")) if REFERENCE.is_dir() else [])

_SAMPLE_LINE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*(\{.*\})?[ \t]+\S+")


def _exposition_only(text: str) -> str:
    """The recorded pages quote a shell prompt or '...' here and there; the oracle would choke."""
    keep = [ln for ln in text.splitlines() if not ln.strip() or ln.startswith("#") or _SAMPLE_LINE.match(ln)]
    return "\n".join(keep) + "\n"


def _key(name: str, labels: dict[str, str], value: float, ts: float | None) -> tuple[object, ...]:
    # prometheus_client renames the samples of a counter declared without "_total" (TGI's
    # tgi_request_count becomes tgi_request_count_total); compare names without that suffix.
    return (
        name.removesuffix("_total"),
        tuple(sorted(labels.items())),
        "NaN" if math.isnan(value) else float(value),
        ts,
    )


def _oracle(text: str, families: set[str]) -> list[tuple[object, ...]]:
    names = expand_families(families)
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in names or s.name.removesuffix("_total") in names:
                ts = None if s.timestamp is None else float(s.timestamp)
                out.append(_key(s.name, s.labels, s.value, ts))
    return sorted(out, key=repr)


def _ours(text: str, families: set[str]) -> list[tuple[object, ...]]:
    page = parse(text, families)
    return sorted((_key(s.name, s.labels, s.value, s.timestamp) for v in page.values() for s in v), key=repr)


def _all_families(text: str) -> set[str]:
    """Every sample name on the page, as a family (so nothing is skipped)."""
    return {m.group(0) for m in re.finditer(r"(?m)^[a-zA-Z_:][a-zA-Z0-9_:]*", text)}


@pytest.mark.parametrize("path", PAGES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_identical_to_prometheus_client_on_recorded_pages(path: Path) -> None:
    text = _exposition_only(path.read_text())
    for families in [_all_families(text), *(set(a.families) for a in ADAPTERS.values())]:
        expected = _oracle(text, families)
        assert _ours(text, families) == expected
    if path.parent == FIXTURES:
        assert _ours(text, _all_families(text))  # our fixtures are real pages, not only comments


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_identical_to_prometheus_client_on_generated_vllm_pages(seed: int) -> None:
    models = ["meta-llama/Llama-3.1-70B-Instruct", 'od"d\\name', "multi\nline,x=y}", "Qwen/Qwen2.5-7B"]
    text = make_vllm_page(models[: seed + 2], seed=seed, engines=2)
    for families in (_all_families(text), set(ADAPTERS["vllm"].families)):
        expected = _oracle(text, families)
        assert expected
        assert _ours(text, families) == expected


def test_generated_page_is_about_100_kb_and_deterministic() -> None:
    page = make_vllm_page(["a/model", "b/model"], seed=3)
    assert 80_000 < len(page.encode()) < 130_000
    assert page == make_vllm_page(["a/model", "b/model"], seed=3)
    assert page != make_vllm_page(["a/model", "b/model"], seed=4)


EDGE_PAGE = r"""# HELP m_total A counter.
# TYPE m_total counter
m_total{a="x\"y",b="back\\slash",c="new\nline",d="keep\tas-is"} 1.5e+03
m_total{a="spaces" , b = "around" ,} 2 1700000000123
m_created{a="x"} 1.7e9
m_total 7
  m_total{a="indented"} -Inf
m_total{a="nan"} NaN
m_total{a="inf"} +Inf
m_total{a="exp"} -1.25E-2
m_totalx{a="not wanted"} 9
h_bucket{le="0.5"} 1
h_bucket{le="+Inf"} 3
h_sum 4.25
h_count 3
# EOF
m_total{a="after eof"} 1
"""


def test_edge_cases_of_the_text_format() -> None:
    page = parse(EDGE_PAGE, {"m_total", "h"})
    m = page["m_total"]
    assert m[0].labels == {"a": 'x"y', "b": "back\\slash", "c": "new\nline", "d": "keep\\tas-is"}
    assert m[0].value == 1500.0
    assert m[1].labels == {"a": "spaces", "b": "around"}
    assert m[1].timestamp == pytest.approx(1_700_000_000.123)
    assert m[2].labels == {} and m[2].value == 7.0
    assert m[3].labels == {"a": "indented"} and m[3].value == -math.inf
    assert math.isnan(m[4].value)
    assert m[5].value == math.inf
    assert m[6].value == -0.0125
    assert m[7].labels == {"a": "after eof"}  # the text format: "# EOF" is a comment
    assert len(m) == 8  # not m_created, not m_totalx
    om = parse(EDGE_PAGE, {"m_total", "h"}, openmetrics=True)["m_total"]
    assert len(om) == 7  # OpenMetrics: nothing after # EOF
    assert om[1].timestamp == 1_700_000_000_123.0  # OpenMetrics timestamps are seconds
    assert [s.labels["le"] for s in page["h_bucket"]] == ["0.5", "+Inf"]
    assert page["h_sum"][0].value == 4.25 and page["h_count"][0].value == 3.0
    assert "m_created" not in page


def test_edge_page_matches_oracle() -> None:
    text = EDGE_PAGE.split("# EOF")[0]
    assert _ours(text, {"m_total", "h"}) == _oracle(text, {"m_total", "h"})


def test_crlf_line_endings() -> None:
    page = parse('a{x="1"} 2\r\nb 3\r\n', {"a", "b"})
    assert page["a"][0].value == 2.0 and page["b"][0].value == 3.0


@pytest.mark.parametrize(
    "line",
    [
        'want{a="unterminated} 1',
        "want{a=unquoted} 1",
        "want 1_000",
        "want notanumber",
        'want{a="1",a="2"} 1',
        "want {} ",
        "want",
        'want{a="1"} ',
        'want{a="1"b="2"} 1',
        'want{-a="1"} 1',
        'want{a="1"-} 1',
        "want 1 NaN",
        "want 1 1_0",
    ],
)
def test_malformed_wanted_line_raises(line: str) -> None:
    with pytest.raises(ParseError):
        parse(f"# TYPE want gauge\n{line}\n", {"want"})


def test_malformed_unwanted_lines_are_never_read() -> None:
    text = 'other{a="unterminated} 1\n<html>\n{"json": 1}\nwant 4\n'
    assert parse(text, {"want"})["want"][0].value == 4.0


def test_no_wanted_family_gives_an_empty_page() -> None:
    assert FamilyParser([]).parse("a 1\n") == {}
    assert parse("", {"a"}) == {}
