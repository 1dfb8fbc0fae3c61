"""The page catalogue: which stored pages changed, when, why, and how much crawlers want them.

Crawlers keep getting the stored copy of a changed page ("fresh from their perspective", Koehl &
Wang 5.4) until it is regenerated; the index is how the gate, its other workers and the
regenerator know which pages those are. It lives beside L2 in SQLite (WAL mode: one writer and any
number of readers across processes), so marks survive restarts and every worker sees them.

It is also the catalogue of stored pages (digest → URL), filled as pages are stored, so a pattern
such as ``/showthread.php?t=12&*`` can be matched against what the cache holds (``UrlPattern``:
``*`` is any run of characters; a query is a set of parameters, in any order).

Each page also carries its crawler demand: requests counted in memory, written every FLUSH_S off
the request path, decayed with a one-day half-life (the regenerator's "most valuable first").

The request path asks ``dirty_since(digest)``: a dictionary lookup, never SQLite. Each process keeps
the marks in memory; ``upkeep``, run off the request path when ``upkeep_due`` says so (every
``refresh_s``), reads what other processes changed (SQLite's ``data_version`` says whether anything
did; only rows changed since are read) and writes the crawler demand counted since the last time.

Reads and writes of many rows are one statement each, the rows going in and out as JSON arrays: SQLite lets
the GIL go around each row it steps, and beside a busy event loop a thread waits for it again at every row.
Written a row at a time, the demand of 10,000 pages held the catalogue for 3.4 s under a storm of crawler
hits, and every PURGE, mark and stored page waited for it (see stores/l2index.py).

    index = PageCatalogue(Path("/var/cache/crawlergate/dirty.sqlite3"))
    index.record_stored(key.digest, key.target)
    index.mark(index.matching("/showthread.php?t=12&*"), "api")
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crawlergate.errors import ConfigError, CrawlerGateError
from crawlergate.stores.l2index import require_json_sql
from crawlergate.throttle import Throttle

logger = logging.getLogger(__name__)
# How long a write waits for another process's write to finish (SQLite's busy timeout).
WAIT_S = 5.0
# The write-ahead log: checkpointed every 256 pages (1 MB of 4 KB pages), and cut back to 1 MB after.
WAL_CHECKPOINT_PAGES = 256
WAL_MAX_BYTES = 1024 * 1024


# Crawler requests are written to the index at most this often; a page's demand halves every half-life.
FLUSH_S = 30.0
DEMAND_HALF_LIFE_S = 86400.0


def _in_no_store(digest: str) -> bool:
    return False


def _decayed(demand: float | None, since: float | None, now: float) -> float:
    if not demand or since is None:
        return float(demand or 0.0)
    return float(demand) * float(0.5 ** (max(0.0, now - since) / DEMAND_HALF_LIFE_S))


@dataclass(frozen=True, slots=True)
class StoredPage:
    """A page of the catalogue: its key digest and URL, crawler demand, when it was marked and last fetched."""

    digest: str
    target: str
    demand: float
    dirty_since: float | None
    fetched_at: float | None


# PRAGMA user_version of a catalogue told the pages L2 holds (0: a new file, or one of an older version).
_KNOWS_STORED_PAGES = 1


class IndexUnavailable(CrawlerGateError):
    """The page catalogue cannot be read or written now (another process holds it too long, a full disk)."""


_SCHEMA = """
CREATE TABLE IF NOT EXISTS pages (
    digest TEXT PRIMARY KEY,
    target TEXT NOT NULL,
    stored_at REAL NOT NULL,
    dirty_since REAL,
    reason TEXT,
    demand REAL NOT NULL DEFAULT 0,
    demand_at REAL,
    regenerated_at REAL,
    seq INTEGER NOT NULL DEFAULT 0,
    stored_seq INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS pages_seq ON pages (seq);
CREATE INDEX IF NOT EXISTS pages_target ON pages (target);
CREATE INDEX IF NOT EXISTS pages_marked ON pages (dirty_since) WHERE dirty_since IS NOT NULL;
CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY CHECK (id = 0), seq INTEGER NOT NULL);
INSERT OR IGNORE INTO counter VALUES (0, 0);
"""


class PageCatalogue:
    """The catalogue of stored pages (target, marks of change, crawler demand, last regeneration), shared by the
    processes that use one L2 directory.

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
        # Writes of this process not yet read back, and what to do about pages other processes stored or removed.
        self._own_seqs: set[int] = set()
        self.on_replaced: Callable[[list[str]], None] | None = None
        # Called before the demand is written: the filled pages on their way here (gate/pagewriter.py) arrive
        # first, so their crawlers' requests count for them.
        self.before_demand: Callable[[], object] | None = None
        self._data_version = -1
        self._warnings = Throttle(60.0)
        # Upkeep: when it is next due, and whether one is under way (at most one at a time).
        self._next_upkeep = 0.0
        self._upkeep_running = False
        # Crawler requests per page since the last flush to the index.
        self._demand: Counter[str] = Counter()
        self._carried: set[str] = set()
        self._next_flush = clock() + FLUSH_S
        # Pages gone from L2 since the last flush: their rows go then, if their files are still gone (``in_l2``).
        self._gone: set[str] = set()
        self._gone_lock = threading.Lock()
        self.in_l2: Callable[[str], bool] = _in_no_store

    def start(self) -> None:
        """Open (or create) the index; raises ConfigError when its folder is unusable.

        A damaged file is moved aside (``dirty.sqlite3.damaged-<time>``) and a new index begun: the marks
        are lost, never the site; its pages are told to the new one (``knows_stored_pages``).
        """
        with self._lock:
            if self._connection is not None:
                return
            # Workers starting together (gunicorn's) may find the file busy while one of them creates it.
            deadline = time.monotonic() + 2 * WAIT_S
            while True:
                try:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    self._connection = self._open_or_begin_anew()
                    self._read_marks()
                    return
                except (OSError, sqlite3.Error) as exc:
                    if self._connection is not None:
                        self._connection.close()
                        self._connection = None
                    busy = isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)
                    if not busy or time.monotonic() >= deadline:
                        raise ConfigError(f"The page catalogue {self.path} is not usable: {exc}.") from None
                time.sleep(0.05)

    def _open_or_begin_anew(self) -> sqlite3.Connection:
        try:
            return self._open()
        except sqlite3.OperationalError:
            raise  # cannot be opened, or busy: not a damaged file
        except sqlite3.DatabaseError as exc:
            aside = self.path.with_name(f"{self.path.name}.damaged-{int(self.clock())}")
            logger.warning("the page catalogue %s is damaged (%s): moved to %s, starting anew", self.path, exc, aside)
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.replace(f"{self.path}{suffix}", f"{aside}{suffix}")
            return self._open()

    def _read_marks(self) -> None:
        """The marked pages and the last sequence number, from one snapshot: the rest of the catalogue (a row per
        page ever stored, a million on a big site) is never read at start."""
        database = self._db()
        (self._data_version,) = database.execute("PRAGMA data_version").fetchone()
        database.execute("BEGIN")
        try:
            self._dirty = dict(_rows(database, ("digest", "dirty_since"), "dirty_since IS NOT NULL"))
            self._seen_seq = int(database.execute("SELECT seq FROM counter WHERE id = 0").fetchone()[0])
        finally:
            database.execute("COMMIT")

    def _open(self) -> sqlite3.Connection:
        connection = sqlite3.connect(self.path, timeout=WAIT_S, isolation_level=None, check_same_thread=False)
        try:
            require_json_sql(connection)
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")
            # The WAL is folded into the index every WAL_CHECKPOINT_PAGES pages and cut back to
            # WAL_MAX_BYTES after: SQLite's defaults let it stay at its largest size for ever.
            connection.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}")
            connection.execute(f"PRAGMA journal_size_limit={WAL_MAX_BYTES}")
            columns = {row[1] for row in connection.execute("PRAGMA table_info(pages)")}
            (version,) = connection.execute("PRAGMA user_version").fetchone()
            if columns and not version:  # an older version's catalogue: it was told each page it stored
                connection.execute(f"PRAGMA user_version = {_KNOWS_STORED_PAGES}")
            connection.executescript(_SCHEMA)
            if columns and "stored_seq" not in columns:  # an index written by crawlergate 0.x before regeneration
                connection.execute("ALTER TABLE pages ADD COLUMN stored_seq INTEGER NOT NULL DEFAULT 0")
            connection.create_function("decayed", 3, _decayed, deterministic=True)
        except sqlite3.Error:
            connection.close()
            raise
        return connection

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    # the request path
    def dirty_since(self, digest: str) -> float | None:
        """When the page was marked changed, or None when it is not (this process's view, as of its last upkeep)."""
        return self._dirty.get(digest)

    def count_demand(self, digest: str) -> None:
        """A crawler asked for this page (counted in memory; upkeep writes the counts)."""
        self._demand[digest] += 1

    def upkeep_due(self, now: float) -> bool:
        """Whether ``upkeep`` should run now (every ``refresh_s``, one at a time); the caller runs it off its loop."""
        if now < self._next_upkeep or self._upkeep_running or self._connection is None:
            return False
        self._next_upkeep = now + self.refresh_s
        self._upkeep_running = True
        return True

    # off the request path
    def upkeep(self) -> None:
        """Read the marks other processes made, and write the crawler demand when FLUSH_S has passed."""
        try:
            self.refresh()
            if self.clock() >= self._next_flush:
                self._next_flush = self.clock() + FLUSH_S
                self.flush_demand()
                self.flush_gone()
        finally:
            self._upkeep_running = False

    def refresh(self, *, wait: bool = True) -> None:
        """Read the rows other processes changed since the last look; ``wait=False`` skips it while a write is
        under way in this process (the view as it is serves). Failures are logged, at most once a minute."""
        if not self._lock.acquire(blocking=wait):
            return
        try:
            self._refresh_locked()
        except sqlite3.Error as exc:
            self._warn("read", exc)
        finally:
            self._lock.release()

    def forget(self, digests: Iterable[str]) -> None:
        """Pages left L2 (evicted, deleted): their rows go at the next flush, or the catalogue would keep a row for
        every URL ever stored, past any cap on L2 (crawlers and attackers ask for URLs without end). Any thread;
        nothing is written here."""
        with self._gone_lock:
            self._gone.update(digests)

    def flush_gone(self) -> None:
        """Delete the rows of the pages gone from L2 whose files are still gone, unless recorded since that was
        looked at (stored again), or marked: a mark must outlive a fill that began before it
        (``record_stored_many``)."""
        with self._gone_lock:
            gone, self._gone = self._gone, set()
        looked_at = self.clock()
        absent = [digest for digest in gone if not self.in_l2(digest)]
        if not absent:
            return
        try:
            with self._lock, self._writing() as (database, _):
                database.execute(
                    "DELETE FROM pages WHERE digest IN " + _EACH + " AND stored_at <= ? AND dirty_since IS NULL",
                    (json.dumps(absent), looked_at),
                )
        except sqlite3.Error as exc:
            self._warn("write", exc)

    def flush_demand(self) -> None:
        """Add the counted crawler requests to each page's demand, which halves every DEMAND_HALF_LIFE_S."""
        if self._demand and self.before_demand is not None:
            self.before_demand()
        counts, self._demand = self._demand, Counter()
        if not counts:
            return
        now = self.clock()
        try:
            with self._lock, self._writing() as (database, _):
                stored = _rows(database, ("digest", "demand", "demand_at"), "digest IN " + _EACH, each=counts)
                demand = {digest: _decayed(was, at, now) + counts[digest] for digest, was, at in stored}
                database.execute(
                    "UPDATE pages SET demand = counted.value, demand_at = ? FROM json_each(?) AS counted "
                    "WHERE pages.digest = counted.key",
                    (now, json.dumps(demand)),
                )
        except sqlite3.Error as exc:
            self._warn("write demand", exc)
            return
        unknown = [digest for digest in counts if digest not in demand]
        # A page asked for before its first fill was recorded: its count waits one more flush, then goes
        # (pages never stored would otherwise pile up).
        for digest in unknown:
            if digest not in self._carried:
                self._demand[digest] += counts[digest]
        self._carried = set(unknown)

    def demand(self, digest: str) -> float:
        """The page's crawler demand as last written: recent requests, older ones halved per half-life."""
        with self._lock:
            row = self._db().execute("SELECT demand, demand_at FROM pages WHERE digest = ?", (digest,)).fetchone()
        return 0.0 if row is None else _decayed(row[0], row[1], self.clock())

    # marking
    def record_stored(self, digest: str, target: str, fetched_at: float | None = None) -> None:
        """A page was stored (see ``record_stored_many``)."""
        self.record_stored_many([(digest, target, fetched_at)])

    def record_stored_many(self, pages: Iterable[tuple[str, str, float | None]]) -> None:
        """Pages were stored, each (digest, target, when its fill began), in one transaction: each is in the
        catalogue, and no longer marked, unless it was marked after its fill began (``None``: now): a change
        during the fill may be missing from the page.

        A busy or failing index is logged (at most once a minute), never raised: the pages are stored anyway.
        """
        pages = list(pages)
        if not pages:
            return
        now = self.clock()
        # The pages by digest (the last of a digest stored twice), each with the time its fill began.
        stored = {digest: (target, now if fetched_at is None else fetched_at) for digest, target, fetched_at in pages}
        stored_json = json.dumps(stored)
        try:
            with self._lock, self._writing() as (database, seq):
                # A mark older than the fill goes; one made since the fill began stays (the page may lack it).
                database.execute(
                    "UPDATE pages SET dirty_since = NULL, reason = NULL FROM json_each(?) AS stored "
                    "WHERE pages.digest = stored.key AND pages.dirty_since <= json_extract(stored.value, '$[1]')",
                    (stored_json,),
                )
                database.execute(
                    "INSERT INTO pages (digest, target, stored_at, regenerated_at, seq, stored_seq) "
                    "SELECT key, json_extract(value, '$[0]'), ?1, ?1, ?2, ?2 FROM json_each(?3) WHERE true "
                    "ON CONFLICT (digest) DO UPDATE SET target = excluded.target, stored_at = excluded.stored_at, "
                    "regenerated_at = excluded.regenerated_at, seq = excluded.seq, stored_seq = excluded.seq",
                    (now, seq, stored_json),
                )
                marked = dict(
                    _rows(
                        database,
                        ("digest", "dirty_since"),
                        "dirty_since IS NOT NULL AND digest IN " + _EACH,
                        each=stored,
                    )
                )
            for digest in stored:
                if digest in marked:
                    self._dirty[digest] = marked[digest]
                else:
                    self._dirty.pop(digest, None)
        except sqlite3.Error as exc:
            self._warn("write", exc)

    def knows_stored_pages(self) -> bool:
        """Whether the pages L2 holds were told to this catalogue: False for one begun anew (a damaged file set
        aside, a file removed) until ``learned_stored_pages`` (gate/relearn.py)."""
        try:
            with self._lock:
                (version,) = self._db().execute("PRAGMA user_version").fetchone()
        except sqlite3.Error:
            return True  # unreadable now: nothing could be told to it either
        return int(version) >= _KNOWS_STORED_PAGES

    def learned_stored_pages(self) -> None:
        try:
            with self._lock:
                self._db().execute(f"PRAGMA user_version = {_KNOWS_STORED_PAGES}")
        except sqlite3.Error as exc:
            self._warn("write", exc)

    def learn_stored(self, pages: Iterable[tuple[str, str, float]]) -> int:
        """Pages found stored in L2, each (digest, target, when it was generated), that the catalogue does not
        know: recorded unmarked, as stored and regenerated when generated; pages it knows are left as they are
        (a fill since, a mark since). Other processes are not told they were replaced: their bytes are the same.
        Returns how many it did not know."""
        learned = {digest: (target, generated_at) for digest, target, generated_at in pages}
        if not learned:
            return 0
        try:
            with self._lock, self._writing() as (database, seq):
                return database.execute(
                    "INSERT INTO pages (digest, target, stored_at, regenerated_at, seq) "
                    "SELECT key, json_extract(value, '$[0]'), json_extract(value, '$[1]'), "
                    "json_extract(value, '$[1]'), ?1 FROM json_each(?2) WHERE true ON CONFLICT (digest) DO NOTHING",
                    (seq, json.dumps(learned)),
                ).rowcount
        except sqlite3.Error as exc:
            self._warn("write", exc)
            return 0

    def mark(self, digests: Iterable[str], reason: str) -> int:
        """Mark stored pages changed (those the catalogue knows); returns how many are marked.

        Idempotent: a page marked already keeps its first mark's time and reason.
        """
        wanted = list(dict.fromkeys(digests))
        if not wanted:
            return 0
        now = self.clock()
        try:
            with self._lock:
                with self._writing() as (database, seq):
                    database.execute(
                        "UPDATE pages SET dirty_since = COALESCE(dirty_since, ?), reason = COALESCE(reason, ?), "
                        "seq = ? WHERE digest IN " + _EACH,
                        (now, reason, seq, json.dumps(wanted)),
                    )
                    rows = _rows(
                        database, ("digest", "dirty_since"), "seq = ? AND digest IN " + _EACH, seq, each=wanted
                    )
                self._dirty.update(rows)
        except sqlite3.Error as exc:
            raise IndexUnavailable(f"the page catalogue {self.path} cannot be written: {exc}") from None
        return len(rows)

    def clear(self, digest: str, fetched_at: float) -> None:
        """The page is gone from the cache (its site says 404/410 and it is not kept): its mark goes, unless it
        was marked after ``fetched_at``."""
        try:
            with self._lock, self._writing() as (database, seq):
                database.execute(
                    "UPDATE pages SET dirty_since = CASE WHEN dirty_since > ? THEN dirty_since END, "
                    "reason = CASE WHEN dirty_since > ? THEN reason END, seq = ?, stored_seq = ? WHERE digest = ?",
                    (fetched_at, fetched_at, seq, seq, digest),
                )
                if self._dirty.get(digest, fetched_at + 1) <= fetched_at:
                    del self._dirty[digest]
        except sqlite3.Error as exc:
            raise IndexUnavailable(f"the page catalogue {self.path} cannot be written: {exc}") from None

    def stored_pages(self, *, dirty_only: bool) -> list[StoredPage]:
        """The catalogue (or its marked pages), most wanted by crawlers first, then the longest marked."""
        where = "WHERE dirty_since IS NOT NULL" if dirty_only else ""
        try:
            with self._lock:
                rows = (
                    self._db()
                    .execute(
                        "SELECT digest, target, decayed(demand, demand_at, ?) AS wanted, dirty_since, regenerated_at "
                        f"FROM pages {where} ORDER BY wanted DESC, dirty_since",
                        (self.clock(),),
                    )
                    .fetchall()
                )
        except sqlite3.Error as exc:
            raise IndexUnavailable(f"the page catalogue {self.path} cannot be read: {exc}") from None
        return [StoredPage(*row) for row in rows]

    def matching(self, pattern: str) -> list[str]:
        """The digests of the stored pages whose URL (path and query) matches ``pattern`` (see ``UrlPattern``)."""
        compiled = UrlPattern(pattern)
        return [digest for digest, target in self._targets(compiled.glob) if compiled.matches(target)]

    def matching_regex(self, pattern: str) -> list[str]:
        """The digests of the stored pages whose URL (path and query) ``pattern`` matches from its start.

        Raises re.error for a pattern that is no regular expression. Reads the whole catalogue.
        """
        compiled = re.compile(pattern)
        return [digest for digest, target in self._targets("*") if compiled.match(target)]

    def marked_now(self, digest: str) -> bool:
        """Whether the page is marked changed, read from the file now (not this process's view, which may lag
        another process's mark by ``refresh_s``); True when the index cannot be read."""
        try:
            with self._lock:
                row = self._db().execute("SELECT dirty_since FROM pages WHERE digest = ?", (digest,)).fetchone()
        except sqlite3.Error:
            return True
        return row is not None and row[0] is not None

    def dirty_digests(self) -> list[str]:
        """The pages marked changed, as this process last read them."""
        return list(self._dirty)

    def _targets(self, glob: str) -> list[tuple[str, str]]:
        """(digest, URL) of the stored pages whose URL matches an SQLite GLOB."""
        try:
            with self._lock:
                return _rows(self._db(), ("digest", "target"), "target GLOB ?", glob)
        except sqlite3.Error as exc:
            raise IndexUnavailable(f"the page catalogue {self.path} cannot be read: {exc}") from None

    def _warn(self, what: str, error: sqlite3.Error) -> None:
        if self._warnings.due():
            logger.warning("the page catalogue %s could not %s: %s", self.path, what, error)

    def _db(self) -> sqlite3.Connection:
        if self._connection is None:
            raise RuntimeError("PageCatalogue.start() was not called")
        return self._connection

    @contextlib.contextmanager
    def _writing(self) -> Iterator[tuple[sqlite3.Connection, int]]:
        """One write transaction with its sequence number: writers take turns, so rows commit in seq order."""
        database = self._db()
        database.execute("BEGIN IMMEDIATE")
        seq = 0
        try:
            database.execute("UPDATE counter SET seq = seq + 1 WHERE id = 0")
            seq = int(database.execute("SELECT seq FROM counter WHERE id = 0").fetchone()[0])
            self._own_seqs.add(seq)
            yield database, seq
        except BaseException:
            database.execute("ROLLBACK")
            self._own_seqs.discard(seq)  # rolled back: another process will write this number
            raise
        database.execute("COMMIT")

    def _refresh_locked(self) -> None:
        """Read the rows other processes (or this one) changed since the last look."""
        if self._connection is None:
            return
        (version,) = self._connection.execute("PRAGMA data_version").fetchone()
        if version == self._data_version:
            return
        self._data_version = version
        rows = _rows(self._connection, ("digest", "dirty_since", "seq", "stored_seq"), "seq > ?", self._seen_seq)
        replaced: list[str] = []
        seen_before = self._seen_seq
        for digest, dirty_since, seq, stored_seq in rows:
            if dirty_since is None:
                self._dirty.pop(digest, None)
            else:
                self._dirty[digest] = dirty_since
            # Stored (or removed) since the last look, by another process: even if marked again after.
            if stored_seq > seen_before and stored_seq not in self._own_seqs:
                replaced.append(digest)
            self._seen_seq = max(self._seen_seq, seq)
        self._own_seqs = {seq for seq in self._own_seqs if seq > self._seen_seq}
        if replaced and self.on_replaced is not None:
            self.on_replaced(replaced)


# The values of a JSON array parameter, as the right side of IN.
_EACH = "(SELECT value FROM json_each(?))"
# The columns of real numbers (times, demand): SQLite writes a REAL into JSON with 15 significant digits, which
# rounds a timestamp to 10 µs; with 17 it comes back as the very double.
_REAL_COLUMNS = frozenset({"dirty_since", "demand", "demand_at"})
# Rows read in one step at most: one JSON text each, far under SQLite's largest string (a billion bytes) even for
# the longest targets.
_PAGE_ROWS = 50_000


def _rows(
    database: sqlite3.Connection,
    columns: tuple[str, ...],
    where: str,
    *parameters: object,
    each: Iterable[str] | None = None,
) -> list[tuple[Any, ...]]:
    """The rows (``columns``, the first the digest) of the pages ``where`` says, read as JSON arrays in one step
    for each _PAGE_ROWS of them, in one snapshot. ``each`` is the JSON array parameter of an ``_EACH`` in
    ``where``, after its other ``parameters``."""
    values = parameters if each is None else (*parameters, json.dumps(list(each)))
    exact = ", ".join(
        f"CASE WHEN {column} IS NULL THEN NULL ELSE json(printf('%!.17g', {column})) END"
        if column in _REAL_COLUMNS
        else column
        for column in columns
    )
    query = (
        f"SELECT json_group_array(json_array({exact})), count(*), max(digest) FROM "
        f"(SELECT {', '.join(columns)} FROM pages WHERE ({where}) AND digest > ? ORDER BY digest LIMIT {_PAGE_ROWS})"
    )
    snapshot = not database.in_transaction
    if snapshot:
        database.execute("BEGIN")
    try:
        rows: list[tuple[Any, ...]] = []
        after = ""
        while True:
            page, count, after = database.execute(query, (*values, after)).fetchone()
            rows += (tuple(row) for row in json.loads(page))
            if count < _PAGE_ROWS:
                return rows
    finally:
        if snapshot:
            database.execute("COMMIT")


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
