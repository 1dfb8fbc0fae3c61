"""The dirty index: which stored pages changed, when, why, and how much crawlers want them.

Crawlers keep getting the stored copy of a changed page ("fresh from their perspective", Koehl &
Wang 5.4) until it is regenerated; the index is how the gate, its other workers and the
regenerator know which pages those are. It lives beside L2 in SQLite (WAL mode: one writer and any
number of readers across processes), so marks survive restarts and every worker sees them.

It is also the catalogue of stored pages (digest → URL), filled as pages are stored, so a pattern
such as ``/showthread.php?t=12&*`` can be matched against what the cache holds (``UrlPattern``:
``*`` is any run of characters; a query is a set of parameters, in any order).

The request path asks ``dirty_since(digest)``: a dictionary lookup. Each process keeps the marks
in memory and reads what other processes changed at most every ``refresh_s`` seconds (SQLite's
``data_version`` says whether anything changed; only rows changed since are read).

    index = DirtyIndex(Path("/var/cache/crawlergate/dirty.sqlite3"))
    index.record_stored(key.digest, key.target)
    index.mark(index.matching("/showthread.php?t=12&*"), "api")
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from crawlergate.errors import ConfigError

# Why a page was marked.
REASONS = ("api", "write-rule", "expiry", "purge", "revalidation")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS pages (
    digest TEXT PRIMARY KEY,
    target TEXT NOT NULL,
    stored_at REAL NOT NULL,
    dirty_since REAL,
    reason TEXT,
    demand INTEGER NOT NULL DEFAULT 0,
    regenerated_at REAL,
    seq INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS pages_seq ON pages (seq);
CREATE INDEX IF NOT EXISTS pages_target ON pages (target);
CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY CHECK (id = 0), seq INTEGER NOT NULL);
INSERT OR IGNORE INTO counter VALUES (0, 0);
"""


class DirtyIndex:
    """Marks of changed pages, shared by the processes that use one L2 directory.

    Parameters:
        path: the SQLite file (created with its folder).
        refresh_s: how stale this process's view of other processes' marks may be.
        clock: wall-clock time, injectable for tests.
    """

    def __init__(self, path: Path, *, refresh_s: float = 0.5, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.refresh_s = refresh_s
        self.clock = clock
        self._lock = threading.Lock()
        self._connection: sqlite3.Connection | None = None
        self._dirty: dict[str, float] = {}
        self._seen_seq = 0
        self._data_version = -1
        self._next_refresh = 0.0

    def start(self) -> None:
        """Open (or create) the index; raises ConfigError when its folder is unusable."""
        with self._lock:
            if self._connection is not None:
                return
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                connection = sqlite3.connect(self.path, timeout=10, isolation_level=None, check_same_thread=False)
                connection.execute("PRAGMA journal_mode=WAL")
                connection.execute("PRAGMA synchronous=NORMAL")
                connection.executescript(_SCHEMA)
            except (OSError, sqlite3.Error) as exc:
                raise ConfigError(f"The dirty index {self.path} is not usable: {exc}.") from None
            self._connection = connection
            self._refresh_locked(force=True)

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    # the request path
    def dirty_since(self, digest: str) -> float | None:
        """When the page was marked changed, or None when it is not (this process's view, ``refresh_s`` old at most)."""
        if self._connection is None:
            return None
        if self.clock() >= self._next_refresh:
            with self._lock:
                self._refresh_locked()
        return self._dirty.get(digest)

    # marking
    def record_stored(self, digest: str, target: str) -> None:
        """A page was stored: it is in the catalogue, and no longer dirty."""
        now = self.clock()
        with self._lock, self._writing() as (database, seq):
            database.execute(
                "INSERT INTO pages (digest, target, stored_at, regenerated_at, seq) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (digest) DO UPDATE SET target = excluded.target, stored_at = excluded.stored_at, "
                "dirty_since = NULL, reason = NULL, regenerated_at = excluded.regenerated_at, seq = excluded.seq",
                (digest, target, now, now, seq),
            )
            self._dirty.pop(digest, None)

    def forget(self, digest: str) -> None:
        """The page left the cache (evicted, gone at the origin)."""
        with self._lock, self._writing() as (database, _):
            database.execute("DELETE FROM pages WHERE digest = ?", (digest,))
            self._dirty.pop(digest, None)

    def mark(self, digests: Iterable[str], reason: str) -> int:
        """Mark stored pages changed (those the catalogue knows); returns how many are marked.

        Idempotent: a page marked already keeps its first mark's time and reason.
        """
        wanted = list(dict.fromkeys(digests))
        if not wanted:
            return 0
        now = self.clock()
        marked = 0
        with self._lock, self._writing() as (database, seq):
            for start in range(0, len(wanted), 500):
                chunk = wanted[start : start + 500]
                holes = ",".join("?" * len(chunk))
                rows = database.execute(
                    f"UPDATE pages SET dirty_since = COALESCE(dirty_since, ?), reason = COALESCE(reason, ?), "
                    f"seq = ? WHERE digest IN ({holes}) RETURNING digest, dirty_since",
                    (now, reason, seq, *chunk),
                ).fetchall()
                self._dirty.update(rows)
                marked += len(rows)
        return marked

    def matching(self, pattern: str) -> list[str]:
        """The digests of the stored pages whose URL (path and query) matches ``pattern`` (see ``UrlPattern``)."""
        compiled = UrlPattern(pattern)
        with self._lock:
            query = "SELECT digest, target FROM pages WHERE target GLOB ?"
            rows = self._db().execute(query, (compiled.glob,)).fetchall()
        return [digest for digest, target in rows if compiled.matches(target)]

    def matching_regex(self, pattern: str) -> list[str]:
        """The digests of the stored pages whose URL (path and query) ``pattern`` matches from its start.

        Raises re.error for a pattern that is no regular expression. Reads the whole catalogue.
        """
        compiled = re.compile(pattern)
        with self._lock:
            rows = self._db().execute("SELECT digest, target FROM pages").fetchall()
        return [digest for digest, target in rows if compiled.match(target)]

    def dirty_count(self) -> int:
        with self._lock:
            self._refresh_locked()
            return len(self._dirty)

    def _db(self) -> sqlite3.Connection:
        if self._connection is None:
            raise RuntimeError("DirtyIndex.start() was not called")
        return self._connection

    @contextlib.contextmanager
    def _writing(self) -> Iterator[tuple[sqlite3.Connection, int]]:
        """One write transaction with its sequence number: writers take turns, so rows commit in seq order."""
        database = self._db()
        database.execute("BEGIN IMMEDIATE")
        try:
            database.execute("UPDATE counter SET seq = seq + 1 WHERE id = 0")
            (seq,) = database.execute("SELECT seq FROM counter WHERE id = 0").fetchone()
            yield database, int(seq)
        except BaseException:
            database.execute("ROLLBACK")
            raise
        database.execute("COMMIT")

    def _refresh_locked(self, *, force: bool = False) -> None:
        """Read the rows other processes (or this one) changed since the last look."""
        if self._connection is None:
            return
        self._next_refresh = self.clock() + self.refresh_s
        (version,) = self._connection.execute("PRAGMA data_version").fetchone()
        if not force and version == self._data_version:
            return
        self._data_version = version
        rows = self._connection.execute(
            "SELECT digest, dirty_since, seq FROM pages WHERE seq > ?", (self._seen_seq,)
        ).fetchall()
        for digest, dirty_since, seq in rows:
            if dirty_since is None:
                self._dirty.pop(digest, None)
            else:
                self._dirty[digest] = dirty_since
            self._seen_seq = max(self._seen_seq, seq)


def _glob(pattern: str) -> str:
    """``pattern`` (``*`` a wildcard, all else literal) as an SQLite GLOB, whose ``?`` and ``[`` are special."""
    return "".join("[" + char + "]" if char in "?[" else char for char in pattern)


class UrlPattern:
    """A page pattern: ``*`` is any run of characters in the path; the query is a set of parameters.

    Stored URLs have their parameters sorted, so a pattern's query is read term by term, in any order:
    ``/showthread.php?t=5&*`` is every URL of /showthread.php with ``t=5`` and any other parameters
    (``?page=2&t=5`` too); ``/showthread.php?t=5`` is t=5 and nothing else; a term's value may hold
    ``*`` (``title=Talk:*``). Without ``?``, ``*`` runs over the whole URL, query included.
    """

    def __init__(self, pattern: str) -> None:
        path, has_query, query = pattern.partition("?")
        self._has_query = bool(has_query)
        self._path = re.compile(_wildcards(path if has_query else pattern), re.DOTALL)
        self._terms: list[tuple[re.Pattern[str], re.Pattern[str]]] = []
        self._others = False
        for term in query.split("&") if has_query else ():
            if term == "*":
                self._others = True
            elif term:
                name, _, value = term.partition("=")
                self._terms.append((re.compile(_wildcards(name), re.DOTALL), re.compile(_wildcards(value), re.DOTALL)))
        # A first cut in SQL (an index-friendly prefix where the pattern has one), then matches() decides.
        self.glob = _glob(path) + "*" if has_query else _glob(pattern)

    def matches(self, target: str) -> bool:
        if not self._has_query:
            return bool(self._path.fullmatch(target))
        path, _, query = target.partition("?")
        if not self._path.fullmatch(path):
            return False
        params = [param.partition("=") for param in query.split("&") if param]
        unmatched = list(range(len(params)))
        for name, value in self._terms:
            found = next((i for i in unmatched if name.fullmatch(params[i][0]) and value.fullmatch(params[i][2])), None)
            if found is None:
                return False
            unmatched.remove(found)
        return self._others or not unmatched


def _wildcards(text: str) -> str:
    return ".*".join(re.escape(part) for part in text.split("*"))
