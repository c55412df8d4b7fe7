"""The price book and rule files reloaded while the daemon runs: on SIGHUP and on change, the last good
version kept on a bad edit with one log line and ``infercost_config_reload_success`` 0. The daemon is
a real process (``python -m agent.cli run``); its signal is a real SIGHUP."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from netutil import free_port, wait_until
from procs import terminate
from prometheus_client.parser import text_string_to_metric_families

RULE = """rules:
  - id: {id}
    signal: usd_per_1m_output_tokens
    over: 5m
    op: ">"
    threshold: 1000
    severity: warning
    summary: "{{model}} costs {{value}}"
"""


def _book(price: float) -> str:
    return f"gpus:\n  - {{match: H100, usd_per_hour: {price}}}\n"


class Daemon:
    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.book = tmp / "book.yaml"
        self.book.write_text(_book(2.0))
        self.rules = tmp / "rules"
        self.rules.mkdir()
        (self.rules / "a.yaml").write_text(RULE.format(id="cost_high"))
        cfg = tmp / "node.yaml"
        cfg.write_text(
            f"node: reload-node\nstate_dir: {tmp / 'state'}\nnvml: {{backend: fake, fake_count: 2}}\n"
            "intervals: {nvml_seconds: 0.5, scrape_seconds: 0.5}\n"
            f"prices: {{book: {self.book}}}\nalerts: {{rules_dirs: [{self.rules}]}}\n"
            f"exporters: {{prometheus: {{port: {self.port}}}}}\nengines: []\n"
        )
        self.log = tmp / "daemon.log"
        self._log = self.log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent.cli", "run", "--config", str(cfg)],
            stderr=self._log,
        )

    def series(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as r:
                text = r.read().decode()
        except OSError:
            return {}
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out.setdefault(s.name, []).append((s.labels, s.value))
        return out

    def reload_success(self) -> float | None:
        got = self.series().get("infercost_config_reload_success")
        return got[0][1] if got else None

    def prices(self) -> set[float]:
        return {v for _, v in self.series().get("infercost_gpu_price_usd_per_hour", [])}

    def rules_exported(self) -> set[str]:
        return {labels["rule"] for labels, _ in self.series().get("infercost_alerts_firing", [])}

    def lines(self, text: str) -> int:
        return sum(text in line for line in self.log.read_text().splitlines())


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path)
    try:
        wait_until(lambda: d.prices() == {2.0}, timeout=60, what="daemon up, priced")
        yield d
    finally:
        terminate(d.proc)
        d._log.close()


def test_sighup_and_edits_reload_keeping_the_last_good_version(daemon: Daemon) -> None:
    d = daemon
    assert d.reload_success() == 1.0 and d.rules_exported() == {"cost_high"}
    # a good edit, then SIGHUP: taken at once
    d.book.write_text(_book(3.0))
    d.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: d.prices() == {3.0}, timeout=30, what="new price after SIGHUP")
    assert d.proc.poll() is None and d.reload_success() == 1.0
    assert d.lines("config reloaded after SIGHUP") == 1
    # a bad edit, no signal: noticed by the watch, refused, the last good book kept, one line
    d.book.write_text("gpus: [ {match: H100, usd_per_hour: -1 ]\n")
    wait_until(lambda: d.reload_success() == 0.0, timeout=30, what="reload refused")
    assert d.lines("config reload after a change failed") == 1
    time.sleep(12)  # two more polls of the unchanged bad file
    assert d.lines("config reload after a change failed") == 1 and d.prices() == {3.0}
    # a rule file added: the new rule set taken (exported at 0), the price book fixed at the same time
    (d.rules / "b.yaml").write_text(RULE.format(id="cost_higher"))
    d.book.write_text(_book(4.0))
    wait_until(lambda: d.reload_success() == 1.0, timeout=30, what="good again")
    wait_until(lambda: d.rules_exported() >= {"cost_high", "cost_higher"}, timeout=30, what="new rule")
    wait_until(lambda: d.prices() == {4.0}, timeout=30, what="the fixed book's price")
    before = d.lines("config reload after a change failed")  # 1, or 2 if a poll fell between the writes
    # a broken rule file: refused, with its file named in the one line; the price edit with it waits
    (d.rules / "b.yaml").write_text("rules:\n  - id: broken\n    signal: no_such_signal\n")
    d.book.write_text(_book(5.0))
    wait_until(lambda: d.reload_success() == 0.0, timeout=30, what="bad rules refused")
    failed = [
        line for line in d.log.read_text().splitlines() if "config reload after a change failed" in line
    ]
    assert len(failed) == before + 1 and "b.yaml" in failed[-1]
    assert d.prices() == {4.0}  # all or nothing: the good book waits for good rules
    d.proc.send_signal(signal.SIGHUP)  # SIGHUP on the same bad files: tried again, refused again
    wait_until(lambda: d.lines("config reload after SIGHUP failed") == 1, timeout=30, what="SIGHUP retry")
    assert d.proc.poll() is None and d.reload_success() == 0.0
