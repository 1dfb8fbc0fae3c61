"""MemoryStore: the embedded L1, an in-process LRU bounded in bytes.

The default when no memcached server is configured, so ``crawlergate serve`` works on a laptop.
Thread-safe: the gate calls it from worker threads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

# Bookkeeping per entry (dict slot, key string, bytes header), so many tiny items cannot exceed the budget.
ENTRY_OVERHEAD_BYTES = 100


class MemoryStore:
    """Least-recently-used store holding at most ``max_bytes`` of values (plus per-entry overhead)."""

    def __init__(self, max_bytes: int, *, item_max_bytes: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.item_max_bytes = item_max_bytes or max_bytes
        self.used_bytes = 0
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()
        # Called once for each page dropped to stay within max_bytes (the cache counts them).
        self.on_evict: Callable[[], None] = _nothing

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: str) -> bytes | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def set(self, key: str, value: bytes) -> None:
        with self._lock:
            self._store(key, value)

    def add(self, key: str, value: bytes) -> bool:
        with self._lock:
            if key in self._items:
                return False
            return self._store(key, value)

    def touch(self, key: str) -> bool:
        with self._lock:
            if key not in self._items:
                return False
            self._items.move_to_end(key)
            return True

    def delete(self, key: str) -> None:
        with self._lock:
            self._remove(key)

    def close(self) -> None:
        pass

    def _store(self, key: str, value: bytes) -> bool:
        size = len(value) + ENTRY_OVERHEAD_BYTES
        self._remove(key)
        if size > self.item_max_bytes or size > self.max_bytes:
            return False
        self._items[key] = value
        self.used_bytes += size
        while self.used_bytes > self.max_bytes:
            _, evicted = self._items.popitem(last=False)
            self.used_bytes -= len(evicted) + ENTRY_OVERHEAD_BYTES
            self.on_evict()
        return True

    def _remove(self, key: str) -> None:
        value = self._items.pop(key, None)
        if value is not None:
            self.used_bytes -= len(value) + ENTRY_OVERHEAD_BYTES


def _nothing() -> None:
    pass
