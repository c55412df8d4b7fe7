"""The Prometheus endpoint: catalogue-driven, absent means absent, and promtool accepts the page."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from promstack import http_get_json

from agent.catalog import CATALOG
from agent.config import EngineConfig
from agent.cost.window import WindowJoiner
from agent.samples import EngineScrape, GpuSample, ModelSignals, NvmlRound
from agent.sinks.prometheus import PrometheusServer, render
from agent.snapshot import Ledger, Snapshot
from agent.sources.prices import parse_price_book

T0 = 1_780_000_000.0
ROOT = Path(__file__).resolve().parents[1]


def _snapshot(priced_gpu: str = "H100") -> Snapshot:
    book = parse_price_book({"gpus": [{"match": priced_gpu, "usd_per_hour": 3.6}]}, "book")
    engines = (EngineConfig(name="llama", url="http://x/metrics", gpus=(0,), model_version="v7"),)
    j = WindowJoiner("node-a", [e.cost_spec() for e in engines], book.table())
    led = Ledger("node-a", "0.1.0")

    def gpus(t: float, e: float) -> NvmlRound:
        return NvmlRound(
            timestamp=t,
            up=True,
            gpus=(
                GpuSample(
                    0,
                    "GPU-0",
                    "NVIDIA H100 80GB HBM3",
                    t,
                    util_gpu_ratio=0.9,
                    power_watts=600,
                    energy_joules=e,
                ),
                # GPU 1 does not support power readings: its power series must be absent
                GpuSample(1, "GPU-1", "NVIDIA H100 80GB HBM3", t, util_gpu_ratio=0.0),
            ),
        )

    def sc(t: float, g: float) -> dict[str, EngineScrape]:
        m = ModelSignals(
            "meta/llama", prompt_tokens_total=g / 2, generation_tokens_total=g, requests_running=4
        )
        return {"llama": EngineScrape("llama", "vllm", t, True, 0.01, (m,))}

    for k, (e, g) in enumerate([(0.0, 0.0), (6000.0, 2000.0), (12000.0, 4000.0)]):
        r = gpus(T0 + 10 * k, e)
        j.add_round(r)
        led.observe_nvml(r)
        for s in sc(T0 + 10 * k, g).values():
            led.observe_scrape(s)
        led.apply(j.close_tick(T0 + 10 * k, sc(T0 + 10 * k, g)))
    return led.snapshot()


def test_an_unpriced_gpu_exports_no_dollars_rather_than_zero() -> None:
    """The book prices no H100: dollars are unknown, so every dollar series is absent, not 0;
    tokens, power and utilisation are still known and exported."""
    names = {name for name, _ in _samples(render(_snapshot(priced_gpu="A100")).decode())}
    dollars = {n for n in names if "usd" in n}
    assert not dollars, dollars
    assert {"infercost_generation_tokens_total", "infercost_gpu_power_watts"} <= names
    priced = {name for name, _ in _samples(render(_snapshot()).decode())}
    assert {"infercost_cost_usd_total", "infercost_gpu_cost_usd_total"} <= priced


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def test_values_and_absence() -> None:
    text = render(_snapshot()).decode()
    s = _samples(text)
    model = frozenset(
        {"node": "node-a", "engine": "llama", "model": "meta/llama", "model_version": "v7"}.items()
    )
    # 20 s of one $3.60/h GPU = $0.02 for 4000 output tokens → $5 per 1M
    assert s[("infercost_cost_usd_total", model)] == 0.02
    assert s[("infercost_generation_tokens_total", model)] == 4000
    assert round(s[("infercost_usd_per_1m_output_tokens", model)], 6) == 5.0
    assert s[("infercost_generation_tokens_per_second", model)] == 200
    gpu1 = frozenset({"node": "node-a", "gpu": "1"}.items())
    assert ("infercost_gpu_power_watts", gpu1) not in s  # unsupported → absent, not 0
    assert s[("infercost_gpu_idle_cost_usd_total", gpu1)] == 0.02  # no engine uses GPU 1
    assert ("infercost_gpu_power_watts", frozenset({"node": "node-a", "gpu": "0"}.items())) in s
    assert not any(v != v for v in s.values())  # no NaN anywhere


def test_promtool_check_metrics_accepts_the_page() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: .ci/run installs the Debian 'prometheus' package"
    proc = subprocess.run(
        [promtool, "check", "metrics"], input=render(_snapshot()), capture_output=True, timeout=30
    )
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()


def test_catalogue_names_follow_conventions() -> None:
    for m in CATALOG:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", m.name), m.name
        assert (m.kind == "counter") == m.name.endswith("_total"), m.name
        assert not any(bad in m.name for bad in ("percent", "mib", "mhz", "milli")), m.name


async def test_http_endpoint_serves_metrics_and_healthz() -> None:
    snap = _snapshot()
    server = PrometheusServer(lambda: snap, lambda: True, "127.0.0.1", 0)
    await server.start()
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{server.port}/metrics") as r:
                assert r.status == 200
                assert r.headers["Content-Type"].startswith("text/plain")
                assert "infercost_usd_per_1m_output_tokens" in await r.text()
            async with s.get(f"http://127.0.0.1:{server.port}/healthz") as r:
                assert r.status == 200 and (await r.json())["status"] == "ok"
    finally:
        await server.stop()


def test_nvml_going_down_marks_every_gpu_down_and_drops_its_readings() -> None:
    led = Ledger("node-a", "0.1.0")
    led.observe_nvml(
        NvmlRound(
            T0,
            True,
            (GpuSample(0, "GPU-0", "NVIDIA H100 80GB HBM3", T0, util_gpu_ratio=0.9, power_watts=500),),
        )
    )
    led.observe_nvml(NvmlRound(T0 + 1, False, (), error="driver not loaded"))
    s = _samples(render(led.snapshot()).decode())
    gpu0 = frozenset({"node": "node-a", "gpu": "0"}.items())
    assert s[("infercost_nvml_up", frozenset({"node": "node-a"}.items()))] == 0
    assert s[("infercost_gpu_up", gpu0)] == 0
    assert ("infercost_gpu_power_watts", gpu0) not in s and ("infercost_gpu_utilization_ratio", gpu0) not in s


def test_trailing_p99_merges_the_ticks_observations() -> None:
    from agent.samples import Histogram
    from agent.snapshot import _merged_p99

    # tick 1: 100 fast requests (≤ 0.1 s); tick 2: 2 slow ones (≤ 1 s). Merged: 2 of 102 are slow,
    # so p99 lies in the slow bucket — the max of per-tick p99s would say the same only by luck
    fast = Histogram(((0.1, 100.0), (1.0, 100.0), (float("inf"), 100.0)), 5.0, 100.0)
    slow = Histogram(((0.1, 0.0), (1.0, 2.0), (float("inf"), 2.0)), 1.6, 2.0)
    p99 = _merged_p99([fast, None, slow])
    assert p99 is not None and 0.1 < p99 <= 1.0
    assert _merged_p99([fast]) is not None and _merged_p99([fast]) <= 0.1  # type: ignore[operator]
    assert _merged_p99([None]) is None


# ---------------------------------------------------------------------------------------------
# build info, process collector, alerts at 0, deploys, no duplicated $/h gauges
# ---------------------------------------------------------------------------------------------


def test_build_info_process_metrics_and_no_per_hour_duplicates() -> None:
    import platform

    from agent import __version__

    s = _samples(render(_snapshot()).decode())
    build = {"node": "node-a", "version": __version__, "python_version": platform.python_version()}
    assert s[("infercost_build_info", frozenset(build.items()))] == 1
    names = {name for name, _ in s}
    # the process collector: CPU seconds, resident memory, open fds, start time
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"} <= names
    assert not any(n.endswith("_usd_per_hour") and n != "infercost_gpu_price_usd_per_hour" for n in names)


def test_alerts_firing_is_zero_for_quiet_rules_and_stays_after_resolve() -> None:
    led = Ledger("node-a", "0.1.0")
    s = _samples(render(led.snapshot()).decode())
    assert not any(n == "infercost_alerts_firing" for n, _ in s)  # no rules loaded: nothing to say
    led.declare_alert_rules([("cost_regression", "critical"), ("engine_down", "warning")])
    led.set_alerts({("engine_down", "warning"): 2}, {"slack": 1})

    def firing() -> dict[str, float]:
        got = _samples(render(led.snapshot()).decode())
        return {dict(k)["rule"]: v for (n, k), v in got.items() if n == "infercost_alerts_firing"}

    assert firing() == {"cost_regression": 0, "engine_down": 2}
    led.set_alerts({}, {})
    assert firing() == {"cost_regression": 0, "engine_down": 0}  # resolved: 0, not a vanished series


def test_deploy_timestamp_marks_a_version_replacing_another() -> None:
    book = parse_price_book({"gpus": [{"match": "H100", "usd_per_hour": 3.6}]}, "book")
    engines = (EngineConfig(name="llama", url="http://x/metrics", gpus=(0,)),)
    j = WindowJoiner("node-a", [e.cost_spec() for e in engines], book.table())
    led = Ledger("node-a", "0.1.0")
    for k in range(4):
        t = T0 + 10 * k
        r = NvmlRound(t, True, (GpuSample(0, "GPU-0", "NVIDIA H100 80GB HBM3", t, util_gpu_ratio=0.5),))
        j.add_round(r)
        m = ModelSignals("meta/llama", prompt_tokens_total=100.0 * k, generation_tokens_total=100.0 * k)
        scrape = {"llama": EngineScrape("llama", "vllm", t, True, 0.01, (m,))}
        version = {"llama": "v1" if k < 2 else "v2"}  # the deployment moves to v2 at the 3rd tick
        led.apply(j.close_tick(t, scrape, version))
    s = _samples(render(led.snapshot()).decode())
    deploys = {
        dict(k)["model_version"]: v for (n, k), v in s.items() if n == "infercost_deploy_timestamp_seconds"
    }
    # v1 was serving when the agent started (no deploy seen); v2 replaced it in the tick ending T0+20
    assert deploys == {"v2": T0 + 20}


# ---------------------------------------------------------------------------------------------
# The page is rendered once per snapshot, off the event loop
# ---------------------------------------------------------------------------------------------


async def test_page_rendered_once_per_snapshot_for_many_scrapes() -> None:
    import asyncio

    snaps = [_snapshot()]
    server = PrometheusServer(lambda: snaps[-1], lambda: True, "127.0.0.1", 0)
    await server.start()
    url = f"http://127.0.0.1:{server.port}/metrics"
    try:
        async with aiohttp.ClientSession() as s:

            async def get() -> str:
                async with s.get(url) as r:
                    assert r.status == 200
                    return await r.text()

            pages = await asyncio.gather(*(get() for _ in range(20)))
            assert server.cache.renders == 1 and len(set(pages)) == 1
            assert "infercost_build_info" in pages[0]
            snaps.append(Ledger("node-b", "0.1.0").snapshot())  # the next tick's snapshot
            page = await get()
            assert server.cache.renders == 2 and 'node="node-b"' in page and 'node="node-a"' not in page
            async with s.get(url, headers={"Accept-Encoding": "gzip"}) as r:  # aiohttp inflates it
                assert r.headers["Content-Encoding"] == "gzip" and await r.text() == page
    finally:
        await server.stop()


# ---------------------------------------------------------------------------------------------
# HTTP hardening: idle floods, slow headers, oversized requests (real sockets)
# ---------------------------------------------------------------------------------------------

_IDLE_CLIENT = r"""
import resource, socket, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
port, n = int(sys.argv[1]), int(sys.argv[2])
socks = []
for _ in range(n):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    socks.append(s)  # connected and silent: never sends a byte
print(len(socks), flush=True)
sys.stdin.read()  # hold them until the test closes our stdin
"""


def _raw(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send raw bytes on a fresh connection; everything read until the server closes."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


async def test_a_thousand_idle_connections_do_not_lock_out_metrics_or_healthz() -> None:
    import asyncio
    import os
    import sys

    from agent.sinks.prometheus import ServerLimits

    snap = _snapshot()
    limits = ServerLimits(header_timeout_seconds=60.0, max_connections=64)  # the flood outlives no timeout
    server = PrometheusServer(lambda: snap, lambda: True, "127.0.0.1", 0, limits=limits)
    await server.start()
    fds_before = len(os.listdir("/proc/self/fd"))
    proc = subprocess.Popen(
        [sys.executable, "-c", _IDLE_CLIENT, str(server.port), "1000"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
        assert line.strip() == "1000"  # all 1,000 connected
        for _ in range(50):  # evicted sockets close on the loop's next turns
            held = len(os.listdir("/proc/self/fd")) - fds_before
            if held <= 64 + 2:
                break
            await asyncio.sleep(0.1)
        assert held <= 64 + 2, held  # the cap bounds the server's fds, not the flood
        conn = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=conn) as s:
            for path in ("/metrics", "/healthz", "/metrics"):
                async with s.get(f"http://127.0.0.1:{server.port}{path}") as r:
                    assert r.status == 200, path
        assert server.refused >= 1000 - 64
    finally:
        proc.communicate(timeout=10)
        await server.stop()


async def test_slow_headers_are_cut_off_and_oversized_requests_refused() -> None:
    import asyncio

    from agent.sinks.prometheus import ServerLimits

    snap = _snapshot()
    limits = ServerLimits(header_timeout_seconds=1.0)
    server = PrometheusServer(lambda: snap, lambda: True, "127.0.0.1", 0, limits=limits)
    await server.start()
    port = server.port
    try:
        t0 = asyncio.get_running_loop().time()
        # a slowloris: the request line and one header, then silence — closed, unanswered
        got = await asyncio.to_thread(_raw, port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        waited = asyncio.get_running_loop().time() - t0
        assert got == b"" and 1.0 <= waited < 9.0
        # a body over the cap: 413 without reading it
        big = b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\nConnection: close\r\n\r\n"
        assert (await asyncio.to_thread(_raw, port, big)).startswith(b"HTTP/1.1 413")
        # a header field over 8190 bytes: refused by the parser
        huge = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Junk: " + b"a" * 20000 + b"\r\n\r\n"
        assert b" 400 " in (await asyncio.to_thread(_raw, port, huge)).split(b"\r\n")[0]
        ok = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        assert (await asyncio.to_thread(_raw, port, ok)).startswith(b"HTTP/1.1 200")
    finally:
        await server.stop()


def test_the_renderer_writes_what_prometheus_client_writes() -> None:
    from dataclasses import replace

    from agent.sinks.prometheus import render_catalogue, render_with_client

    snap = _snapshot()
    hostile = replace(snap.models[0], model='we"ird\\name\nline2', model_version="v\\7")
    for s in (snap, replace(snap, models=(hostile,))):
        assert render_catalogue(s) == render_with_client(s)
    text = render_catalogue(replace(snap, models=(hostile,))).decode()
    assert 'model="we\\"ird\\\\name\\nline2"' in text  # escaped: one line per series
    assert 'model_version="v\\\\7"' in text


# ---------------------------------------------------------------------------------------------
# TLS and authentication (exporter-toolkit web-config)
# ---------------------------------------------------------------------------------------------


def _make_pki(d: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 signed by it (openssl; SAN as Go requires)."""
    openssl = shutil.which("openssl")
    assert openssl, "openssl missing (CI's .ci/run installs it)"

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, cwd=d)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
        "-days", "2", "-subj", "/CN=infercost test CA")  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out", "tls.csr",
        "-subj", "/CN=127.0.0.1")  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "tls.crt", "-days", "2", "-extfile", "san.ext")  # fmt: skip
    return d / "ca.crt", d / "tls.crt", d / "tls.key"


def _web_config(d: Path, tls: bool = True) -> Path:
    import bcrypt

    _make_pki(d)
    # htpasswd writes $2y$; cost 4 keeps the test fast (the server accepts any cost)
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode().replace("$2b$", "$2y$", 1)
    (d / "token").write_text("tok-123\n")
    doc: dict[str, object] = {"basic_auth_users": {"prom": hashed}, "bearer_token_file": "token"}
    if tls:
        doc["tls_server_config"] = {"cert_file": "tls.crt", "key_file": "tls.key"}
    path = d / "web.yml"
    import yaml

    path.write_text(yaml.safe_dump(doc))
    return path


def _basic(user: str, password: str) -> dict[str, str]:
    from base64 import b64encode

    return {"Authorization": "Basic " + b64encode(f"{user}:{password}".encode()).decode()}


async def test_tls_and_auth_from_a_web_config(tmp_path: Path) -> None:
    import ssl

    from agent.sinks.webconfig import load_web_config

    web = load_web_config(_web_config(tmp_path))
    snap = _snapshot()
    server = PrometheusServer(lambda: snap, lambda: True, "127.0.0.1", 0, web_config=web)
    await server.start()
    ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    base = f"https://127.0.0.1:{server.port}"
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s:
            for path in ("/metrics", "/healthz"):
                async with s.get(base + path) as r:  # no credentials
                    assert r.status == 401 and r.headers["WWW-Authenticate"].startswith("Basic")
            async with s.get(base + "/metrics", headers=_basic("prom", "guess")) as r:
                assert r.status == 401
            async with s.get(base + "/metrics", headers=_basic("nobody", "s3cret")) as r:
                assert r.status == 401
            for _ in range(2):  # the second is answered from the verified-pair cache
                async with s.get(base + "/metrics", headers=_basic("prom", "s3cret")) as r:
                    assert r.status == 200 and "infercost_build_info" in await r.text()
            async with s.get(base + "/healthz", headers={"Authorization": "Bearer tok-123"}) as r:
                assert r.status == 200
            async with s.get(base + "/healthz", headers={"Authorization": "Bearer tok-12"}) as r:
                assert r.status == 401
        # plain HTTP to the TLS port gets no page
        async with aiohttp.ClientSession() as s:
            try:
                async with s.get(f"http://127.0.0.1:{server.port}/metrics") as r:
                    assert r.status == 400
            except aiohttp.ClientError:
                pass
    finally:
        await server.stop()


def test_web_config_errors_name_the_key_and_hide_secrets(tmp_path: Path) -> None:
    from agent.config import ConfigError
    from agent.sinks.webconfig import load_web_config

    bad = tmp_path / "web.yml"
    bad.write_text("basic_auth_users:\n  prom: plaintext-password\n")
    with pytest.raises(ConfigError) as e:
        load_web_config(bad)
    assert "basic_auth_users.prom" in str(e.value) and "plaintext-password" not in str(e.value)
    bad.write_text("tls_server_config:\n  cert_file: missing.crt\n  key_file: missing.key\n")
    with pytest.raises(ConfigError, match=r"tls_server_config.cert_file.*missing.crt"):
        load_web_config(bad)
    bad.write_text("basic_auth_user: {}\n")  # a typo of the key
    with pytest.raises(ConfigError, match=r"basic_auth_user.*unknown key"):
        load_web_config(bad)


@pytest.mark.slow
def test_real_prometheus_scrapes_over_tls_with_basic_and_bearer_auth(tmp_path: Path) -> None:
    """Prometheus 2.42 scrapes the agent's endpoint with ``tls_config`` + ``basic_auth`` and with
    ``tls_config`` + ``authorization`` (Bearer); a job without credentials gets 401 (up = 0)."""
    import asyncio
    import threading

    from promstack import Prometheus

    from agent.sinks.webconfig import load_web_config

    web = load_web_config(_web_config(tmp_path))
    snap = _snapshot()
    loop = asyncio.new_event_loop()
    server = PrometheusServer(lambda: snap, lambda: True, "127.0.0.1", 0, web_config=web)
    loop.run_until_complete(server.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    (tmp_path / "password").write_text("s3cret")
    target = {"static_configs": [{"targets": [f"127.0.0.1:{server.port}"]}], "scheme": "https"}
    tls = {"ca_file": str(tmp_path / "ca.crt")}
    jobs = [
        {"job_name": "basic", **target, "tls_config": tls,
         "basic_auth": {"username": "prom", "password_file": str(tmp_path / "password")}},
        {"job_name": "bearer", **target, "tls_config": tls,
         "authorization": {"type": "Bearer", "credentials_file": str(tmp_path / "token")}},
        {"job_name": "anonymous", **target, "tls_config": tls},
    ]  # fmt: skip
    prom = None
    try:
        prom = Prometheus(tmp_path / "prom", scrape_configs=jobs)
        up = prom.wait_for('count(up{job=~"basic|bearer|anonymous"}) == 3', timeout=30)
        assert up, prom.log.read_text()[-2000:]
        got = {r["metric"]["job"]: r["value"][1] for r in prom.query('up{job=~"basic|bearer|anonymous"}')}
        assert got == {"basic": "1", "bearer": "1", "anonymous": "0"}
        # the scraped series arrived: the 20 s at $3.60/h of _snapshot() = $0.02
        cost = prom.query('infercost_cost_usd_total{job="bearer"}')
        assert [float(r["value"][1]) for r in cost] == [0.02]
        targets = http_get_json(f"{prom.url}/api/v1/targets")["data"]["activeTargets"]
        errors = {t["labels"]["job"]: t["lastError"] for t in targets}
        assert "401" in errors["anonymous"] and errors["basic"] == errors["bearer"] == ""
    finally:
        if prom is not None:
            prom.close()
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def test_refused_and_folded_series_are_counted_per_engine() -> None:
    """What the adapter refused or folded into model="other" is visible per engine, and 0 when none."""
    led = Ledger("node-a", "0.1.0")
    bad = ('generation_tokens_total: {model_name="m"} (+Inf)', "kv_cache_usage_ratio: {} (NaN)")
    led.observe_scrape(EngineScrape("hostile", "vllm", T0, True, 0.01, invalid_series=bad, dropped_series=7))
    led.observe_scrape(EngineScrape("calm", "vllm", T0, True, 0.01))
    s = _samples(render(led.snapshot()).decode())
    for engine, invalid, dropped in (("hostile", 2, 7), ("calm", 0, 0)):
        labels = frozenset({"node": "node-a", "engine": engine}.items())
        assert s[("infercost_engine_invalid_series", labels)] == invalid
        assert s[("infercost_engine_dropped_series", labels)] == dropped


def test_the_driver_version_nvml_reported_is_kept_across_rounds() -> None:
    led = Ledger("node-a", "0.1.0")
    gpu = GpuSample(0, "GPU-0", "NVIDIA H100 80GB HBM3", T0)
    led.observe_nvml(NvmlRound(timestamp=T0, up=True, gpus=(gpu,), driver_version="580.159.04"))
    assert led.snapshot().driver_version == "580.159.04"
    led.observe_nvml(NvmlRound(timestamp=T0 + 1, up=True, gpus=(gpu,)))  # a round that did not say
    assert led.snapshot().driver_version == "580.159.04"


def _churn_ledger(ticks: int, **kw: float) -> Ledger:
    """A node whose engine page names a new model every scrape (10 s apart), through the real join."""
    book = parse_price_book({"gpus": [{"match": "H100", "usd_per_hour": 3.6}]}, "book")
    engines = (EngineConfig(name="llama", url="http://x/metrics", gpus=(0,), model_version="v7"),)
    j = WindowJoiner("node-a", [e.cost_spec() for e in engines], book.table())
    led = Ledger("node-a", "0.1.0", **kw)  # type: ignore[arg-type]
    for k in range(ticks):
        t = T0 + 10 * k
        r = NvmlRound(timestamp=t, up=True, gpus=(GpuSample(0, "GPU-0", "NVIDIA H100 80GB HBM3", t),))
        models = tuple(
            ModelSignals(f"m{i}", prompt_tokens_total=10.0 * (k - i), generation_tokens_total=10.0 * (k - i))
            for i in (k - 1, k)
            if i >= 0
        )  # model i appears at scrape i and is gone after scrape i + 1
        scrape = {"llama": EngineScrape("llama", "vllm", t, True, 0.01, models)}
        j.add_round(r)
        led.observe_nvml(r)
        led.observe_scrape(scrape["llama"])
        led.apply(j.close_tick(t, scrape))
    return led


def test_model_names_not_seen_for_the_expiry_leave_metrics() -> None:
    led = _churn_ledger(100, expire_after_seconds=60.0)
    names = {m.model for m in led.snapshot().models}
    # 100 names came and went; only those seen in the last minute are left
    assert 0 < len(names) <= 8 and "m99" in names and "m0" not in names
    assert led.expired_series >= 90
    kept = _churn_ledger(100, expire_after_seconds=1e9)
    assert len(kept.snapshot().models) >= 99  # without expiry every name stays


def test_beyond_the_series_cap_the_least_recently_seen_go_first() -> None:
    led = _churn_ledger(50, expire_after_seconds=1e9, max_model_series=5)
    names = {m.model for m in led.snapshot().models}
    assert len(names) <= 5 and "m49" in names and "m0" not in names
