"""The regeneration lease: one process regenerates at a time.

Every worker ticks, and the pass needs the lease, held in memcached (``add`` with a time to live:
one across the machines that share L1) or, with the embedded L1, in the page catalogue's file (one
machine). A lease whose holder process died on this machine is taken over at once; another
machine's lapses after the window.

    lease = Lease(state, cache.l1, ttl_s=3600)
    holder = lease.take()   # None: this process holds it
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import uuid
from pathlib import Path

from crawlergate.errors import StoreUnavailable
from crawlergate.regenerate.state import RegenerationState
from crawlergate.stores.memcached import MemcachedStore

logger = logging.getLogger(__name__)

LEASE_KEY = "regenerate-lease"


class Lease:
    """The right to regenerate: one holder at a time, across processes (and machines sharing memcached)."""

    def __init__(self, state: RegenerationState, l1: object, ttl_s: float) -> None:
        self.state = state
        self.memcached = l1 if isinstance(l1, MemcachedStore) else None
        self.ttl_s = ttl_s
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._in_memcached = False

    def take(self) -> str | None:
        """Take the lease; returns None when taken, else who holds it."""
        if self.memcached is not None:
            try:
                held = self._take_memcached()
            except StoreUnavailable as exc:
                logger.warning("regeneration lease: memcached is unavailable (%s); using this machine's lease", exc)
            else:
                self._in_memcached = held is None
                return held
        return self.state.take_lease(self.holder, self.ttl_s, is_stale=_died_here)

    def _take_memcached(self) -> str | None:
        """``add`` takes a free lease; a released one (empty) or a dead holder's is taken by compare-and-set, so
        of two processes that saw it free, one wins."""
        assert self.memcached is not None
        mine = self.holder.encode()
        for _ in range(3):
            if self.memcached.add_expiring(LEASE_KEY, mine, self.ttl_s):
                return None
            value, token = self.memcached.gets(LEASE_KEY)
            if value is None or token is None:
                continue  # gone meanwhile: add again
            current = value.decode("utf-8", "replace")
            if current and not _died_here(current):
                return current
            if self.memcached.cas(LEASE_KEY, mine, token, self.ttl_s):
                return None
        return "another process"

    def holder_now(self) -> str | None:
        """Who holds the lease now (memcached's, else this machine's), if anyone."""
        if self.memcached is not None:
            with contextlib.suppress(StoreUnavailable):
                value = self.memcached.get(LEASE_KEY)
                return value.decode("utf-8", "replace") if value else None
        return self.state.lease_holder()

    def release(self) -> None:
        """Give the lease up (only if it is still this process's): an empty value for a second marks it free."""
        if self._in_memcached and self.memcached is not None:
            self._in_memcached = False
            with contextlib.suppress(StoreUnavailable):
                value, token = self.memcached.gets(LEASE_KEY)
                if value == self.holder.encode() and token is not None:
                    self.memcached.cas(LEASE_KEY, b"", token, 1)
            return
        self.state.release_lease(self.holder)


def _died_here(holder: str) -> bool:
    """Whether a lease holder ("host:pid:token") was a process of this machine that no longer runs."""
    host, _, rest = holder.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    # A killed process its parent has not reaped yet still answers the signal: a zombie is dead too.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] == ["Z"]
