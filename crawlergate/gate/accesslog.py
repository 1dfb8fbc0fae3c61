"""The access log: one line per request, the combined format plus TTFB and the gate's outcome.

Like varnishncsa's, each line is what nginx and Apache write in their combined format, followed by
the time to first byte in microseconds (Apache's ``%D``), the ``X-Crawlergate`` outcome, what the
gate made of the request (class, and family) and the evidence that made a suspect::

    203.0.113.9 - - [24/Nov/2026:18:30:00 +0000] "GET /t/1 HTTP/1.1" 200 5120 "-" "Googlebot/2.1" 412 l1-hit \
        "crawler:Googlebot" "-"

so ``crawlergate analyze`` and ``replay`` (and any log tool) read it back. The request path formats
its line (bytes as they came: 1.5 µs in a tight loop, about 4 µs between real requests) and queues
it; a writer thread wakes every half second and appends the lines, one ``write`` a batch. Measured
alternatives were slower (scripts/bench_gate.py): a writer woken by every queued line takes the GIL
from the event loop once a request (20 % of crawler-hit throughput); formatting in the writer, or in
batches, keeps each request's scope alive and cost more than formatting at once.

Several worker processes append to one file: the file is opened with ``O_APPEND`` and each batch
is one ``write``, so lines never interleave. Before a batch would take the file past ``max_bytes`` it is
rotated (``access.log.1``
…) under a lock file, by whichever process sees it first; the others notice the new file and reopen
it, as they do after ``logrotate`` renames it. ``copytruncate`` needs nothing: appends follow the end.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path

from crawlergate.errors import ConfigError
from crawlergate.gate.forwarded import FORWARDING
from crawlergate.gate.request import Request
from crawlergate.metrics import Classified
from crawlergate.throttle import Throttle

logger = logging.getLogger(__name__)

# Lines are written this often (seconds). The writer sleeps in between rather than wait for lines: a
# thread woken by every queued line takes the GIL from the event loop once a request.
FLUSH_INTERVAL_S = 0.5
# Lines waiting beyond this are dropped (and counted) rather than let a stuck disk grow memory: a second of
# a busy gate. With fields cut at MAX_FIELD_BYTES a line is at most ~13 KB, so the queue at most ~260 MB.
MAX_QUEUED = 20_000
# A quoted field (target, referer, user agent) longer than this is cut, and ends in "...": an attacker's
# 60 KB user agent costs the log 4 KB (nginx's large_client_header_buffers would refuse it at 8 KB).
MAX_FIELD_BYTES = 4096
# Bytes nginx escapes in quoted fields ($http_user_agent, $request): quote, backslash, control and non-ASCII.
_UNSAFE = re.compile(rb'["\\\x00-\x1f\x7f-\xff]')
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")

ClientOf = Callable[[str | None, Iterable[tuple[bytes, bytes]]], str | None]


class AccessLog:
    """Appends request lines to ``path`` from a background thread; ``log`` formats one and queues it."""

    def __init__(self, path: Path, *, client_of: ClientOf, max_bytes: int = 0, backups: int = 5) -> None:
        self.path = path
        self._client_of = client_of
        self.max_bytes = max_bytes
        self.backups = backups
        self.dropped = 0
        self._lines: deque[bytes] = deque()
        self._stopping = threading.Event()
        self._fd = -1
        self._inode = (0, 0)
        # The file's size as this process last saw it, plus what it wrote since.
        self._size = 0
        self._checked_at = 0.0
        self._write_warnings = Throttle(60.0)
        self._dropped_reported = 0
        self._reopen = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Open the file (creating its folder) and start the writer; raises ConfigError when it cannot be written."""
        with self._lock:
            if self._thread is not None:
                return
            self._fd = open_log(self.path)
            stat = os.fstat(self._fd)
            self._inode = (stat.st_dev, stat.st_ino)
            self._size = stat.st_size
            self._thread = threading.Thread(target=self._run, name="crawlergate-access-log", daemon=True)
            self._thread.start()

    def log(
        self,
        request: Request,
        status: int,
        size: int,
        ttfb_ms: float,
        outcome: str,
        verdict: Classified | None = None,
        reasons: tuple[str, ...] = (),
    ) -> None:
        """Queue the line of one request and its answer; ``verdict`` is what the
        gate made of it (a person when None) and ``reasons`` the evidence."""
        if len(self._lines) >= MAX_QUEUED:
            self.dropped += 1
            return
        judged = _judged(verdict.kind, verdict.family, reasons) if verdict is not None else _PERSON
        self._lines.append(self._line(request, status, size, ttfb_ms, outcome, judged, time.time()))

    def reopen(self) -> None:
        """Open the file again at the next batch (SIGHUP, after logrotate moved it)."""
        self._reopen = True

    def close(self) -> None:
        """Write what is queued and stop the writer."""
        thread = self._thread
        if thread is None:
            return
        self._stopping.set()
        thread.join(timeout=10)
        self._thread = None
        self._stopping.clear()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _run(self) -> None:
        while True:
            stopping = self._stopping.wait(FLUSH_INTERVAL_S)
            batch = []
            lines = self._lines
            while lines:
                batch.append(lines.popleft())  # appends on other threads go on meanwhile: deques are thread-safe
            if batch:
                self._write(b"".join(batch))
            if self.dropped != self._dropped_reported:
                logger.warning("access log %s: %d lines dropped so far (the disk is too slow)", self.path, self.dropped)
                self._dropped_reported = self.dropped
            if stopping:
                return

    def _write(self, data: bytes) -> None:
        try:
            while data:
                self._follow_rotation(len(data))
                piece = data
                if self.max_bytes and self._size + len(data) > self.max_bytes:
                    # A batch larger than the room left (a burst): the whole lines that fit, the rest in a new file.
                    room = self.max_bytes - self._size
                    cut = data.rfind(b"\n", 0, room) + 1 if room > 0 else 0
                    if cut == 0 and self._size:
                        self._rotate(len(data))
                        continue
                    piece = data[: cut or data.find(b"\n") + 1 or len(data)]  # a lone line past the limit: whole
                os.write(self._fd, piece)
                self._size += len(piece)
                data = data[len(piece) :]
        except OSError as exc:
            # A full or lost disk: the lines are lost, requests go on; said once a minute at most.
            if self._write_warnings.due():
                logger.warning("access log %s: %s", self.path, exc)

    def _follow_rotation(self, incoming: int) -> None:
        """Reopen after another process or logrotate moved the file; rotate it before ``incoming`` more bytes
        would take it past ``max_bytes`` (looked at once a second, or sooner when this process's own writes
        bring it near the limit)."""
        now = time.monotonic()
        near_limit = self.max_bytes and self._size + incoming > self.max_bytes
        if not self._reopen and now - self._checked_at < 1.0 and not near_limit:
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
        elif self.max_bytes and stat.st_size and stat.st_size + incoming > self.max_bytes:
            self._rotate(incoming)
        else:
            self._size = stat.st_size

    def _rotate(self, incoming: int) -> None:
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            try:
                # Another process may have rotated while this one waited: then only reopen.
                size = os.stat(self.path).st_size
                if size and size + incoming > self.max_bytes:
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
        fd = _open_appending(self.path)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = fd
        stat = os.fstat(fd)
        self._inode = (stat.st_dev, stat.st_ino)
        self._size = stat.st_size

    def _line(
        self, request: Request, status: int, size: int, ttfb_ms: float, outcome: str, judged: bytes, epoch: float
    ) -> bytes:
        """The line of one request, as bytes (headers and path stay as they came, nothing decoded)."""
        headers = request.headers
        referer = agent = b""
        forwarded = False
        for name, value in headers:
            if name == b"user-agent":
                agent = value
            elif name == b"referer":
                referer = value
            elif name in FORWARDING:
                forwarded = True
        client = self._client_of(request.peer, headers) if forwarded else request.peer
        target = request.raw_path + b"?" + request.query if request.query else request.raw_path
        return _format(client, epoch, request.method, target, request.http_version, status, size, referer, agent,
                       ttfb_ms, outcome, judged)  # fmt: skip


def open_log(path: Path) -> int:
    """Open the log for appending (creating its folder); raises ConfigError, in one sentence, when it cannot."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return _open_appending(path)
    except OSError as exc:
        raise ConfigError(
            f"Access log '{path}' cannot be written: {exc.strerror or exc}. Set log.access_log to another file, "
            "or to off."
        ) from None


def _open_appending(path: Path) -> int:
    # O_APPEND: every write lands at the end, whoever else appends (other workers) or truncates (copytruncate).
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)


def _format(
    client: str | None,
    epoch: float,
    method: str,
    target: bytes,
    version: str,
    status: int,
    size: int,
    referer: bytes,
    agent: bytes,
    ttfb_ms: float,
    outcome: str,
    judged: bytes,
) -> bytes:
    """One combined-format line, then the TTFB in microseconds, the outcome, the verdict and its reasons."""
    if _UNSAFE.search(target) or len(target) > MAX_FIELD_BYTES:
        target = _escaped(target)
    return b'%s - - [%s] "%s %s HTTP/%s" %d %d %s %d %s %s\n' % (
        _client(client or "-"),
        _stamp(int(epoch)),
        _text(method),
        target,
        _text(version),
        status,
        size,
        _quoted_pair(referer, agent),
        int(ttfb_ms * 1000),
        _text(outcome),
        judged,
    )


# Lines repeat most of their fields (a crawler's user agent, the client, the outcome): each is escaped
# and encoded once, then looked up; at most this many, of at most _REMEMBERED_PAIR_BYTES (a few MB).
_REPEATED = 2048
_REMEMBERED_PAIR_BYTES = 1024
# What a client address may hold. It is what a trusted proxy's X-Forwarded-For named, so anything else
# (spaces, quotes: a forged line) is escaped like a quoted field.
_ADDRESS = re.compile(r"[0-9A-Za-z:._%-]{1,64}")


@functools.lru_cache(maxsize=_REPEATED)
def _judged(kind: str, family: str, reasons: tuple[str, ...]) -> bytes:
    """``"class:family" "reason,reason"``: what the gate made of the request, and the evidence."""
    label = f"{kind}:{family}" if family else kind
    because = ",".join(reasons)
    return b'"%s" "%s"' % (_escaped(_text(label)), _escaped(_text(because)) or b"-")


_PERSON = b'"human" "-"'


@functools.lru_cache(maxsize=_REPEATED)
def _text(value: str) -> bytes:
    return value.encode("latin-1", "replace")


@functools.lru_cache(maxsize=_REPEATED)
def _client(address: str) -> bytes:
    if _ADDRESS.fullmatch(address):
        return _text(address)
    return _escaped(address.encode("latin-1", "replace")).replace(b" ", b"\\x20")


def _quoted_pair(referer: bytes, agent: bytes) -> bytes:
    """``"referer" "user agent"``, escaped as nginx escapes them, ``"-"`` for an empty one; the pairs of usual
    length are remembered (an attacker's long ones would make the memo large)."""
    if len(referer) + len(agent) <= _REMEMBERED_PAIR_BYTES:
        return _remembered_pair(referer, agent)
    return b'"%s" "%s"' % (_escaped(referer) or b"-", _escaped(agent) or b"-")


@functools.lru_cache(maxsize=_REPEATED)
def _remembered_pair(referer: bytes, agent: bytes) -> bytes:
    return b'"%s" "%s"' % (_escaped(referer) or b"-", _escaped(agent) or b"-")


@functools.lru_cache(maxsize=4)
def _stamp(second: int) -> bytes:
    """The combined format's time of one second (in UTC): most lines share theirs with the line before."""
    moment = time.gmtime(second)
    return (
        f"{moment.tm_mday:02d}/{_MONTHS[moment.tm_mon - 1]}/{moment.tm_year}:"
        f"{moment.tm_hour:02d}:{moment.tm_min:02d}:{moment.tm_sec:02d} +0000"
    ).encode()


def _escaped(field: bytes) -> bytes:
    # nginx's escaping of quoted fields: a quote, a backslash, control and non-ASCII bytes as \xHH.
    escaped = _UNSAFE.sub(lambda match: b"\\x%02X" % match.group()[0], field[:MAX_FIELD_BYTES])
    if len(escaped) <= MAX_FIELD_BYTES and len(field) <= MAX_FIELD_BYTES:
        return escaped
    cut = escaped[:MAX_FIELD_BYTES]
    partial = cut.rfind(b"\\", len(cut) - 3)  # never end inside an escape
    return (cut[:partial] if partial >= 0 else cut) + b"..."
