"""The shared engine scraper: one GET of an engine's ``/metrics``, mapped by the engine's adapter.

:meth:`EngineScraper.scrape` never raises. Whatever goes wrong (timeout, refused or dropped
connection, HTTP error, a page over ``max_bytes``, an endless or slow stream, a binary or
non-UTF-8 body, the wrong content type, an unparsable wanted line, an unrecognisable engine, a
histogram of more buckets than ``limits.max_histogram_buckets``, a page that cost more CPU to read
than ``limits.scrape_cpu_seconds`` — then the next scrapes are skipped a while) gives
an :class:`EngineScrape` with ``up=False`` and the reason (a quoted line is cut to 200 characters);
the log gets one line when the state changes (down with a new kind of reason, at most one a minute,
or back up), not one per scrape. A page that reads but carries hostile values is up, with the
refused series in ``invalid_series`` (one log line when that set changes) and the series of models
beyond ``max_models`` counted in ``dropped_series``. The content type decides the format:
``application/openmetrics-text`` is read as OpenMetrics (timestamps in seconds, ``# EOF``).

Values are cumulative, as read. Counter resets, glitches and spikes are told apart downstream, in
the window join (:func:`agent.cost.counters.counter_increase`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

import aiohttp

from agent.clock import Clock
from agent.config import EngineConfig, LimitsConfig
from agent.samples import EngineScrape
from agent.sources.engines.base import Adapter, PageRefused
from agent.sources.engines.parser import ParseError
from agent.sources.engines.registry import ADAPTERS, detect_kind

logger = logging.getLogger(__name__)

# Media types of the Prometheus text format (0.0.4) and OpenMetrics text. A missing header is
# accepted (hand-written servers omit it); anything else (HTML, JSON, octet-stream) is refused.
ACCEPTED_TYPES = ("text/plain", "application/openmetrics-text")
# Plain text only: prometheus_client (what vLLM and SGLang serve with) ignores q-values and, asked
# for OpenMetrics, escapes "vllm:" names to "vllm_" in its newer releases.
ACCEPT_HEADER = "text/plain;version=0.0.4,*/*;q=0.1"
CHUNK_BYTES = 64 * 1024  # read size; the max_bytes cap is checked after each chunk
# Why 60 s: an endpoint cycling through failure kinds still leaves at most one line a minute.
LOG_INTERVAL_SECONDS = 60.0
# After a page over its CPU budget the engine's next scrapes are skipped (down, same reason): one
# after the first, doubling with each refusal in a row. Why at most 32: the page's cost is then
# spread over 33 intervals (under a thirtieth of its cost per interval at the worst), and an engine
# whose page becomes cheap again is read within 33 intervals (under 3 minutes at 5 s).
MAX_SKIPPED_SCRAPES = 32


class ScrapeFailed(Exception):
    """Why a scrape is down (the message becomes ``EngineScrape.error``)."""


class EngineScraper:
    """Scrapes one configured engine endpoint with a shared HTTP session and the injected clock.

    With ``kind: auto`` the engine is detected from the first page that can be read and kept
    from then on.
    """

    def __init__(
        self,
        cfg: EngineConfig,
        session: aiohttp.ClientSession,
        clock: Clock,
        limits: LimitsConfig | None = None,
    ) -> None:
        self.cfg = cfg
        self.session = session
        self.clock = clock
        self.limits = limits or LimitsConfig()
        self.cpu_seconds = 0.0  # CPU time of the last page read (decode, parse, map), this thread's
        self._over_budget = 0  # pages over the CPU budget in a row
        self._skip = 0  # scrapes still to skip after one
        self._skip_reason = ""
        self.kind: str | None = None if cfg.kind == "auto" else cfg.kind
        self._state: str | None = None  # "up" or the kind of the last error, for log-once-per-change
        self._last_down_log = -math.inf  # time.monotonic() of the last "down" line
        self._held_back = 0  # down lines not written since (rate limit)
        self._invalid: frozenset[str] = frozenset()  # the refused series last logged

    @property
    def adapter(self) -> Adapter | None:
        """The adapter in use (None until ``kind: auto`` has seen a page)."""
        return ADAPTERS.get(self.kind) if self.kind else None

    async def scrape(self) -> EngineScrape:
        """One scrape; never raises (see the module docstring)."""
        t0 = time.perf_counter()
        size = 0
        skipped = 0  # scrapes this one's CPU cost makes the next ones skip
        try:
            if self._skip:
                self._skip -= 1
                raise ScrapeFailed(self._skip_reason)
            body, openmetrics = await asyncio.wait_for(self._fetch(), timeout=self.cfg.timeout_seconds)
            size = len(body)
            cpu0 = time.thread_time()  # the parse runs on this thread alone, between two awaits
            try:
                text = self._decode(body)
                del body  # the text is what is read: the bytes need not stay as well
                adapter = self._adapter_for(text)
                reading = adapter.read(
                    text,
                    self.cfg.model,
                    openmetrics,
                    self.cfg.max_models,
                    self.limits.max_histogram_buckets,
                )
            finally:
                self.cpu_seconds = time.thread_time() - cpu0
                skipped = self._note_cost()
            if skipped:
                raise ScrapeFailed(
                    f"page refused: reading it cost {self.cpu_seconds:.2f} s of CPU, over the budget of "
                    f"{self.limits.scrape_cpu_seconds:g} s (limits.scrape_cpu_seconds)"
                )
        except asyncio.CancelledError:
            raise
        except Exception as err:
            reason = self._reason(err)
            if skipped:  # refused for its cost, or for something else and costly too
                if "limits.scrape_cpu_seconds" not in reason:
                    reason += f"; reading it cost {self.cpu_seconds:.2f} s of CPU (limits.scrape_cpu_seconds)"
                reason += f"; the next {skipped} scrape(s) skipped"
                self._skip_reason = reason
            self._note(reason)
            return EngineScrape(
                engine=self.cfg.name,
                kind=self.kind or "unknown",
                timestamp=self.clock.now(),
                up=False,
                duration_seconds=time.perf_counter() - t0,
                error=reason,
                size_bytes=size,
            )
        self._note("up")
        self._note_invalid(reading.invalid_series)
        return EngineScrape(
            engine=self.cfg.name,
            kind=adapter.kind,
            timestamp=self.clock.now(),
            up=True,
            duration_seconds=time.perf_counter() - t0,
            models=reading.models,
            size_bytes=size,
            invalid_series=reading.invalid_series,
            dropped_series=reading.dropped_series,
        )

    async def _fetch(self) -> tuple[bytearray, bool]:
        """The body, and whether it is OpenMetrics text (by its content type)."""
        # redirects are never followed: a page may not send the agent to another host (SSRF)
        # identity only, never inflated: a compressed body is one the page's size cap cannot bound
        # before it is expanded (a gzip bomb of a few kB is gigabytes of text)
        async with self.session.get(
            self.cfg.url,
            headers={"Accept": ACCEPT_HEADER, "Accept-Encoding": "identity"},
            allow_redirects=False,
            auto_decompress=False,
        ) as resp:
            if resp.status != 200:
                raise ScrapeFailed(f"HTTP {resp.status}")
            coding = resp.headers.get("Content-Encoding", "identity").strip().lower()
            if coding not in ("", "identity"):
                raise ScrapeFailed(
                    f"compressed body (Content-Encoding {coding[:40]!r}) though identity was asked"
                )
            ctype = resp.headers.get("Content-Type")
            media = (ctype or "").strip().lower()
            if ctype is not None and not media.startswith(ACCEPTED_TYPES):
                raise ScrapeFailed(f"wrong content type {ctype[:100]!r} (want text/plain)")
            declared = resp.content_length
            if declared is not None and declared > self.cfg.max_bytes:
                raise ScrapeFailed(f"page too large: {declared} bytes > max_bytes {self.cfg.max_bytes}")
            body = bytearray()  # grown in place: the page is held once, never as chunks and a copy
            try:
                async for chunk in resp.content.iter_chunked(CHUNK_BYTES):
                    if len(body) + len(chunk) > self.cfg.max_bytes:
                        raise ScrapeFailed(f"page too large: over max_bytes {self.cfg.max_bytes}")
                    body += chunk
            except BaseException:
                # the exception's traceback holds this frame, and through wait_for's task a reference
                # cycle holds the traceback: only the cyclic GC, some time later, would free the page
                body.clear()
                raise
            return body, media.startswith("application/openmetrics-text")

    def _note_cost(self) -> int:
        """After a page costing more CPU than ``limits.scrape_cpu_seconds`` (refused or not), the
        next scrapes are skipped (see MAX_SKIPPED_SCRAPES); returns how many (0: within budget)."""
        if self.cpu_seconds <= self.limits.scrape_cpu_seconds:
            self._over_budget = 0
            return 0
        self._over_budget += 1
        self._skip = min(MAX_SKIPPED_SCRAPES, 2 ** (self._over_budget - 1))
        return self._skip

    @staticmethod
    def _decode(body: bytes | bytearray) -> str:
        # A few NUL bytes are text (the OpenMetrics suite has one in a HELP line; in a label value
        # the adapter removes it); a compressed body, or one with more than 8 NULs making up over
        # 1 % of it (protobuf, a core dump), is not.
        nuls = body.count(b"\x00")
        if body[:2] == b"\x1f\x8b" or (nuls > 8 and nuls * 100 > len(body)):
            raise ScrapeFailed("binary body (compressed or NUL bytes), not exposition text")
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ScrapeFailed(f"body is not UTF-8 (byte {err.start})") from None

    def _adapter_for(self, text: str) -> Adapter:
        if self.kind is None:
            kind = detect_kind(text)
            if kind is None:
                raise ScrapeFailed("no known engine series on the page (kind: auto)")
            logger.info("engine %s: detected kind %s", self.cfg.name, kind)
            self.kind = kind
        return ADAPTERS[self.kind]

    def _reason(self, err: BaseException) -> str:
        if isinstance(err, ScrapeFailed):
            return str(err)
        if isinstance(err, TimeoutError):
            return f"timeout after {self.cfg.timeout_seconds:g} s"
        if isinstance(err, PageRefused):
            return f"page refused: {err}"
        if isinstance(err, ParseError):
            return f"unparsable page: {err}"
        if isinstance(err, aiohttp.ClientConnectorError):
            return f"connection failed: {err.os_error.strerror or err.os_error}"
        if isinstance(err, aiohttp.ClientError):
            return f"{type(err).__name__}: {err}"
        return f"unexpected {type(err).__name__}: {err}"

    def _note(self, state: str) -> None:
        """One log line per change of state. A down reason that only differs in its details (the
        quoted line of a page whose text changes every scrape) is the same state; a new kind of
        reason is logged at most once per LOG_INTERVAL_SECONDS, with a count of the ones held back."""
        kind = state.split(":", 1)[0]
        if kind == self._state:
            return
        previous, self._state = self._state, kind
        if state == "up":
            if previous is not None:
                logger.info("engine %s (%s) is up again", self.cfg.name, self.cfg.url)
            return
        now = time.monotonic()
        if previous not in (None, "up") and now - self._last_down_log < LOG_INTERVAL_SECONDS:
            self._held_back += 1
            return
        held = f" ({self._held_back} other down reasons held back)" if self._held_back else ""
        self._last_down_log, self._held_back = now, 0
        logger.warning("engine %s (%s) is down: %s%s", self.cfg.name, self.cfg.url, state[:300], held)

    def _note_invalid(self, invalid: tuple[str, ...]) -> None:
        """One log line when the set of refused series changes (values aside), not per scrape."""
        keys = frozenset(i.rsplit(" (", 1)[0] for i in invalid)
        if keys == self._invalid:
            return
        self._invalid = keys
        if invalid:
            more = f" (+{len(invalid) - 1} more)" if len(invalid) > 1 else ""
            logger.warning(
                "engine %s: %d series refused, their signals absent: %s%s",
                self.cfg.name,
                len(invalid),
                invalid[0],
                more,
            )
        else:
            logger.info("engine %s: every series valid again", self.cfg.name)
