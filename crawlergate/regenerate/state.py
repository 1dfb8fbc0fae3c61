"""What regeneration remembers across restarts and shares between processes, beside the page catalogue.

Four small tables in the page catalogue's SQLite file (WAL: every worker of a ``serve`` and the
``regenerate`` command read and write it): each page's re-fetch history (how often it was fetched
again and found changed, over how long, and its credit in the EDF schedule), human requests per
hour (for the ``auto`` window), the last window's summary and running totals, and the lease that
lets one process regenerate at a time on this machine.

    state = RegenerationState(cache_dir / "dirty.sqlite3")
    state.start()
    state.add_human_requests(int(time.time() // 3600), 120)
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crawlergate.errors import ConfigError
from crawlergate.gate.catalogue import WAIT_S, IndexUnavailable

_SCHEMA = """
CREATE TABLE IF NOT EXISTS fetch_history (
    digest TEXT PRIMARY KEY,
    fetches INTEGER NOT NULL DEFAULT 0,
    changes INTEGER NOT NULL DEFAULT 0,
    observed_s REAL NOT NULL DEFAULT 0,
    credit REAL NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS human_hours (hour INTEGER PRIMARY KEY, requests INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS regeneration (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS lease (name TEXT PRIMARY KEY, holder TEXT NOT NULL, expires_at REAL NOT NULL);
"""

# Hours of human traffic kept: the auto window averages the last week.
KEEP_HOURS = 8 * 24


@dataclass(frozen=True, slots=True)
class History:
    """A page's re-fetches: how many, how many found it changed, the time they covered, its EDF credit."""

    fetches: int = 0
    changes: int = 0
    observed_s: float = 0.0
    credit: float = 0.0


@dataclass(frozen=True, slots=True)
class Refetch:
    """One re-fetch of a stored page: did its body change, and how long after the fetch before."""

    digest: str
    changed: bool
    interval_s: float


class RegenerationState:
    """Regeneration's tables beside the page catalogue (``path`` is the index's file)."""

    def __init__(self, path: Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.clock = clock
        self._lock = threading.Lock()
        self._connection: sqlite3.Connection | None = None

    def start(self) -> None:
        with self._lock:
            if self._connection is not None:
                return
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                connection = sqlite3.connect(self.path, timeout=WAIT_S, isolation_level=None, check_same_thread=False)
                connection.execute("PRAGMA journal_mode=WAL")
                connection.executescript(_SCHEMA)
            except (OSError, sqlite3.Error) as exc:
                raise ConfigError(f"The regeneration state in {self.path} is not usable: {exc}.") from None
            self._connection = connection

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    # re-fetch history
    def histories(self) -> dict[str, History]:
        rows = self._read("SELECT digest, fetches, changes, observed_s, credit FROM fetch_history")
        return {digest: History(*values) for digest, *values in rows}

    def record_refetches(self, refetches: Iterable[Refetch]) -> None:
        rows = [(r.digest, int(r.changed), max(0.0, r.interval_s)) for r in refetches]
        with self._writing() as database:
            database.executemany(
                "INSERT INTO fetch_history (digest, fetches, changes, observed_s) VALUES (?, 1, ?, ?) "
                "ON CONFLICT (digest) DO UPDATE SET fetches = fetches + 1, changes = changes + excluded.changes, "
                "observed_s = observed_s + excluded.observed_s",
                rows,
            )

    def save_credits(self, credits: dict[str, float]) -> None:
        with self._writing() as database:
            database.executemany(
                "INSERT INTO fetch_history (digest, credit) VALUES (?, ?) "
                "ON CONFLICT (digest) DO UPDATE SET credit = excluded.credit",
                credits.items(),
            )

    # human traffic per hour
    def add_human_requests(self, hour: int, requests: int) -> None:
        """Add ``requests`` human requests to the hour numbered ``hour`` (Unix time // 3600)."""
        with self._writing() as database:
            database.execute(
                "INSERT INTO human_hours VALUES (?, ?) ON CONFLICT (hour) DO UPDATE SET requests = requests + ?",
                (hour, requests, requests),
            )
            database.execute("DELETE FROM human_hours WHERE hour < ?", (hour - KEEP_HOURS,))

    def human_hours(self) -> dict[int, int]:
        """Human requests per hour (Unix time // 3600) of the last KEEP_HOURS hours counted."""
        return dict(self._read("SELECT hour, requests FROM human_hours"))

    # windows
    def last_window(self) -> dict[str, Any] | None:
        value: dict[str, Any] | None = self._value("last_window")
        return value

    def totals(self) -> dict[str, int]:
        return self._value("totals") or {}

    def served_window(self) -> float | None:
        """The start of the last scheduled window a pass served."""
        value = self._value("served_window")
        return None if value is None else float(value)

    def record_window(self, summary: dict[str, Any], *, scheduled_start: float | None) -> None:
        """Keep a pass's summary as the last one (``scheduled_start``: the window it served, None for the command's),
        and add its pages, errors and revalidations to the running totals."""
        with self._writing() as database:
            totals = self._value("totals", database) or {}
            for name in ("revalidated", "revalidations_changed", "pages", "errors"):
                totals[name] = int(totals.get(name, 0)) + int(summary.get(name, 0))
            values: list[tuple[str, Any]] = [("last_window", dict(summary, scheduled_start=scheduled_start))]
            values.append(("totals", totals))
            if scheduled_start is not None:
                values.append(("served_window", scheduled_start))
            for name, value in values:
                database.execute(
                    "INSERT INTO regeneration VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                    (name, json.dumps(value)),
                )

    # the lease
    def take_lease(self, holder: str, ttl_s: float, *, is_stale: Callable[[str], bool]) -> str | None:
        """Hold the machine's regeneration lease for ``ttl_s``; returns None when taken, else who holds it.

        A lease past its time, or whose holder ``is_stale`` says is gone (a killed process), is taken over.
        """
        now = self.clock()
        with self._writing() as database:
            row = database.execute("SELECT holder, expires_at FROM lease WHERE name = 'regenerate'").fetchone()
            if row is not None and row[0] != holder and row[1] > now and not is_stale(row[0]):
                return str(row[0])
            database.execute(
                "INSERT INTO lease VALUES ('regenerate', ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at",
                (holder, now + ttl_s),
            )
        return None

    def lease_holder(self) -> str | None:
        """Who holds the machine's lease now, if anyone."""
        rows = self._read("SELECT holder FROM lease WHERE name = 'regenerate' AND expires_at > ?", (self.clock(),))
        return str(rows[0][0]) if rows else None

    def release_lease(self, holder: str) -> None:
        with self._writing() as database:
            database.execute("DELETE FROM lease WHERE name = 'regenerate' AND holder = ?", (holder,))

    def _value(self, name: str, database: sqlite3.Connection | None = None) -> Any:
        if database is None:
            rows = self._read("SELECT value FROM regeneration WHERE name = ?", (name,))
        else:
            rows = database.execute("SELECT value FROM regeneration WHERE name = ?", (name,)).fetchall()
        return json.loads(rows[0][0]) if rows else None

    def _opened(self) -> None:
        """Open the tables at their first use (a gate whose job never started still reports the command's passes);
        a folder that turned unusable since start-up is IndexUnavailable there, as a failed read is."""
        try:
            self.start()
        except ConfigError as exc:
            raise IndexUnavailable(str(exc).rstrip(".")) from None

    def _read(self, query: str, parameters: tuple[Any, ...] = ()) -> list[Any]:
        if self._connection is None:
            self._opened()
        try:
            with self._lock:
                return self._db().execute(query, parameters).fetchall()
        except sqlite3.Error as exc:
            raise IndexUnavailable(f"the regeneration state in {self.path} cannot be read: {exc}") from None

    def _db(self) -> sqlite3.Connection:
        if self._connection is None:
            raise IndexUnavailable(f"the regeneration state in {self.path} is not open")
        return self._connection

    @contextlib.contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        if self._connection is None:
            self._opened()
        try:
            with self._lock:
                database = self._db()
                database.execute("BEGIN IMMEDIATE")
                try:
                    yield database
                except BaseException:
                    database.execute("ROLLBACK")
                    raise
                database.execute("COMMIT")
        except sqlite3.Error as exc:
            raise IndexUnavailable(f"the regeneration state in {self.path} cannot be written: {exc}") from None
