"""In-process origins: a fill asks the wrapped app itself, called as ASGI or WSGI in the same process.

In a mounted gate the app is the site; in the standalone proxy it is the reverse-proxy app, so there
is one code path. A direct call (rather than ``httpx.ASGITransport``, which buffers whole bodies)
enforces the size limit while the body streams, and the deadline on in-process apps. Failures become
OriginError here, once.

    origin = AsgiOrigin(site, public=PublicSite.from_url("https://forum.example"), max_bytes=2**23)
    response = await origin.fetch_guest("/showthread.php?t=12", client="203.0.113.7")
"""

from __future__ import annotations

import asyncio
import functools
import io
import ipaddress
import logging
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_to_bytes

import anyio
from starlette.types import ASGIApp, Message, Scope

from crawlergate.errors import OriginError, OriginTimeout
from crawlergate.gate.origin import (
    DEFAULT_FILL_CLIENT,
    FILL_EXTENSION,
    GuestBody,
    OriginResponse,
    PassedOn,
    PublicSite,
    content_type_of,
    fill_client,
    fill_headers,
    fill_target,
    public_site,
)
from crawlergate.throttle import Throttle

# An app's own way to answer a fill's scope: status, headers, the body into GuestBody, whether it came whole.
FetchForFill = Callable[[Scope, GuestBody], Awaitable[tuple[int, list[tuple[bytes, bytes]], bool]]]

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIApplication

    from crawlergate.config import Settings
    from crawlergate.devices import DeviceClasses

logger = logging.getLogger(__name__)


class AsgiOrigin:
    """Fetches guest pages from an ASGI app.

    Parameters:
        app: the site, or the standalone proxy's forwarding app.
        public: the public site; None takes the address the request arrived on (a mounted gate without
            ``server.public_url``) and the origin's address in the proxy.
        fill_client_address: X-Forwarded-For of fills that no outside client triggered.
        timeout_s: the whole fetch, first byte to last.
        max_bytes: a larger body raises PageTooLarge.
        devices: the device classes whose copies of a page are fetched with their own user agent.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        public: PublicSite | None,
        fill_client_address: str = DEFAULT_FILL_CLIENT,
        timeout_s: float = 30.0,
        max_bytes: int,
        devices: DeviceClasses | None = None,
    ) -> None:
        self._app = app
        self.public = public
        self._fill_client = fill_client_address
        # The server addresses fills asked as, without a public URL (each said once).
        self._asked_as: set[str] = set()
        self._said = _AppErrors()
        # Fills' app calls still at work after their page ended (background tasks), held until they end.
        self._after_pages: set[asyncio.Future[None]] = set()
        self._timeout_s = timeout_s
        self._max_bytes = max_bytes
        self._devices = devices
        # Where the site is mounted (the requests' ``root_path``, as the adapter last saw it): fills are
        # called as mounted, or a site under /blog answers /blog/post with its 404.
        self.root_path = ""
        # What the server and the layers around the gate put in the requests' scopes for the app, as last seen: the
        # lifespan's state (copied for each fill, as servers copy it for each request) and the app around the gate
        # (Starlette's ``add_middleware``): a page reading ``request.state.db`` or ``request.app`` fails without.
        self.lifespan_state: dict[str, Any] | None = None
        self.outer_app: object = None
        # An app that answers a fill without ASGI's messages (the reverse proxy) is asked so: a third of a miss's
        # time went to the messages, closures and event of a call the proxy turned back into one exchange.
        self._fetch_for_fill: FetchForFill | None = getattr(app, "fetch_for_fill", None)

    def saw(self, scope: Scope) -> None:
        """Take what fills need of a request's scope: where the site is mounted, its lifespan state, the app."""
        self.root_path = scope.get("root_path", "")
        self.lifespan_state = scope.get("state")
        self.outer_app = scope.get("app")

    @classmethod
    def for_gate(
        cls, app: ASGIApp, settings: Settings, public: PublicSite | None, devices: DeviceClasses
    ) -> AsgiOrigin:
        """The origin of a gate mounted around ``app``, as its settings say."""
        return cls(
            app,
            public=public,
            fill_client_address=settings.server.fill_client_address,
            timeout_s=settings.cache.fill_timeout_seconds,
            max_bytes=settings.l2.page_max_bytes,
            devices=devices,
        )

    async def fetch_guest(
        self, target: str, *, client: str | None = None, arrived_at: PublicSite | None = None
    ) -> OriginResponse:
        """GET ``target`` (a normalised path and query) as an anonymous guest of the public site.

        ``client`` is the address of the visitor the fill is for; ``arrived_at`` the site the request
        was sent to, used only when no public site is configured.
        """
        public = public_site(self.public, arrived_at, target, self._asked_as)
        try:
            async with asyncio.timeout(self._timeout_s):  # anyio's fail_after cost a miss 30 us more
                return await self._call(target, public, fill_client(client, self._fill_client))
        except TimeoutError as exc:
            raise OriginTimeout(f"{target}: the site did not answer within {self._timeout_s:g} s") from exc

    async def _call(self, target: str, public: PublicSite, client: str) -> OriginResponse:
        url, user_agent = fill_target(target, self._devices)
        raw_path, _, query = url.encode("latin-1", "replace").partition(b"?")
        host, _, port = public.host.rpartition(":") if public.host.count(":") == 1 else (public.host, "", "")
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": public.scheme,
            "path": unquote_to_bytes(raw_path).decode("utf-8", "replace"),
            "raw_path": raw_path,
            "query_string": query,
            "root_path": self.root_path,
            "headers": [
                (name.encode(), value.encode("latin-1")) for name, value in fill_headers(public, client, user_agent)
            ],
            "client": (client, 0),
            "server": (host, int(port) if port.isdigit() else (443 if public.scheme == "https" else 80)),
            "state": {} if self.lifespan_state is None else self.lifespan_state.copy(),
            "extensions": {FILL_EXTENSION: {}},
        }
        if self.outer_app is not None:
            scope["app"] = self.outer_app
        body = GuestBody(target, self._max_bytes)
        try:
            if self._fetch_for_fill is not None:
                status, raw_headers, complete = await self._fetch_for_fill(scope, body)
            else:
                status, raw_headers, complete = await self._exchange(scope, body)
        except OriginError:
            raise
        except Exception as exc:
            error = _origin_error(target, exc)
            if not isinstance(error, PassedOn):
                self._said.exception(error, exc)
            raise error from exc
        headers = ((name.decode("latin-1").lower(), value.decode("latin-1")) for name, value in raw_headers)
        return body.response(status, headers, finished=complete)

    async def _exchange(self, scope: Scope, body: GuestBody) -> tuple[int, list[tuple[bytes, bytes]], bool]:
        """Call the app with the fill's ``scope``: its status and headers, its body into ``body``, whether whole."""
        start: Message | None = None
        request_sent = False
        finished = anyio.Event()

        async def receive() -> Message:
            nonlocal request_sent
            if not request_sent:
                request_sent = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await finished.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
                body.started(content_type_of(message.get("headers", ())))
            elif message["type"] == "http.response.body" and not finished.is_set():
                body.add(message.get("body", b""))
                if not message.get("more_body", False):
                    finished.set()

        # The page is whole at its last body message: an app's work after it (Starlette's background tasks, an
        # email sent) goes on without the crawler waiting for it, as a server's client does not.
        call = asyncio.ensure_future(self._app(scope, receive, send))
        ended = asyncio.ensure_future(finished.wait())
        try:
            await asyncio.wait((call, ended), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            call.cancel()
            raise
        finally:
            ended.cancel()
        complete = finished.is_set()
        if call.done() and not complete:
            call.result()  # the app's own exception, if it raised before its page ended
        elif call.done():
            self._after_page_done(call)
        else:
            self._after_pages.add(call)
            call.add_done_callback(self._after_page_done)
        finished.set()
        if start is None:
            raise OriginError(f"{body.target}: the site sent no response")
        return int(start["status"]), start["headers"], complete

    def _after_page_done(self, call: asyncio.Future[None]) -> None:
        self._after_pages.discard(call)
        if not call.cancelled() and call.exception() is not None:
            error = call.exception()
            assert error is not None
            self._said.exception(OriginError(f"the site raised once a fill's answer had ended: {error!r}"), error)


# What ``WsgiOrigin.mounted_as`` says of a request mounted by a header: no SCRIPT_NAME holds a NUL.
HEADER_MOUNT = "\x00header"


class HeaderMounted(PassedOn):
    """Raised for a fill of a request whose SCRIPT_NAME came from a request header: the crawler gets the site."""

    reason = "script-name-header"
    of_the_page = False


class WsgiOrigin:
    """Fetches guest pages from a WSGI app (synchronous; the deadline is the app server's to enforce)."""

    def __init__(
        self,
        app: WSGIApplication,
        *,
        public: PublicSite | None,
        fill_client_address: str = DEFAULT_FILL_CLIENT,
        max_bytes: int,
        devices: DeviceClasses | None = None,
        threads_from_loop: int = 2,
        timeout_s: float = 30.0,
    ) -> None:
        self._app = app
        self.public = public
        self._fill_client = fill_client_address
        # The server addresses fills asked as, without a public URL (each said once).
        self._asked_as: set[str] = set()
        self._said = _AppErrors()
        self._max_bytes = max_bytes
        self._devices = devices
        self._timeout_s = timeout_s
        # Where the site is mounted (the requests' SCRIPT_NAME, as the adapter last saw it): see AsgiOrigin.
        self.script_name = ""
        self._from_loop = ThreadPoolExecutor(max_workers=threads_from_loop, thread_name_prefix="crawlergate-wsgi-fetch")

    @classmethod
    def for_gate(
        cls, app: WSGIApplication, settings: Settings, public: PublicSite | None, devices: DeviceClasses
    ) -> WsgiOrigin:
        """The origin of a gate mounted around ``app``, as its settings say."""
        return cls(
            app,
            public=public,
            fill_client_address=settings.server.fill_client_address,
            max_bytes=settings.l2.page_max_bytes,
            devices=devices,
            threads_from_loop=settings.regenerate.concurrency,
            timeout_s=settings.cache.fill_timeout_seconds,
        )

    async def fetch_guest_from_loop(self, target: str, *, arrived_at: PublicSite | None) -> OriginResponse:
        """``fetch_guest`` for an event loop (regeneration), in a thread of its own pool: a site that hangs keeps
        that thread, never the caller, which gets OriginTimeout after ``timeout_s``."""
        call = functools.partial(self.fetch_guest, target, client=None, arrived_at=arrived_at)
        answer = asyncio.get_running_loop().run_in_executor(self._from_loop, call)
        try:
            return await asyncio.wait_for(answer, self._timeout_s)
        except TimeoutError:
            raise OriginTimeout(f"{target}: the site did not answer in time") from None

    def close(self) -> None:
        self._from_loop.shutdown(wait=False, cancel_futures=True)

    def mounted_as(self, environ: dict[str, Any]) -> str:
        """Where a fill for this request finds the site mounted: the request's SCRIPT_NAME, remembered for
        regeneration; ``HEADER_MOUNT`` when a request header set it (gunicorn takes a SCRIPT_NAME header from its
        forwarded_allow_ips, ProxyFix an X-Forwarded-Prefix), for a client's header must never decide which page
        is stored under a URL."""
        if "HTTP_SCRIPT_NAME" in environ or _as_served(environ).get("SCRIPT_NAME") != environ.get("SCRIPT_NAME"):
            return HEADER_MOUNT  # gunicorn's SCRIPT_NAME header, or ProxyFix's X-Forwarded-Prefix
        self.script_name = environ.get("SCRIPT_NAME", "")
        return self.script_name

    def fetch_guest(
        self,
        target: str,
        *,
        client: str | None = None,
        arrived_at: PublicSite | None = None,
        mount: str | None = None,
    ) -> OriginResponse:
        """GET ``target`` as an anonymous guest of the public site (see AsgiOrigin.fetch_guest), with the site
        mounted at ``mount`` (``mounted_as``; None: where requests last found it)."""
        if mount == HEADER_MOUNT:
            raise HeaderMounted(f"{target}: mounted by a SCRIPT_NAME request header, which a client may send")
        public = public_site(self.public, arrived_at, target, self._asked_as)
        address = fill_client(client, self._fill_client)
        url, user_agent = fill_target(target, self._devices)
        raw_path, _, query = url.partition("?")
        name, _, port = public.host.rpartition(":") if public.host.count(":") == 1 else (public.host, "", "")
        mounted_at = self.script_name if mount is None else mount
        script_name, path_info = _mounted(mounted_at, unquote_to_bytes(raw_path).decode("latin-1"))
        environ: dict[str, Any] = {
            "REQUEST_METHOD": "GET",
            "SCRIPT_NAME": script_name,
            "PATH_INFO": path_info,
            "QUERY_STRING": query,
            "RAW_URI": url,
            "SERVER_NAME": name,
            "SERVER_PORT": port or ("443" if public.scheme == "https" else "80"),
            "SERVER_PROTOCOL": "HTTP/1.1",
            "REMOTE_ADDR": address,
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": public.scheme,
            "wsgi.input": io.BytesIO(b""),
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": True,
            "wsgi.run_once": False,
            FILL_EXTENSION: True,
        }
        for header, value in fill_headers(public, address, user_agent):
            environ["HTTP_" + header.upper().replace("-", "_")] = value
        started: list[tuple[str, list[tuple[str, str]]]] = []
        body = GuestBody(target, self._max_bytes)

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], Any]:
            started[:] = [(status, headers)]
            body.started(next((value for name, value in headers if name.lower() == "content-type"), ""))
            return body.add

        result: Iterable[bytes] | None = None
        try:
            result = self._app(environ, start_response)
            # The caller stops waiting at the fill's timeout, but this thread goes on while the body comes: one that
            # never ends (a long poll) would hold it, and past the pool's threads every fill. A page the app was
            # slow to begin is still read whole, and stored for the crawlers after.
            deadline = time.monotonic() + self._timeout_s
            for chunk in result:
                body.add(chunk)
                if time.monotonic() > deadline:
                    raise OriginTimeout(f"{target}: the site did not finish within {self._timeout_s:g} s")
        except OriginError:
            raise
        except Exception as exc:
            error = OriginError(f"{target}: the site raised {type(exc).__name__}: {exc}")
            self._said.exception(error, exc)
            raise error from exc
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        if not started:
            raise OriginError(f"{target}: the site sent no response")
        status, headers = started[0]
        return body.response(int(status.split(" ", 1)[0]), ((name.lower(), value) for name, value in headers))


class _AppErrors:
    """An app's exception in a fill, logged with its traceback once a minute at most: the crawler gets 502, and the
    server logs nothing of it (the fill is no request of its)."""

    def __init__(self) -> None:
        self._throttle = Throttle(60.0)
        self._unsaid = 0

    def exception(self, error: OriginError, raised: BaseException) -> None:
        self._unsaid += 1
        if self._throttle.due():
            logger.error("%s (%d fill(s) failed since the last such line)", error, self._unsaid, exc_info=raised)
            self._unsaid = 0


def wsgi_server_address(environ: dict[str, Any]) -> PublicSite | None:
    """The server's own address a WSGI request came to, for fills to ask as without ``server.public_url``:
    ``SERVER_ADDR`` where the server names its socket (Apache, nginx's uwsgi and FastCGI parameters), else
    ``SERVER_NAME`` on a TCP connection (gunicorn, waitress, wsgiref: the address they listen on). None on a
    unix socket, where gunicorn makes ``SERVER_NAME`` of the client's Host: a fill must never ask as that."""
    served = _as_served(environ)
    scheme, port = served.get("wsgi.url_scheme", "http"), served.get("SERVER_PORT")
    if served.get("SERVER_ADDR"):
        return PublicSite.from_server(scheme, (served["SERVER_ADDR"], port))
    if getattr(environ.get("gunicorn.socket"), "family", None) == socket.AF_UNIX:
        return None  # even when the PROXY protocol gave it a client address
    try:
        ipaddress.ip_address(served.get("REMOTE_ADDR") or "")
    except ValueError:
        return None
    return PublicSite.from_server(scheme, (served.get("SERVER_NAME", ""), port))


def _as_served(environ: dict[str, Any]) -> dict[str, Any]:
    """The environ as the server made it: werkzeug's ProxyFix keeps the values it replaced from request headers
    (X-Forwarded-For, -Host, -Prefix) aside, and a header a client may write never names the site to a fill."""
    original = environ.get("werkzeug.proxy_fix.orig")
    return {**environ, **original} if isinstance(original, dict) else environ


def _mounted(script_name: str, path: str) -> tuple[str, str]:
    """SCRIPT_NAME and PATH_INFO of ``path`` for an app mounted at ``script_name`` (PEP 3333)."""
    if script_name and (path == script_name or path.startswith(script_name + "/")):
        return script_name, path[len(script_name) :]
    return "", path


def _origin_error(target: str, exc: Exception) -> OriginError:
    """What an app's exception means for a fill: an OriginError of ours raised inside a task group (the proxy
    streams in one, and the size limit is enforced as the body arrives) is that error, not the site's."""
    if isinstance(exc, ExceptionGroup):
        ours, _ = exc.split(OriginError)
        if ours is not None:
            first = ours.exceptions[0]
            return first if isinstance(first, OriginError) else _origin_error(target, first)
    return OriginError(f"{target}: the site raised {type(exc).__name__}: {exc}")
