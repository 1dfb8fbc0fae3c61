"""CrawlerGateMiddleware: pure ASGI. Crawlers get cached guest pages; everyone else gets the site.

The request's way through the gate is ``gate/flow.py``'s; this adapter performs its
steps on the event loop: L1 inline, L2 and other disk work in worker threads, fills through the
filler with the wrapped app called in-process as the origin. Admin paths go to the admin
endpoints; what passes reaches the site untouched (streaming preserved), watched by the flow.
Every response carries ``X-Crawlergate``.

    app = CrawlerGateMiddleware(site, settings=load_settings("crawlergate.toml"))
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from crawlergate.adapters.base import GateAdapter
from crawlergate.adapters.inapp import AsgiOrigin
from crawlergate.cache import CacheHit, TwoLevelCache
from crawlergate.classify import Classifier
from crawlergate.config import Settings
from crawlergate.gate.answer import Later, Response, send_response
from crawlergate.gate.fill import FillResult
from crawlergate.gate.flow import PASS_HEADER, Prepared, Waiting, run
from crawlergate.gate.origin import OriginResponse, PublicSite
from crawlergate.gate.request import Decision, Request, Route
from crawlergate.gate.writes import FORM_BYTES
from crawlergate.keys import CacheKey
from crawlergate.regenerate.schedule import start_async_scheduler
from crawlergate.wiring import GateRuntime

T = TypeVar("T")
# The scope key under which a server that decided a request itself (``answer_at_once``) hands it on.
PREPARED = "crawlergate.prepared"


class CrawlerGateMiddleware(GateAdapter):
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
        fetch = self._fetch_for_regeneration
        runtime = GateRuntime(settings, fetch_for_regeneration=fetch, cache=cache, classifier=classifier,
                              clock=clock, standalone=standalone, app=app)  # fmt: skip
        super().__init__(runtime)
        self.origin = origin or AsgiOrigin.for_gate(app, settings, self.core.public, self.core.devices)
        self._background: set[asyncio.Task[object]] = set()

    def start_serving(self) -> None:
        """Start the gate and its off-peak job (at the server's start-up; raises ConfigError when unusable)."""
        self._scheduling = True
        self.runtime.start_schedule(start_async_scheduler)
        # anyio imports its asyncio backend at the first thread hop (30 ms here): at start-up, not in the event
        # loop while the first crawler's page is filled.
        anyio.to_thread.current_default_thread_limiter()

    async def aclose(self) -> None:
        """Finish background work, then stop and close everything the gate opened."""
        await self.runtime.aclose(drain=self.drain)

    async def drain(self) -> None:
        """Wait for background work (prefetches) to finish, e.g. before shutdown."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
        await anyio.to_thread.run_sync(self.flow.prefetcher.drain)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, self._lifespan_receive(receive), send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self._scheduling:  # at the first request of an app without a lifespan (Django's)
            self.start_serving()
        prepared: Prepared | None = scope.get(PREPARED)
        if prepared is None:
            client = scope.get("client")
            request = Request(
                scope["method"],
                scope["path"],
                scope.get("raw_path") or scope["path"].encode("utf-8"),
                scope.get("query_string", b""),
                scope["headers"],
                client[0] if client else None,
                scope.get("scheme", "http"),
                scope.get("http_version", "1.1"),
            )
            prepared = self.flow.prepare(request, self, time.perf_counter())
        request, decision, started = prepared.request, prepared.decision, prepared.started
        if decision.route is Route.ADMIN:
            await self.admin(scope, receive, send)
            return
        answer = prepared.progress
        if isinstance(answer, Waiting):
            answer = await run(answer, self, scope)
        if answer is None:
            await self._pass(scope, receive, send, request, decision, started)
            return
        await send_response(send, answer.response)
        self.flow.finish(request, decision, answer, started)

    def answer_at_once(self, request: Request, started: float, scope: Scope, may_wait: bool) -> Response | Later | None:
        """For a server that parses requests itself (``serve``'s protocol): the whole response when the gate has
        it at once; with ``may_wait`` (a request without a body), the coroutine that gives the gate's own answer
        once its steps are done (an L2 read, a fill, a large page); else None, and the request, decided, goes on
        through ``__call__`` (kept in ``scope``, with the server's ``server``, ``scheme`` and ``root_path``)."""
        if not self._scheduling:
            return None
        answered = self.flow.answer_at_once(request, self, started)
        if isinstance(answered, Prepared):
            scope[PREPARED] = answered
            return self.flow.answer_later(answered, self, scope, may_wait=may_wait)
        return answered

    async def lookup_l2(self, key: CacheKey) -> CacheHit | None:
        return await anyio.to_thread.run_sync(self.cache.lookup_l2, key)

    async def fill(self, key: CacheKey, client: str | None, scope: Scope) -> FillResult:
        return await self.filler.fill_result(key, functools.partial(self._fetch, key, client, scope))

    async def blocking(self, work: Callable[[], T]) -> T:
        return await anyio.to_thread.run_sync(work)

    def background(self, work: Callable[[], object]) -> None:
        task = asyncio.get_running_loop().create_task(anyio.to_thread.run_sync(work))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _fetch(self, key: CacheKey, client: str | None, scope: Scope) -> Awaitable[OriginResponse]:
        server = scope.get("server")
        self.origin.saw(scope)
        if server:
            self._arrived_at = PublicSite.from_server(scope.get("scheme", "http"), server)
        return self.origin.fetch_guest(key.target, client=client, arrived_at=self._arrived_at if server else None)

    def _fetch_for_regeneration(self, key: CacheKey) -> Awaitable[OriginResponse]:
        """A regeneration's guest sub-request: no visitor, the site as configured (or as crawlers last named it)."""
        return self.origin.fetch_guest(key.target, client=None, arrived_at=self._arrived_at)

    async def _pass(
        self, scope: Scope, receive: Receive, send: Send, request: Request, decision: Decision, started: float
    ) -> None:
        """Pass the request to the site, watched by the flow (marked, measured, counted, logged)."""
        passing = self.flow.passing(request, decision, started)

        async def send_marked(message: Message) -> None:
            # The flow hears of each message once it is sent: a person's bytes never wait for the counting.
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), PASS_HEADER]
                passing.answered(message["status"], message["headers"])
            try:
                await send(message)
            finally:
                if message["type"] == "http.response.body":
                    passing.body(len(message.get("body", b"")), last=not message.get("more_body", False))

        try:
            if passing.wants_form(lambda: next((v for k, v in scope["headers"] if k == b"content-type"), b"")):
                passing.form = bytearray()
                receive = _teed(receive, passing.form)
            await self.app(scope, receive, send_marked)
        finally:
            passing.left()
        if (after := passing.follow_up()) is not None:
            self.background(after)

    def _lifespan_receive(self, receive: Receive) -> Receive:
        async def wrapped() -> Message:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.start_serving()
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
            return message

        return wrapped


def _teed(receive: Receive, copy: bytearray) -> Receive:
    """``receive`` that also keeps the first FORM_BYTES of the request body in ``copy``."""

    async def teeing() -> Message:
        message = await receive()
        if message["type"] == "http.request" and len(copy) < FORM_BYTES:
            copy.extend(message.get("body", b"")[: FORM_BYTES - len(copy)])
        return message

    return teeing
