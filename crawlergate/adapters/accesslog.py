"""The access log: one line per request, the combined format plus TTFB and the gate's outcome.

Like varnishncsa's, each line is what nginx and Apache write in their combined format, followed by
the time to first byte in microseconds (Apache's ``%D``) and the ``X-Crawlergate`` outcome::

    203.0.113.9 - - [24/Nov/2026:18:30:00 +0000] "GET /t/1 HTTP/1.1" 200 5120 "-" "Googlebot/2.1" 412 l1-hit

so ``crawlergate analyze`` and ``replay`` (and any log tool) read it back. The request path only
queues a tuple; a writer thread formats and appends the lines in batches, off the event loop.

Several worker processes append to one file: the file is opened with ``O_APPEND`` and each batch
is one ``write``, so lines never interleave. Past ``max_bytes`` the file is rotated (``access.log.1``
…) under a lock file, by whichever process sees it first; the others notice the new file and reopen
it, as they do after ``logrotate`` renames it. ``copytruncate`` needs nothing: appends follow the end.
"""

from __future__ import annotations

import fcntl
import logging
import os
import queue
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from starlette.types import Message, Scope, Send

logger = logging.getLogger(__name__)

# Lines are written at least this often (seconds), and as soon as this many are waiting.
FLUSH_INTERVAL_S = 0.5
BATCH_LINES = 512
# Lines queued beyond this are dropped (and counted) rather than let a stuck disk grow memory.
MAX_QUEUED = 100_000
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")

# (client, epoch seconds, method, target, http version, status, bytes, referer, user agent, ttfb µs, outcome)
Entry = tuple[str, float, str, str, str, int, int, str, str, int, str]


class AccessLog:
    """Appends request lines to ``path`` from a background thread; ``log`` is all the request path does."""

    def __init__(self, path: Path, *, max_bytes: int = 0, backups: int = 5) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self.dropped = 0
        self._queue: queue.SimpleQueue[Entry | None] = queue.SimpleQueue()
        self._fd = -1
        self._inode = (0, 0)
        self._checked_at = 0.0
        self._reopen = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Open the file (creating its folder) and start the writer; raises OSError when it cannot be written."""
        with self._lock:
            if self._thread is not None:
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._open()
            self._thread = threading.Thread(target=self._run, name="crawlergate-access-log", daemon=True)
            self._thread.start()

    def log(self, entry: Entry) -> None:
        if self._queue.qsize() >= MAX_QUEUED:
            self.dropped += 1
            return
        self._queue.put(entry)

    def reopen(self) -> None:
        """Open the file again at the next batch (SIGHUP, after logrotate moved it)."""
        self._reopen = True

    def close(self) -> None:
        """Write what is queued and stop the writer."""
        thread = self._thread
        if thread is None:
            return
        self._queue.put(None)
        thread.join(timeout=10)
        self._thread = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _run(self) -> None:
        stopping = False
        while not stopping:
            batch: list[Entry] = []
            try:
                entry = self._queue.get(timeout=FLUSH_INTERVAL_S)
                while True:
                    if entry is None:
                        stopping = True
                        break
                    batch.append(entry)
                    if len(batch) >= BATCH_LINES:
                        break
                    entry = self._queue.get_nowait()
            except queue.Empty:
                pass
            if batch:
                self._write("".join(map(format_line, batch)).encode("utf-8", "replace"))

    def _write(self, data: bytes) -> None:
        try:
            self._follow_rotation()
            os.write(self._fd, data)
        except OSError as exc:
            # A full or lost disk: the lines are lost, requests go on; said once a minute at most.
            now = time.monotonic()
            if now >= self._checked_at + 60:
                self._checked_at = now
                logger.warning("access log %s: %s", self.path, exc)

    def _follow_rotation(self) -> None:
        """Reopen after another process or logrotate moved the file; rotate it when it is too big."""
        now = time.monotonic()
        if not self._reopen and now - self._checked_at < 1.0:
            return
        self._checked_at = now
        try:
            stat = os.stat(self.path)
            moved = (stat.st_dev, stat.st_ino) != self._inode
        except FileNotFoundError:
            moved = True
        if moved or self._reopen:
            self._reopen = False
            self._open()
        elif self.max_bytes and stat.st_size >= self.max_bytes:
            self._rotate()

    def _rotate(self) -> None:
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            try:
                # Another process may have rotated while this one waited: then only reopen.
                if os.stat(self.path).st_size >= self.max_bytes:
                    self._shift_backups()
            finally:
                fcntl.flock(lock_file, fcntl.LOCK_UN)
        self._open()

    def _shift_backups(self) -> None:
        if self.backups == 0:
            os.truncate(self.path, 0)
            return
        for number in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{number}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{number + 1}"))
        os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))

    def _open(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = fd
        stat = os.fstat(fd)
        self._inode = (stat.st_dev, stat.st_ino)


def format_line(entry: Entry) -> str:
    """One combined-format line, then the TTFB in microseconds and the outcome."""
    client, epoch, method, target, version, status, size, referer, agent, ttfb_us, outcome = entry
    moment = time.gmtime(epoch)
    stamp = (
        f"{moment.tm_mday:02d}/{_MONTHS[moment.tm_mon - 1]}/{moment.tm_year}:"
        f"{moment.tm_hour:02d}:{moment.tm_min:02d}:{moment.tm_sec:02d} +0000"
    )
    return (
        f'{client or "-"} - - [{stamp}] "{_quoted(method)} {_quoted(target)} HTTP/{version}" {status} {size} '
        f'"{_quoted(referer) or "-"}" "{_quoted(agent) or "-"}" {ttfb_us} {outcome}\n'
    )


def _quoted(text: str) -> str:
    # nginx's escaping of quoted fields: a quote, a backslash and control bytes as \xHH.
    if text.isprintable() and '"' not in text and "\\" not in text:
        return text
    return "".join(f"\\x{ord(char):02X}" if char in '"\\' or not char.isprintable() else char for char in text)


class AccessLogged:
    """Per request: the ``send`` wrapper that notes status, bytes and TTFB, then queues the line."""

    __slots__ = ("_log", "_client", "_scope", "_send", "_started", "_status", "_bytes", "_ttfb_us", "_outcome", "_done")

    def __init__(self, log: AccessLog, scope: Scope, send: Send, client: str | None) -> None:
        self._log = log
        self._scope = scope
        self._send = send
        self._client = client or "-"
        self._started = time.perf_counter()
        self._status = 0
        self._bytes = 0
        self._ttfb_us = -1
        self._outcome = "-"
        self._done = False

    async def __call__(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self._status = message["status"]
            self._outcome = _outcome(message.get("headers", ()))
        elif kind == "http.response.body":
            if self._ttfb_us < 0:
                self._ttfb_us = int((time.perf_counter() - self._started) * 1e6)
            self._bytes += len(message.get("body", b""))
            if not message.get("more_body", False):
                self.finish()
        await self._send(message)

    def finish(self) -> None:
        """Queue the request's line, once: when its answer is complete, or when it ended without one (status 499,
        nginx's "client closed request", when no answer had begun)."""
        if self._done:
            return
        self._done = True
        scope = self._scope
        headers = scope["headers"]
        query: bytes = scope.get("query_string", b"")
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
        target = (raw_path + b"?" + query if query else raw_path).decode("latin-1")
        self._log.log(
            (
                self._client,
                time.time() - (time.perf_counter() - self._started),
                scope["method"],
                target,
                scope.get("http_version", "1.1"),
                self._status or 499,
                self._bytes,
                _header(headers, b"referer"),
                _header(headers, b"user-agent"),
                self._ttfb_us,
                self._outcome,
            )
        )


def _header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> str:
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return ""


def _outcome(headers: Iterable[tuple[bytes, bytes]]) -> str:
    for key, value in headers:
        if key == b"x-crawlergate":
            return value.decode("latin-1")
    return "-"
