"""A lean HTTP/1.1 client for replay: keep-alive connections on asyncio protocols, responses parsed by httptools.

A load tester's own time is part of every latency it reports. httpx spends about a millisecond of
Python per request (pool, models, header objects), more than a cache hit costs the gate, so replay
measured mostly itself. Here a request is one pre-built bytes write, and its answer is timed where
its bytes arrive (``data_received``): the first bytes give the time to first byte, the end of the
message the total. Nothing is decoded: the body is counted and dropped.

    async with ConnectionPool("127.0.0.1", 8080, size=16) as pool:
        answer = await pool.fetch(b"GET / HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n", head=False, timeout_s=30)
"""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass
from ssl import SSLContext
from types import TracebackType

import httptools


@dataclass(slots=True)
class Answer:
    """What came back: status, ``X-Crawlergate``, and when its first and last bytes arrived (perf_counter)."""

    status: int
    outcome: str
    first_byte: float
    finished: float


class ReplayError(Exception):
    """Raised when a request got no whole answer; ``kind`` names why (ConnectError, timeout, ...)."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._waiter: asyncio.Future[Answer] | None = None
        self._parser: httptools.HttpResponseParser | None = None
        self._head = False
        self._first_byte = 0.0
        self._outcome = b""
        self._header_name = b""
        self._keep_alive = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ReplayError("RemoteProtocolError"))

    def send(self, request: bytes, *, head: bool, waiter: asyncio.Future[Answer]) -> None:
        assert self.transport is not None
        self._waiter = waiter
        self._head = head
        self._first_byte = 0.0
        self._outcome = b""
        self._parser = httptools.HttpResponseParser(self)
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        if not self._first_byte:
            self._first_byte = time.perf_counter()
        if self._parser is None:
            return  # bytes nobody asked for: the connection is not reused (see on_message_complete)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail("RemoteProtocolError")
        except httptools.HttpParserError:
            self._fail("RemoteProtocolError")

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"x-crawlergate":
            self._outcome = value

    def on_headers_complete(self) -> None:
        assert self._parser is not None
        self._keep_alive = self._parser.should_keep_alive()
        if self._head:
            self._done()  # a HEAD answer has no body, whatever its Content-Length says

    def on_message_complete(self) -> None:
        if self._parser is not None:
            self._done()

    def _done(self) -> None:
        assert self._parser is not None
        status = self._parser.get_status_code()
        self._parser = None
        waiter = self._waiter
        self._waiter = None
        if not self._keep_alive and self.transport is not None:
            self.transport.close()
        if waiter is not None and not waiter.done():
            waiter.set_result(Answer(status, self._outcome.decode("latin-1"), self._first_byte, time.perf_counter()))

    def _fail(self, kind: str) -> None:
        self._parser = None
        if self.transport is not None:
            self.transport.close()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ReplayError(kind))


class ConnectionPool:
    """Up to ``size`` keep-alive connections to one server, each used by one request at a time."""

    def __init__(
        self, host: str, port: int, *, size: int, connect_timeout_s: float = 10.0, ssl: SSLContext | None = None
    ) -> None:
        self._host = host
        self._port = port
        self._ssl = ssl
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(size)
        self._connect_timeout_s = connect_timeout_s
        self._all: set[_Connection] = set()

    async def __aenter__(self) -> ConnectionPool:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        for connection in self._all:
            if connection.transport is not None:
                connection.transport.close()

    async def fetch(self, request: bytes, *, head: bool, timeout_s: float) -> Answer:
        """Send one request on a free connection and wait for the whole answer; raises ReplayError."""
        async with self._slots:
            for attempt in (1, 2):
                reused = bool(self._idle)
                connection = await self._connection()
                loop = asyncio.get_running_loop()
                waiter: asyncio.Future[Answer] = loop.create_future()
                connection.send(request, head=head, waiter=waiter)
                try:
                    answer = await asyncio.wait_for(waiter, timeout_s)
                except TimeoutError:
                    connection.closed = True
                    if connection.transport is not None:
                        connection.transport.close()
                    raise ReplayError("timeout") from None
                except ReplayError:
                    # A server may close an idle keep-alive connection as the request goes out: once more, anew.
                    if attempt == 1 and reused:
                        continue
                    raise
                if not connection.closed:
                    self._idle.append(connection)
                return answer
            raise AssertionError("unreachable")  # pragma: no cover

    async def _connection(self) -> _Connection:
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed:
                return connection
        loop = asyncio.get_running_loop()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(_Connection, self._host, self._port, ssl=self._ssl), self._connect_timeout_s
            )
        except TimeoutError:
            raise ReplayError("ConnectTimeout") from None
        except ssl.SSLError:
            raise ReplayError("TLSError") from None  # e.g. https:// to a port that speaks plain HTTP
        except OSError:
            raise ReplayError("ConnectError") from None
        self._all.add(connection)
        return connection
