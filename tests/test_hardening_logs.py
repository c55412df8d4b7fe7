"""Log lines that tell the whole story and hide nothing: with many engines down at once every one
of them is named (the flood limit is per engine, not per line of code), still bounded; and no
invisible formatting character from a name reaches a text or JSON log line."""

from __future__ import annotations

import io
import json
import logging
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from agent.logs import MAX_SUBJECTS, JsonFormatter, RateLimitFilter

ROOT = Path(__file__).resolve().parents[1]
DOWN = "engine %s (%s) is down: %s%s"  # the scraper's line


def down(log: logging.Logger, engine: str, reason: str = "connection failed") -> None:
    """One place in the code, as the scraper's down line is."""
    log.warning(DOWN, engine, "http://127.0.0.1:9/metrics", reason, "")


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def kept() -> Iterator[tuple[logging.Logger, list[logging.LogRecord], Clock]]:
    clock = Clock()
    out: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            out.append(record)

    h = Keep()
    h.addFilter(RateLimitFilter(interval=60.0, monotonic=clock))
    log = logging.getLogger("test.hardening.logs")
    log.addHandler(h)
    log.propagate = False
    log.setLevel(logging.DEBUG)
    try:
        yield log, out, clock
    finally:
        log.removeHandler(h)


def test_each_engine_going_down_gets_its_own_line_and_a_repeat_is_still_held(
    kept: tuple[logging.Logger, list[logging.LogRecord], Clock],
) -> None:
    log, out, clock = kept
    for i in range(21):
        down(log, f"engine-{i:02d}")
    assert [r.args[0] for r in out if isinstance(r.args, tuple)] == [f"engine-{i:02d}" for i in range(21)]
    out.clear()
    for _ in range(5):  # the same engine again within the interval: held back
        clock.now += 1.0
        down(log, "engine-00", "timeout after 2 s")
    assert out == []
    clock.now = 61.0
    down(log, "engine-00", "timeout after 2 s")
    (line,) = [r.getMessage() for r in out]
    assert line.startswith("engine engine-00 ") and "[5 similar messages held back" in line


def test_distinct_subjects_are_bounded_per_place_and_the_rest_are_counted(
    kept: tuple[logging.Logger, list[logging.LogRecord], Clock],
) -> None:
    log, out, clock = kept
    n = MAX_SUBJECTS + 40
    for i in range(n):
        down(log, f"e{i}", "HTTP 503")
    # every subject up to the bound, then one line for all the others together
    assert len(out) == MAX_SUBJECTS + 1
    clock.now = 61.0
    out.clear()
    down(log, f"e{n + 1}", "HTTP 503")
    for text in ("x", "y"):  # a line with no subject keeps its one limit per place
        log.warning("malformed line %r", text)
    assert len(out) == 2
    assert out[0].getMessage().startswith(f"engine e{n + 1} ")
    extra = logging.getLogger("test.hardening.logs")
    for i in range(3):  # an explicit subject, for a line whose template does not start with it
        extra.warning("could not record the build (%s)", "boom", extra={"subject": f"x{i}"})
    assert len(out) == 5


def test_invisible_characters_leave_message_and_arguments_but_json_values_stay_typed(
    kept: tuple[logging.Logger, list[logging.LogRecord], Clock],
) -> None:
    log, out, _ = kept
    labels = {"model": "llama\u202e-70b\u200b", "gpus": [0, 1]}
    log.warning("model %s\u2066 on %d GPUs: %s", "ev\u202eil\ufeff", 4, labels)
    (record,) = out
    text = record.getMessage()
    assert text == "model evil on 4 GPUs: {'model': 'llama-70b', 'gpus': [0, 1]}"
    doc = json.loads(JsonFormatter().format(record))
    assert doc["msg"] == text and doc["args"] == ["evil", 4, {"model": "llama-70b", "gpus": [0, 1]}]
    assert not re.search(
        "[\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]", json.dumps(doc, ensure_ascii=False)
    )


def test_a_traceback_naming_a_hostile_value_loses_its_invisible_characters(
    kept: tuple[logging.Logger, list[logging.LogRecord], Clock],
) -> None:
    log, out, _ = kept
    try:
        raise ValueError("unknown model 'ev\u202eil\u200d'")
    except ValueError:
        log.exception("scrape failed")
    (record,) = out
    for text in (logging.Formatter().format(record), JsonFormatter().format(record)):
        assert "unknown model 'evil'" in text and "Traceback" in text
        assert not re.search("[\u200d\u202e]", text)


def _free_ports(n: int) -> list[int]:
    """Ports on 127.0.0.1 that nothing listens on (bound, then released)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.mark.slow
def test_the_daemon_with_21_engines_down_names_every_one_of_them(tmp_path: Path) -> None:
    """``infercost run`` as a process, its engines on 127.0.0.1 ports nothing listens on."""
    ports = _free_ports(21)
    names = [f"engine-{i:02d}" for i in range(21)]
    cfg = tmp_path / "node.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "node": "n1",
                "state_dir": str(tmp_path / "state"),
                "exporters": {"prometheus": {"enabled": False}},
                "nvml": {"backend": "fake", "fake_count": 2},
                "intervals": {"nvml_seconds": 0.5, "scrape_seconds": 0.5, "window_seconds": 10},
                "engines": [
                    {"name": n, "url": f"http://127.0.0.1:{p}/metrics"}
                    for n, p in zip(names, ports, strict=True)
                ],
            }
        )
    )
    err = tmp_path / "stderr.txt"
    with err.open("w") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent.cli", "run", "--config", str(cfg)], stderr=f, cwd=ROOT
        )
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and err.read_text().count(" is down: ") < 21:
                time.sleep(0.2)
        finally:
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=60)
    log = err.read_text()
    down = re.findall(r"engine (engine-\d\d) \(http://127\.0\.0\.1:\d+/metrics\) is down: connection", log)
    assert sorted(down) == names, log
    assert rc == 0 and "Traceback" not in log, log
    assert io.StringIO(log).read().count("agent stopped") == 1
