"""The command line as a user runs it: exit codes, messages, a daemon that stops cleanly on SIGTERM."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "agent.cli"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60)


def test_check_accepts_the_bundled_defaults() -> None:
    ok = _run("check")
    assert ok.returncode == 0, ok.stderr
    assert "rules: ok" in ok.stdout and "price book" in ok.stdout


@pytest.mark.parametrize(
    ("files", "needles"),
    [
        ({"node.yaml": "engines: [{name: a, url: 'localhost:80'}]"}, ["node.yaml", "engines.0.url", "fix:"]),
        ({"node.yaml": "prices: {book: BOOK}", "book.yaml": "gpus: [{match: H100, usd_per_hour: -3}]"},
         ["book.yaml", "gpus.0.usd_per_hour"]),
        ({"node.yaml": "alerts: {rules_dirs: [RULES]}", "rules/r.yaml": "rules: [{id: x, signal: nope}]"},
         ["r.yaml", "rule 'x'", "fix:"]),
    ],
)  # fmt: skip
def test_bad_files_exit_2_naming_file_key_and_fix(
    tmp_path: Path, files: dict[str, str], needles: list[str]
) -> None:
    for name, text in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(
            text.replace("BOOK", str(tmp_path / "book.yaml")).replace("RULES", str(tmp_path / "rules"))
        )
    proc = _run("check", "--config", str(tmp_path / "node.yaml"))
    assert proc.returncode == 2
    for n in needles:
        assert n in proc.stderr


def test_run_serves_metrics_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = tmp_path / "node.yaml"
    cfg.write_text(
        f"node: cli-test\nstate_dir: {tmp_path / 'state'}\nnvml: {{backend: fake, fake_count: 2}}\n"
        f"intervals: {{nvml_seconds: 0.5, scrape_seconds: 0.5}}\n"
        f"exporters: {{prometheus: {{port: {port}}}}}\n"
    )
    proc = subprocess.Popen([*CLI, "run", "--config", str(cfg)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        body = ""
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
                    body = r.read().decode()
                if 'infercost_gpu_cost_usd_total{gpu="1",node="cli-test"}' in body:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        assert 'infercost_gpu_idle_cost_usd_total{gpu="1",node="cli-test"}' in body
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "agent stopped" in (proc.stderr.read() if proc.stderr else "")
    assert (tmp_path / "state" / "history.sqlite").exists()
