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

import functools
import hashlib
import hmac
import re
import ssl
from base64 import b64decode
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


class Authenticator:
    """Checks an ``Authorization`` header against a :class:`WebConfig`.

    bcrypt is slow on purpose (tens of ms): a verified (user, password) pair is remembered by its
    SHA-256, as exporter-toolkit does, so a scrape every few seconds costs one hash, not one bcrypt.
    ``check`` is blocking; the server calls it off the event loop when the cache misses."""

    def __init__(self, cfg: WebConfig) -> None:
        self.cfg = cfg
        self._ok: set[bytes] = set()  # sha256(user \0 password) of verified pairs
        self._bad: dict[bytes, None] = {}  # recent failures, bounded (why 1024: a scan can't grow it)

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
        # an unknown user still costs one bcrypt, so timing does not tell which users exist
        ok = bcrypt.checkpw(password, hashed or _dummy_hash()) and hashed is not None
        if ok:
            self._ok.add(key)
        else:
            self._bad[key] = None
            while len(self._bad) > 1024:
                del self._bad[next(iter(self._bad))]
        return ok


@functools.cache
def _dummy_hash() -> bytes:
    """A bcrypt hash to check unknown users against (cost 10, like htpasswd -B's default)."""
    return bcrypt.hashpw(b"infercost-dummy", bcrypt.gensalt(rounds=10))
