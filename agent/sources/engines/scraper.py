"""The shared engine scraper: one GET of an engine's ``/metrics``, mapped by the engine's adapter.

:meth:`EngineScraper.scrape` never raises. Whatever goes wrong (timeout, refused or dropped
connection, HTTP error, a page over ``max_bytes``, an endless or slow stream, a binary or
non-UTF-8 body, the wrong content type, an unparsable wanted line, an unrecognisable engine, a
histogram of more buckets than ``limits.max_histogram_buckets``, a page that cost more CPU to read
than ``limits.scrape_cpu_seconds`` — then the next scrapes are skipped a while, a page that would
pass ``limits.page_bytes_in_flight`` with the pages of the other engines being read) gives
an :class:`EngineScrape` with ``up=False`` and the reason (a quoted line is cut to 200 characters);
the log gets one line when the state changes (down with a new kind of reason, at most one a minute,
or back up), not one per scrape. A page that reads but carries hostile values is up, with the
refused series in ``invalid_series`` (one log line when that set changes) and the series of models
beyond ``max_models`` counted in ``dropped_series``. The content type decides the format:
``application/openmetrics-text`` is read as OpenMetrics (timestamps in seconds, ``# EOF``).

A page is read as it arrives, its bytes counted against the shared :class:`PageBudget`: each
chunk's whole lines are decoded and parsed at once (a histogram over its limit is refused after its
first thousand buckets, not after the whole page), so neither its bytes nor its text are held whole.
Decoding, parsing and mapping run on the shared :class:`PageThread`, never on the event loop, so
``/metrics`` keeps answering while every engine's pages are read.

Values are cumulative, as read. Counter resets, glitches and spikes are told apart downstream, in
the window join (:func:`agent.cost.counters.counter_increase`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import NoReturn, TypeVar

import aiohttp

from agent.clock import Clock
from agent.config import EngineConfig, LimitsConfig
from agent.samples import EngineScrape
from agent.sources.engines.base import Adapter, PageRefused, Reading
from agent.sources.engines.parser import PageReader, ParseError
from agent.sources.engines.registry import ADAPTERS, detect_kind

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

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


class PageBudget:
    """Bytes of engine pages being read, over every scraper that shares it (``limits.page_bytes_in_flight``).

    A scrape takes the bytes of its page as they arrive and gives them all back when it is done
    (parsed and mapped, or refused). A scrape that holds nothing yet waits for room (until its own
    timeout); one that already holds some and needs more than is left is refused at once, so two
    pages never wait for each other. ``most`` is the most ever held; it never passes ``total``.
    """

    def __init__(self, total: int) -> None:
        self.total = total  # bytes
        self.held = 0  # bytes
        self.most = 0  # bytes, the most held at once
        self.waits = 0  # takes that had to wait for room
        self.refused = 0  # takes refused (a page over the whole budget, or grown past what was left)
        self._waiters: list[asyncio.Future[None]] = []

    async def take(self, n: int, holding: int) -> None:
        """Take ``n`` more bytes for a page already holding ``holding``; ScrapeFailed when refused."""
        if holding + n > self.total:
            self.refused += 1
            raise ScrapeFailed(
                f"page refused: {holding + n} bytes, more than limits.page_bytes_in_flight "
                f"({self.total}) allows for every engine's pages together"
            )
        if self.held + n > self.total:
            if holding:
                self.refused += 1
                raise ScrapeFailed(
                    f"page refused: {self.held} bytes of pages in flight over every engine, and this "
                    f"page's {n} more would pass limits.page_bytes_in_flight ({self.total})"
                )
            self.waits += 1
            while self.held + n > self.total:
                fut = asyncio.get_running_loop().create_future()
                self._waiters.append(fut)
                try:
                    await fut
                finally:
                    if fut in self._waiters:
                        self._waiters.remove(fut)
        self.held += n
        self.most = max(self.most, self.held)

    def give(self, n: int) -> None:
        """Give back ``n`` bytes; every waiting scrape looks again."""
        self.held -= n
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done() and not fut.get_loop().is_closed():
                fut.set_result(None)


class PageThread:
    """The one worker thread on which every engine page is decoded, parsed and mapped, a chunk at a
    time, over every scraper that shares it (the daemon's one, built in :mod:`agent.supervisor`).

    Why off the event loop: a chunk parsed there holds the loop for the whole chunk, and the chunks
    of every engine that arrived together run back to back before the loop looks at its sockets
    again, so a ``/metrics`` request waited behind all of them. On a worker the loop waits at most
    the interpreter's switch interval for the GIL. Why one thread, not a pool: one contender for the
    GIL (the loop never waits behind several parsing threads), and the pages' CPU spent one chunk at
    a time in arrival order. ``jobs`` counts what ran on it; after :meth:`close` work runs inline.
    """

    def __init__(self) -> None:
        self.jobs = 0  # calls run on the thread, ever
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False

    async def run(self, fn: Callable[..., _T], *args: object) -> _T:
        """``fn(*args)`` on the thread (FIFO: what one page submits runs in order)."""
        if self._closed:
            return fn(*args)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="infercost-pages")
        self.jobs += 1
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        """Stop the thread (what is running finishes; what is queued is dropped)."""
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


class _Hold:
    """One scrape's share of a :class:`PageBudget`."""

    def __init__(self, budget: PageBudget) -> None:
        self.budget = budget
        self.taken = 0  # bytes
        self.waiting = False  # waiting for room (a timeout then names the budget)

    async def grow_to(self, n: int) -> None:
        if n > self.taken:
            self.waiting = not self.taken  # (left set when a timeout cancels the wait)
            await self.budget.take(n - self.taken, self.taken)
            self.waiting = False
            self.taken = n

    def release(self) -> None:
        self.budget.give(self.taken)
        self.taken = 0


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
        budget: PageBudget | None = None,
        thread: PageThread | None = None,
    ) -> None:
        self.cfg = cfg
        self.session = session
        self.clock = clock
        self.limits = limits or LimitsConfig()
        # the daemon's one budget (agent.supervisor hands every scraper the same); alone, its own
        self.budget = budget or PageBudget(self.limits.page_bytes_in_flight)
        self.thread = thread or PageThread()  # the daemon's one (agent.supervisor); alone, its own
        self.cpu_seconds = 0.0  # CPU seconds of the last page read (decode, parse, map), on any thread
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
        skipped = 0  # scrapes this one's CPU cost makes the next ones skip
        page = _Page(self)
        hold = _Hold(self.budget)
        try:
            if self._skip:
                self._skip -= 1
                raise ScrapeFailed(self._skip_reason)
            try:
                try:
                    await asyncio.wait_for(self._fetch(page, hold), timeout=self.cfg.timeout_seconds)
                except TimeoutError:
                    if hold.waiting:
                        raise ScrapeFailed(self._budget_timeout()) from None
                    raise
                adapter, reading = await self.thread.run(page.map)
            finally:
                try:  # on the thread too, so after a chunk still being parsed there (a timeout)
                    await self.thread.run(page.close)
                finally:
                    hold.release()
                    self.cpu_seconds = page.cpu_seconds
                    skipped = self._note_cost()
            if skipped:
                raise ScrapeFailed(self.over_cpu(self.cpu_seconds))
        except asyncio.CancelledError:
            raise
        except Exception as err:
            reason = self._reason(err)
            _forget(err)
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
                size_bytes=page.size,
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
            size_bytes=page.size,
            invalid_series=reading.invalid_series,
            dropped_series=reading.dropped_series,
        )

    def over_cpu(self, cpu: float) -> str:
        """Why a page that cost ``cpu`` seconds is refused."""
        return (
            f"page refused: reading it cost {cpu:.2f} s of CPU, over the budget of "
            f"{self.limits.scrape_cpu_seconds:g} s (limits.scrape_cpu_seconds)"
        )

    def _budget_timeout(self) -> str:
        b = self.budget
        return (
            f"timeout after {self.cfg.timeout_seconds:g} s waiting for room among the pages in flight: "
            f"{b.held} bytes of limits.page_bytes_in_flight ({b.total}) held by other engines"
        )

    async def _fetch(self, page: _Page, hold: _Hold) -> None:
        """Read the page's bytes into ``page`` as they arrive, taken from the budget."""
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
            page.openmetrics = media.startswith("application/openmetrics-text")
            if declared:
                await hold.grow_to(declared)  # all at once: a declared page is never cut for room
            async for chunk in resp.content.iter_chunked(CHUNK_BYTES):
                if page.size + len(chunk) > self.cfg.max_bytes:
                    raise ScrapeFailed(f"page too large: over max_bytes {self.cfg.max_bytes}")
                await hold.grow_to(page.size + len(chunk))
                await self.thread.run(page.feed, chunk)
            await self.thread.run(page.end)

    def _note_cost(self) -> int:
        """After a page costing more CPU than ``limits.scrape_cpu_seconds`` (refused or not), the
        next scrapes are skipped (see MAX_SKIPPED_SCRAPES); returns how many (0: within budget)."""
        if self.cpu_seconds <= self.limits.scrape_cpu_seconds:
            self._over_budget = 0
            return 0
        self._over_budget += 1
        self._skip = min(MAX_SKIPPED_SCRAPES, 2 ** (self._over_budget - 1))
        return self._skip

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


class _Page:
    """One page, read as it arrives: each chunk's whole lines decoded and parsed at once, so neither
    the page's bytes nor its text are ever held whole. Every method runs on the :class:`PageThread`
    (one at a time, in order). A page whose reading passes the CPU budget is parsed no further but
    still read to its end, so a page too large is named as that."""

    def __init__(self, scraper: EngineScraper) -> None:
        self.scraper = scraper
        self.openmetrics = False
        self.size = 0  # bytes read
        self.cpu_seconds = 0.0  # CPU seconds of checking, decoding, parsing and mapping it
        self._nuls = 0
        self._head = b""  # the first two bytes (a gzip magic number)
        self._rest = bytearray()  # bytes after the last newline, not parsed yet
        self._over = False  # its CPU passed the budget: not parsed on
        self._reader: PageReader | None = None
        self._unknown: list[str] = []  # pieces read before the engine is known (kind: auto)

    def feed(self, chunk: bytes) -> None:
        """The next bytes of the page; the whole lines among them are parsed now."""
        cpu0 = time.thread_time()
        try:
            self.size += len(chunk)
            self._nuls += chunk.count(b"\x00")
            if len(self._head) < 2:
                self._head = (self._head + chunk[:2])[:2]
                if self._head == b"\x1f\x8b":
                    self._binary()
            if self._over:
                return
            rest = self._rest
            cut = chunk.rfind(b"\n")
            if cut < 0:
                rest += chunk  # inside a line: kept (bounded by max_bytes and the budget)
                return
            if rest:
                rest += memoryview(chunk)[: cut + 1]
                self._parse(rest, self.size - len(chunk) + cut + 1 - len(rest))
                rest.clear()
            else:
                self._parse(memoryview(chunk)[: cut + 1], self.size - len(chunk))
            rest += memoryview(chunk)[cut + 1 :]
        finally:
            self.cpu_seconds += time.thread_time() - cpu0
            if self.cpu_seconds > self.scraper.limits.scrape_cpu_seconds and not self._over:
                self._over = True
                self.close()

    def end(self) -> None:
        """The page is complete: its last line (without a newline) and the whole-page checks."""
        cpu0 = time.thread_time()
        try:
            if self._rest and not self._over:
                self._parse(self._rest, self.size - len(self._rest))
                self._rest.clear()
            if self._is_binary():
                self._binary()
            if self._over:
                raise ScrapeFailed(self.scraper.over_cpu(self.cpu_seconds))  # not read on: already over
        finally:
            self.cpu_seconds += time.thread_time() - cpu0

    def map(self) -> tuple[Adapter, Reading]:
        """The page's adapter and Reading (on a worker thread: its CPU seconds are added)."""
        cpu0 = time.thread_time()
        try:
            scraper = self.scraper
            adapter = scraper.adapter
            if self._reader is None or adapter is None:
                raise ScrapeFailed("no known engine series on the page (kind: auto)")
            parsed, self._reader = self._reader.finish(), None
            limits, cfg = scraper.limits, scraper.cfg
            return adapter, adapter.map_read(parsed, cfg.model, cfg.max_models, limits.max_histogram_buckets)
        finally:
            self.cpu_seconds += time.thread_time() - cpu0

    def close(self) -> None:
        """Let go of what the page holds: a failed scrape's traceback may keep this object a while."""
        self._rest.clear()
        self._unknown.clear()
        self._reader = None

    def _is_binary(self) -> bool:
        # A few NUL bytes are text (the OpenMetrics suite has one in a HELP line; in a label value
        # the adapter removes it); a compressed body, or one with more than 8 NULs making up over
        # 1 % of it (protobuf, a core dump), is not.
        return self._nuls > 8 and self._nuls * 100 > self.size

    @staticmethod
    def _binary() -> NoReturn:
        raise ScrapeFailed("binary body (compressed or NUL bytes), not exposition text")

    def _parse(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        """Decode and parse whole lines (``data``, at byte ``offset`` of the page)."""
        try:
            text = str(data, "utf-8")  # a cut after a newline is never inside a character
        except UnicodeDecodeError as err:
            if self._is_binary():
                self._binary()
            raise ScrapeFailed(f"body is not UTF-8 (byte {offset + err.start})") from None
        try:
            self._read(text)
        except (ParseError, PageRefused):
            if self._is_binary():
                self._binary()
            raise

    def _read(self, text: str) -> None:
        if self._reader is not None:
            self._reader.feed(text)
            return
        scraper = self.scraper
        if scraper.kind is None:
            kind = detect_kind(text)
            if kind is None:
                self._unknown.append(text)  # held until the engine is known (within the budget)
                return
            logger.info("engine %s: detected kind %s", scraper.cfg.name, kind)
            scraper.kind = kind
        adapter = ADAPTERS[scraper.kind]
        self._reader = adapter.reader(self.openmetrics, scraper.limits.max_histogram_buckets)
        for piece in _drain(self._unknown):
            self._reader.feed(piece)
        self._reader.feed(text)


def _forget(err: BaseException) -> None:
    """Drop the tracebacks of a failed scrape's exceptions (only their messages are kept). Their
    frames hold the page's reader and chunks, and through ``wait_for``'s task a cycle back to the
    exception: only a full pass of the cyclic GC over the whole daemon, which stalls the event loop
    for that long, would free them."""
    stack: list[BaseException] = [err]
    seen: set[int] = set()
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        stack.extend(x for x in (e.__cause__, e.__context__) if x is not None)


def _drain(items: list[_T]) -> Iterator[_T]:
    """The items in order, each let go of once read."""
    items.reverse()
    while items:
        yield items.pop()
