"""Deployment metadata (downward-API labels files) and discovery of engines on local ports."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web
from netutil import free_port

from agent.config import EngineConfig
from agent.sources.discovery import VersionReader, discover_local_engines, parse_labels_file


def test_labels_file_as_kubernetes_writes_it() -> None:
    text = 'app.kubernetes.io/name="vllm"\napp.kubernetes.io/version="2024-09"\npod-template-hash="7d9f"\n'
    assert parse_labels_file(text) == {
        "app.kubernetes.io/name": "vllm",
        "app.kubernetes.io/version": "2024-09",
        "pod-template-hash": "7d9f",
    }


def test_version_reader_follows_a_rollout_and_survives_a_missing_file(tmp_path: Path) -> None:
    f = tmp_path / "labels"
    eng = EngineConfig(name="e", url="http://x/metrics", version_file=f)
    reader = VersionReader([eng])
    assert reader.read() == {}  # missing file: no version (logged once), no crash
    f.write_text('app.kubernetes.io/version="v1"\n')
    assert reader.read() == {"e": "v1"}
    f.write_text('app.kubernetes.io/version="v2"\n')
    assert reader.read() == {"e": "v2"}


async def test_discovery_finds_only_ports_that_answer_metrics() -> None:
    app = web.Application()
    app.router.add_get("/metrics", lambda _r: web.Response(text="vllm:num_requests_running 0\n"))
    runner = web.AppRunner(app)
    await runner.setup()
    up = free_port()
    await web.TCPSite(runner, "127.0.0.1", up).start()
    try:
        found = await discover_local_engines(ports={"vllm": up, "sglang": free_port()}, timeout=1.0)
    finally:
        await runner.cleanup()
    assert [(e.name, e.url, e.kind) for e in found] == [
        (f"vllm-{up}", f"http://127.0.0.1:{up}/metrics", "auto")
    ]


def test_a_garbled_version_file_is_skipped_not_fatal(tmp_path: Path) -> None:
    f = tmp_path / "labels"
    f.write_bytes(b'app.kubernetes.io/version="\xff\xfe"\n')
    reader = VersionReader([EngineConfig(name="e", url="http://x/metrics", version_file=f)])
    assert reader.read() == {}
