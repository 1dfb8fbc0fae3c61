"""The one filler: a guest sub-request for a key, judged by the storable rules, stored, counted.

Every fill goes through here, whoever asks for it: a crawler's miss through the ASGI or WSGI
middleware or the proxy. Concurrent fills of one key share one origin request (single-flight).
Async callers share an asyncio future; blocking callers (WSGI) share a thread event, and their
fill runs in a small pool so the fill deadline holds however long the site takes: the caller
answers stale or 504 in time, and the fill may still finish and store the page in the background.
A filled page is answered at once: L1 and lookups have it, and the writer (gate/pagewriter.py) puts it
on disk, in the catalogue and in the published tree a few milliseconds later.

    filler = Filler(cache, catalogue, storage, valve, clock=time.time, timeout_s=30)   # wiring.build_filler
    result = await filler.fill(key, lambda: origin.fetch_guest(key.target, client=None))
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout
from dataclasses import dataclass

import anyio

from crawlergate.cache import TwoLevelCache
from crawlergate.errors import OriginError, OriginTimeout
from crawlergate.gate.answer import INLINE_PAGE_BYTES
from crawlergate.gate.catalogue import PageCatalogue
from crawlergate.gate.origin import OriginResponse, PassedOn
from crawlergate.gate.pagewriter import PageWriter
from crawlergate.gate.storable import StoragePolicy, StoreVerdict
from crawlergate.gate.valve import OverloadValve
from crawlergate.keys import CacheKey
from crawlergate.page import Page
from crawlergate.stores.published import PublishedTree

# Blocking fills at once, across pages: a site that hangs holds at most these threads, never the server's.
FILL_THREADS = 8


@dataclass(frozen=True, slots=True)
class NotStored:
    """A guest answer that was not stored, with the verdict that says why."""

    response: OriginResponse
    verdict: StoreVerdict

    def has(self, reason: str) -> bool:
        return any(label == reason for label, _ in self.verdict.reasons)


@dataclass(slots=True)
class FillResult:
    """How a fill ended: the stored Page, or the answer that was not stored, or the error that stopped it."""

    result: Page | NotStored | None = None
    error: OriginError | None = None


# How long a page the site answered with what is passed on (PassedOn) goes to the site without a fill first, and
# how many such pages a gate remembers at most (emptied when full: bounded whatever crawlers ask for).
PASSED_ON_SECONDS = 600.0
PASSED_ON_PAGES = 10_000


class _Flight:
    """One blocking fill in progress that other threads wait for."""

    __slots__ = ("done", "outcome")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.outcome = FillResult()


class Filler:
    """Fills keys from the origin for one gate.

    Parameters:
        cache: where filled pages are stored (its metrics count the fills).
        catalogue: the page catalogue, told of every page stored.
        storage: the storable rules: which answers are stored, for how long.
        valve: the overload valve, which hears each fill's time.
        clock: wall-clock time (page ages are persisted in L2).
        timeout_s: a blocking fill's deadline (``cache.fill_timeout_seconds``).
        published: the tree a front server answers crawlers from, when the gate keeps one.
    """

    def __init__(
        self,
        cache: TwoLevelCache,
        catalogue: PageCatalogue,
        storage: StoragePolicy,
        valve: OverloadValve,
        *,
        clock: Callable[[], float] = time.time,
        timeout_s: float = 30.0,
        threads: int = FILL_THREADS,
        published: PublishedTree | None = None,
    ) -> None:
        self.cache = cache
        self.published = published
        self.catalogue = catalogue
        self.storage = storage
        self.metrics = cache.metrics
        self.valve = valve
        self.clock = clock
        self.timeout_s = timeout_s
        self._async_fills: dict[str, asyncio.Future[Page | NotStored]] = {}
        self._blocking_fills: dict[str, _Flight] = {}
        self._blocking_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="crawlergate-fill")
        # Pages the site answered lately with what is passed on, not stored (too big, a stream, a coding the gate
        # cannot read): until when, and why. Their crawlers go to the site at once; a fill first made each of them
        # cost the site the page twice.
        self._passed_on: dict[str, tuple[float, PassedOn]] = {}
        # Filled pages go to disk, the catalogue and the published tree in this thread, after their answer.
        self.writer = PageWriter(cache, catalogue, self._publish if published is not None else None)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.writer.close()

    async def fill(
        self, key: CacheKey, fetch: Callable[[], Awaitable[OriginResponse]], *, previous: Page | None = None
    ) -> Page | NotStored:
        """Fetch, judge and store ``key`` once for all concurrent callers; raises OriginError when the site failed.

        ``previous`` is the stored copy being replaced (regeneration): an unchanged page keeps its Last-Modified.
        """
        self._raise_if_passed_on_lately(key)
        pending = self._async_fills.get(key.digest)
        if pending is not None:
            self.valve.withdrawn(key.digest)  # let through, but the fill under way answers it
            return await asyncio.shield(pending)
        future: asyncio.Future[Page | NotStored] = asyncio.get_running_loop().create_future()
        self._async_fills[key.digest] = future
        try:
            result = await self._fetch_async(key, fetch, previous)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except Exception as exc:
            future.set_exception(exc)
            # Followers retrieve it; mark it retrieved so a lone leader leaves no warning behind.
            future.exception()
            raise
        else:
            future.set_result(result)
            return result
        finally:
            del self._async_fills[key.digest]

    async def fill_result(self, key: CacheKey, fetch: Callable[[], Awaitable[OriginResponse]]) -> FillResult:
        """``fill``, its failure included in the result rather than raised."""
        try:
            return FillResult(await self.fill(key, fetch))
        except OriginError as exc:
            return FillResult(error=exc)

    def fill_blocking(self, key: CacheKey, fetch: Callable[[], OriginResponse]) -> FillResult:
        """``fill`` for threads: waits at most the fill deadline, then reports an OriginTimeout."""
        try:
            self._raise_if_passed_on_lately(key)
        except PassedOn as passed:
            return FillResult(error=passed)
        with self._blocking_lock:
            flight = self._blocking_fills.get(key.digest)
            leader = flight is None
            if flight is None:
                flight = self._blocking_fills[key.digest] = _Flight()
        if not leader:
            self.valve.withdrawn(key.digest)
            if not flight.done.wait(self.timeout_s):
                return FillResult(error=OriginTimeout(f"{key.target}: still being fetched by another request"))
            return flight.outcome
        try:
            flight.outcome.result = self._pool.submit(self._fetch_blocking, key, fetch).result(timeout=self.timeout_s)
        except FutureTimeout:
            flight.outcome.error = OriginTimeout(f"{key.target}: the site did not answer within {self.timeout_s:g} s")
        except OriginError as exc:
            flight.outcome.error = exc
        finally:
            with self._blocking_lock:
                del self._blocking_fills[key.digest]
            flight.done.set()
        return flight.outcome

    async def _fetch_async(
        self, key: CacheKey, fetch: Callable[[], Awaitable[OriginResponse]], previous: Page | None
    ) -> Page | NotStored:
        fetched_at = self.clock()
        started = time.perf_counter()
        self.valve.entered(key.digest)
        try:
            response = await fetch()
        except OriginError as exc:
            self._count_failure(exc, started, key)
            raise
        finally:
            self.valve.left()  # a fill's time is sampled below, whole (the valve hears people's TTFB too)
        generation_ms = self._count_fetch(started, key)
        # Compressing, hashing and checksumming a big page takes the event loop for a while (297 ms for 8 MB): a
        # thread.
        if len(response.body) > INLINE_PAGE_BYTES:
            judged, data = await anyio.to_thread.run_sync(self._judged_and_held, key, response, previous, generation_ms)
        else:
            judged, data = self._judged_and_held(key, response, previous, generation_ms)
        if isinstance(judged, Page) and not self.writer.write(key, judged, data, fetched_at):
            await anyio.to_thread.run_sync(self.writer.write_blocking, key, judged, data, fetched_at)
        return self._counted(judged)

    def _fetch_blocking(self, key: CacheKey, fetch: Callable[[], OriginResponse]) -> Page | NotStored:
        fetched_at = self.clock()
        started = time.perf_counter()
        self.valve.entered(key.digest)
        try:
            response = fetch()
        except OriginError as exc:
            self._count_failure(exc, started, key)
            raise
        finally:
            self.valve.left()
        judged, data = self._judged_and_held(key, response, None, self._count_fetch(started, key))
        if isinstance(judged, Page):
            self.writer.write_blocking(key, judged, data, fetched_at)
        return self._counted(judged)

    def _judged_and_held(
        self, key: CacheKey, response: OriginResponse, previous: Page | None, generation_ms: float
    ) -> tuple[Page | NotStored, bytes]:
        """``judge_fill``, and a page to store held in memory (``TwoLevelCache.hold``) with its bytes."""
        judged = self.judge_fill(key, response, previous, generation_ms)
        return judged, self.cache.hold(key, judged) if isinstance(judged, Page) else b""

    def judge_fill(
        self, key: CacheKey, response: OriginResponse, previous: Page | None = None, generation_ms: float = 0.0
    ) -> Page | NotStored:
        """The Page to store for a guest answer, or the answer with every reason it is not stored (counted).

        ``generation_ms`` is how long the site took to answer: kept with the page for the origin time hits save.

        A page with the same body as ``previous``, the copy it replaces, keeps its Last-Modified (its ETag is
        the body's hash): a crawler's conditional request still gets 304.
        """
        now = self.clock()
        verdict = self.storage.judge(response, key.target, now=now)
        if verdict.storable:
            page = self.storage.page(response, verdict, now=now, generation_ms=generation_ms)
            if previous is not None and previous.etag == page.etag and previous.last_modified < page.last_modified:
                page = dataclasses.replace(page, last_modified=previous.last_modified)
            return page
        for label in dict.fromkeys(label for label, _ in verdict.reasons):
            self.metrics.count_not_stored(label)
        return NotStored(response, verdict)

    def _publish(self, key: CacheKey, page: Page) -> None:
        """The stored page into the published tree, unless it is marked; a copy it replaces that a front server
        cannot give (now a redirect, say) leaves the tree. A mark that came while it was published takes it out
        again: marks unpublish before and after they are written, and this reads the mark after the rename."""
        assert self.published is not None
        placed = self.catalogue.dirty_since(key.digest) is None and self.published.publish(key, page)
        if not placed or self.catalogue.marked_now(key.digest):
            self.published.unpublish([key.digest])

    def _count_fetch(self, started: float, key: CacheKey) -> float:
        """Count one guest sub-request that the site answered; its time in milliseconds."""
        elapsed_ms = (time.perf_counter() - started) * 1000
        self.metrics.record_origin(elapsed_ms)
        self.valve.sample(elapsed_ms, key.digest)
        return elapsed_ms

    def _raise_if_passed_on_lately(self, key: CacheKey) -> None:
        remembered = self._passed_on.get(key.digest)
        if remembered is None:
            return
        until, passed = remembered
        if self.clock() >= until:
            self._passed_on.pop(key.digest, None)
            return
        self.metrics.count_not_stored(passed.reason)
        raise type(passed)(str(passed))

    def _count_failure(self, error: OriginError, started: float, key: CacheKey) -> None:
        self._count_fetch(started, key)
        if isinstance(error, PassedOn):  # the site answered; the page is passed on, not stored
            self.metrics.count_not_stored(error.reason)
            if not error.of_the_page:
                return
            if len(self._passed_on) >= PASSED_ON_PAGES:
                self._passed_on.clear()
            self._passed_on[key.digest] = (self.clock() + PASSED_ON_SECONDS, error)
            return
        self.metrics.count("origin_errors")
        self.metrics.count_not_stored("origin-error")

    def _counted(self, judged: Page | NotStored) -> Page | NotStored:
        if isinstance(judged, NotStored) and (judged.has("origin-error") or judged.has("incomplete")):
            self.metrics.count("origin_errors")
        return judged
