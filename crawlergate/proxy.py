"""The standalone reverse proxy: ``create_app(settings)`` = the gate around a streaming forwarding app.

ReverseProxy forwards every request to the origin with httpx (pooled keep-alive connections),
streaming bodies both ways so a 1 GB upload or download never sits in memory. Hop-by-hop headers
are dropped (RFC 9110 7.6.1), ``X-Forwarded-For/-Proto/-Host`` are set, and the incoming ones are
believed only from configured proxies. Redirects and ``Set-Cookie`` pass unchanged. An origin that
refuses or times out gets a clear 502 or 504. The gate's guest sub-requests go through this same
app, so a mounted gate and the proxy share one code path.

    app = create_app(load_settings(None, os.environ, {"server.origin": "http://127.0.0.1:8000"}))
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httpx
from starlette.types import Message, Receive, Scope, Send

from crawlergate.config import Settings, load_settings
from crawlergate.errors import ConfigError
from crawlergate.forwarded import TrustedProxies
from crawlergate.middleware import CrawlerGateMiddleware
from crawlergate.serve import plain_response, send_response

logger = logging.getLogger(__name__)

# RFC 9110 7.6.1, plus the de-facto ones (keep-alive, proxy-connection) nginx also drops.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
_FORWARDED = (b"x-forwarded-for", b"x-forwarded-proto", b"x-forwarded-host")


class ReverseProxy:
    """An ASGI app that forwards requests to ``origin`` and streams the answers back.

    Parameters:
        origin: base URL, e.g. ``http://127.0.0.1:8000``.
        timeout_s: read timeout between bytes from the origin; connect gets ``connect_timeout_s``.
        trusted_proxies: addresses or networks whose X-Forwarded-* headers are believed.
        transport: httpx transport, injected by tests; a pooled network transport by default.
    """

    def __init__(
        self,
        origin: str,
        *,
        timeout_s: float = 60.0,
        connect_timeout_s: float = 5.0,
        trusted_proxies: tuple[str, ...] = (),
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"Setting 'server.origin' has value '{origin}'. Must be an http:// or https:// URL.")
        self.origin = origin.rstrip("/")
        self._origin_prefix = parts.path.rstrip("/").encode()
        self._trusted = TrustedProxies(trusted_proxies)
        # The transport is called directly: the client layer (cookies, auth, redirects, hooks) has nothing
        # to do in a proxy and costs ~0.3 ms a request.
        self._transport = transport or httpx.AsyncHTTPTransport(
            limits=httpx.Limits(max_connections=512, max_keepalive_connections=128)
        )
        self._timeouts = {
            "connect": connect_timeout_s,
            "read": timeout_s,
            "write": timeout_s,
            "pool": connect_timeout_s,
        }
        self._base = httpx.URL(self.origin)

    async def aclose(self) -> None:
        await self._transport.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # WebSockets are not proxied; the server closes the connection.
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
        query: bytes = scope.get("query_string", b"")
        target = self._origin_prefix + raw_path + (b"?" + query if query else b"")
        request = httpx.Request(
            scope["method"],
            self._base.copy_with(raw_path=target),
            headers=self._forward_headers(scope),
            content=_request_body(receive) if _has_body(scope) else None,
            extensions={"timeout": self._timeouts},
        )
        try:
            response = await self._transport.handle_async_request(request)
        except httpx.TimeoutException:
            await send_response(send, plain_response(504, b"The origin did not answer in time.\n", outcome=None))
            return
        except (httpx.HTTPError, OSError) as exc:
            logger.warning("origin %s failed: %s", self.origin, exc)
            await send_response(send, plain_response(502, b"The origin cannot be reached.\n", outcome=None))
            return
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": _without_hop_by_hop(response.headers.raw),
                }
            )
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except httpx.HTTPError as exc:
            # The origin broke off mid-body: the client sees a truncated response, as from the origin itself.
            logger.warning("origin %s broke off a response: %s", self.origin, exc)
        finally:
            await response.aclose()

    def _forward_headers(self, scope: Scope) -> list[tuple[bytes, bytes]]:
        client = scope.get("client")
        client_ip = client[0] if client else ""
        trusted = client_ip in self._trusted
        headers = _without_hop_by_hop(scope["headers"], drop=_FORWARDED if not trusted else ())
        incoming = dict(headers)
        forwarded_for = incoming.get(b"x-forwarded-for")
        chain = forwarded_for + b", " + client_ip.encode() if trusted and forwarded_for else client_ip.encode()
        result = [(name, value) for name, value in headers if name not in (b"host", *_FORWARDED)]
        result.append((b"x-forwarded-for", chain))
        result.append(
            (b"x-forwarded-proto", incoming.get(b"x-forwarded-proto") or scope.get("scheme", "http").encode())
        )
        host = incoming.get(b"x-forwarded-host") or incoming.get(b"host")
        if host:
            result.append((b"x-forwarded-host", host))
        return result

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return


def create_app(settings: Settings) -> CrawlerGateMiddleware:
    """The standalone proxy: the gate around a ReverseProxy to ``settings.server.origin``."""
    if not settings.server.origin:
        raise ConfigError("Setting 'server.origin' is empty. The proxy needs the site's URL, e.g. --origin URL.")
    proxy = ReverseProxy(
        settings.server.origin,
        timeout_s=settings.cache.fill_timeout_seconds,
        trusted_proxies=settings.server.trusted_proxies,
    )
    return CrawlerGateMiddleware(proxy, settings=settings)


def app_from_environment() -> CrawlerGateMiddleware:
    """Factory for ``uvicorn --factory`` workers: settings from CRAWLERGATE_CONFIG and CRAWLERGATE_* variables."""
    return create_app(load_settings(None, os.environ))


def _has_body(scope: Scope) -> bool:
    name: bytes
    value: bytes
    for name, value in scope["headers"]:
        if name == b"content-length":
            return value.strip() != b"0"
        if name == b"transfer-encoding":
            return True
    return False


async def _request_body(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            return
        chunk = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return


def _without_hop_by_hop(headers: list[tuple[bytes, bytes]], drop: tuple[bytes, ...] = ()) -> list[tuple[bytes, bytes]]:
    named: set[bytes] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            named.update(token.strip().lower() for token in value.split(b","))
    return [
        (name.lower(), value)
        for name, value in headers
        if name.lower() not in HOP_BY_HOP and name.lower() not in named and name.lower() not in drop
    ]
