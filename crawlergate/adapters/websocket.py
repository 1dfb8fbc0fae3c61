"""WebSockets through the standalone proxy: each ``websocket`` connection is relayed to the origin.

A site's live features (chat, notifications, live previews: Discourse, Gitea, Django Channels,
ActionCable) open a WebSocket on the pages' own host; nginx passes them on with Upgrade/Connection,
and so must the gate, or they break behind it. WebSocketRelay opens the same path on the origin
(http becomes ws, https wss) with the headers the HTTP path forwards, offers the client's
subprotocols, accepts the client with the one the origin chose, then copies text and binary
messages both ways until one side closes, and closes the other with the same code and reason. An
origin that refuses the handshake or cannot be reached gets the client's handshake refused (uvicorn
answers 403). This is the only module that knows the ``websockets`` package; its exceptions stop here.

    # ReverseProxy builds one with its own header rules and hands it every ``websocket`` scope:
    relay = WebSocketRelay("http://127.0.0.1:8000", forward_headers=self._forward_headers)
    await relay(scope, receive, send)
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from starlette.types import Receive, Scope, Send
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, WebSocketException

logger = logging.getLogger(__name__)

# websockets' own default max_size. uvicorn takes up to 16 MiB from clients (--ws-max-size): this is the
# limit that guards the origin, and the proxy's memory, since each message is held whole in between.
MAX_MESSAGE_BYTES = 1024 * 1024
# Seconds between two log lines about refused handshakes.
REFUSAL_LOG_INTERVAL_S = 60.0

# Close codes, RFC 6455 7.4.1 and the IANA registry.
_NORMAL = 1000
_GOING_AWAY = 1001
_NO_STATUS = 1005  # an empty close frame: reported, never sent with a code
_TOO_BIG = 1009
_BAD_GATEWAY = 1014  # IANA: "the server was acting as a gateway or proxy and received an invalid response"
# Codes a close frame may carry (RFC 6455 7.4.2; 3000-4999 are for libraries and applications).
_SENDABLE = frozenset({1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014})

# Answer headers the client-facing server writes itself: the origin's copies would be duplicates or lies.
_OWN_ANSWER_HEADERS = frozenset(
    {"connection", "upgrade", "keep-alive", "transfer-encoding", "content-length", "date", "server"}
)

# A Host header usable as a URL authority: a name or IPv4 address, or a bracketed IPv6 one, and a port.
_HOST = re.compile(r"(?:[A-Za-z0-9._~-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")

Close = tuple[int, str]
HeadersOf = Callable[[Scope], list[tuple[bytes, bytes]]]


@dataclass(frozen=True, slots=True)
class _Ending:
    """How a relay ended: the close still owed to each side, None where that side is already closed."""

    to_client: Close | None
    to_origin: Close | None


class WebSocketRelay:
    """Relay ASGI ``websocket`` connections to the origin's WebSocket endpoint, messages both ways.

    Parameters:
        origin: the site's base URL, e.g. ``http://127.0.0.1:8000``.
        forward_headers: the reverse proxy's header rules (hop-by-hop dropped, X-Forwarded-* set), for a scope.
        client_host: send the client's Host to the origin, as the HTTP path does; else the origin's address.
        connect_timeout_s: the whole opening handshake with the origin, TCP connect included.
        max_message_bytes: the largest message relayed either way; a larger one closes both sides with 1009.
    """

    def __init__(
        self,
        origin: str,
        *,
        forward_headers: HeadersOf,
        client_host: bool = True,
        connect_timeout_s: float = 5.0,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        parts = urlsplit(origin)
        secure = parts.scheme == "https"
        self.origin = origin
        self._scheme = "wss" if secure else "ws"
        self._authority = parts.netloc.rpartition("@")[2]  # credentials in the origin URL are not sent, as over HTTP
        self._prefix = parts.path.rstrip("/")
        # Where the TCP (and TLS) connection goes, whatever Host the URL carries.
        self._address: dict[str, Any] = {"host": parts.hostname, "port": parts.port or (443 if secure else 80)}
        if secure:
            self._address["server_hostname"] = parts.hostname
        self._forward_headers = forward_headers
        self._client_host = client_host
        self._connect_timeout_s = connect_timeout_s
        self._max_message_bytes = max_message_bytes
        # Refusals are logged at most once a minute: any client can ask for a handshake the origin refuses.
        self._next_log_at = 0.0
        self._refusals_not_logged = 0

    def url_for(self, scope: Scope) -> str:
        """The WebSocket URL asked of the origin: ws(s), the Host to send, the raw path and query as they came.

        websockets writes the Host header from the URL, so the client's Host goes there; the connection
        itself goes to the origin's address (``host``/``port``/``server_hostname`` of connect()).
        """
        authority = self._authority
        if self._client_host:
            host = next((value for name, value in scope["headers"] if name == b"host"), b"").decode("latin-1")
            if _HOST.fullmatch(host):
                authority = host
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
        query: bytes = scope.get("query_string", b"")
        path = self._prefix + raw_path.decode("latin-1") + ("?" + query.decode("latin-1") if query else "")
        return f"{self._scheme}://{authority}{path}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (await receive())["type"] != "websocket.connect":
            return  # the client left before the handshake
        try:
            origin = await _Connect(
                self.url_for(scope),
                subprotocols=scope.get("subprotocols") or None,
                additional_headers=self._request_headers(scope),
                # The HTTP path sends exactly the client's headers: no User-Agent of ours, no proxy from the
                # environment (httpx's transport reads none either).
                user_agent_header=None,
                proxy=None,
                # Both legs are terminated here, so the origin leg would inflate what uvicorn deflates again:
                # CPU and a zlib context per connection, for a hop that is usually loopback or a LAN.
                compression=None,
                open_timeout=self._connect_timeout_s,
                max_size=self._max_message_bytes,
                **self._address,
            )
        # OSError covers refused connections and TimeoutError; ValueError is a client's malformed subprotocol.
        except (WebSocketException, OSError, ValueError) as exc:
            self._log_refusal(scope["path"], exc)
            await send({"type": "websocket.close", "code": _BAD_GATEWAY})  # before accept: uvicorn answers 403
            return
        to_origin: Close = (_GOING_AWAY, "")  # what the origin hears when the relay ends early (client gone, shutdown)
        try:
            await send({"type": "websocket.accept", "subprotocol": origin.subprotocol, "headers": _answer(origin)})
            ending = await self._relay(receive, send, origin)
            if ending.to_origin is not None:
                to_origin = ending.to_origin
            if ending.to_client is not None:
                code, reason = ending.to_client
                await send({"type": "websocket.close", "code": code, "reason": reason})
        finally:
            await _close(origin, to_origin)

    def _request_headers(self, scope: Scope) -> list[tuple[str, str]]:
        # X-Forwarded-Proto must say http/https, as for the page that opened the socket: ActionCable's
        # same-origin check compares the Origin header with the URL it builds from these headers. Host and
        # the Sec-WebSocket-* handshake headers are the library's to write (see url_for); the subprotocols
        # go through ``subprotocols``.
        http_scope = {**scope, "scheme": "https" if scope.get("scheme") in ("wss", "https") else "http"}
        return [
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, value in self._forward_headers(http_scope)
            if name.lower() != b"host" and not name.lower().startswith(b"sec-websocket-")
        ]

    def _log_refusal(self, path: str, exc: Exception) -> None:
        now = time.monotonic()
        if now < self._next_log_at:
            self._refusals_not_logged += 1
            return
        more = f" ({self._refusals_not_logged} more refused since the last report)" if self._refusals_not_logged else ""
        logger.warning("origin %s refused the WebSocket %s: %s%s", self.origin, path, exc, more)
        self._next_log_at = now + REFUSAL_LOG_INTERVAL_S
        self._refusals_not_logged = 0

    async def _relay(self, receive: Receive, send: Send, origin: ClientConnection) -> _Ending:
        pumps = {
            asyncio.create_task(self._to_origin(receive, origin)),
            asyncio.create_task(self._to_client(origin, send)),
        }
        try:
            done, _ = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            return next(iter(done)).result()
        finally:
            # recv() and an ASGI receive() are both safe to cancel; send() is closed right after anyway.
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)

    async def _to_origin(self, receive: Receive, origin: ClientConnection) -> _Ending:
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                code = _sendable(message.get("code", _NORMAL), otherwise=_GOING_AWAY)
                return _Ending(to_client=None, to_origin=(code, message.get("reason") or ""))
            text: str | None = message.get("text")
            data: bytes = text.encode() if text is not None else message.get("bytes") or b""
            if len(data) > self._max_message_bytes:
                too_big = (_TOO_BIG, f"message over {self._max_message_bytes} bytes")
                return _Ending(to_client=too_big, to_origin=too_big)
            try:
                # Encoded once here; text=True sends the UTF-8 bytes as a text frame without a second pass.
                await origin.send(data, text=text is not None)
            except ConnectionClosed as exc:
                return _origin_closed(exc)

    async def _to_client(self, origin: ClientConnection, send: Send) -> _Ending:
        while True:
            try:
                data = await origin.recv()
            except ConnectionClosed as exc:
                return _origin_closed(exc)
            if isinstance(data, str):
                await send({"type": "websocket.send", "text": data})
            else:
                await send({"type": "websocket.send", "bytes": data})


class _Connect(connect):
    """websockets' connect without following redirects: that is the client's business, not the proxy's.

    The HTTP path hands a redirect to the client; a WebSocket client cannot be handed one, so the
    handshake is refused instead of the proxy carrying the client's cookies to wherever it points.
    """

    def process_redirect(self, exc: Exception) -> Exception | str:
        return exc


def _origin_closed(exc: ConnectionClosed) -> _Ending:
    if exc.rcvd is not None and (exc.sent is None or exc.rcvd_then_sent):
        frame = exc.rcvd  # the origin closed: its code and reason go to the client
    elif exc.sent is not None:
        frame = exc.sent  # our end failed the origin leg: a message over max_size (1009), a protocol error, keepalive
    else:
        return _Ending(to_client=(_BAD_GATEWAY, "the origin closed the connection"), to_origin=None)
    return _Ending(to_client=(_sendable(frame.code, otherwise=_BAD_GATEWAY), frame.reason), to_origin=None)


def _sendable(code: int, *, otherwise: int) -> int:
    # 1005 (no code) and 1006 (no close frame) only ever describe a close: they cannot be put in one.
    if code in _SENDABLE or 3000 <= code < 5000:
        return code
    return _NORMAL if code == _NO_STATUS else otherwise


def _answer(origin: ClientConnection) -> list[tuple[bytes, bytes]]:
    # The origin's own answer headers (Set-Cookie, say) reach the client, as nginx passes them on a 101.
    if origin.response is None:  # pragma: no cover - connect() returns only after the answer
        return []
    return [
        (name.lower().encode("latin-1"), value.encode("latin-1"))
        for name, value in origin.response.headers.raw_items()
        if name.lower() not in _OWN_ANSWER_HEADERS and not name.lower().startswith("sec-websocket-")
    ]


async def _close(origin: ClientConnection, close: Close) -> None:
    try:
        await origin.close(*close)  # does nothing once the origin leg is closed
    finally:
        # close() returns when the TCP connection is gone; if it was cancelled half-way, do not leave it open.
        origin.transport.abort()
