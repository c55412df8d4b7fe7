"""Authentication that does not melt: bounded caches, failures limited per client address, bcrypt on
its own worker, connection places that one client cannot all take — real sockets on loopback.

A second client address is a second source address on the loopback network (127.0.0.2): every
connection still goes to 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
import threading
from base64 import b64encode
from pathlib import Path

import bcrypt
import yaml

from agent.sinks.prometheus import PrometheusServer, ServerLimits
from agent.sinks.webconfig import (
    BCRYPT_WORKERS,
    FAILURE_BURST,
    GOOD_CACHE_MAX,
    MAX_PENDING_CHECKS,
    Authenticator,
    FailureLimiter,
    WebConfig,
    client_key,
    load_web_config,
)
from agent.snapshot import Ledger

OTHER = "127.0.0.2"  # a second client: another loopback source address


def _header(user: str, password: str) -> str:
    return "Basic " + b64encode(f"{user}:{password}".encode()).decode()


def _web(tmp_path: Path, users: dict[str, str]) -> WebConfig:
    hashed = {u: bcrypt.hashpw(p.encode(), bcrypt.gensalt(rounds=4)).decode() for u, p in users.items()}
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump({"basic_auth_users": hashed}))
    return load_web_config(path)


def _get(port: int, header: str | None, source: str = "127.0.0.1", path: str = "/healthz") -> int:
    """One request on a fresh connection from ``source``; the status code (0: closed unanswered)."""
    with socket.create_connection(("127.0.0.1", port), timeout=20, source_address=(source, 0)) as s:
        auth = f"Authorization: {header}\r\n" if header else ""
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n".encode())
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
        except ConnectionResetError:  # closed unanswered (held over a cap)
            return 0
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0


async def _server(web: WebConfig, **limits: float) -> PrometheusServer:
    snap = Ledger("node-a", "0.1.0").snapshot()
    server = PrometheusServer(
        lambda: snap, lambda: True, "127.0.0.1", 0, limits=ServerLimits(**limits), web_config=web
    )
    await server.start()
    return server


def test_client_keys_are_addresses_and_ipv6_slash_64s() -> None:
    assert client_key("127.0.0.1") == "127.0.0.1"
    assert client_key("::ffff:10.1.2.3") == "10.1.2.3"
    assert client_key("2001:db8::1") == client_key("2001:db8::ffff:1") == "2001:db8::/64"
    assert client_key("2001:db8:0:1::1") != client_key("2001:db8::1")
    assert client_key(None) == "?"


def test_the_failure_table_is_bounded_and_refills() -> None:
    now = [0.0]
    lim = FailureLimiter(burst=3, refill_seconds=10.0, max_clients=8, clock=lambda: now[0])
    for i in range(100):
        assert lim.take(f"10.0.0.{i}")
    assert len(lim) == 8  # a spray of addresses evicts the oldest, never grows the table
    assert [lim.take("a") for _ in range(5)] == [True, True, True, False, False]
    now[0] += 10.0
    assert [lim.take("a") for _ in range(2)] == [True, False]  # one token back per 10 s
    lim.refund("a")
    assert lim.take("a")


async def test_the_cache_of_verified_pairs_is_bounded(tmp_path: Path) -> None:
    users = {f"u{i}": f"pw{i}" for i in range(GOOD_CACHE_MAX + 6)}
    auth = Authenticator(_web(tmp_path, users), FailureLimiter(burst=1000))
    try:
        for u, p in users.items():
            assert await auth.verify(_header(u, p), "127.0.0.1") == "ok"
        assert auth.cached_good == GOOD_CACHE_MAX and auth.bcrypt_runs == len(users)
        last = len(users) - 1
        assert (
            await auth.verify(_header(f"u{last}", f"pw{last}"), "127.0.0.1") == "ok"
        )  # recent: from the cache
        assert auth.bcrypt_runs == len(users)
        assert await auth.verify(_header("u0", "pw0"), "127.0.0.1") == "ok"  # the oldest was forgotten
        assert auth.bcrypt_runs == len(users) + 1 and auth.cached_good == GOOD_CACHE_MAX
    finally:
        auth.close()


async def test_bcrypt_runs_on_its_own_bounded_worker_not_the_default_executor(tmp_path: Path) -> None:
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=12)).decode()  # slow: the queue fills
    (tmp_path / "web.yml").write_text(yaml.safe_dump({"basic_auth_users": {"prom": hashed}}))
    auth = Authenticator(load_web_config(tmp_path / "web.yml"), FailureLimiter(burst=1000))
    try:
        guesses = [
            asyncio.ensure_future(auth.verify(_header("prom", f"guess{i}"), f"10.0.{i}.1")) for i in range(40)
        ]
        await asyncio.sleep(0)
        # the default executor is free while bcrypt works: a job there finishes before the queue drains
        await asyncio.to_thread(lambda: None)
        assert not all(g.done() for g in guesses)
        names = [t.name for t in threading.enumerate() if t.name.startswith("infercost-bcrypt")]
        assert 1 <= len(names) <= BCRYPT_WORKERS
        verdicts = await asyncio.gather(*guesses)
        assert verdicts.count("bad") == BCRYPT_WORKERS + MAX_PENDING_CHECKS == auth.bcrypt_runs
        assert verdicts.count("busy") == 40 - auth.bcrypt_runs  # refused at once, no bcrypt
    finally:
        auth.close()


async def test_failures_are_limited_per_client_address_over_real_sockets(tmp_path: Path) -> None:
    server = await _server(_web(tmp_path, {"prom": "s3cret"}), failure_delay_seconds=0.01)
    port = server.port
    try:
        codes = [await asyncio.to_thread(_get, port, _header("prom", f"g{i}")) for i in range(20)]
        assert codes.count(401) == FAILURE_BURST and codes.count(429) == 20 - FAILURE_BURST
        assert server.auth.bcrypt_runs == FAILURE_BURST  # refused guesses cost no bcrypt
        # another address has its own budget: its right password and its first wrong one are checked
        assert await asyncio.to_thread(_get, port, _header("prom", "s3cret"), OTHER) == 200
        assert await asyncio.to_thread(_get, port, _header("prom", "nope"), OTHER) == 401
        # a verified pair is answered from the cache even from the address that is locked out
        assert await asyncio.to_thread(_get, port, _header("prom", "s3cret")) == 200
        assert server.auth.bcrypt_runs == FAILURE_BURST + 2
        # no credentials: refused without bcrypt or budget
        assert await asyncio.to_thread(_get, port, None) == 401
        assert server.auth.bcrypt_runs == FAILURE_BURST + 2
    finally:
        await server.stop()


async def test_one_client_cannot_hold_every_connection(tmp_path: Path) -> None:
    """A guesser from one address whose connections all wait on their (delayed) refusals: it holds
    its share and no more; the rest of its connections wait unread; another client is served."""
    server = await _server(
        _web(tmp_path, {"prom": "s3cret"}),
        max_connections=8,
        max_connections_per_client=4,
        failure_delay_seconds=5.0,
        park_seconds=5.0,
        fresh_seconds=0.2,
    )
    port = server.port
    codes: list[int] = []
    threads = [
        threading.Thread(target=lambda: codes.append(_get(port, _header("prom", "x")))) for _ in range(10)
    ]
    try:
        for t in threads:
            t.start()
        for _ in range(100):
            if server.connections_of("127.0.0.1") == 4 and server.parked == 6:
                break
            await asyncio.sleep(0.05)
        assert server.connections_of("127.0.0.1") == 4 and server.parked == 6
        assert await asyncio.to_thread(_get, port, _header("prom", "s3cret"), OTHER, "/metrics") == 200
        assert server.connections_of("127.0.0.1") <= 4
        for t in threads:
            await asyncio.to_thread(t.join)
        # the held ones were served as places came free, or closed unanswered after park_seconds
        assert len(codes) == 10 and codes.count(401) >= 4 and set(codes) <= {401, 0}
    finally:
        await server.stop()


async def test_silent_sockets_of_one_client_leave_room_for_others(tmp_path: Path) -> None:
    server = await _server(
        WebConfig(), max_connections=8, max_connections_per_client=4, fresh_seconds=0.1, park_seconds=0.5
    )
    port = server.port
    socks = []
    try:
        for _ in range(12):  # silent: never send a byte
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.7)  # the fresh ones age; the held ones time out
        assert server.connections_of("127.0.0.1") <= 4 and server.parked == 0
        assert await asyncio.to_thread(_get, port, None, OTHER, "/metrics") == 200
        # the same address again: one of its silent sockets is closed to make room
        assert await asyncio.to_thread(_get, port, None, "127.0.0.1", "/metrics") == 200
        assert server.connections_of("127.0.0.1") <= 4
    finally:
        for s in socks:
            s.close()
        await server.stop()
