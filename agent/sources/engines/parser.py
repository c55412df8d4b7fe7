"""A Prometheus / OpenMetrics text parser that reads only the metric families it is asked for.

Engines expose hundreds of series (http_*, process_*, python_gc_*, ``_created`` gauges, buckets of
histograms nobody uses); an adapter needs a few dozen. :class:`FamilyParser` compiles the wanted
sample names into one regular expression (a trie) anchored at the start of a line, so the C regex
engine skips every other line without Python touching it; only the wanted lines are read further,
their label blocks by one validating regex.

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
:attr:`Parsed.duplicates` (the adapter refuses its signal: never the last line, never counted
twice). Both spellings of a name with a colon are read (``vllm:x`` and the ``vllm_x`` that newer
prometheus_client releases write when asked for OpenMetrics); a page carrying both keeps the
canonical one only (:attr:`Page` keys are always canonical).
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from itertools import pairwise
from typing import NamedTuple

logger = logging.getLogger(__name__)

# Suffixes under which one family's samples appear on the wire. ``_total`` is not here: adapters
# name counters by their wire name (``vllm:prompt_tokens_total``, TGI's ``tgi_request_count``).
FAMILY_SUFFIXES: tuple[str, ...] = ("", "_bucket", "_sum", "_count")
QUOTE_LIMIT = 200  # characters of a bad line quoted in a ParseError (a hostile line may be 1 MB)

# Possessive quantifiers (*+) everywhere a hostile 1 MB line could make sre backtrack: every
# pattern here runs in time linear in the line.
_LABEL_NAME = r'(?:[a-zA-Z_][a-zA-Z0-9_]*+|"[^"\\\n]*+(?:\\.[^"\\\n]*+)*+")'
_LABEL_VALUE = r'"[^"\\\n]*+(?:\\.[^"\\\n]*+)*+"'  # unrolled (?:[^"\\]|\\.)* : much faster in sre
_TERM = rf"[ \t]*+(?:{_LABEL_NAME}[ \t]*+=[ \t]*+{_LABEL_VALUE}[ \t]*+)?"
# A label block (without its braces): terms separated by commas, empty terms allowed.
_BLOCK = rf"{_TERM}(?:,{_TERM})*"
_HEAD_RE = re.compile(rf"\{{({_BLOCK})\}}")
_PAIR_RE = re.compile(rf'({_LABEL_NAME})[ \t]*+=[ \t]*+"([^"\\\n]*+(?:\\.[^"\\\n]*+)*+)"')
_ESCAPE_RE = re.compile(r'\\[\\n"]')
_ESCAPES: Mapping[str, str] = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}


class ParseError(ValueError):
    """A wanted line of the page is not valid exposition text (the message quotes it, truncated)."""


class PageRefused(ValueError):
    """A page that parses but is refused whole (a histogram over the bucket limit); the message
    names the series and the limit."""


class Sample(NamedTuple):
    """One sample line: name (canonical spelling), labels, value and the optional timestamp.

    ``labels`` may be shared with other samples and later scrapes: never mutate it."""

    name: str
    labels: dict[str, str]
    value: float  # in the metric's unit, as written
    timestamp: float | None  # seconds since the epoch (the text format carries milliseconds)


Page = dict[str, list[Sample]]
"""Samples by canonical wire name, in page order."""
_Key = tuple[str, ...]  # a series' labels sorted by name, flat: (name, value, name, value, ...)
# A series' value, or (value, timestamp in seconds) when it has one: most have none, and a tuple
# would be 56 bytes more per series read.
_Read = float | tuple[float, float]


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
    body = "(?:" + "|".join(alts) + ")"
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


def expand_families(families: Iterable[str]) -> frozenset[str]:
    """Every wire sample name under which ``families`` can appear (name, _bucket, _sum, _count)."""
    return frozenset(f + s for f in families for s in FAMILY_SUFFIXES)


class Parsed(NamedTuple):
    """One page's wanted samples and the series it wrote twice with different values."""

    page: Page
    duplicates: tuple[tuple[str, dict[str, str]], ...]  # (canonical name, labels), left out of page


class FamilyParser:
    """Parses only the samples of the given families out of exposition text.

    Build one per set of families (the regular expression is compiled once) and call :meth:`read`
    or :meth:`parse` on each page; it keeps no state between pages. Raises :class:`ParseError` only
    for a malformed *wanted* line; everything else on the page is skipped unread.
    """

    def __init__(self, families: Iterable[str]) -> None:
        families = frozenset(families)
        self.names = expand_families(families)
        # prometheus_client >= 0.2x escapes ':' to '_' when it answers in OpenMetrics with the
        # default "underscores" escaping (vllm:x -> vllm_x): read both spellings, report the canonical.
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
        # One pass finds every wanted line, in page order. Groups: (name, rest) for a line of a
        # wanted name, indented or not; else (quoted name, rest after it). [^\n]* stops at a
        # newline, and the text ends with one.
        self._line_re = re.compile(
            rf"\n[ \t]*(?:{name}([ \t{{\r][^\n]*|)(?=\n)"
            rf'|\{{[ \t]*"{quoted}"[ \t]*([,}}][^\n]*)(?=\n))'
        )

    def parse(self, text: str, openmetrics: bool = False) -> Page:
        """Samples of the wanted families, by canonical name (see :meth:`read`)."""
        return self.read(text, openmetrics).page

    def read(self, text: str, openmetrics: bool = False, max_buckets: int | None = None) -> Parsed:
        """Samples of the wanted families, by canonical name, and the series left out.

        ``openmetrics``: the page is OpenMetrics text (``application/openmetrics-text``):
        timestamps are in seconds and nothing after ``# EOF`` is read. ``max_buckets``: a histogram
        series (one label set but ``le``) with more buckets raises :class:`PageRefused` as soon as
        its next bucket is read, so a hostile page is never read (or held) whole.
        """
        reader = self.reader(openmetrics, max_buckets)
        reader.feed(text)
        return reader.finish()

    def reader(self, openmetrics: bool = False, max_buckets: int | None = None) -> PageReader:
        """A :class:`PageReader` of one page, fed in pieces as it arrives (see :meth:`read`)."""
        return PageReader(self, openmetrics, max_buckets)

    def _canonicalise(self, out: Page) -> None:
        """Escaped spellings (``vllm_x``) -> canonical (``vllm:x``); a family written both ways
        keeps only its canonical samples, so nothing is read twice."""
        canonical_families = {self._family_of[n] for n in out if n in self._family_of}
        for escaped in [n for n in out if n in self._canonical]:
            samples = out.pop(escaped)
            canonical = self._canonical[escaped]
            if self._family_of[canonical] in canonical_families:
                logger.debug("both %s and %s on one page: reading %s", canonical, escaped, canonical)
                continue
            out[canonical] = [s._replace(name=canonical) for s in samples]


class PageReader:
    """One page read in pieces: :meth:`feed` each piece as it arrives, then :meth:`finish`.

    A piece is a whole number of lines (it may end without its last newline), so a scraper reads a
    page as it streams in and never holds it whole. What it keeps while reading is small and one
    per series (a page repeating one line a million times holds one): the series' labels as one
    flat tuple of strings (one object per distinct label name and value on the page), its value
    and timestamp; the :class:`Sample` objects and their label dicts are built by :meth:`finish`,
    so a page refused while it is read (a histogram over its limit, a parse over the CPU budget)
    never builds them. Raises as :meth:`FamilyParser.read` does.
    """

    def __init__(self, parser: FamilyParser, openmetrics: bool, max_buckets: int | None) -> None:
        self._parser = parser
        self._openmetrics = openmetrics
        self._max_buckets = max_buckets
        self._done = False  # past an OpenMetrics # EOF: the rest is not read
        self._lines = 0  # wanted lines read so far: a series' last line orders the duplicates
        self._series: dict[str, dict[_Key, _Read]] = {}  # name -> labels -> its last reading
        self._clashes: dict[tuple[str, _Key], int] = {}  # repeated with other values -> its last line
        self._strings: dict[str, str] = {}  # each distinct label name and value, kept once
        self._bucket_lines: dict[str, int] = {}  # name -> bucket samples (cheap: counted per name)
        self._buckets: dict[str, dict[_Key, int]] = {}  # name -> series -> buckets

    def feed(self, piece: str) -> None:
        """Read the wanted lines of ``piece`` (whole lines of the page, in page order)."""
        if self._done:
            return
        text = f"\n{piece}\n"
        if self._openmetrics:
            cut = _cut_at_eof(text)
            self._done = len(cut) < len(text)
            text = cut
        p, openmetrics, series, strings = self._parser, self._openmetrics, self._series, self._strings
        for line in p._line_re.finditer(text):
            name, rest, qname, qrest = line.groups()
            if not name:  # {"name", labels} value: read as name{labels} value
                name = p._unquoted[qname]
                rest = qrest[1:] if qrest[0] == "}" else "{" + qrest[1:]
            got = _sample(name, rest, openmetrics, strings)
            if got is None:  # a native histogram: {count:24,sum:100,schema:0,...}
                continue
            key, value, ts = got
            per = series.setdefault(name, {})
            seen = per.get(key)
            self._lines += 1
            if seen is not None:
                if (name, key) in self._clashes or _differ(_value(seen), value):
                    self._clashes[name, key] = self._lines
            elif self._max_buckets is not None and "le" in key[::2]:
                n = self._bucket_lines[name] = self._bucket_lines.get(name, 0) + 1
                if n > self._max_buckets:  # only then per series (a real page never gets here)
                    _count_bucket(self._buckets, per, name, key, self._max_buckets)
            per[key] = value if ts is None else (value, ts)

    def finish(self) -> Parsed:
        """The page's samples, by canonical name in page order, and the series left out."""
        series, clashes = self._series, self._clashes
        out: Page = {}
        for name in list(series):
            per = series.pop(name)
            samples = []
            while per:  # last first, each series' read let go of once its sample is built
                key, read = per.popitem()
                if (name, key) not in clashes:
                    samples.append(_sample_of(name, key, read))
            if samples:
                samples.reverse()
                out[name] = samples
        self._parser._canonicalise(out)
        canonical = self._parser._canonical
        by_last = sorted(clashes.items(), key=_last_line)
        return Parsed(out, tuple((canonical.get(name, name), _labels_of(key)) for (name, key), _ in by_last))


def _value(read: _Read) -> float:
    """The value of a series' reading."""
    return read if isinstance(read, float) else read[0]


def _sample_of(name: str, key: _Key, read: _Read) -> Sample:
    """The Sample of a series' reading."""
    labels = _labels_of(key)
    return Sample(name, labels, read, None) if isinstance(read, float) else Sample(name, labels, *read)


def _last_line(clash: tuple[tuple[str, _Key], int]) -> int:
    """The line a series written twice was last written on."""
    return clash[1]


def _labels_of(key: _Key) -> dict[str, str]:
    """A series' labels as a dict (by name), from its flat key."""
    return dict(zip(key[::2], key[1::2]))  # noqa: B905 (names and values alternate)


def _without_le(key: _Key) -> _Key:
    """The series of a histogram bucket: its labels but ``le``."""
    at = key[::2].index("le") * 2
    return key[:at] + key[at + 2 :]


def _count_bucket(
    buckets: dict[str, dict[_Key, int]],
    per: Mapping[_Key, object],
    name: str,
    key: _Key,
    most: int,
) -> None:
    """Count one more bucket (``key``) of its histogram series (``name``'s samples so far in
    ``per``, counted once when the name first passes ``most`` bucket lines); PageRefused past
    ``most`` in one series."""
    counts = buckets.get(name)
    if counts is None:
        counts = buckets[name] = {}
        for k in per:
            if "le" in k[::2]:
                of = _without_le(k)
                counts[of] = counts.get(of, 0) + 1
    of = _without_le(key)
    n = counts[of] = counts.get(of, 0) + 1
    if n > most:
        labels = ",".join(f'{k}="{v[:60]}"' for k, v in zip(of[::2], of[1::2]))  # noqa: B905
        raise PageRefused(
            f"histogram {name}{{{labels[:200]}}} has more than {most} buckets (limits.max_histogram_buckets)"
        )


def _differ(before: float, value: float) -> bool:
    """Two values of one series that disagree (NaN twice is the same reading)."""
    return before != value and (before == before or value == value)


def _labels(name: str, rest: str, strings: dict[str, str]) -> tuple[_Key, str]:
    """The labels of a line whose ``rest`` starts with ``{`` (validated), as a series key (sorted
    by name, each string the one in ``strings``), and the text after them."""
    head = _HEAD_RE.match(rest)
    if head is None:
        why = "malformed" if "}" in rest else "unterminated"
        raise ParseError(f"{why} labels in line {quote(name + rest)}")
    block = head.group(1)
    pairs = _PAIR_RE.findall(block)
    if "\\" in block or any(k[0] == '"' for k, _ in pairs):  # escapes or quoted names
        pairs = [(_unescape(k[1:-1]) if k[0] == '"' else k, _unescape(v)) for k, v in pairs]
    pairs.sort()
    for (key, _), (after, _) in pairwise(pairs):
        if key == after:
            raise ParseError(f"duplicate label name {key!r} in line {quote(name + rest)}")
    flat = [x for pair in pairs for x in pair]
    return tuple(map(strings.setdefault, flat, flat)), rest[head.end() :]


def _sample(
    name: str, rest: str, openmetrics: bool, strings: dict[str, str]
) -> tuple[_Key, float, float | None] | None:
    """The series key, value and timestamp of a wanted line (its name and the text after it); None
    for a native histogram."""
    key: _Key = ()
    stripped = rest.lstrip(" \t")
    if rest[:1] == "{":
        key, tail = _labels(name, rest, strings)
        if openmetrics and tail[:1] not in (" ", "\t"):  # the text format lets it pass
            raise ParseError(f"no blank before the value in line {quote(name + rest)}")
    elif stripped[:1] == "{":  # blanks before the labels
        rest = stripped
        key, tail = _labels(name, rest, strings)
    else:
        tail = rest
    if "#" in tail:  # an exemplar (or a comment) after the value
        tail = tail[: tail.index("#")]
    read = _value_and_timestamp(tail, name, rest, openmetrics)
    if read is None:
        return None
    return key, *read


# Why 64: one family set per adapter kind, a few more in tests; a parser holds one compiled pattern.
@lru_cache(maxsize=64)
def parser_for(families: frozenset[str]) -> FamilyParser:
    """A cached :class:`FamilyParser` for a set of families."""
    return FamilyParser(families)


def parse(text: str, families: Iterable[str], openmetrics: bool = False) -> Page:
    """Parse the samples of ``families`` out of ``text`` (see :class:`FamilyParser`)."""
    return parser_for(frozenset(families)).parse(text, openmetrics)
