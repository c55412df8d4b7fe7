"""The state directory: where the history and the outbox live, held by one agent at a time.

:func:`open_state_dir` creates the directory, takes its lock (``agent.lock``, an exclusive
``flock`` held for the agent's lifetime, with the holder's pid for the error a second agent
prints), proves it takes a write (a read-only or full directory means running without history, in
a private temporary one) and moves damaged SQLite files aside (``<name>.corrupt-<UTC time>``, kept
for a person) so the agent starts new ones. The store and the outbox only open files in it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import logging
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypeVar

T = TypeVar("T")

logger = logging.getLogger(__name__)


class StateDirError(Exception):
    """The state directory cannot be used (not creatable, not a folder, held by another agent)."""


LOCK_NAME = "agent.lock"
HISTORY_NAME = "history.sqlite"
OUTBOX_NAME = "outbox.sqlite"
# Why 64 KiB: enough to prove the directory takes a write (a full disk or quota refuses it), small
# enough to cost nothing at start-up.
PROBE_BYTES = 64 * 1024


@dataclass
class StateDir:
    """The state directory as the agent will use it."""

    path: Path  # where history.sqlite and outbox.sqlite live (a private temp dir when degraded)
    configured: Path  # state_dir from the config
    lock: IO[str] | None = None  # held open for the agent's lifetime (flock)
    note: str | None = None  # why history is degraded or off, for /healthz
    temporary: bool = False  # path is a private temp dir, removed at shutdown
    recovered: list[Path] = field(default_factory=list)  # damaged files moved aside

    def close(self) -> None:
        """Release the lock; remove a temporary directory."""
        if self.lock is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self.lock, fcntl.LOCK_UN)
            self.lock.close()
            self.lock = None
        if self.temporary:
            shutil.rmtree(self.path, ignore_errors=True)


def _holder_pid(lock_path: Path) -> str:
    try:
        text = lock_path.read_text().strip()
    except OSError:
        return "unknown"
    return text if text.isdigit() else "unknown"


def take_lock(path: Path) -> IO[str] | None:
    """Lock ``path/agent.lock`` exclusively; None when it cannot even be opened (read-only dir)."""
    lock_path = path / LOCK_NAME
    try:
        fh: IO[str] = lock_path.open("a+")
    except OSError:
        if not lock_path.exists():
            return None
        try:
            fh = lock_path.open("r")
        except OSError:
            return None
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        raise StateDirError(
            f"state_dir {path} is in use by another infercost agent (pid {_holder_pid(lock_path)}); "
            "fix: stop that agent, or give this one its own state_dir (INFERCOST_STATE_DIR)"
        ) from None
    except OSError as err:  # a filesystem without locks (some NFS setups): say so, run unlocked
        logger.warning("state_dir %s cannot be locked (%s); a second agent would not be refused", path, err)
        return fh
    with contextlib.suppress(OSError, ValueError):
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
    return fh


def write_problem(path: Path) -> OSError | None:
    """None when ``path`` takes a small write; else the error (read-only, full, no permission)."""
    try:
        fd, name = tempfile.mkstemp(prefix=".write-probe-", dir=path)
    except OSError as err:
        return err
    try:
        left = memoryview(b"\0" * PROBE_BYTES)
        while left:  # a write cut short (a file-size limit, the last blocks of a disk) is retried
            n = os.write(fd, left)
            if n <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            left = left[n:]
        os.fsync(fd)
    except OSError as err:
        return err
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(name)
    return None


def open_state_dir(path: Path, now: float, history: bool = True) -> StateDir:
    """Create (if needed), lock and check the state directory.

    Raises :class:`StateDirError` when it cannot be created or another agent holds it. A directory
    that exists but takes no writes (read-only, full) gives a private temporary one instead, with a
    note: the agent then runs without history (baselines absent, absolute rules only)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        if not path.is_dir():
            raise StateDirError(
                f"state_dir {path}: cannot create it ({err.strerror}); fix: create it, writable by the "
                "agent's user, or set state_dir (or INFERCOST_STATE_DIR) to a writable folder"
            ) from None
    if not path.is_dir():
        raise StateDirError(f"state_dir {path} is not a directory; fix: point state_dir at a folder")
    state = StateDir(path=path, configured=path)
    state.lock = take_lock(path)
    problem = write_problem(path)
    if problem is not None:
        why = errno.errorcode.get(problem.errno or 0, "") if problem.errno else ""
        state.note = (
            f"state_dir {path} takes no writes ({problem.strerror or problem}{', ' + why if why else ''}): "
            "running without history (baselines absent, absolute rules only); fix: free space or make "
            "it writable, then restart the agent"
        )
        logger.error("%s", state.note)
        if history:
            state.path = Path(tempfile.mkdtemp(prefix="infercost-nohistory-"))
            state.temporary = True
        return state
    if history:
        for name, full in ((HISTORY_NAME, False), (OUTBOX_NAME, True)):
            moved = recover_if_corrupt(path / name, now, full=full)
            if moved is not None:
                state.recovered.append(moved)
    return state


# -- damaged files ------------------------------------------------------------------------------

# SQLite's primary result codes that mean "this file is damaged", not "this call failed":
# SQLITE_CORRUPT (11) and SQLITE_NOTADB (26).
_CORRUPT_CODES = frozenset({11, 26})


def is_corrupt(err: BaseException) -> bool:
    """True when ``err`` says the SQLite file itself is damaged (corrupt or not a database)."""
    code = getattr(err, "sqlite_errorcode", None)
    if isinstance(code, int):
        return (code & 0xFF) in _CORRUPT_CODES
    msg = str(err).lower()
    return isinstance(err, sqlite3.DatabaseError) and ("malformed" in msg or "not a database" in msg)


def check_sqlite_file(path: Path, full: bool = False) -> str | None:
    """What is wrong with the SQLite file at ``path`` (None: usable or absent).

    Reads the header and the schema; ``full`` also runs ``PRAGMA quick_check`` (reads every page:
    for small files such as the outbox)."""
    if not path.exists():
        return None
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as err:
        return None if not is_corrupt(err) else str(err)
    try:
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        if full:
            row = db.execute("PRAGMA quick_check").fetchone()
            if row is not None and row[0] != "ok":
                return f"quick_check: {row[0]}"
    except sqlite3.Error as err:
        return str(err) if is_corrupt(err) else None
    finally:
        db.close()
    return None


def move_aside(path: Path, now: float) -> Path:
    """Rename a damaged file (and its -wal / -shm) to ``<name>.corrupt-<UTC time>``; returns the new
    path. The file is kept for a person to inspect; the agent starts a new one."""
    stamp = dt.datetime.fromtimestamp(now, tz=dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    dest = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while dest.exists():
        n += 1
        dest = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    path.rename(dest)
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            side.rename(dest.with_name(dest.name + suffix))
    return dest


def recover_if_corrupt(path: Path, now: float, full: bool = False) -> Path | None:
    """Move ``path`` aside when it is damaged (one ERROR line); returns where it went, or None."""
    problem = check_sqlite_file(path, full=full)
    if problem is None:
        return None
    dest = move_aside(path, now)
    logger.error(
        "%s is damaged (%s); moved it to %s and starting a new one (its history is not used)",
        path,
        problem,
        dest.name,
    )
    return dest


def open_recovering(path: Path, now: float, open_file: Callable[[Path], T], recovered: list[Path]) -> T:
    """``open_file(path)``; a file SQLite finds damaged only on opening it (past the start-up check)
    is moved aside (one ERROR line, appended to ``recovered``) and a new one opened."""
    try:
        return open_file(path)
    except sqlite3.DatabaseError as err:
        if not is_corrupt(err):
            raise
        dest = move_aside(path, now)
        logger.error("%s is damaged (%s); moved it to %s and starting a new one", path, err, dest.name)
        recovered.append(dest)
        return open_file(path)
