"""Test helper: a history file as an older agent left it (schema ``version``), with one row in it."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

from agent.store import MIGRATIONS


def old_store(path: Path, version: int, insert: str, params: Sequence[object]) -> Path:
    """Create ``path`` with the first ``version`` migrations applied and ``insert`` run once."""
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    for v in range(version):
        for stmt in MIGRATIONS[v]:
            db.execute(stmt)
    db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(version),))
    db.execute(insert, tuple(params))
    db.commit()
    db.close()
    return path
