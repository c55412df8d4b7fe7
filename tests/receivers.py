"""Local stand-ins for Slack's incoming webhooks, PagerDuty's Events API v2, an Alertmanager-style
webhook receiver and Alertmanager's ``POST /api/v2/alerts`` (aiohttp on 127.0.0.1, a free port),
and :class:`ThreadedReceiver`, the same vendors in a thread for synchronous tests.

Each receiver checks every body against the vendor's documented shape and answers like the vendor
(Slack: 200 "ok"; PagerDuty: 202 with a JSON status, 400 for an invalid event). A test can take it
down (connection refused) and up again on the same port, or script the next answers (429 with
Retry-After, 5xx, ...) or make it hang (never answer) until it is stopped. ``received`` holds the
accepted bodies in arrival order, ``raw`` their bytes.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

from aiohttp import web

Kind = Literal["slack", "pagerduty", "webhook", "alertmanager"]

SLACK_COLORS = {"good", "warning", "danger"}
PD_ACTIONS = {"trigger", "acknowledge", "resolve"}
PD_SEVERITIES = {"critical", "error", "warning", "info"}
RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


def validate_slack(body: Any) -> list[str]:
    """Problems with a Slack incoming-webhook body (api.slack.com/messaging/webhooks)."""
    errs: list[str] = []
    if not isinstance(body, dict):
        return ["body is not a JSON object"]
    if not any(body.get(k) for k in ("text", "attachments", "blocks")):
        errs.append("needs text, attachments or blocks")
    for i, a in enumerate(body.get("attachments") or []):
        if not isinstance(a, dict):
            errs.append(f"attachments[{i}] is not an object")
            continue
        if not (a.get("fallback") or a.get("text")):
            errs.append(f"attachments[{i}] needs fallback or text")
        color = a.get("color")
        if color is not None and color not in SLACK_COLORS and not re.fullmatch(r"#[0-9A-Fa-f]{6}", color):
            errs.append(f"attachments[{i}].color {color!r} is not good/warning/danger/#hex")
        for j, f in enumerate(a.get("fields") or []):
            if not isinstance(f, dict) or not isinstance(f.get("title"), str) or "value" not in f:
                errs.append(f"attachments[{i}].fields[{j}] needs title and value")
    if "channel" in body and not isinstance(body["channel"], str):
        errs.append("channel must be a string")
    return errs


def validate_pagerduty(body: Any) -> list[str]:
    """Problems with a PagerDuty Events API v2 body (developer.pagerduty.com, Send an Event)."""
    if not isinstance(body, dict):
        return ["body is not a JSON object"]
    errs: list[str] = []
    if not isinstance(body.get("routing_key"), str) or len(body["routing_key"]) != 32:
        errs.append("routing_key must be a 32-character string")
    action = body.get("event_action")
    if action not in PD_ACTIONS:
        errs.append(f"event_action {action!r} is not trigger/acknowledge/resolve")
    key = body.get("dedup_key")
    if action in ("acknowledge", "resolve") and not key:
        errs.append("dedup_key is required to acknowledge or resolve")
    if key is not None and (not isinstance(key, str) or len(key) > 255):
        errs.append("dedup_key must be a string of at most 255 characters")
    p = body.get("payload")
    if action == "trigger" or p is not None:
        if not isinstance(p, dict):
            errs.append("payload is required for trigger")
        else:
            if not isinstance(p.get("summary"), str) or not p["summary"] or len(p["summary"]) > 1024:
                errs.append("payload.summary must be 1–1024 characters")
            if not isinstance(p.get("source"), str) or not p["source"]:
                errs.append("payload.source is required")
            if p.get("severity") not in PD_SEVERITIES:
                errs.append(f"payload.severity {p.get('severity')!r} is not critical/error/warning/info")
            if "timestamp" in p and not RFC3339.match(str(p["timestamp"])):
                errs.append("payload.timestamp must be ISO 8601")
            if "custom_details" in p and not isinstance(p["custom_details"], dict | str):
                errs.append("payload.custom_details must be an object")
    for link in body.get("links") or []:
        if not isinstance(link, dict) or "href" not in link:
            errs.append("links[] need href")
    return errs


def validate_webhook(body: Any) -> list[str]:
    """Problems with an Alertmanager webhook (version 4) body."""
    if not isinstance(body, dict):
        return ["body is not a JSON object"]
    errs: list[str] = []
    for k, t in (
        ("receiver", str),
        ("status", str),
        ("alerts", list),
        ("groupLabels", dict),
        ("commonLabels", dict),
        ("commonAnnotations", dict),
        ("externalURL", str),
        ("version", str),
        ("groupKey", str),
    ):
        if not isinstance(body.get(k), t):
            errs.append(f"{k} must be a {t.__name__}")
    if body.get("version") != "4":
        errs.append("version must be '4'")
    if body.get("status") not in ("firing", "resolved"):
        errs.append("status must be firing or resolved")
    for i, a in enumerate(body.get("alerts") or []):
        if a.get("status") not in ("firing", "resolved"):
            errs.append(f"alerts[{i}].status")
        if "alertname" not in (a.get("labels") or {}):
            errs.append(f"alerts[{i}].labels.alertname is required")
        for k in ("startsAt", "endsAt"):
            if not RFC3339.match(str(a.get(k))):
                errs.append(f"alerts[{i}].{k} must be RFC 3339")
        if not isinstance(a.get("fingerprint"), str) or not a["fingerprint"]:
            errs.append(f"alerts[{i}].fingerprint is required")
    return errs


LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def validate_alertmanager(body: Any) -> list[str]:
    """Problems with a ``POST /api/v2/alerts`` body (Alertmanager's openapi: postableAlerts)."""
    if not isinstance(body, list):
        return ["body is not a JSON array of alerts"]
    errs: list[str] = []
    for i, a in enumerate(body):
        if not isinstance(a, dict):
            errs.append(f"[{i}] is not an object")
            continue
        labels = a.get("labels")
        if not isinstance(labels, dict) or not labels:
            errs.append(f"[{i}].labels is required")
        else:
            for k, v in labels.items():
                if not LABEL_NAME.match(k):
                    errs.append(f"[{i}].labels: invalid label name {k!r}")
                if not isinstance(v, str) or v == "":
                    errs.append(f"[{i}].labels.{k} must be a non-empty string")
        ann = a.get("annotations", {})
        if not isinstance(ann, dict) or not all(isinstance(v, str) for v in ann.values()):
            errs.append(f"[{i}].annotations must map names to strings")
        for k in ("startsAt", "endsAt"):
            if k in a and not RFC3339.match(str(a[k])):
                errs.append(f"[{i}].{k} must be RFC 3339")
        if "generatorURL" in a and not re.match(r"^https?://", str(a["generatorURL"])):
            errs.append(f"[{i}].generatorURL must be a URI")
    return errs


VALIDATORS = {
    "slack": validate_slack,
    "pagerduty": validate_pagerduty,
    "webhook": validate_webhook,
    "alertmanager": validate_alertmanager,
}


@dataclass
class Receiver:
    """One fake vendor endpoint; ``await start()``, use ``url``, ``await stop()`` at the end."""

    kind: Kind
    path: str = "/hook"
    received: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # shape problems found (the answer was 400)
    requests: int = 0  # every request that reached the receiver
    script: deque[tuple[int, dict[str, str], str | None]] = field(default_factory=deque)
    raw: list[bytes] = field(default_factory=list)  # accepted bodies as received
    hang: bool = False  # never answer (until stop)
    port: int = 0
    _runner: web.AppRunner | None = None
    _release: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def url(self) -> str:
        """Where to post."""
        return f"http://127.0.0.1:{self.port}{self.path}"

    def answer_next(
        self, status: int, headers: dict[str, str] | None = None, body: str | None = None
    ) -> None:
        """Make the next request get this answer (before validation)."""
        self.script.append((status, headers or {}, body))

    async def _handle(self, request: web.Request) -> web.Response:
        self.requests += 1
        if self.hang:
            await self._release.wait()
            return web.Response(status=503, text="gone")
        if self.script:
            status, headers, text = self.script.popleft()
            # like a misbehaving proxy: echo the request path (it may hold a secret)
            return web.Response(status=status, headers=headers, text=text or f"error at {request.path}")
        data = await request.read()
        try:
            body = json.loads(data)
        except ValueError:
            return self._invalid(["body is not JSON"])
        problems = VALIDATORS[self.kind](body)
        if problems:
            return self._invalid(problems)
        self.received.append(body)
        self.raw.append(data)
        if self.kind == "slack":
            return web.Response(status=200, text="ok")
        if self.kind == "pagerduty":
            return web.json_response(
                {"status": "success", "message": "Event processed", "dedup_key": body.get("dedup_key")},
                status=202,
            )
        return web.Response(status=200)

    def _invalid(self, problems: list[str]) -> web.Response:
        self.errors.extend(problems)
        if self.kind == "pagerduty":
            return web.json_response(
                {"status": "invalid event", "message": "Event object is invalid", "errors": problems},
                status=400,
            )
        return web.Response(status=400, text="invalid_payload")

    async def start(self) -> None:
        """Listen (on a free port the first time, on the same port afterwards)."""
        self._release = asyncio.Event()
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        if self.port == 0:
            server = site._server
            assert server is not None
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        """Go down: connections are refused until ``start()``."""
        self._release.set()  # hanging requests answer now
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


class ThreadedReceiver:
    """For synchronous tests (Alertmanager posting to "Slack" and "PagerDuty"): one server, the vendor
    chosen by path (``/slack…``, ``/pagerduty…``, anything else a webhook). It records every POST
    (path, headers, JSON body), answers like the vendor and notes in ``errors`` each body that does
    not have the vendor's documented shape (the validators above)."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, str], Any]] = []
        self.errors: list[str] = []  # "path: problem" for bodies not in the vendor's shape
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                data = json.loads(body or b"null")
                kind: Kind = "pagerduty" if self.path.startswith("/pagerduty") else "slack"
                if not self.path.startswith(("/pagerduty", "/slack")):
                    kind = "webhook"
                with outer._lock:
                    outer.received.append((self.path, dict(self.headers), data))
                    outer.errors.extend(f"{self.path}: {e}" for e in VALIDATORS[kind](data))
                if kind == "pagerduty":
                    reply, code = b'{"status":"success","message":"Event processed"}', 202
                else:
                    reply, code = b"ok", 200
                self.send_response(code)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self._server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def bodies(self, path: str) -> list[Any]:
        """JSON bodies received on ``path``."""
        with self._lock:
            return [b for p, _, b in self.received if p == path]

    def wait(self, path: str, pred: Any, timeout: float = 20.0) -> list[Any]:
        """Poll until a body on ``path`` satisfies ``pred``; the matching bodies."""
        deadline = time.monotonic() + timeout
        while True:
            hits = [b for b in self.bodies(path) if pred(b)]
            if hits or time.monotonic() > deadline:
                return hits
            time.sleep(0.1)

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
