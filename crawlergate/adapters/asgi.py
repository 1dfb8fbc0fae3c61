"""CrawlerGateMiddleware: pure ASGI. Crawlers get cached guest pages; everyone else gets the site.

The flow (DESIGN.md, "The request, end to end"): admin paths go to the admin endpoints; anything
that is not a cacheable GET/HEAD, carries a session cookie or credentials, or comes from a human
passes through untouched (streaming preserved), and a human's page view then prefetches the page
into L1 off the response path. A crawler is answered from L1, then L2, else from one guest
sub-request per key, whose page is stored when storable. If the origin fails and L2 has the page,
the stored copy is served as ``stale``. Every response carries ``X-Crawlergate``.

    app = CrawlerGateMiddleware(site, settings=load_settings("crawlergate.toml"))
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from crawlergate.cache import CacheHit, TwoLevelCache
from crawlergate.classify import HUMAN, Classifier, Verdict
from crawlergate.config import Settings
from crawlergate.errors import OriginError
from crawlergate.gate.answer import (
    INLINE_PAGE_BYTES,
    Response,
    accepts_gzip,
    page_response,
    plain_response,
    send_response,
)
from crawlergate.gate.engine import Decision, NotStored, RequestHeaders, Route
from crawlergate.gate.fill import Filler
from crawlergate.gate.origin import AsgiOrigin, OriginResponse, PublicSite
from crawlergate.gate.writes import FORM_BYTES, FORM_TYPES, form_fields
from crawlergate.keys import CacheKey
from crawlergate.page import Page
from crawlergate.regenerate.schedule import Scheduler, start_async_scheduler
from crawlergate.wiring import build_access_log, build_admin, build_core, build_regeneration


async def _answer(
    page: Page, method: str, request: RequestHeaders, *, outcome: bytes, now: float | None = None
) -> Response:
    if len(page.body_gz) > INLINE_PAGE_BYTES // 4 and not accepts_gzip(request.accept_encoding):
        return await anyio.to_thread.run_sync(lambda: page_response(page, method, request, outcome=outcome, now=now))
    return page_response(page, method, request, outcome=outcome, now=now)


class CrawlerGateMiddleware:
    """Wrap an ASGI site so crawlers are served from the two-level cache.

    Parameters:
        app: the site (or, in the standalone proxy, the reverse-proxy app).
        settings: all configuration; ``Settings()`` works on a laptop.
        cache: a ready TwoLevelCache (tests, or several gates sharing one); built from settings if None.
        classifier: a ready Classifier; built from settings if None.
        origin: where guest pages come from; ``app`` itself, called in-process, if None.
        standalone: the gate is the server (``serve``): its access log is on unless ``log.access_log`` is "off".
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        settings: Settings,
        cache: TwoLevelCache | None = None,
        classifier: Classifier | None = None,
        origin: AsgiOrigin | None = None,
        clock: Callable[[], float] = time.time,
        standalone: bool = False,
    ) -> None:
        self.app = app
        self.core = build_core(settings, cache=cache, classifier=classifier, clock=clock)
        self.settings = settings
        self.cache = self.core.cache
        self.keys = self.core.keys
        self.metrics = self.core.metrics
        self.origin = origin or AsgiOrigin(
            app,
            public=self.core.public,
            fill_client_address=settings.server.fill_client_address,
            timeout_s=settings.cache.fill_timeout_seconds,
            max_bytes=settings.l2.page_max_bytes,
            devices=self.core.devices,
        )
        self.filler = Filler(self.core)
        self.admin = build_admin(self.core)
        self._background: set[asyncio.Task[object]] = set()
        # The site as the last crawler's request named it: what a mounted gate without public_url regenerates as.
        self._arrived_at: PublicSite | None = None
        self.regeneration = build_regeneration(self.core, self.filler, self._fetch_for_regeneration, clock=clock)
        self._scheduler: Scheduler | None = None
        self._scheduling = False
        self.access_log = build_access_log(self.core, standalone=standalone)

    def start(self) -> None:
        """Prepare the stores (create the L2 directory) and the access log; raises ConfigError when unusable."""
        self.core.start()
        if self.access_log is not None:
            self.access_log.start()

    def _start_schedule(self) -> None:
        """Start the off-peak job on the running loop (at startup, or at the first request of an app without a
        lifespan, such as Django's)."""
        self._scheduling = True
        if self.access_log is not None:
            self.access_log.start()  # an app without a lifespan (Django's) starts it here
        if self.settings.regenerate.enabled:
            self.start()
            self._scheduler = start_async_scheduler(self.regeneration)

    async def _stop_schedule(self) -> None:
        self.regeneration.stop()
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None
        task = self.regeneration.task
        if task is not None and not task.done():
            task.cancel()  # the pass stops between pages: marks stay until a page's new copy is stored
            await asyncio.gather(task, return_exceptions=True)

    async def drain(self) -> None:
        """Wait for background work (prefetches) to finish, e.g. before shutdown."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    def stats(self) -> dict[str, object]:
        return self.core.stats()

    def mark_changed(self, url_or_pattern: str) -> int:
        """Mark stored pages changed (a URL, or a pattern with ``*``): crawlers get the stored copy until it is
        regenerated; returns the pages marked."""
        return self.core.mark_changed(url_or_pattern)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, self._lifespan_receive(receive), send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self._scheduling:
            self._start_schedule()
        started = time.perf_counter()
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
        client = scope.get("client")
        decision = self.core.decide(
            scope["method"],
            scope["path"],
            raw_path,
            scope.get("query_string", b""),
            scope["headers"],
            client[0] if client else None,
            scope.get("scheme", "http"),
        )
        route = decision.route
        if route is Route.CACHE:
            await self._serve_crawler(scope, receive, send, decision, started)
        elif route is Route.PASS:
            method: str = scope["method"]
            if method in self.core.writes.methods:
                await self._pass_write(scope, receive, send, decision, started)
                return
            status = await self._pass(scope, receive, send, decision, started)
            key = decision.key
            # Most human views are of pages L1 already holds: with the embedded L1 that is settled inline.
            if key is not None and self.core.should_prefetch(decision, status) and not self.cache.touch_local_l1(key):
                self._in_background(self.cache.prefetch, key)
        elif route is Route.ADMIN:
            await self.admin(scope, receive, send)
        elif route is Route.PURGE:
            peer = client[0] if client else None
            query: bytes = scope.get("query_string", b"")
            answer = await anyio.to_thread.run_sync(self.core.purge, peer, scope["headers"], raw_path, query)
            await send_response(send, answer)
        elif route is Route.DENY:
            response = self.core.deny()
            await send_response(send, response)
            self._count(scope, decision.verdict, "denied", started, response, reasons=decision.reasons)
        else:
            response = plain_response(414, b"URI Too Long\n", outcome=b"pass")
            await send_response(send, response)
            self._count(scope, HUMAN, "pass", started, response)

    async def _serve_crawler(
        self, scope: Scope, receive: Receive, send: Send, decision: Decision, started: float
    ) -> None:
        key = decision.key
        assert key is not None
        method: str = scope["method"]
        request = decision.headers
        # L1 is called inline: the embedded store answers in microseconds, and memcached is bounded by
        # its 50 ms socket timeout and the dead-server back-off. Worker threads measured slower for
        # memcached too (3,000 vs 5,000 hits/s, scripts/bench_gate.py): pymemcache spends ~100 µs of
        # Python per 17 KB get, which threads cannot overlap under the GIL. L2 reads the disk: a thread.
        found = self.cache.lookup_l1(key) or await anyio.to_thread.run_sync(self.cache.lookup_l2, key)
        variant = self.core.variant_for(key, found.page if found is not None else None, request)
        if variant is not None:  # the site serves each device its own page: this device's copy
            key = variant
            found = self.cache.lookup_l1(key) or await anyio.to_thread.run_sync(self.cache.lookup_l2, key)
        now = self.core.clock()
        if self.core.note_demand(key, now):
            self._in_background(self.core.dirty.upkeep)
        step = self.core.serve_or_fill(key, found, now)
        if isinstance(step, CacheHit):
            hit = b"%s-hit" % step.level.encode()
            served = await _answer(step.page, method, request, outcome=hit, now=now)
            await send_response(send, served)
            self._count(
                scope, decision.verdict, f"{step.level}-hit", started, served, step.page.generation_ms, decision.reasons
            )
            return
        stale = step.stale
        spared = self.core.spare_site(decision, stale, method, request)
        if spared is not None:
            await send_response(send, spared[0])
            self._count(scope, decision.verdict, spared[1], started, spared[0], reasons=decision.reasons)
            return
        result: Page | NotStored | None = None
        error: OriginError | None = None
        try:
            result = await self.filler.fill(key, functools.partial(self._fetch, key, scope))
            variant = self.core.variant_for(key, result, request) if isinstance(result, Page) else None
            if variant is not None:  # the page turned out to vary by device: fill this device's copy too
                key = variant
                result = await self.filler.fill(variant, functools.partial(self._fetch, variant, scope))
        except OriginError as exc:
            error = exc
        response: Response | None
        if isinstance(result, Page):
            response, outcome = await _answer(result, method, request, outcome=b"miss"), "miss"
        else:
            # The rare paths (errors, unstorable answers) may read L2 for a stale copy: a worker thread.
            response, outcome = await anyio.to_thread.run_sync(
                self.core.after_fill, key, result, error, stale, method, request
            )
        if response is None:
            await self._pass(scope, receive, send, decision, started)
            return
        await send_response(send, response)
        self._count(scope, decision.verdict, outcome, started, response, reasons=decision.reasons)

    def _count(
        self,
        scope: Scope,
        verdict: Verdict,
        outcome: str,
        started: float,
        response: Response,
        saved_ms: float = 0.0,
        reasons: tuple[str, ...] = (),
    ) -> None:
        """Count an answer the gate gave itself, and log it."""
        ttfb_ms = self.metrics.record_for(verdict, outcome, started, saved_ms)
        if self.access_log is not None:
            self.access_log.log(scope, response[0], len(response[2]), ttfb_ms, outcome, verdict, reasons)

    def _fetch(self, key: CacheKey, scope: Scope) -> Awaitable[OriginResponse]:
        """The guest sub-request for the visitor of ``scope``."""
        client, server = scope.get("client"), scope.get("server")
        self.origin.root_path = scope.get("root_path", "")
        if server:
            self._arrived_at = PublicSite.from_server(scope.get("scheme", "http"), server)
        return self.origin.fetch_guest(
            key.target,
            client=self.core.client_address(client[0] if client else None, scope["headers"]),
            arrived_at=self._arrived_at if server else None,
        )

    def _fetch_for_regeneration(self, key: CacheKey) -> Awaitable[OriginResponse]:
        """A regeneration's guest sub-request: no visitor, the site as configured (or as crawlers last named it)."""
        return self.origin.fetch_guest(key.target, client=None, arrived_at=self._arrived_at)

    async def _pass(self, scope: Scope, receive: Receive, send: Send, decision: Decision, started: float) -> int:
        """Pass the request to the site, marked and counted; the status it answered."""
        status = 0
        ttfb_ms = -1.0
        sent = 0
        access_log = self.access_log
        verdict = decision.verdict
        valve = self.core.valve
        client = decision.client

        async def send_marked(message: Message) -> None:
            nonlocal status, ttfb_ms, sent
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = message.get("headers", [])
                if client is not None and any(name.lower() == b"set-cookie" for name, _ in headers):
                    self.core.judge.cookie_offered(client)
                message["headers"] = [*headers, (b"x-crawlergate", b"pass")]
                if decision.key is not None and status < 500:  # a page's speed (not a static file's, nor an error's)
                    valve.sample((time.perf_counter() - started) * 1000, decision.key.digest)
            elif message["type"] == "http.response.body":
                if ttfb_ms < 0:
                    ttfb_ms = self.metrics.record_for(verdict, "pass", started)
                sent += len(message.get("body", b""))
                if not message.get("more_body", False):
                    self.metrics.add_origin_time(verdict.kind, (time.perf_counter() - started) * 1000)
                    if access_log is not None:
                        access_log.log(scope, status, sent, ttfb_ms, "pass", verdict, decision.reasons)
            await send(message)

        valve.entered()
        try:
            await self.app(scope, receive, send_marked)
        finally:
            valve.left()
        return status

    async def _pass_write(self, scope: Scope, receive: Receive, send: Send, decision: Decision, started: float) -> None:
        """Pass an unsafe request on; when it succeeded, mark the pages the write rules say it changed."""
        method, path = scope["method"], scope["path"]
        form: bytearray | None = None
        if self.core.writes.wants_form(method, path) and _is_form(scope["headers"]):
            form = bytearray()
            receive = _teed(receive, form)
        location = b""

        async def send_watched(message: Message) -> None:
            nonlocal location
            if message["type"] == "http.response.start":
                location = next((value for name, value in message.get("headers", []) if name == b"location"), b"")
            await send(message)

        status = await self._pass(scope, receive, send_watched, decision, started)
        if 200 <= status < 400:
            fields = form_fields(bytes(form)) if form is not None else None
            query: bytes = scope.get("query_string", b"")
            self._in_background(self.core.after_write, method, path, query, fields, location)

    def _in_background(self, work: Callable[..., object], *args: object) -> None:
        """Run ``work(*args)`` in a worker thread, off the response path; ``drain`` waits for it."""
        task = asyncio.get_running_loop().create_task(anyio.to_thread.run_sync(work, *args))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _lifespan_receive(self, receive: Receive) -> Receive:
        async def wrapped() -> Message:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.start()
                self._start_schedule()
            elif message["type"] == "lifespan.shutdown":
                await self._stop_schedule()
                await self.drain()
                if self.access_log is not None:
                    self.access_log.close()
                self.core.close()
                self.regeneration.state.close()
            return message

        return wrapped


def _is_form(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(name == b"content-type" and value.lower().startswith(FORM_TYPES) for name, value in headers)


def _teed(receive: Receive, copy: bytearray) -> Receive:
    """``receive`` that also keeps the first FORM_BYTES of the request body in ``copy``."""

    async def teeing() -> Message:
        message = await receive()
        if message["type"] == "http.request" and len(copy) < FORM_BYTES:
            copy.extend(message.get("body", b"")[: FORM_BYTES - len(copy)])
        return message

    return teeing
