"""Escaping for every destination the report's text reaches. Model, engine, node and version
names come from engine pages and deployment metadata, i.e. from whoever deploys an engine: none
of them may format, link, mention or inject anything where a person reads the report.

- HTML: :func:`html.escape` (quotes too), applied by the renderer to every interpolated string.
- GitHub Markdown (:func:`md`): control characters replaced, Markdown and HTML metacharacters
  backslash-escaped or entity-encoded, ``@`` mentions and auto-links broken, long names shortened.
- Slack mrkdwn (:func:`slack`): ``&``, ``<``, ``>`` entity-encoded (Slack's own rule: this alone
  disarms ``<!channel>`` and ``<url|text>``), ``@`` mentions broken with a zero-width space, names set in
  code spans (no *bold*, _italic_ or ~strike~ inside), long names shortened.
- CSV (:func:`csv_cell`, every cell of every row): a text cell starting with ``= + - @``, a tab or a
  carriage return (what a spreadsheet runs as a formula) gets a leading ``'``, as OWASP recommends;
  a number (``-12.5``, ``1e-07``) stays a number; otherwise names are kept exactly (the writer ends
  rows with CRLF, so a cell holding a carriage return or a line feed is quoted and cannot start a
  row of its own).

Every destination also drops invisible formatting characters (bidirectional overrides and
isolates, zero-width spaces and joiners, the byte-order mark: :func:`agent.text.strip_invisible`),
before any zero-width space of our own goes in.
"""

from __future__ import annotations

import re

from agent.text import strip_invisible

# Why 160: a name longer than two lines of a chat message is not a name a person reads whole; the
# head and the tail are kept, so a version at the end of a long name stays visible.
MAX_NAME_CHARS = 160
ZWSP = "\u200b"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_MD_SPECIAL = re.compile(r"([\\`*_\[\]#|~])")
_FORMULA = ("=", "+", "-", "@", "\t", "\r")  # what a spreadsheet reads as the start of a formula
_NUMBER = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")  # as the renderers write numbers


def clean(text: str) -> str:
    """Invisible formatting characters dropped, control characters (newlines, escapes, C0/C1) as
    U+FFFD: one visible line."""
    return _CONTROL.sub("\ufffd", strip_invisible(text))


def shorten(text: str, limit: int = MAX_NAME_CHARS) -> str:
    """At most ``limit`` characters: head … tail (the tail usually holds the version)."""
    if len(text) <= limit:
        return text
    tail = limit // 3
    return f"{text[: limit - tail - 1]}…{text[-tail:]}"


def md(text: str, limit: int = MAX_NAME_CHARS) -> str:
    """Text for a GitHub-flavoured Markdown cell or line (no markup, no HTML, no mention)."""
    t = shorten(clean(text), limit)
    t = t.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    t = _MD_SPECIAL.sub(r"\\\1", t)
    return _unlink(t.replace("@", "@" + ZWSP))


def _unlink(text: str) -> str:
    """Break what a renderer would auto-link (``scheme://``, ``www.``)."""
    return text.replace("://", ":" + ZWSP + "//").replace("www.", "www" + ZWSP + ".")


def slack(text: str, limit: int = MAX_NAME_CHARS, entities: bool = True) -> str:
    """Plain text for Slack mrkdwn (no link, mention or formatting). ``entities=False`` leaves
    ``&``, ``<``, ``>`` to a sender that escapes the whole message itself
    (:func:`agent.sinks.slack.enqueue_slack_message`), so nothing is escaped twice."""
    t = shorten(clean(text), limit)
    if entities:
        t = t.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _unlink(t.replace("@", "@" + ZWSP))


def slack_code(text: str, limit: int = MAX_NAME_CHARS, entities: bool = True) -> str:
    """A name as a Slack code span (formatting characters inside are shown as typed)."""
    return "`" + slack(text, limit, entities).replace("`", "ˋ") + "`"


def csv_cell(text: str) -> str:
    """A CSV cell that a spreadsheet will not run as a formula (invisible characters dropped; a
    number such as ``-1.5`` left as it is)."""
    t = strip_invisible(text)
    return "'" + t if t[:1] in _FORMULA and not _NUMBER.fullmatch(t) else t
