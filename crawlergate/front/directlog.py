"""DirectLog: the crawler hits the front server answered from the published tree, counted as the gate's own.

nginx writes one JSON line per direct hit (the include's ``crawlergate_direct`` log format). The gate
reads the file as it grows, a few times a second, and counts each line as a crawler request with the
outcome ``direct``, its family (the classifier's, from the logged user agent) and nginx's
``$request_time`` as its time, so stats, Prometheus, the dashboard and the demo report include the
hits the gate never saw. One process of a gate reads (a lock beside L2); the others' figures include
its counts through the shared counters. A rotated or truncated file is read again from its start;
the lines written before the gate started are not counted.

    reader = DirectLog(Path("/var/log/nginx/crawlergate-direct.log"), classifier, metrics, lock=cache_dir / ".direct")
    reader.start()
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import IO

from crawlergate.classify import Classifier
from crawlergate.metrics import Metrics

logger = logging.getLogger(__name__)

DIRECT = "direct"
# How often the file is read: a direct hit shows in stats within this long.
POLL_S = 0.25
# How long the file before a rotation is still read (nginx writes to it until it reopens its logs).
ROTATED_READ_S = 10.0
# Lines longer than this are no line nginx writes with the include's format: skipped.
MAX_LINE_BYTES = 16 * 1024


class DirectLog:
    """Follows the front server's JSON log of direct hits and counts them in ``metrics``."""

    def __init__(self, path: Path, classifier: Classifier, metrics: Metrics, *, lock: Path) -> None:
        self.path = path
        self.classifier = classifier
        self.metrics = metrics
        self.lock = lock
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle: IO[bytes] | None = None
        self._inode = 0
        self._partial = b""
        self._lock_fd = -1
        # The file before a rotation, read a while longer: nginx writes to it until it reopens its logs.
        self._rotated: IO[bytes] | None = None
        self._rotated_until = 0.0

    def start(self) -> None:
        if not self.path.parent.is_dir():
            logger.warning(
                "front.direct_log %s: its folder does not exist, so the front server cannot write it: direct hits "
                "are not counted until it does (a typo?).",
                self.path,
            )
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="crawlergate-direct-log", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        for handle in (self._handle, self._rotated):
            if handle is not None:
                handle.close()
        self._handle = self._rotated = None
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _run(self) -> None:
        first = True
        while not self._stopping.is_set():
            if self._holds_lock():
                try:
                    self.read(from_end=first)
                    first = False
                except OSError as exc:
                    logger.warning("cannot read the front server's log %s: %s", self.path, exc)
                    self._stopping.wait(5.0)
            self._stopping.wait(POLL_S)

    def _holds_lock(self) -> bool:
        """Whether this process is the gate's reader (the first to take the lock; the next when it stops)."""
        if self._lock_fd >= 0:
            return True
        fd = os.open(self.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._lock_fd = fd
        return True

    def read(self, *, from_end: bool = False) -> int:
        """Count the lines written since the last read; returns how many hits were counted."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return 0
        handle = self._handle
        counted = 0
        if self._rotated is not None:
            counted += self._read_to_end(self._rotated, partial=False)
            if time.monotonic() > self._rotated_until:
                self._rotated.close()
                self._rotated = None
        if handle is None or stat.st_ino != self._inode or stat.st_size < handle.tell():
            if handle is not None:
                if stat.st_ino != self._inode:
                    # Rotated: nginx goes on writing to the old file until it reopens its logs (logrotate's
                    # postrotate), so the old file is read a while longer.
                    counted += self._read_to_end(handle)
                    if self._rotated is not None:
                        self._rotated.close()
                    self._rotated, self._rotated_until = handle, time.monotonic() + ROTATED_READ_S
                else:
                    handle.close()
            handle = self._handle = open(self.path, "rb")  # noqa: SIM115 - kept open between reads
            self._inode = stat.st_ino
            self._partial = b""
            if from_end:
                handle.seek(0, os.SEEK_END)
        return counted + self._read_to_end(handle)

    def _read_to_end(self, handle: IO[bytes], *, partial: bool = True) -> int:
        """Count the whole lines from ``handle`` on; a last half line waits (``partial``: the current file's)."""
        counted = 0
        held = self._partial if partial else b""
        while True:
            chunk = handle.read(1 << 20)
            if not chunk:
                break
            lines = (held + chunk).split(b"\n")
            held = lines.pop()
            if len(held) > MAX_LINE_BYTES:
                held = b""
            for line in lines:
                counted += self._count(line)
        if partial:
            self._partial = held
        elif held:
            handle.seek(-len(held), os.SEEK_CUR)  # read again once whole
        return counted

    def _count(self, line: bytes) -> int:
        with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
            # escape=json leaves bytes over 127 as they came: a user agent need not be UTF-8.
            record = json.loads(line.decode("utf-8", "replace"))
            status = int(record["status"])
            if status >= 400:
                return 0
            verdict = self.classifier.classify(str(record.get("user_agent", "")))
            ms = float(record.get("request_time") or 0) * 1000
            self.metrics.record("crawler", DIRECT, ms, verdict.family, verdict.tag)
            return 1
        return 0
