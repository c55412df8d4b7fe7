"""The family parser's messages, escapes, trie, ``# EOF`` and spellings, computed by hand
(each a behaviour a surviving mutant showed no test pinned)."""

from __future__ import annotations

import logging
import math
import re

import pytest

from agent.sources.engines.parser import (
    QUOTE_LIMIT,
    FamilyParser,
    ParseError,
    Sample,
    _cut_at_eof,
    _escape,
    _trie_pattern,
    parse,
    quote,
)


def test_quote_strips_and_cuts_at_the_limit() -> None:
    assert QUOTE_LIMIT == 200
    assert quote('  want{a="1"} x \n') == repr('want{a="1"} x')
    exact = "y" * 200
    assert quote(exact) == repr(exact)  # exactly at the limit: whole
    assert quote("z" * 250) == repr("z" * 200 + "…(+50 chars)")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("want 1_000", "invalid value '1_000' in line 'want 1_000'"),
        ("want notanumber", "invalid value 'notanumber' in line 'want notanumber'"),
        ("want 1 1_0", "invalid timestamp '1_0' in line 'want 1 1_0'"),
        ("want 1 NaN", "timestamp not finite in line 'want 1 NaN'"),
        ("want", "no value in line 'want'"),
        ("want {} ", "no value in line 'want{}'"),
        ('want{a="1",a="2"} 1', "duplicate label name 'a' in line 'want{a=\"1\",a=\"2\"} 1'"),
        ('want{a="unterminated} 1', "malformed labels in line 'want{a=\"unterminated} 1'"),
        ('want{a="1" 1', "unterminated labels in line 'want{a=\"1\" 1'"),
        ('want{a="x\\"y",a="z"} 1', 'duplicate label name \'a\' in line \'want{a="x\\\\"y",a="z"} 1\''),
        ('want{a="1"b="2"} # x', 'malformed labels in line \'want{a="1"b="2"} # x\''),
    ],
)
def test_malformed_wanted_lines_name_the_fault_and_quote_the_line(line: str, message: str) -> None:
    with pytest.raises(ParseError) as err:
        parse(f"{line}\n", {"want"})
    assert str(err.value) == message


def test_a_long_bad_line_is_quoted_cut() -> None:
    with pytest.raises(ParseError) as err:
        parse("want " + "x" * 300 + "\n", {"want"})
    line = "want " + "x" * 195 + "…(+105 chars)"
    assert str(err.value) == f"invalid value {'x' * 200 + '…(+100 chars)'!r} in line {line!r}"


def test_openmetrics_needs_a_blank_before_the_value() -> None:
    with pytest.raises(ParseError) as err:
        parse('want{a="1"}1\n', {"want"}, openmetrics=True)
    assert str(err.value) == "no blank before the value in line 'want{a=\"1\"}1'"
    assert parse('want{a="1"}1\n', {"want"})["want"][0].value == 1.0  # the text format lets it pass
    assert parse('want{a="1"}\t2\n', {"want"}, openmetrics=True)["want"][0].value == 2.0


def test_escape_writes_a_name_as_it_stands_between_quotes() -> None:
    assert _escape('a\\b\n"c') == 'a\\\\b\\n\\"c'
    assert _escape("plain") == "plain"


def test_quoted_names_with_escapes_are_read_in_page_order() -> None:
    text = 'plain 1\n{"we\\"ird", x="1"} 2\n  {"we\\"ird"} 3\nplain{y="2"} 4\n'
    page = parse(text, {"plain", 'we"ird'})
    assert page['we"ird'] == [Sample('we"ird', {"x": "1"}, 2.0, None), Sample('we"ird', {}, 3.0, None)]
    assert page["plain"] == [Sample("plain", {}, 1.0, None), Sample("plain", {"y": "2"}, 4.0, None)]


@pytest.mark.parametrize(
    ("text", "cut"),
    [
        ("\na 1\n# EOF\nb 2\n", "\na 1\n"),
        ("\na 1\n# EOF\n", "\na 1\n"),
        ("\na 1\n# EOF   \nb 2\n", "\na 1\n"),  # trailing blanks are still the end
        ("\na 1\n# EOFx\nb 2\n# EOF\nc 3\n", "\na 1\n# EOFx\nb 2\n"),  # "# EOFx" is not the end
        ("\na 1\n# EOF x\nb 2\n", "\na 1\n# EOF x\nb 2\n"),
        ("\na 1\nb 2\n", "\na 1\nb 2\n"),
        ("\n# EOF\nb 2\n", "\n"),  # the first line
        ("\na 1\n# EOFx\nb 2\n# EOF\nc 3\n# EOF\nd 4\n", "\na 1\n# EOFx\nb 2\n"),  # the first end
    ],
)
def test_cut_at_eof(text: str, cut: str) -> None:
    assert _cut_at_eof(text) == cut


def test_trie_pattern_matches_exactly_the_names() -> None:
    names = sorted(["a", "ab", "abc", "abd", "b", "ba:x", "c.d", "c_d_bucket"])
    rx = re.compile(_trie_pattern(names))
    assert [n for n in names if rx.fullmatch(n)] == names
    others = ["", "abcd", "ac", "aa", "bb", "ba", "ba:", "c", "cxd", "c_d", "c_d_bucke", "ab?", "a|b"]
    assert [n for n in others if rx.fullmatch(n)] == []
    assert re.fullmatch(_trie_pattern(["x"]), "x") and not re.fullmatch(_trie_pattern(["x"]), "xx")


def test_indented_lines_blanks_before_labels_exemplars_and_native_histograms() -> None:
    text = (
        'h_bucket{le="1"} 2 # {trace_id="a"} 0.5\n'
        '\th_bucket {le="+Inf"} 3\n'
        'h{le="x"} {count:3,sum:1,schema:0} 9\n'
        "h_count 3 # a comment\n"
    )
    page = parse(text, {"h"})
    assert page["h_bucket"] == [
        Sample("h_bucket", {"le": "1"}, 2.0, None),
        Sample("h_bucket", {"le": "+Inf"}, 3.0, None),
    ]
    assert "h" not in page  # the native histogram sample is skipped
    assert page["h_count"] == [Sample("h_count", {}, 3.0, None)]


def test_timestamps_are_milliseconds_in_text_and_seconds_in_openmetrics() -> None:
    assert parse("m 1 1500\n", {"m"})["m"][0].timestamp == 1.5
    assert parse("m 1 1500\n", {"m"}, openmetrics=True)["m"][0].timestamp == 1500.0
    assert parse("m 1 x 2000\n", {"m"})["m"][0].timestamp == 2.0  # the last token is the timestamp


def test_escaped_spellings_read_as_canonical_and_a_page_with_both_keeps_the_canonical(
    caplog: pytest.LogCaptureFixture,
) -> None:
    p = FamilyParser(["vllm:x", "plain"])
    assert p.parse("vllm_x_count 3\nplain 1\n") == {
        "vllm:x_count": [Sample("vllm:x_count", {}, 3.0, None)],
        "plain": [Sample("plain", {}, 1.0, None)],
    }
    caplog.set_level(logging.DEBUG, logger="agent.sources.engines.parser")
    both = p.parse("vllm_x_sum 9\nvllm:x_count 3\nvllm_x_count 4\n")
    assert both == {"vllm:x_count": [Sample("vllm:x_count", {}, 3.0, None)]}  # the escaped family is dropped
    assert [r.getMessage() for r in caplog.records] == [
        "both vllm:x_sum and vllm_x_sum on one page: reading vllm:x_sum",
        "both vllm:x_count and vllm_x_count on one page: reading vllm:x_count",
    ]


def test_values_as_written() -> None:
    page = parse('m{a="1"} -Inf\nm{a="2"} +Inf\nm{a="3"} 1e3\n', {"m"})
    assert [s.value for s in page["m"]] == [-math.inf, math.inf, 1000.0]


@pytest.mark.parametrize(
    ("text", "kept", "duplicates"),
    [
        # the same series whatever the label order, with another value: left out, named
        ('m{a="1",b="2"} 1\nm{b="2",a="1"} 2\nm{a="1"} 3\n', [({"a": "1"}, 3.0)], [{"b": "2", "a": "1"}]),
        ("m 4\nm 5\n", [], [{}]),
        # written twice with the same value (NaN too): one sample, nothing named
        ('m{a="1"} 7\nm{a="1"} 7\nm 2\n', [({"a": "1"}, 7.0), ({}, 2.0)], []),
        ("m NaN\nm NaN\n", [({}, math.nan)], []),
        # NaN then a number is two values
        ("m NaN\nm 1\nn 1\n", [], [{}]),
        ("m 1\nm NaN\n", [], [{}]),
        # several clashes: named in the order of their last lines, the rest of the family kept
        (
            'm{a="2"} 1\nm{a="1"} 1\nm{a="3"} 1\nm{a="1"} 2\nm{a="2"} 2\n',
            [({"a": "3"}, 1.0)],
            [{"a": "1"}, {"a": "2"}],
        ),
    ],
)
def test_a_series_written_twice_with_different_values_is_left_out_and_named(
    text: str, kept: list[tuple[dict[str, str], float]], duplicates: list[dict[str, str]]
) -> None:
    p = FamilyParser(["m"])
    for _ in range(2):  # the parser keeps nothing between pages
        page, named = p.read(text)
        got = [(s.labels, s.value) for s in page.get("m", [])]
        assert len(got) == len(kept)
        for (labels, value), (want_labels, want) in zip(got, kept, strict=True):
            assert labels == want_labels and (value == want or (math.isnan(value) and math.isnan(want)))
        assert [labels for _, labels in named] == duplicates
        assert all(name == "m" for name, _ in named)
    assert p.read("m 1\n").duplicates == ()  # each page names its own


def test_a_repeated_line_agreeing_then_disagreeing() -> None:
    p = FamilyParser(["m"])
    assert p.parse("m 1\nm 1\n") == {"m": [Sample("m", {}, 1.0, None)]}
    assert p.read("m 1\nm 2\n") == ({}, (("m", {}),))


def test_a_duplicate_of_the_escaped_spelling_is_named_canonically() -> None:
    p = FamilyParser(["vllm:x"])
    assert p.read("vllm_x 1\nvllm_x 2\n") == ({}, (("vllm:x", {}),))


def test_a_series_read_again_follows_the_same_rules() -> None:
    p = FamilyParser(["m"])
    first = p.parse('m{a="1"} 1\n')
    again = p.parse('m{a="1"} 3 # {trace_id="x"} 0.5\nm{a="1"}3\n')  # an exemplar, no blank
    assert first == {"m": [Sample("m", {"a": "1"}, 1.0, None)]}
    assert again == {"m": [Sample("m", {"a": "1"}, 3.0, None)]}
    with pytest.raises(ParseError, match="no blank before the value"):
        p.parse('m{a="1"}4\n', openmetrics=True)  # OpenMetrics wants the blank
    assert p.parse('m{a="1"} 5 # {t="y"} 1\n')["m"][0].value == 5.0
    assert p.parse('m{a="1"} 6\n')["m"][0].value == 6.0


def test_underscores_in_a_number_are_refused_even_where_float_takes_them() -> None:
    with pytest.raises(ParseError) as err:
        parse("want 1_0\n", {"want"})
    assert str(err.value) == "invalid value '1_0' in line 'want 1_0'"
    with pytest.raises(ParseError) as err:
        parse('want{a="1"} 2 1_000\n', {"want"})
    assert str(err.value) == "invalid timestamp '1_000' in line 'want{a=\"1\"} 2 1_000'"


def test_blanks_before_labels_and_a_label_value_with_a_brace() -> None:
    page = parse('m  {a="x{y}"} 1\nm\t{b="z"} 2 3000\n', {"m"})
    assert page["m"] == [Sample("m", {"a": "x{y}"}, 1.0, None), Sample("m", {"b": "z"}, 2.0, 3.0)]


# A page read again with new values, blanks, timestamps, exemplars or native histograms:
# hand-computed samples for each way a page can change between scrapes.
PAGE = 'a{x="1"} 8\nb 2\n# HELP c x\na{x="2"} 3\na{x="3"} 5\n'


def test_a_page_read_again_reads_its_new_values() -> None:
    p = FamilyParser(["a", "b"])
    first = p.parse(PAGE)
    assert first == {
        "a": [
            Sample("a", {"x": "1"}, 8.0, None),
            Sample("a", {"x": "2"}, 3.0, None),
            Sample("a", {"x": "3"}, 5.0, None),
        ],
        "b": [Sample("b", {}, 2.0, None)],
    }
    again = p.parse('a{x="1"} 9\nb\t-4.5e1\r\n# HELP c x\na{x="2"} NaN\na{x="3"} +Inf\n')
    assert again["a"][0] == Sample("a", {"x": "1"}, 9.0, None)
    assert again["a"][1].value != again["a"][1].value  # NaN
    assert again["a"][2] == Sample("a", {"x": "3"}, math.inf, None)
    assert again["b"] == [Sample("b", {}, -45.0, None)]
    assert list(again) == ["a", "b"] and len(again["a"]) == 3


def test_a_page_read_again_with_a_tail_that_is_more_than_a_value() -> None:
    p = FamilyParser(["a", "b"])
    p.parse(PAGE)
    page = p.parse('a{x="1"} 8\nb 2 3000\n# HELP c x\na{x="2"} 3\na{x="3"} 5\n')
    assert page["b"] == [Sample("b", {}, 2.0, 3.0)]  # a timestamp, in seconds
    with pytest.raises(ParseError) as err:
        p.parse('a{x="1"} 8\nb 1_000\n# HELP c x\na{x="2"} 3\na{x="3"} 5\n')
    assert str(err.value) == "invalid value '1_000' in line 'b 1_000'"
    page = p.parse('a{x="1"} 8\nb 2 # {t="x"} 1\n# HELP c x\na{x="2"} 3\na{x="3"} 5\n')
    assert page["b"] == [Sample("b", {}, 2.0, None)]  # an exemplar: ignored


def test_an_exemplar_with_braces_is_not_read_as_labels() -> None:
    # The common shape's head runs to the last "}" before a blank: here the exemplar's. Read line
    # by line, the value is 1, not the exemplar's 0.5, however often the page comes back.
    p = FamilyParser(["a_total"])
    for _ in range(3):
        page = p.parse('a_total{x="1"} 1 # {t="z"} 0.5\n')
        assert page == {"a_total": [Sample("a_total", {"x": "1"}, 1.0, None)]}
    page = p.parse('a_total {x="1"} 7\n')  # blanks before the labels: the head is the name alone
    assert page == {"a_total": [Sample("a_total", {"x": "1"}, 7.0, None)]}
    assert p.parse('a_total {x="1"} 8\n')["a_total"][0].value == 8.0


def test_a_native_histogram_line_among_classic_buckets_is_skipped() -> None:
    p = FamilyParser(["h"])
    text = 'h_bucket{le="1"} 2\nh{a="b"} {count:2,sum:1,schema:0}\nh_bucket{le="+Inf"} 3\n'
    for _ in range(2):
        assert p.parse(text) == {
            "h_bucket": [
                Sample("h_bucket", {"le": "1"}, 2.0, None),
                Sample("h_bucket", {"le": "+Inf"}, 3.0, None),
            ]
        }


def test_two_engines_alternating_each_read_their_own_page() -> None:
    p = FamilyParser(["a", "b"])
    one, two = 'a{m="p"} %s\nb 1\n', 'b 2\na{m="q"} %s\n'
    for v in (1, 2):
        assert p.parse(one % v) == {
            "a": [Sample("a", {"m": "p"}, v, None)],
            "b": [Sample("b", {}, 1.0, None)],
        }
        assert p.parse(two % (v * 10)) == {
            "b": [Sample("b", {}, 2.0, None)],
            "a": [Sample("a", {"m": "q"}, v * 10, None)],
        }


def test_a_page_read_again_keeps_the_canonical_spelling() -> None:
    p = FamilyParser(["vllm:x", "vllm:y"])
    text = 'vllm_x{m="a"} %s\nvllm:y %s\nvllm_y 3\n'
    for v in (1, 2):
        page = p.parse(text % (v, v + 1))
        assert page == {
            "vllm:x": [Sample("vllm:x", {"m": "a"}, float(v), None)],
            "vllm:y": [Sample("vllm:y", {}, float(v + 1), None)],  # the escaped spelling dropped
        }


def test_a_parser_asked_for_nothing_reads_nothing_even_an_empty_quoted_name() -> None:
    p = FamilyParser([])
    assert p.parse('{""} 1\n{"", a="b"} 2\nx 3\n') == {}


def test_read_reads_the_text_format_by_default() -> None:
    # the text format: "# EOF" is a comment, so the line after it is read
    p = FamilyParser(["t_x", "t_y"])
    assert p.read("t_x 5\n# EOF\nt_y 7\n") == (
        {"t_x": [Sample("t_x", {}, 5.0, None)], "t_y": [Sample("t_y", {}, 7.0, None)]},
        (),
    )
    assert p.read("t_x 5\n# EOF\nt_y 7\n", openmetrics=True).page == {"t_x": [Sample("t_x", {}, 5.0, None)]}


def test_a_quoted_name_s_bad_value_is_quoted_as_written_unquoted() -> None:
    with pytest.raises(ParseError) as err:
        parse('{"want"} x\n', {"want"})
    assert str(err.value) == "invalid value 'x' in line 'want x'"


def test_only_blanks_and_tabs_may_stand_before_the_labels() -> None:
    # a carriage return is no blank: the braces read as a native histogram's, and the line is skipped
    assert parse('m\r{a="1"} 1\n', {"m"}) == {}
    with pytest.raises(ParseError) as err:  # nor is any other character
        parse('m X{a="1"} 1\n', {"m"})
    assert str(err.value) == "invalid value 'X{a=\"1\"}' in line 'm X{a=\"1\"} 1'"
    assert parse('m \t{a="1"} 1\n', {"m"}) == {"m": [Sample("m", {"a": "1"}, 1.0, None)]}


def _histogram_lines(model: str, buckets: int, le_start: int = 0) -> str:
    """``buckets`` bucket lines of one series of vllm:e2e_request_latency_seconds (bounds 0, 1, …)."""
    name = "vllm:e2e_request_latency_seconds_bucket"
    return "".join(f'{name}{{model_name="{model}",le="{le_start + i}"}} {i}\n' for i in range(buckets))


def test_the_bucket_limit_counts_per_series_and_names_the_one_past_it() -> None:
    from agent.sources.engines.parser import PageRefused

    p = FamilyParser(["vllm:e2e_request_latency_seconds"])
    most = 3
    # exactly the limit in each of two series: more bucket lines than the limit on the page, none
    # refused (the limit is per series, counted from the lines seen before the page passed it)
    ok = _histogram_lines("a", most) + _histogram_lines("b", most) + _histogram_lines("c", most)
    page = p.read(ok, max_buckets=most).page
    assert len(page["vllm:e2e_request_latency_seconds_bucket"]) == 3 * most
    # no limit: any number
    assert (
        len(
            p.read(_histogram_lines("a", 50), max_buckets=None).page[
                "vllm:e2e_request_latency_seconds_bucket"
            ]
        )
        == 50
    )
    # one bucket past it in the first series, after the page already passed the limit in total
    over = ok + _histogram_lines("a", 1, le_start=most)
    with pytest.raises(PageRefused) as refused:
        p.read(over, max_buckets=most)
    msg = str(refused.value)
    assert 'vllm:e2e_request_latency_seconds_bucket{model_name="a"}' in msg
    assert f"more than {most} buckets" in msg and "limits.max_histogram_buckets" in msg
    # a long label value is cut in the message
    long = _histogram_lines("m" * 500, most + 1)
    with pytest.raises(PageRefused) as cut:
        p.read(long, max_buckets=most)
    assert "m" * 60 in str(cut.value) and "m" * 61 not in str(cut.value)
    # samples without an le label never count as buckets
    plain = "".join(f'vllm:e2e_request_latency_seconds_count{{model_name="x{i}"}} 1\n' for i in range(10))
    assert len(p.read(plain, max_buckets=1).page["vllm:e2e_request_latency_seconds_count"]) == 10


def _fed(p: FamilyParser, pieces: list[str], openmetrics: bool = False) -> object:
    reader = p.reader(openmetrics)
    for piece in pieces:
        reader.feed(piece)
    return reader.finish()


def test_a_page_fed_in_pieces_reads_as_the_whole_page() -> None:
    from agent.sources.engines.parser import PageRefused

    p = FamilyParser(["m", "n"])
    lines = ["m 1\n", 'n{a="x"} 2 5000\n', "m 1\n", 'n{a="x"} 3\n', 'n{a="y"} 4\n', "m 1\n"]
    whole = "".join(lines)
    # a series repeated with the same value across pieces is one sample; with another value it is
    # named, in the order of its last line, as when the page is read whole
    assert (
        _fed(p, lines)
        == p.read(whole)
        == (
            {"n": [Sample("n", {"a": "y"}, 4.0, None)], "m": [Sample("m", {}, 1.0, None)]},
            (("n", {"a": "x"}),),
        )
    )
    assert _fed(p, ["m 1\n", "m 2"]) == ({}, (("m", {}),))
    # OpenMetrics: nothing after the # EOF of a middle piece is read, in that piece or a later one
    om = ["m 1\n", "n 2\n# EOF\nm 5\n", "n 7\n"]
    assert _fed(p, om, openmetrics=True) == (
        {"m": [Sample("m", {}, 1.0, None)], "n": [Sample("n", {}, 2.0, None)]},
        (),
    )
    assert _fed(p, om) == ({}, (("m", {}), ("n", {})))  # the text format reads on: both written twice
    # the bucket limit counts over pieces
    buckets = p.reader(max_buckets=2)
    buckets.feed('m_bucket{le="1"} 1\nm_bucket{le="2"} 1\n')
    with pytest.raises(PageRefused):
        buckets.feed('m_bucket{le="3"} 1\n')
