"""Text that reaches a person, made safe for its destination (pure functions).

Model, engine and version names come from engine pages and deployment metadata, i.e. from whoever
deploys an engine. Before they reach Slack, PagerDuty or a webhook they go through here:

- :func:`clean` drops control characters and invisible formatting characters (bidirectional
  marks and overrides, zero-width spaces and joiners, the byte-order mark: they reorder or hide
  text; :func:`agent.text.strip_invisible`) and cuts a value to a length, marking the cut with "…";
- :func:`escape_slack` also escapes ``&``, ``<`` and ``>`` as Slack requires, which makes
  ``<!channel>``, ``<@U123>`` and ``<https://evil.example|runbook>`` inert text, and breaks
  ``@here`` / ``@channel`` / ``@everyone`` with a zero-width space so no client turns them into
  mentions;
- :func:`bounded_mapping` bounds a dict of strings (keys, count, value length) for PagerDuty's
  ``custom_details`` and Alertmanager labels/annotations.

A zero-width space stays only where a neutraliser puts one (after ``@``, inside ``:`` ``//`` and
``www`` ``.``, as here and in :mod:`agent.report.escape`): there it disarms a mention or a link, and a
text escaped upstream (the weekly report's summary) keeps its breaks; anywhere else it only hides.

Links are never taken from data: destinations put only URLs from our own configuration into link
fields (see :func:`config_link`).

:func:`redact` takes secrets out of error text for the log and the outbox, whatever their case (a
URL's host comes back lower-cased from URL parsing); :func:`url_secrets` names the parts of a
secret URL.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urljoin, urlsplit

from agent.text import strip_invisible

# C0 (but tab and newline), DEL, C1, line/paragraph separators (format characters: strip_invisible).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")
_BROADCAST = re.compile(r"@(?=[A-Za-z0-9])")  # @here, @channel, @everyone, @user: break them all
ZWSP = "\u200b"  # zero-width space: invisible, but no mention parses across it
ELLIPSIS = "…"
# The zero-width spaces a neutraliser puts in (a mention, a scheme, a www. host): kept.
_BREAKS = re.compile("@\u200b|:\u200b//|www\u200b\\.")
REDACTED = "***"


def _invisible_gone(s: str) -> str:
    """``s`` without format characters, but for the zero-width spaces of :data:`_BREAKS`."""
    out: list[str] = []
    pos = 0
    for m in _BREAKS.finditer(s):
        out += (strip_invisible(s[pos : m.start()]), m.group())
        pos = m.end()
    out.append(strip_invisible(s[pos:]))
    return "".join(out)


def _strip(text: Any, one_line: bool) -> str:
    s = _invisible_gone(_CONTROL.sub("", str(text)))
    return s.replace("\n", " ").replace("\t", " ") if one_line else s


def clean(text: Any, limit: int, one_line: bool = True) -> str:
    """``text`` as a string without control characters (and, for ``one_line``, without line
    breaks: a name cannot start a fake second line), at most ``limit`` characters."""
    s = _strip(text, one_line)
    if len(s) > limit:
        s = s[: max(0, limit - 1)] + ELLIPSIS
    return s


def _slack(s: str, keep_entities: bool = False) -> str:
    if not keep_entities:
        s = s.replace("&", "&amp;")
    s = s.replace("<", "&lt;").replace(">", "&gt;")
    return _BROADCAST.sub("@" + ZWSP, s)


def escape_slack(text: Any, limit: int, one_line: bool = False, keep_entities: bool = False) -> str:
    """``text`` safe inside Slack message text (mrkdwn or not), at most ``limit`` characters
    after escaping (an entity such as ``&amp;`` is never cut in half).

    ``keep_entities``: the text was escaped by its author already (``&amp;`` stays as written);
    ``<``, ``>`` and mentions are still disarmed, so a slip there cannot page or link."""
    raw = _strip(text, one_line)
    out = _slack(raw, keep_entities)
    if len(out) <= limit:
        return out
    lo, hi = 0, min(len(raw), limit)  # the longest prefix whose escaped form leaves room for "…"
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(_slack(raw[:mid], keep_entities)) + 1 <= limit:
            lo = mid
        else:
            hi = mid - 1
    return _slack(raw[:lo], keep_entities) + ELLIPSIS


def bounded_mapping(
    values: Mapping[str, Any], max_items: int, key_limit: int, value_limit: int, one_line: bool = True
) -> dict[str, str]:
    """A copy with at most ``max_items`` entries, keys and values cleaned and cut (values keep
    line breaks unless ``one_line``)."""
    out: dict[str, str] = {}
    for k, v in values.items():
        if len(out) >= max_items:
            break
        out[clean(k, key_limit)] = clean(v, value_limit, one_line)
    return out


def absolute_link(link: str | None, external_url: str | None) -> str | None:
    """An absolute http(s) link: ``link`` itself when absolute, else joined to ``external_url``;
    None when it cannot be made absolute (a relative link without ``alerts.external_url``)."""
    if not link:
        return None
    if urlsplit(link).scheme in ("http", "https"):
        return link
    if urlsplit(link).scheme or not external_url:
        return None
    base = external_url if external_url.endswith("/") else external_url + "/"
    return urljoin(base, link)


def config_link(*candidates: str | None, external_url: str | None = None) -> str | None:
    """The first candidate that is (or can be made) an absolute http(s) URL."""
    for c in candidates:
        link = absolute_link(c, external_url)
        if link:
            return link
    return None


def redact(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with every secret replaced by ``***``, in any letter case (longest secret first,
    so a secret that holds a shorter one is taken out whole)."""
    found = sorted({s for s in secrets if s}, key=len, reverse=True)
    if not found:
        return text
    return re.sub("|".join(map(re.escape, found)), REDACTED, text, flags=re.IGNORECASE)


def url_secrets(url: str) -> tuple[str, ...]:
    """The parts of a secret URL that must not be logged: the URL, its user and password, its host
    (a token may be a subdomain; connection errors name the host alone), and its path and query
    (where Slack and most webhook tokens live), which servers like to echo back in error pages."""
    parts = urlsplit(url)
    out = [url]
    for part in (parts.username, parts.password, parts.hostname):
        if part:
            out.append(part)
    if parts.query:
        out.append(parts.query)
    if len(parts.path) > 1:
        out.append(parts.path)
    return tuple(out)


__all__ = [
    "absolute_link",
    "bounded_mapping",
    "clean",
    "config_link",
    "escape_slack",
    "redact",
    "url_secrets",
]
