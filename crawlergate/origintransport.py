"""The proxy's HTTP/1.1 client leg: an httpx transport on asyncio protocols, responses parsed by httptools.

httpcore parses HTTP in Python (h11) and costs about 0.3 ms a request in its pool and models: most
of what a person's request paid to pass through ``serve`` (nginx pays 0.04 ms). Here a request head
is one write, the answer's head is parsed in C, and its body streams to the caller through a small
queue with flow control both ways, so a 1 GB upload or download never sits in memory.

A connection is reused only when its previous answer ended exactly where the protocol says: bytes
an origin sends past the end of an answer (a body on HEAD, more than its Content-Length) close it,
so they can never be read as the next request's answer. ``keep_alive=False`` closes every connection
after one answer (the proxy's fills and HEAD requests).

    transport = OriginTransport(max_connections=512)
    response = await transport.handle_async_request(httpx.Request("GET", "http://127.0.0.1:8000/"))
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator

import httptools
import httpx

# Body bytes queued for the caller before the connection stops reading from the origin.
_READ_HIGH_WATER = 256 * 1024


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
        # (scheme, host, port): the pool the connection belongs to.
        self.address: tuple[str, str, int] = ("", "", 0)

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reusable = False
        self._writable.set()
        if not self._done:
            self._fail(httpx.RemoteProtocolError("the origin closed the connection before the answer ended"))

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def data_received(self, data: bytes) -> None:
        if self._parser is None or self._done:
            # Bytes after the end of an answer, or nobody asked: never read as an answer.
            self.reusable = False
            if self.transport is not None:
                self.transport.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"the origin sent a malformed answer: {exc}"))
            if self.transport is not None:
                self.transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        if self._done:  # a second answer in the bytes of the first: the connection cannot be trusted again
            self.reusable = False
            self._keep_alive = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self._parser is not None and self._head is not None
        self._keep_alive = self._parser.should_keep_alive()
        if not self._head.done():
            self._head.set_result((self._parser.get_status_code(), self._headers))
        if self._head_only:
            self._finish()  # a HEAD answer has no body, whatever its Content-Length says

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._queued += len(body)
        self._arrived.set()
        if self._queued > _READ_HIGH_WATER and self.transport is not None:
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if not self._done:
            self._finish()

    # the request
    async def send(self, request: httpx.Request, head: bytes) -> None:
        assert self.transport is not None
        self._parser = httptools.HttpResponseParser(self)
        self._head = asyncio.get_running_loop().create_future()
        self._headers = []
        self._chunks.clear()
        self._queued = 0
        self._done = False
        self._error = None
        self.reusable = False
        self._head_only = request.method == "HEAD"
        self.transport.write(head)
        chunked = request.headers.get("transfer-encoding", "").lower() == "chunked"
        async for chunk in request.stream:  # type: ignore[union-attr]
            if not chunk:
                continue
            await self._writable.wait()
            if self.closed:
                raise httpx.WriteError("the origin closed the connection during the request body")
            self.transport.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
        if chunked:
            self.transport.write(b"0\r\n\r\n")

    async def head(self, timeout_s: float | None) -> tuple[int, list[tuple[bytes, bytes]]]:
        assert self._head is not None
        try:
            return await asyncio.wait_for(asyncio.shield(self._head), timeout_s)
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
                await asyncio.wait_for(self._arrived.wait(), timeout_s)
            except TimeoutError:
                raise httpx.ReadTimeout("the origin stopped sending in time") from None

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


class _Body(httpx.AsyncByteStream):
    def __init__(self, transport: OriginTransport, connection: _Connection, timeout_s: float | None) -> None:
        self._transport = transport
        self._connection = connection
        self._timeout_s = timeout_s
        self._released = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._connection.body(self._timeout_s):
            yield chunk

    async def aclose(self) -> None:
        if not self._released:
            self._released = True
            self._transport.release(self._connection)


class OriginTransport(httpx.AsyncBaseTransport):
    """Pooled keep-alive connections to HTTP/1.1 origins (one pool per host and port).

    Parameters:
        max_connections: connections open at once; more requests wait for one (the "pool" timeout).
        keep_alive: False closes each connection after its answer.
    """

    def __init__(self, *, max_connections: int = 512, keep_alive: bool = True) -> None:
        self._slots = asyncio.Semaphore(max_connections)
        self._keep_alive = keep_alive
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._open: set[_Connection] = set()
        self._ssl: ssl.SSLContext | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        try:
            await asyncio.wait_for(self._slots.acquire(), timeouts.get("pool"))
        except TimeoutError:
            raise httpx.PoolTimeout("no connection to the origin came free in time") from None
        try:
            return await self._exchange(request, timeouts)
        except BaseException:
            self._slots.release()
            raise

    async def aclose(self) -> None:
        for connection in list(self._open):
            if connection.transport is not None:
                connection.transport.close()
        self._open.clear()
        self._idle.clear()

    def release(self, connection: _Connection) -> None:
        """The caller is done with an answer: the connection goes back to the pool, or is closed."""
        self._slots.release()
        if self._keep_alive and connection.reusable and not connection.closed:
            self._idle.setdefault(connection.address, []).append(connection)
            return
        self._open.discard(connection)
        if connection.transport is not None:
            connection.transport.close()

    async def _exchange(self, request: httpx.Request, timeouts: dict[str, float | None]) -> httpx.Response:
        head = _request_head(request, self._keep_alive)
        for attempt in (1, 2):
            connection, reused = await self._connection(request.url, timeouts.get("connect"))
            try:
                await asyncio.wait_for(connection.send(request, head), timeouts.get("write"))
                status, headers = await connection.head(timeouts.get("read"))
            except httpx.RemoteProtocolError:
                self._discard(connection)
                # A reused connection the origin closed as the request went out: once more, anew, when the
                # request can be sent again (no body, or one already held in memory).
                if attempt == 1 and reused and isinstance(request.stream, httpx.ByteStream):
                    continue
                raise
            except TimeoutError:
                self._discard(connection)
                raise httpx.WriteTimeout("the origin did not take the request in time") from None
            except BaseException:
                self._discard(connection)
                raise
            stream = _Body(self, connection, timeouts.get("read"))
            return httpx.Response(status, headers=headers, stream=stream, extensions={"http_version": b"HTTP/1.1"})
        raise AssertionError("unreachable")  # pragma: no cover

    async def _connection(self, url: httpx.URL, timeout_s: float | None) -> tuple[_Connection, bool]:
        scheme = url.scheme
        port = url.port or (443 if scheme == "https" else 80)
        address = (scheme, url.host, port)
        idle = self._idle.get(address)
        while idle:
            connection = idle.pop()
            if not connection.closed:
                return connection, True
            self._open.discard(connection)
        secure = scheme == "https"
        if secure and self._ssl is None:
            self._ssl = ssl.create_default_context()
        loop = asyncio.get_running_loop()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(
                    _Connection,
                    url.host,
                    port,
                    ssl=self._ssl if secure else None,
                    server_hostname=url.host if secure else None,
                ),  # fmt: skip
                timeout_s,
            )
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {url.host}:{port} timed out") from None
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {url.host}:{port}: {exc.strerror or exc}") from None
        connection.address = address
        self._open.add(connection)
        return connection, False

    def _discard(self, connection: _Connection) -> None:
        self._open.discard(connection)
        if connection.transport is not None:
            connection.transport.close()


def _request_head(request: httpx.Request, keep_alive: bool) -> bytes:
    target = request.url.raw_path
    lines = [b"%s %s HTTP/1.1" % (request.method.encode("ascii"), target)]
    has_host = False
    for name, value in request.headers.raw:
        lowered = name.lower()
        if lowered == b"host":
            has_host = True
        elif lowered == b"connection":
            continue
        lines.append(name + b": " + value)
    if not has_host:
        lines.insert(1, b"Host: " + request.url.netloc)
    if not keep_alive:
        lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"
