"""L2Index: what one L2 folder holds, shared by every process that uses it, in one SQLite file.

Each page's row has its size on disk and when it was last used; one more row has the totals (pages, their bytes,
the bytes of what else the folder holds for them: the published tree). Triggers keep the totals with the rows in
the same transaction, so the folder's size is known without listing it, and the least recently used pages are the
first rows of an index: eviction costs a lookup per page, whatever the folder holds. This is nginx's key zone
(a shared LRU of metadata) in a file: the processes of ``serve --workers`` and the off-peak regenerator share it.

A write transaction (``writing``) is also the lock under which a page's file changes: a file is renamed into
place or unlinked while its row changes, so no process sees one without the other for long, and a loader that
lists a shard under the same lock finds them agreeing (a crash between the two is what the loader repairs).

Every read or write of many rows is one statement, its rows going in as a JSON array (``json_each``) and
coming out as one (``json_group_array``). SQLite lets the GIL go around each row it steps (``executemany``, a
cursor's rows), and a thread beside a busy event loop then waits for it again at each row, up to the
interpreter's switch interval: 8,000 hits' recency took 35 s that way beside a busy thread, and 56 ms as one
statement, so under a crawler storm eviction all but stopped while the hits were written.

Nothing here is synced to disk (``synchronous=OFF``): the index can be rebuilt from the files, which the loader
does for a damaged file, so a power cut costs a rebuild, never a page.

    index = L2Index(Path("/var/cache/crawlergate/l2.sqlite3"))
    index.open()
    with index.writing() as write:
        write.put("ab12…", 4096, time.time())
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from crawlergate.errors import StoreUnavailable
from crawlergate.forksafe import after_fork_in_child, no_fork_inside

logger = logging.getLogger(__name__)

# How long a process waits for another's write transaction (the loader holds one for a shard's few milliseconds).
WAIT_S = 10.0
# The WAL is cut back to this size after each checkpoint.
WAL_MAX_BYTES = 4 * 1024 * 1024

_SCHEMA = """
CREATE TABLE IF NOT EXISTS pages (key TEXT PRIMARY KEY, bytes INTEGER NOT NULL, used REAL NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS pages_by_use ON pages (used);
CREATE TABLE IF NOT EXISTS totals (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    pages INTEGER NOT NULL,
    page_bytes INTEGER NOT NULL,
    other_bytes INTEGER NOT NULL,
    shards_to_load INTEGER NOT NULL,
    loaded_at REAL NOT NULL
);
INSERT OR IGNORE INTO totals VALUES (0, 0, 0, 0, 0, 0);
CREATE TRIGGER IF NOT EXISTS page_added AFTER INSERT ON pages BEGIN
    UPDATE totals SET pages = pages + 1, page_bytes = page_bytes + NEW.bytes WHERE id = 0;
END;
CREATE TRIGGER IF NOT EXISTS page_removed AFTER DELETE ON pages BEGIN
    UPDATE totals SET pages = pages - 1, page_bytes = page_bytes - OLD.bytes WHERE id = 0;
END;
CREATE TRIGGER IF NOT EXISTS page_resized AFTER UPDATE OF bytes ON pages BEGIN
    UPDATE totals SET page_bytes = page_bytes - OLD.bytes + NEW.bytes WHERE id = 0;
END;
"""


class IndexWrite:
    """The index inside one write transaction (see ``L2Index.writing``)."""

    def __init__(self, database: sqlite3.Connection) -> None:
        self._database = database
        # Whether a process's hits counted in memory were written in this transaction (evictions write them once).
        self.hits_written = False

    def total_bytes(self) -> int:
        """The folder's size as counted: the pages and what else is held for them."""
        (total,) = self._database.execute("SELECT page_bytes + other_bytes FROM totals WHERE id = 0").fetchone()
        return max(0, int(total))

    def put(self, key: str, size: int, used: float) -> None:
        self._database.execute(
            "INSERT INTO pages VALUES (?, ?, ?) ON CONFLICT (key) DO UPDATE SET bytes = excluded.bytes, "
            "used = excluded.used",
            (key, size, used),
        )

    def put_many(self, rows: list[tuple[str, int, float]]) -> None:
        """Add pages (key, size, last used) the index does not hold yet."""
        if rows:
            self._database.execute(
                "INSERT OR IGNORE INTO pages SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), "
                "json_extract(value, '$[2]') FROM json_each(?)",
                (json.dumps(rows),),
            )

    def remove(self, key: str) -> None:
        self._database.execute("DELETE FROM pages WHERE key = ?", (key,))

    def mark_used(self, used: dict[str, float]) -> None:
        """Record when pages were last used (key: when)."""
        if used:
            self._database.execute(
                "UPDATE pages SET used = hit.value FROM json_each(?) AS hit WHERE pages.key = hit.key",
                (json.dumps(used),),
            )

    def remove_many(self, keys: list[str]) -> None:
        if keys:
            self._database.execute(
                "DELETE FROM pages WHERE key IN (SELECT value FROM json_each(?))", (json.dumps(keys),)
            )

    def least_recently_used(self, count: int) -> list[tuple[str, int]]:
        """The ``count`` pages used longest ago, with their sizes."""
        (rows,) = self._database.execute(
            "SELECT json_group_array(json_array(key, bytes)) FROM (SELECT key, bytes FROM pages ORDER BY used LIMIT ?)",
            (count,),
        ).fetchone()
        return [(key, size) for key, size in json.loads(rows)]

    def keys_from(self, prefix: str) -> set[str]:
        """The keys that start with a shard's two characters (a range of the primary key, not a scan)."""
        upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        (keys,) = self._database.execute(
            "SELECT json_group_array(key) FROM pages WHERE key >= ? AND key < ?", (prefix, upper)
        ).fetchone()
        return set(json.loads(keys))

    def add_other(self, size: int) -> None:
        """Count ``size`` bytes more (negative: fewer) of what the folder holds beside the pages."""
        if size:
            self._database.execute("UPDATE totals SET other_bytes = MAX(0, other_bytes + ?) WHERE id = 0", (size,))

    def set_other(self, size: int) -> None:
        self._database.execute("UPDATE totals SET other_bytes = ? WHERE id = 0", (max(0, size),))

    def set_loading(self, shards_to_load: int, *, loaded_at: float | None = None) -> None:
        if loaded_at is None:
            self._database.execute("UPDATE totals SET shards_to_load = ? WHERE id = 0", (shards_to_load,))
        else:
            self._database.execute(
                "UPDATE totals SET shards_to_load = ?, loaded_at = ? WHERE id = 0", (shards_to_load, loaded_at)
            )


class L2Index:
    """The shared index file of one L2 folder; every call is safe from any thread, and after a fork.

    A damaged file (a power cut: nothing is synced) is moved aside under a lock every process of the folder
    takes first, and begun anew (its totals say it was never loaded: the loader fills it from the folder). A
    process whose file was moved aside by another opens the new one at its next transaction (the path names
    another file now), so the processes of a folder never keep counting in two files.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._connection: sqlite3.Connection | None = None
        self._inode = 0
        after_fork_in_child(self, L2Index._forget_parent)
        no_fork_inside(self, lambda index: index._lock)

    def open(self) -> None:
        """Open (or create) the file; a damaged one is moved aside (``….damaged-<time>``) and begun anew.
        Raises StoreUnavailable when the folder cannot hold it."""
        with self._lock:
            self._open_locked()

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
            self._connection = None

    @contextlib.contextmanager
    def writing(self) -> Iterator[IndexWrite]:
        """One write transaction, which is also the folder's lock: one thread of one process at a time. Any
        failure of the index is a StoreUnavailable; a damaged file is rebuilt for the next call."""
        with self._lock:
            database = self._database()
            try:
                database.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise self._failed(exc) from exc
            try:
                yield IndexWrite(database)
                database.execute("COMMIT")
            except BaseException as exc:
                with contextlib.suppress(sqlite3.Error):
                    database.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise self._failed(exc) from exc
                raise

    def totals(self) -> tuple[int, int, int, float]:
        """(pages, bytes counted, shards still to load, when the last load ended)."""
        row = self._read("SELECT pages, page_bytes + other_bytes, shards_to_load, loaded_at FROM totals WHERE id = 0")
        if not row:
            return 0, 0, 0, 0.0
        pages, total, shards, loaded_at = row[0]
        return max(0, int(pages)), max(0, int(total)), int(shards), float(loaded_at)

    def keys(self) -> list[str]:
        keys: list[str] = json.loads(self._read("SELECT json_group_array(key) FROM pages")[0][0])
        return keys

    def touch(self, used: dict[str, float]) -> None:
        """Record when pages were last used (many at once: hits are counted in memory, then written)."""
        if not used:
            return
        with self.writing() as write:
            write.mark_used(used)

    def _read(self, query: str) -> list[tuple[Any, ...]]:
        with self._lock:
            try:
                return self._database().execute(query).fetchall()
            except sqlite3.Error as exc:
                raise self._failed(exc) from exc

    def _failed(self, error: sqlite3.Error) -> StoreUnavailable:
        """The error to raise; a damaged file is moved aside first, so the next call begins a new one."""
        if _is_damage(error):
            with contextlib.suppress(OSError, sqlite3.Error, StoreUnavailable):
                self._rebuild_locked(error)
        return StoreUnavailable(f"L2 index {self.path}: {error}")

    def _database(self) -> sqlite3.Connection:
        if self._connection is not None:
            try:
                replaced = os.stat(self.path).st_ino != self._inode
            except FileNotFoundError:
                replaced = True
            if not replaced:
                return self._connection
            self._connection.close()  # another process rebuilt the file: this one is the damaged copy
            self._connection = None
        self._open_locked()
        assert self._connection is not None
        return self._connection

    def _open_locked(self) -> None:
        if self._connection is not None:
            return
        try:
            with self._folder_lock():
                try:
                    connection = _connect(self.path)
                except sqlite3.OperationalError:
                    raise  # cannot be opened, or busy: not a damaged file
                except sqlite3.DatabaseError as exc:
                    self._move_aside(exc)
                    connection = _connect(self.path)
                self._inode = os.stat(self.path).st_ino
        except (OSError, sqlite3.Error) as exc:
            raise StoreUnavailable(f"L2 index {self.path} is not usable: {exc}") from exc  # its cause says why
        self._connection = connection

    def _rebuild_locked(self, error: sqlite3.Error) -> None:
        """Move the damaged file aside, unless another process did (the path names a new file then)."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        with self._folder_lock():
            if os.stat(self.path).st_ino == self._inode:
                self._move_aside(error)
        self._open_locked()

    def _move_aside(self, error: sqlite3.Error) -> None:
        aside = self.path.with_name(f"{self.path.name}.damaged-{int(time.time())}")
        logger.warning("the L2 index %s is damaged (%s): moved to %s, rebuilt from the folder", self.path, error, aside)
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.replace(f"{self.path}{suffix}", f"{aside}{suffix}")

    @contextlib.contextmanager
    def _folder_lock(self) -> Iterator[None]:
        """Every process of the folder opens or rebuilds the file under this lock, one at a time."""
        with open(f"{self.path}.lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _forget_parent(self) -> None:
        """In a forked child: the parent's connection and lock are the parent's."""
        self._lock = threading.Lock()
        self._connection = None


def _is_damage(error: sqlite3.Error) -> bool:
    """Whether SQLite says the file itself is damaged (not busy, locked or full)."""
    return isinstance(error, sqlite3.DatabaseError) and getattr(error, "sqlite_errorcode", 0) & 0xFF in (
        sqlite3.SQLITE_CORRUPT,
        sqlite3.SQLITE_NOTADB,
    )


def require_json_sql(connection: sqlite3.Connection) -> None:
    """Raise OperationalError (a file that cannot be used, not a damaged one) unless SQLite has what bulk reads and
    writes here are made of: ``UPDATE … FROM`` (3.33) and its JSON functions."""
    if sqlite3.sqlite_version_info < (3, 33, 0):
        raise sqlite3.OperationalError(f"SQLite {sqlite3.sqlite_version} is older than 3.33, which crawlergate needs")
    try:
        connection.execute("SELECT json_array()")
    except sqlite3.OperationalError:
        raise sqlite3.OperationalError(
            f"SQLite {sqlite3.sqlite_version} was built without its JSON functions, which crawlergate needs"
        ) from None


def _connect(path: Path) -> sqlite3.Connection:
    connection = sqlite3.connect(path, timeout=WAIT_S, isolation_level=None, check_same_thread=False)
    try:
        require_json_sql(connection)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=OFF")
        connection.execute(f"PRAGMA journal_size_limit={WAL_MAX_BYTES}")
        connection.executescript(_SCHEMA)
    except sqlite3.Error:
        connection.close()
        raise
    return connection
