"""Durable state in SQLite: tail offsets, the notification outbox, counters.

Everything that must survive a restart (or a ``kill -9``) of sentinel lives in
one database file in the state dir. Each write is one transaction, so a crash
leaves either the old value or the new one, never half of each. The store is
shared by threads; one lock serialises access to the single connection.

The database carries a schema version (SQLite's ``user_version``). A newer sentinel
migrates an older state dir in place; a state dir it cannot read (written by a newer
sentinel, or not a database at all) is moved aside, whole, and sentinel starts afresh,
saying so in one line. Nothing is deleted.

The state dir is private (0700) and so are its files (0600), whatever the
umask: the outbox holds notification URLs with their tokens. ``private_dir``
and ``open_private`` are what every writer under the state dir creates with.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
#: SQLite's own files beside the database; it creates them with the database's mode.
_SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS offsets (
    dev INTEGER NOT NULL,
    inode INTEGER NOT NULL,
    path TEXT NOT NULL,
    offset INTEGER NOT NULL,
    head_hash TEXT NOT NULL,
    tail_hash TEXT NOT NULL,
    PRIMARY KEY (dev, inode)
);
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""

#: The layout this sentinel writes. Bump it with a migration in ``_MIGRATIONS``.
SCHEMA_VERSION = 1


def _from_unversioned(conn: sqlite3.Connection) -> None:
    """Schema 0 (sentinel 0.1, no version mark) had the same tables: only the mark is new."""
    for statement in _SCHEMA.split(";"):  # not executescript: it would commit
        if statement.strip():
            conn.execute(statement)


#: Version N's migration to N + 1; each runs in its own transaction with the new mark.
_MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {0: _from_unversioned}


class StateUnreadable(Exception):
    """The database cannot be used as it is (a newer schema, or not a database)."""


class StateDirUnusable(Exception):
    """A file of the state dir that sentinel can neither use nor set aside by itself (a
    directory where a file belongs, a symlink loop, a database SQLite may not write): a
    usage error (exit 2) that names it, before anything starts."""

    def __init__(self, path: Path, why: str, *, itself: bool = False) -> None:
        what = f"the state dir {path}" if itself else f"the state dir's {path.name}"
        super().__init__(f"{what} cannot be used ({why}): move it away")
        self.path = path


def unusable(
    path: Path, error: OSError | sqlite3.Error, *, itself: bool = False
) -> StateDirUnusable:
    """``StateDirUnusable`` for ``path`` (the state dir ``itself``) from the error that said so."""
    why = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
    return StateDirUnusable(path, why, itself=itself)


#: The columns each of the store's tables must hold (a table of the same name made by hand
#: with others is no sentinel table: the database is set aside, as one of a newer schema).
_COLUMNS = {
    "offsets": {"dev", "inode", "path", "offset", "head_hash", "tail_hash"},
    "kv": {"key", "value"},
}


@dataclass(frozen=True, slots=True)
class FileOffset:
    """How far a tailed file was read.

    ``offset`` is the end of the last complete line handed on. ``head_hash``
    fingerprints the file's first bytes, so a reused inode is not mistaken for
    the old file; ``tail_hash`` covers the bytes just before ``offset``, so a
    file truncated and regrown past the offset is noticed.
    """

    path: str
    dev: int
    inode: int
    offset: int
    head_hash: str
    tail_hash: str


def private_dir(path: Path) -> Path:
    """Make ``path`` (and its missing parents) a directory only its owner can use: 0700.

    A state dir that exists with a looser mode is tightened, and the log says so;
    one that cannot be (another user's) is logged and left. Parents it creates get
    the umask's mode, as ``mkdir -p`` gives them.
    """
    existed = path.is_dir()
    path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode != PRIVATE_DIR_MODE:
        try:
            os.chmod(path, PRIVATE_DIR_MODE)
        except OSError as error:
            log.warning("state dir %s is %04o and cannot be made private: %s", path, mode, error)
            return path
        if existed and mode & 0o077:
            log.warning("state dir %s was %04o, open to others: made it 0700", path, mode)
    return path


def open_private(path: Path, flags: int) -> int:
    """``os.open`` a file for writing with mode 0600, whatever the umask; an older file too.

    ``flags`` are the usual ``os.O_*`` (``O_CREAT`` is added). The descriptor is not
    inherited by child processes (the job).
    """
    fd = os.open(path, flags | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE_MODE)
    try:
        _fix_mode(fd, path)
    except OSError:
        os.close(fd)
        raise
    return fd


def open_own(path: Path, flags: int) -> int:
    """``open_private`` for a file the state dir must hold for sentinel to run (the lock,
    the alert journal): one it cannot open (a directory, a symlink loop) is
    ``StateDirUnusable``, before anything starts."""
    try:
        return open_private(path, flags)
    except OSError as error:
        raise unusable(path, error) from None


def make_private(path: Path) -> None:
    """Tighten an existing file to 0600 (logged when it was open to others); none is fine."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return
    try:
        _fix_mode(fd, path)
    finally:
        os.close(fd)


def _fix_mode(fd: int, path: Path) -> None:
    mode = stat.S_IMODE(os.fstat(fd).st_mode)
    if mode != PRIVATE_FILE_MODE:
        os.fchmod(fd, PRIVATE_FILE_MODE)
        if mode & 0o077:
            log.warning("%s was %04o, open to others: made it 0600", path, mode)


class StateStore:
    """The state dir's SQLite database (``<state_dir>/state.db``)."""

    def __init__(self, state_dir: Path) -> None:
        private_dir(state_dir)
        self.path = state_dir / "state.db"
        self._lock = threading.RLock()
        try:
            # SQLite gives its -wal and -shm files the database's mode: create it 0600 first.
            os.close(open_private(self.path, os.O_RDWR))
            for suffix in _SQLITE_SIDE_FILES:  # left by an older sentinel, with the umask's mode
                side = self.path.with_name(self.path.name + suffix)
                if side.is_dir():  # SQLite would read the database and refuse every write
                    raise StateDirUnusable(side, "a directory, not a file")
                make_private(side)
            try:
                self._conn = self._open()
            except StateUnreadable as why:
                aside = _move_aside(self.path)
                log.warning("%s: moved it aside to %s and started afresh", why, aside.name)
                os.close(open_private(self.path, os.O_RDWR))
                self._conn = self._open()
        except (OSError, sqlite3.OperationalError) as error:
            # A directory named state.db (or -shm), a symlink loop: nothing sentinel moves.
            raise unusable(self.path, error) from None

    @classmethod
    def in_memory(cls) -> StateStore:
        """A store that keeps nothing on disk: what cannot wait for a state dir that
        refuses writes (``Outbox``'s spill). Gone when sentinel exits."""
        store = cls.__new__(cls)
        store.path = Path(":memory:")
        store._lock = threading.RLock()
        store._conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        store._conn.executescript(_SCHEMA)
        return store

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, check_same_thread=False, isolation_level=None, timeout=30.0
        )
        try:
            # Read before anything writes: a database sentinel cannot read is kept as it was.
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if version > SCHEMA_VERSION:
                raise StateUnreadable(
                    f"{self.path} was written by a newer sentinel (schema {version}; this one"
                    f" reads up to {SCHEMA_VERSION})"
                )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            for old in range(version, SCHEMA_VERSION):
                conn.execute("BEGIN IMMEDIATE")
                _MIGRATIONS[old](conn)
                conn.execute(f"PRAGMA user_version = {old + 1}")
                conn.execute("COMMIT")
                if old or _has_rows(conn):
                    log.info("%s: migrated the state from schema %d to %d", self.path, old, old + 1)
            conn.executescript(_SCHEMA)
            for table, needed in _COLUMNS.items():
                have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
                if not needed <= have:
                    raise StateUnreadable(
                        f"{self.path} has a table {table} without sentinel's columns"
                        f" ({', '.join(sorted(needed - have))})"
                    )
            # A write now, not at the first notice: a -shm that is a directory leaves the
            # database readable and every write refused.
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except sqlite3.DatabaseError as error:
            conn.close()
            if isinstance(error, sqlite3.OperationalError):
                raise  # locked, read-only, full: the caller says so; nothing is moved
            why = f"{self.path} is not a sentinel state database ({error})"
            raise StateUnreadable(why) from None
        except StateUnreadable:
            conn.close()
            raise
        return conn

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic unit of work: committed on success, rolled back on error."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                if self._conn.in_transaction:  # a full disk has SQLite roll back itself
                    self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    @contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        """A consistent read that takes no write lock: it works in a read-only state dir."""
        with self._lock:
            self._conn.execute("BEGIN DEFERRED")
            try:
                yield self._conn
            finally:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")

    def executescript(self, script: str) -> None:
        """Create a plugin's own tables (idempotent ``CREATE ... IF NOT EXISTS``)."""
        with self._lock:
            self._conn.executescript(script)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    @property
    def schema_version(self) -> int:
        with self._lock:
            return int(self._conn.execute("PRAGMA user_version").fetchone()[0])

    # -- tail offsets -------------------------------------------------------

    def load_offset(self, dev: int, inode: int) -> FileOffset | None:
        with self.reading() as conn:
            row = conn.execute(
                "SELECT path, dev, inode, offset, head_hash, tail_hash FROM offsets"
                " WHERE dev = ? AND inode = ?",
                (dev, inode),
            ).fetchone()
        return FileOffset(*row) if row else None

    def save_offset(self, record: FileOffset) -> None:
        with self.transaction() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO offsets (dev, inode, path, offset, head_hash, tail_hash)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (
                    record.dev,
                    record.inode,
                    record.path,
                    record.offset,
                    record.head_hash,
                    record.tail_hash,
                ),
            )

    # -- small counters (restart count, run id) -----------------------------

    def get(self, key: str) -> str | None:
        with self.reading() as conn:
            row = conn.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        return str(row[0]) if row else None

    def put(self, key: str, value: str) -> None:
        self.put_many({key: value})

    def put_many(self, values: dict[str, str]) -> None:
        """Set several keys in one transaction: a reader sees all of them or none."""
        with self.transaction() as conn:
            conn.executemany(
                "INSERT OR REPLACE INTO kv (key, value) VALUES (?, ?)", list(values.items())
            )


def _has_rows(conn: sqlite3.Connection) -> bool:
    """Whether an unversioned database held anything (not merely created just now)."""
    return any(
        conn.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchone() for table in ("offsets", "kv")
    )


def _move_aside(path: Path) -> Path:
    """Rename the database and its SQLite side files to ``<name>.unreadable-<time>``."""
    aside = path.with_name(f"{path.name}.unreadable-{time.strftime('%Y%m%dT%H%M%S')}")
    n = 1
    while os.path.lexists(aside):
        n += 1
        aside = aside.with_name(f"{path.name}.unreadable-{time.strftime('%Y%m%dT%H%M%S')}-{n}")
    os.rename(path, aside)
    for suffix in _SQLITE_SIDE_FILES:
        side = path.with_name(path.name + suffix)
        if os.path.lexists(side):
            os.rename(side, aside.with_name(aside.name + suffix))
    return aside
