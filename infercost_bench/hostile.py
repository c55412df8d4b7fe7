"""``infercost bench hostile``: the real daemon under load and attack, one pass/fail line per case.

Everything runs on this machine and only ever talks to loopback: the daemon (``python -m agent.cli
run``, fake NVML, basic auth on ``/metrics``), a hostile engine server on 127.0.0.1 (one endpoint per
hostile page; until it is armed every endpoint serves a small valid page, so the daemon's steady
figures are read with the same engines), and a separate load process whose connections come from a
second loopback source address (127.0.0.2, still connecting to 127.0.0.1) for the brute force.

Cases:
- brute force: 64 connections guessing passwords for 30 s while Prometheus-like scrapes with the
  right password come from 127.0.0.1, each on a fresh connection; passes when at least 19 of 20 are
  answered (200) within 1 s. Printed: their latencies, the agent's CPU seconds, the guesses and their
  answers.
- hostile pages, all at once for 10 minutes (``--quick``: 2): a new model name every scrape, a
  100,000-bucket histogram, a page costing more CPU than its budget, a page that never answers, one
  over ``max_bytes``, a gzip bomb, binary garbage, a right-to-left override in a model name. Passes
  when the agent's RSS stays within its steady figure + 20 MB, the churning models on /metrics stay
  within what the series lifetime allows, each refused page is down with its reason named, and the
  good engine's counters keep advancing. Printed too: ``/metrics`` latency (the HTTP answer alone,
  one GET every 0.25 s throughout, from a process of its own), which passes when the slowest is
  under 200 ms.
- config reload: a bad price book edit keeps the last good one with one log line and
  ``infercost_config_reload_success`` 0; the fix sets it back to 1.
- check: ``infercost check`` refuses a rule duration beyond its maximum and warns on a book with only
  future prices.

Figures go with the machine they ran on; tests assert counts and bounds, never these times.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infercost_bench.procs import cpu_seconds, free_port, status_mb

PASSWORD = "right-horse-battery"
USER = "prom"
ATTACKER = "127.0.0.2"  # the load process's source address (it connects to 127.0.0.1)
BRUTE_CONNECTIONS = 64
BRUTE_SECONDS = 30.0
GOOD_SCRAPES = 20
GOOD_WITHIN_SECONDS = 1.0
GOOD_NEEDED = 19
RSS_HEADROOM_MB = 20.0
# /metrics while hostile pages are parsed: why 200 ms: a fifth of a second is what a person or a
# Prometheus scrape (timeouts of seconds) never notices, while a page parsed on the event loop
# stalls it for the page's whole parse (hundreds of ms to seconds).
METRICS_WITHIN_MS = 200.0
METRICS_EVERY_SECONDS = 0.25  # one right-password GET of /metrics this often during the hostile pages
SCRAPE_SECONDS = 1.0  # the daemon's scrape interval here: more hostile pages per minute than the default
SERIES_TTL_SECONDS = 60.0  # limits.series_ttl_seconds here (its least), so expiry shows within the run
# limits.scrape_cpu_seconds here: below what the costly page costs (about twice it), above the
# daemon's own longest full cyclic-GC pause, which is counted in whichever page is being parsed
CPU_BUDGET_SECONDS = 0.25
HOSTILE = ("churn", "buckets", "costly", "silent", "huge", "gzip", "garbage", "bidi")


# ------------------------------------------------------------------------------------------ pages
def _vllm(models: list[str], tokens: float, buckets: int = 8) -> str:
    out = []
    for m in models:
        out.append(f'vllm:generation_tokens_total{{model_name="{m}"}} {tokens:.1f}')
        out.append(f'vllm:prompt_tokens_total{{model_name="{m}"}} {tokens / 2:.1f}')
        out.append(f'vllm:num_requests_running{{model_name="{m}"}} 4')
        for i in range(buckets):
            out.append(
                f'vllm:e2e_request_latency_seconds_bucket{{le="{0.01 * (i + 1):g}",model_name="{m}"}} {i}'
            )
        out.append(f'vllm:e2e_request_latency_seconds_bucket{{le="+Inf",model_name="{m}"}} {buckets}')
        out.append(f'vllm:e2e_request_latency_seconds_count{{model_name="{m}"}} {buckets}')
        out.append(f'vllm:e2e_request_latency_seconds_sum{{model_name="{m}"}} 2.5')
    return "\n".join(out) + "\n"


class HostileServer:
    """The engine pages, on 127.0.0.1 in a thread of the bench (aiohttp)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.armed = False
        self.t0 = time.monotonic()
        self.requests: dict[str, int] = {}
        # 96 models of 1,000 buckets (999 bounds and +Inf, each within the bucket limit): about 7 MB,
        # under max_bytes, costing about twice the CPU budget, so it is refused while it is read
        self._costly = _vllm([f"lora-{i}" for i in range(96)], 1e6, buckets=999)
        self._buckets = _vllm(["m"], 1e6, buckets=100_000)
        self._bomb = gzip.compress(b"0" * (64 * 1024 * 1024), 9)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()
        self._ready.wait(30)

    def tokens(self) -> float:
        return 200.0 * (time.monotonic() - self.t0)

    def _serve(self) -> None:
        from aiohttp import web  # noqa: TID251 (the hostile engines are servers of the bench's own)

        async def page(request: web.Request) -> web.StreamResponse:
            try:
                return await serve(request)
            except (ConnectionError, OSError, RuntimeError):  # the agent hung up on a hostile page
                return web.Response(status=499)

        async def serve(request: web.Request) -> web.StreamResponse:
            name = request.match_info["name"]
            self.requests[name] = self.requests.get(name, 0) + 1
            n = self.requests[name]
            if name not in HOSTILE or not self.armed:
                return web.Response(text=_vllm([name], self.tokens()), content_type="text/plain")
            if name == "churn":
                return web.Response(text=_vllm([f"churn-{n}"], 100.0 * n), content_type="text/plain")
            if name == "buckets":
                return web.Response(text=self._buckets, content_type="text/plain")
            if name == "costly":
                return web.Response(text=self._costly, content_type="text/plain")
            if name == "silent":
                await asyncio.sleep(3600)
            if name == "huge":
                resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
                await resp.prepare(request)
                line = b'vllm:num_requests_running{model_name="h"} 1\n' * 1000
                for _ in range(300):  # 13 MB, over the 8 MiB max_bytes
                    await resp.write(line)
                return resp
            if name == "gzip":
                return web.Response(
                    body=self._bomb, headers={"Content-Type": "text/plain", "Content-Encoding": "gzip"}
                )
            if name == "garbage":
                return web.Response(body=os.urandom(256 * 1024), content_type="text/plain")
            # a right-to-left override and a zero-width joiner in a model name
            return web.Response(
                text=_vllm(["evil\u202egpj.exe\u200d"], self.tokens()), content_type="text/plain"
            )

        async def start() -> None:
            app = web.Application()
            app.router.add_get("/{name}/metrics", page)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            self._ready.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()


# ------------------------------------------------------------------------------------------ daemon
_PROBE = r"""
import base64, http.client, json, sys, time
port, auth, every, seconds = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
end = time.monotonic() + seconds
out = []
while time.monotonic() < end:
    t0 = time.perf_counter()
    status = 0
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/metrics", headers={"Authorization": "Basic " + auth})
        r = c.getresponse()
        r.read()
        status = r.status
        c.close()
    except OSError:
        pass
    took = time.perf_counter() - t0
    out.append([status, took])
    time.sleep(max(0.0, every - took))
print(json.dumps(out))
"""


class MetricsProbe:
    """GETs of /metrics with the right password every METRICS_EVERY_SECONDS for ``seconds``, from a
    process of its own (so the bench's own parsing and its engine server never delay them): each
    one's seconds until the whole answer is read."""

    def __init__(self, d: Daemon, seconds: float) -> None:
        auth = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _PROBE, str(d.port), auth, str(METRICS_EVERY_SECONDS), str(seconds)],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.seconds: list[float] = []
        self.failed = 0

    def __enter__(self) -> MetricsProbe:
        return self

    def __exit__(self, *_exc: object) -> None:
        out, _ = self._proc.communicate(timeout=120)
        for status, took in json.loads(out or "[]"):
            self.seconds.append(took)
            self.failed += status != 200


@dataclass
class Daemon:
    """The agent as a process, and what the bench reads of it."""

    tmp: Path
    engines_port: int
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    def start(self, engines: tuple[str, ...] = ("good", *HOSTILE), extra: str = "") -> None:
        import bcrypt

        t = self.tmp
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
        (t / "web.yml").write_text(f"basic_auth_users:\n  {USER}: '{hashed}'\n")
        self.book = t / "book.yaml"
        self.book.write_text("gpus:\n  - {match: H100, usd_per_hour: 2.5}\n")
        listed = "".join(
            f"  - {{name: {n}, kind: vllm, url: 'http://127.0.0.1:{self.engines_port}/{n}/metrics', "
            f"gpus: [{i}], timeout_seconds: 2}}\n"
            for i, n in enumerate(engines)
        )
        (t / "node.yaml").write_text(
            f"node: hostile-node\nstate_dir: {t / 'state'}\nnvml: {{backend: fake, fake_count: 16}}\n"
            f"intervals: {{nvml_seconds: 1, scrape_seconds: {SCRAPE_SECONDS}}}\n"
            f"prices: {{book: {self.book}}}\n"
            f"exporters: {{prometheus: {{port: {self.port}, web_config_file: {t / 'web.yml'}}}}}\n"
            f"limits: {{series_ttl_seconds: {SERIES_TTL_SECONDS}, "
            f"scrape_cpu_seconds: {CPU_BUDGET_SECONDS}}}\n"
            f"{extra}engines:\n{listed}"
        )
        self.log = t / "daemon.log"
        self._log = self.log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent.cli", "run", "--config", str(t / "node.yaml")],
            stdout=self._log,
            stderr=self._log,
        )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, bytes, float]:
        """(status, body, seconds) of one request with the right password on a fresh connection."""
        auth = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", headers={"Authorization": f"Basic {auth}"}
        )
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                body = r.read()
                return r.status, body, time.perf_counter() - t0
        except urllib.error.HTTPError as err:
            return err.code, err.read(), time.perf_counter() - t0
        except OSError:
            return 0, b"", time.perf_counter() - t0

    def health(self) -> dict[str, Any]:
        _, body, _ = self.get("/healthz")
        return json.loads(body) if body else {}

    def series(self, name: str) -> list[tuple[dict[str, str], float]]:
        from prometheus_client.parser import text_string_to_metric_families

        status, body, _ = self.get("/metrics")
        if status != 200:
            return []
        return [
            (s.labels, s.value)
            for fam in text_string_to_metric_families(body.decode())
            for s in fam.samples
            if s.name == name
        ]

    def log_lines(self, text: str) -> int:
        return sum(text in line for line in self.log.read_text(errors="replace").splitlines())

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


def _wait(pred: Callable[[], bool], timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.25)
    return False


# ------------------------------------------------------------------------------------------ cases
_LOAD = r"""
import base64, json, os, socket, sys, threading, time
port, n, seconds, source = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
end = time.monotonic() + seconds
codes = {}
lock = threading.Lock()
def worker(k):
    i = 0
    while time.monotonic() < end:
        i += 1
        guess = base64.b64encode(f"prom:guess-{k}-{i}".encode()).decode()
        code = "closed"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0)) as s:
                req = f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {guess}\r\n"
                s.sendall((req + "Connection: close\r\n\r\n").encode())
                head = s.recv(64)
                if head.startswith(b"HTTP/"):
                    code = head.split(b" ", 2)[1].decode()
        except OSError:
            pass
        with lock:
            codes[code] = codes.get(code, 0) + 1
threads = [threading.Thread(target=worker, args=(k,)) for k in range(n)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(codes))
"""


def brute_force(d: Daemon) -> bool:
    """Right-password scrapes during a 64-connection brute force from a separate load process."""
    d.get("/metrics")  # Prometheus has scraped before the attack: its credential is verified
    quiet0 = cpu_seconds(d.pid)
    time.sleep(10.0)
    quiet = (cpu_seconds(d.pid) - quiet0) / 10.0  # CPU seconds per second without the attack
    cpu0 = cpu_seconds(d.pid)
    load = subprocess.Popen(
        [sys.executable, "-c", _LOAD, str(d.port), str(BRUTE_CONNECTIONS), str(BRUTE_SECONDS), ATTACKER],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(2.0)  # the attack is under way
    gap = (BRUTE_SECONDS - 4.0) / GOOD_SCRAPES
    lat: list[float] = []
    ok = 0
    for _ in range(GOOD_SCRAPES):
        status, _, seconds = d.get("/metrics", timeout=10)
        lat.append(seconds)
        ok += status == 200 and seconds <= GOOD_WITHIN_SECONDS
        time.sleep(max(0.0, gap - seconds))
    out, _ = load.communicate(timeout=BRUTE_SECONDS + 60)
    cpu = cpu_seconds(d.pid) - cpu0
    codes = json.loads(out or "{}")
    lat.sort()
    passed = ok >= GOOD_NEEDED
    print(
        f"brute force      {'pass' if passed else 'FAIL'}  {ok} of {GOOD_SCRAPES} right-password scrapes "
        f"answered within {GOOD_WITHIN_SECONDS:g} s (target >= {GOOD_NEEDED}); latency median "
        f"{lat[len(lat) // 2] * 1000:.0f} ms, "
        f"slowest {lat[-1] * 1000:.0f} ms; agent CPU {cpu:.2f} s over the {BRUTE_SECONDS:.0f} s attack "
        f"({quiet * BRUTE_SECONDS:.2f} s in as long without it); "
        f"{BRUTE_CONNECTIONS} guessing connections made {sum(codes.values())} attempts, answered {codes}"
    )
    return passed


def hostile_pages(d: Daemon, server: HostileServer, seconds: float) -> list[bool]:
    """Every hostile page at once for ``seconds``: RSS, churn bound, reasons named, good engine on."""
    time.sleep(20.0)  # the steady state with every page small and valid
    samples = []
    for _ in range(10):
        samples.append(status_mb(d.pid, "VmRSS") or 0.0)
        time.sleep(1.0)
    steady = max(samples)
    good0 = sum(v for lb, v in d.series("infercost_generation_tokens_total") if lb.get("engine") == "good")
    cpu0, t0 = cpu_seconds(d.pid), time.monotonic()
    server.armed = True
    most_rss, most_churn = steady, 0
    live = int(SERIES_TTL_SECONDS / SCRAPE_SECONDS) + 2
    marks: list[float] = []  # RSS at each quarter of the run: a plateau or a climb
    with MetricsProbe(d, seconds) as probe:
        while time.monotonic() - t0 < seconds:
            rss = status_mb(d.pid, "VmRSS") or 0.0
            most_rss = max(most_rss, rss)
            if (time.monotonic() - t0) >= len(marks) * seconds / 4:
                marks.append(rss)
            churn = {
                lb.get("model")
                for lb, _ in d.series("infercost_generation_tokens_total")
                if lb.get("engine") == "churn"
            }
            most_churn = max(most_churn, len(churn))
            time.sleep(2.0)
    cpu = cpu_seconds(d.pid) - cpu0
    health = d.health().get("components", {}).get("engines", {})
    good1 = sum(v for lb, v in d.series("infercost_generation_tokens_total") if lb.get("engine") == "good")
    results = []
    rss_ok = most_rss <= steady + RSS_HEADROOM_MB
    print(
        f"RSS, all pages   {'pass' if rss_ok else 'FAIL'}  steady {steady:.1f} MB, at most {most_rss:.1f} MB "
        f"over {seconds / 60:.0f} min of every hostile page at once (target <= steady + "
        f"{RSS_HEADROOM_MB:.0f} MB; at each quarter {', '.join(f'{m:.0f}' for m in marks)} MB); "
        f"agent CPU {cpu / (time.monotonic() - t0) * 100:.1f} % of a core"
    )
    results.append(rss_ok)
    lat = sorted(probe.seconds)
    p50 = lat[len(lat) // 2] * 1000 if lat else float("nan")
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000 if lat else float("nan")
    slowest = lat[-1] * 1000 if lat else float("nan")
    lat_ok = bool(lat) and probe.failed == 0 and slowest < METRICS_WITHIN_MS
    print(
        f"/metrics latency {'pass' if lat_ok else 'FAIL'}  {len(lat)} GETs while every hostile page was "
        f"read: median {p50:.0f} ms, p99 {p99:.0f} ms, slowest {slowest:.0f} ms (target < "
        f"{METRICS_WITHIN_MS:.0f} ms), {probe.failed} not 200"
    )
    results.append(lat_ok)
    names = server.requests.get("churn", 0)
    churn_ok = 0 < most_churn <= live and names > 1.5 * live  # names enough to expire some
    print(
        f"model churn      {'pass' if churn_ok else 'FAIL'}  {names} model names served (a new one every "
        f"scrape), at "
        f"most {most_churn} on /metrics at once (bound {live}: series_ttl_seconds {SERIES_TTL_SECONDS:g} / "
        f"scrape {SCRAPE_SECONDS:g} s + 2)"
    )
    results.append(churn_ok)
    expect = {
        "buckets": "limits.max_histogram_buckets",
        "costly": "limits.scrape_cpu_seconds",
        "silent": "timeout",
        "huge": "max_bytes",
        "gzip": "compressed body",
        "garbage": "",  # not UTF-8 or binary
    }
    for name, why in expect.items():
        e = health.get(name, {})
        err = e.get("error") or ""
        good = e.get("state") == "down" and why in err
        print(f"page {name:<11} {'pass' if good else 'FAIL'}  {e.get('state')}: {err[:150]}")
        results.append(good)
    bidi = [
        lb.get("model", "")
        for lb, _ in d.series("infercost_generation_tokens_total")
        if lb.get("engine") == "bidi"
    ]
    invisible = re.compile("[\u202a-\u202e\u2066-\u2069\u200b-\u200f]")
    in_log = len(invisible.findall(d.log.read_text(errors="replace")))
    bidi_ok = bool(bidi) and in_log == 0
    print(
        f"page bidi        {'pass' if bidi_ok else 'FAIL'}  read (model label on /metrics as sent: "
        f"{bidi!r}); "
        f"invisible characters in the daemon's log: {in_log}"
    )
    results.append(bidi_ok)
    advancing = good1 > good0
    print(
        f"good engine      {'pass' if advancing else 'FAIL'}  generation tokens {good0:.0f} -> {good1:.0f} "
        "while attacked"
    )
    results.append(advancing)
    return results


def config_reload(d: Daemon) -> bool:
    """A bad price book edit: last good kept, one line, the gauge at 0; the fix: 1."""

    def gauge() -> float | None:
        got = d.series("infercost_config_reload_success")
        return got[0][1] if got else None

    good = d.book.read_text()
    d.book.write_text("gpus: [ {match: H100, usd_per_hour: oops\n")
    refused = _wait(lambda: gauge() == 0.0, 30)
    lines = d.log_lines("config reload after a change failed")
    d.book.write_text(good.replace("2.5", "2.75"))
    back = _wait(lambda: gauge() == 1.0, 30)
    _wait(lambda: {v for _, v in d.series("infercost_gpu_price_usd_per_hour")} == {2.75}, 10)  # next tick
    price = {v for _, v in d.series("infercost_gpu_price_usd_per_hour")}
    passed = refused and back and lines == 1
    print(
        f"config reload    {'pass' if passed else 'FAIL'}  bad book: gauge 0 {'yes' if refused else 'NO'}, "
        f"{lines} log line(s); fixed: gauge 1 {'yes' if back else 'NO'}, GPU prices now {sorted(price)}"
    )
    return passed


def check_cases(tmp: Path) -> list[bool]:
    """``infercost check`` on a rule of an absurd duration and on a book of future prices only."""
    rules = tmp / "rules"
    rules.mkdir()
    (rules / "r.yaml").write_text(
        "rules:\n  - id: forever\n    signal: usd_per_1m_output_tokens\n    over: 5m\n    op: '>'\n"
        "    threshold: 1\n    for: 99999999999999999999d\n    severity: warning\n    summary: x\n"
    )
    future = tmp / "future.yaml"
    future.write_text("gpus:\n  - {match: H100, usd_per_hour: 2.0, effective_from: '2999-01-01'}\n")
    out = []
    for what, cfg, want_rc, want in (
        ("check duration", f"alerts: {{rules_dirs: [{rules}]}}\nstate_dir: {tmp / 's1'}\n", 2, "at most"),
        (
            "check future",
            f"prices: {{book: {future}}}\nstate_dir: {tmp / 's2'}\n",
            0,
            "no gpu price is in effect",
        ),
    ):
        path = tmp / f"config-{what.split()[1]}.yaml"
        path.write_text(cfg + "exporters: {prometheus: {port: 0}}\n")
        r = subprocess.run(
            [sys.executable, "-m", "agent.cli", "check", "--config", str(path)],
            capture_output=True,
            text=True,
        )
        text = (r.stdout + r.stderr).strip().replace("\n", " | ")
        good = r.returncode == want_rc and want in text.lower()
        said = text[-170:] if r.returncode else text[text.lower().find(want) :][:170]  # the line that counts
        print(f"{what:<16} {'pass' if good else 'FAIL'}  exit {r.returncode}: {said}")
        out.append(good)
    return out


# ------------------------------------------------------------------------------------------ pods
PODS = 5_000
MAX_ENGINES = 256  # the default kubernetes.max_engines
KUBE_NODE = "gpu-node-1"
LOG_LINE_BYTES = 300  # an upper bound for one discovery line naming one pod (with its prefix)


class KubeServer:
    """The tests' local Kubernetes API server (list + watch) in a thread of the bench."""

    def __init__(self) -> None:
        root = Path(__file__).resolve().parents[1]
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
        from tests.kubeapi import FakeKubeApi, pod, write_kubeconfig

        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # its runner logs each request

        self.pod, self.write_kubeconfig = pod, write_kubeconfig
        self.api = FakeKubeApi()
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()

        def serve() -> None:
            self._loop.run_until_complete(self.api.start())
            ready.set()
            self._loop.run_forever()

        threading.Thread(target=serve, daemon=True).start()
        ready.wait(30)

    def engine_pod(self, i: int, port: int, ip: str = "127.0.0.1") -> dict[str, Any]:
        path = "/silent/metrics" if i % 6 == 0 else f"/pod-{i}/metrics"  # every sixth never answers
        return self.pod(
            f"engine-{i:05d}",
            node=KUBE_NODE,
            ip=ip,
            ports=(("metrics", port),),
            annotations={
                "infercost.io/scrape": "true",
                "infercost.io/engine": "vllm",
                "infercost.io/path": path,
            },
            rv=str(10_000 + i),
        )

    def put(self, obj: dict[str, Any]) -> None:
        self._loop.call_soon_threadsafe(self.api.put, obj)

    def emit(self, obj: dict[str, Any]) -> None:
        self._loop.call_soon_threadsafe(self.api.emit, "ADDED", obj)


def pods_case(tmp: Path, server: HostileServer, how: str) -> bool:
    """5,000 engine pods on the node, listed at start (``list``) or arriving by watch (``watch``),
    one of them at the cloud metadata address: the cap filled, the rest counted, the log bounded,
    /metrics and /healthz answering throughout, the static engine advancing."""
    kube = KubeServer()
    work = tmp / f"pods-{how}"
    work.mkdir()
    kubeconfig = kube.write_kubeconfig(work / "kubeconfig", kube.api.url)
    pods = [kube.engine_pod(i, server.port) for i in range(1, PODS)]
    pods.append(kube.engine_pod(PODS, server.port, ip="169.254.169.254"))  # the metadata service
    if how == "list":
        for p in pods:
            kube.put(p)
    d = Daemon(work, server.port)
    d.start(
        engines=("good",),
        extra=(
            f"kubernetes: {{enabled: true, node_name: {KUBE_NODE}, kubeconfig: {kubeconfig}, "
            "allow_loopback: true, pod_resources_socket: null}\n"
        ),
    )
    worst = {"/metrics": 0.0, "/healthz": 0.0}
    failed = 0
    try:
        if not _wait(lambda: d.get("/healthz", 2)[0] in (200, 503), 90):
            print(f"pods by {how:<6} FAIL  the daemon did not come up")
            return False
        t0 = time.monotonic()
        if how == "watch":
            for p in pods:
                kube.emit(p)
        good0 = sum(
            v for lb, v in d.series("infercost_generation_tokens_total") if lb.get("engine") == "good"
        )
        over = None
        while time.monotonic() - t0 < 180:
            for path in worst:
                status, _, seconds = d.get(path, timeout=10)
                worst[path] = max(worst[path], seconds)
                failed += status not in (200, 503)
            got = d.series("infercost_kube_engines_over_cap")
            over = got[0][1] if got else None
            if over == PODS - 1 - MAX_ENGINES:  # the metadata-address pod is no engine
                break
            time.sleep(0.5)
        took = time.monotonic() - t0
        time.sleep(3.0)
        taken = {lb.get("engine") for lb, _ in d.series("infercost_engine_up")} - {"good"}
        good1 = sum(
            v for lb, v in d.series("infercost_generation_tokens_total") if lb.get("engine") == "good"
        )
        log = d.log.read_text(errors="replace")
        refused = sum("169.254.169.254" in line for line in log.splitlines())
    finally:
        d.stop()
    log_bytes = len(log.encode())
    passed = (
        len(taken) == MAX_ENGINES
        and over == PODS - 1 - MAX_ENGINES
        and failed == 0
        and good1 > good0
        and refused >= 1
        and log_bytes <= (MAX_ENGINES + 50) * LOG_LINE_BYTES
    )
    print(
        f"pods by {how:<8} {'pass' if passed else 'FAIL'}  {PODS} pods: {len(taken)} taken in (cap "
        f"{MAX_ENGINES}), {over:.0f} counted over the cap, in {took:.1f} s; slowest /metrics "
        f"{worst['/metrics'] * 1000:.0f} ms, /healthz {worst['/healthz'] * 1000:.0f} ms, {failed} failed; "
        f"static engine {good0:.0f} -> {good1:.0f} tokens; metadata-address pod refused "
        f"({refused} log line(s)); log {log_bytes / 1024:.0f} kB"
        if over is not None
        else f"pods by {how:<8} FAIL  no infercost_kube_engines_over_cap on /metrics after {took:.0f} s"
    )
    return passed


def run(quick: bool = False) -> int:
    """Run every case; print one line each (pass or FAIL with its figures); 0 once all have run."""
    seconds = 120.0 if quick else 600.0
    print(
        f"infercost bench hostile{' --quick' if quick else ''}: the daemon as a process, basic auth (bcrypt "
        f"cost 10), scrape every {SCRAPE_SECONDS:g} s, {1 + len(HOSTILE)} engines; hostile pages for "
        f"{seconds / 60:.0f} min"
    )
    results: list[bool] = []
    with tempfile.TemporaryDirectory(prefix="infercost-hostile-") as tmp_name:
        tmp = Path(tmp_name)
        server = HostileServer()
        d = Daemon(tmp, server.port)
        d.start()
        try:
            if not _wait(lambda: d.get("/healthz", 2)[0] == 200, 90):
                print("the daemon did not come up:", d.log.read_text()[-2000:])
                return 1
            results.append(brute_force(d))
            results += hostile_pages(d, server, seconds)
            results.append(config_reload(d))
            results.append(d.proc is not None and d.proc.poll() is None)
        finally:
            d.stop()
        log_kb = d.log.stat().st_size / 1024
        print(f"daemon log       {log_kb:.0f} kB over the whole run")
        for how in ("list", "watch"):
            results.append(pods_case(tmp, server, how))
        results += check_cases(tmp)
    passed = sum(results)
    print(f"{passed} of {len(results)} checks passed")
    return 0  # it ran: each case's verdict is in its line (1 only when the daemon could not start)


if __name__ == "__main__":
    raise SystemExit(run(quick="--quick" in sys.argv))
