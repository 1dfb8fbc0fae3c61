"""Human-induced prefetching off the request path: the pages people viewed are queued, and one thread per process
makes sure L1 holds those L2 has, in batches.

A page view costs an append to a queue: no thread hop, no disk lookup and no wake-up of another thread while
the request is answered (a hop per view added 60-80 µs to a person's answer). The thread is woken once per
batch and waits ``BATCH_WAIT_S`` for the views that follow, so a busy site wakes it a few times a second.

    prefetcher = Prefetcher(cache.prefetch)
    prefetcher.offer(key)   # on the request path
    prefetcher.drain()      # the queued prefetches done, e.g. before the stores close
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

from crawlergate.forksafe import after_fork_in_child
from crawlergate.keys import CacheKey

logger = logging.getLogger(__name__)

# How long the thread, once woken, lets views gather before it works through them.
BATCH_WAIT_S = 0.05
# Views queued at most; more are dropped (a prefetch is a head start for crawlers, never needed for an answer).
MAX_QUEUED = 4096


class Prefetcher:
    """Runs ``prefetch(key)`` for the offered keys in a thread of its own, started at the first offer."""

    def __init__(self, prefetch: Callable[[CacheKey], object]) -> None:
        self._prefetch = prefetch
        self.dropped = 0
        self._forget_parent()
        after_fork_in_child(self, Prefetcher._forget_parent)

    def _forget_parent(self) -> None:
        """A forked child has no thread of its parent's, and its queue is the parent's to work through."""
        self._keys: deque[CacheKey] = deque()
        self._woken = threading.Event()
        self._stopping = threading.Event()
        # Held while keys are worked through: drain() waits for a batch under way.
        self._working = threading.Lock()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def offer(self, key: CacheKey) -> None:
        """Queue a page a person viewed (returns at once)."""
        if len(self._keys) >= MAX_QUEUED:
            self.dropped += 1
            return
        self._keys.append(key)
        if self._thread is None:
            self._start()
        if not self._woken.is_set():
            self._woken.set()

    def drain(self) -> None:
        """Work through what is queued now, in the caller's thread, once a batch under way has ended."""
        with self._working:
            self._work()

    def close(self) -> None:
        """Stop the thread once it has worked through the queue."""
        thread = self._thread
        if thread is not None:
            self._stopping.set()
            self._woken.set()
            thread.join(timeout=10)
            self._thread = None
        self.drain()

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None and not self._stopping.is_set():
                self._thread = threading.Thread(target=self._run, name="crawlergate-prefetch", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._woken.wait()
            self._stopping.wait(BATCH_WAIT_S)
            self._woken.clear()
            with self._working:
                self._work()

    def _work(self) -> None:
        keys = self._keys
        while keys:
            key = keys.popleft()
            try:
                self._prefetch(key)
            except Exception:  # a store's failure is counted by the cache; anything else must not end the thread
                logger.exception("prefetch of %s failed", key.target)
