"""Guest sub-requests: the public guest copy of a URL, asked of the wrapped app in-process.

A fill looks like an anonymous outside visitor of the public site: no Cookie, no Authorization, no
client forwarding headers of its own; ``Host``, ``X-Forwarded-Host`` and ``X-Forwarded-Proto`` from
``server.public_url``; ``X-Forwarded-For`` the address of the client it fetches for, or a
documentation address (never loopback, so no page is fetched with local rights); and
``Accept-Encoding: gzip``, whose answer is stored as it came once it is known to be whole. The app
is called directly, ASGI or WSGI, in the same process: in a mounted gate it is the site, in the
standalone proxy it is the reverse-proxy app, so there is one code path. A direct call (rather
than ``httpx.ASGITransport``, which buffers whole bodies) enforces the size limit while the body
streams and the deadline on in-process apps. Failures become OriginError here, once.

    origin = AsgiOrigin(site, public=PublicSite.from_url("https://forum.example"), max_bytes=2**23)
    response = await origin.fetch_guest("/showthread.php?t=12", client="203.0.113.7")
"""

from __future__ import annotations

import io
import ipaddress
import sys
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_to_bytes, urlsplit

import anyio
from starlette.types import ASGIApp, Message

from crawlergate import __version__
from crawlergate.errors import OriginError, OriginTimeout

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIApplication

    from crawlergate.devices import DeviceClasses

GUEST_USER_AGENT = f"crawlergate/{__version__} (guest page fill)"
_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
# The ASGI scope extension that tells the reverse proxy a request is the gate's own fill, whose
# forwarding headers were set by the gate and are sent on as they are.
FILL_EXTENSION = "crawlergate.fill"
# RFC 5737 TEST-NET-1: an address no real client has, for fills no outside client triggered.
DEFAULT_FILL_CLIENT = "192.0.2.1"


class PageTooLarge(OriginError):
    """Raised when a guest page exceeds the size limit, likely a download rather than a page."""


@dataclass(frozen=True, slots=True)
class PublicSite:
    """The site as the world sees it: the Host and scheme a fill carries."""

    scheme: str
    host: str

    @classmethod
    def from_url(cls, url: str) -> PublicSite:
        parts = urlsplit(url)
        return cls(parts.scheme or "http", parts.netloc)

    @classmethod
    def from_server(cls, scheme: str, server: tuple[str, int | str | None] | list[Any]) -> PublicSite:
        """The site at a server's own address (the ASGI ``server`` pair, or SERVER_NAME and SERVER_PORT)."""
        host, port = server[0], server[1]
        name = f"[{host}]" if ":" in host else host
        default = "443" if scheme == "https" else "80"
        return cls(scheme, name if port is None or str(port) == default else f"{name}:{port}")

    @property
    def base(self) -> str:
        return f"{self.scheme}://{self.host}"


@dataclass(frozen=True, slots=True)
class OriginResponse:
    """What the site answered to a guest sub-request; header names are lower-case.

    ``body`` is decoded; ``body_gz`` holds the site's own gzip bytes when it sent gzip (already
    checked by decoding). ``complete`` is False when the body ended before the site said it was
    done or before its Content-Length: such a body is never stored.
    """

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    body_gz: bytes | None = None
    complete: bool = True

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def all(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key == name]


class _BodyCollector:
    def __init__(self, target: str, max_bytes: int) -> None:
        self.target = target
        self.max_bytes = max_bytes
        self.chunks: list[bytes] = []
        self.size = 0

    def add(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.max_bytes:
            raise PageTooLarge(f"{self.target}: more than {self.max_bytes} bytes")
        self.chunks.append(chunk)

    def response(self, status: int, headers: Iterable[tuple[str, str]], *, finished: bool = True) -> OriginResponse:
        listed = tuple(headers)
        raw = b"".join(self.chunks)
        length = next((value.strip() for name, value in listed if name == "content-length"), None)
        complete = finished and (length is None or not length.isdigit() or int(length) == len(raw))
        return _decoded(self.target, OriginResponse(status, listed, raw, complete=complete), self.max_bytes)


def fill_headers(public: PublicSite, client: str, user_agent: str = GUEST_USER_AGENT) -> list[tuple[str, str]]:
    """The request headers of a fill, as a visitor of the public site would arrive through a front proxy."""
    return [
        ("host", public.host),
        ("x-forwarded-host", public.host),
        ("x-forwarded-proto", public.scheme),
        ("x-forwarded-for", client),
        ("user-agent", user_agent),
        ("accept", _ACCEPT),
        ("accept-encoding", "gzip"),
    ]


def fill_client(address: str | None, default: str) -> str:
    """The address a fill fetches for: the requesting client's, unless there is none or it is local."""
    if not address:
        return default
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return default
    return default if ip.is_loopback or ip.is_unspecified else address


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
        self._timeout_s = timeout_s
        self._max_bytes = max_bytes
        self._devices = devices
        # Where the site is mounted (the requests' ``root_path``, as the adapter last saw it): fills are
        # called as mounted, or a site under /blog answers /blog/post with its 404.
        self.root_path = ""

    async def fetch_guest(
        self, target: str, *, client: str | None = None, arrived_at: PublicSite | None = None
    ) -> OriginResponse:
        """GET ``target`` (a normalised path and query) as an anonymous guest of the public site.

        ``client`` is the address of the visitor the fill is for; ``arrived_at`` the site the request
        was sent to, used only when no public site is configured.
        """
        public = _public_site(self.public or arrived_at, target)
        try:
            with anyio.fail_after(self._timeout_s):
                return await self._call(target, public, fill_client(client, self._fill_client))
        except TimeoutError as exc:
            raise OriginTimeout(f"{target}: the site did not answer within {self._timeout_s:g} s") from exc

    async def _call(self, target: str, public: PublicSite, client: str) -> OriginResponse:
        url, user_agent = _fill_target(target, self._devices)
        raw_path, _, query = url.encode("latin-1", "replace").partition(b"?")
        host, _, port = public.host.rpartition(":") if public.host.count(":") == 1 else (public.host, "", "")
        scope = {
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
            "state": {},
            "extensions": {FILL_EXTENSION: {}},
        }
        body = _BodyCollector(target, self._max_bytes)
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
            elif message["type"] == "http.response.body" and not finished.is_set():
                body.add(message.get("body", b""))
                if not message.get("more_body", False):
                    finished.set()

        try:
            await self._app(scope, receive, send)
        except OriginError:
            raise
        except Exception as exc:
            raise _origin_error(target, exc) from exc
        complete = finished.is_set()
        finished.set()
        if start is None:
            raise OriginError(f"{target}: the site sent no response")
        headers = ((name.decode("latin-1").lower(), value.decode("latin-1")) for name, value in start["headers"])
        return body.response(int(start["status"]), headers, finished=complete)


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
    ) -> None:
        self._app = app
        self.public = public
        self._fill_client = fill_client_address
        self._max_bytes = max_bytes
        self._devices = devices
        # Where the site is mounted (the requests' SCRIPT_NAME, as the adapter last saw it): see AsgiOrigin.
        self.script_name = ""

    def fetch_guest(
        self, target: str, *, client: str | None = None, arrived_at: PublicSite | None = None
    ) -> OriginResponse:
        """GET ``target`` as an anonymous guest of the public site (see AsgiOrigin.fetch_guest)."""
        public = _public_site(self.public or arrived_at, target)
        address = fill_client(client, self._fill_client)
        url, user_agent = _fill_target(target, self._devices)
        raw_path, _, query = url.partition("?")
        name, _, port = public.host.rpartition(":") if public.host.count(":") == 1 else (public.host, "", "")
        script_name, path_info = _mounted(self.script_name, unquote_to_bytes(raw_path).decode("latin-1"))
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
        body = _BodyCollector(target, self._max_bytes)

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], Any]:
            started[:] = [(status, headers)]
            return body.add

        result: Iterable[bytes] | None = None
        try:
            result = self._app(environ, start_response)
            for chunk in result:
                body.add(chunk)
        except OriginError:
            raise
        except Exception as exc:
            raise OriginError(f"{target}: the site raised {type(exc).__name__}: {exc}") from exc
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        if not started:
            raise OriginError(f"{target}: the site sent no response")
        status, headers = started[0]
        return body.response(int(status.split(" ", 1)[0]), ((name.lower(), value) for name, value in headers))


def _fill_target(target: str, devices: DeviceClasses | None) -> tuple[str, str]:
    """The URL a fill asks for, and its user agent: a device copy's target ends in ``#class`` (devices.py)."""
    url, _, device_name = target.partition("#")
    device = devices.named(device_name) if device_name and devices is not None else None
    if device is None:
        return url, GUEST_USER_AGENT
    return url, f"{device.fill_user_agent} {GUEST_USER_AGENT}"


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


def _public_site(public: PublicSite | None, target: str) -> PublicSite:
    if public is None:
        raise OriginError(
            f"{target}: no server.public_url, and the request named no server address to ask as; set server.public_url"
        )
    return public


def _decoded(target: str, response: OriginResponse, max_bytes: int) -> OriginResponse:
    """Decode the body the site compressed; its gzip bytes, once known to be whole, are kept to be stored.

    The size limit holds for the decoded body too: a small gzip can inflate a thousandfold (a "bomb").
    """
    encoding = (response.header("content-encoding") or "identity").strip().lower()
    if encoding == "identity" or not response.complete:
        return response
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise OriginError(f"{target}: the site answered in {encoding!r}, which a fill did not ask for")
    try:
        if encoding == "deflate":
            try:
                body = _inflate(response.body, max_bytes)
            except zlib.error:
                body = _inflate(response.body, max_bytes, raw_deflate=True)
            body_gz = None
        else:
            body, body_gz = _inflate(response.body, max_bytes, gzip_wrapped=True), response.body
    except zlib.error as exc:
        raise OriginError(f"{target}: the site sent a broken {encoding} body: {exc}") from exc
    if body is None:
        raise PageTooLarge(f"{target}: more than {max_bytes} bytes once decompressed")
    headers = tuple((k, v) for k, v in response.headers if k not in ("content-encoding", "content-length"))
    return OriginResponse(response.status, headers, body, body_gz=body_gz, complete=True)


def _inflate(data: bytes, max_bytes: int, *, gzip_wrapped: bool = False, raw_deflate: bool = False) -> bytes | None:
    """Decompress at most ``max_bytes`` (None past that); raises zlib.error on a broken or cut stream.

    gzip may hold several members, one after the other (RFC 1952); "deflate" is zlib-wrapped by the
    standard (RFC 9110 8.4.1.2), but some servers send it raw.
    """
    wbits = zlib.MAX_WBITS | 16 if gzip_wrapped else -zlib.MAX_WBITS if raw_deflate else zlib.MAX_WBITS
    parts: list[bytes] = []
    size = 0
    rest = data
    while rest:
        inflater = zlib.decompressobj(wbits)
        part = inflater.decompress(rest, max_bytes + 1 - size)
        size += len(part)
        if size > max_bytes:
            return None
        if not inflater.eof:
            if inflater.unconsumed_tail:
                return None  # stopped at the limit with input left: larger than allowed
            raise zlib.error("the compressed stream ends early")
        parts.append(part)
        rest = inflater.unused_data if gzip_wrapped else b""
    return b"".join(parts)
