"""Invisible formatting characters, removed from text a person reads (pure; standard library only).

Names come from engine pages and deployment metadata, i.e. from whoever deploys an engine. Unicode's
format characters (category Cf) draw nothing but change what a reader sees: bidirectional marks,
embeddings, overrides and isolates (U+200E, U+200F, U+061C, U+202A–U+202E, U+2066–U+2069) reorder
the text around them, so ``evil`` + U+202E + ``txt.exe`` reads as ``evilexe.txt``; zero-width spaces and
joiners, the byte-order mark, soft hyphens and tag characters make two different names look alike.
Every destination a person reads (Slack, PagerDuty, webhook and Alertmanager annotations, report
HTML, Markdown and CSV, log lines) drops them through :func:`strip_invisible`, here, low enough in
the package that every layer may import it.
"""

from __future__ import annotations

import unicodedata

__all__ = ["has_invisible", "strip_invisible"]


def _visible(ch: str) -> bool:
    return unicodedata.category(ch) != "Cf"


def has_invisible(text: str) -> bool:
    """Whether ``text`` holds a format (Cf) character."""
    return not text.isascii() and not all(map(_visible, text))


def strip_invisible(text: str) -> str:
    """``text`` without format (Cf) characters (ASCII text, which has none, is returned as is)."""
    if text.isascii():
        return text
    return "".join(filter(_visible, text))
