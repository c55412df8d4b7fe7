"""Who paid, over time: each engine's cost identity (namespace, pod, role, group, cost labels) kept
with the history, so a cost query groups every minute by the labels its engine had *then*.

One small table in the history file, ``engine_cost_labels`` (node, engine, since, info): a row is
added only when an engine's identity changes, so it holds a handful of rows per engine and its
writes are rare. A model minute takes the identity of the latest row whose ``since`` is at or before
the minute's start; an engine's first row has ``since`` 0 (it names who pays for all of that engine's
history before it). The table is created if absent and pruned with the history's retention (keeping
each engine's latest row); it is kept apart from the minute tables, whose versioned schema it does
not touch, and a store without it reads as engines without cost labels.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agent.records import MINUTE
from agent.snapshot import EngineCostInfo, Snapshot

logger = logging.getLogger(__name__)

TABLE = "engine_cost_labels"
CREATE = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} (node TEXT NOT NULL, engine TEXT NOT NULL, since REAL NOT NULL, "
    "info TEXT NOT NULL, PRIMARY KEY (node, engine, since)) WITHOUT ROWID"
)
PRUNE_EVERY_SECONDS = 3600.0  # as the store's own retention: a DELETE at most hourly


def info_json(info: EngineCostInfo) -> str:
    """An identity as the table keeps it (stable text: equal identities compare equal)."""
    return json.dumps(info.as_json(), sort_keys=True, separators=(",", ":"))


def parse_info(text: str | None) -> dict[str, Any]:
    """A kept identity as a mapping; {} for a minute whose engine has none (or unreadable text)."""
    if not text:
        return {}
    try:
        out = json.loads(text)
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}


def has_table(db: sqlite3.Connection) -> bool:
    """Whether the history file holds the identity table (a file written before it read without)."""
    row = db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (TABLE,)).fetchone()
    return row is not None


class CostLabelHistory:
    """Writes engines' identities into the history file as they change (its own connection)."""

    def __init__(self, path: Path, retention_days: float) -> None:
        self.path = path
        self.retention_seconds = retention_days * 86400.0
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.execute(CREATE)
        self._latest: dict[tuple[str, str], str] = {}
        rows = self._db.execute(
            f"SELECT node, engine, info FROM {TABLE} t WHERE since = "
            f"(SELECT MAX(since) FROM {TABLE} u WHERE u.node = t.node AND u.engine = t.engine)"
        )
        for node, engine, info in rows:
            self._latest[(str(node), str(engine))] = str(info)
        self._next_prune = 0.0
        self._failing = False

    def note(self, node: str, infos: Iterable[EngineCostInfo], at: float) -> int:
        """Keep each identity that changed since it was last kept (``at``: epoch seconds of the
        tick); returns the rows added. A failing disk is logged once per outage, never raised."""
        rows: list[tuple[str, str, float, str]] = []
        for info in infos:
            text = info_json(info)
            key = (node, info.engine)
            last = self._latest.get(key)
            if last == text:
                continue
            since = 0.0 if last is None else float(int(at // MINUTE * MINUTE))
            rows.append((node, info.engine, since, text))
        if not rows and at < self._next_prune:
            return 0
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(f"INSERT OR REPLACE INTO {TABLE} VALUES (?, ?, ?, ?)", rows)
                if at >= self._next_prune:
                    self._prune(at)
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
        except sqlite3.Error as err:
            if not self._failing:
                self._failing = True
                logger.warning(
                    "cost labels not kept in %s (%s); tried again at the next tick", self.path, err
                )
            return 0
        if self._failing:
            self._failing = False
            logger.info("cost labels kept in %s again", self.path)
        for node_, engine, _since, text in rows:
            self._latest[(node_, engine)] = text
        return len(rows)

    def _prune(self, now: float) -> None:
        """Rows older than the retention, except each engine's latest (it still names who pays)."""
        self._next_prune = now + PRUNE_EVERY_SECONDS
        self._db.execute(
            f"DELETE FROM {TABLE} WHERE since < ? AND since < "
            f"(SELECT MAX(since) FROM {TABLE} u WHERE u.node = {TABLE}.node AND u.engine = {TABLE}.engine)",
            (now - self.retention_seconds,),
        )

    def on_tick(self, _tick: object, snap: Snapshot) -> None:
        """The daemon's per-tick hook: keep the snapshot's identities."""
        self.note(snap.node, snap.engine_info, snap.timestamp)

    def close(self) -> None:
        """Close the connection."""
        self._db.close()
