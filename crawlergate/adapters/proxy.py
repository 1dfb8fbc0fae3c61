"""The standalone reverse proxy: ``create_app(settings)`` = the gate around a streaming forwarding app.

ReverseProxy forwards every request to the origin with httpx (pooled keep-alive connections),
streaming bodies both ways so a 1 GB upload or download never sits in memory. Hop-by-hop headers
are dropped (RFC 9110 7.6.1), ``X-Forwarded-For/-Proto/-Host`` are set, and the incoming ones are
believed only from configured proxies. The origin sees the client's ``Host`` (nginx's
``proxy_set_header Host $host``) unless ``server.forward_host`` is "origin"; ``Location``,
``Content-Location`` and ``Refresh`` that name the origin's own address are rewritten to the public
one (nginx's ``proxy_redirect default``), so a person never leaves the gate after a form. The origin's
``Date`` and ``Server`` give way to the gate's own (nginx's ``proxy_hide_header`` defaults): one of
each. An origin that refuses or times out gets a clear 502 or 504. The gate's guest sub-requests go
through this same app, without ASGI's messages (``fetch_for_fill``): the same headers out and in, the
same origin connections.

    app = create_app(load_settings(None, os.environ, {"server.origin": "http://127.0.0.1:8000"}))
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar
from urllib.parse import urlsplit

import anyio
import httpx
from starlette.types import Message, Receive, Scope, Send

from crawlergate.adapters.asgi import CrawlerGateMiddleware
from crawlergate.adapters.httpserver import HeadLimits
from crawlergate.adapters.origintransport import OriginAddress, OriginAnswer, OriginTransport, RequestBody
from crawlergate.adapters.requestbody import BodyRefused, BodyTooLarge, BufferedBody, ClientLeft
from crawlergate.adapters.server import keep_freed_heap, stop_with_master
from crawlergate.adapters.sites import SiteGates
from crawlergate.adapters.websocket import MAX_MESSAGE_BYTES, WebSocketRelay
from crawlergate.config import Settings, load_settings
from crawlergate.errors import ConfigError, OriginError, OriginTimeout
from crawlergate.gate.answer import plain_response, send_response
from crawlergate.gate.forwarded import TrustedProxies
from crawlergate.gate.origin import FILL_EXTENSION, GuestBody, PublicSite, content_type_of

logger = logging.getLogger(__name__)

# RFC 9110 7.6.1, plus the de-facto ones (keep-alive, proxy-connection) nginx also drops, and Expect: the
# server in front answers a client's 100-continue itself, and the body goes on whole (as nginx does).
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"expect",
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
# Other headers a client may write to claim an address or scheme: believed only from trusted proxies.
_CLAIMS = (
    *_FORWARDED,
    b"forwarded",
    b"x-real-ip",
    b"x-client-ip",
    b"true-client-ip",
    b"cf-connecting-ip",
    b"fastly-client-ip",
    b"x-cluster-client-ip",
    b"x-forwarded-port",
    b"x-forwarded-scheme",
    b"x-original-forwarded-for",
)
# The server in front (uvicorn here) writes its own; passing the origin's too would send two of each.
_ORIGIN_ONLY = (b"date", b"server")
# What each leg drops: a client's claims unless it is a trusted proxy, and the origin's own Date and Server.
_DROPPED_UNTRUSTED = HOP_BY_HOP | frozenset(_CLAIMS)
_DROPPED_FROM_ORIGIN = HOP_BY_HOP | frozenset(_ORIGIN_ONLY)
# The origin's answer headers not handed on, by (passed to a person, unframed): an unframed answer's Content-Length
# frames nothing; a person's answer says what this gate did in its own X-Crawlergate, which the origin's (a gate
# behind it) would contradict. A fill keeps it, for `crawlergate check` to say a gate answered; a crawler's answer
# never carries it.
_DROPPED_FROM = {
    (passed, unframed): _DROPPED_FROM_ORIGIN
    | ({b"x-crawlergate"} if passed else set())
    | ({b"content-length"} if unframed else set())
    for passed in (False, True)
    for unframed in (False, True)
}
_FORWARDING = frozenset((b"host", *_FORWARDED))
# Response headers that may carry an absolute URL of the origin.
_URL_HEADERS = (b"location", b"content-location", b"refresh", b"link")
_LINK_TARGET = re.compile(rb"<([^>]*)>")
_REFRESH_URL = re.compile(rb"(?i)(url\s*=\s*['\"]?)([^'\";]+)")
# An answer whose Content-Length is at most this goes to the client whole when its body follows its head within
# SHORT_BODY_WAIT_S (nginx reads an answer into 32-64 KB of buffers before the client gets it, whole when it fits);
# a body that comes slower streams as it comes, as any other.
SHORT_BODY_BYTES = 64 * 1024
SHORT_BODY_WAIT_S = 0.25
Exchanged = TypeVar("Exchanged")


class ReverseProxy:
    """An ASGI app that forwards requests to ``origin`` and streams the answers back.

    Parameters:
        origin: base URL, e.g. ``http://127.0.0.1:8000``.
        timeout_s: the longest wait between two reads from the origin (the answer's head included);
            connect gets ``connect_timeout_s``, each write of a request body ``send_timeout_s``.
        trusted_proxies: addresses or networks whose X-Forwarded-* headers are believed.
        public_url: the site as the world sees it; empty takes each request's own scheme and Host.
        forward_host: "client" sends the client's Host to the origin, "origin" the origin's address.
        max_connections: people's connections to the origin at once; fills and HEAD requests have
            ``fill_max_connections`` of their own, each used once (fills keep theirs with ``fill_keep_alive``).
        per_client: a client's requests to the origin at once (0: no limit); past it, 503.
        websocket_max_message_bytes: the largest WebSocket message relayed either way; a larger one closes with 1009.
        buffer_bodies: a request's body is read whole before the origin is asked (adapters/requestbody.py), its
            pauses bounded by ``body_timeout_s`` (408), its size by ``max_body_bytes`` (413).
    """

    def __init__(
        self,
        origin: str,
        *,
        timeout_s: float = 60.0,
        connect_timeout_s: float = 5.0,
        send_timeout_s: float = 60.0,
        max_connections: int = 512,
        fill_max_connections: int = 128,
        fill_keep_alive: bool = False,
        per_client: int = 0,
        trusted_proxies: tuple[str, ...] = (),
        public_url: str = "",
        forward_host: str = "client",
        websocket_max_message_bytes: int = MAX_MESSAGE_BYTES,
        buffer_bodies: bool = True,
        body_timeout_s: float = 60.0,
        max_body_bytes: int = 100 * 1024 * 1024,
    ) -> None:
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"Setting 'server.origin' has value '{origin}'. Must be an http:// or https:// URL.")
        self.origin = origin.rstrip("/")
        self._origin_prefix = parts.path.rstrip("/").encode()
        self._origin_lower = self.origin.lower().encode()
        self._public_base = public_url.rstrip("/").encode()
        self._client_host = forward_host == "client"
        self._trusted = TrustedProxies(trusted_proxies)
        self._per_client = per_client
        self._buffer_bodies = buffer_bodies
        self._body_timeout_s = body_timeout_s
        self._max_body_bytes = max_body_bytes
        self._in_flight: dict[str, int] = {}
        # No httpx client, requests or responses: the client layer (cookies, auth, redirects, hooks) has
        # nothing to do in a proxy and cost ~0.3 ms a request. OriginTransport parses answers in C (httptools).
        self._transport = OriginTransport(max_connections=max_connections)
        # Fills and HEAD requests get a connection of their own, closed after the answer. A fill's answer is
        # stored and served to every crawler: bytes an origin sends past the end of an answer close a connection
        # when they arrive while it is idle, but bytes that come later (a second write of a page longer than its
        # Content-Length, echoing what a client asked for) would be read as the next request's answer on a
        # connection kept alive. A new connection per fill costs about a fifth of a miss's CPU: an operator who
        # trusts the origin's framing keeps fills' connections (server.fill_keep_alive).
        self._single_use = OriginTransport(max_connections=fill_max_connections, keep_alive=False)
        self._fills = OriginTransport(max_connections=fill_max_connections) if fill_keep_alive else self._single_use
        self._timeouts = {
            "connect": connect_timeout_s,
            "read": timeout_s,
            "write": send_timeout_s,
            "pool": connect_timeout_s,
        }
        self._address = OriginAddress.from_url(httpx.URL(self.origin))
        self._closed = False
        self._websocket = WebSocketRelay(
            self.origin,
            forward_headers=self._forward_headers,
            client_host=forward_host == "client",
            connect_timeout_s=connect_timeout_s,
            max_message_bytes=websocket_max_message_bytes,
        )

    async def aclose(self) -> None:
        """Close the origin connections, once: the gate's runtime and this app's own lifespan both ask."""
        if self._closed:
            return
        self._closed = True
        await self._transport.aclose()
        await self._single_use.aclose()
        await self._fills.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
            return
        if scope["type"] != "http":
            return
        if not self._per_client or FILL_EXTENSION in scope.get("extensions", {}):
            await self._forward(scope, receive, send)
            return
        client = scope.get("client")
        who = self._trusted.client(client[0] if client else None, scope["headers"]) or ""
        if self._in_flight.get(who, 0) >= self._per_client:
            # nginx's limit_conn: one client's requests to the origin at once are bounded, so it cannot take
            # the pool from everyone else.
            message = b"Too many requests from this client at once.\n"
            await send_response(send, plain_response(503, message, outcome=None, retry_after=b"10"))
            return
        self._in_flight[who] = self._in_flight.get(who, 0) + 1
        try:
            await self._forward(scope, receive, send)
        finally:
            left = self._in_flight.pop(who) - 1
            if left:
                self._in_flight[who] = left

    async def _forward(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
        query: bytes = scope.get("query_string", b"")
        hosts = [value for name, value in scope["headers"] if name == b"host"]
        if not raw_path.startswith(b"/") or len(hosts) > 1:
            # Asterisk and absolute-form targets are not for an origin; two Hosts are refused (RFC 9112 3.2).
            await send_response(send, plain_response(400, b"Bad Request\n", outcome=None))
            return
        target, headers = self._outgoing(scope, raw_path, query, hosts)
        method: str = scope["method"]
        # A fill called the ASGI way (the proxy inside another app; AsgiOrigin asks ``fetch_for_fill`` otherwise).
        fill = FILL_EXTENSION in scope.get("extensions", {})
        # A body's end, after which the client's leaving is watched for (until then the body's stream sees it).
        body_sent = asyncio.Event() if _has_body(scope) else None
        body: AsyncIterator[bytes] | None = None
        if body_sent is not None and self._buffer_bodies and not fill:
            buffered = await self._whole_body(scope, receive, send)
            if buffered is None:
                return
            body_sent.set()
            body = buffered.chunks()
            if not any(name == b"content-length" for name, _ in headers):
                # A chunked upload, now whole, goes on with its length, as nginx sends it: servers that read only
                # Content-Length (Django's runserver, wsgiref, CGI) would otherwise see no body at all.
                headers.append((b"content-length", b"%d" % buffered.size))
        elif body_sent is not None:
            body = _request_body(receive, body_sent)
        transport = self._fills if fill else self._single_use if method == "HEAD" else self._transport
        try:
            exchange = self._exchange(transport, method, target, headers, body)
            # A fill has no client to leave.
            answer, whole = await (exchange if fill else _unless_client_leaves(exchange, receive, body_sent))
        except _ClientLeft:
            return  # the origin's connection was closed mid-body: nobody is left to answer
        except (httpx.HTTPError, OSError) as exc:
            if fill:
                raise self._fill_failed(exc) from exc
            timeout = isinstance(exc, httpx.TimeoutException)
            if not timeout:
                logger.warning("origin %s failed: %s", self.origin, exc)
            message = b"The origin did not answer in time.\n" if timeout else b"The origin cannot be reached.\n"
            await send_response(send, plain_response(504 if timeout else 502, message, outcome=None))
            return
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": answer.status,
                    "headers": self._answer_headers(answer.status, answer.headers, scope, passed=True),
                }
            )
            if whole is not None:
                await send({"type": "http.response.body", "body": whole, "more_body": False})
                return
            # A client that leaves mid-answer (a download, a stream, long polling) must release the origin
            # connection: sending to it does not fail, so its disconnect is watched for.
            async with anyio.create_task_group() as streaming:
                streaming.start_soon(_cancel_on_disconnect, receive, streaming.cancel_scope)
                try:
                    async for chunk in answer:
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                except httpx.HTTPError as exc:
                    # The origin broke off mid-body: the client sees a truncated response, as from the origin
                    # itself (no final message: a fill knows the page is not whole).
                    logger.warning("origin %s broke off a response: %s", self.origin, exc)
                finally:
                    streaming.cancel_scope.cancel()
        finally:
            await answer.aclose()

    async def _whole_body(self, scope: Scope, receive: Receive, send: Send) -> BufferedBody | None:
        """The request's body, read whole; None when the client left or was refused (408, 413), answered here."""
        try:
            if _declared_length(scope) > self._max_body_bytes:
                raise BodyTooLarge
            return await BufferedBody.read(receive, timeout_s=self._body_timeout_s, max_bytes=self._max_body_bytes)
        except ClientLeft:
            return None
        except BodyRefused as refused:
            status, headers, text = plain_response(refused.status, refused.message, outcome=None)
            # The rest of the body is not read: the connection ends with this answer.
            await send_response(send, (status, [*headers, (b"connection", b"close")], text))
            return None

    async def fetch_for_fill(self, scope: Scope, body: GuestBody) -> tuple[int, list[tuple[bytes, bytes]], bool]:
        """A fill (``scope`` as AsgiOrigin makes it) without ASGI's messages: the answer's status and headers as sent
        on, its body into ``body``, and whether it came whole. The filler says what failed (OriginTimeout,
        OriginError), not a 504 or 502 of ours posing as the site's."""
        hosts = [value for name, value in scope["headers"] if name == b"host"]
        target, headers = self._outgoing(scope, scope["raw_path"], scope["query_string"], hosts)
        try:
            answer, whole = await self._exchange(self._fills, "GET", target, headers, None)
        except (httpx.HTTPError, OSError) as exc:
            raise self._fill_failed(exc) from exc
        try:
            answer_headers = self._answer_headers(answer.status, answer.headers, scope)
            body.started(content_type_of(answer.headers))
            if whole is not None:
                body.add(whole)
                return answer.status, answer_headers, True
            try:
                async for chunk in answer:
                    body.add(chunk)
            except httpx.HTTPError as exc:  # the page is not whole: the fill will not store it
                logger.warning("origin %s broke off a response: %s", self.origin, exc)
                return answer.status, answer_headers, False
            return answer.status, answer_headers, True
        finally:
            await answer.aclose()

    def _fill_failed(self, exc: httpx.HTTPError | OSError) -> OriginError:
        """What a fill's failed exchange raises: the filler says what failed, not a 504 or 502 of ours posing as
        the site's."""
        if isinstance(exc, httpx.TimeoutException):
            return OriginTimeout(f"the origin {self.origin} did not answer in time")
        logger.warning("origin %s failed: %s", self.origin, exc)
        return OriginError(f"the origin {self.origin} cannot be reached: {exc or type(exc).__name__}")

    def _outgoing(
        self, scope: Scope, raw_path: bytes, query: bytes, hosts: list[bytes]
    ) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        """The target and headers a request goes to the origin with."""
        target = self._origin_prefix + raw_path + (b"?" + query if query else b"")
        headers = self._forward_headers(scope)
        if self._client_host and hosts:
            headers.append((b"host", hosts[0]))
        return target, headers

    async def _exchange(
        self,
        transport: OriginTransport,
        method: str,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        body: RequestBody,
    ) -> tuple[OriginAnswer, bytes | None]:
        """The origin's answer, and its whole body when that came with the head or is short and follows it at once (as
        most origins write a page): one message to the client, without the streaming's watcher and task group."""
        answer = await transport.exchange(method, self._address, target, headers, body, self._timeouts)
        try:
            return answer, await answer.whole_body(SHORT_BODY_BYTES, SHORT_BODY_WAIT_S)
        except BaseException:
            await answer.aclose()
            raise

    def _forward_headers(self, scope: Scope) -> list[tuple[bytes, bytes]]:
        """The request headers sent on, without Host: no hop-by-hop ones, X-Forwarded-* set or believed."""
        client = scope.get("client")
        client_ip = client[0] if client else ""
        # A fill's forwarding headers are the gate's own: they say whom it fetches for, as they are.
        fill = FILL_EXTENSION in scope.get("extensions", {})
        trusted = fill or client_ip in self._trusted
        result: list[tuple[bytes, bytes]] = []
        forwarding: dict[bytes, bytes] = {}  # Host and X-Forwarded-*, the last of each
        for name, value in _without_hop_by_hop(scope["headers"], HOP_BY_HOP if trusted else _DROPPED_UNTRUSTED):
            if name in _FORWARDING:
                forwarding[name] = value
            else:
                result.append((name, value))
        forwarded_for = forwarding.get(b"x-forwarded-for")
        if fill and forwarded_for:
            chain = forwarded_for
        else:
            chain = forwarded_for + b", " + client_ip.encode() if trusted and forwarded_for else client_ip.encode()
        result.append((b"x-forwarded-for", chain))
        result.append(
            (b"x-forwarded-proto", forwarding.get(b"x-forwarded-proto") or scope.get("scheme", "http").encode())
        )
        host = forwarding.get(b"x-forwarded-host") or forwarding.get(b"host")
        if host:
            result.append((b"x-forwarded-host", host))
        return result

    def _answer_headers(
        self, status: int, raw: list[tuple[bytes, bytes]], scope: Scope, *, passed: bool = False
    ) -> list[tuple[bytes, bytes]]:
        """The origin's answer headers as the gate hands them on: to a person (``passed``), or to a fill."""
        # With Transfer-Encoding, Content-Length must be ignored (RFC 9112 6.3) and so never passed on; on a 204 or a
        # 304 it frames no body (a 304's is the page's length), and the server in front would wait for one.
        unframed = status in (204, 304) or any(name.lower() == b"transfer-encoding" for name, _ in raw)
        headers = _without_hop_by_hop(raw, _DROPPED_FROM[passed, unframed])
        for index, (name, value) in enumerate(headers):
            if name in _URL_HEADERS and self._origin_lower in value.lower():
                headers[index] = (name, self._public_address(name, value, scope))
        return headers

    def _public_address(self, name: bytes, value: bytes, scope: Scope) -> bytes:
        """``value`` with URLs that begin with the origin's base rewritten to the public one (nginx ``proxy_redirect``).

        Only URLs the header gives: Location and Content-Location as a whole, Refresh after ``url=``, Link
        between ``<`` and ``>``; an origin address inside another URL (``?next=http://origin/``) stays.
        """
        if name == b"link":
            return _LINK_TARGET.sub(lambda match: b"<" + self._rebased(match.group(1), scope) + b">", value)
        if name == b"refresh":
            return _REFRESH_URL.sub(lambda match: match.group(1) + self._rebased(match.group(2), scope), value)
        return self._rebased(value, scope)

    def _rebased(self, url: bytes, scope: Scope) -> bytes:
        stripped = url.strip()
        base = self._origin_lower
        if not stripped.lower().startswith(base) or stripped[len(base) : len(base) + 1] not in (b"", b"/", b"?", b"#"):
            return url  # another host or port that merely begins like the origin's
        return (self._public_base or _request_base(scope, self._trusted)) + stripped[len(base) :]

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
    settings = settings.one_site()
    if not settings.server.origin:
        raise ConfigError("Setting 'server.origin' is empty. The proxy needs the site's URL, e.g. --origin URL.")
    proxy = ReverseProxy(
        settings.server.origin,
        # People's timeouts between reads and writes; a fill's total deadline is the gate's (AsgiOrigin).
        timeout_s=settings.server.origin_read_timeout_seconds,
        connect_timeout_s=settings.server.origin_connect_timeout_seconds,
        send_timeout_s=settings.server.origin_send_timeout_seconds,
        max_connections=settings.server.origin_max_connections,
        fill_max_connections=settings.server.fill_max_connections,
        fill_keep_alive=settings.server.fill_keep_alive,
        per_client=settings.server.origin_requests_per_client,
        trusted_proxies=settings.server.trusted_proxies,
        public_url=settings.server.public_url,
        forward_host=settings.server.forward_host,
        websocket_max_message_bytes=settings.server.websocket_max_message_bytes,
        buffer_bodies=settings.server.buffer_request_bodies,
        body_timeout_s=settings.server.body_timeout_seconds,
        max_body_bytes=settings.server.max_body_bytes,
    )
    gate = CrawlerGateMiddleware(proxy, settings=settings, standalone=True)
    gate.runtime.async_closers.append(proxy.aclose)
    return gate


def create_server_app(settings: Settings) -> CrawlerGateMiddleware | SiteGates:
    """What ``serve`` runs: the proxy's gate, or with ``[[sites]]`` a gate per site chosen by Host."""
    return SiteGates.from_settings(settings, create_app) if settings.sites else create_app(settings)


def app_from_environment() -> CrawlerGateMiddleware | SiteGates:
    """Factory for ``uvicorn --factory`` workers: settings from CRAWLERGATE_CONFIG and CRAWLERGATE_* variables."""
    settings = load_settings(None, os.environ)
    HeadLimits.apply(settings.server)  # each worker process sets its own connections' limits
    keep_freed_heap()  # each worker its own heap
    if settings.server.workers > 1:  # a worker process of uvicorn's, started by serve's master
        stop_with_master()
    _log_to_stderr()
    app = create_server_app(settings)
    # logrotate's `postrotate` sends SIGHUP: the logs are opened again (a move is also noticed within a second).
    if isinstance(app, SiteGates):
        signal.signal(signal.SIGHUP, lambda number, frame: app.reopen_logs())
    elif app.access_log is not None:
        access_log = app.access_log
        signal.signal(signal.SIGHUP, lambda number, frame: access_log.reopen())
    return app


def _log_to_stderr() -> None:
    """crawlergate's own log lines (warnings, and the regeneration windows at INFO) on stderr, beside serve's."""
    gate_logger = logging.getLogger("crawlergate")
    if not gate_logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"crawlergate serve [{os.getpid()}]: %(message)s"))
        gate_logger.addHandler(handler)
        gate_logger.setLevel(logging.INFO)
        gate_logger.propagate = False


async def _unless_client_leaves(
    exchange: Coroutine[Any, Any, Exchanged], receive: Receive, body_sent: asyncio.Event | None
) -> Exchanged:
    """The origin's answer, unless the client leaves first: then the request is cancelled and its connection
    (or its place in the pool's queue) freed at once, not when the origin answers a client who is gone.
    With a request body, the client is watched once the body is sent (``body_sent``): the body's stream reads
    the client until then.

    One watcher task, which cancels this one when the client leaves (a task for the exchange too, and
    ``asyncio.wait``, cost a person's request twice as much), started once the request is sent.
    """
    current = asyncio.current_task()
    assert current is not None
    left = False

    async def watch() -> None:
        nonlocal left
        if body_sent is not None:
            await body_sent.wait()
        await _disconnected(receive)
        left = True
        current.cancel()

    # The watcher starts at the loop's next turn, once the request is on its way to the origin: a task's making
    # is not among what a person waits for.
    loop = asyncio.get_running_loop()
    watchers: list[asyncio.Task[None]] = []
    starting = loop.call_soon(lambda: watchers.append(loop.create_task(watch())))
    try:
        return await exchange
    except asyncio.CancelledError:
        if left and current.uncancel() == 0:
            raise _ClientLeft from None
        raise
    finally:
        starting.cancel()
        for watcher in watchers:
            watcher.cancel()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _cancel_on_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    await _disconnected(receive)
    scope.cancel()


def _request_base(scope: Scope, trusted: TrustedProxies) -> bytes:
    """The scheme and host the client asked for: its own, or what a trusted front proxy says they were."""
    client = scope.get("client")
    believed = FILL_EXTENSION in scope.get("extensions", {}) or (client is not None and client[0] in trusted)
    headers: dict[bytes, bytes] = dict(scope["headers"])
    scheme: bytes = (believed and headers.get(b"x-forwarded-proto")) or scope.get("scheme", "http").encode()
    host = (believed and headers.get(b"x-forwarded-host")) or headers.get(b"host")
    if not host:
        server = scope.get("server") or ("localhost", None)
        host = PublicSite.from_server(scheme.decode("latin-1"), server).host.encode("latin-1")
    return scheme.split(b",")[0].strip() + b"://" + host.split(b",")[0].strip()


def _declared_length(scope: Scope) -> int:
    """The request's Content-Length, or 0 (none, chunked: its size is known as it comes)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.strip().isdigit() else 0
    return 0


def _has_body(scope: Scope) -> bool:
    name: bytes
    value: bytes
    for name, value in scope["headers"]:
        if name == b"content-length":
            return value.strip() != b"0"
        if name == b"transfer-encoding":
            return True
    return False


class _ClientLeft(Exception):
    """Raised when a client leaves before the origin answered it, or mid-body, likely a cut or malformed upload."""


async def _request_body(receive: Receive, sent: asyncio.Event) -> AsyncIterator[bytes]:
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            # Never end the body for the client: the origin would take a cut upload for a whole one.
            raise _ClientLeft
        chunk = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            sent.set()
            return


def _without_hop_by_hop(headers: list[tuple[bytes, bytes]], dropped: frozenset[bytes]) -> list[tuple[bytes, bytes]]:
    """``headers`` with lower-case names, without those in ``dropped`` (the hop-by-hop ones and more) and those
    a Connection header names."""
    kept: list[tuple[bytes, bytes]] = []
    named: set[bytes] = set()
    for name, value in headers:
        lowered = name.lower()
        if lowered not in dropped:
            kept.append((lowered, value))
        elif lowered == b"connection":
            named.update(token.strip().lower() for token in value.split(b","))
    return [(name, value) for name, value in kept if name not in named] if named else kept
