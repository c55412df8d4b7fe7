"""The Prometheus endpoint: ``/metrics`` and ``/healthz``.

The page is rendered once per snapshot, in a worker thread, and the bytes are cached: a request
never renders on the event loop, and any number of scrapes of one tick cost one render. Besides
the catalogue's families it carries ``infercost_build_info`` and prometheus_client's process
collector (``process_*``: CPU, RSS, open file descriptors, start time).

The server is hardened against slow or idle clients and floods (``ServerLimits``): a connection
that has not delivered a request's headers within ``header_timeout_seconds`` is closed, at most
``max_connections`` are held (at the cap, the oldest idle one is closed to make room, so a flood of
idle sockets can never lock Prometheus out), header sizes are bounded and a request carrying a body
over ``max_request_bytes`` gets 413. Optional TLS and basic / bearer authentication come from an
exporter-toolkit web-config file (``agent.sinks.webconfig``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.utils import floatToGoString

from agent.catalog import CATALOG, HISTOGRAMS, MetricSpec
from agent.samples import Histogram
from agent.sinks.webconfig import Authenticator, WebConfig, client_key
from agent.snapshot import Snapshot, label_names, series

logger = logging.getLogger(__name__)
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class _OncePerMinute(logging.Filter):
    """Lets one record through per minute: a client sending garbage must not flood the log."""

    def __init__(self) -> None:
        super().__init__()
        self._next = 0.0  # monotonic seconds
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        if now < self._next:
            self.suppressed += 1
            return False
        if self.suppressed:
            record.msg = f"{record.msg} ({self.suppressed} similar suppressed in the last minute)"
        self._next, self.suppressed = now + 60.0, 0
        record.exc_info = None  # the client's fault: no traceback
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


_http_log = logging.getLogger(__name__ + ".http")  # aiohttp's per-connection errors (bad requests)
_http_log.addFilter(_OncePerMinute())


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """Bounds on what one client can hold of the server."""

    # why 10 s: a scraper sends its request at once; Go's exporters use the same ReadHeaderTimeout
    header_timeout_seconds: float = 10.0
    # why 64: a node has one or two scrapers (Prometheus, a debugging curl); 64 leaves room and
    # keeps the server far below the usual 1,024 open-file limit shared with the engine scrapes
    max_connections: int = 64
    max_request_bytes: int = 64 * 1024  # bytes; GET endpoints take no body
    max_header_bytes: int = 8190  # bytes per request line / header field (aiohttp's default)
    max_headers: int = 64  # why: Prometheus sends about 6
    # why 15 s: process_* and a stuck tick loop stay visible even when no new snapshot comes
    max_page_age_seconds: float = 15.0
    # Connections one client address (an IPv6 /64) may hold; why half the cap: a scraper holds one
    # or two (a burst of concurrent scrapes a few dozen), and one abusive address can never hold
    # the places the others need
    max_connections_per_client: int = 32
    # A connection over its client's share, with none of that client's idle ones to close, is held
    # unread this long and then closed (why 1 s: a refusal at once is answered by an instant
    # reconnect, a loop that costs the agent a core; held, each guessing worker retries once a second)
    park_seconds: float = 1.0
    max_parked: int = 128  # why: bounds the sockets so held (fds), far below the 1,024 open-file limit
    # Wrong credentials (401) or a refused check (429) are answered after this delay. Why 1 s: a
    # scraper with the right credentials never waits; a person mistyping does not notice; a guessing
    # connection gets one try a second instead of as many as the agent can answer
    failure_delay_seconds: float = 1.0
    # A new connection is not closed for a newcomer within this time unless it has had a request
    # (why 1 s: a client sends its request within a round trip of connecting, so a socket silent
    # for a second is an idle one; a burst of scrapes keeps its connections)
    fresh_seconds: float = 1.0


def families(snap: Snapshot) -> list[Metric]:
    """All catalogue metric families of a snapshot, in catalogue order."""
    out: list[Metric] = []
    for spec in CATALOG:
        fam: Metric
        if spec.kind == "counter":
            # prometheus_client appends _total itself
            fam = CounterMetricFamily(
                spec.full_name.removesuffix("_total"), spec.help, labels=label_names(spec, snap)
            )
        else:
            fam = GaugeMetricFamily(spec.full_name, spec.help, labels=label_names(spec, snap))
        for labels, value in series(spec, snap):
            if value is None:
                continue
            fam.add_metric(list(labels), float(value))
        out.append(fam)
    for spec in HISTOGRAMS:
        hist = HistogramMetricFamily(spec.full_name, spec.help, labels=spec.labels)
        for labels, h in series(spec, snap):
            if h is not None:
                hist.add_metric(list(labels), _le_counts(h), h.sum)
        out.append(hist)
    return out


def _le_counts(h: Histogram) -> list[tuple[str, float]]:
    """A re-based histogram's buckets as (``le`` text, cumulative count): the bound written as
    Prometheus' Go clients write it, so engines that spell one bound differently (``1`` and
    ``1.0``) meet on one ``le`` value in a fleet's ``sum by (le)``."""
    return [(floatToGoString(le), float(c)) for le, c in h.buckets]


class SnapshotCollector:
    """A prometheus_client collector over whatever snapshot ``get`` returns at scrape time."""

    def __init__(self, get: Callable[[], Snapshot]) -> None:
        self._get = get

    def collect(self) -> Iterator[Metric]:
        """Build the families from the current snapshot."""
        yield from families(self._get())


_PROCESS = CollectorRegistry(auto_describe=False)
ProcessCollector(registry=_PROCESS)  # reads /proc/self; yields nothing where /proc is missing


def _escape_label(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_catalogue(snap: Snapshot) -> bytes:
    """The catalogue's families as Prometheus text (format 0.0.4), written directly.

    Byte-for-byte what prometheus_client writes for the same families (tests hold the two equal);
    written here because prometheus_client's writer misses the render budget that ``bench
    exposition`` prints on a large node. Label strings are built once per label set and reused by
    every family of that set (a model version's ~30 series share one)."""
    out: list[str] = []
    labelled: dict[tuple[tuple[str, ...], tuple[str, ...]], str] = {}
    for spec in CATALOG:
        name = spec.full_name
        help_ = spec.help.replace("\\", "\\\\").replace("\n", "\\n")
        out.append(f"# HELP {name} {help_}\n# TYPE {name} {spec.kind}\n")
        keys = label_names(spec, snap)
        order = sorted(range(len(keys)), key=keys.__getitem__)  # label names sorted, as the client does
        for values, value in series(spec, snap):
            if value is None:
                continue
            lk = (keys, values)
            text = labelled.get(lk)
            if text is None:
                inner = ",".join(f'{keys[i]}="{_escape_label(values[i])}"' for i in order)
                text = labelled[lk] = "{" + inner + "}" if inner else ""
            out.append(f"{name}{text} {floatToGoString(value)}\n")
    for spec in HISTOGRAMS:
        _render_histograms(spec, snap, out)
    return "".join(out).encode()


def _render_histograms(spec: MetricSpec, snap: Snapshot, out: list[str]) -> None:
    """One re-based histogram family as prometheus_client writes a HistogramMetricFamily: per label
    set the ``_bucket`` lines (``le`` sorted among the labels), then ``_count`` (the ``+Inf``
    bucket) and ``_sum``."""
    name = spec.full_name
    help_ = spec.help.replace("\\", "\\\\").replace("\n", "\\n")
    out.append(f"# HELP {name} {help_}\n# TYPE {name} histogram\n")
    keys = spec.labels
    with_le = (*keys, "le")
    order = sorted(range(len(with_le)), key=with_le.__getitem__)
    plain = sorted(range(len(keys)), key=keys.__getitem__)
    for values, h in series(spec, snap):
        if h is None:
            continue
        inner = ",".join(f'{keys[i]}="{_escape_label(values[i])}"' for i in plain)
        for le, count in _le_counts(h):
            v = (*values, le)
            bucket = ",".join(f'{with_le[i]}="{_escape_label(v[i])}"' for i in order)
            out.append(f"{name}_bucket{{{bucket}}} {floatToGoString(count)}\n")
        out.append(f"{name}_count{{{inner}}} {floatToGoString(h.buckets[-1][1])}\n")
        out.append(f"{name}_sum{{{inner}}} {floatToGoString(h.sum)}\n")


def render(snap: Snapshot, process: bool = True) -> bytes:
    """The Prometheus text exposition of one snapshot (with ``process_*`` unless told not to)."""
    body = render_catalogue(snap)
    return body + generate_latest(_PROCESS) if process else body


def render_with_client(snap: Snapshot) -> bytes:
    """The catalogue rendered by prometheus_client: the reference :func:`render_catalogue` is held to."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SnapshotCollector(lambda: snap))
    return generate_latest(reg)


class PageCache:
    """The rendered page of the latest snapshot: rendered once, off the event loop."""

    def __init__(self, get: Callable[[], Snapshot], max_age_seconds: float) -> None:
        self._get = get
        self._max_age = max_age_seconds
        self._snap: Snapshot | None = None
        self._at = 0.0  # monotonic seconds of the render
        self._body = b""
        self._gzip: bytes | None = None
        self._lock = asyncio.Lock()
        self.renders = 0  # how many times the page was rendered (for tests and the bench)

    def _fresh(self) -> bool:
        return self._snap is self._get() and time.monotonic() - self._at < self._max_age

    async def page(self, want_gzip: bool) -> tuple[bytes, bool]:
        """(body, is_gzip) for the current snapshot; concurrent callers share one render."""
        if not self._fresh():
            async with self._lock:
                if not self._fresh():
                    snap = self._get()
                    self._body = await asyncio.to_thread(render, snap)
                    self._snap, self._at, self._gzip = snap, time.monotonic(), None
                    self.renders += 1
        if not want_gzip:
            return self._body, False
        if self._gzip is None:
            body = self._body
            zipped = await asyncio.to_thread(gzip.compress, body, 6)
            if body is self._body:
                self._gzip = zipped
            return zipped, True
        return self._gzip, True


class _Tracked(asyncio.Protocol):
    """aiohttp's protocol for one connection, with what the limits need to know about it."""

    def __init__(self, inner: RequestHandler, server: PrometheusServer) -> None:
        self.inner = inner
        self.last = time.monotonic()  # seconds of the last activity: connect, request start / end
        self.busy = 0  # requests in flight
        self.closed = False
        self.client = "?"  # the client's key (its address, an IPv6 /64), known at connection_made
        self.trusted = False  # a request on it passed authentication
        self.requests = 0  # requests begun on it
        self.placed = self.last  # monotonic seconds it was counted under the caps
        self._connected = False  # aiohttp saw connection_made, so it must see connection_lost
        self._server = server
        self._park: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None  # while held

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.closed:  # evicted between accept and connect (a burst): never serve it
            transport.close()
            return
        peer = transport.get_extra_info("peername")
        self.client = client_key(peer[0] if isinstance(peer, tuple) and peer else None)
        if not self._server._place(self):
            self._hold(transport)
            return
        self._connected = True
        self.inner.connection_made(transport)

    def _hold(self, transport: asyncio.BaseTransport) -> None:
        """Over a cap: held unread until a place comes free (then served) or ``park_seconds``
        pass (then closed), see ServerLimits."""
        server = self._server
        if len(server._parked) >= server.limits.max_parked or not isinstance(transport, asyncio.Transport):
            self.closed = True
            transport.close()
            return
        transport.pause_reading()
        self._transport = transport
        server._parked[self] = None
        self._park = asyncio.get_running_loop().call_later(server.limits.park_seconds, self._expire)

    def _expire(self) -> None:
        self.closed = True
        self._server._parked.pop(self, None)
        if self._transport is not None:
            self._transport.close()

    def unpark(self) -> None:
        """Served after all: a place came free."""
        self._server._parked.pop(self, None)
        if self._park is not None:
            self._park.cancel()
        assert self._transport is not None
        self.last = time.monotonic()
        self._connected = True
        self.inner.connection_made(self._transport)
        self._transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._server._conns.pop(self, None)
        self._server._parked.pop(self, None)
        if self._park is not None:
            self._park.cancel()
        if self._connected:
            self.inner.connection_lost(exc)
            self._server._freed()

    def data_received(self, data: bytes) -> None:
        if self._connected:
            self.inner.data_received(data)

    def eof_received(self) -> None:
        if self._connected:
            self.inner.eof_received()

    def pause_writing(self) -> None:
        if self._connected:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self._connected:
            self.inner.resume_writing()

    def close(self) -> None:
        """Drop the connection now."""
        self.closed = True
        self._server._conns.pop(self, None)
        if self._connected:
            self.inner.force_close()


class PrometheusServer:
    """aiohttp server for /metrics and /healthz on the event loop (limits, optional TLS and auth)."""

    def __init__(
        self,
        get: Callable[[], Snapshot],
        healthy: Callable[[], bool | Mapping[str, Any]],
        host: str,
        port: int,
        limits: ServerLimits | None = None,
        web_config: WebConfig | None = None,
        routes: Mapping[str, _Handler] | None = None,
    ) -> None:
        """``routes``: more GET paths served behind the same limits, TLS and auth (the cost API)."""
        self._routes = dict(routes or {})
        self._get = get
        self._healthy = healthy
        self.host = host
        self.port = port
        self.limits = limits or ServerLimits()
        self.web = web_config or WebConfig()
        self.cache = PageCache(get, self.limits.max_page_age_seconds)
        self.auth = Authenticator(self.web)
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._conns: dict[_Tracked, None] = {}  # open (or opening) connections, oldest first
        self._by_handler: dict[RequestHandler, _Tracked] = {}
        self._parked: dict[_Tracked, None] = {}  # connections over a cap, held unread, oldest first
        self.refused = 0  # connections refused, evicted or held at a cap

    @property
    def scheme(self) -> str:
        """http or https."""
        return "https" if self.web.ssl_context is not None else "http"

    async def start(self) -> None:
        """Bind and serve; ``port`` 0 picks a free port (read ``self.port`` afterwards)."""
        lim = self.limits

        @web.middleware
        async def guard(request: web.Request, handler: _Handler) -> web.StreamResponse:
            return await self._guard(request, handler)

        app = web.Application(middlewares=[guard], client_max_size=lim.max_request_bytes)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._health)
        for path, route in self._routes.items():
            app.router.add_get(path, route)
        self._runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            keepalive_timeout=lim.header_timeout_seconds,
            max_line_size=lim.max_header_bytes,
            max_field_size=lim.max_header_bytes,
            max_headers=lim.max_headers,
            lingering_time=0,
            logger=_http_log,
        )
        await self._runner.setup()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._protocol,
            self.host,
            self.port,
            ssl=self.web.ssl_context,
            ssl_handshake_timeout=lim.header_timeout_seconds if self.web.ssl_context else None,
            reuse_address=True,
            backlog=512,  # why: a burst waits in the kernel's queue (no fd of ours) instead of SYN retries
        )
        for sock in self._server.sockets:
            self.port = int(sock.getsockname()[1])
        self._reaper = asyncio.create_task(self._reap())
        logger.info("serving /metrics on %s://%s:%d", self.scheme, self.host, self.port)

    def _protocol(self) -> asyncio.BaseProtocol:
        """A handler for a new connection; whether it is served is decided when it connects (its
        address is known then), in :meth:`_place`."""
        assert self._runner is not None and self._runner.server is not None
        tracked = _Tracked(self._runner.server(), self)
        self._by_handler[tracked.inner] = tracked
        return tracked

    def _victim(self, conns: list[_Tracked]) -> _Tracked | None:
        """The connection to close for a newcomer: the oldest idle one not yet authenticated, else
        the oldest idle one; None when all are busy. Idle: no request in flight, and one answered
        already or none begun within ``fresh_seconds`` of connecting (a burst's newest connections
        carry requests still on their way)."""
        fresh = time.monotonic() - self.limits.fresh_seconds
        idle = [c for c in conns if not c.busy and (c.requests or c.placed < fresh)]  # oldest first
        return next((c for c in idle if not c.trusted), idle[0] if idle else None)

    def _place(self, conn: _Tracked) -> bool:
        """Make room for ``conn`` under both caps (its client's share, then the server's), closing
        idle connections as needed, and count it; False (nothing closed) when it must wait.

        Decided one connection at a time as each connects, against the connections already
        counted, so a burst of accepted sockets cannot slip past the caps."""
        lim = self.limits
        mine = [c for c in self._conns if c.client == conn.client]
        own = self._victim(mine) if len(mine) >= lim.max_connections_per_client else None
        if len(mine) >= lim.max_connections_per_client and own is None:
            self.refused += 1
            return False
        other = None
        if own is None and len(self._conns) >= lim.max_connections:
            other = self._victim(list(self._conns))
            if other is None:
                self.refused += 1
                return False
        for victim in (own, other):
            if victim is not None:
                self.refused += 1
                victim.close()
        self._conns[conn] = None
        conn.placed = time.monotonic()
        return True

    def _freed(self) -> None:
        """A connection closed or went idle: serve the oldest held connections that now fit."""
        for waiting in list(self._parked):
            if not waiting.closed and self._place(waiting):
                waiting.unpark()
                return

    @property
    def parked(self) -> int:
        """Connections held unread now (over their client's share)."""
        return len(self._parked)

    def connections_of(self, client: str) -> int:
        """Connections a client key holds now (for tests and the bench)."""
        return sum(1 for c in self._conns if c.client == client)

    async def _reap(self) -> None:
        """Close connections that delivered no request headers within the header timeout (idle
        sockets, slow senders); a kept-alive connection gets the same time for its next request."""
        timeout = self.limits.header_timeout_seconds
        while True:
            await asyncio.sleep(min(1.0, timeout / 4))
            now = time.monotonic()
            for conn in list(self._conns):
                if not conn.busy and now - conn.last > timeout:
                    conn.close()
            for handler in [h for h, c in self._by_handler.items() if c not in self._conns]:
                del self._by_handler[handler]

    async def _guard(self, req: web.Request, handler: _Handler) -> web.StreamResponse:
        conn = self._by_handler.get(req.protocol)
        if conn is not None:
            conn.busy += 1
            conn.requests += 1
        try:
            if (req.content_length or 0) > self.limits.max_request_bytes:
                return web.Response(status=413, text="request too large\n")
            header = req.headers.get("Authorization")
            verdict = await self.auth.verify(header, req.remote)
            if verdict != "ok":
                if header:  # a guess: answered late; no credentials at all cost nothing to refuse
                    await asyncio.sleep(self.limits.failure_delay_seconds)
                if verdict == "bad":
                    return web.Response(
                        status=401, text="unauthorised\n", headers={"WWW-Authenticate": self.web.scheme}
                    )
                retry = str(max(1, round(self.auth.limiter.refill_seconds)))
                return web.Response(
                    status=429, text="too many failed attempts\n", headers={"Retry-After": retry}
                )
            if conn is not None:
                conn.trusted = True
            resp = await handler(req)
            for k, v in self.web.headers.items():
                resp.headers[k] = v
            return resp
        finally:
            if conn is not None:
                conn.busy -= 1
                conn.last = time.monotonic()
                if not conn.busy and self._parked:
                    self._freed()

    async def _metrics(self, req: web.Request) -> web.Response:
        want_gzip = "gzip" in req.headers.get("Accept-Encoding", "")
        body, zipped = await self.cache.page(want_gzip)
        headers = {"Content-Type": CONTENT_TYPE_LATEST}
        if zipped:
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=body, headers=headers)

    async def _health(self, _req: web.Request) -> web.Response:
        res = self._healthy()
        if isinstance(res, Mapping):  # each component's state; 503 only when ``ok`` is false
            return web.json_response(dict(res), status=200 if res.get("ok") else 503)
        return web.json_response({"status": "ok" if res else "starting"}, status=200 if res else 503)

    async def stop(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.close()
            if self._reaper is not None:
                self._reaper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._reaper
            self._server = None
            for conn in list(self._conns):
                conn.close()
        self.auth.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
