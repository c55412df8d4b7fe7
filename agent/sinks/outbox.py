"""A durable outbox (SQLite): alert notifications survive crashes and outages until delivered.

Each notification is one row per sink, written in the same moment the lifecycle produced the
event, *before* any delivery is tried. Delivery is at-least-once and strictly in order per sink:
only the oldest undelivered row of a sink is tried (head of line), so a resolve can never
overtake its trigger. A failed try is rescheduled with exponential backoff and jitter (or the
receiver's Retry-After); a row the receiver rejects as malformed (4xx other than 408/429) is
marked dead and logged, so one bad payload cannot block a sink forever. Duplicates (a crash after
the receiver accepted but before the row was marked) are harmless: keys are stable.

The row holds the alert, not the vendor payload: secrets (routing keys, webhook URLs) are read
at send time and never written to disk.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Why a day: delivered rows are only kept to answer "was it sent?" while debugging.
KEEP_DELIVERED_SECONDS = 86400.0


@dataclass(frozen=True, slots=True)
class OutboxItem:
    """One notification waiting for (or done with) delivery to one sink."""

    id: int
    sink: str
    dedup_key: str
    kind: str  # firing | resolved | message
    body: Mapping[str, Any]  # the alert as a dict (agent.records.Alert, asdict), or a message
    created: float  # epoch seconds
    attempts: int
    next_attempt: float  # epoch seconds


class Outbox:
    """The outbox file (``outbox.sqlite`` in the state directory)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        # Detection enqueues from a worker thread while the delivery loop reads and marks rows on
        # the event loop: one lock keeps every statement and transaction whole.
        self._lock = threading.RLock()
        self._db.execute("PRAGMA journal_mode=WAL")
        # FULL: an enqueued alert is on disk before we go on (alerts are rare, the fsync is cheap)
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.execute(
            """CREATE TABLE IF NOT EXISTS outbox (
              id INTEGER PRIMARY KEY AUTOINCREMENT,
              sink TEXT NOT NULL, dedup_key TEXT NOT NULL, kind TEXT NOT NULL, body TEXT NOT NULL,
              created REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, next_attempt REAL NOT NULL,
              state TEXT NOT NULL DEFAULT 'pending', done_at REAL, last_error TEXT)"""
        )
        self._db.execute("CREATE INDEX IF NOT EXISTS outbox_pending ON outbox (sink, state, id)")
        # Alerts firing per sink, for destinations that need them re-sent while they fire.
        self._db.execute(
            """CREATE TABLE IF NOT EXISTS active (
              sink TEXT NOT NULL, dedup_key TEXT NOT NULL, body TEXT NOT NULL,
              PRIMARY KEY (sink, dedup_key))"""
        )

    def enqueue(self, sink: str, dedup_key: str, kind: str, body: Mapping[str, Any], now: float) -> int:
        """Add one notification; returns its id (ids give the delivery order)."""
        with self._lock:
            cur = self._db.execute(
                "INSERT INTO outbox (sink, dedup_key, kind, body, created, next_attempt) "
                "VALUES (?,?,?,?,?,?)",
                (sink, dedup_key, kind, json.dumps(body, sort_keys=True), now, now),
            )
            return int(cur.lastrowid or 0)

    def enqueue_many(
        self,
        items: Sequence[tuple[str, str, str, Mapping[str, Any]]],
        now: float,
        active: Sequence[tuple[str, str, Mapping[str, Any] | None]] = (),
    ) -> None:
        """Add several notifications (sink, dedup_key, kind, body) in one transaction, together
        with changes to the firing set (sink, dedup_key, body; None = no longer firing)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for sink, key, kind, body in items:
                    self.enqueue(sink, key, kind, body, now)
                for sink, key, fired in active:
                    if fired is None:
                        self._db.execute("DELETE FROM active WHERE sink=? AND dedup_key=?", (sink, key))
                    else:
                        self._db.execute(
                            "INSERT OR REPLACE INTO active (sink, dedup_key, body) VALUES (?,?,?)",
                            (sink, key, json.dumps(fired, sort_keys=True)),
                        )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def head(self, sink: str) -> OutboxItem | None:
        """The oldest undelivered notification of a sink (due or not)."""
        with self._lock:
            row = self._db.execute(
                "SELECT id, sink, dedup_key, kind, body, created, attempts, next_attempt FROM outbox "
                "WHERE sink=? AND state='pending' ORDER BY id LIMIT 1",
                (sink,),
            ).fetchone()
            if row is None:
                return None
            return OutboxItem(row[0], row[1], row[2], row[3], json.loads(row[4]), row[5], row[6], row[7])

    def delivered(self, item_id: int, now: float) -> None:
        """Mark delivered."""
        with self._lock:
            self._db.execute(
                "UPDATE outbox SET state='delivered', done_at=?, attempts=attempts+1 WHERE id=?",
                (now, item_id),
            )

    def retry(self, item_id: int, next_attempt: float, error: str) -> None:
        """Count a failed try and schedule the next one (epoch seconds)."""
        with self._lock:
            self._db.execute(
                "UPDATE outbox SET attempts=attempts+1, next_attempt=?, last_error=? WHERE id=?",
                (next_attempt, error, item_id),
            )

    def dead(self, item_id: int, now: float, error: str) -> None:
        """Give up on a notification the receiver rejects as malformed."""
        with self._lock:
            self._db.execute(
                "UPDATE outbox SET state='dead', done_at=?, attempts=attempts+1, last_error=? WHERE id=?",
                (now, error, item_id),
            )

    def pending(self, sink: str | None = None) -> int:
        """Undelivered notifications (of one sink, or all)."""
        with self._lock:
            if sink is None:
                row = self._db.execute("SELECT COUNT(*) FROM outbox WHERE state='pending'").fetchone()
            else:
                row = self._db.execute(
                    "SELECT COUNT(*) FROM outbox WHERE state='pending' AND sink=?", (sink,)
                ).fetchone()
            return int(row[0])

    def active(self, sink: str) -> list[tuple[str, Mapping[str, Any]]]:
        """The alerts firing on ``sink`` as (dedup_key, body), oldest key first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT dedup_key, body FROM active WHERE sink=? ORDER BY rowid", (sink,)
            ).fetchall()
            return [(r[0], json.loads(r[1])) for r in rows]

    def items(self, sink: str | None = None, state: str | None = None) -> list[tuple[OutboxItem, str]]:
        """Every row (optionally of one sink / state) with its state, oldest first (for tests, debugging)."""
        with self._lock:
            sql = "SELECT id, sink, dedup_key, kind, body, created, attempts, next_attempt, state FROM outbox"
            conds, params = [], []
            if sink is not None:
                conds.append("sink=?")
                params.append(sink)
            if state is not None:
                conds.append("state=?")
                params.append(state)
            if conds:
                sql += " WHERE " + " AND ".join(conds)
            rows = self._db.execute(sql + " ORDER BY id", params).fetchall()
            return [
                (OutboxItem(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5], r[6], r[7]), r[8]) for r in rows
            ]

    def prune(self, now: float) -> int:
        """Forget delivered / dead rows older than a day; returns rows deleted."""
        with self._lock:
            cur = self._db.execute(
                "DELETE FROM outbox WHERE state != 'pending' AND done_at < ?", (now - KEEP_DELIVERED_SECONDS,)
            )
            return cur.rowcount

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            self._db.close()
