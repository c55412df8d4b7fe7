"""Log handling for the command line: text or JSON lines, and a rate limit on repeated messages.

``cli.py`` calls :func:`setup_logging` once; library modules only log (``logging.getLogger``).

- JSON lines (``--log-format json``): RFC 3339 time with milliseconds in UTC, level, logger, the
  formatted message, the message template with its arguments as JSON values (a dict of labels is a
  JSON object, not Python text), and the record's structured fields (``extra=``) as JSON values.
- :class:`RateLimitFilter`: a warning or error repeated from the same place with the same template
  is written in full the first time, then held back for the rest of the interval; the next one
  after the interval carries the count of those held back. A huge message (a 1 MB malformed line)
  is cut to :data:`MAX_MESSAGE_CHARS`. So a source failing every second, an exhausted file
  descriptor table or a full disk cost a few lines a minute, not a flood. A record about one thing
  is limited per thing: twenty engines going down at once give twenty lines, one each, up to
  :data:`MAX_SUBJECTS` per place and interval (the rest share one limit, and the next line after
  the interval counts them). The subject is ``extra={"subject": ...}``, else the first argument of
  a template that starts with a noun and its name (``"engine %s (%s) is down: %s"``, ``"pod %s/%s
  skipped"``): the house style of a line about one engine, pod, sink or GPU.
- Every record leaves without invisible formatting characters (bidirectional overrides, zero-width
  characters: :func:`agent.text.strip_invisible`) in its message, arguments and traceback: a model
  name from an engine page cannot reorder or hide a log line.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import sys
import time
from collections.abc import Callable
from typing import Any

from agent.text import has_invisible, strip_invisible

# Why 60 s: one line a minute per repeated problem keeps a week of a persistent fault under
# 10,000 lines per problem while still showing it is ongoing.
RATE_INTERVAL_SECONDS = 60.0
# Why 2,000: a full URL, an error and a short excerpt of the offending input fit; a page does not.
MAX_MESSAGE_CHARS = 2000
# Why 4,096 keys: distinct (place, template) pairs are bounded by the code; the cap only guards memory.
MAX_KEYS = 4096
# Why 64 subjects: a node's engines are the subjects (8 GPUs of 7 MIG slices each is 56), so each
# gets its own line; a place that names more distinct subjects than that within one interval is a
# flood, and the rest share one limit.
MAX_SUBJECTS = 64
OTHER_SUBJECTS = "(other subjects)"  # the shared key of the subjects beyond MAX_SUBJECTS

_NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\d+")
_ABOUT = re.compile(r"[A-Za-z_]+ %[sr]")  # "engine %s ...": a line about the engine it names
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


def _visible(v: Any) -> Any:
    """``v`` with invisible characters gone from its text (containers item by item; numbers and
    objects whose text has none kept as they are, so ``%d`` and JSON values still work)."""
    if isinstance(v, str):
        return strip_invisible(v)
    if v is None or isinstance(v, bool | int | float):
        return v
    if isinstance(v, dict):
        return {_visible(k): _visible(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_visible(x) for x in v]
    if isinstance(v, tuple):
        return tuple(_visible(x) for x in v)
    text = str(v)
    return strip_invisible(text) if has_invisible(text) else v


def _make_visible(record: logging.LogRecord) -> None:
    """Invisible characters out of ``record``'s template and arguments."""
    record.msg = _visible(record.msg)
    if isinstance(record.args, tuple | dict):
        record.args = _visible(record.args)


def _visible_traceback(record: logging.LogRecord) -> None:
    """An exception's text without invisible characters, set where every formatter reads it."""
    if record.exc_info and not record.exc_text:
        text = logging.Formatter().formatException(record.exc_info)
        if has_invisible(text):
            record.exc_text = strip_invisible(text)


def _subject_of(record: logging.LogRecord) -> Any:
    """What ``record`` is about (see the module docstring), None when it does not say."""
    subject = getattr(record, "subject", None)
    if subject is not None:
        return subject
    if isinstance(record.msg, str) and isinstance(record.args, tuple) and record.args:
        return record.args[0] if _ABOUT.match(record.msg) else None
    return None


def _truncate(text: str) -> str:
    if len(text) <= MAX_MESSAGE_CHARS:
        return text
    return f"{text[:MAX_MESSAGE_CHARS]}… ({len(text) - MAX_MESSAGE_CHARS} more characters)"


class RateLimitFilter(logging.Filter):
    """Lets a repeated WARNING+ record through once per interval (see the module docstring)."""

    def __init__(
        self, interval: float = RATE_INTERVAL_SECONDS, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.interval = interval  # seconds
        self._monotonic = monotonic
        # key → (window start, held back)
        self._seen: dict[tuple[str, int, str, str | None], tuple[float, int]] = {}
        # place → (window start, subjects with a key of their own in that window)
        self._subjects: dict[tuple[str, int, str], tuple[float, set[str]]] = {}

    def _subject(self, place: tuple[str, int, str], subject: Any, now: float) -> str | None:
        """The key part for ``subject``: itself, or :data:`OTHER_SUBJECTS` beyond MAX_SUBJECTS."""
        if subject is None:
            return None
        name = str(subject)[:200]
        start, names = self._subjects.get(place, (now, set()))
        if now - start >= self.interval:
            start, names = now, set()
        if name not in names and len(names) >= MAX_SUBJECTS:
            name = OTHER_SUBJECTS
        else:
            names.add(name)
        if len(self._subjects) >= MAX_KEYS and place not in self._subjects:
            self._subjects.clear()
        self._subjects[place] = (start, names)
        return name

    def filter(self, record: logging.LogRecord) -> bool:
        """False to hold a repeat back; the first after the interval reports how many were held."""
        # the template, not the text; numbers and addresses folded (a preformatted message such as
        # asyncio's names a socket or an object at a new address each time)
        place = (record.name, record.lineno, _NUMBERS.sub("#", str(record.msg)[:200]))
        msg = record.getMessage()
        if has_invisible(msg):
            _make_visible(record)
            msg = record.getMessage()
        _visible_traceback(record)
        if len(msg) > MAX_MESSAGE_CHARS:
            record.msg, record.args = _truncate(msg), None
        if record.levelno < logging.WARNING:
            return True
        now = self._monotonic()
        key = (*place, self._subject(place, _subject_of(record), now))
        seen = self._seen.get(key)
        if seen is None or now - seen[0] >= self.interval:
            if seen is not None and seen[1]:
                record.msg, record.args = (
                    f"{record.getMessage()} [{seen[1]} similar messages held back in the last "
                    f"{now - seen[0]:.0f} s]",
                    None,
                )
            if len(self._seen) >= MAX_KEYS and key not in self._seen:
                self._seen.clear()
            self._seen[key] = (now, 0)
            return True
        self._seen[key] = (seen[0], seen[1] + 1)
        return False


def _jsonable(v: Any) -> Any:
    """``v`` when JSON can hold it as is (mappings and sequences recursively), else its text."""
    if v is None or isinstance(v, str | bool | int):
        return v
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else str(v)
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    return str(v)


def rfc3339(ts: float) -> str:
    """``ts`` (epoch seconds) as RFC 3339 UTC with milliseconds, e.g. 2026-11-30T16:40:32.123Z."""
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """One JSON object per line (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a JSON line."""
        doc: dict[str, Any] = {
            "time": rfc3339(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if isinstance(record.msg, str) and record.args:
            doc["template"] = record.msg
            if isinstance(record.args, tuple):  # each argument as a JSON value (a dict of labels stays one)
                doc["args"] = [_jsonable(a) for a in record.args]
        for k, v in vars(record).items():
            if k not in _STANDARD and not k.startswith("_"):
                doc[k] = v if isinstance(v, str | int | float | bool | type(None) | list | dict) else str(v)
        if record.exc_info:
            doc["exc"] = record.exc_text or self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def setup_logging(level: str, fmt: str, handler: logging.Handler | None = None) -> None:
    """Configure the root logger once: text or JSON lines on stderr (or ``handler``), rate-limited."""
    h = handler or logging.StreamHandler(sys.stderr)
    if fmt == "json":
        h.setFormatter(JsonFormatter())
    elif handler is None:
        h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    h.addFilter(RateLimitFilter())
    root = logging.getLogger()
    root.handlers[:] = [h]
    root.setLevel(level.upper())
