"""SQLite history: idempotent 1-minute rollups, restarts, baselines, deploys, retention, schema."""

from __future__ import annotations

import contextlib
import logging
import resource
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.clock import ManualClock
from agent.detect.baselines import baseline_of
from agent.detect.deploys import record_deploy
from agent.detect.evaluator import RuleEvaluator
from agent.detect.rules import load_default_rules
from agent.records import DeployEvent
from agent.samples import CostWindow, EngineScrape, GpuSample, NvmlRound, UsageWindow
from agent.state import check_sqlite_file, recover_if_corrupt
from agent.store import MIGRATIONS, Store, StoreError, VersionSeen

T0 = 1699833600.0  # Monday 00:00 UTC
KEY = {"node": "n1", "engine": "vllm-a", "model": "llama", "model_version": "v1"}


def cw(
    start: float,
    dur: float = 60.0,
    tokens: float = 6000.0,
    usd: float = 0.03,
    version: str = "v1",
    util: float | None = 0.8,
) -> CostWindow:
    u = UsageWindow(
        "n1",
        "vllm-a",
        "llama",
        version,
        start,
        start + dur,
        prompt_tokens=tokens / 2,
        generation_tokens=tokens,
        gpu_seconds=dur,
        energy_joules=dur * 300,
        gpu_util_ratio=util,
    )
    per_1m = usd / tokens * 1e6 if tokens else None
    return CostWindow(
        u,
        gpu_time_usd=usd,
        energy_usd=0.0,
        usd_per_1m_output=per_1m,
        usd_per_1m_total=usd / (1.5 * tokens) * 1e6 if tokens else None,
        idle_usd=0.0 if tokens else usd,
    )


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0 + 86400)


def test_rollup_merges_windows_and_is_idempotent(tmp_path: Path, clock: ManualClock) -> None:
    st = Store(tmp_path / "h.sqlite", 35, clock)
    wins = [cw(T0 + i * 20, dur=20, tokens=2000, usd=0.01) for i in range(6)]  # two minutes of 20 s windows
    assert st.write_windows(wins) == 6
    assert st.write_windows(wins[2:5]) == 0  # written again (a retry, a restart): ignored
    recs = st.records(T0, T0 + 120, ("model",))
    assert [r.minute for r in recs] == [T0, T0 + 60]
    s = recs[0].sums
    assert s["generation_tokens"] == 6000 and s["cost_usd"] == pytest.approx(0.03) and s["seconds"] == 60
    assert s["gpu_util.s"] == pytest.approx(48.0) and s["gpu_util.w"] == 60 and s["energy_joules"] == 18000
    assert "kv.s" not in s  # never reported: absent, not zero
    st.close()
    # a restarted agent re-writes the last window: still no double counting
    st2 = Store(tmp_path / "h.sqlite", 35, clock)
    assert st2.write_windows([wins[-1], cw(T0 + 120, dur=20, tokens=2000, usd=0.01)]) == 1
    recs = st2.records(T0, T0 + 180, ("model",))
    assert [r.sums["generation_tokens"] for r in recs] == [6000, 6000, 2000]
    st2.close()


def test_gpu_engine_and_node_rollups(tmp_path: Path, clock: ManualClock) -> None:
    st = Store(tmp_path / "h.sqlite", 35, clock)
    for i in range(3):
        t = T0 + i
        g0 = GpuSample(
            0,
            "GPU-0",
            "NVIDIA H100",
            t,
            util_gpu_ratio=0.5 + 0.1 * i,
            power_watts=300,
            energy_joules=1000 + 300 * i,
        )
        g1 = GpuSample(1, "GPU-1", "NVIDIA H100", t, up=False, error="lost")
        rnd = NvmlRound(t, True, (g0, g1))
        st.write_nvml_round("n1", rnd)
        st.write_nvml_round("n1", rnd)  # the same round twice: counted once
    st.write_engine_scrapes(
        "n1",
        [
            EngineScrape("vllm-a", "vllm", T0 + 5, True, 0.02),
            EngineScrape("vllm-a", "vllm", T0 + 10, False, 2.0, error="timeout"),
        ],
    )
    recs = {(r.kind, r.labels): r.sums for r in st.records(T0, T0 + 60)}
    g0s = recs[("gpu", (("node", "n1"), ("gpu", "0")))]
    assert g0s["gpu_util.s"] / g0s["gpu_util.w"] == pytest.approx(0.6) and g0s["up.s"] == 3
    assert g0s["energy_last"] - g0s["energy_first"] == 600
    g1s = recs[("gpu", (("node", "n1"), ("gpu", "1")))]
    assert g1s["up.s"] == 0 and g1s["up.w"] == 3 and "gpu_util.s" not in g1s
    assert recs[("node", (("node", "n1"),))]["nvml_up.w"] == 3
    eng = recs[("engine", (("node", "n1"), ("engine", "vllm-a")))]
    assert eng["up.s"] == 1 and eng["up.w"] == 2 and eng["scrape.s"] == pytest.approx(2.02)
    # the default rules read these records: the lost GPU is found, nothing else
    ev = RuleEvaluator(load_default_rules())
    found = ev.step(T0 + 60, st.records(T0, T0 + 60))
    assert [(f.rule_id, f.labels, f.value) for f in found] == [
        ("gpu_lost", (("node", "n1"), ("gpu", "1")), 0.0)
    ]
    st.close()


def test_nvml_rounds_written_as_one_batch_equal_round_by_round(tmp_path: Path, clock: ManualClock) -> None:
    """The daemon writes a tick's rounds at once: across a minute boundary, the sums, energy span
    and up counts are those of writing every round alone, and a batch written twice counts once."""

    def rounds(start: float) -> list[NvmlRound]:
        out = []
        for i in range(4):  # T0+58 .. T0+61: two rounds in each minute
            t = start + 58 + i
            g = GpuSample(0, "GPU-0", "NVIDIA H100", t, util_gpu_ratio=0.1 * (i + 1), energy_joules=500.0 * i)
            out.append(NvmlRound(t, True, (g,)))
        return out

    one, batch = Store(tmp_path / "one.sqlite", 35, clock), Store(tmp_path / "batch.sqlite", 35, clock)
    for rnd in rounds(T0):
        one.write_nvml_round("n1", rnd)
    batch.write_nvml_rounds("n1", rounds(T0))
    batch.write_nvml_rounds("n1", rounds(T0))  # replayed: already covered
    key = ("gpu", (("node", "n1"), ("gpu", "0")))
    for st in (one, batch):
        recs = {(r.minute, r.kind, r.labels): r.sums for r in st.records(T0, T0 + 120)}
        first, second = recs[(T0, *key)], recs[(T0 + 60, *key)]
        # minute 1: rounds 0, 1 (util 0.1, 0.2; energy 0 → 500); minute 2: 2, 3 (0.3, 0.4; 1000 → 1500)
        assert first["gpu_util.s"] == pytest.approx(0.3) and first["gpu_util.w"] == 2
        assert (first["energy_first"], first["energy_last"]) == (0.0, 500.0)
        assert second["gpu_util.s"] == pytest.approx(0.7) and second["up.w"] == 2
        assert (second["energy_first"], second["energy_last"]) == (1000.0, 1500.0)
        assert recs[(T0, "node", (("node", "n1"),))]["nvml_up.w"] == 2
        st.close()


def test_deploys_are_recorded_and_survive_restart(tmp_path: Path, clock: ManualClock) -> None:
    seen: list[tuple[VersionSeen | None, VersionSeen]] = []

    def rule(last: VersionSeen | None, now: VersionSeen) -> DeployEvent | None:
        seen.append((last, now))
        return record_deploy(last, now)

    st = Store(tmp_path / "h.sqlite", 35, clock, deploys=rule)
    st.write_windows([cw(T0), cw(T0 + 60)])
    st.write_windows([cw(T0 + 120, version="v2")])
    st.write_windows([cw(T0 + 120, version="v2")])  # rewritten: not merged, not shown to the rule
    st.write_windows([cw(T0 + 60, dur=30, version="v1")])  # written late, an earlier minute: no deploy back
    assert [now.minute for _, now in seen] == [T0, T0 + 60, T0 + 120]  # the merged windows only
    assert seen[0][0] is None and seen[2][0] == VersionSeen("n1", "vllm-a", "llama", "v1", T0 + 60)
    st.close()
    st = Store(tmp_path / "h.sqlite", 35, clock)  # no rule: versions kept, no deploy decided
    st.write_windows([cw(T0 + 180, version="v3")])
    assert st.current_versions() == [("n1", "vllm-a", "llama", "v3", T0 + 180)]
    (d,) = st.deploys()
    assert (d.model, d.from_version, d.to_version, d.at) == ("llama", "v1", "v2", T0 + 120)
    st.save_alert_state([{"dedup_key": "k", "state": "firing"}])
    st.close()
    st = Store(tmp_path / "h.sqlite", 35, clock)
    assert st.load_alert_state() == [{"dedup_key": "k", "state": "firing"}]
    st.close()


def test_retention_and_size_cap(tmp_path: Path) -> None:
    st = Store(tmp_path / "h.sqlite", retention_days=1, clock=ManualClock(T0))
    st.write_windows([cw(T0 - 3 * 3600 + i * 60) for i in range(240)])  # 4 h ending one hour after T0
    assert st.prune(now=T0 + 86400 - 60) == 179  # older than one day before "now"
    assert st.span() == (T0 - 60, T0 + 3600 - 60)
    st.max_bytes = 1
    st.prune(now=T0 + 86400)
    assert st.span() is None  # the cap wins over everything
    st.close()


def test_schema_migrates_and_refuses_newer(tmp_path: Path, clock: ManualClock) -> None:
    p = tmp_path / "h.sqlite"
    db = sqlite3.connect(p)  # a file as version 1 of the agent left it, with one row
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    for stmt in MIGRATIONS[0]:
        db.execute(stmt)
    db.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    db.execute(
        "INSERT INTO model_minutes (node, engine, model, model_version, minute, covered_until, seconds, "
        "generation_tokens, cost_usd) VALUES ('n1', 'vllm-a', 'llama', 'v1', ?, ?, 60, 6000, 0.03)",
        (int(T0), T0 + 60),
    )
    db.commit()
    db.close()
    st = Store(p, 35, clock, deploys=record_deploy)
    assert st.schema_version() == len(MIGRATIONS)
    assert [r.sums["generation_tokens"] for r in st.records(T0, T0 + 60, ("model",))] == [6000]
    st.write_windows([cw(T0 + 60, version="v2")])
    assert len(st.deploys()) == 0  # no version known before the migration
    st.set_meta("schema_version", "99")
    st.close()
    with pytest.raises(StoreError, match="newer than this agent"):
        Store(p, 35, clock)


def test_backfill_gives_a_week_of_baselines(tmp_path: Path) -> None:
    from synthetic_history import backfill_simulated

    end = T0 + 7 * 86400
    st = Store(tmp_path / "h.sqlite", 35, ManualClock(end))
    assert backfill_simulated(st, [("n1", "vllm-a", "llama", "v1")], T0, end) == 7 * 1440
    key = {"node": "n1", "engine": "vllm-a", "model": "llama"}
    week = st.series("model", key, end - 7 * 86400, end)
    day = baseline_of(week, "usd_per_1m_output_tokens", end, band_of=380.0)
    night = baseline_of(week, "usd_per_1m_output_tokens", end, band_of=40.0)
    # $2/h in the 256–512 tok/s band: $1.39–2.17/1M; at night a GPU hour buys a tenth of the tokens
    assert day.value is not None and 1.38 < day.value < 2.18 and day.minutes > 500
    assert night.value is not None and night.value > 5 * day.value
    st.close()


# ---------------------------------------------------------------- a full disk, damaged files
@contextlib.contextmanager
def _file_size_limit(limit: int) -> Iterator[None]:
    """RLIMIT_FSIZE for this process: a write past ``limit`` bytes fails with EFBIG, as on a full
    disk (Python ignores SIGXFSZ, so the write returns the error instead of killing the process)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_a_full_disk_raises_the_real_error_and_the_next_write_works(
    tmp_path: Path, clock: ManualClock
) -> None:
    store = Store(tmp_path / "h.sqlite", clock=clock)
    store.write_windows([cw(T0)])
    wal = tmp_path / "h.sqlite-wal"
    err: BaseException | None = None
    with _file_size_limit(wal.stat().st_size + 16_384):
        for i in range(1, 200):
            try:
                store.write_windows([cw(T0 + 60 * i, version=f"v{i}")])
            except sqlite3.Error as e:
                err = e
                break
    assert err is not None, "the WAL never reached the limit"
    # SQLite rolled the transaction back itself; a second ROLLBACK used to raise this and hide it
    assert "cannot rollback" not in str(err)
    assert "disk I/O error" in str(err) or "full" in str(err)
    store.write_windows([cw(T0 + 60 * 500)])  # not stuck inside a dead transaction
    assert store.records(T0 + 60 * 500, T0 + 60 * 501, ("model",))[0].sums["generation_tokens"] == 6000.0


def test_a_full_disk_at_close_loses_nothing_and_raises_nothing(
    tmp_path: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "h.sqlite"
    store = Store(path, clock=clock)
    store.write_windows([cw(T0 + 60 * i, version=f"v{i}") for i in range(200)])  # rows in the WAL
    caplog.set_level(logging.WARNING, logger="agent.store")
    with _file_size_limit(path.stat().st_size):  # the checkpoint cannot grow the main file
        store.close()
    assert any("not checkpointed at close" in r.getMessage() for r in caplog.records)
    again = Store(path, clock=clock)  # the next start replays the WAL
    assert len(again.records(T0, T0 + 60 * 200, ("model",))) == 200
    again.close()


def _damage(path: Path, offset: int, length: int) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(b"\xa5" * length)


@pytest.mark.parametrize(
    ("how", "full"),
    [
        ("garbage", False),  # not a database at all
        ("header", False),  # the 100-byte header overwritten
        ("schema", False),  # page 1 (the schema) overwritten after the header
        ("table", True),  # a table page overwritten: only a full check reads it
    ],
)
def test_damaged_files_are_recognised(tmp_path: Path, clock: ManualClock, how: str, full: bool) -> None:
    path = tmp_path / "h.sqlite"
    store = Store(path, clock=clock)
    for i in range(40):
        store.write_windows([cw(T0 + 60 * i)])
    store.close()
    assert check_sqlite_file(path, full=True) is None  # healthy first
    if how == "garbage":
        path.write_bytes(b"this is not sqlite " * 500)
    elif how == "header":
        _damage(path, 0, 100)
    elif how == "schema":
        _damage(path, 100, 3900)
    else:
        _damage(path, path.stat().st_size - 4096, 4096)
    assert check_sqlite_file(path, full=full) is not None


def test_a_damaged_file_is_moved_aside_with_a_timestamp(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "history.sqlite"
    path.write_bytes(b"\x00garbage" * 1000)
    (tmp_path / "history.sqlite-wal").write_bytes(b"w")
    with caplog.at_level("ERROR"):
        dest = recover_if_corrupt(path, T0)
    assert dest == tmp_path / "history.sqlite.corrupt-20231113T000000Z"  # T0 is 2023-11-13 00:00 UTC
    assert dest.read_bytes().startswith(b"\x00garbage")
    assert (tmp_path / "history.sqlite.corrupt-20231113T000000Z-wal").read_bytes() == b"w"
    assert not path.exists()
    assert [r.levelname for r in caplog.records] == ["ERROR"]
    assert Store(path).span() is None  # a new, empty store opens in its place
    assert recover_if_corrupt(path, T0) is None  # a healthy file stays


def test_a_new_store_is_created_at_the_current_schema_with_one_log_line(
    tmp_path: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent.store")
    new = Store(tmp_path / "new.sqlite", 35, clock)
    lines = [r.getMessage() for r in caplog.records if r.name == "agent.store"]
    assert lines == [f"history {tmp_path / 'new.sqlite'}: created at schema version {len(MIGRATIONS)}"]
    # the same tables and columns as a file migrated one version at a time from the first release
    old = tmp_path / "old.sqlite"
    db = sqlite3.connect(old)
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    for stmt in MIGRATIONS[0]:
        db.execute(stmt)
    db.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    db.commit()
    db.close()
    caplog.clear()
    migrated = Store(old, 35, clock)
    assert len([r for r in caplog.records if "migrated" in r.getMessage()]) == len(MIGRATIONS) - 1

    def schema(path: Path) -> list[tuple[str, str]]:
        with contextlib.closing(sqlite3.connect(path)) as c:
            return sorted(c.execute("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL").fetchall())

    assert new.schema_version() == migrated.schema_version() == len(MIGRATIONS)
    new.close()
    migrated.close()
    assert schema(tmp_path / "new.sqlite") == schema(old)
