"""The proxy's HTTP/1.1 client leg: asyncio protocols, answers parsed by httptools, pooled keep-alive.

httpcore parses HTTP in Python (h11) and costs about 0.3 ms a request in its pool and models: most
of what a person's request paid to pass through ``serve`` (nginx pays 0.04 ms). Here a request head
is one write, the answer's head is parsed in C, and its body streams to the caller through a small
queue with flow control both ways, so a 1 GB upload or download never sits in memory. The proxy
calls ``exchange`` with the bytes it has (no request, URL or response objects: their construction
was a third of what remained); ``handle_async_request`` serves httpx clients.

A connection is reused only when its previous answer ended exactly where the protocol says: bytes
an origin sends past the end of an answer (a body on HEAD, more than its Content-Length) close it,
so they can never be read as the next request's answer. ``keep_alive=False`` closes every connection
after one answer (the proxy's fills and HEAD requests: bytes that arrive after the next request went
out would be read as its answer).

    transport = OriginTransport(max_connections=512)
    address = OriginAddress("http", "127.0.0.1", 8000, b"127.0.0.1:8000")
    answer = await transport.exchange("GET", address, b"/", [], None, {"read": 60.0})
    try:
        page = answer.received_body() or b"".join([chunk async for chunk in answer])
    finally:
        await answer.aclose()
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from typing import NamedTuple

import httptools
import httpx

logger = logging.getLogger(__name__)

# Body bytes queued for the caller before the connection stops reading from the origin.
_READ_HIGH_WATER = 256 * 1024
# The most an answer's status line and headers may take (nginx's proxy_buffer_size is 4 or 8 KB; pages with a long
# Content-Security-Policy or Link list need more). Past it the answer is broken (502), and the parser, which joins a
# header's pieces anew at each read, is never fed a head of megabytes on the event loop.
_MAX_HEAD_BYTES = 64 * 1024

# A request body: none, bytes held in memory, or a stream of chunks.
RequestBody = bytes | AsyncIterable[bytes] | None
# Seconds for "connect", "read", "write" and "pool" (httpx's names); a missing one waits for ever.
Timeouts = Mapping[str, float | None]


class OriginAddress(NamedTuple):
    """Where an origin listens: its pool key, and the Host its requests carry by default."""

    scheme: str
    host: str
    port: int
    netloc: bytes

    @classmethod
    def from_url(cls, url: httpx.URL) -> OriginAddress:
        port = url.port or (443 if url.scheme == "https" else 80)
        return cls(url.scheme, url.host, port, url.netloc)


class _PastTheEnd(Exception):
    """Raised from the parser's callback to stop it at bytes an origin sent after its answer ended."""


class _Connection(asyncio.Protocol):
    """One connection to the origin, one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = False
        self._writable = asyncio.Event()
        self._writable.set()
        self._parser: httptools.HttpResponseParser | None = None
        self._head: asyncio.Future[tuple[int, list[tuple[bytes, bytes]]]] | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self._chunks: deque[bytes] = deque()
        self._queued = 0
        self._arrived = asyncio.Event()
        self._done = False
        self._error: httpx.HTTPError | None = None
        self._head_only = False
        self._keep_alive = True
        # The answer has neither Content-Length nor Transfer-Encoding: its body ends when the origin closes.
        self._until_close = False
        # The body's length as its Content-Length gives it (without Transfer-Encoding); None when unknown.
        self._length: int | None = None
        # An interim (1xx) answer is being parsed: skipped, the final answer comes after it.
        self._interim = False
        # The gate closed the connection itself (cancelled, timed out, shutting down): a close that ends no body.
        self._aborted = False
        # (scheme, host, port): the pool the connection belongs to.
        self.address = OriginAddress("", "", 0, b"")
        # Bytes read while the answer's head was not whole yet.
        self._head_bytes = 0

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reusable = False
        self._writable.set()
        if self._done:
            return
        if exc is None and self._until_close and not self._aborted:
            # RFC 9112 6.3 rule 8: a clean close is how such an answer ends (HTTP/1.0 servers, PHP's built-in
            # server, http.server, CGI front-ends). A reset (exc) or a timeout still leaves it cut short.
            self._finish()
            return
        self._fail(httpx.RemoteProtocolError("the origin closed the connection before the answer ended"))

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def data_received(self, data: bytes) -> None:
        if self._parser is None or self._done:
            # Bytes after the end of an answer, or nobody asked: never read as an answer.
            self.reusable = False
            self.abort()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self._done and self._error is None:
                # Bytes past the answer's end in the same read (more than its Content-Length): the answer stands
                # as the protocol delimits it, the rest is never parsed, and the connection is not used again
                # (nginx: "upstream sent more data than specified").
                logger.warning("the origin %s sent more than its answer held; the rest was dropped", self.address.host)
                self.reusable = False
                self.abort()
                return
            self._fail(httpx.RemoteProtocolError(f"the origin sent a malformed answer: {exc}"))
            self.abort()
            return
        if not self._done and self._head is not None and not self._head.done():
            self._head_bytes += len(data)
            if self._head_bytes > _MAX_HEAD_BYTES:
                self._fail(httpx.RemoteProtocolError(f"the origin sent an answer head over {_MAX_HEAD_BYTES} bytes"))
                self.abort()

    # httptools callbacks
    def on_message_begin(self) -> None:
        if self._done:
            # A second answer in the bytes of the first: parsing stops here, before its headers could join the
            # answer's (they share the list handed out) or its body the answer's body.
            raise _PastTheEnd

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self._parser is not None and self._head is not None
        status = self._parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            # An interim answer (100 Continue, 103 Early Hints): the final one follows on the same connection.
            # Taken as the answer, the final one would be read as the next request's (another person's).
            self._interim = True
            self._headers = []
            return
        if status > 599 or status < 100:
            # httptools takes any three digits; no client could read a 999 (nginx: "upstream sent invalid status").
            self._fail(httpx.RemoteProtocolError(f"the origin sent status {status}, which HTTP does not have"))
            self.abort()
            return
        codings, length, has_length = _framing(self._headers)
        if codings is not None and codings.strip().lower() != b"chunked":
            # A coding besides chunked (gzip, chunked): the body would be read as the page with the coding left on
            # it. nginx refuses it too ("upstream sent unknown Transfer-Encoding").
            self._fail(httpx.RemoteProtocolError("the origin sent a transfer coding other than chunked"))
            self.abort()
            return
        self._keep_alive = self._parser.should_keep_alive()
        # RFC 9112 6.3: unframed (neither header), a status with a body: the body runs until the connection closes.
        has_body = status >= 200 and status not in (204, 304)
        self._until_close = not self._head_only and has_body and codings is None and not has_length
        # Transfer-Encoding overrides Content-Length.
        self._length = length if codings is None else None
        if not self._head.done():
            self._head.set_result((status, self._headers))
        if self._head_only:
            self._finish()  # a HEAD answer has no body, whatever its Content-Length says

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._queued += len(body)
        self._arrived.set()
        if self._queued > _READ_HIGH_WATER and self.transport is not None:
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        if not self._done:
            self._finish()

    # the request
    async def send(
        self, method: str, head: bytes, body: RequestBody, chunked: bool, step_timeout_s: float | None = None
    ) -> None:
        """Write the request; a streamed body may wait at most ``step_timeout_s`` for each chunk and each write."""
        assert self.transport is not None
        self._parser = httptools.HttpResponseParser(self)
        self._head = asyncio.get_running_loop().create_future()
        self._head_bytes = 0
        self._headers = []
        self._chunks.clear()
        self._queued = 0
        self._done = False
        self._error = None
        self.reusable = False
        self._until_close = False
        self._length = None
        self._interim = False
        self._head_only = method == "HEAD"
        if body is None or isinstance(body, bytes):
            self.transport.write(head + body if body else head)
            return
        self.transport.write(head)
        chunks = aiter(body)
        while True:
            # Between writes, not in total (nginx's proxy_send_timeout): a long upload is fine, a stall is not.
            async with asyncio.timeout(step_timeout_s):
                try:
                    chunk = await anext(chunks)
                except StopAsyncIteration:
                    break
                await self._writable.wait()
            if not chunk:
                continue
            if self.closed:
                raise httpx.WriteError("the origin closed the connection during the request body")
            self.transport.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
        if chunked:
            self.transport.write(b"0\r\n\r\n")

    async def head(self, timeout_s: float | None) -> tuple[int, list[tuple[bytes, bytes]]]:
        assert self._head is not None
        try:
            # asyncio.timeout, not wait_for: no task per request. A cancelled wait cancels ``_head``, which
            # the parser callbacks allow for (they complete it only while it is pending).
            async with asyncio.timeout(timeout_s):
                return await self._head
        except TimeoutError:
            raise httpx.ReadTimeout("the origin did not answer in time") from None

    async def body(self, timeout_s: float | None) -> AsyncIterator[bytes]:
        while True:
            if self._chunks:
                chunk = self._chunks.popleft()
                self._queued -= len(chunk)
                if self._queued <= _READ_HIGH_WATER // 2 and self.transport is not None and not self.closed:
                    self.transport.resume_reading()
                yield chunk
                continue
            if self._error is not None:
                raise self._error
            if self._done:
                return
            self._arrived.clear()
            try:
                async with asyncio.timeout(timeout_s):
                    await self._arrived.wait()
            except TimeoutError:
                raise httpx.ReadTimeout("the origin stopped sending in time") from None

    def abort(self) -> None:
        """Close the connection from our side: an answer that ends at the close is then cut, never whole."""
        self._aborted = True
        if self.transport is not None:
            self.transport.close()

    async def until_whole(self, limit: int, wait_s: float) -> None:
        """Wait up to ``wait_s`` in all for the rest of a body of at most ``limit`` bytes by its Content-Length; at
        once for a body already whole, a longer one, one of unknown length, or one that failed. A body still not
        whole by then is read by iterating, as any other (the read timeout between two reads)."""
        if self._done or self._length is None or self._length > limit:
            return
        try:
            async with asyncio.timeout(wait_s):
                while not self._done:
                    self._arrived.clear()
                    await self._arrived.wait()
        except TimeoutError:
            return

    def take_whole_body(self) -> bytes | None:
        """The whole body, when all of it has already arrived and none of it was read; else None."""
        if not self._done or self._error is not None or self._parser is not None:
            return None
        body = b"".join(self._chunks)
        self._chunks.clear()
        self._queued = 0
        return body

    def _finish(self) -> None:
        self._done = True
        self._parser = None
        self.reusable = self._keep_alive and not self.closed
        self._arrived.set()

    def _fail(self, error: httpx.HTTPError) -> None:
        self._error = error
        self._done = True
        self.reusable = False
        if self._head is not None and not self._head.done():
            self._head.set_exception(error)
        self._arrived.set()


class OriginAnswer:
    """An origin's answer: status and raw headers at once, the body read from the connection as it comes.

    ``aclose()`` must be called when done with it (it returns the connection to the pool, or closes it).
    """

    __slots__ = ("status", "headers", "_transport", "_connection", "_timeout_s", "_released", "_started")

    def __init__(
        self,
        status: int,
        headers: list[tuple[bytes, bytes]],
        transport: OriginTransport,
        connection: _Connection,
        timeout_s: float | None,
    ) -> None:
        self.status = status
        self.headers = headers
        self._transport = transport
        self._connection = connection
        self._timeout_s = timeout_s
        self._released = False
        self._started = False

    def received_body(self) -> bytes | None:
        """The whole body when all of it has already arrived (most answers arrive whole with their head),
        so the caller can pass it on at once; else None, and the body is read by iterating."""
        if self._started:
            return None
        body = self._connection.take_whole_body()
        self._started = body is not None
        return body

    async def whole_body(self, limit: int, wait_s: float) -> bytes | None:
        """The whole body when it came with the head, or when it is short (a Content-Length of at most ``limit``)
        and the rest of it comes within ``wait_s`` (and the read timeout): most origins write a page's head and its
        body apart, and the body follows at once. None for a longer body or one of unknown length, one that comes
        slower or that the origin broke off: iterating then gives what came, the rest, or the error."""
        if self._started:
            return None
        timeout_s = self._timeout_s
        await self._connection.until_whole(limit, wait_s if timeout_s is None else min(wait_s, timeout_s))
        return self.received_body()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self._started = True
        async for chunk in self._connection.body(self._timeout_s):
            yield chunk

    async def aclose(self) -> None:
        if not self._released:
            self._released = True
            self._transport.release(self._connection)


class _HttpxBody(httpx.AsyncByteStream):
    def __init__(self, answer: OriginAnswer) -> None:
        self._answer = answer

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._answer:
            yield chunk

    async def aclose(self) -> None:
        await self._answer.aclose()


class OriginTransport(httpx.AsyncBaseTransport):
    """Pooled keep-alive connections to HTTP/1.1 origins (one pool per host and port).

    ``exchange`` is the proxy's own call (no request or response objects to build: a person's
    request pays for none); ``handle_async_request`` makes it an httpx transport as well.

    Parameters:
        max_connections: connections open at once; more requests wait for one (the "pool" timeout).
        keep_alive: False closes each connection after its answer.
    """

    def __init__(self, *, max_connections: int = 512, keep_alive: bool = True) -> None:
        self._slots = asyncio.Semaphore(max_connections)
        self._keep_alive = keep_alive
        self._idle: dict[OriginAddress, list[_Connection]] = {}
        self._open: set[_Connection] = set()
        self._ssl: ssl.SSLContext | None = None

    async def exchange(
        self,
        method: str,
        address: OriginAddress,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        body: RequestBody,
        timeouts: Timeouts,
    ) -> OriginAnswer:
        """Send one request (``headers`` without Host get the origin's) and return the answer's head.

        A ``body`` without a Content-Length in ``headers`` gets one (bytes) or goes chunked (a stream).
        Raises httpx's exceptions: ConnectError, the timeouts, RemoteProtocolError, WriteError.
        """
        try:
            if self._slots.locked():  # a timer only when there is a wait
                async with asyncio.timeout(timeouts.get("pool")):
                    await self._slots.acquire()
            else:
                await self._slots.acquire()
        except TimeoutError:
            raise httpx.PoolTimeout("no connection to the origin came free in time") from None
        try:
            return await self._exchange(method, address, target, headers, body, timeouts)
        except BaseException:
            self._slots.release()  # an answer holds its slot until aclose(); no answer, no slot
            raise

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        address = OriginAddress.from_url(url)
        stream = request.stream
        body: RequestBody
        if isinstance(stream, httpx.ByteStream):
            body = b"".join(stream)
        elif isinstance(stream, httpx.AsyncByteStream):
            body = stream
        else:
            raise TypeError("OriginTransport sends async request bodies only")
        headers = [(name, value) for name, value in request.headers.raw if name.lower() != b"transfer-encoding"]
        answer = await self.exchange(
            request.method, address, url.raw_path, headers, body or None, request.extensions.get("timeout", {})
        )
        extensions = {"http_version": b"HTTP/1.1"}
        return httpx.Response(answer.status, headers=answer.headers, stream=_HttpxBody(answer), extensions=extensions)

    async def aclose(self) -> None:
        for connection in list(self._open):
            connection.abort()
        self._open.clear()
        self._idle.clear()

    def release(self, connection: _Connection) -> None:
        """The caller is done with an answer: the connection goes back to the pool, or is closed."""
        self._slots.release()
        if self._keep_alive and connection.reusable and not connection.closed:
            self._idle.setdefault(connection.address, []).append(connection)
            return
        self._discard(connection)

    async def _exchange(
        self,
        method: str,
        address: OriginAddress,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        body: RequestBody,
        timeouts: Timeouts,
    ) -> OriginAnswer:
        framing = b""
        chunked = False
        if body is not None and not _has(headers, b"content-length"):
            if isinstance(body, bytes):
                framing = b"Content-Length: %d" % len(body)
            else:
                chunked, framing = True, b"Transfer-Encoding: chunked"
        head = _request_head(method, target, headers, address, keep_alive=self._keep_alive, framing=framing)
        for attempt in (1, 2):
            # Once more on a new connection: the other idle ones may have been closed by the origin just as well.
            connection, reused = await self._connection(address, timeouts.get("connect"), reuse=attempt == 1)
            try:
                if body is None or isinstance(body, bytes):
                    await connection.send(method, head, body, chunked)  # one write, no wait: no timer
                else:
                    await connection.send(method, head, body, chunked, timeouts.get("write"))
                status, answer_headers = await connection.head(timeouts.get("read"))
            except httpx.RemoteProtocolError:
                self._discard(connection)
                # A reused connection the origin closed as the request went out: once more, anew, when the
                # request can be sent again (no body, or one already held in memory).
                if attempt == 1 and reused and (body is None or isinstance(body, bytes)):
                    continue
                raise
            except TimeoutError:
                self._discard(connection)
                raise httpx.WriteTimeout("the origin did not take the request in time") from None
            except BaseException:
                self._discard(connection)
                raise
            return OriginAnswer(status, answer_headers, self, connection, timeouts.get("read"))
        raise AssertionError("unreachable")  # pragma: no cover

    async def _connection(
        self, address: OriginAddress, timeout_s: float | None, *, reuse: bool = True
    ) -> tuple[_Connection, bool]:
        idle = self._idle.get(address) if reuse else None
        while idle:
            connection = idle.pop()
            if not connection.closed:
                return connection, True
            self._open.discard(connection)
        secure = address.scheme == "https"
        if secure and self._ssl is None:
            self._ssl = ssl.create_default_context()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout_s):
                _, connection = await loop.create_connection(
                    _Connection,
                    address.host,
                    address.port,
                    ssl=self._ssl if secure else None,
                    server_hostname=address.host if secure else None,
                )
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {address.host}:{address.port} timed out") from None
        except OSError as exc:
            raise httpx.ConnectError(
                f"cannot connect to {address.host}:{address.port}: {exc.strerror or exc}"
            ) from None
        connection.address = address
        self._open.add(connection)
        return connection, False

    def _discard(self, connection: _Connection) -> None:
        self._open.discard(connection)
        connection.abort()


def _framing(headers: list[tuple[bytes, bytes]]) -> tuple[bytes | None, int | None, bool]:
    """An answer's framing, in one pass over its headers: its transfer codings (None without Transfer-Encoding), its
    Content-Length as a number (None when absent or not digits), and whether it has a Content-Length at all."""
    codings: list[bytes] = []
    length = None
    has_length = False
    for name, value in headers:
        lowered = name.lower()
        if lowered == b"transfer-encoding":
            codings.append(value)
        elif lowered == b"content-length":
            has_length = True
            if value.strip().isdigit():
                length = int(value)
    return (b",".join(codings) if codings else None), length, has_length


def _has(headers: list[tuple[bytes, bytes]], wanted: bytes) -> bool:
    return any(name.lower() == wanted for name, _ in headers)


def _request_head(
    method: str,
    target: bytes,
    headers: list[tuple[bytes, bytes]],
    address: OriginAddress,
    *,
    keep_alive: bool,
    framing: bytes,
) -> bytes:
    lines = [b"%s %s HTTP/1.1" % (method.encode("ascii"), target)]
    has_host = False
    for name, value in headers:
        lowered = name.lower()
        if lowered == b"host":
            has_host = True
        elif lowered == b"connection":
            continue
        lines.append(name + b": " + value)
    if not has_host:
        lines.insert(1, b"Host: " + address.netloc)
    if framing:
        lines.append(framing)
    if not keep_alive:
        lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"
