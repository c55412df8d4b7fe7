"""Embedded SQLite history: 1-minute rollups, baselines, deploys and alert state.

One file in the state directory (``history.sqlite``), WAL mode, a versioned schema migrated in
place at open (:data:`MIGRATIONS`), retention (default 35 days) plus a size cap.

Rollups (one row per series and minute; a window belongs to the minute it *starts* in):

- ``model_minutes`` per (node, engine, model, model_version): seconds, tokens, dollars
  (GPU time, energy, idle), GPU-seconds, joules, preemptions, and time-weighted gauges stored as
  ``<name>_s`` (value × seconds) / ``<name>_w`` (seconds with a value): utilisation, bandwidth,
  power, requests running, KV cache, p99 TTFT / ITL, roofline, anomaly score; and where the
  dollars went (:data:`SPLIT_SUMS`, :func:`agent.records.split_sums`): prompt vs output, usage
  basis, prefix-cache savings, the cost floor; and where the GPU time went (:data:`BOUND_SUMS`,
  :func:`agent.records.bound_sums`): GPU-seconds and dollars by bound, all 0 where the minute had
  no split (GPM unsupported: absent, not zero).
- ``gpu_minutes`` per (node, gpu): NVML samples, sample-weighted gauges, first/last energy, and
  the GPU's dollars (cost, idle, unallocated) from the window join.
- ``engine_minutes`` per (node, engine): scrapes up / total, scrape duration.
- ``node_minutes`` per node: NVML rounds up / total.

**Windows that cover several minutes.** The daemon asks (``spread=True``) for a window that covers
a gap to be spread over every minute it covers: a tick the agent was paused in, an engine outage
and the tick it came back in. Each minute gets the window's sums in proportion to the seconds of it
the window covers (every column is a sum, so ratios of sums stay exact) and counts those seconds in
``estimated_seconds``. By default a window goes whole into the minute it starts in (the coarse
windows of imported history, e.g. 5-minute steps, stay one row each).

**Idempotent writes.** Each row remembers ``covered_until`` (epoch seconds): the end of the last
window (or the time of the last sample) merged into it. A window whose start is before that mark
was already counted and is ignored; a later one is added. So re-writing a window after a restart,
or writing the same tick twice, never double counts, and several windows per minute (a window
shorter than 60 s) add up. Windows of one series must arrive in time order, which the window
join guarantees.

**Columns and migrations.** Every sum column comes from the table of measures
(``agent/data/measures.csv``): a row with ``since`` set adds its column (a counter's sum) or its
gauge's pair (``<store>_s``, ``<store>_w``) at that schema version; :data:`MIGRATIONS` is generated
from ``since`` plus the structure that is not a measure (indexes, the deploy and alert tables),
and :data:`SCHEMA_VERSION` is the highest version either names. The policy, for released files:

- *added row*: give it ``since`` = the current schema version + 1; opening an older file adds the
  column (``ALTER TABLE … ADD COLUMN … DEFAULT 0``) and the minutes from before read 0, which the
  row's formula must read as "absent" (pair such a figure with the sum it covers, as the split
  and bound sums are paired with their dollars);
- *renamed measure*: change ``name`` (and what exports it), never ``store``: the column keeps its
  name, so old files need nothing;
- *removed measure*: keep its store column as a ``stored`` row (nothing exports or reads it);
  a column is never dropped or renamed, so a released migration never changes and a file from
  any earlier release opens (tests/test_store_previous_release.py opens one made by the release
  before, tests/fixtures/stores/).

**Versions and deploys.** The ``versions`` table keeps the version each (node, engine, model) showed
last, and when (model "" is the engine's own build); every merged window and every engine build
updates it, never to an earlier minute. Whether a version seen is a deploy is not the store's call:
the :data:`DeployRule` it is constructed with (:func:`agent.detect.deploys.record_deploy` in the
daemon) is shown the version the series showed last and the one it shows now, and the store writes
the deploy row the rule hands back, in the same transaction as the minute it came with. Without a
rule no deploy is recorded.

Queries return :class:`agent.records.MinuteRecord` (sums), so every ratio over a longer
range is a ratio of sums. The store is persistence only: baselines are computed over its records
in :mod:`agent.detect.baselines`, deploys decided in :mod:`agent.detect.deploys`. SQLite calls are
short and synchronous; the agent writes at most a few rows per second.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import operator
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.clock import Clock, SystemClock
from agent.measures import MEASURES
from agent.records import (
    MINUTE,
    DeployEvent,
    Kind,
    MinuteRecord,
    model_sums,
)
from agent.samples import CostWindow, EngineScrape, NvmlRound

if TYPE_CHECKING:
    from agent.cost.window import TickResult

logger = logging.getLogger(__name__)

# Why 1 GiB: 35 days of 1-minute rows for ~50 series is ~150 MB; the cap only guards a runaway
# label set from filling the node's disk.
DEFAULT_MAX_BYTES = 1 << 30
PRUNE_EVERY_SECONDS = 3600.0  # retention is enforced at most hourly (a DELETE scan is not free)
EPS = 1e-6  # seconds of tolerance when comparing window edges
SAMPLE_SPAN = 1e-3  # seconds an instantaneous sample "covers", so re-writing it is recognised


def _gauge_cols(names: Sequence[str]) -> list[str]:
    return [c for n in names for c in (f"{n}_s", f"{n}_w")]


def _columns(kind: Kind, since: int | None = None) -> list[str]:
    """The columns the table of measures gives a record kind's table (only those added at schema
    ``since`` when given), in table order."""
    return [
        c for m in MEASURES if m.source == kind and (since is None or m.since == since) for c in m.columns
    ]


# The GPU table's first and last NVML energy readings of the minute: not sums, so not measures.
GPU_ENERGY = ("energy_first", "energy_last")


@dataclass(frozen=True, slots=True)
class _Table:
    name: str
    kind: Kind
    keys: tuple[str, ...]
    cols: tuple[str, ...]


TABLES: Mapping[Kind, _Table] = {
    "model": _Table(
        "model_minutes", "model", ("node", "engine", "model", "model_version"), tuple(_columns("model"))
    ),
    "gpu": _Table("gpu_minutes", "gpu", ("node", "gpu"), (*_columns("gpu"), *GPU_ENERGY)),
    "engine": _Table("engine_minutes", "engine", ("node", "engine"), tuple(_columns("engine"))),
    "node": _Table("node_minutes", "node", ("node",), tuple(_columns("node"))),
}
# Columns of a table that are not sums: (kind → DDL) added at creation.
_EXTRA: Mapping[Kind, tuple[str, ...]] = {
    "gpu": ("uuid TEXT", "gpu_model TEXT"),
    "engine": ("engine_kind TEXT",),
}


def _create(t: _Table, extra: Sequence[str] = ()) -> str:
    cols = ",\n  ".join(
        [f"{k} TEXT NOT NULL" for k in t.keys]
        + ["minute INTEGER NOT NULL", "covered_until REAL NOT NULL"]
        + list(extra)
        + [f"{c} REAL NOT NULL DEFAULT 0" for c in t.cols]
    )
    pk = ", ".join([*t.keys, "minute"])
    return f"CREATE TABLE {t.name} (\n  {cols},\n  PRIMARY KEY ({pk})\n) WITHOUT ROWID"


# The schema's structure apart from the measures' columns, by the version that added it (the
# measures' columns come from the table's ``since``). Never edit a released entry: append one.
_STRUCTURE: tuple[tuple[str, ...], ...] = (
    (f"CREATE INDEX model_minutes_minute ON {TABLES['model'].name} (minute)",),
    (
        """CREATE TABLE deploys (
          id INTEGER PRIMARY KEY AUTOINCREMENT,
          node TEXT NOT NULL, engine TEXT NOT NULL, model TEXT NOT NULL,
          from_version TEXT NOT NULL, to_version TEXT NOT NULL, at REAL NOT NULL)""",
        """CREATE TABLE versions (
          node TEXT NOT NULL, engine TEXT NOT NULL, model TEXT NOT NULL,
          version TEXT NOT NULL, minute REAL NOT NULL, PRIMARY KEY (node, engine, model))""",
        "CREATE TABLE alert_state (dedup_key TEXT PRIMARY KEY, body TEXT NOT NULL)",
    ),
    (  # retention deletes and time-range reads by minute on every table, not only model_minutes
        f"CREATE INDEX gpu_minutes_minute ON {TABLES['gpu'].name} (minute)",
        f"CREATE INDEX engine_minutes_minute ON {TABLES['engine'].name} (minute)",
        f"CREATE INDEX node_minutes_minute ON {TABLES['node'].name} (minute)",
        "CREATE INDEX deploys_at ON deploys (at)",
    ),
    (  # per-GPU dollars' coverage mark, apart from the NVML samples': a tick's [start, end) and
        # instantaneous samples are merged independently
        "ALTER TABLE gpu_minutes ADD COLUMN cost_covered_until REAL NOT NULL DEFAULT 0",
    ),
)
SCHEMA_VERSION = max(len(_STRUCTURE), *(m.since or 0 for m in MEASURES))


def _migration(version: int) -> tuple[str, ...]:
    """The statements that take the schema to ``version`` (from ``version`` − 1): version 1 creates
    the minute tables with the measures of ``since`` 1; later ones add the columns of the measures
    whose ``since`` is ``version``, then that version's structure."""
    structure = _STRUCTURE[version - 1] if version <= len(_STRUCTURE) else ()
    if version == 1:
        model, *rest = (
            _create(
                _Table(t.name, t.kind, t.keys, tuple(_columns(k, 1)) + (GPU_ENERGY if k == "gpu" else ())),
                _EXTRA.get(k, ()),
            )
            for k, t in TABLES.items()
        )
        return (model, *structure, *rest)
    added = tuple(
        f"ALTER TABLE {t.name} ADD COLUMN {c} REAL NOT NULL DEFAULT 0"
        for k, t in TABLES.items()
        for c in _columns(k, version)
    )
    return (*added, *structure)


MIGRATIONS: tuple[tuple[str, ...], ...] = tuple(_migration(v) for v in range(1, SCHEMA_VERSION + 1))


@dataclass(slots=True)
class _Rollup:
    """NVML samples of one row (table, keys, minute) summed in memory before one write."""

    start: float  # epoch seconds of the first sample
    end: float  # end of the span the last sample covers
    add: dict[str, float]
    extra: dict[str, Any] | None = None
    energy_first: float | None = None  # joules (NVML counter) at the first sample with a reading
    energy_last: float | None = None  # joules at the last one


def _rollup(
    rows: dict[tuple[Kind, tuple[str, ...], int], _Rollup],
    key: tuple[Kind, tuple[str, ...], int],
    ts: float,
    add: Mapping[str, float],
) -> _Rollup:
    r = rows.get(key)
    if r is None:
        r = rows[key] = _Rollup(ts, ts + SAMPLE_SPAN, dict(add))
        return r
    r.end = ts + SAMPLE_SPAN
    for k, v in add.items():
        r.add[k] = r.add.get(k, 0.0) + v
    return r


@dataclass(frozen=True, slots=True)
class ModelSpan:
    """The additive sums (:func:`agent.records.model_sums` names) of one model series over
    [start, end) (epoch seconds): one window, or consecutive ones summed."""

    node: str
    engine: str
    model: str
    model_version: str
    start: float  # epoch seconds
    end: float  # epoch seconds
    sums: Mapping[str, float]

    @property
    def keys(self) -> tuple[str, str, str, str]:
        """The model_minutes key (node, engine, model, model_version)."""
        return (self.node, self.engine, self.model, self.model_version)


def span_of(cw: CostWindow) -> ModelSpan:
    """One priced window as a span."""
    u = cw.usage
    return ModelSpan(u.node, u.engine, u.model, u.model_version, u.start, u.end, model_sums(cw))


def join_spans(a: ModelSpan, b: ModelSpan) -> ModelSpan:
    """``a`` then ``b`` (same series, ``b`` from where ``a`` ends) as one span: sums added."""
    sums = dict(a.sums)
    for k, v in b.sums.items():
        sums[k] = sums.get(k, 0.0) + v
    return ModelSpan(a.node, a.engine, a.model, b.model_version, a.start, max(a.end, b.end), sums)


@dataclass(frozen=True, slots=True)
class GpuCostSpan:
    """One GPU's dollars over [start, end) (epoch seconds) from the window join."""

    gpu: str  # index, or the MIG instance's UUID
    uuid: str
    gpu_model: str
    start: float  # epoch seconds
    end: float  # epoch seconds
    cost_usd: float  # dollars (time + energy)
    idle_usd: float  # dollars not used to make tokens
    unallocated_usd: float  # dollars held by no engine


def gpu_cost_spans(tick: TickResult) -> list[GpuCostSpan]:
    """One tick's per-GPU dollars as spans."""
    out = []
    for g in tick.gpus:
        s = g.sample
        gpu = str(s.index) if not s.mig_parent_uuid else s.uuid
        out.append(
            GpuCostSpan(gpu, s.uuid, s.name, tick.start, tick.end, g.cost_usd, g.idle_usd, g.unallocated_usd)
        )
    return out


def minute_pieces(start: float, end: float) -> list[tuple[int, float, float]]:
    """(minute, piece start, piece end) of every minute [start, end) (epoch seconds) covers."""
    out: list[tuple[int, float, float]] = []
    lo = start
    while lo < end - EPS:
        minute = _minute(lo)
        hi = min(end, minute + MINUTE)
        out.append((minute, lo, hi))
        lo = hi
    return out or [(_minute(start), start, end)]


def _share(start: float, end: float, lo: float, hi: float) -> float:
    return (hi - lo) / (end - start) if end > start else 1.0


def spread_span(sp: ModelSpan) -> list[ModelSpan]:
    """``sp`` shared among the minutes it covers in proportion to their seconds, each piece's
    seconds counted as ``estimated_seconds``."""
    out = []
    for _, lo, hi in minute_pieces(sp.start, sp.end):
        f = _share(sp.start, sp.end, lo, hi)
        sums = {k: v * f for k, v in sp.sums.items()}
        sums["estimated_seconds"] = sums.get("estimated_seconds", 0.0) + (hi - lo)
        out.append(ModelSpan(sp.node, sp.engine, sp.model, sp.model_version, lo, hi, sums))
    return out


def spread_gpu_span(sp: GpuCostSpan) -> list[GpuCostSpan]:
    """A GPU's dollars shared among the minutes its span covers, as :func:`spread_span`."""
    out = []
    for _, lo, hi in minute_pieces(sp.start, sp.end):
        f = _share(sp.start, sp.end, lo, hi)
        out.append(
            GpuCostSpan(
                sp.gpu,
                sp.uuid,
                sp.gpu_model,
                lo,
                hi,
                sp.cost_usd * f,
                sp.idle_usd * f,
                sp.unallocated_usd * f,
            )
        )
    return out


# The GPU gauges an NVML sample gives (table rows of source gpu, aggregation mean, with the sample
# attribute in ``window``): a sample-weighted mean per minute.
_GPU_GAUGES: tuple[tuple[str, Callable[[Any], Any]], ...] = tuple(
    (m.store, operator.attrgetter(m.window))
    for m in MEASURES
    if m.source == "gpu" and m.aggregation == "mean" and m.since is not None and m.window
)


# One bucket of hourly_model_sums: (node, engine, model, model_version), bucket start, sums by name.
HourSums = tuple[tuple[str, str, str, str], float, dict[str, float]]
IDLE_GPU_SECONDS = "idle_gpu_seconds"  # the GPU-seconds of a bucket's minutes without tokens


class StoreError(Exception):
    """The history file is unusable (e.g. written by a newer agent)."""


@dataclass(frozen=True, slots=True)
class VersionSeen:
    """A series showing a version in a minute: a model's version, or (``model`` "") the build of the
    engine itself (image@digest)."""

    node: str
    engine: str
    model: str
    version: str
    minute: float  # epoch seconds, start of the minute


# (what the series showed last, None the first time; what it shows now) → the deploy to record, or None.
DeployRule = Callable[[VersionSeen | None, VersionSeen], DeployEvent | None]


def _minute(t: float) -> int:
    return int(t // MINUTE * MINUTE)


class Store:
    """The SQLite history (see the module docstring)."""

    def __init__(
        self,
        path: Path,
        retention_days: float = 35.0,
        clock: Clock | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        deploys: DeployRule | None = None,
    ) -> None:
        self.path = path
        self._deploy_rule = deploys  # None: versions are kept, no deploy is recorded
        self.retention_seconds = retention_days * 86400.0
        self.max_bytes = max_bytes  # bytes
        self._clock: Clock = clock or SystemClock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA auto_vacuum=INCREMENTAL")  # only effective on a new file
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a crash of the process loses nothing
        self._db.execute("PRAGMA busy_timeout=5000")
        self._migrate()
        self._next_prune = 0.0

    @contextlib.contextmanager
    def _txn(self) -> Iterator[None]:
        """One write transaction. When a statement or the COMMIT fails, roll back only if SQLite has
        not already done so (a full disk makes it roll back itself; a second ROLLBACK would raise
        "cannot rollback" and hide the real error), then re-raise the real error."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    self._db.execute("ROLLBACK")
            raise

    # -- schema ---------------------------------------------------------------------------------

    def _migrate(self) -> None:
        db = self._db
        db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        version = int(row[0]) if row else 0
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path}: schema version {version} is newer than this agent's ({SCHEMA_VERSION}); "
                "fix: upgrade the agent or point state_dir at a new folder"
            )
        if version == 0:  # a new file: every migration in one transaction, one line in the log
            with self._txn():
                for v in range(SCHEMA_VERSION):
                    self._apply(v)
            logger.info("history %s: created at schema version %d", self.path, SCHEMA_VERSION)
            return
        for v in range(version, SCHEMA_VERSION):
            with self._txn():
                self._apply(v)
            logger.info("history %s: schema migrated to version %d", self.path, v + 1)

    def _apply(self, v: int) -> None:
        """Run migration ``v`` (version v → v + 1) inside the caller's transaction."""
        for stmt in MIGRATIONS[v]:
            self._db.execute(stmt)
        self._db.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)", (str(v + 1),)
        )

    def schema_version(self) -> int:
        """The schema version of the open file."""
        row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        return int(row[0])

    def get_meta(self, key: str) -> str | None:
        """A small value kept with the history (e.g. the last evaluated minute)."""
        row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        """Keep a small value with the history."""
        self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    # -- writes ---------------------------------------------------------------------------------

    def _merge(
        self,
        t: _Table,
        keys: Sequence[str],
        minute: int,
        start: float,
        end: float,
        add: Mapping[str, float],
        extra: Mapping[str, Any] | None = None,
        first_last: Mapping[str, float] | None = None,
        energy_first: float | None = None,
    ) -> bool:
        """Add ``add`` into the row unless [start, end) was already covered. True when merged.

        A new row's ``energy_first`` is ``energy_first`` when given, else ``energy_last``."""
        where = " AND ".join(f"{k}=?" for k in (*t.keys, "minute"))
        params = (*keys, minute)
        row = self._db.execute(f"SELECT covered_until FROM {t.name} WHERE {where}", params).fetchone()
        if row is not None and start < float(row[0]) - EPS:
            return False
        if row is None:
            cols = [*t.keys, "minute", "covered_until", *(extra or {}), *add, *(first_last or {})]
            fl = first_last or {}
            vals = [*keys, minute, end, *(extra or {}).values(), *add.values(), *fl.values()]
            if "energy_last" in fl:
                cols.append("energy_first")
                vals.append(fl["energy_last"] if energy_first is None else energy_first)
            marks = ", ".join("?" for _ in cols)
            self._db.execute(f"INSERT INTO {t.name} ({', '.join(cols)}) VALUES ({marks})", vals)
        else:
            sets = ", ".join([f"{c} = {c} + ?" for c in add] + [f"{c} = ?" for c in (first_last or {})])
            sets = (sets + ", " if sets else "") + "covered_until = ?"
            self._db.execute(
                f"UPDATE {t.name} SET {sets} WHERE {where}",
                (*add.values(), *(first_last or {}).values(), end, *params),
            )
        return True

    def write_windows(self, windows: Sequence[CostWindow], spread: bool = False) -> int:
        """Roll priced windows into their minutes (idempotent, see the module docstring); with
        ``spread`` each is shared among the minutes it covers, marked estimated.

        Returns how many windows were merged (the rest were already counted). Each merged window's
        version is noted, and the deploy the store's rule makes of it recorded (see the module
        docstring).
        """
        return self.write_spans([span_of(cw) for cw in windows], spread)

    def write_spans(self, spans: Sequence[ModelSpan], spread: bool = False) -> int:
        """Roll model spans into their minutes, as :meth:`write_windows` does windows (each span in
        the minute it starts in, or with ``spread`` shared among the minutes it covers)."""
        t = TABLES["model"]
        merged = 0
        with self._txn():
            for sp in spans:
                done = False
                for piece in spread_span(sp) if spread else [sp]:
                    minute = _minute(piece.start)
                    cols = {k.replace(".", "_"): v for k, v in piece.sums.items()}
                    if self._merge(t, piece.keys, minute, piece.start, piece.end, cols):
                        done = True
                        self._note_version(sp.node, sp.engine, sp.model, piece.model_version, minute)
                merged += done
        self._maybe_prune()
        return merged

    def _note_version(
        self, node: str, engine: str, model: str, version: str, minute: int
    ) -> DeployEvent | None:
        """Keep the version a series shows in ``minute`` (inside the caller's transaction) and record
        the deploy the rule makes of it; returns that deploy."""
        row = self._db.execute(
            "SELECT version, minute FROM versions WHERE node=? AND engine=? AND model=?",
            (node, engine, model),
        ).fetchone()
        now = VersionSeen(node, engine, model, version, float(minute))
        last = None if row is None else VersionSeen(node, engine, model, str(row[0]), float(row[1]))
        event = None if self._deploy_rule is None else self._deploy_rule(last, now)
        if event is not None:
            self.record_deploy(event)
        if last is None or now.minute >= last.minute:
            self._db.execute(
                "INSERT OR REPLACE INTO versions (node, engine, model, version, minute) VALUES (?,?,?,?,?)",
                (node, engine, model, version, now.minute),
            )
        return event

    def record_deploy(self, event: DeployEvent) -> None:
        """Write one deploy row (an engine deploy has the model "")."""
        e = event
        self._db.execute(
            "INSERT INTO deploys (node, engine, model, from_version, to_version, at) VALUES (?,?,?,?,?,?)",
            (e.node, e.engine, e.model, e.from_version, e.to_version, e.at),
        )

    def note_engine_version(self, node: str, engine: str, version: str, at: float) -> DeployEvent | None:
        """Keep the engine's build (image@digest, from Kubernetes) seen at ``at`` (epoch seconds).

        Engine-level rows use the model "" in the versions and deploys tables (no model has an empty
        name). Returns the deploy the store's rule made of it and that was recorded, if any."""
        with self._txn():
            return self._note_version(node, engine, "", version, _minute(at))

    def write_nvml_round(self, node: str, rnd: NvmlRound) -> None:
        """Roll one NVML round into the node's and each GPU's minute (a sample counted once)."""
        self.write_nvml_rounds(node, (rnd,))

    def write_nvml_rounds(self, node: str, rounds: Sequence[NvmlRound]) -> None:
        """Roll NVML rounds into the node's and each GPU's minutes in one transaction.

        The rounds are summed in memory first, so a tick of five 1 s rounds costs one row update
        per GPU and minute rather than five (the daemon writes once per tick, not once per round).
        A round already written is recognised and not counted again."""
        rows: dict[tuple[Kind, tuple[str, ...], int], _Rollup] = {}
        for rnd in rounds:
            ts = rnd.timestamp
            minute = _minute(ts)
            up = {"nvml_up_s": float(rnd.up), "nvml_up_w": 1.0}
            _rollup(rows, ("node", (node,), minute), ts, up)
            for g in rnd.gpus:
                add: dict[str, float] = {}
                for col, get in _GPU_GAUGES:
                    v = get(g)
                    if v is not None:
                        add[col + "_s"] = float(v)
                        add[col + "_w"] = 1.0
                gpu = str(g.index) if not g.mig_parent_uuid else g.uuid
                r = _rollup(rows, ("gpu", (node, gpu), minute), ts, add)
                r.extra = {"uuid": g.uuid, "gpu_model": g.name}
                if g.energy_joules is not None:
                    r.energy_first = g.energy_joules if r.energy_first is None else r.energy_first
                    r.energy_last = g.energy_joules
        if not rows:
            return
        with self._txn():
            for (table, keys, minute), r in rows.items():
                fl = {"energy_last": r.energy_last} if r.energy_last is not None else None
                self._merge(
                    TABLES[table],
                    keys,
                    minute,
                    r.start,
                    r.end,
                    r.add,
                    r.extra,
                    fl,
                    energy_first=r.energy_first,
                )

    def write_gpu_costs(self, node: str, tick: TickResult, spread: bool = False) -> int:
        """Roll one tick's per-GPU dollars (cost, idle, unallocated) into each GPU's minute (with
        ``spread``: shared among the minutes the tick covers, as :meth:`write_windows`).

        Idempotent like :meth:`write_windows` (a tick already merged is ignored); returns the GPUs
        merged. Σ idle over a node's GPUs is the node's idle cost, GPUs no engine uses included."""
        spans = gpu_cost_spans(tick)
        return self.write_gpu_spans(
            node, [p for sp in spans for p in spread_gpu_span(sp)] if spread else spans
        )

    def write_gpu_spans(self, node: str, spans: Sequence[GpuCostSpan]) -> int:
        """Roll GPU dollar spans into the minute each starts in; returns the spans merged."""
        merged = 0
        with self._txn():
            for sp in spans:
                minute = _minute(sp.start)
                row = self._db.execute(
                    "SELECT cost_covered_until FROM gpu_minutes WHERE node=? AND gpu=? AND minute=?",
                    (node, sp.gpu, minute),
                ).fetchone()
                if row is not None and sp.start < float(row[0]) - EPS:
                    continue
                self._db.execute(
                    "INSERT INTO gpu_minutes (node, gpu, minute, covered_until, uuid, gpu_model, cost_usd, "
                    "idle_usd, unallocated_usd, cost_covered_until) VALUES (?,?,?,0,?,?,?,?,?,?) "
                    "ON CONFLICT (node, gpu, minute) DO UPDATE SET cost_usd = cost_usd + excluded.cost_usd, "
                    "idle_usd = idle_usd + excluded.idle_usd, "
                    "unallocated_usd = unallocated_usd + excluded.unallocated_usd, "
                    "cost_covered_until = excluded.cost_covered_until",
                    (node, sp.gpu, minute, sp.uuid, sp.gpu_model, sp.cost_usd, sp.idle_usd,
                     sp.unallocated_usd, sp.end),
                )  # fmt: skip
                merged += 1
        return merged

    def gpu_idle_by_node(self, start: float, end: float) -> dict[str, float]:
        """Idle dollars of every node's GPUs over minutes in [start, end) (epoch seconds)."""
        rows = self._db.execute(
            "SELECT node, SUM(idle_usd) FROM gpu_minutes WHERE minute >= ? AND minute < ? GROUP BY node",
            (start, end),
        )
        return {str(n): float(v or 0.0) for n, v in rows}

    def gpu_unallocated_by_node(self, start: float, end: float) -> dict[tuple[str, str], float]:
        """Dollars of GPUs no engine used, per (node, GPU model), over minutes in [start, end)
        (read-only; the weekly report's "unused GPUs" saving)."""
        rows = self._db.execute(
            "SELECT node, COALESCE(gpu_model, ''), SUM(unallocated_usd) FROM gpu_minutes "
            "WHERE minute >= ? AND minute < ? GROUP BY node, gpu_model",
            (start, end),
        )
        return {(str(n), str(g)): float(v or 0.0) for n, g, v in rows}

    def write_engine_scrapes(self, node: str, scrapes: Sequence[EngineScrape]) -> None:
        """Roll engine scrapes (up, duration) into each engine's minute."""
        with self._txn():
            for s in scrapes:
                add = {"up_s": float(s.up), "up_w": 1.0, "scrape_s": s.duration_seconds, "scrape_w": 1.0}
                ts = s.timestamp
                self._merge(
                    TABLES["engine"],
                    (node, s.engine),
                    _minute(ts),
                    ts,
                    ts + SAMPLE_SPAN,
                    add,
                    {"engine_kind": s.kind},
                )

    def write_anomaly_score(
        self, node: str, engine: str, model: str, model_version: str, minute: float, score: float
    ) -> None:
        """Set the anomaly score of one model-version minute (the isolation forest's output; above 1
        is anomalous: the minute's seconds then count in ``anomalous_seconds``)."""
        self._db.execute(
            "UPDATE model_minutes SET anomaly_s = ? * seconds, anomaly_w = seconds, "
            "anomalous_seconds = CASE WHEN ? > 1 THEN seconds ELSE 0 END "
            "WHERE node=? AND engine=? AND model=? AND model_version=? AND minute=?",
            (score, score, node, engine, model, model_version, _minute(minute)),
        )

    # -- reads ----------------------------------------------------------------------------------

    def records(
        self,
        start: float,
        end: float,
        kinds: Iterable[Kind] = ("model", "engine", "gpu", "node"),
        match: Mapping[str, str] | None = None,
    ) -> list[MinuteRecord]:
        """Minute records with start ≤ minute < end (epoch seconds), by minute then series.

        ``match`` keeps only series whose labels equal the given values (e.g. model, node).
        """
        out: list[MinuteRecord] = []
        for kind in kinds:
            t = TABLES[kind]
            conds = ["minute >= ?", "minute < ?"]
            params: list[Any] = [start, end]
            for k, v in (match or {}).items():
                if k not in t.keys:
                    break
                conds.append(f"{k} = ?")
                params.append(v)
            else:
                cols = ", ".join([*t.keys, "minute", *t.cols])
                sql = f"SELECT {cols} FROM {t.name} WHERE {' AND '.join(conds)}"
                nk = len(t.keys)
                plan = _read_plan(t)
                for row in self._db.execute(sql, params):
                    labels = tuple(zip(t.keys, row[:nk], strict=True))
                    sums = {n: row[i] for n, i, w in plan if w < 0 or row[w]}
                    out.append(MinuteRecord(kind, labels, float(row[nk]), sums))
        out.sort(key=lambda r: (r.minute, r.kind, r.labels))
        return out

    def series(self, kind: Kind, labels: Mapping[str, str], start: float, end: float) -> list[MinuteRecord]:
        """One series' (or a label subset's) minute records in [start, end), oldest first."""
        return self.records(start, end, (kind,), labels)

    def span(self) -> tuple[float, float] | None:
        """(first minute, last minute) held for model series, or None when empty."""
        row = self._db.execute("SELECT MIN(minute), MAX(minute) FROM model_minutes").fetchone()
        return None if row is None or row[0] is None else (float(row[0]), float(row[1]))

    def hourly_model_sums(
        self,
        start: float,
        end: float,
        bucket_seconds: float = 3600.0,
        names: Sequence[str] | None = None,
    ) -> list[HourSums]:
        """Model minutes in [start, end) summed in SQL per series and bucket of ``bucket_seconds``
        counted from ``start`` (read-only; the weekly report reads weeks without loading minutes).

        Each row: the series (node, engine, model, model_version), the bucket's start and its sums
        by name (:class:`agent.records.MinuteRecord` names: ``gpu_util.s``, …) — every model column,
        or the ``names`` asked for — plus :data:`IDLE_GPU_SECONDS` (the GPU-seconds of the minutes
        without tokens)."""
        t = TABLES["model"]
        wanted = t.cols if names is None else tuple(n.replace(".", "_") for n in names)
        unknown = set(wanted) - set(t.cols)
        if unknown:
            raise ValueError(f"no such model_minutes columns: {sorted(unknown)}")
        sql = (
            "SELECT node, engine, model, model_version, "
            "? + CAST((minute - ?) / ? AS INTEGER) * ? AS bucket, "
            "SUM(CASE WHEN generation_tokens + prompt_tokens > 0 THEN 0 ELSE gpu_seconds END), "
            + ", ".join(f"SUM({c})" for c in wanted)
            + " "
            # "+minute": a sequential scan in primary-key order beats the minute index here (the
            # index visits rows in time order, each a separate b-tree lookup): measured 1.4 s vs
            # 3.4 s on a 35-day store of 24 series (infercost_bench/report.py)
            "FROM model_minutes WHERE +minute >= ? AND +minute < ? "
            "GROUP BY node, engine, model, model_version, bucket"
        )
        b = float(bucket_seconds)
        sum_names = [_sum_name(c) for c in wanted]
        out: list[HourSums] = []
        for row in self._db.execute(sql, (start, start, b, b, start, end)):
            sums = {IDLE_GPU_SECONDS: float(row[5] or 0.0)}
            sums.update((n, float(v or 0.0)) for n, v in zip(sum_names, row[6:], strict=True))
            out.append(((str(row[0]), str(row[1]), str(row[2]), str(row[3])), float(row[4]), sums))
        return out

    # -- deploys and alert state ----------------------------------------------------------------

    def deploys(self, since: float = 0.0) -> list[DeployEvent]:
        """Deploys recorded at or after ``since`` (epoch seconds), oldest first."""
        rows = self._db.execute(
            "SELECT node, engine, model, from_version, to_version, at FROM deploys "
            "WHERE at >= ? ORDER BY at, id",
            (since,),
        )
        return [
            DeployEvent(node, engine, model, a, b, at, kind="engine" if model == "" else "model")
            for node, engine, model, a, b, at in rows
        ]

    def current_versions(self) -> list[tuple[str, str, str, str, float]]:
        """(node, engine, model, version, minute last seen) per model."""
        return [
            tuple(r) for r in self._db.execute("SELECT node, engine, model, version, minute FROM versions")
        ]

    def save_alert_state(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Replace the persisted alert lifecycle state (AlertManager.snapshot())."""
        with self._txn():
            self._db.execute("DELETE FROM alert_state")
            self._db.executemany(
                "INSERT INTO alert_state (dedup_key, body) VALUES (?, ?)",
                [(r["dedup_key"], json.dumps(r)) for r in rows],
            )

    def load_alert_state(self) -> list[dict[str, Any]]:
        """The persisted alert lifecycle state."""
        return [json.loads(r[0]) for r in self._db.execute("SELECT body FROM alert_state")]

    # -- retention ------------------------------------------------------------------------------

    def _maybe_prune(self) -> None:
        now = self._clock.now()
        if now >= self._next_prune:
            self._next_prune = now + PRUNE_EVERY_SECONDS
            self.prune(now)

    def size_bytes(self) -> int:
        """Bytes used by the database pages (excluding the WAL)."""
        pages = self._db.execute("PRAGMA page_count").fetchone()[0]
        free = self._db.execute("PRAGMA freelist_count").fetchone()[0]
        size = self._db.execute("PRAGMA page_size").fetchone()[0]
        return int((pages - free) * size)

    def prune(self, now: float | None = None) -> int:
        """Delete rows older than the retention, then the oldest days while over ``max_bytes``.

        Returns rows deleted.
        """
        now = self._clock.now() if now is None else now
        deleted = self._delete_before(now - self.retention_seconds)
        for _ in range(64):  # each pass drops the oldest tenth of the span held
            if self.size_bytes() <= self.max_bytes:
                break
            span = self.span()
            if span is None:
                break
            cut = span[0] + max(MINUTE, (span[1] - span[0]) / 10)
            logger.warning(
                "history %s over %d bytes: dropping minutes before %.0f", self.path, self.max_bytes, cut
            )
            deleted += self._delete_before(cut)
        self._db.execute("PRAGMA incremental_vacuum")
        return deleted

    def _delete_before(self, cut: float) -> int:
        n = 0
        for t in TABLES.values():
            n += self._db.execute(f"DELETE FROM {t.name} WHERE minute < ?", (cut,)).rowcount
        n += self._db.execute("DELETE FROM deploys WHERE at < ?", (cut,)).rowcount
        return n

    def close(self) -> None:
        """Checkpoint the WAL and close the file. A checkpoint that fails (a full or read-only disk)
        loses nothing: the WAL keeps the rows and the next open replays it; it is logged, not raised."""
        try:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as err:
            logger.warning(
                "history %s: WAL not checkpointed at close (%s); its rows stay in the WAL for the next start",
                self.path,
                err,
            )
        finally:
            self._db.close()


def _sum_name(col: str) -> str:
    if col.endswith("_s") or col.endswith("_w"):
        return col[:-2] + "." + col[-1]
    return col


@functools.cache
def _read_plan(t: _Table) -> tuple[tuple[str, int, int], ...]:
    """How :meth:`Store.records` turns a row of ``t`` (its keys, its minute, then its columns) into
    sums: (sum name, the value's index, the index that must be non-zero for it to be kept, -1 for
    always). A gauge pair with no weight is absent, not zero: its weight is kept only when non-zero
    and its value only when its weight is; a value column without a weight column is never kept."""
    first = len(t.keys) + 1
    at = {_sum_name(c): first + i for i, c in enumerate(t.cols)}
    plan = []
    for name, i in at.items():
        if name.endswith(".w"):
            plan.append((name, i, i))
        elif name.endswith(".s"):
            if (w := at.get(name[:-2] + ".w")) is not None:
                plan.append((name, i, w))
        else:
            plan.append((name, i, -1))
    return tuple(plan)
