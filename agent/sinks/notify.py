"""Delivery of alert notifications from the outbox to the sinks (Slack, PagerDuty, webhook).

:class:`Notifier` puts every ``firing`` / ``resolved`` event into the durable outbox, one row
per sink, and a delivery loop drains it:

- per sink, strictly in order (head of line), so each resolve follows its trigger;
- per sink, a rate limit: a minimum interval (Slack: 1 message/s) and a cap per sliding minute
  (PagerDuty: 120 events/min per routing key);
- failures back off exponentially with jitter (``base × 2^(attempts-1)`` capped, times a random
  factor in [0.5, 1)), or wait the receiver's ``Retry-After``;
- a 4xx other than 408/429 means the payload itself is refused: the row is marked dead.

A sink is a small object with ``name``, ``limit`` and ``async send(session, item)`` returning a
:class:`SendResult`; it reads its secret at send time and never logs it (:func:`redact`).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp

from agent.clock import Clock
from agent.records import AlertEvent
from agent.sinks.outbox import Outbox, OutboxItem

logger = logging.getLogger(__name__)

PRUNE_EVERY_SECONDS = 3600.0  # why hourly: rows are kept a day; the prune is one indexed DELETE

USER_AGENT = "infercost/0.1.0"
# Why 10 s: vendor endpoints answer in well under a second; a hung connection must not stall
# the queue for longer than a scrape cycle or two.
SEND_TIMEOUT_SECONDS = 10.0
BACKOFF_BASE_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 300.0  # why 5 min: an outage longer than that is noticed by people anyway
IDLE_POLL_SECONDS = 1.0  # how often an idle delivery loop looks at the outbox


@dataclass(frozen=True, slots=True)
class SendResult:
    """What one delivery attempt came to."""

    ok: bool
    status: int | None = None  # HTTP status, None when no answer
    retry_after: float | None = None  # seconds the receiver asked us to wait
    permanent: bool = False  # the receiver refuses this payload: do not retry
    error: str = ""  # already redacted


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most one send per ``min_interval`` seconds and ``per_minute`` sends per sliding minute."""

    min_interval: float = 0.0  # seconds
    per_minute: int | None = None


class Sink(Protocol):
    """A notification receiver."""

    name: str
    limit: RateLimit

    async def send(self, session: aiohttp.ClientSession, item: OutboxItem) -> SendResult:
        """Deliver one outbox item; never raises for HTTP or network errors."""
        ...


def redact(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with every secret replaced by ***."""
    for s in secrets:
        if s:
            text = text.replace(s, "***")
    return text


def url_secrets(url: str) -> list[str]:
    """The parts of a secret URL that must not be logged: the URL, and its path and query (where
    Slack and most webhook tokens live), which servers like to echo back in error pages."""
    parts = urlsplit(url)
    out = [url]
    if parts.query:
        out.append(parts.query)
    if len(parts.path) > 1:
        out.append(parts.path)
    return out


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds form; HTTP dates are rare here)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


async def post_json(
    session: aiohttp.ClientSession,
    url: str,
    body: Mapping[str, Any],
    ok_statuses: Sequence[int],
    secrets: Sequence[str | None],
) -> SendResult:
    """POST ``body`` as JSON and classify the answer (errors are redacted of ``secrets``)."""
    try:
        async with session.post(
            url,
            json=body,
            headers={"User-Agent": USER_AGENT},
            timeout=aiohttp.ClientTimeout(total=SEND_TIMEOUT_SECONDS),
        ) as resp:
            text = (await resp.text())[:200]
            if resp.status in ok_statuses:
                return SendResult(True, resp.status)
            retry_after = parse_retry_after(resp.headers.get("Retry-After"))
            permanent = 400 <= resp.status < 500 and resp.status not in (408, 429)
            return SendResult(
                False, resp.status, retry_after, permanent, redact(f"HTTP {resp.status}: {text}", secrets)
            )
    except (TimeoutError, aiohttp.ClientError, OSError) as err:
        return SendResult(False, None, error=redact(f"{type(err).__name__}: {err}", secrets))


class Notifier:
    """Enqueues alert events for every sink and delivers them (see the module docstring)."""

    def __init__(
        self,
        outbox: Outbox,
        sinks: Sequence[Sink],
        clock: Clock,
        rng: random.Random | None = None,
        backoff_base: float = BACKOFF_BASE_SECONDS,
        backoff_max: float = BACKOFF_MAX_SECONDS,
    ) -> None:
        self.outbox = outbox
        self.sinks = list(sinks)
        self.clock = clock
        self._rng = rng or random.Random()
        self.backoff_base = backoff_base  # seconds
        self.backoff_max = backoff_max  # seconds
        self._sent: dict[str, deque[float]] = {s.name: deque() for s in self.sinks}
        self._session: aiohttp.ClientSession | None = None

    def enqueue(self, events: Iterable[AlertEvent]) -> int:
        """Write the firing / resolved events into the outbox for every sink; returns rows added."""
        rows = [
            (s.name, e.alert.dedup_key, e.kind, asdict(e.alert))
            for e in events
            if e.kind in ("firing", "resolved")
            for s in self.sinks
        ]
        if rows:
            self.outbox.enqueue_many(rows, self.clock.now())
        return len(rows)

    def backoff(self, attempts: int) -> float:
        """Seconds before try number ``attempts + 1`` (exponential, capped, with equal jitter)."""
        delay = min(self.backoff_max, self.backoff_base * 2 ** max(0, attempts - 1))
        return delay * (0.5 + 0.5 * self._rng.random())

    def _rate_wait(self, sink: Sink, now: float) -> float:
        sent = self._sent[sink.name]
        while sent and sent[0] <= now - 60.0:
            sent.popleft()
        wait = 0.0
        if sent and sink.limit.min_interval > 0:
            wait = max(wait, sent[-1] + sink.limit.min_interval - now)
        if sink.limit.per_minute is not None and len(sent) >= sink.limit.per_minute:
            wait = max(wait, sent[0] + 60.0 - now)
        return wait

    async def _session_get(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def deliver_once(self) -> float:
        """Try the head of every sink that is due and allowed; returns seconds until next due."""
        session = await self._session_get()
        next_due = IDLE_POLL_SECONDS
        for sink in self.sinks:
            now = self.clock.now()
            item = self.outbox.head(sink.name)
            if item is None:
                continue
            wait = max(item.next_attempt - now, self._rate_wait(sink, now))
            if wait > 0:
                next_due = min(next_due, wait)
                continue
            self._sent[sink.name].append(now)
            try:
                result = await sink.send(session, item)
            except Exception as err:  # a bug or a bad secret file in one sink is a retry, not a stop
                logger.exception("sink %s raised while sending", sink.name)
                result = SendResult(ok=False, error=f"{type(err).__name__} in the sink")
            now = self.clock.now()
            if result.ok:
                self.outbox.delivered(item.id, now)
                logger.info("delivered %s %s to %s", item.kind, item.body.get("rule_id"), sink.name)
                next_due = 0.0
            elif result.permanent:
                self.outbox.dead(item.id, now, result.error)
                logger.error(
                    "%s refused %s %s (%s); dropped",
                    sink.name,
                    item.kind,
                    item.body.get("rule_id"),
                    result.error,
                )
                next_due = 0.0
            else:
                delay = self.backoff(item.attempts + 1)
                if result.retry_after is not None:
                    delay = max(delay, result.retry_after)
                self.outbox.retry(item.id, now + delay, result.error)
                logger.warning(
                    "delivery to %s failed (%s); try %d again in %.1f s",
                    sink.name,
                    result.error,
                    item.attempts + 1,
                    delay,
                )
                next_due = min(next_due, delay)
        return max(0.0, next_due)

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver until ``stop`` is set (one failing sink never stops the others)."""
        next_prune = 0.0
        while not stop.is_set():
            if self.clock.now() >= next_prune:  # delivered and dead rows are kept a day, then dropped
                self.outbox.prune(self.clock.now())
                next_prune = self.clock.now() + PRUNE_EVERY_SECONDS
            try:
                wait = await self.deliver_once()
            except Exception:  # a bug or a broken file must not kill the agent; log and go on
                logger.exception("outbox delivery round failed")
                wait = IDLE_POLL_SECONDS
            if wait > 0:
                sleeper = asyncio.ensure_future(self.clock.sleep(min(wait, IDLE_POLL_SECONDS)))
                stopper = asyncio.ensure_future(stop.wait())
                await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
                for t in (sleeper, stopper):
                    t.cancel()
            else:
                await asyncio.sleep(0)

    def pending(self) -> Mapping[str, int]:
        """Undelivered notifications per sink (for infercost_outbox_pending)."""
        return {s.name: self.outbox.pending(s.name) for s in self.sinks}

    async def close(self) -> None:
        """Close the HTTP session (the outbox itself is closed by its owner)."""
        if self._session is not None:
            await self._session.close()
            self._session = None
