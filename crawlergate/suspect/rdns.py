"""Reverse-then-forward DNS verification of claimed crawlers, off the request path.

Google's and Bing's documented check: the address's PTR name must end in the engine's domain
and resolve back to the same address. Lookups run in one background thread from a bounded
queue; answers are kept per address for ``cache_s``, in a bounded table. A request whose answer
is not known yet is judged without it (a suspect, served from the cache).

    dns = ReverseDns(cache_s=86400)
    dns.verified("66.249.66.1", ("googlebot.com", "google.com"))   # None until looked up, then True/False
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

_QUEUED = 1024
_KNOWN = 65536

Resolver = Callable[[str], tuple[str, list[str]]]  # address -> (PTR name, the names' forward addresses)


def system_resolve(address: str) -> tuple[str, list[str]]:
    """Reverse then forward lookup through the system resolver; its time limit is the resolver's own
    (resolv.conf), which is why it runs in the DNS thread, never on a request's path."""
    name = socket.gethostbyaddr(address)[0]
    forward = {info[4][0] for info in socket.getaddrinfo(name, None)}
    return name, sorted(str(item) for item in forward)


class ReverseDns:
    """Cached reverse-then-forward verdicts per address, looked up by a background thread."""

    def __init__(
        self,
        *,
        cache_s: float = 86400.0,
        resolver: Resolver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._resolver = resolver or system_resolve
        self._cache_s = cache_s
        self._clock = clock
        self._answers: dict[str, tuple[float, str]] = {}  # address -> (when, PTR name or "")
        self._queue: queue.Queue[str] = queue.Queue(maxsize=_QUEUED)
        self._pending: set[str] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def verified(self, address: str, suffixes: tuple[str, ...]) -> bool | None:
        """Whether ``address``'s name ends in one of ``suffixes`` and resolves back to it; None until known."""
        answer = self._answers.get(address)
        if answer is not None and self._clock() - answer[0] < self._cache_s:
            name = answer[1]
            return bool(name) and any(name == suffix or name.endswith("." + suffix) for suffix in suffixes)
        self._ask(address)
        return None

    def _ask(self, address: str) -> None:
        with self._lock:
            if address in self._pending:
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="crawlergate-rdns", daemon=True)
                self._thread.start()
            try:
                self._queue.put_nowait(address)
            except queue.Full:
                return  # asked again by a later request
            self._pending.add(address)

    def wait_idle(self, timeout_s: float = 10.0) -> None:
        """Wait until the queued lookups are answered (tests)."""
        deadline = time.monotonic() + timeout_s
        while self._pending and time.monotonic() < deadline:
            time.sleep(0.01)

    def _run(self) -> None:
        while True:
            address = self._queue.get()
            name = ""
            try:
                ptr, forward = self._resolver(address)
                if address in forward:
                    name = ptr.lower().rstrip(".")
            except (OSError, UnicodeError) as exc:
                logger.debug("reverse DNS of %s failed: %s", address, exc)
            if len(self._answers) >= _KNOWN:
                self._answers.clear()
            self._answers[address] = (self._clock(), name)
            with self._lock:
                self._pending.discard(address)
