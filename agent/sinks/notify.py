"""Delivery of notifications from the durable outbox to HTTP JSON destinations.

:class:`Notifier` puts every ``firing`` / ``resolved`` event into the outbox, one row per sink,
and delivers it:

- every sink in its own task, so a hanging or slow sink never delays the others;
- per sink, strictly in order (head of line), so each resolve follows its trigger;
- per sink, a rate limit: a minimum interval (Slack: 1 message/s) and a cap per sliding minute
  (PagerDuty: 120 events/min per routing key);
- failures back off exponentially with jitter (``base × 2^(attempts-1)`` capped, times a random
  factor in [0.5, 1)), or wait the receiver's ``Retry-After``;
- a 4xx other than the destination's retryable ones (408/429) means the payload itself is refused:
  the row is marked dead;
- a destination that forgets alerts it is not told about again (Alertmanager: an alert resolves
  at its ``endsAt``) gets each firing alert re-sent every ``resend_seconds`` while it fires.

Every destination is one :class:`HttpJsonSink`: a *payload function* (outbox item → URL and JSON
body, reading its secret at send time) plus its :class:`Policy` (rate limit, success and retry
statuses, resend period). Secrets never reach a log line (:func:`redact`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import aiohttp

from agent.clock import Clock
from agent.records import AlertEvent
from agent.sinks.escape import redact
from agent.sinks.escape import url_secrets as url_secrets  # where the sinks import it from
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
ERROR_TEXT_CHARS = 200  # of a refusing receiver's answer kept for the log (redacted)

# Kinds of outbox rows: alert transitions, and free-form messages (the weekly report to Slack).
ALERT_KINDS = ("firing", "resolved")
MESSAGE_KIND = "message"


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


@dataclass(frozen=True, slots=True)
class Policy:
    """How a destination is delivered to."""

    limit: RateLimit = RateLimit()
    ok_statuses: frozenset[int] = frozenset(range(200, 300))
    retry_statuses: frozenset[int] = frozenset({408, 429})  # 4xx that are retried (5xx always are)
    # Re-send each firing alert this often (seconds) while it fires; None = send transitions only.
    resend_seconds: float | None = None
    kinds: frozenset[str] = frozenset(ALERT_KINDS)  # the row kinds this destination takes


@dataclass(frozen=True, slots=True)
class Request:
    """One HTTP POST of a JSON body: what a payload function returns."""

    url: str
    body: Any  # JSON-able
    secrets: tuple[str, ...] = ()  # to redact from errors (URL parts, keys)
    headers: Mapping[str, str] = field(default_factory=dict)


# item → the request, or a string saying why there is none (a secret that cannot be read).
PayloadFn = Callable[[OutboxItem], "Request | str"]


class Sink(Protocol):
    """A notification receiver."""

    name: str
    limit: RateLimit

    async def send(self, session: aiohttp.ClientSession, item: OutboxItem) -> SendResult:
        """Deliver one outbox item; never raises for HTTP or network errors."""
        ...


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds form; HTTP dates are rare here)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


async def post_json(
    session: aiohttp.ClientSession, request: Request, policy: Policy = Policy()
) -> SendResult:
    """POST ``request`` and classify the answer by ``policy`` (errors redacted of its secrets).

    The body is serialised here with ``allow_nan=False`` and ASCII escapes, so no NaN, no raw
    control or line-separator character ever reaches a receiver's JSON parser."""
    try:
        data = json.dumps(request.body, allow_nan=False, ensure_ascii=True)
    except ValueError as err:
        return SendResult(False, permanent=True, error=f"payload is not valid JSON: {err}")
    headers = {"User-Agent": USER_AGENT, "Content-Type": "application/json", **request.headers}
    try:
        async with session.post(
            request.url,
            data=data.encode(),
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=SEND_TIMEOUT_SECONDS),
        ) as resp:
            text = (await resp.text(errors="replace"))[:ERROR_TEXT_CHARS]
            if resp.status in policy.ok_statuses:
                return SendResult(True, resp.status)
            retry_after = parse_retry_after(resp.headers.get("Retry-After"))
            permanent = 400 <= resp.status < 500 and resp.status not in policy.retry_statuses
            error = redact(f"HTTP {resp.status}: {text}", request.secrets)
            return SendResult(False, resp.status, retry_after, permanent, error)
    except (TimeoutError, aiohttp.ClientError, OSError) as err:
        return SendResult(False, None, error=redact(f"{type(err).__name__}: {err}", request.secrets))


class HttpJsonSink:
    """The one HTTP sink: a destination is its payload function and its policy."""

    def __init__(self, name: str, destination: str, payload: PayloadFn, policy: Policy) -> None:
        self.name = name  # the outbox's sink column (unique per configured sink)
        self.destination = destination  # slack | pagerduty | webhook | alertmanager
        self.payload = payload
        self.policy = policy
        self.limit = policy.limit

    async def send(self, session: aiohttp.ClientSession, item: OutboxItem) -> SendResult:
        """Build the request for ``item`` (reading secrets now) and POST it."""
        request = self.payload(item)
        if isinstance(request, str):
            return SendResult(False, error=request)
        return await post_json(session, request, self.policy)


def _policy(sink: Sink) -> Policy:
    return getattr(sink, "policy", None) or Policy(limit=sink.limit)


class Notifier:
    """Enqueues notifications for every sink and delivers them (see the module docstring)."""

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
        self._next_resend: dict[str, float] = {}  # sink → epoch seconds
        self._pending = {s.name: outbox.pending(s.name) for s in self.sinks}
        self._session: aiohttp.ClientSession | None = None
        # Called with the pending counts after every change (enqueue, delivery, drop).
        self.on_change: Callable[[Mapping[str, int]], None] | None = None

    # -- enqueueing -------------------------------------------------------------------------------

    def enqueue(self, events: Iterable[AlertEvent]) -> int:
        """Write the firing / resolved events into the outbox for every sink; returns rows added."""
        rows: list[tuple[str, str, str, Mapping[str, Any]]] = []
        active: list[tuple[str, str, Mapping[str, Any] | None]] = []
        for e in events:
            if e.kind not in ALERT_KINDS:
                continue
            body = asdict(e.alert)
            for s in self.sinks:
                policy = _policy(s)
                if e.kind not in policy.kinds:
                    continue
                rows.append((s.name, e.alert.dedup_key, e.kind, body))
                if policy.resend_seconds is not None:
                    active.append((s.name, e.alert.dedup_key, body if e.kind == "firing" else None))
        if rows:
            self.outbox.enqueue_many(rows, self.clock.now(), active)
            self._recount()
        return len(rows)

    def enqueue_message(self, sink_name: str, key: str, body: Mapping[str, Any]) -> int:
        """Queue a free-form message (kind ``message``) for one sink; returns rows added (0 when
        no such sink is configured, or it takes no messages: PagerDuty would page with it).
        ``key`` names the message, e.g. ``report-2026-W48``."""
        if not any(s.name == sink_name and MESSAGE_KIND in _policy(s).kinds for s in self.sinks):
            return 0
        self.outbox.enqueue_many([(sink_name, key, MESSAGE_KIND, dict(body))], self.clock.now())
        self._recount()
        return 1

    def _resend_firing(self, sink: Sink, now: float) -> None:
        """Queue a re-send of every alert still firing on ``sink`` unless one is already queued."""
        policy = _policy(sink)
        if policy.resend_seconds is None or now < self._next_resend.get(sink.name, now):
            return
        if sink.name in self._next_resend:
            queued = {item.dedup_key for item, _ in self.outbox.items(sink.name, "pending")}
            rows = [
                (sink.name, key, "firing", body)
                for key, body in self.outbox.active(sink.name)
                if key not in queued
            ]
            if rows:
                self.outbox.enqueue_many(rows, now)
                self._recount()
        self._next_resend[sink.name] = now + policy.resend_seconds

    # -- delivery ---------------------------------------------------------------------------------

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

    def _recount(self) -> None:
        self._pending = {s.name: self.outbox.pending(s.name) for s in self.sinks}
        if self.on_change is not None:
            self.on_change(dict(self._pending))

    async def deliver_sink(self, sink: Sink) -> float:
        """Try the head of one sink if it is due and allowed; returns seconds until it is next due."""
        now = self.clock.now()
        self._resend_firing(sink, now)
        item = self.outbox.head(sink.name)
        if item is None:
            return _policy(sink).resend_seconds or IDLE_POLL_SECONDS
        wait = max(item.next_attempt - now, self._rate_wait(sink, now))
        if wait > 0:
            return wait
        self._sent[sink.name].append(now)
        session = await self._session_get()
        try:
            result = await sink.send(session, item)
        except Exception as err:  # a bug or a bad secret file in one sink is a retry, not a stop
            logger.exception("sink %s raised while sending", sink.name)
            result = SendResult(ok=False, error=f"{type(err).__name__} in the sink")
        now = self.clock.now()
        what = item.body.get("rule_id") or item.dedup_key
        if result.ok:
            self.outbox.delivered(item.id, now)
            logger.info("delivered %s %s to %s", item.kind, what, sink.name)
            self._recount()
            return 0.0
        if result.permanent:
            self.outbox.dead(item.id, now, result.error)
            logger.error("%s refused %s %s (%s); dropped", sink.name, item.kind, what, result.error)
            self._recount()
            return 0.0
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
        return delay

    async def deliver_once(self) -> float:
        """One round over every sink at once; returns seconds until the next sink is due."""
        waits = await asyncio.gather(*(self.deliver_sink(s) for s in self.sinks))
        return max(0.0, min([IDLE_POLL_SECONDS, *waits]))

    async def _run_sink(self, sink: Sink, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                wait = await self.deliver_sink(sink)
            except Exception:  # a bug or a broken file must not kill the agent; log and go on
                logger.exception("outbox delivery to %s failed this round", sink.name)
                wait = IDLE_POLL_SECONDS
            if wait > 0:
                sleeper = asyncio.ensure_future(self.clock.sleep(min(wait, IDLE_POLL_SECONDS)))
                stopper = asyncio.ensure_future(stop.wait())
                await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
                for t in (sleeper, stopper):
                    t.cancel()
            else:
                await asyncio.sleep(0)

    async def _run_prune(self, stop: asyncio.Event) -> None:
        while not stop.is_set():  # delivered and dead rows are kept a day, then dropped
            try:
                self.outbox.prune(self.clock.now())
            except Exception:
                logger.exception("outbox prune failed; tried again in an hour")
            sleeper = asyncio.ensure_future(self.clock.sleep(PRUNE_EVERY_SECONDS))
            stopper = asyncio.ensure_future(stop.wait())
            await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
            for t in (sleeper, stopper):
                t.cancel()

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver until ``stop`` is set: one task per sink (a hanging sink delays no other).

        At stop, a send still in flight is abandoned: its row stays pending and is sent again
        after a restart (delivery is at least once; keys are stable)."""
        tasks = [asyncio.create_task(self._run_prune(stop))]
        tasks += [asyncio.create_task(self._run_sink(s, stop), name=f"deliver-{s.name}") for s in self.sinks]
        try:
            await stop.wait()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def pending(self) -> Mapping[str, int]:
        """Undelivered notifications per sink (for infercost_outbox_pending); kept up to date on
        every enqueue and delivery, so reading it costs no query."""
        return dict(self._pending)

    async def close(self) -> None:
        """Close the HTTP session (the outbox itself is closed by its owner)."""
        if self._session is not None:
            await self._session.close()
            self._session = None
