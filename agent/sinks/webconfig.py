"""TLS and authentication for ``/metrics`` and ``/healthz``, read from a Prometheus exporter-toolkit
``web-config`` file — the shape node_exporter and friends take with ``--web.config.file``:

.. code-block:: yaml

    tls_server_config:
      cert_file: /etc/infercost/tls/tls.crt
      key_file: /etc/infercost/tls/tls.key
      client_ca_file: /etc/infercost/tls/ca.crt      # optional: mutual TLS
      client_auth_type: RequireAndVerifyClientCert    # optional
      min_version: TLS12                              # optional (TLS12 | TLS13)
    basic_auth_users:                                 # user → bcrypt hash (htpasswd -nBC 10 user)
      prometheus: $2y$10$...
    bearer_token_file: /etc/infercost/token           # infercost extension: Authorization: Bearer

Every path is a file, never a value in the config; the secrets are read at start-up. A request
must pass any one configured scheme (basic *or* bearer); with no scheme configured, only TLS
applies. Problems raise :class:`~agent.config.ConfigError` naming the file, the key and the fix.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import ipaddress
import re
import ssl
import time
from base64 import b64decode
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import bcrypt
from pydantic import BaseModel, ConfigDict, ValidationError

from agent.config import ConfigError, format_validation_error, load_yaml

_TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
ClientAuth = Literal[
    "NoClientCert",
    "RequestClientCert",
    "RequireAnyClientCert",
    "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert",
]


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TlsServerConfig(_Strict):
    """``tls_server_config`` (exporter-toolkit field names)."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None
    client_auth_type: ClientAuth = "NoClientCert"
    min_version: Literal["TLS12", "TLS13"] = "TLS12"  # why: TLS 1.0/1.1 are deprecated (RFC 8996)


class HttpServerConfig(_Strict):
    """``http_server_config``: extra response headers (exporter-toolkit); http2 is not served."""

    headers: dict[str, str] = {}
    http2: bool = True  # accepted for compatibility; this server speaks HTTP/1.1


class WebConfigFile(_Strict):
    """The whole web-config file."""

    tls_server_config: TlsServerConfig | None = None
    http_server_config: HttpServerConfig = HttpServerConfig()
    basic_auth_users: dict[str, str] = {}
    bearer_token_file: Path | None = None


@dataclass(frozen=True, slots=True)
class WebConfig:
    """What the HTTP server enforces: a TLS context (or None), basic-auth users and bearer tokens."""

    ssl_context: ssl.SSLContext | None = None
    basic_auth_users: dict[str, bytes] = field(default_factory=dict)  # user → bcrypt hash
    bearer_tokens: tuple[bytes, ...] = ()
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def auth_required(self) -> bool:
        """True when a request must carry credentials."""
        return bool(self.basic_auth_users or self.bearer_tokens)

    @property
    def scheme(self) -> str:
        """The ``WWW-Authenticate`` challenge sent with a 401."""
        return 'Basic realm="infercost"' if self.basic_auth_users else 'Bearer realm="infercost"'


def _hide_values(msg: str) -> str:
    """Drop the offending values from a validation message (they may be hashes or tokens)."""
    return re.sub(r"\(got .*?\); fix:", "(value hidden); fix:", msg)


def _read(path: Path, source: str, key: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise ConfigError(
            f"{source}: key '{key}': cannot read {path}: {err.strerror}; fix: check the path and permissions"
        ) from None


def load_web_config(path: Path | None) -> WebConfig:
    """Read and check a web-config file: certificates load, hashes are bcrypt, token files are read
    (None: plain HTTP, no authentication)."""
    if path is None:
        return WebConfig()
    raw = load_yaml(path)
    src = str(path)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{src}: the top level must be a mapping (tls_server_config, basic_auth_users)")
    try:
        doc = WebConfigFile.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_hide_values(format_validation_error(src, err))) from None
    base = path.parent
    ctx = None
    if doc.tls_server_config is not None:
        tls = doc.tls_server_config
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = _TLS_VERSIONS[tls.min_version]
        cert, key = base / tls.cert_file, base / tls.key_file
        _read(cert, src, "tls_server_config.cert_file")
        _read(key, src, "tls_server_config.key_file")
        try:
            ctx.load_cert_chain(cert, key)
        except (ssl.SSLError, ValueError) as err:
            raise ConfigError(
                f"{src}: key 'tls_server_config': {cert} and {key} are not a PEM certificate and its "
                f"private key ({err}); fix: point cert_file/key_file at a matching pair"
            ) from None
        if tls.client_ca_file is not None:
            ca = base / tls.client_ca_file
            _read(ca, src, "tls_server_config.client_ca_file")
            try:
                ctx.load_verify_locations(cafile=ca)
            except ssl.SSLError as err:
                raise ConfigError(
                    f"{src}: key 'tls_server_config.client_ca_file': {ca} is not a PEM CA bundle ({err})"
                ) from None
        ctx.verify_mode = {
            "NoClientCert": ssl.CERT_NONE,
            "RequestClientCert": ssl.CERT_OPTIONAL,
            "RequireAnyClientCert": ssl.CERT_REQUIRED,
            "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
            "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
        }[tls.client_auth_type]
        if ctx.verify_mode != ssl.CERT_NONE and tls.client_ca_file is None:
            raise ConfigError(
                f"{src}: key 'tls_server_config.client_auth_type': {tls.client_auth_type} needs "
                "client_ca_file; fix: add client_ca_file or use NoClientCert"
            )
    users: dict[str, bytes] = {}
    for user, hashed in doc.basic_auth_users.items():
        h = hashed.encode()
        if not h.startswith((b"$2a$", b"$2b$", b"$2y$")):
            raise ConfigError(
                f"{src}: key 'basic_auth_users.{user}': not a bcrypt hash (value hidden); "
                "fix: store a hash, e.g. `htpasswd -nBC 10 USER`, never the password"
            )
        users[user] = b"$2b$" + h[4:] if h.startswith(b"$2y$") else h  # $2y$ is $2b$ (PHP's name)
    tokens: tuple[bytes, ...] = ()
    if doc.bearer_token_file is not None:
        token = _read(base / doc.bearer_token_file, src, "bearer_token_file").strip()
        if not token:
            raise ConfigError(
                f"{src}: key 'bearer_token_file': the file is empty; fix: write the token in it"
            )
        tokens = (token,)
    return WebConfig(ctx, users, tokens, dict(doc.http_server_config.headers))


# Why 64 verified pairs: a node is scraped by one or two Prometheus replicas and a person's curl,
# each with one credential (two while a password is rotated); only a bcrypt-verified pair enters,
# so a scan cannot fill it, and past 64 the least recently used pair is forgotten (one more bcrypt).
GOOD_CACHE_MAX = 64
# Why 1,024 remembered wrong pairs: a misconfigured scraper repeats one wrong password forever and is
# refused without bcrypt; a scan of fresh guesses only churns the oldest entries, it cannot grow it.
BAD_CACHE_MAX = 1024
# Failed bcrypt checks per client address: a burst of 5, then one per 6 s (10 a minute). Why: a
# person retyping a password needs a handful of tries; a guesser from one address then costs at most
# one bcrypt (tens of ms) per 6 s, about 1 % of a core, instead of every core the machine has.
FAILURE_BURST = 5
FAILURE_REFILL_SECONDS = 6.0
# Client addresses whose failures are tracked; why 4,096: far more than the scrapers of a node, and a
# guesser spraying addresses only evicts the oldest (the bcrypt pool's own bound still caps the CPU).
MAX_CLIENTS_TRACKED = 4096
# Why 1 worker: bcrypt may take at most one core, whatever arrives; the event loop's default
# executor (renders, NVML, the store) never waits behind it. A node's scrapers need one bcrypt per
# credential per cache lifetime, so one worker is never the bottleneck of an honest client.
BCRYPT_WORKERS = 1
# Checks queued for that worker beyond the one running; why 4: an honest burst (Prometheus replicas
# and a curl after a restart) fits, and a flood gets 429 at once instead of an unbounded queue.
MAX_PENDING_CHECKS = 4

Verdict = Literal["ok", "bad", "limited", "busy"]


def client_key(address: str | None) -> str:
    """The key a client's failures are counted under: its IPv4 address, or its IPv6 /64 (one host
    holds a whole /64, so per-address limits on IPv6 would be none at all)."""
    if not address:
        return "?"
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class FailureLimiter:
    """A token bucket of failed checks per client (``burst`` tokens, one back per ``refill_seconds``),
    over a bounded table (``max_clients``; the least recently seen client is dropped first)."""

    def __init__(
        self,
        burst: int = FAILURE_BURST,
        refill_seconds: float = FAILURE_REFILL_SECONDS,
        max_clients: int = MAX_CLIENTS_TRACKED,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst = burst
        self.refill_seconds = refill_seconds
        self.max_clients = max_clients
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key → (tokens, at)

    def __len__(self) -> int:
        return len(self._buckets)

    def _tokens(self, key: str, now: float) -> float:
        tokens, at = self._buckets.get(key, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - at) / self.refill_seconds)

    def take(self, key: str) -> bool:
        """Spend one token of ``key``'s bucket; False (nothing spent) when it is empty."""
        now = self._clock()
        tokens = self._tokens(key, now)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            self._buckets.move_to_end(key)
            return False
        self._buckets[key] = (tokens - 1.0, now)
        self._buckets.move_to_end(key)
        while len(self._buckets) > self.max_clients:
            self._buckets.popitem(last=False)
        return True

    def refund(self, key: str) -> None:
        """Give back the token of a check that succeeded (a right password costs no budget)."""
        now = self._clock()
        if key in self._buckets:
            self._buckets[key] = (min(float(self.burst), self._tokens(key, now) + 1.0), now)


class Authenticator:
    """Checks an ``Authorization`` header against a :class:`WebConfig`.

    bcrypt is slow on purpose (tens of ms): a verified (user, password) pair is remembered by its
    SHA-256, as exporter-toolkit does, so a scrape every few seconds costs one hash, not one bcrypt
    (:data:`GOOD_CACHE_MAX` pairs, least recently used first out). What may run bcrypt is bounded:
    failures per client address (:class:`FailureLimiter`), one dedicated worker thread
    (:data:`BCRYPT_WORKERS`) with a short queue (:data:`MAX_PENDING_CHECKS`). ``check`` is
    blocking; :meth:`verify` runs it on that worker."""

    def __init__(self, cfg: WebConfig, limiter: FailureLimiter | None = None) -> None:
        self.cfg = cfg
        self._ok: OrderedDict[bytes, None] = OrderedDict()  # sha256(user:password) of verified pairs
        self._bad: OrderedDict[bytes, None] = OrderedDict()  # recent wrong pairs
        self.limiter = limiter or FailureLimiter()
        self._pool: ThreadPoolExecutor | None = None
        self._pending = 0  # checks queued or running on the pool
        self.bcrypt_runs = 0  # bcrypt checks run, ever (for tests and the bench)
        self.limited = 0  # checks refused by the per-client limit or the full queue, ever

    @property
    def cached_good(self) -> int:
        """How many verified pairs are remembered."""
        return len(self._ok)

    def cached(self, header: str | None) -> bool | None:
        """True/False when the answer needs no bcrypt; None when :meth:`check` must run."""
        if not self.cfg.auth_required:
            return True
        if not header:
            return False
        scheme, _, cred = header.partition(" ")
        scheme = scheme.lower()
        if scheme == "bearer":
            got = cred.strip().encode()
            return any(hmac.compare_digest(got, t) for t in self.cfg.bearer_tokens)
        if scheme != "basic" or not self.cfg.basic_auth_users:
            return False
        key = self._key(cred)
        if key is None:
            return False
        if key in self._ok:
            self._ok.move_to_end(key)
            return True
        if key in self._bad:
            return False
        return None

    @staticmethod
    def _key(cred: str) -> bytes | None:
        try:
            raw = b64decode(cred.strip(), validate=True)
        except ValueError:
            return None
        return hashlib.sha256(raw).digest() if b":" in raw else None

    def check(self, header: str) -> bool:
        """Full check of a Basic header (runs bcrypt; blocking)."""
        _, _, cred = header.partition(" ")
        key = self._key(cred)
        if key is None:
            return False
        user, _, password = b64decode(cred.strip()).partition(b":")
        hashed = self.cfg.basic_auth_users.get(user.decode(errors="replace"))
        self.bcrypt_runs += 1
        # an unknown user still costs one bcrypt, so timing does not tell which users exist
        ok = bcrypt.checkpw(password, hashed or _dummy_hash()) and hashed is not None
        if ok:
            self._ok[key] = None
            while len(self._ok) > GOOD_CACHE_MAX:
                self._ok.popitem(last=False)
        else:
            self._bad[key] = None
            while len(self._bad) > BAD_CACHE_MAX:
                self._bad.popitem(last=False)
        return ok

    async def verify(self, header: str | None, client: str | None) -> Verdict:
        """The verdict on a request's header from ``client`` (an address): from the caches, else
        one bcrypt on the dedicated worker if the client's failure budget and the queue allow."""
        verdict = self.cached(header)
        if verdict is not None:
            return "ok" if verdict else "bad"
        assert header is not None
        key = client_key(client)
        if self._pending >= BCRYPT_WORKERS + MAX_PENDING_CHECKS:
            self.limited += 1
            return "busy"
        if not self.limiter.take(key):
            self.limited += 1
            return "limited"
        if self._pool is None:
            self._pool = ThreadPoolExecutor(BCRYPT_WORKERS, thread_name_prefix="infercost-bcrypt")
        self._pending += 1
        try:
            ok = await asyncio.get_running_loop().run_in_executor(self._pool, self.check, header)
        finally:
            self._pending -= 1
        if ok:
            self.limiter.refund(key)
        return "ok" if ok else "bad"

    def close(self) -> None:
        """Stop the bcrypt worker (checks already queued finish)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


@functools.cache
def _dummy_hash() -> bytes:
    """A bcrypt hash to check unknown users against (cost 10, like htpasswd -B's default)."""
    return bcrypt.hashpw(b"infercost-dummy", bcrypt.gensalt(rounds=10))
