"""MemcachedStore: L1 on one or more memcached servers, through pymemcache.

memcached's own LRU does the eviction (start it with ``-m`` = the L1 budget). Keys are spread over
the servers by rendezvous hashing. Every call has short connect and read timeouts; a server that
fails is skipped for ``dead_retry_seconds``, so a dead memcached costs one timeout per back-off
period, not one per request. Meanwhile its keys go to the next server in their rendezvous order (the
same for every gate), where they are refilled from L2; the others' keys stay where they are. When it
comes back, its first call is ``flush_all``: what it held may have changed while it was away (a page
regenerated, a mark lifted), and a stale copy must never be served. Its keys then return to it, cold.

    store = MemcachedStore(["127.0.0.1:11211"], connect_timeout_s=0.05, timeout_s=0.05)
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence

from pymemcache.client.base import PooledClient
from pymemcache.client.rendezvous import RendezvousHash
from pymemcache.exceptions import MemcacheClientError, MemcacheError, MemcacheServerError, MemcacheUnexpectedCloseError

from crawlergate.errors import ConfigError, StoreUnavailable

logger = logging.getLogger(__name__)

KEY_PREFIX = "cg:"
# memcached's item limit (-I) counts its item header, key and flags with the value: values this much under
# item_max_bytes are the largest it takes (1,048,483 bytes of a 1 MiB limit were refused).
ITEM_OVERHEAD_BYTES = 1024
# A page's change mark sits beside the page, on the page's server: "m:" + the page's key.
MARK_PREFIX = "m:"


class MemcachedStore:
    """A Store on memcached servers with per-server back-off.

    Parameters:
        servers: ``HOST:PORT`` strings.
        connect_timeout_s, timeout_s: socket timeouts of every call.
        dead_retry_seconds: how long a failed server is skipped.
        item_max_bytes: memcached's ``-I`` limit: values over it, less ITEM_OVERHEAD_BYTES, skip L1.
        namespace: part of every key, so several sites (or staging and production) share servers safely.
        clock: monotonic time, injectable for tests.
    """

    def __init__(
        self,
        servers: Sequence[str],
        *,
        connect_timeout_s: float = 0.05,
        timeout_s: float = 0.05,
        dead_retry_seconds: float = 10.0,
        item_max_bytes: int = 1024 * 1024,
        namespace: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not servers:
            raise ConfigError("MemcachedStore needs at least one server (setting 'l1.memcached').")
        self.item_max_bytes = max(item_max_bytes - ITEM_OVERHEAD_BYTES, item_max_bytes // 2)
        self._prefix = f"{KEY_PREFIX}{namespace}:" if namespace else KEY_PREFIX
        self._dead_retry = dead_retry_seconds
        self._clock = clock
        self._clients: dict[str, PooledClient] = {}
        for server in servers:
            host, _, port = server.rpartition(":")
            self._clients[server] = PooledClient(
                (host, int(port)),
                connect_timeout=connect_timeout_s,
                timeout=timeout_s,
                no_delay=True,
                max_pool_size=64,
            )
        self._ring = RendezvousHash(list(self._clients))
        self._dead_until: dict[str, float] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes | None:
        value = self._call(key, lambda client, k: client.get(k))
        return value if isinstance(value, bytes) else None

    def set(self, key: str, value: bytes) -> None:
        if len(value) <= self.item_max_bytes:
            self._call(key, lambda client, k: client.set(k, value, noreply=False))

    def get_marked(self, key: str) -> tuple[bytes | None, float | None]:
        """The value and, in the same round trip, the time its page was last marked changed (None: never), as
        any gate sharing these servers marked it."""
        page_key, mark_key = self._prefix + key, self._prefix + MARK_PREFIX + key
        found = self._call(key, lambda client, _: client.get_many([page_key, mark_key]))
        values = found if isinstance(found, dict) else {}
        value, mark = values.get(page_key), values.get(mark_key)
        try:
            marked_at = float(mark) if isinstance(mark, bytes) else None
        except ValueError:
            marked_at = None
        return (value if isinstance(value, bytes) else None), marked_at

    def set_mark(self, key: str, marked_at: float, ttl_s: float) -> None:
        """Tell every gate sharing these servers that ``key``'s page changed at ``marked_at``."""
        expire = max(1, math.ceil(ttl_s))
        mark = b"%.3f" % marked_at
        self._call(
            key, lambda client, _: client.set(self._prefix + MARK_PREFIX + key, mark, expire=expire, noreply=False)
        )

    def add(self, key: str, value: bytes) -> bool:
        if len(value) > self.item_max_bytes:
            return False
        return bool(self._call(key, lambda client, k: client.add(k, value, noreply=False)))

    def add_expiring(self, key: str, value: bytes, ttl_s: float) -> bool:
        """Store ``value`` for ``ttl_s`` seconds unless the key exists (a lease); True when stored."""
        expire = max(1, math.ceil(ttl_s))
        return bool(self._call(key, lambda client, k: client.add(k, value, expire=expire, noreply=False)))

    def gets(self, key: str) -> tuple[bytes | None, bytes | None]:
        """The value and its compare-and-set token (None, None when the key is not there)."""
        found = self._call(key, lambda client, k: client.gets(k))
        value, token = found if isinstance(found, tuple) else (None, None)
        return (value if isinstance(value, bytes) else None), (token if isinstance(token, bytes) else None)

    def cas(self, key: str, value: bytes, token: bytes, ttl_s: float) -> bool:
        """Replace the value only if nobody changed it since ``gets`` gave ``token``; True when replaced."""
        expire = max(1, math.ceil(ttl_s))
        return bool(self._call(key, lambda client, k: client.cas(k, value, token, expire=expire, noreply=False)))

    def touch(self, key: str) -> bool:
        return bool(self._call(key, lambda client, k: client.touch(k, 0, noreply=False)))

    def delete(self, key: str) -> None:
        self._call(key, lambda client, k: client.delete(k, noreply=False))

    def close(self) -> None:
        for client in self._clients.values():
            client.close()

    def status(self) -> dict[str, dict[str, object]]:
        """Each server's figures as memcached gives them (``stats``: items, bytes, its ``-m``, its evictions), or why
        it is not in use: for the gate's stats. A server skipped after a failure is not asked."""
        now = self._clock()
        servers: dict[str, dict[str, object]] = {}
        for server, client in self._clients.items():
            dead_until = self._dead_until.get(server)
            if dead_until is not None and now < dead_until:
                servers[server] = {"up": False, "skipped_s": round(dead_until - now, 1)}
                continue
            try:
                figures = client.stats()
            except (OSError, MemcacheError) as exc:
                servers[server] = {"up": False, "error": str(exc) or type(exc).__name__}
                continue
            servers[server] = {"up": True} | {
                name: int(figures.get(field, 0))
                for name, field in (
                    ("items", b"curr_items"),
                    ("used_bytes", b"bytes"),
                    ("max_bytes", b"limit_maxbytes"),
                    ("evictions", b"evictions"),
                )
            }
        return servers

    def _call(self, key: str, operation: Callable[[PooledClient, str], object]) -> object:
        server = self._ring.get_node(key) if not self._dead_until else self._live_server(key)
        try:
            return operation(self._clients[server], self._prefix + key)
        except (OSError, MemcacheError) as exc:
            # A server that answered an error refused this item alone ("object too large for cache", "out of
            # memory storing object" with -M): it is up, and holds every other page still. Skipping it would
            # empty it for every gate that shares it when it is taken back.
            answered = isinstance(exc, (MemcacheServerError, MemcacheClientError))
            if not answered or isinstance(exc, MemcacheUnexpectedCloseError):
                self._mark_dead(server, exc)
            raise StoreUnavailable(f"memcached {server}: {exc}") from exc

    def _live_server(self, key: str) -> str:
        """The first server of the key's rendezvous order that is not skipped; one whose back-off is over is
        flushed first and taken back (or skipped again)."""
        hashed = self._ring.hash_function
        for server in sorted(self._clients, key=lambda node: (hashed(f"{node}-{key}"), node), reverse=True):
            dead_until = self._dead_until.get(server)
            if dead_until is None or (self._clock() >= dead_until and self._rejoin(server)):
                return server
        raise StoreUnavailable("every memcached server is skipped after a failure")

    def _rejoin(self, server: str) -> bool:
        with self._lock:
            if server not in self._dead_until:
                return True  # another thread took it back meanwhile
            try:
                self._clients[server].flush_all(noreply=False)
            except (OSError, MemcacheError) as exc:
                self._dead_until[server] = self._clock() + self._dead_retry
                self._clients[server].close()
                logger.debug("L1 server %s still unavailable: %s", server, exc)
                return False
            del self._dead_until[server]
        logger.warning("L1 server %s back in rotation, emptied (its pages may have changed meanwhile)", server)
        return True

    def _mark_dead(self, server: str, exc: BaseException) -> None:
        with self._lock:
            first = server not in self._dead_until
            self._dead_until[server] = self._clock() + self._dead_retry
        # Every pooled connection of a failed server is suspect (a restarted memcached leaves them all
        # broken): dropping the pool lets the first call after the back-off connect afresh and succeed,
        # instead of each stale connection failing in turn, one back-off window each.
        self._clients[server].close()
        if first:
            logger.warning("L1 server %s marked dead for %.0f s: %r", server, self._dead_retry, exc)
