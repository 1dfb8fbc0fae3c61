"""TwoLevelCache: L1 (memcached or in-process) in front of L2 (gzip files).

Lookup goes L1, then L2 (an L2 hit is promoted into L1), then reports a miss, which the gate's
filler (``gate/fill.py``) fills and stores here, in L2 and L1, when it is storable. Human page
views prefetch: the page's L2 copy is pushed into L1 if absent, its recency refreshed if present
(memcached ``touch`` / ``add``). A store that fails is a miss, counted, never an error; a page
that fails its checksum is deleted and never served.

    cache = TwoLevelCache(MemoryStore(64 << 20), DiskStore(root, max_bytes=1 << 30), metrics)
    found = cache.lookup(key)
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from crawlergate.errors import StoreUnavailable
from crawlergate.forksafe import after_fork_in_child
from crawlergate.keys import CacheKey
from crawlergate.metrics import Metrics
from crawlergate.page import CorruptPage, Page
from crawlergate.stores.base import Store
from crawlergate.stores.disk import DiskStore
from crawlergate.stores.memcached import MemcachedStore
from crawlergate.stores.memory import MemoryStore
from crawlergate.throttle import Throttle

logger = logging.getLogger(__name__)

# Parsed L1 pages kept per process, so a hot page is decoded once, not per request: at most this many
# pages and this many bytes (a page counts twice: the stored bytes and the parsed body), so memory is
# bounded by settings, not by traffic (1,100 distinct 1 MB pages once took 2 GB here).
DECODED_PAGES = 1024
DECODED_MAX_BYTES = 32 * 1024 * 1024
# Seconds between two log lines about failed cache writes.
STORE_WARNING_INTERVAL_S = 60.0
# L2 pages larger than this are shared between the requests sending them at the same time.
SHARED_L2_PAGE_BYTES = 256 * 1024
# L2 pages up to this size are read on an event loop when the system holds them in memory (a read and a checksum
# of tens of microseconds); larger ones, and any the disk must give, in a thread.
INLINE_L2_PAGE_BYTES = 256 * 1024
# Pages a human view prefetched into L1 that are remembered until a crawler hits them (a prefetch is
# "useful" then); the oldest are forgotten past this many.
PREFETCHED_REMEMBERED = 65536

Level = Literal["l1", "l2"]


@dataclass(frozen=True, slots=True)
class CacheHit:
    """A page found in the cache, the level it came from, and when a gate sharing the memcached L1 last marked
    it changed (None: no mark read)."""

    page: Page
    level: Level
    marked_at: float | None = None


class TwoLevelCache:
    """The two cache levels together; synchronous, called from the gate directly or in a worker thread."""

    def __init__(
        self,
        l1: Store,
        l2: DiskStore,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.time,
        local_ttl_s: float = 0.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.l1 = l1
        self.l2 = l2
        self.metrics = metrics
        self.clock = clock
        # A page this process read from a remote L1 is trusted for this long without asking again.
        self.local_ttl_s = local_ttl_s
        self._monotonic = monotonic
        self._decoded: OrderedDict[str, tuple[bytes, CacheHit, float]] = OrderedDict()
        self._decoded_bytes = 0
        self._store_warnings = Throttle(STORE_WARNING_INTERVAL_S, monotonic)
        # Big L2 pages some request is still sending, by digest; they leave when the last sender lets go.
        self._l2_in_use: weakref.WeakValueDictionary[str, Page] = weakref.WeakValueDictionary()
        self._prefetched: OrderedDict[str, None] = OrderedDict()
        # Filled pages on their way to disk (gate/pagewriter.py), by digest: found by lookups meanwhile. The short
        # lock guards the map; the long one a batch's writes against an invalidation of one of its pages.
        self._held: dict[str, Page] = {}
        self._held_lock = threading.Lock()
        self._writing_lock = threading.Lock()
        after_fork_in_child(self, TwoLevelCache._forget_parent)
        if isinstance(l1, MemoryStore):  # memcached evicts by itself: its own `stats` counts them
            l1.on_evict = functools.partial(metrics.count, "evictions_l1")
        l2.on_evict = functools.partial(metrics.count, "evictions_l2")

    def start(self) -> None:
        self.l2.start()

    def close(self) -> None:
        self.l1.close()
        self.l2.close()

    def lookup(self, key: CacheKey, kind: str = "crawler") -> CacheHit | None:
        """L1, then L2 (promoting an L2 hit into L1)."""
        return self.lookup_l1(key, kind) or self.lookup_l2(key, kind)

    def lookup_l1(self, key: CacheKey, kind: str = "crawler") -> CacheHit | None:
        found = self._lookup_l1(key, kind)
        # A crawler's L1 hit on a page a human view prefetched: the prefetch was useful (counted once).
        if self._prefetched and found is not None and self._prefetched.pop(key.digest, 0) is None:
            self.metrics.count("prefetch_useful")
        return found

    def _lookup_l1(self, key: CacheKey, kind: str) -> CacheHit | None:
        if self._held:
            held = self._held.get(key.digest)
            if held is not None:  # just filled, on its way to a remote L1 and to disk: in this process's memory
                return CacheHit(held, "l1")
        decoded = self._decoded.get(key.digest)
        now = self._monotonic()
        if decoded is not None and now - decoded[2] < self.local_ttl_s:
            # forget_local, on another thread, may have dropped it since it was read: then it stays dropped.
            try:  # noqa: SIM105 - a bare try builds no object on every L1 hit, as contextlib.suppress would
                self._decoded.move_to_end(key.digest)
            except KeyError:
                pass
            return decoded[1]
        data, marked_at = self._get_marked(key, kind)
        if data is None:
            self._forget(key.digest)
            return None
        # The embedded store returns the very object it holds; memcached returns equal bytes.
        if decoded is not None and (decoded[0] is data or decoded[0] == data):
            found = decoded[1] if decoded[1].marked_at == marked_at else CacheHit(decoded[1].page, "l1", marked_at)
            self._decoded[key.digest] = (data, found, now)
            try:  # noqa: SIM105 - as above
                self._decoded.move_to_end(key.digest)
            except KeyError:
                pass
            return found
        page = self._parse(self.l1, key, data, kind, verify=False)
        if page is None:
            return None
        found = CacheHit(page, "l1", marked_at)
        self._forget(key.digest)
        if 2 * len(data) <= DECODED_MAX_BYTES:
            self._decoded[key.digest] = (data, found, now)
            self._decoded_bytes += 2 * len(data)
            while len(self._decoded) > DECODED_PAGES or self._decoded_bytes > DECODED_MAX_BYTES:
                _, (evicted, _, _) = self._decoded.popitem(last=False)
                self._decoded_bytes -= 2 * len(evicted)
        return found

    def _store_errors(self) -> int:
        totals = self.metrics.counters.totals()
        return sum(value for name, value in totals.items() if name.startswith("store_errors|"))

    def _forget(self, digest: str) -> None:
        entry = self._decoded.pop(digest, None)
        if entry is not None:
            self._decoded_bytes -= 2 * len(entry[0])

    def lookup_l2(self, key: CacheKey, kind: str = "crawler") -> CacheHit | None:
        """The L2 copy, promoted into L1 on the way.

        A page too big for L1 is read from disk for every request; while one request still holds it (a
        slow reader of a 7 MB page), others share that copy instead of reading their own.
        """
        shared = self._l2_in_use.get(key.digest)
        if shared is not None:
            return CacheHit(shared, "l2")
        data = self._get(self.l2, key, kind)
        return self._found_in_l2(key, data, kind) if data is not None else None

    def lookup_l2_at_once(self, key: CacheKey, kind: str = "crawler") -> CacheHit | None | Literal[False]:
        """``lookup_l2`` for an event loop: the hit when the page's file is in the system's memory and small; None
        when L2 has no such page; False when reading it would wait for the disk (``lookup_l2`` in a thread).

        A thread's read cost an L2 hit ten times an L1 hit: the hop, and the GIL the thread waits for behind a busy
        event loop (a 5 ms switch interval), so sixteen crawlers on L2 hits waited 10 ms each.
        """
        shared = self._l2_in_use.get(key.digest)
        if shared is not None:
            return CacheHit(shared, "l2")
        try:
            data = self.l2.get_at_once(key.digest, INLINE_L2_PAGE_BYTES)
        except StoreUnavailable:
            self.metrics.count_store_error(kind)
            return None
        if data is None or data is False:
            return data
        return self._found_in_l2(key, data, kind)

    def _found_in_l2(self, key: CacheKey, data: bytes, kind: str) -> CacheHit | None:
        """The page read from L2, promoted into L1 (None: it was corrupt, and is gone)."""
        page = self._parse(self.l2, key, data, kind)
        if page is None:
            return None
        self._put(self.l1, key, data, kind)
        if len(data) > SHARED_L2_PAGE_BYTES:
            self._l2_in_use[key.digest] = page
        return CacheHit(page, "l2")

    def stale_copy(self, key: CacheKey) -> Page | None:
        """The L2 copy whatever its age, for serving when the origin fails."""
        held = self._held.get(key.digest)
        if held is not None:
            return held
        data = self._get(self.l2, key, "crawler")
        return self._parse(self.l2, key, data, "crawler") if data is not None else None

    def store(self, key: CacheKey, page: Page) -> None:
        """A page in both levels now: ``hold`` and ``store_held`` in one call, where the writer's delay is not
        wanted."""
        self.store_held([(key, page, self.hold(key, page))])

    def hold(self, key: CacheKey, page: Page) -> bytes:
        """A filled page on its way to disk (``store_held``, from gate/pagewriter.py): lookups find it at once, and
        L1 has it now, the embedded one and memcached alike: other workers' crawlers find it there at once, not
        once the writer reaches it (they would fill it again meanwhile). Returns its bytes as stored."""
        self._forget(key.digest)
        self._l2_in_use.pop(key.digest, None)
        data = page.to_bytes(key.target)
        # Under the held lock: an invalidation (which takes it too) comes wholly before the put, or after, and then
        # deletes the L1 copy this put made.
        with self._held_lock:
            self._held[key.digest] = page
            self._put(self.l1, key, data, "crawler")
        return data

    def store_held(self, pages: list[tuple[CacheKey, Page, bytes]]) -> set[str]:
        """Write held pages to L2 (one index transaction; ``hold`` put them in L1). A page invalidated or held anew
        since is skipped; one L2 could not take leaves no older copy there. The digests of the pages stored."""
        with self._writing_lock:
            with self._held_lock:
                wanted = [(key, page, data) for key, page, data in pages if self._held.get(key.digest) is page]
            written: list[str] = []
            try:
                written = self.l2.set_many([(key.digest, data) for key, _, data in wanted])
            except StoreUnavailable as exc:
                self._failed_write(exc, "crawler")
            try:
                # An older copy of a page not written must not outlive the new one in L1 as a fresh page.
                for digest in {key.digest for key, _, _ in wanted}.difference(written):
                    self.l2.delete(digest)
            except StoreUnavailable as exc:
                self._failed_write(exc, "crawler")
            finally:
                with self._held_lock:  # found in the levels now (or lost with a failed one: filled again)
                    for key, page, _ in wanted:
                        if self._held.get(key.digest) is page:
                            del self._held[key.digest]
        return {key.digest for key, _, _ in wanted}

    def _forget_parent(self) -> None:
        """In a forked child: the parent's pages on their way to disk are the parent's to write."""
        self._held, self._held_lock, self._writing_lock = {}, threading.Lock(), threading.Lock()

    def forget_local(self, digests: Iterable[str]) -> None:
        """Another process stored (or removed) these pages: drop the copies this process holds in memory (the
        embedded L1, the decoded copies of a remote L1), so the next request reads the new one."""
        for digest in digests:
            self._forget(digest)
            self._l2_in_use.pop(digest, None)
            if isinstance(self.l1, MemoryStore):
                self.l1.delete(digest)

    def usage(self) -> dict[str, dict[str, object]]:
        """What each level holds (bytes used and allowed; a memcached L1's as each server says, or why it is not
        in use)."""
        l1: dict[str, object] = {"backend": type(self.l1).__name__}
        if isinstance(self.l1, MemoryStore):
            l1 |= {"pages": len(self.l1), "used_bytes": self.l1.used_bytes, "max_bytes": self.l1.max_bytes}
        elif isinstance(self.l1, MemcachedStore):
            l1["servers"] = self.l1.status()
        pages, used_bytes, loading = self.l2.figures()
        l2: dict[str, object] = {"pages": pages, "bytes": used_bytes, "max_bytes": self.l2.max_bytes}
        if loading is not None:
            l2["loading"] = round(loading, 3)
        return {"l1": l1, "l2": l2}

    def touch_local_l1(self, key: CacheKey) -> bool:
        """Refresh the page's L1 recency when L1 is in this process (microseconds, no I/O); False otherwise."""
        return isinstance(self.l1, MemoryStore) and self.l1.touch(key.digest)

    def prefetch(self, key: CacheKey) -> bool:
        """Human-induced prefetch: make sure L1 holds the page if L2 does. True if L1 was filled."""
        if not self.l2.has_file(key.digest):
            return False
        try:
            if self.l1.touch(key.digest):
                return False
        except StoreUnavailable:
            self.metrics.count_store_error("human")
            return False
        data = self._get(self.l2, key, "human")
        if data is None or self._parse(self.l2, key, data, "human") is None:
            return False
        try:
            added = self.l1.add(key.digest, data)
        except StoreUnavailable:
            self.metrics.count_store_error("human")
            return False
        if added:
            self.metrics.count_prefetch()
            self._prefetched[key.digest] = None
            if len(self._prefetched) > PREFETCHED_REMEMBERED:
                self._prefetched.popitem(last=False)
        return added

    def invalidate(self, key: CacheKey) -> None:
        self._forget(key.digest)
        self._l2_in_use.pop(key.digest, None)
        with self._writing_lock:  # a held page is never written after this: its batch ended before, or skips it
            with self._held_lock:
                self._held.pop(key.digest, None)
            for store in (self.l1, self.l2):
                try:
                    store.delete(key.digest)
                except StoreUnavailable:
                    self.metrics.count_store_error("crawler")

    def _get_marked(self, key: CacheKey, kind: str) -> tuple[bytes | None, float | None]:
        """The L1 value, and with memcached the mark another gate left beside it, in one round trip."""
        if not isinstance(self.l1, MemcachedStore):
            return self._get(self.l1, key, kind), None
        try:
            return self.l1.get_marked(key.digest)
        except StoreUnavailable:
            self.metrics.count_store_error(kind)
            return None, None

    def share_marks(self, digests: Iterable[str], marked_at: float, ttl_s: float) -> None:
        """Leave a change mark beside each page in the memcached L1, so gates on other machines (whose dirty
        indexes do not know it) see the page as changed; nothing to do with the embedded L1."""
        if not isinstance(self.l1, MemcachedStore):
            return
        for digest in digests:
            try:
                self.l1.set_mark(digest, marked_at, ttl_s)
            except StoreUnavailable:
                self.metrics.count_store_error("crawler")

    def _get(self, store: Store | DiskStore, key: CacheKey, kind: str) -> bytes | None:
        try:
            return store.get(key.digest)
        except StoreUnavailable:
            self.metrics.count_store_error(kind)
            return None

    def _put(self, store: Store | DiskStore, key: CacheKey, data: bytes, kind: str) -> None:
        try:
            store.set(key.digest, data)
        except StoreUnavailable as exc:
            self._failed_write(exc, kind)

    def _failed_write(self, exc: StoreUnavailable, kind: str) -> None:
        self.metrics.count_store_error(kind)
        # Once a minute at most: a full or broken disk fails every write, and each is counted.
        if self._store_warnings.due():
            logger.warning("cache write failed (%s store errors so far): %s", self._store_errors(), exc)

    def _parse(
        self, store: Store | DiskStore, key: CacheKey, data: bytes, kind: str, *, verify: bool = True
    ) -> Page | None:
        try:
            return Page.from_bytes(data, verify=verify, target=key.target)
        except CorruptPage as exc:
            self.metrics.count("corrupt_pages")
            logger.warning("dropping corrupt cached page %s (%s): %s", key.target, key.digest, exc)
            try:
                store.delete(key.digest)
            except StoreUnavailable:
                self.metrics.count_store_error(kind)
            return None
