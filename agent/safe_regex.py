"""Regular expressions from rule files, run in linear time on bounded label values.

A rule's ``match:`` regexes run on label values that come from engine pages and deployment
metadata, i.e. from whoever deploys an engine. Python's ``re`` backtracks: ``(a+)+$`` on a long
crafted label stalls detection for minutes. Here patterns are compiled with RE2 (PyPI
``google-re2``), whose matching time is linear in the subject; what RE2 cannot run in linear time
(backreferences, lookaround, possessive or atomic groups) is refused at load time with a message
saying why, so ``infercost check`` names the rule. Label values longer than
:data:`MAX_SUBJECT_CHARS` never match (linear is still too slow for a 10 MB "model name").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import re2

# Why 1024: label values are cut to 128 characters at the edge; nothing legitimate is longer, and
# a bound keeps even linear matching cheap (10 kB names are seen in hostile pages).
MAX_SUBJECT_CHARS = 1024
# Why 1 MiB: RE2's default program budget is 8 MiB; rule patterns are a few dozen characters, so
# a pattern that needs more is a mistake (or an attempt to use memory), not a rule.
MAX_PROGRAM_BYTES = 1 << 20
MAX_PATTERN_CHARS = 1024  # why: same bound as subjects; a rule's pattern is one short line


class UnsafeRegexError(ValueError):
    """A pattern that cannot be run in linear time (or is not a valid pattern at all)."""


def _options() -> Any:
    opts = re2.Options()
    opts.log_errors = False  # RE2 would otherwise print every refused pattern to stderr
    opts.max_mem = MAX_PROGRAM_BYTES
    return opts


@dataclass(frozen=True, slots=True)
class SafeRegex:
    """A compiled pattern that only does full matches on bounded subjects."""

    pattern: str
    _compiled: Any = field(repr=False, compare=False)

    def fullmatch(self, value: str) -> bool:
        """Whether the whole ``value`` matches (False for values over MAX_SUBJECT_CHARS)."""
        if len(value) > MAX_SUBJECT_CHARS:
            return False
        return self._compiled.fullmatch(value) is not None


def compile_safe(pattern: str) -> SafeRegex:
    """Compile ``pattern`` with RE2; raise :class:`UnsafeRegexError` naming the problem and the fix."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise UnsafeRegexError(
            f"pattern is {len(pattern)} characters (limit {MAX_PATTERN_CHARS}); use a shorter pattern"
        )
    try:
        re.compile(pattern)  # compiling never backtracks; it only tells a typo from a refused feature
    except re.error as err:
        raise UnsafeRegexError(f"{pattern!r} is not a valid regular expression ({err})") from None
    try:
        compiled = re2.compile(pattern, _options())
    except re2.error as err:
        reason = err.args[0] if err.args else err
        if isinstance(reason, bytes):
            reason = reason.decode(errors="replace")
        raise UnsafeRegexError(
            f"{pattern!r} cannot run in linear time (RE2 refuses it: {reason}); backreferences, "
            "lookaround and possessive quantifiers can stall detection on a crafted label: "
            "rewrite it without them"
        ) from None
    return SafeRegex(pattern, compiled)


__all__ = ["MAX_SUBJECT_CHARS", "SafeRegex", "UnsafeRegexError", "compile_safe"]
