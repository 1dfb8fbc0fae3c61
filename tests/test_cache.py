"""The two-level cache (L1 memcached, L2 disk): how long a remote L1 page is trusted, the bounded memo of decoded
pages, big L2 pages shared while in use, and what prefetches and evictions count."""

from __future__ import annotations

from pathlib import Path

import pytest

from crawlergate.cache import TwoLevelCache
from crawlergate.keys import CacheKey, digest_of
from crawlergate.metrics import Metrics
from crawlergate.page import Page
from crawlergate.stores.disk import DiskStore
from crawlergate.stores.memcached import MemcachedStore
from crawlergate.stores.memory import MemoryStore
from tests.conftest import MemcachedServer

KEY = CacheKey("/t/1", digest_of("/t/1"))
PAGE = Page.from_response(200, b"<p>page</p>", content_type="text/html", generated_at=1000.0, ttl_seconds=60)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.memcached
def test_cache_trusts_a_remote_l1_page_for_the_local_ttl(tmp_path: Path, memcached_server: MemcachedServer) -> None:
    clock = FakeClock()
    l1 = MemcachedStore([memcached_server.address])
    cache = TwoLevelCache(l1, DiskStore(tmp_path, max_bytes=10**6), Metrics(), local_ttl_s=1.0, monotonic=clock)
    cache.start()
    cache.store(KEY, PAGE)
    assert cache.lookup_l1(KEY) is not None
    l1.delete(KEY.digest)  # changed by another worker
    assert cache.lookup_l1(KEY) is not None  # still trusted locally
    clock.now += 1.5
    assert cache.lookup_l1(KEY) is None  # asked memcached again
    cache.store(KEY, PAGE)
    assert cache.lookup_l1(KEY) is not None
    cache.invalidate(KEY)
    assert cache.lookup_l1(KEY) is None  # this worker's own invalidation is immediate
    cache.close()


def test_cache_without_local_ttl_asks_l1_every_time(tmp_path: Path) -> None:
    l1 = MemoryStore(10**6)
    cache = TwoLevelCache(l1, DiskStore(tmp_path, max_bytes=10**6), Metrics())
    cache.start()
    cache.store(KEY, PAGE)
    assert cache.lookup_l1(KEY) is not None
    l1.delete(KEY.digest)
    assert cache.lookup_l1(KEY) is None
    found = cache.lookup(KEY)
    assert found is not None and found.level == "l2"
    assert cache.lookup_l1(KEY) is not None  # promoted


def test_cache_decoded_memo_is_bounded_in_bytes(tmp_path) -> None:
    from crawlergate.cache import DECODED_MAX_BYTES, TwoLevelCache
    from crawlergate.keys import CacheKey
    from crawlergate.metrics import Metrics
    from crawlergate.page import Page
    from crawlergate.stores.disk import DiskStore
    from crawlergate.stores.memory import MemoryStore

    cache = TwoLevelCache(
        MemoryStore(512 * 1024 * 1024, item_max_bytes=4 * 1024 * 1024), DiskStore(tmp_path, max_bytes=10**9), Metrics()
    )
    cache.start()
    for number in range(60):
        page = Page.from_response(200, bytes(range(256)) * 4096 + bytes([number]), content_type="x",
                                  generated_at=1, ttl_seconds=10**9)  # fmt: skip
        key = CacheKey(f"/big/{number}", f"{number:032x}")
        cache.store(key, page)
        assert cache.lookup_l1(key) is not None
    assert cache._decoded_bytes <= DECODED_MAX_BYTES
    assert cache._decoded_bytes == sum(2 * len(entry[0]) for entry in cache._decoded.values())


def test_cache_big_l2_pages_are_shared_while_in_use(tmp_path) -> None:
    import gc
    import random

    from crawlergate.cache import TwoLevelCache
    from crawlergate.keys import CacheKey
    from crawlergate.metrics import Metrics
    from crawlergate.page import Page
    from crawlergate.stores.disk import DiskStore
    from crawlergate.stores.memory import MemoryStore

    cache = TwoLevelCache(MemoryStore(10**8, item_max_bytes=1024), DiskStore(tmp_path, max_bytes=10**9), Metrics())
    cache.start()
    key = CacheKey("/big", "b" * 32)
    body = random.Random(5).randbytes(2 * 1024 * 1024)  # 2 MB that gzip cannot shrink, over L1's item limit
    cache.store(key, Page.from_response(200, body, content_type="x", generated_at=1, ttl_seconds=10**9))
    first = cache.lookup(key)
    second = cache.lookup(key)
    assert first is not None and second is not None and first.page is second.page  # one copy for both senders
    held = first.page
    del first, second
    cache.store(key, Page.from_response(200, body + b"!", content_type="x", generated_at=2, ttl_seconds=10**9))
    renewed = cache.lookup(key)
    assert renewed is not None and renewed.page is not held and renewed.page.body().endswith(b"!")
    del held, renewed
    gc.collect()
    assert len(cache._l2_in_use) == 0  # nobody sends it: nothing kept


def test_cache_counts_useful_prefetches_once_and_evictions_per_level(tmp_path: Path) -> None:
    metrics = Metrics()
    page_bytes = len(PAGE.to_bytes())
    # L1 holds one page; L2 two pages' worth of disk blocks.
    cache = TwoLevelCache(MemoryStore(page_bytes + 150), DiskStore(tmp_path, max_bytes=2 * 4096), metrics)
    cache.start()
    other = CacheKey("/t/2", digest_of("/t/2"))
    cache.l2.set(KEY.digest, PAGE.to_bytes())
    assert cache.prefetch(KEY)  # a person's view copies the page into L1
    assert (
        cache.lookup_l1(KEY) is not None and cache.lookup_l1(KEY) is not None
    )  # two crawler hits: one useful prefetch
    cache.store(other, PAGE)  # L1 holds one page: KEY goes
    third = CacheKey("/t/3", digest_of("/t/3"))
    cache.store(third, PAGE)  # L2 holds two pages: the least recently served goes
    totals = metrics.snapshot()
    assert totals["prefetches"] == {"issued": 1, "useful": 1}
    assert totals["evictions"] == {"l1": 2, "l2": 1}


@pytest.mark.memcached
def test_cache_a_held_page_is_in_a_shared_l1_before_it_is_written(
    tmp_path: Path, memcached_server: MemcachedServer
) -> None:
    """A worker's fill is found by another worker's crawler at once (memcached), not when the filling worker's
    writer has put it on disk: that crawler would fill it again meanwhile."""
    filling, other = (
        TwoLevelCache(MemcachedStore([memcached_server.address]), DiskStore(tmp_path, max_bytes=10**6), Metrics())
        for _ in range(2)
    )
    filling.start()
    other.start()
    filling.hold(KEY, PAGE)  # the writer has not written it yet
    found = other.lookup_l1(KEY)
    assert found is not None and found.page.body_gz == PAGE.body_gz
    filling.invalidate(KEY)
    assert filling.l1.get(KEY.digest) is None
    filling.close()
    other.close()
