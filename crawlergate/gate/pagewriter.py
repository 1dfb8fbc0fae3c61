"""PageWriter: filled pages written to disk by one thread, in batches, after their crawler has its answer.

A miss used to wait for its page's file, the folder's index and the page catalogue before it answered: on
most disks creating a file is the longest part of a fill, and each write was a transaction of its own and a
thread hop. Now a filled page is held in memory (``TwoLevelCache.hold``: the embedded L1 has it, lookups find
it) and queued here; one thread takes what has queued, writes the files, then commits the folder's index and
the catalogue once for the whole batch, and publishes what a front server may answer with. A page is on
disk a few milliseconds after its answer went out; a crash in between loses it, and the next crawler's
request fills it again (nothing half-written is ever served: L2 reads check each page's checksum).

The queue is bounded (``MAX_PAGES``, ``MAX_BYTES``): past it ``write`` says no and the caller waits for room
(``write_blocking``, in a thread), so a slow disk slows the fills, never fills the memory. ``flush`` waits for
what is queued; ``close`` writes it all, then stops.

    writer = PageWriter(cache, catalogue, publish)
    if not writer.write(key, page, data, fetched_at):
        await anyio.to_thread.run_sync(writer.write_blocking, key, page, data, fetched_at)
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from crawlergate.cache import TwoLevelCache
from crawlergate.forksafe import after_fork_in_child
from crawlergate.gate.catalogue import PageCatalogue
from crawlergate.keys import CacheKey
from crawlergate.page import Page

logger = logging.getLogger(__name__)

# Pages (and their bytes) queued at most; past either, fills wait for the disk.
MAX_PAGES = 1024
MAX_BYTES = 64 * 1024 * 1024
# Pages written in one batch: one index and one catalogue transaction.
BATCH_PAGES = 256


class Held(NamedTuple):
    """A filled page on its way to disk: its bytes as stored, and when its fill began."""

    key: CacheKey
    page: Page
    data: bytes
    fetched_at: float | None


class PageWriter:
    """The writer thread of one gate (started at the first write)."""

    def __init__(
        self, cache: TwoLevelCache, catalogue: PageCatalogue, publish: Callable[[CacheKey, Page], None] | None
    ) -> None:
        self.cache = cache
        self.catalogue = catalogue
        self.publish = publish
        self._queue: deque[Held] = deque()
        self._queued_bytes = 0
        # Pages ever queued, and of those the ones written (or given up on): a flush waits for the first count
        # as it was when it began, never for pages queued after it.
        self._queued = 0
        self._done = 0
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        after_fork_in_child(self, PageWriter._forget_parent)

    def write(self, key: CacheKey, page: Page, data: bytes, fetched_at: float | None) -> bool:
        """Queue a held page; False (nothing queued) when the queue is full."""
        with self._changed:
            if self._full(len(data)):
                return False
            self._enqueue(Held(key, page, data, fetched_at))
        return True

    def write_blocking(self, key: CacheKey, page: Page, data: bytes, fetched_at: float | None) -> None:
        """Queue a held page, waiting for room (a thread's call)."""
        with self._changed:
            while self._full(len(data)):
                self._changed.wait()
            self._enqueue(Held(key, page, data, fetched_at))

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until what is queued now is on disk (not what is queued meanwhile); False when that took longer
        than ``timeout_s``."""
        with self._changed:
            queued = self._queued
            return self._changed.wait_for(lambda: self._done >= queued, timeout_s)

    def close(self) -> None:
        """Write what is queued, then stop the thread; a page held after this is not written (the stores are
        closing): its next request fills it again."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _forget_parent(self) -> None:
        """In a forked child: the parent's queue is the parent's to write; this process starts its own."""
        self._queue, self._queued_bytes, self._queued, self._done = deque(), 0, 0, 0
        self._changed, self._thread = threading.Condition(), None

    def _full(self, size: int) -> bool:
        """Whether a page of ``size`` bytes must wait for room (an empty queue takes any page)."""
        return bool(self._queue) and (len(self._queue) >= MAX_PAGES or self._queued_bytes + size > MAX_BYTES)

    def _enqueue(self, held: Held) -> None:
        if self._closed:
            return
        self._queue.append(held)
        self._queued += 1
        self._queued_bytes += len(held.data)
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="crawlergate-writer", daemon=True)
            self._thread.start()
        self._changed.notify_all()

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._queue or self._closed)
                if not self._queue:
                    return
                batch = [self._queue.popleft() for _ in range(min(BATCH_PAGES, len(self._queue)))]
                self._queued_bytes -= sum(len(held.data) for held in batch)
                self._changed.notify_all()
            try:
                self._write(batch)
            except Exception:  # the thread must go on: the pages stay in L1 and are filled again when asked for
                logger.exception("writing %d filled pages failed", len(batch))
            finally:
                with self._changed:
                    self._done += len(batch)
                    self._changed.notify_all()

    def _write(self, batch: list[Held]) -> None:
        written = self.cache.store_held([(held.key, held.page, held.data) for held in batch])
        kept = [held for held in batch if held.key.digest in written]
        self.catalogue.record_stored_many([(held.key.digest, held.key.target, held.fetched_at) for held in kept])
        if self.publish is not None:
            for held in kept:
                self.publish(held.key, held.page)
