"""A fast Prometheus / OpenMetrics text parser that reads only the metric families it is asked for.

Engines expose hundreds of series (http_*, process_*, python_gc_*, ``_created`` gauges, buckets of
histograms nobody uses); an adapter needs a few dozen. :class:`FamilyParser` compiles the wanted
sample names into one regular expression (a trie) anchored at the start of a line, so the C regex
engine skips every other line without Python touching it; only the wanted lines are split further,
with plain string operations on the common shapes and a validating regex on the rest.

Grammar read (the Prometheus text format 0.0.4 and OpenMetrics 1.0 text, as prometheus_client reads
them; ``tests/test_conformance.py`` holds both public conformance suites against it):

- ``# HELP`` / ``# TYPE`` / ``# UNIT`` / other comments and blank lines: ignored;
- ``name{label="value",...} value [timestamp]``, leading blanks and CRLF allowed; label values
  with ``\\\\``, ``\\"`` and ``\\n`` escapes (other backslash pairs are kept as written, as
  prometheus_client does); spaces around labels; empty terms (``{,}``, a trailing comma);
- UTF-8 quoted names (Prometheus 3 / OpenMetrics 2.0): ``{"vllm:x", model_name="m"} 1`` and quoted
  label names ``{"my.label"="v"}``;
- values ``NaN``, ``+Inf``, ``-Inf``, exponents (``1_000`` refused, as Go's parser does); the first
  token after the labels is the value and the last (if more than one) the timestamp, as
  prometheus_client reads it: tokens in between are tolerated;
- exemplars (`` # {trace_id="…"} 0.5``) are ignored; native-histogram samples
  (``{count:24,sum:100,schema:0,…}``) are skipped while the classic buckets of the same family are
  read;
- timestamps: milliseconds in the text format, seconds in OpenMetrics, returned in seconds;
- OpenMetrics only: the page ends at ``# EOF`` (in the text format that line is a comment);
- ``_created`` series: read only where asked for (an adapter asks for its counters'). NUL and other
  control characters inside label values are kept as written: the adapter cleans label values
  (``base.clean_label``).

One sample per series, in page order: a series written twice with the same value is one sample;
written twice with different values it has no value the agent can trust (the exposition format
forbids it, and which line did the engine mean?), so it is left out of the page and named in
:attr:`FamilyParser.duplicates` (the adapter refuses its signal: never the last line, never counted
twice). Both spellings of a name with a colon are read (``vllm:x`` and the ``vllm_x`` that newer
prometheus_client releases write when asked for OpenMetrics); a page carrying both keeps the
canonical one only (:attr:`Page` keys are always canonical).
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from itertools import repeat
from operator import itemgetter
from typing import Any, NamedTuple

logger = logging.getLogger(__name__)

# Suffixes under which one family's samples appear on the wire. ``_total`` is not here: adapters
# name counters by their wire name (``vllm:prompt_tokens_total``, TGI's ``tgi_request_count``).
FAMILY_SUFFIXES: tuple[str, ...] = ("", "_bucket", "_sum", "_count")
QUOTE_LIMIT = 200  # characters of a bad line quoted in a ParseError (a hostile line may be 1 MB)
# Label blocks remembered per parser (why 10,000: the wanted series of a dense vLLM page of 32 models
# on 2 ranks have 3,008 label sets, and one parser serves every engine of its kind on the node; a
# page whose labels change every scrape just refills it, so memory stays bounded, ~2 MB)
BLOCK_CACHE = 10_000
# Page layouts remembered per parser (why 8: one parser serves every engine of its kind on the node,
# and engines of one kind on a node rarely number more than its 8 GPUs; a layout holds references
# to the wanted lines' name-and-labels text, about 100 bytes a line, so 8 dense pages cost ~3 MB)
LAYOUTS = 8
_NO_LABELS: frozenset[tuple[str, str]] = frozenset()
_HEAD, _TAIL = itemgetter(0), itemgetter(1)  # of a wanted line's groups: the common shape's parts

# Possessive quantifiers (*+) everywhere a hostile 1 MB line could make sre backtrack: every
# pattern here runs in time linear in the line.
_LABEL_NAME = r'(?:[a-zA-Z_][a-zA-Z0-9_]*+|"[^"\\\n]*+(?:\\.[^"\\\n]*+)*+")'
_LABEL_VALUE = r'"[^"\\\n]*+(?:\\.[^"\\\n]*+)*+"'  # unrolled (?:[^"\\]|\\.)* : much faster in sre
_TERM = rf"[ \t]*+(?:{_LABEL_NAME}[ \t]*+=[ \t]*+{_LABEL_VALUE}[ \t]*+)?"
# A label block (without its braces): terms separated by commas, empty terms allowed.
_BLOCK = rf"{_TERM}(?:,{_TERM})*"
_HEAD_RE = re.compile(rf"\{{({_BLOCK})\}}")
_PAIR_RE = re.compile(rf'({_LABEL_NAME})[ \t]*+=[ \t]*+"([^"\\\n]*+(?:\\.[^"\\\n]*+)*+)"')
# The common case: no escapes, no blanks. A name starts only after a non-word character, so a long
# run of word characters is scanned once, not once per starting position.
_SIMPLE_PAIR_RE = re.compile(r'(?<!\w)([a-zA-Z_]\w*+)="([^"]*+)"')
_ESCAPE_RE = re.compile(r'\\[\\n"]')
_ESCAPES: Mapping[str, str] = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}


class ParseError(ValueError):
    """A wanted line of the page is not valid exposition text (the message quotes it, truncated)."""


class Sample(NamedTuple):
    """One sample line: name (canonical spelling), labels, value and the optional timestamp.

    ``labels`` may be shared with other samples and later scrapes: never mutate it."""

    name: str
    labels: dict[str, str]
    value: float  # in the metric's unit, as written
    timestamp: float | None  # seconds since the epoch (the text format carries milliseconds)


Page = dict[str, list[Sample]]
"""Samples by canonical wire name, in page order."""

_Layout = tuple[
    tuple[int, ...], tuple[str, ...], tuple[dict[str, str], ...], tuple[str, ...], tuple[slice, ...]
]
"""A page's layout: the lines whose values it keeps, grouped by wire name (their indices, names
and labels), then the wire names and each one's slice of those lines."""


def quote(line: str) -> str:
    """``line`` for a message: stripped and cut to :data:`QUOTE_LIMIT` characters."""
    line = line.strip()
    return repr(
        line if len(line) <= QUOTE_LIMIT else line[:QUOTE_LIMIT] + f"…(+{len(line) - QUOTE_LIMIT} chars)"
    )


def _unescape(value: str) -> str:
    return _ESCAPE_RE.sub(lambda m: _ESCAPES[m.group(0)], value) if "\\" in value else value


def _escape(name: str) -> str:
    """``name`` as written between quotes on the wire."""
    return name.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(token: str, what: str, name: str, rest: str) -> float:
    # Python's float() would take "1_000"; the exposition format does not.
    if "_" not in token:
        try:
            return float(token)
        except ValueError:
            pass
    raise ParseError(f"invalid {what} {quote(token)} in line {quote(name + rest)}")


def _trie_pattern(names: list[str]) -> str:
    """A regex matching exactly ``names`` (sorted, non-empty), factored by common prefixes."""
    prefix = os.path.commonprefix(names)  # noqa: RUF071 (a string prefix is meant)
    rest = [n[len(prefix) :] for n in names]
    optional = "" in rest
    groups: dict[str, list[str]] = {}
    for r in rest:
        if r:
            groups.setdefault(r[0], []).append(r)
    if not groups:
        return re.escape(prefix)
    alts = [_trie_pattern(g) for g in groups.values()]
    body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
    if optional:
        body = f"(?:{body}|)"  # (X|) is (X)? without sre's repeat machinery: faster
    return re.escape(prefix) + body


def _cut_at_eof(text: str) -> str:
    """``text`` up to an OpenMetrics ``# EOF`` line (``text`` starts and ends with a newline)."""
    at = text.find("\n# EOF")
    while at >= 0:
        end = text.find("\n", at + 1)
        if text[at + 6 : end].strip() == "":
            return text[: at + 1]
        at = text.find("\n# EOF", at + 1)
    return text


def _value_and_timestamp(
    tail: str, name: str, rest: str, openmetrics: bool
) -> tuple[float, float | None] | None:
    """Value and timestamp (seconds) of a sample's text after its labels; None for a native
    histogram. prometheus_client reads the first token as the value and the last, if more
    than one, as the timestamp: tokens in between are tolerated."""
    tokens = tail.split()
    if not tokens:
        raise ParseError(f"no value in line {quote(name + rest)}")
    if tokens[0][:1] == "{":
        return None
    value = _number(tokens[0], "value", name, rest)
    if len(tokens) == 1:
        return value, None
    ts = _number(tokens[-1], "timestamp", name, rest) / (1.0 if openmetrics else 1000.0)
    if not math.isfinite(ts):
        raise ParseError(f"timestamp not finite in line {quote(name + rest)}")
    return value, ts


def _slow_labels(block: str, name: str, rest: str) -> dict[str, str]:
    """Labels of a block with escapes, blanks, quoted names or empty terms (validated)."""
    if _HEAD_RE.fullmatch("{" + block + "}") is None:
        raise ParseError(f"malformed labels in line {quote(name + rest)}")
    labels: dict[str, str] = {}
    for key, value in _PAIR_RE.findall(block):
        if key[0] == '"':
            key = _unescape(key[1:-1])
        if key in labels:
            raise ParseError(f"duplicate label name {key!r} in line {quote(name + rest)}")
        labels[key] = _unescape(value)
    return labels


def expand_families(families: Iterable[str]) -> frozenset[str]:
    """Every wire sample name under which ``families`` can appear (name, _bucket, _sum, _count)."""
    return frozenset(f + s for f in families for s in FAMILY_SUFFIXES)


class FamilyParser:
    """Parses only the samples of the given families out of exposition text.

    Build one per adapter (the regular expressions are compiled once) and call :meth:`parse` on
    each page. Raises :class:`ParseError` only for a malformed *wanted* line; everything else on
    the page is skipped unread.
    """

    def __init__(self, families: Iterable[str]) -> None:
        families = frozenset(families)
        self.names = expand_families(families)
        # prometheus_client ≥ 0.2x escapes ':' to '_' when it answers in OpenMetrics with the
        # default "underscores" escaping (vllm:x → vllm_x): read both spellings, report the canonical.
        self._canonical = {n.replace(":", "_"): n for n in self.names if ":" in n}
        self._family_of = {n: f for f in families for n in expand_families([f])}
        all_names = sorted(self.names | frozenset(self._canonical))
        # A trie of the names: sre rejects a line after its first differing character instead of
        # trying every name in turn. The rest of the line is "" when nothing follows the name.
        name = f"({_trie_pattern(all_names)})" if all_names else "((?!))"
        # A quoted name opens the label block instead: {"vllm:x", a="b"} 1 or {"vllm:x"} 1; it is
        # written with escapes (only names outside the legacy charset can need them).
        self._unquoted = {_escape(n): n for n in all_names}
        quoted = f"({_trie_pattern(sorted(self._unquoted))})" if all_names else "((?!))"
        # One pass finds every kind of wanted line, in page order. Groups: (head, tail) for the
        # common shape, a name and its labels ending before a blank and the value
        # (``name{labels} 1`` or ``name 1``, the head up to the last ``}`` followed by a blank);
        # else (name, rest) for any other line of a wanted name, indented or not; else (quoted
        # name, rest after it). [^\n]* stops at a newline, and the text ends with one; (X|) is a
        # faster (X)? in sre.
        bare = name[1:-1]  # the trie without its group
        self._line_re = re.compile(
            rf"\n(?:({bare}(?:\{{[^\n]*\}}|))([ \t][^\n]*)"
            rf"|[ \t]*(?:{name}([ \t{{\r][^\n]*|)(?=\n)"
            rf'|\{{[ \t]*"{quoted}"[ \t]*([,}}][^\n]*)(?=\n)))'
        )
        # Label blocks read before (the same series come back every scrape), bounded.
        self._blocks: dict[str, tuple[dict[str, str], frozenset[tuple[str, str]]]] = {}
        # Layouts of pages read before: the heads of their wanted lines (all of the common shape)
        # and, by name, the lines kept and their labels (see :meth:`parse`), newest last, bounded.
        self._layouts: list[tuple[tuple[str, ...], _Layout]] = []
        # The series the last page wrote twice with different values (canonical name, labels),
        # left out of its samples.
        self.duplicates: tuple[tuple[str, dict[str, str]], ...] = ()

    def parse(self, text: str, openmetrics: bool = False) -> Page:
        """Samples of the wanted families, by canonical name.

        ``openmetrics``: the page is OpenMetrics text (``application/openmetrics-text``):
        timestamps are in seconds and nothing after ``# EOF`` is read.

        A page laid out as one read before (the same wanted lines, each ``head value`` with the
        same heads, in the same order: an engine's page between scrapes) is read from that
        layout: only the values are converted. The line-by-line reading of the same text gives
        the same samples, as the head alone decides a line's name and labels and the value is
        the whole tail; a tail that is not one plain number (a timestamp, an exemplar) is read
        line by line.
        """
        got = self.read_layout(text, openmetrics)
        return got if isinstance(got, dict) else self.page_of(*got)

    def read_layout(self, text: str, openmetrics: bool = False) -> Page | tuple[_Layout, list[float]]:
        """:meth:`parse`'s samples, or, for a page laid out as one read before, that layout (the
        same object each time) and the page's values, one per wanted line: ``page_of(layout,
        values)`` is the page's samples."""
        text = f"\n{text}\n"
        if openmetrics:
            text = _cut_at_eof(text)
        self.duplicates = ()
        lines = self._line_re.findall(text)
        if not lines:
            return {}
        heads: tuple[str, ...] = tuple(map(_HEAD, lines))
        for known_heads, layout in self._layouts:
            if known_heads == heads:
                tails = list(map(_TAIL, lines))
                if "_" in "".join(tails):  # float() takes "1_000"; the format does not
                    break
                try:
                    return layout, list(map(float, tails))
                except ValueError:  # more than a value: read line by line
                    break
        return self._read_lines(lines, heads, openmetrics)

    def page_of(self, layout: _Layout, values: Sequence[Any]) -> Page:
        """The samples of a page of ``layout`` (from :meth:`read_layout`) with ``values``."""
        picks, names, labels, wire_names, spans = layout
        made = list(
            map(
                tuple.__new__,  # Sample(...) without its Python-level __new__
                repeat(Sample),
                zip(names, labels, map(values.__getitem__, picks), repeat(None)),
            )
        )
        # (one slice per wire name: both are the layout's)
        out: Page = dict(zip(wire_names, map(made.__getitem__, spans)))  # noqa: B905
        if self._canonical and not self._canonical.keys().isdisjoint(out):
            self._canonicalise(out)
        return out

    def _read_lines(
        self, lines: list[tuple[str, str, str, str, str, str]], heads: tuple[str, ...], openmetrics: bool
    ) -> Page:
        """The samples of the wanted lines found by ``_line_re`` (``heads``: their first
        groups), read one by one; the page's layout is remembered when every line has the common
        shape and a plain value."""
        series: dict[str, dict[frozenset[tuple[str, str]], int]] = {}  # name → labels → last sample
        made: list[Sample] = []  # in page order (one per line when none is skipped)
        plain = 0  # lines of the common shape whose value was their whole tail
        clashes: set[tuple[str, frozenset[tuple[str, str]]]] = set()  # series repeated with other values
        known = self._blocks
        new_sample = tuple.__new__  # Sample(...) without its Python-level __new__
        for head, whole_tail, name, rest, qname, qrest in lines:
            if head:  # the common shape: read as any other line
                name = head.partition("{")[0]
                rest = head[len(name) :] + whole_tail
            elif not name:  # {"name", labels} value: read as name{labels} value
                name = self._unquoted[qname]
                rest = qrest[1:] if qrest[0] == "}" else "{" + qrest[1:]
            if rest[:1] == "{":
                end = rest.rfind("}")
                hit = known.get(rest[1:end]) if end > 0 else None
                if hit is not None:  # a block this parser has read before: valid and simple
                    labels, key = hit
                    tail = rest[end + 1 :]
                    if "#" in tail:  # an exemplar (or a comment) after the value
                        tail = tail[: tail.index("#")]
                else:
                    labels, key, tail = self._labels(name, rest)
                if openmetrics and tail[:1] not in (" ", "\t"):  # the text format lets it pass
                    raise ParseError(f"no blank before the value in line {quote(name + rest)}")
            elif "{" in rest and rest.lstrip(" \t")[:1] == "{":  # blanks before the labels
                rest = rest.lstrip(" \t")
                labels, key, tail = self._labels(name, rest)
            else:
                labels, key = {}, _NO_LABELS
                tail = rest
                if "#" in tail:
                    tail = tail[: tail.index("#")]
            try:  # the common case: the value alone (float() ignores the blanks around it)
                value = float(tail)
                ts: float | None = None
                plain += tail == whole_tail  # ("" for other shapes, never a number)
            except ValueError:
                read = _value_and_timestamp(tail, name, rest, openmetrics)
                if read is None:  # a native histogram: {count:24,sum:100,schema:0,...}
                    continue
                value, ts = read
            if "_" in tail:  # float() takes "1_000"; the exposition format does not
                raise ParseError(f"invalid number in line {quote(name + rest)}")
            per = series.get(name)
            if per is None:
                series[name] = per = {}
            if key in per:  # a repeated series: harmless with the same value, else no value at all
                before = made[per[key]].value
                if before != value and (before == before or value == value):  # (NaN twice: the same)
                    clashes.add((name, key))
            per[key] = len(made)
            made.append(new_sample(Sample, (name, labels, value, ts)))
        out: Page = {name: [made[i] for i in per.values()] for name, per in series.items()}
        if clashes:
            self._drop(out, series, made, clashes)
        # no line skipped or repeated: sample i is line i
        if plain == len(lines) and len(made) == sum(map(len, series.values())):
            self._remember(heads, series, made)
        if self._canonical and not self._canonical.keys().isdisjoint(out):
            self._canonicalise(out)
        return out

    def _drop(
        self,
        out: Page,
        series: dict[str, dict[frozenset[tuple[str, str]], int]],
        made: list[Sample],
        clashes: set[tuple[str, frozenset[tuple[str, str]]]],
    ) -> None:
        """Leave the series written twice with different values out of ``out``; name them in
        :attr:`duplicates` (canonically spelled, in the order of their last lines)."""
        dropped = sorted((series[name][key], name) for name, key in clashes)
        for _, name in dropped:
            keys = {key for n, key in clashes if n == name}
            out[name] = [made[i] for key, i in series[name].items() if key not in keys]
            if not out[name]:
                del out[name]
        self.duplicates = tuple((self._canonical.get(name, name), made[i].labels) for i, name in dropped)

    def _remember(
        self,
        heads: tuple[str, ...],
        series: dict[str, dict[frozenset[tuple[str, str]], int]],
        made: list[Sample],
    ) -> None:
        """Keep the layout of a page whose every wanted line is ``head value``."""
        if len(self._layouts) >= LAYOUTS:
            del self._layouts[0]
        picks = [i for per in series.values() for i in per.values()]
        spans, start = [], 0
        for per in series.values():
            spans.append(slice(start, start + len(per)))
            start += len(per)
        layout = (
            tuple(picks),
            tuple(made[i].name for i in picks),
            tuple(made[i].labels for i in picks),
            tuple(series),
            tuple(spans),
        )
        self._layouts.append((heads, layout))

    def forget(self) -> None:
        """Drop the label blocks and layouts remembered from earlier pages (benchmarks: a first
        scrape)."""
        self._blocks.clear()
        self._layouts.clear()

    def _labels(self, name: str, rest: str) -> tuple[dict[str, str], frozenset[tuple[str, str]], str]:
        """The labels of a line starting with ``{``, their series key and the text after them
        (validated). A simple block (no escapes, exemplar, braces or blanks) is remembered."""
        if "\\" in rest or "#" in rest or rest.find("{", 1) >= 0:
            # Escapes, exemplars, braces in values, quoted label names, native histograms: the
            # validating regex finds where the label block ends.
            head = _HEAD_RE.match(rest)
            if head is None:
                raise ParseError(f"malformed labels in line {quote(name + rest)}")
            tail = rest[head.end() :]
            if "#" in tail:  # an exemplar (or a comment) after the value
                tail = tail[: tail.index("#")]
            labels = _slow_labels(head.group(1), name, rest)
            return labels, frozenset(labels.items()), tail
        end = rest.rfind("}")
        if end < 0:
            raise ParseError(f"unterminated labels in line {quote(name + rest)}")
        block = rest[1:end]
        found = _SIMPLE_PAIR_RE.findall(block)
        # Exactly k="v" pairs joined by commas, one trailing comma allowed? (Values hold no quote
        # here, so '",' only occurs where a pair ends.)
        extra = len(block) - sum([len(k) + len(v) for k, v in found]) - 4 * len(found)
        if not ((extra == -1 or (extra == 0 and found)) and block.count('",') == len(found) + extra):
            labels = _slow_labels(block, name, rest)  # blanks, empty terms, garbage
            return labels, frozenset(labels.items()), rest[end + 1 :]
        labels = dict(found)
        if len(labels) != len(found):
            raise ParseError(f"duplicate label name in line {quote(name + rest)}")
        if len(self._blocks) >= BLOCK_CACHE:
            self._blocks.clear()
        key = frozenset(labels.items())  # the series key (label order aside); its hash is cached
        self._blocks[block] = (labels, key)
        return labels, key, rest[end + 1 :]

    def _canonicalise(self, out: Page) -> None:
        """Escaped spellings (``vllm_x``) → canonical (``vllm:x``); a family written both ways
        keeps only its canonical samples, so nothing is read twice."""
        canonical_families = {self._family_of[n] for n in out if n in self._family_of}
        for escaped in [n for n in out if n in self._canonical]:
            samples = out.pop(escaped)
            canonical = self._canonical[escaped]
            if self._family_of[canonical] in canonical_families:
                logger.debug("both %s and %s on one page: reading %s", canonical, escaped, canonical)
                continue
            out[canonical] = [s._replace(name=canonical) for s in samples]


@lru_cache(maxsize=64)
def parser_for(families: frozenset[str]) -> FamilyParser:
    """A cached :class:`FamilyParser` for a set of families."""
    return FamilyParser(families)


def parse(text: str, families: Iterable[str], openmetrics: bool = False) -> Page:
    """Parse the samples of ``families`` out of ``text`` (see :class:`FamilyParser`)."""
    return parser_for(frozenset(families)).parse(text, openmetrics)
