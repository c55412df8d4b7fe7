"""A fast Prometheus text-format parser that reads only the metric families it is asked for.

Engines expose hundreds of series (http_*, process_*, python_gc_*, ``_created`` gauges, buckets of
histograms nobody uses); an adapter needs a few dozen. :class:`FamilyParser` compiles the wanted
sample names into one regular expression anchored at the start of a line, so the C regex engine
skips every other line without Python touching it; only the wanted lines are parsed further.

Grammar handled (the Prometheus text format 0.0.4, plus what OpenMetrics pages add):

- ``# HELP`` / ``# TYPE`` / other comments and blank lines: ignored;
- ``name{label="value",...} value [timestamp]``: label values with ``\\\\``, ``\\"`` and ``\\n``
  escapes (other backslash pairs are kept as written, as prometheus_client does), spaces around
  labels, a trailing comma; values ``NaN``, ``+Inf``, ``-Inf``, exponents; a timestamp in
  milliseconds, returned in seconds;
- ``_created`` series: never wanted, so never read;
- ``# EOF`` (OpenMetrics): the page ends there.

prometheus_client's ``text_string_to_metric_families`` is the test oracle: for the wanted names
both produce the same samples.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import NamedTuple

logger = logging.getLogger(__name__)

# Suffixes under which one family's samples appear on the wire. ``_total`` is not here: adapters
# name counters by their wire name (``vllm:prompt_tokens_total``, TGI's ``tgi_request_count``).
FAMILY_SUFFIXES: tuple[str, ...] = ("", "_bucket", "_sum", "_count")

_LABEL_NAME = r"[a-zA-Z_][a-zA-Z0-9_]*"
_LABEL_VALUE = r'"[^"\\\n]*(?:\\.[^"\\\n]*)*"'  # unrolled (?:[^"\\]|\\.)* : much faster in sre
_LABEL_PAIR = rf"[ \t]*{_LABEL_NAME}[ \t]*=[ \t]*{_LABEL_VALUE}[ \t]*"
# After the metric name: an optional label block, the value, an optional timestamp, end of line.
_REST = (
    rf"[ \t]*(?:\{{((?:{_LABEL_PAIR}(?:,{_LABEL_PAIR})*,?)?[ \t]*)\}})?[ \t]*([^ \t\r\n]+)"
    r"(?:[ \t]+([^ \t\r\n]+))?[ \t]*\r?(?=\n)"
)
# Label pairs in a block already validated by _REST.
_PAIR_RE = re.compile(rf'({_LABEL_NAME})[ \t]*=[ \t]*"([^"\\\n]*(?:\\.[^"\\\n]*)*)"')
_SIMPLE_PAIR_RE = re.compile(r'([a-zA-Z_]\w*)="([^"]*)"')  # the common case: no escapes, no spaces
_ESCAPE_RE = re.compile(r'\\[\\n"]')
_ESCAPES: Mapping[str, str] = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}


class ParseError(ValueError):
    """A wanted line of the page is not valid exposition text (the message quotes it)."""


class Sample(NamedTuple):
    """One sample line: wire name, labels, value and the optional timestamp."""

    name: str
    labels: dict[str, str]
    value: float  # in the metric's unit, as written
    timestamp: float | None  # seconds since the epoch (the wire carries milliseconds)


Page = dict[str, list[Sample]]
"""Samples by wire name, in page order."""


def _unescape(value: str) -> str:
    return _ESCAPE_RE.sub(lambda m: _ESCAPES[m.group(0)], value)


def _number(token: str, line: str) -> float:
    # Python's float() would take "1_000"; the exposition format does not.
    if "_" in token:
        raise ParseError(f"invalid number {token!r} in line {line!r}")
    try:
        return float(token)
    except ValueError:
        raise ParseError(f"invalid number {token!r} in line {line!r}") from None


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
        body = f"(?:{body})?"
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
        self.names = expand_families(families)
        # prometheus_client ≥ 0.2x escapes ':' to '_' when it answers in OpenMetrics with the
        # default "underscores" escaping (vllm:x → vllm_x): read both spellings, report the canonical.
        self._canonical = {n.replace(":", "_"): n for n in self.names if ":" in n}
        self.names = self.names | frozenset(self._canonical)
        # A trie of the names: sre rejects a line after its first differing character instead of
        # trying every name in turn, and the literal "\n<common prefix>" lets it jump between
        # candidate lines in C.
        name = f"({_trie_pattern(sorted(self.names))})" if self.names else "((?!))"
        tail = rf"(?:(?=[ \t{{]){_REST}|([ \t{{][^\n]*))"
        self._fast_re = re.compile(rf"\n{name}{tail}")
        self._indented_re = re.compile(rf"\n[ \t]*{name}{tail}")

    def parse(self, text: str) -> Page:
        """Samples of the wanted families, by wire name."""
        text = _cut_at_eof(f"\n{text}\n")
        line_re = self._indented_re if ("\n " in text or "\n\t" in text) else self._fast_re
        out: Page = {}
        simple_pairs = _SIMPLE_PAIR_RE.findall
        for m in line_re.finditer(text):
            name, block, value_tok, ts_tok, bad = m.groups()
            if bad is not None:
                raise ParseError(f"malformed sample line {m.group(0).strip()!r}")
            labels: dict[str, str]
            if block:
                if "\\" in block:
                    found = _PAIR_RE.findall(block)
                    labels = {k: _unescape(v) for k, v in found}
                else:
                    found = simple_pairs(block)
                    if 2 * len(found) != block.count('"'):  # spaces around "=": the slow path
                        found = _PAIR_RE.findall(block)
                    labels = dict(found)
                if len(labels) != len(found):
                    raise ParseError(f"duplicate label name in line {m.group(0).strip()!r}")
            else:
                labels = {}
            if "_" in value_tok:  # float() would take "1_000"; the exposition format does not
                raise ParseError(f"invalid value {value_tok!r} in line {m.group(0).strip()!r}")
            try:
                value = float(value_tok)
            except ValueError:
                raise ParseError(f"invalid value {value_tok!r} in line {m.group(0).strip()!r}") from None
            ts = _number(ts_tok, m.group(0).strip()) / 1000.0 if ts_tok is not None else None
            name = self._canonical.get(name, name)
            bucket = out.get(name)
            if bucket is None:
                out[name] = bucket = []
            bucket.append(Sample(name, labels, value, ts))
        return out


@lru_cache(maxsize=64)
def parser_for(families: frozenset[str]) -> FamilyParser:
    """A cached :class:`FamilyParser` for a set of families."""
    return FamilyParser(families)


def parse(text: str, families: Iterable[str]) -> Page:
    """Parse the samples of ``families`` out of ``text`` (see :class:`FamilyParser`)."""
    return parser_for(frozenset(families)).parse(text)
