"""The in-process memory store: least-recently-used eviction counted in bytes, add and touch, and items over the
limit skipped."""

from __future__ import annotations

from crawlergate.stores.memory import ENTRY_OVERHEAD_BYTES, MemoryStore


def test_memory_store_evicts_least_recently_used_by_bytes() -> None:
    store = MemoryStore(max_bytes=3 * (100 + ENTRY_OVERHEAD_BYTES))
    for key in "abc":
        store.set(key, b"x" * 100)
    assert store.get("a") is not None  # a is now the most recent
    store.set("d", b"x" * 100)
    assert store.get("b") is None
    assert {key for key in "acd" if store.get(key)} == {"a", "c", "d"}
    assert store.used_bytes <= store.max_bytes


def test_memory_store_add_and_touch() -> None:
    store = MemoryStore(max_bytes=10_000)
    assert store.add("k", b"1")
    assert not store.add("k", b"2")
    assert store.get("k") == b"1"
    assert store.touch("k")
    assert not store.touch("missing")
    store.delete("k")
    assert store.get("k") is None
    assert store.used_bytes == 0


def test_memory_store_skips_items_over_the_limit() -> None:
    store = MemoryStore(max_bytes=10_000, item_max_bytes=500)
    store.set("big", b"x" * 1000)
    assert store.get("big") is None
    assert not store.add("big", b"x" * 1000)
