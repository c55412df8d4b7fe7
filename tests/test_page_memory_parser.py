"""What the page reader keeps while a page is read, as behaviour: one string object per distinct
label name and value, a series whatever its label order, its last reading, and the duplicates in
the order of their last lines (each a behaviour of the compact reading that a mutant could break)."""

from __future__ import annotations

import pytest

from agent.sources.engines.parser import FamilyParser, PageRefused, ParseError, Sample


def test_label_names_and_values_are_one_object_each_on_the_page() -> None:
    # each line's strings are cut out of the text as new objects; the samples share one per distinct
    # string (names of more than one character: CPython keeps one object of each 1-character string)
    text = "".join(
        f'm_bucket{{model_name="lora",le="{i}"}} {i}\nm_bucket{{model_name="base",le="{i}"}} 0\n'
        for i in range(6)
    )
    samples = FamilyParser(["m"]).parse(text)["m_bucket"]
    assert [s.labels for s in samples[:3]] == [
        {"model_name": "lora", "le": "0"},
        {"model_name": "base", "le": "0"},
        {"model_name": "lora", "le": "1"},
    ]
    assert len(samples) == 12
    assert len({id(s.labels["model_name"]) for s in samples}) == 2  # lora, base
    assert len({id(s.labels["le"]) for s in samples}) == 6
    assert len({id(k) for s in samples for k in s.labels}) == 2  # model_name, le


@pytest.mark.parametrize(
    ("text", "kept", "duplicates"),
    [
        # a series clashing, then another, then the first again with its last value: the first's
        # last line is the last, so it is named last
        (
            'm{a="1"} 1\nm{a="1"} 2\nm{a="2"} 1\nm{a="2"} 2\nm{a="1"} 2\nm{a="3"} 0\n',
            [({"a": "3"}, 0.0)],
            [{"a": "2"}, {"a": "1"}],
        ),
        # three labels in any order are one series
        (
            'm{c="3",a="1",b="2"} 1\nm{b="2",c="3",a="1"} 1\nm{a="1",b="2",c="3"} 5\n',
            [],
            [{"a": "1", "b": "2", "c": "3"}],
        ),
    ],
)
def test_duplicates_are_named_in_the_order_of_their_last_lines(
    text: str, kept: list[tuple[dict[str, str], float]], duplicates: list[dict[str, str]]
) -> None:
    page, named = FamilyParser(["m"]).read(text)
    assert [(s.labels, s.value) for s in page.get("m", [])] == kept
    assert [labels for _, labels in named] == duplicates


def test_a_series_keeps_its_last_timestamp_and_clashes_by_value_not_timestamp() -> None:
    p = FamilyParser(["m", "n"])
    # the same value again: one sample, the last line's timestamp (or none)
    page, named = p.read("m 7 1000\nm 7 2000\nn 7 1000\nn 7\n")
    assert page == {"m": [Sample("m", {}, 7.0, 2.0)], "n": [Sample("n", {}, 7.0, None)]} and named == ()
    page, named = p.read("m 7\nm 7 3000\n")
    assert page == {"m": [Sample("m", {}, 7.0, 3.0)]} and named == ()
    # another value at the same timestamp: written twice
    assert p.read("m 7 1000\nm 8 1000\n") == ({}, (("m", {}),))


def test_samples_keep_page_order_with_repeats() -> None:
    text = 'm{a="2"} 1\nm{a="1"} 1\nm{a="3"} 1\nm{a="2"} 1\nm 0\n'
    got = [s.labels for s in FamilyParser(["m"]).parse(text)["m"]]
    assert got == [{"a": "2"}, {"a": "1"}, {"a": "3"}, {}]


@pytest.mark.parametrize(
    "line",
    ['m{a="1",b="2",a="3"} 1', 'm{b="1",a="2",b="3"} 1', 'm{"a"="1",c="2",a="3"} 1'],
)
def test_a_label_name_written_twice_apart_is_refused(line: str) -> None:
    with pytest.raises(ParseError, match="duplicate label name"):
        FamilyParser(["m"]).parse(line + "\n")


def test_quoted_label_names_without_escapes_are_unquoted() -> None:
    page = FamilyParser(["m"]).parse('m{"my.label"="v",b="x"} 1\nm{ "q" = "w"} 2\n')
    assert [s.labels for s in page["m"]] == [{"my.label": "v", "b": "x"}, {"q": "w"}]
    page = FamilyParser(["m"]).parse('m{a="x\\ny"} 1\n')
    assert page["m"][0].labels == {"a": "x\ny"}


def test_the_bucket_limit_names_a_series_whose_labels_sort_before_le() -> None:
    name = "h_bucket"
    lines = "".join(f'{name}{{model_name="m",engine="0",le="{i}"}} {i}\n' for i in range(4))
    p = FamilyParser(["h"])
    assert len(p.read(lines, max_buckets=4).page[name]) == 4
    with pytest.raises(PageRefused) as refused:
        p.read(lines + f'{name}{{engine="0",le="9",model_name="m"}} 9\n', max_buckets=4)
    assert f'{name}{{engine="0",model_name="m"}} has more than 4 buckets' in str(refused.value)
    # another rank of the same model is a series of its own
    other = lines.replace('engine="0"', 'engine="1"')
    assert len(p.read(lines + other, max_buckets=4).page[name]) == 8


def test_the_first_per_series_count_is_exact() -> None:
    # the family passes the limit (4 bucket lines, limit 3) while each series is under it: the
    # series then counted from the lines already read, exactly, so series a reaching the limit
    # afterwards is not refused, and passing it is
    name = "h_bucket"

    def lines(model: str, les: range) -> str:
        return "".join(f'{name}{{model_name="{model}",le="{i}"}} {i}\n' for i in les)

    p = FamilyParser(["h"])
    page = lines("a", range(2)) + lines("b", range(2)) + lines("a", range(2, 3))
    assert len(p.read(page, max_buckets=3).page[name]) == 5
    with pytest.raises(PageRefused, match=r'model_name="a"\} has more than 3'):
        p.read(page + lines("a", range(3, 4)), max_buckets=3)


def test_the_refused_series_labels_are_cut_to_200_characters() -> None:
    labels = "".join(f'l{k}="{k * 70}",' for k in "abcd")  # four values cut to 60 characters each
    page = "".join(f'h_bucket{{{labels}le="{i}"}} {i}\n' for i in range(3))
    with pytest.raises(PageRefused) as refused:
        FamilyParser(["h"]).read(page, max_buckets=2)
    written = ",".join(f'l{k}="{k * 60}"' for k in "abcd")
    assert f"h_bucket{{{written[:200]}}} has more than 2 buckets" in str(refused.value)


def test_a_reader_reads_the_text_format_unless_told() -> None:
    p = FamilyParser(["m"])
    for reader, ts in ((p.reader(), 1.0), (p.reader(openmetrics=True), 1000.0)):
        reader.feed("m 1 1000\n")
        assert reader.finish().page == {"m": [Sample("m", {}, 1.0, ts)]}
