"""Minutes that tell the truth: a paused agent, an engine outage and a full disk, against the real
daemon as a process (``python -m agent.cli run``) scraping a simulated engine on 127.0.0.1 with the
fake NVML backend; and the pieces (spreading a window, the buffer) by hand.

``infercost run`` has no accelerated clock, so the process tests shrink time instead: a scrape
interval of 0.5 s and a pause of 14 intervals (7 s) stand for a 70 s ``SIGSTOP`` at the 5 s
default; the pause is started just before a minute boundary, so it covers two minutes as a 70 s
one would. Assertions are on counts and values in the store, never on wall-clock durations.
"""

from __future__ import annotations

import http.server
import math
import resource
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from netutil import free_port, wait_until
from prometheus_client.parser import text_string_to_metric_families

from agent.clock import ManualClock
from agent.records import MINUTE, MinuteRecord
from agent.store import ModelSpan, Store, spread_span
from agent.supervisor import LONG_TICK_INTERVALS, HistoryBuffer, outage_span

# seconds between ticks in the process tests; why 0.5: a long tick is 3 intervals, and on a busy test
# machine a start-up step (the scorer's fitting process, detection's first replay) can hold the loop
# for a second, which must not read as a pause
SCRAPE = 0.5
PAUSE = 14 * SCRAPE  # seconds: 14 intervals, as 70 s at the default 5 s
RATE = 2000.0  # generated tokens per second of the simulated engine
PROMPT_RATE = 500.0  # prompt tokens per second
PRICE = 2.0  # $ per GPU-hour
GPUS = 2


# ---------------------------------------------------------------- the pieces, by hand
def _span(start: float, end: float, gen: float, cost: float, idle: float = 0.0) -> ModelSpan:
    secs = end - start
    sums = {
        "seconds": secs,
        "generation_tokens": gen,
        "prompt_tokens": 0.0,
        "cost_usd": cost,
        "idle_usd": idle,
        "gpu_util.s": 0.5 * secs,
        "gpu_util.w": secs,
    }
    return ModelSpan("n", "e", "m", "v1", start, end, sums)


M0 = 1_780_000_020.0  # a minute boundary (epoch seconds)


def test_a_long_window_is_spread_over_its_minutes_in_proportion_to_their_seconds(tmp_path: Path) -> None:
    store = Store(tmp_path / "h.sqlite", clock=ManualClock(M0))
    store.write_spans([_span(M0 + 30, M0 + 135, gen=1050.0, cost=10.5)], spread=True)  # 105 s
    recs = store.records(0, 4e9, ("model",))
    assert [(r.minute - M0, r.sums["seconds"]) for r in recs] == [(0, 30.0), (60, 60.0), (120, 15.0)]
    assert [r.sums["generation_tokens"] for r in recs] == pytest.approx([300.0, 600.0, 150.0])
    assert [r.sums["estimated_seconds"] for r in recs] == pytest.approx([30.0, 60.0, 15.0])
    assert sum(r.sums["cost_usd"] for r in recs) == pytest.approx(10.5)  # dollars conserved
    # every ratio of sums is the window's: $/token and the time-weighted gauge
    assert all(r.sums["cost_usd"] / r.sums["generation_tokens"] == pytest.approx(0.01) for r in recs)
    assert all(r.sums["gpu_util.s"] / r.sums["gpu_util.w"] == pytest.approx(0.5) for r in recs)
    # the next window continues the last minute; writing the spread one again counts nothing
    store.write_spans([_span(M0 + 30, M0 + 135, gen=1050.0, cost=10.5)], spread=True)
    store.write_spans([_span(M0 + 135, M0 + 140, gen=10.0, cost=0.5)])
    last = store.records(M0 + 120, M0 + 180, ("model",))[0]
    assert last.sums["seconds"] == 20.0 and last.sums["estimated_seconds"] == pytest.approx(15.0)


def test_coarse_imported_windows_stay_whole_in_the_minute_they_start_in(tmp_path: Path) -> None:
    store = Store(tmp_path / "h.sqlite", clock=ManualClock(M0))
    store.write_spans([_span(M0, M0 + 300, gen=3000.0, cost=1.0)])  # a 5-minute step of history
    (rec,) = store.records(0, 4e9, ("model",))
    assert rec.minute == M0 and rec.sums["seconds"] == 300.0 and rec.sums["estimated_seconds"] == 0.0


def test_an_outage_joined_with_the_tick_after_it_is_not_idle_where_it_made_tokens() -> None:
    held = _span(M0, M0 + 20, gen=0.0, cost=2.0, idle=2.0)  # down: its cost idle so far
    back = _span(M0 + 20, M0 + 25, gen=2500.0, cost=0.5)  # the return tick counts the outage's tokens
    sp = outage_span(held, back)
    assert (sp.start, sp.end) == (M0, M0 + 25)
    assert sp.sums["cost_usd"] == 2.5 and sp.sums["generation_tokens"] == 2500.0 and sp.sums["idle_usd"] == 0
    idle = outage_span(held, _span(M0 + 20, M0 + 25, gen=0.0, cost=0.5, idle=0.5))
    assert idle.sums["idle_usd"] == 2.5  # no tokens at all: idle it is


class _FailingStore:
    """Stands in for a store on a full disk."""

    def write_spans(self, spans: object, spread: bool = False) -> int:
        raise OSError(28, "No space left on device")

    def write_nvml_rounds(self, *a: object) -> None:
        raise OSError(28, "No space left on device")

    write_engine_scrapes = write_gpu_spans = write_nvml_rounds


def test_the_buffer_keeps_minutes_until_the_store_takes_them_and_drops_the_oldest_past_its_bound(
    tmp_path: Path,
) -> None:
    buf = HistoryBuffer(max_minutes=3)
    for i in range(8):  # 8 ticks of 30 s: minutes M0 .. M0+180
        buf.add_spans(spread_span(_span(M0 + 30 * i, M0 + 30 * (i + 1), gen=300.0, cost=1.0)))
        with pytest.raises(OSError):
            buf.flush(_FailingStore(), "n")  # type: ignore[arg-type]
        buf.trim()
    assert buf.dropped_minutes == 1  # minutes M0+60 .. M0+180 kept
    store = Store(tmp_path / "h.sqlite", clock=ManualClock(M0))
    buf.flush(store, "n")
    recs = store.records(0, 4e9, ("model",))
    assert [(r.minute - M0, r.sums["seconds"], r.sums["generation_tokens"]) for r in recs] == [
        (60, 60.0, 600.0),
        (120, 60.0, 600.0),
        (180, 60.0, 600.0),
    ]
    assert len(buf) == 0
    buf.flush(store, "n")  # nothing left: nothing written twice
    assert store.records(0, 4e9, ("model",)) == recs


# ---------------------------------------------------------------- the daemon as a process
class LinearEngine:
    """A vLLM /metrics endpoint on 127.0.0.1 whose counters grow at fixed rates in real time;
    ``down`` makes it answer 503 (counting on, as a busy engine behind a broken endpoint does)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.down = False
        engine = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if engine.down:
                    self.send_error(503)
                    return
                t = time.monotonic() - engine.t0
                body = (
                    "# TYPE vllm:prompt_tokens_total counter\n"
                    f'vllm:prompt_tokens_total{{model_name="m"}} {PROMPT_RATE * t:.3f}\n'
                    "# TYPE vllm:generation_tokens_total counter\n"
                    f'vllm:generation_tokens_total{{model_name="m"}} {RATE * t:.3f}\n'
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def engine() -> Iterator[LinearEngine]:
    e = LinearEngine()
    yield e
    e.close()


class Daemon:
    """``python -m agent.cli run`` on a config of its own; stderr kept in a file."""

    def __init__(self, tmp: Path, eng: LinearEngine, state: Path, preexec: object = None) -> None:
        self.port = free_port()
        self.state = state
        book = tmp / "book.yaml"
        book.write_text(f"gpus:\n  - {{match: H100, usd_per_hour: {PRICE}}}\n")
        cfg = tmp / "node.yaml"
        cfg.write_text(
            f"node: truth-node\nstate_dir: {state}\nnvml: {{backend: fake, fake_count: {GPUS}}}\n"
            f"intervals: {{nvml_seconds: {SCRAPE}, scrape_seconds: {SCRAPE}}}\n"
            f"prices: {{book: {book}}}\n"
            f"exporters: {{prometheus: {{port: {self.port}}}}}\n"
            "engines:\n"
            f"  - {{name: eng, kind: vllm, url: 'http://127.0.0.1:{eng.port}/metrics', gpus: [0, 1],"
            " timeout_seconds: 0.2}\n"
        )
        self.log = tmp / "daemon.log"
        self._log = self.log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent.cli", "run", "--config", str(cfg)],
            stderr=self._log,
            preexec_fn=preexec,  # type: ignore[arg-type]
        )

    def metric(self, name: str, **labels: str) -> float | None:
        """The sum of the series of ``name`` with ``labels``, None when absent or unreachable."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as r:
                text = r.read().decode()
        except OSError:
            return None
        values = [
            s.value
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
            if s.name == name and labels.items() <= s.labels.items()
        ]
        return sum(values) if values else None

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30)
        self._log.close()
        return self.log.read_text()


def _model_minutes(state: Path) -> list[MinuteRecord]:
    store = Store(state / "history.sqlite")
    try:
        return store.records(0, 4e9, ("model",))
    finally:
        store.close()


def _gpu_minutes(state: Path) -> list[MinuteRecord]:
    store = Store(state / "history.sqlite")
    try:
        return store.records(0, 4e9, ("gpu",))
    finally:
        store.close()


def _wait_for_second_of_minute(lo: float, hi: float) -> None:
    """Sleep until the wall clock's second of the minute is in [lo, hi)."""
    while not lo <= time.time() % MINUTE < hi:
        time.sleep(0.05)


def _usd_per_token(r: MinuteRecord) -> float:
    return r.sums["cost_usd"] / r.sums["generation_tokens"]


def _check_truthful(recs: list[MinuteRecord]) -> None:
    """Every minute: at most 60 s (plus one tick that ends just past its boundary, kept whole in the
    minute it starts in), tokens at the engine's rate for its seconds, dollars at the GPUs' price."""
    slack = 2 * SCRAPE
    for r in recs:
        secs = r.sums["seconds"]
        assert secs <= MINUTE + slack, (r.minute, secs)
        assert r.sums["generation_tokens"] == pytest.approx(RATE * secs, rel=0.05, abs=RATE * slack), r.minute
        assert r.sums["cost_usd"] == pytest.approx(GPUS * PRICE * secs / 3600, rel=1e-6), r.minute


@pytest.mark.slow
def test_a_stopped_agent_spreads_the_pause_over_its_minutes_marked_estimated(
    tmp_path: Path, engine: LinearEngine
) -> None:
    d = Daemon(tmp_path, engine, tmp_path / "state")
    try:
        wait_until(lambda: (d.metric("infercost_generation_tokens_total") or 0) > 0, 60)
        _wait_for_second_of_minute(57.0, 58.0)  # the pause ends in the next minute
        d.proc.send_signal(signal.SIGSTOP)
        stopped_minute = time.time() // MINUTE * MINUTE
        time.sleep(PAUSE)
        d.proc.send_signal(signal.SIGCONT)
        ticks = d.metric("infercost_generation_tokens_total")
        wait_until(lambda: (d.metric("infercost_generation_tokens_total") or 0) > (ticks or 0), 20)
        time.sleep(8 * SCRAPE)
    finally:
        err = d.stop()
    recs = _model_minutes(d.state)
    by_minute = {r.minute: r for r in recs}
    assert stopped_minute in by_minute and stopped_minute + MINUTE in by_minute
    _check_truthful(recs)  # the minute the pause began in does not hold the pause's seconds
    estimated = {r.minute: r.sums["estimated_seconds"] for r in recs if r.sums["estimated_seconds"] > 0}
    assert {stopped_minute, stopped_minute + MINUTE} <= set(estimated), estimated
    # the long tick and the one after it (which may hold the pause's tokens), all estimated: at least
    # the pause, at most a slot before it, the slot it ends in, and the next tick (one or two slots)
    paused = estimated[stopped_minute] + estimated[stopped_minute + MINUTE]
    assert PAUSE <= paused <= PAUSE + (LONG_TICK_INTERVALS + 1) * SCRAPE
    # dollars conserved: what the models were charged is what the GPUs cost, minute by minute
    gpu_usd: dict[float, float] = {}
    for g in _gpu_minutes(d.state):
        gpu_usd[g.minute] = gpu_usd.get(g.minute, 0.0) + g.sums["cost_usd"] - g.sums["unallocated_usd"]
    for m, r in by_minute.items():
        assert r.sums["cost_usd"] == pytest.approx(gpu_usd[m], rel=1e-9), m
    # $ per token is the same every minute: the pause is no spike
    per_token = [_usd_per_token(r) for r in recs if r.sums["seconds"] > 4 * SCRAPE]
    assert len(per_token) >= 2 and max(per_token) <= 1.1 * min(per_token)
    covered = [float(x.split(" s,")[0]) for x in err.split("a tick covered ")[1:]]  # one line per long tick
    assert len([c for c in covered if c >= PAUSE]) == 1, err[-3000:]


@pytest.mark.slow
def test_an_engine_outage_spreads_its_tokens_over_the_outage_not_into_one_tick(
    tmp_path: Path, engine: LinearEngine
) -> None:
    d = Daemon(tmp_path, engine, tmp_path / "state")
    try:
        wait_until(lambda: (d.metric("infercost_generation_tokens_total") or 0) > 0, 60)
        time.sleep(1.0)
        engine.down = True
        wait_until(lambda: d.metric("infercost_engine_up", engine="eng") == 0.0, 20)
        time.sleep(12 * SCRAPE)
        engine.down = False
        wait_until(lambda: d.metric("infercost_engine_up", engine="eng") == 1.0, 20)
        time.sleep(1.0)
    finally:
        err = d.stop()
    recs = _model_minutes(d.state)
    _check_truthful(recs)  # no minute has the outage's tokens against a tick's dollars
    assert sum(r.sums["estimated_seconds"] for r in recs) >= 12 * SCRAPE  # the outage, spread
    assert sum(r.sums["idle_usd"] for r in recs) == 0.0  # its dollars made the tokens counted after it
    assert err.count("read again after") == 1, err[-3000:]


@pytest.mark.slow
def test_a_full_disk_loses_no_minute_and_no_minute_claims_what_it_does_not_have(
    tmp_path: Path, engine: LinearEngine
) -> None:
    d = Daemon(tmp_path, engine, tmp_path / "state")
    store_up: list[float | None] = []
    try:
        wait_until(lambda: d.metric("infercost_store_up") == 1.0, 60)
        wait_until(lambda: (d.metric("infercost_generation_tokens_total") or 0) > 0, 20)
        _wait_for_second_of_minute(54.0, 56.0)  # full across a minute boundary
        # every write past 4 KiB fails as on a full disk (EFBIG; Python ignores SIGXFSZ)
        resource.prlimit(d.proc.pid, resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
        wait_until(lambda: d.metric("infercost_store_up") == 0.0, 20)
        while time.time() % MINUTE >= 50 or time.time() % MINUTE < 8:  # until 8 s into the next minute
            store_up.append(d.metric("infercost_store_up"))
            time.sleep(0.2)
        resource.prlimit(d.proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        wait_until(lambda: d.metric("infercost_store_up") == 1.0, 60)
        time.sleep(1.0)
        dropped = d.metric("infercost_store_dropped_seconds_total")
    finally:
        err = d.stop()
    assert store_up and all(v == 0.0 for v in store_up)
    assert dropped == 0.0
    recs = _model_minutes(d.state)
    minutes = [r.minute for r in recs]
    assert minutes == [minutes[0] + MINUTE * i for i in range(len(minutes))]  # none missing
    assert len(minutes) >= 2
    _check_truthful(recs)  # each minute with its tokens, none claiming seconds it did not see
    for r in recs[1:-1]:  # the minutes between the first and the last are whole
        assert r.sums["seconds"] == pytest.approx(MINUTE, abs=2 * SCRAPE), r.minute
    assert err.count("history store failed") == 1 and err.count("works again") == 1, err[-3000:]
    assert "dropping the oldest" not in err


@pytest.mark.slow
def test_a_read_only_state_dir_at_start_runs_with_store_up_0(
    tmp_path: Path, engine: LinearEngine, read_only_dir: Path
) -> None:
    d = Daemon(tmp_path, engine, read_only_dir)
    try:
        wait_until(lambda: (d.metric("infercost_generation_tokens_total") or 0) > 0, 60)
        up = d.metric("infercost_store_up")
        assert d.proc.poll() is None
    finally:
        err = d.stop()
    assert up == 0.0
    assert "takes no writes" in err


@pytest.mark.slow
def test_a_full_disk_at_start_runs_with_store_up_0(tmp_path: Path, engine: LinearEngine) -> None:
    def full() -> None:  # no file of the process may grow past 1 KiB: the state dir and /tmp alike
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, resource.RLIM_INFINITY))

    d = Daemon(tmp_path, engine, tmp_path / "state", preexec=full)
    try:
        wait_until(lambda: (d.metric("infercost_generation_tokens_total") or 0) > 0, 60)
        up = d.metric("infercost_store_up")
        assert d.proc.poll() is None
    finally:
        err = d.stop()
    assert up == 0.0
    assert "takes no writes" in err and not math.isnan(up)
