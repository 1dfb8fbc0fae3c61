"""CrawlerGateWSGI: the gate for WSGI sites (Flask, Django under gunicorn or uWSGI); synchronous.

The same decisions, headers and stores as the ASGI middleware, through the same GateCore. Guest
pages come from calling the wrapped WSGI app in-process; concurrent misses for one key share one
call (threads wait on the leader). A human's page view prefetches after the response is closed,
in a small background pool, so it never delays the person.

    application = CrawlerGateWSGI(django_application, settings=load_settings())
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from http import HTTPStatus
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from crawlergate.admin.endpoints import MAX_BODY_BYTES
from crawlergate.cache import CacheHit, TwoLevelCache
from crawlergate.classify import HUMAN, Classifier, Verdict
from crawlergate.config import Settings
from crawlergate.errors import OriginTimeout
from crawlergate.gate.accesslog import WSGI_TARGET
from crawlergate.gate.answer import Response, page_response, plain_response
from crawlergate.gate.engine import Decision, Route
from crawlergate.gate.fill import Filler
from crawlergate.gate.origin import OriginResponse, PublicSite, WsgiOrigin
from crawlergate.gate.writes import FORM_BYTES, FORM_TYPES, form_fields
from crawlergate.keys import CacheKey
from crawlergate.page import Page
from crawlergate.regenerate.schedule import Scheduler, start_background_scheduler
from crawlergate.wiring import build_access_log, build_admin, build_core, build_regeneration

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

# Prefetches are small (a touch, maybe a file read and an add): two threads keep up with a busy site.
PREFETCH_THREADS = 2
_PATH_SAFE = "/:@!$&'()*+,;=~"


class CrawlerGateWSGI:
    """Wrap a WSGI app so crawlers are served from the two-level cache.

    Parameters:
        app: the WSGI site.
        settings: all configuration; ``Settings()`` works on a laptop.
        cache: a ready TwoLevelCache; built from settings if None.
        classifier: a ready Classifier; built from settings if None.
    """

    def __init__(
        self,
        app: WSGIApplication,
        *,
        settings: Settings,
        cache: TwoLevelCache | None = None,
        classifier: Classifier | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.app = app
        self.core = build_core(settings, cache=cache, classifier=classifier, clock=clock)
        self.settings = settings
        self.cache = self.core.cache
        self.metrics = self.core.metrics
        self.origin = WsgiOrigin(
            app,
            public=self.core.public,
            fill_client_address=settings.server.fill_client_address,
            max_bytes=settings.l2.page_max_bytes,
            devices=self.core.devices,
        )
        self.admin = build_admin(self.core)
        self.filler = Filler(self.core)
        self._prefetcher = ThreadPoolExecutor(max_workers=PREFETCH_THREADS, thread_name_prefix="crawlergate-prefetch")
        self._pending: set[Future[object]] = set()
        self._arrived_at: PublicSite | None = None
        self.regeneration = build_regeneration(self.core, self.filler, self._fetch_for_regeneration, clock=clock)
        self._scheduler: Scheduler | None = None
        self._scheduling = False
        self._scheduling_lock = threading.Lock()
        self._regeneration_fetches = ThreadPoolExecutor(
            max_workers=settings.regenerate.concurrency, thread_name_prefix="crawlergate-regenerate-fetch"
        )
        # Off unless log.access_log names a file (the WSGI server usually keeps its own).
        self.access_log = build_access_log(self.core, standalone=False)

    def start(self) -> None:
        self.core.start()

    def _start_schedule(self) -> None:
        """Start the off-peak job in a thread of its own, at the first request: after a pre-forking server
        (gunicorn --preload) has forked, since threads do not survive a fork."""
        with self._scheduling_lock:
            if self._scheduling:
                return
            self._scheduling = True
            if self.access_log is not None:
                self.access_log.start()
            if self.settings.regenerate.enabled:
                self.start()
                self._scheduler = start_background_scheduler(self.regeneration)

    async def _fetch_for_regeneration(self, key: CacheKey) -> OriginResponse:
        """A regeneration's guest sub-request, in a thread of its own pool (a site that hangs keeps that thread,
        never the pass: it moves on after the fill deadline)."""
        call = functools.partial(self.origin.fetch_guest, key.target, client=None, arrived_at=self._arrived_at)
        answer = asyncio.get_running_loop().run_in_executor(self._regeneration_fetches, call)
        try:
            return await asyncio.wait_for(answer, self.settings.cache.fill_timeout_seconds)
        except TimeoutError:
            raise OriginTimeout(f"{key.target}: the site did not answer in time") from None

    def drain(self) -> None:
        """Wait for the prefetches queued so far."""
        for future in list(self._pending):
            future.result()

    def close(self) -> None:
        """Stop the off-peak job (a pass under way ends its fetches first), finish queued prefetches and release
        the stores."""
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
        self.regeneration.stop(wait_s=self.settings.cache.fill_timeout_seconds + 5)
        self._regeneration_fetches.shutdown(wait=False, cancel_futures=True)
        self._prefetcher.shutdown(wait=True)
        self.filler.close()
        if self.access_log is not None:
            self.access_log.close()
        self.core.close()
        self.regeneration.state.close()

    def mark_changed(self, url_or_pattern: str) -> int:
        """Mark stored pages changed (see CrawlerGateMiddleware.mark_changed); returns the pages marked."""
        return self.core.mark_changed(url_or_pattern)

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if not self._scheduling:
            self._start_schedule()
        started = time.perf_counter()
        method = environ.get("REQUEST_METHOD", "GET")
        raw_path, query = _raw_target(environ)
        if self.access_log is not None:
            environ[WSGI_TARGET] = raw_path + b"?" + query if query else raw_path
        headers = _request_headers(environ)
        decision = self.core.decide(
            method,
            environ.get("PATH_INFO", "/") or "/",
            raw_path,
            query,
            headers,
            environ.get("REMOTE_ADDR"),
            environ.get("wsgi.url_scheme", "http"),
        )
        if decision.route is Route.CACHE:
            return self._serve_crawler(environ, start_response, decision, started)
        if decision.route is Route.PASS:
            return self._pass(environ, start_response, decision, started)
        if decision.route is Route.PURGE:
            return _respond(start_response, self.core.purge(environ.get("REMOTE_ADDR"), headers, raw_path, query))
        if decision.route is Route.ADMIN:
            path, peer = environ.get("PATH_INFO", ""), environ.get("REMOTE_ADDR")
            response = self.admin.respond(path, method, peer, headers, _admin_body(environ))
            return _respond(start_response, response)
        if decision.route is Route.DENY:
            response = self.core.deny()
            self._count(environ, decision.verdict, "denied", started, response, reasons=decision.reasons)
            return _respond(start_response, response)
        response = plain_response(414, b"URI Too Long\n", outcome=b"pass")
        self._count(environ, HUMAN, "pass", started, response)
        return _respond(start_response, response)

    def _serve_crawler(
        self, environ: WSGIEnvironment, start_response: StartResponse, decision: Decision, started: float
    ) -> Iterable[bytes]:
        key = decision.key
        assert key is not None
        method = environ["REQUEST_METHOD"]
        now = self.core.clock()
        if self.core.note_demand(key, now):
            self._in_background(self.core.dirty.upkeep)
        found = self.cache.lookup(key)
        variant = self.core.variant_for(key, found.page if found is not None else None, decision.headers)
        if variant is not None:  # the site serves each device its own page: this device's copy
            key, found = variant, self.cache.lookup(variant)
        step = self.core.serve_or_fill(key, found, now)
        if isinstance(step, CacheHit):
            hit = b"%s-hit" % step.level.encode()
            served = page_response(step.page, method, decision.headers, outcome=hit, now=now)
            outcome = f"{step.level}-hit"
            self._count(environ, decision.verdict, outcome, started, served, step.page.generation_ms, decision.reasons)
            return _respond(start_response, served)
        spared = self.core.spare_site(decision, step.stale, method, decision.headers)
        if spared is not None:
            self._count(environ, decision.verdict, spared[1], started, spared[0], reasons=decision.reasons)
            return _respond(start_response, spared[0])
        client = self.core.client_address(
            environ.get("REMOTE_ADDR"), [(b"x-forwarded-for", environ.get("HTTP_X_FORWARDED_FOR", "").encode())]
        )
        self.origin.script_name = environ.get("SCRIPT_NAME", "")
        arrived_at = self._arrived_at = PublicSite.from_server(
            environ.get("wsgi.url_scheme", "http"), (environ.get("SERVER_NAME", ""), environ.get("SERVER_PORT"))
        )
        fetch = functools.partial(self.origin.fetch_guest, key.target, client=client, arrived_at=arrived_at)
        filled = self.filler.fill_blocking(key, fetch)
        page = filled.result if isinstance(filled.result, Page) else None
        variant = self.core.variant_for(key, page, decision.headers)
        if variant is not None:  # the page turned out to vary by device: fill this device's copy too
            fetch = functools.partial(self.origin.fetch_guest, variant.target, client=client, arrived_at=arrived_at)
            filled = self.filler.fill_blocking(variant, fetch)
            key = variant
        response, outcome = self.core.after_fill(key, filled.result, filled.error, step.stale, method, decision.headers)
        if response is None:
            return self._pass(environ, start_response, decision, started)
        self._count(environ, decision.verdict, outcome, started, response, reasons=decision.reasons)
        return _respond(start_response, response)

    def _count(
        self,
        environ: WSGIEnvironment,
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
            self.access_log.log(environ, response[0], len(response[2]), ttfb_ms, outcome, verdict, reasons)

    def _pass(
        self, environ: WSGIEnvironment, start_response: StartResponse, decision: Decision, started: float
    ) -> Iterable[bytes]:
        status_code = 0
        location = ""
        valve = self.core.valve
        client = decision.client

        def start_marked(
            status: str, headers: list[tuple[str, str]], exc_info: Any = None
        ) -> Callable[[bytes], object]:
            nonlocal status_code, location
            status_code = int(status.split(" ", 1)[0])
            if 300 <= status_code < 400:
                location = next((value for name, value in headers if name.lower() == "location"), "")
            if client is not None and any(name.lower() == "set-cookie" for name, _ in headers):
                self.core.judge.cookie_offered(client)
            if decision.key is not None and status_code < 500:  # a page's speed (not a static file's, nor an error's)
                valve.sample((time.perf_counter() - started) * 1000, decision.key.digest)
            return start_response(status, [*headers, ("X-Crawlergate", "pass")], exc_info)

        method, path = environ.get("REQUEST_METHOD", "GET"), environ.get("PATH_INFO", "/") or "/"
        form: _TeedInput | None = None
        is_form = environ.get("CONTENT_TYPE", "").lower().encode("latin-1").startswith(FORM_TYPES)
        if is_form and method in self.core.writes.methods and self.core.writes.wants_form(method, path):
            form = environ["wsgi.input"] = _TeedInput(environ["wsgi.input"])
        valve.entered()
        try:
            body = self.app(environ, start_marked)
        except BaseException:
            valve.left()
            raise

        def after_close() -> None:
            valve.left()
            self.metrics.add_origin_time(decision.kind, (time.perf_counter() - started) * 1000)
            if decision.key is not None and self.core.should_prefetch(decision, status_code):
                self._in_background(self.cache.prefetch, decision.key)
            elif method in self.core.writes.methods and 200 <= status_code < 400:
                fields = form_fields(bytes(form.copy)) if form is not None else None
                query = environ.get("QUERY_STRING", "").encode("latin-1")
                self._in_background(self.core.after_write, method, path, query, fields, location.encode("latin-1"))

        measured = _Measured(body, lambda: self.metrics.record_for(decision.verdict, "pass", started), after_close)
        if self.access_log is not None:
            access_log = self.access_log
            measured.on_done = lambda: access_log.log(
                environ, status_code, measured.sent, measured.ttfb_ms, "pass", decision.verdict, decision.reasons
            )
        return measured

    def _in_background(self, work: Callable[..., object], *args: Any) -> None:
        future = self._prefetcher.submit(work, *args)
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)


class _TeedInput:
    """``wsgi.input`` that also keeps the first FORM_BYTES the application reads."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.copy = bytearray()

    def _kept(self, data: bytes) -> bytes:
        if len(self.copy) < FORM_BYTES:
            self.copy.extend(data[: FORM_BYTES - len(self.copy)])
        return data

    def read(self, *args: Any) -> bytes:
        return self._kept(self._stream.read(*args))

    def readline(self, *args: Any) -> bytes:
        return self._kept(self._stream.readline(*args))

    def readlines(self, *args: Any) -> list[bytes]:
        return [self._kept(line) for line in self._stream.readlines(*args)]

    def __iter__(self) -> Iterator[bytes]:
        return (self._kept(line) for line in self._stream)


class _Measured:
    """Wraps a WSGI body: counts the first chunk's time, and runs a callback once the server closes it."""

    def __init__(self, body: Iterable[bytes], on_first: Callable[[], float], on_close: Callable[[], None]) -> None:
        self._body = body
        self._on_first = on_first
        self._on_close = on_close
        # With an access log: the bytes sent, the TTFB, and what to do once the body is sent whole.
        self.on_done: Callable[[], None] | None = None
        self.sent = 0
        self.ttfb_ms = -1.0

    def __iter__(self) -> Iterator[bytes]:
        first = True
        counting = self.on_done is not None
        for chunk in self._body:
            if first:
                first = False
                self.ttfb_ms = self._on_first()
            if counting:
                self.sent += len(chunk)
            yield chunk
        if first:
            self.ttfb_ms = self._on_first()

    def close(self) -> None:
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            if self.on_done is not None:
                self.on_done()
            self._on_close()


def _admin_body(environ: WSGIEnvironment) -> bytes:
    """A POST body for the admin endpoints, at most one byte past their limit (which they refuse)."""
    if environ.get("REQUEST_METHOD") != "POST":
        return b""
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    body: bytes = environ["wsgi.input"].read(min(length, MAX_BODY_BYTES + 1)) if length > 0 else b""
    return body


def _respond(start_response: StartResponse, response: Response) -> list[bytes]:
    status, headers, body = response
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Unknown"
    start_response(
        f"{status} {reason}",
        [(name.decode("latin-1"), value.decode("latin-1")) for name, value in headers],
    )
    return [body]


def _raw_target(environ: WSGIEnvironment) -> tuple[bytes, bytes]:
    """The request target as sent: gunicorn's RAW_URI or uWSGI's REQUEST_URI, else rebuilt from PATH_INFO."""
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI")
    if raw:
        path, _, query = raw.encode("latin-1").partition(b"?")
        if path.startswith(b"/"):
            return path, query
    path_info = environ.get("SCRIPT_NAME", "") + (environ.get("PATH_INFO", "") or "/")
    return quote(path_info.encode("latin-1"), safe=_PATH_SAFE).encode(), environ.get("QUERY_STRING", "").encode(
        "latin-1"
    )


def _request_headers(environ: WSGIEnvironment) -> list[tuple[bytes, bytes]]:
    headers = []
    for name, value in environ.items():
        if name.startswith("HTTP_"):
            headers.append((name[5:].replace("_", "-").lower().encode("latin-1"), str(value).encode("latin-1")))
    return headers
