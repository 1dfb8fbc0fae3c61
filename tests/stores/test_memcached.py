"""The L1 memcached store against real memcached servers: pages spread over the servers, size limits, per-site
namespaces, and a dead or restarted server backed off from and taken back."""

from __future__ import annotations

import contextlib

import pytest

from crawlergate.errors import StoreUnavailable
from crawlergate.stores.memcached import MemcachedStore
from tests.conftest import MemcachedServer, free_port

pytestmark = pytest.mark.memcached


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_memcached_store_roundtrip(memcached_server: MemcachedServer) -> None:
    store = MemcachedStore([memcached_server.address])
    store.set("k", b"\x00page")
    assert store.get("k") == b"\x00page"
    assert store.touch("k")
    assert not store.add("k", b"other")
    assert store.add("new", b"v")
    store.delete("k")
    assert store.get("k") is None
    assert not store.touch("k")
    store.close()


def test_memcached_store_skips_items_over_item_limit(memcached_server: MemcachedServer) -> None:
    store = MemcachedStore([memcached_server.address], item_max_bytes=1000)
    store.set("big", b"x" * 2000)
    assert store.get("big") is None
    store.close()


def test_memcached_store_takes_what_memcached_takes_at_its_item_limit(memcached_server: MemcachedServer) -> None:
    """memcached (-I 1m, its default) counts its item header with the value: the store keeps a margin under it."""
    store = MemcachedStore([memcached_server.address])  # item_max_bytes: 1 MiB, as memcached's default -I
    store.set("edge", b"x" * (1024 * 1024 - 60))  # refused by memcached: skipped by the store, no error
    store.set("under", b"x" * (1024 * 1024 - 2048))
    assert store.get("edge") is None and store.get("under") == b"x" * (1024 * 1024 - 2048)
    store.close()


def test_memcached_store_an_item_memcached_refuses_fails_alone(memcached_server: MemcachedServer) -> None:
    """A server that answers an error for one item is up: it keeps serving every other page, and is not emptied
    (taken out of rotation and flushed on return, as a dead server is, it was emptied for every gate sharing it)."""
    clock = FakeClock()
    store = MemcachedStore([memcached_server.address], item_max_bytes=4 * 1024 * 1024, clock=clock)
    store.set("kept", b"page")
    with pytest.raises(StoreUnavailable, match="too large"):
        store.set("big", b"x" * (2 * 1024 * 1024))  # over memcached's -I 1m: SERVER_ERROR object too large
    assert store.get("kept") == b"page"
    clock.now += 60  # past any back-off: a server taken out would be flushed when taken back
    assert store.get("kept") == b"page"
    store.close()


def test_memcached_store_status_says_what_each_server_holds_or_why_it_is_not_in_use(
    memcached_server: MemcachedServer,
) -> None:
    silent = f"127.0.0.1:{free_port()}"
    clock = FakeClock()
    store = MemcachedStore([memcached_server.address, silent], clock=clock)
    for number in range(20):
        with contextlib.suppress(StoreUnavailable):  # the keys of the silent server fail, and it is skipped
            store.set(f"k{number}", b"x" * 1000)
    status = store.status()
    up = status[memcached_server.address]
    assert up["up"] and up["items"] >= 1 and up["used_bytes"] > 0 and up["evictions"] == 0
    assert up["max_bytes"] == memcached_server.memory_mb * 2**20
    assert status[silent] == {"up": False, "skipped_s": 10.0}
    clock.now += 11
    assert status[silent]["up"] is False and "error" in store.status()[silent]
    store.close()


def test_memcached_store_spreads_keys_over_servers(memcached_server: MemcachedServer) -> None:
    second = MemcachedServer()
    second.start()
    try:
        store = MemcachedStore([memcached_server.address, second.address])
        for number in range(50):
            store.set(f"key{number}", b"v")
        assert all(store.get(f"key{number}") == b"v" for number in range(50))
        only_first = MemcachedStore([memcached_server.address])
        found_on_first = sum(only_first.get(f"key{number}") == b"v" for number in range(50))
        assert 0 < found_on_first < 50
        store.close()
        only_first.close()
    finally:
        second.stop()


def test_memcached_store_dead_server_backs_off_then_returns(memcached_server: MemcachedServer) -> None:
    clock = FakeClock()
    store = MemcachedStore([memcached_server.address], dead_retry_seconds=10, clock=clock)
    store.set("k", b"v")
    memcached_server.stop()
    with pytest.raises(StoreUnavailable):
        store.get("k")
    # Skipped without touching the network for the back-off period.
    with pytest.raises(StoreUnavailable, match="skipped"):
        store.get("k")
    memcached_server.start()
    with pytest.raises(StoreUnavailable, match="skipped"):
        store.get("k")
    clock.now += 11
    assert store.get("k") is None  # back in rotation (a fresh memcached is empty)
    store.set("k", b"again")
    assert store.get("k") == b"again"
    store.close()


def test_memcached_store_refused_connection_is_unavailable() -> None:
    store = MemcachedStore([f"127.0.0.1:{free_port()}"])
    with pytest.raises(StoreUnavailable):
        store.get("k")
    store.close()


def test_memcached_store_namespaces_keep_sites_apart(memcached_server: MemcachedServer) -> None:
    forum = MemcachedStore([memcached_server.address], namespace="forum")
    wiki = MemcachedStore([memcached_server.address], namespace="wiki")
    forum_again = MemcachedStore([memcached_server.address], namespace="forum")
    forum.set("page", b"forum page")
    assert wiki.get("page") is None and forum_again.get("page") == b"forum page"
    for store in (forum, wiki, forum_again):
        store.close()


def test_memcached_store_recovers_at_once_after_a_restart(memcached_server: MemcachedServer) -> None:
    from concurrent.futures import ThreadPoolExecutor

    clock = FakeClock()
    store = MemcachedStore([memcached_server.address], dead_retry_seconds=10, clock=clock)
    store.set("k", b"v")
    with ThreadPoolExecutor(8) as pool:  # eight pooled connections
        assert list(pool.map(lambda _: store.get("k"), range(64))) == [b"v"] * 64
    memcached_server.stop()
    memcached_server.start()
    with pytest.raises(StoreUnavailable):
        store.get("k")  # one stale connection fails: the server leaves rotation, its pool is dropped
    clock.now += 11
    with ThreadPoolExecutor(8) as pool:  # every call after the back-off succeeds, none meets a stale socket
        assert list(pool.map(lambda _: store.get("k"), range(64))) == [None] * 64
    store.close()


def test_memcached_store_moves_a_dead_servers_keys_and_empties_it_when_it_returns(
    memcached_server: MemcachedServer,
) -> None:
    second = MemcachedServer()
    second.start()
    clock = FakeClock()
    store = MemcachedStore([memcached_server.address, second.address], dead_retry_seconds=10, clock=clock)
    try:
        on_second = next(f"page{n}" for n in range(100) if store._ring.get_node(f"page{n}") == second.address)
        on_first = next(f"page{n}" for n in range(100) if store._ring.get_node(f"page{n}") == memcached_server.address)
        store.set(on_second, b"old")
        store.set(on_first, b"stays")
        second.pause()  # hung, not gone: it keeps its "old" copy
        with pytest.raises(StoreUnavailable):
            store.get(on_second)  # one timeout: the server leaves rotation
        assert store.get(on_second) is None  # its keys now go to the next server in their order
        store.set(on_second, b"new")
        assert store.get(on_second) == b"new" and store.get(on_first) == b"stays"
        second.resume()
        clock.now += 11
        assert store.get(on_second) is None  # back, emptied first: the copy made before the outage is never served
        store.set(on_second, b"newer")
        assert store.get(on_second) == b"newer" and store.get(on_first) == b"stays"
    finally:
        second.resume()
        store.close()
        second.stop()


def test_memcached_store_keeps_a_change_mark_beside_the_page(memcached_server: MemcachedServer) -> None:
    store = MemcachedStore([memcached_server.address], namespace="site")
    store.set("page", b"v")
    assert store.get_marked("page") == (b"v", None) and store.get_marked("absent") == (None, None)
    store.set_mark("page", 1_764_000_000.25, ttl_s=60)
    assert store.get_marked("page") == (b"v", 1_764_000_000.25)
    other_site = MemcachedStore([memcached_server.address], namespace="other")
    assert other_site.get_marked("page") == (None, None)
    store.close()
    other_site.close()
