"""CrawlerGateWSGI: the gate for WSGI sites (Flask, Django under gunicorn or uWSGI); synchronous.

The same flow (``gate/flow.py``), decisions, headers and stores as the ASGI middleware; this adapter
performs the flow's steps in the request's thread. Guest pages come from calling the wrapped WSGI
app in-process; concurrent misses for one key share one call (threads wait on the leader). A
human's page view prefetches after the response is closed, in a small background pool, so it never
delays the person.

    application = CrawlerGateWSGI(django_application, settings=load_settings())
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

from crawlergate.adapters.base import GateAdapter
from crawlergate.adapters.inapp import WsgiOrigin, wsgi_server_address
from crawlergate.admin.endpoints import MAX_BODY_BYTES
from crawlergate.cache import CacheHit, TwoLevelCache
from crawlergate.classify import Classifier
from crawlergate.config import Settings
from crawlergate.gate.answer import Response
from crawlergate.gate.fill import FillResult
from crawlergate.gate.flow import PASS_HEADER_TEXT, Passing, run_blocking
from crawlergate.gate.origin import OriginResponse
from crawlergate.gate.request import Decision, Request, Route
from crawlergate.gate.writes import FORM_BYTES
from crawlergate.keys import CacheKey
from crawlergate.regenerate.schedule import start_background_scheduler
from crawlergate.wiring import GateRuntime

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

# Background work is small (a write's marks, an L2 hit's copy into L1): two threads keep up with a busy site.
BACKGROUND_THREADS = 2
_PATH_SAFE = "/:@!$&'()*+,;=~"
T = TypeVar("T")


class CrawlerGateWSGI(GateAdapter):
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
        # The access log is off unless log.access_log names a file (the WSGI server usually keeps its own).
        fetch = self._fetch_for_regeneration
        super().__init__(GateRuntime(settings, fetch_for_regeneration=fetch, cache=cache, classifier=classifier,
                                     clock=clock, app=app))  # fmt: skip
        self.origin = WsgiOrigin.for_gate(app, settings, self.core.public, self.core.devices)
        self._pool = ThreadPoolExecutor(max_workers=BACKGROUND_THREADS, thread_name_prefix="crawlergate-background")
        self._pending: set[Future[object]] = set()
        self._scheduling_lock = threading.Lock()

    def start(self) -> None:
        """Prepare the stores; the access log opens at the first request, after a pre-forking server forked."""
        self.runtime.start(access_log=False)

    def _start_schedule(self) -> None:
        """Start the gate, and the off-peak job in a thread of its own, at the first request: after a pre-forking
        server (gunicorn --preload) has forked, since threads do not survive a fork."""
        with self._scheduling_lock:
            if not self._scheduling:
                self._scheduling = True
                self.runtime.start_schedule(start_background_scheduler)

    def _fetch_for_regeneration(self, key: CacheKey) -> Awaitable[OriginResponse]:
        return self.origin.fetch_guest_from_loop(key.target, arrived_at=self._arrived_at)

    def drain(self) -> None:
        """Wait for the prefetches and background work queued so far."""
        for future in list(self._pending):
            future.result()
        self.flow.prefetcher.drain()

    def close(self) -> None:
        """Stop the off-peak job (a pass under way ends its fetches first), finish queued prefetches and release
        everything the gate opened."""
        self.runtime.close(wait_s=self.settings.cache.fill_timeout_seconds + 5, drain=self._drain_for_close)

    def _drain_for_close(self) -> None:
        self.origin.close()
        self._pool.shutdown(wait=True)  # queued marks, while the stores are open

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if not self._scheduling:
            self._start_schedule()
        started = time.perf_counter()
        raw_path, query = _raw_target(environ)
        request = Request(
            environ.get("REQUEST_METHOD", "GET"),
            environ.get("PATH_INFO", "/") or "/",
            raw_path,
            query,
            _request_headers(environ),
            environ.get("REMOTE_ADDR"),
            environ.get("wsgi.url_scheme", "http"),
            environ.get("SERVER_PROTOCOL", "HTTP/1.1").removeprefix("HTTP/"),
        )
        decision = self.core.decide(request)
        if decision.route is Route.ADMIN:
            body = _admin_body(environ)
            return _respond(start_response, self.admin.respond(request.path, request.method, request.peer,
                                                               request.headers, body))  # fmt: skip
        answer = run_blocking(self.flow.answer(request, decision), self, environ)
        if answer is None:
            return self._pass(environ, start_response, request, decision, started)
        self.flow.finish(request, decision, answer, started)
        return _respond(start_response, answer.response)

    # The flow's steps, all in the request's thread.

    async def lookup_l2(self, key: CacheKey) -> CacheHit | None:
        return self.cache.lookup_l2(key)

    async def fill(self, key: CacheKey, client: str | None, environ: WSGIEnvironment) -> FillResult:
        mount = self.origin.mounted_as(environ)
        arrived_at = self._arrived_at = wsgi_server_address(environ) or self._arrived_at
        fetch = functools.partial(
            self.origin.fetch_guest, key.target, client=client, arrived_at=arrived_at, mount=mount
        )
        return self.filler.fill_blocking(key, fetch)

    async def blocking(self, work: Callable[[], T]) -> T:
        return work()

    def background(self, work: Callable[[], object]) -> None:
        future = self._pool.submit(work)
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)

    def _pass(
        self,
        environ: WSGIEnvironment,
        start_response: StartResponse,
        request: Request,
        decision: Decision,
        started: float,
    ) -> Iterable[bytes]:
        """Pass the request to the site, watched by the flow (marked, measured, counted, logged)."""
        passing = self.flow.passing(request, decision, started)

        def start_marked(
            status: str, headers: list[tuple[str, str]], exc_info: Any = None
        ) -> Callable[[bytes], object]:
            passing.answered(int(status.split(" ", 1)[0]), headers)
            return start_response(status, [*headers, PASS_HEADER_TEXT], exc_info)

        try:
            if passing.wants_form(lambda: environ.get("CONTENT_TYPE", "").encode("latin-1")):
                teed = environ["wsgi.input"] = _TeedInput(environ["wsgi.input"])
                passing.form = teed.copy
            body = self.app(environ, start_marked)
        except BaseException:
            passing.left()
            raise
        return _Watched(body, passing, self.background)


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


class _Watched:
    """Wraps a WSGI body: tells the flow's Passing of each piece sent, and that it is done once the server closes
    it."""

    def __init__(self, body: Iterable[bytes], passing: Passing, background: Callable[[Callable[[], object]], None]):
        self._body = body
        self._passing = passing
        self._background = background

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._body:
            self._passing.body(len(chunk))
            yield chunk

    def close(self) -> None:
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            self._passing.finished()
            self._passing.left()
            after = self._passing.follow_up()
            if after is not None:
                self._background(after)


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
        # A fragment is the client's own (RFC 9110 7.1): gunicorn keeps one a client sent, PATH_INFO does not.
        path, _, query = raw.encode("latin-1").partition(b"#")[0].partition(b"?")
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
