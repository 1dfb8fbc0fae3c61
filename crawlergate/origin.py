"""Guest sub-requests: the public guest copy of a URL, asked of the wrapped app in-process.

The request carries a fixed, sanitised header set (no Cookie, no Authorization, no client
forwarding headers, the canonical Host), so what is stored is exactly the guest page of the key.
The app is called directly, ASGI or WSGI, in the same process: in a mounted gate it is the site,
in the standalone proxy it is the reverse-proxy app, so there is one code path. A direct call
(rather than ``httpx.ASGITransport``, which buffers whole bodies) enforces the size limit while
the body streams and the deadline on in-process apps. Failures become OriginError here, once.

    origin = AsgiOrigin(site, canonical_host="forum.example")
    response = await origin.fetch_guest("/showthread.php?t=12")
"""

from __future__ import annotations

import gzip
import io
import sys
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_to_bytes

import anyio
from starlette.types import ASGIApp, Message

from crawlergate import __version__
from crawlergate.errors import OriginError, OriginTimeout

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIApplication

GUEST_USER_AGENT = f"crawlergate/{__version__} (guest page fill)"
_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


class PageTooLarge(OriginError):
    """Raised when a guest page exceeds the size limit, likely a download rather than a page."""


@dataclass(frozen=True, slots=True)
class OriginResponse:
    """What the site answered to a guest sub-request; header names are lower-case."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes

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

    def response(self, status: int, headers: Iterable[tuple[str, str]]) -> OriginResponse:
        return _decoded(OriginResponse(status, tuple(headers), b"".join(self.chunks)))


class AsgiOrigin:
    """Fetches guest pages from an ASGI app.

    Parameters:
        app: the site, or the standalone proxy's forwarding app.
        canonical_host: the Host header of every guest request.
        timeout_s: the whole fetch, first byte to last.
        max_bytes: a larger body raises PageTooLarge.
    """

    def __init__(
        self, app: ASGIApp, *, canonical_host: str, scheme: str = "http", timeout_s: float = 30.0, max_bytes: int
    ) -> None:
        self._app = app
        self._scheme = scheme
        self._timeout_s = timeout_s
        self._max_bytes = max_bytes
        self._headers = [
            (b"host", canonical_host.encode("idna")),
            (b"user-agent", GUEST_USER_AGENT.encode()),
            (b"accept", _ACCEPT.encode()),
            (b"accept-encoding", b"identity"),
        ]

    async def fetch_guest(self, target: str) -> OriginResponse:
        """GET ``target`` (a normalised path and query) as an anonymous guest."""
        try:
            with anyio.fail_after(self._timeout_s):
                return await self._call(target)
        except TimeoutError as exc:
            raise OriginTimeout(f"{target}: the site did not answer within {self._timeout_s:g} s") from exc

    async def _call(self, target: str) -> OriginResponse:
        raw_path, _, query = target.encode("latin-1", "replace").partition(b"?")
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": self._scheme,
            "path": unquote_to_bytes(raw_path).decode("utf-8", "replace"),
            "raw_path": raw_path,
            "query_string": query,
            "root_path": "",
            "headers": list(self._headers),
            "client": ("127.0.0.1", 0),
            "server": ("127.0.0.1", 80),
            "state": {},
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
            elif message["type"] == "http.response.body":
                body.add(message.get("body", b""))
                if not message.get("more_body", False):
                    finished.set()

        try:
            await self._app(scope, receive, send)
        except OriginError:
            raise
        except Exception as exc:
            raise OriginError(f"{target}: the site raised {type(exc).__name__}: {exc}") from exc
        finally:
            finished.set()
        if start is None:
            raise OriginError(f"{target}: the site sent no response")
        headers = ((name.decode("latin-1").lower(), value.decode("latin-1")) for name, value in start["headers"])
        return body.response(int(start["status"]), headers)


class WsgiOrigin:
    """Fetches guest pages from a WSGI app (synchronous; the deadline is the app server's to enforce)."""

    def __init__(self, app: WSGIApplication, *, canonical_host: str, scheme: str = "http", max_bytes: int) -> None:
        self._app = app
        self._host = canonical_host
        self._scheme = scheme
        self._max_bytes = max_bytes

    def fetch_guest(self, target: str) -> OriginResponse:
        raw_path, _, query = target.partition("?")
        environ: dict[str, Any] = {
            "REQUEST_METHOD": "GET",
            "SCRIPT_NAME": "",
            "PATH_INFO": unquote_to_bytes(raw_path).decode("latin-1"),
            "QUERY_STRING": query,
            "SERVER_NAME": self._host.partition(":")[0],
            "SERVER_PORT": self._host.partition(":")[2] or ("443" if self._scheme == "https" else "80"),
            "SERVER_PROTOCOL": "HTTP/1.1",
            "REMOTE_ADDR": "127.0.0.1",
            "HTTP_HOST": self._host,
            "HTTP_USER_AGENT": GUEST_USER_AGENT,
            "HTTP_ACCEPT": _ACCEPT,
            "HTTP_ACCEPT_ENCODING": "identity",
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": self._scheme,
            "wsgi.input": io.BytesIO(b""),
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": True,
            "wsgi.run_once": False,
        }
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


def _decoded(response: OriginResponse) -> OriginResponse:
    """Undo a Content-Encoding the site applied although identity was asked for."""
    encoding = (response.header("content-encoding") or "").strip().lower()
    if encoding not in ("gzip", "x-gzip", "deflate"):
        return response
    try:
        body = gzip.decompress(response.body) if "gzip" in encoding else zlib.decompress(response.body)
    except (OSError, EOFError, zlib.error) as exc:
        raise OriginError(f"the site sent a broken {encoding} body: {exc}") from exc
    headers = tuple((k, v) for k, v in response.headers if k not in ("content-encoding", "content-length"))
    return OriginResponse(response.status, headers, body)
