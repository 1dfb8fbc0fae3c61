"""The proxy's transport to the origin: bodies of unknown length streamed, read timeouts, and keep-alive connections
the origin closed retried, never reused past a close that ended a body."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from crawlergate.adapters.origintransport import OriginAddress, OriginTransport
from tests.conftest import RawHttpServer, ServerThread

pytestmark = pytest.mark.e2e
TIMEOUTS = {"connect": 5.0, "read": 5.0, "write": 5.0, "pool": 5.0}


@pytest.fixture(scope="module")
def origin() -> Iterator[ServerThread]:
    async def upload(request: Request) -> Response:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
        return JSONResponse({"received": size, "chunked": request.headers.get("transfer-encoding")})

    async def slow(request: Request) -> Response:
        await asyncio.sleep(2)
        return Response("late")

    server = ServerThread(Starlette(routes=[Route("/upload", upload, methods=["POST"]), Route("/slow", slow)])).start()
    yield server
    server.stop()


async def _fetch(transport: OriginTransport, request: httpx.Request) -> tuple[int, bytes]:
    response = await transport.handle_async_request(request)
    try:
        body = b"".join([chunk async for chunk in response.aiter_raw()])
    finally:
        await response.aclose()
    return response.status_code, body


def test_origintransport_streams_a_body_of_unknown_length(origin: ServerThread) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(64):
            yield b"u" * 65536

    async def run() -> tuple[int, bytes]:
        transport = OriginTransport()
        try:
            request = httpx.Request("POST", f"{origin.url}/upload", content=chunks(), extensions={"timeout": TIMEOUTS})
            return await _fetch(transport, request)
        finally:
            await transport.aclose()

    status, body = asyncio.run(run())
    assert status == 200 and body == b'{"received":4194304,"chunked":"chunked"}'


def test_origintransport_read_timeout(origin: ServerThread) -> None:
    async def run() -> None:
        transport = OriginTransport()
        try:
            timeouts = {**TIMEOUTS, "read": 0.2}
            await _fetch(transport, httpx.Request("GET", f"{origin.url}/slow", extensions={"timeout": timeouts}))
        finally:
            await transport.aclose()

    with pytest.raises(httpx.ReadTimeout):
        asyncio.run(run())


def test_origintransport_retries_a_keep_alive_connection_the_origin_closed() -> None:
    # The origin answers one request per connection, then closes it without saying so.
    origin = RawHttpServer(lambda method, path: (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", True)).start()

    async def run() -> list[int]:
        transport = OriginTransport()
        try:
            statuses = []
            for _ in range(3):
                request = httpx.Request("GET", f"{origin.url}/", extensions={"timeout": TIMEOUTS})
                statuses.append((await _fetch(transport, request))[0])
                await asyncio.sleep(0.05)  # the origin's close arrives while the connection is idle
            return statuses
        finally:
            await transport.aclose()

    try:
        assert asyncio.run(run()) == [200, 200, 200]
    finally:
        origin.stop()
    assert origin.accepted == 3


def test_origintransport_exchange_hands_over_a_body_that_arrived_whole(origin: ServerThread) -> None:
    async def run() -> tuple[int, bytes | None, bytes]:
        transport = OriginTransport()
        address = OriginAddress("http", "127.0.0.1", origin.port, f"127.0.0.1:{origin.port}".encode())
        try:
            small = await transport.exchange("POST", address, b"/upload", [], b"x" * 10, TIMEOUTS)
            try:
                await asyncio.sleep(0.1)  # the answer's body has arrived by now
                whole = small.received_body()
            finally:
                await small.aclose()
            slow = await transport.exchange("GET", address, b"/slow", [], None, TIMEOUTS)
            try:
                body = b"".join([chunk async for chunk in slow])
            finally:
                await slow.aclose()
            return small.status, whole, body
        finally:
            await transport.aclose()

    status, whole, body = asyncio.run(run())
    assert status == 200 and whole == b'{"received":10,"chunked":null}' and body == b"late"


def test_origintransport_body_ended_by_a_clean_close_is_whole_and_never_reused() -> None:
    def answer(method: bytes, path: bytes) -> tuple[bytes, bool | str]:
        head = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n"
        return head + (b"until the close" if path == b"/close" else b"cut"), True if path == b"/close" else "reset"

    origin = RawHttpServer(answer).start()

    async def run(path: str) -> tuple[int, bytes]:
        transport = OriginTransport()
        try:
            request = httpx.Request("GET", f"{origin.url}{path}", extensions={"timeout": TIMEOUTS})
            first = await _fetch(transport, request)
            await _fetch(transport, request)
            return first
        finally:
            await transport.aclose()

    try:
        assert asyncio.run(run("/close")) == (200, b"until the close")
        assert origin.accepted == 2  # a connection the origin closed is never taken for the next request
        with pytest.raises(httpx.RemoteProtocolError):
            asyncio.run(run("/reset"))
    finally:
        origin.stop()


def test_origintransport_our_own_close_never_ends_a_body_that_ends_at_the_close() -> None:
    """The gate closing its own connections (shutdown, a cancel) is no end of such a body: a fill under way at
    shutdown would store half a page."""

    def answer(method: bytes, path: bytes) -> tuple[bytes, bool | str]:
        time.sleep(0.5)  # the head and half a body, then the rest never (within the test)
        return b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n<p>half", False

    origin = RawHttpServer(answer).start()

    async def run() -> bytes | Exception:
        transport = OriginTransport()
        address = OriginAddress("http", "127.0.0.1", origin.port, b"127.0.0.1")
        answer = await transport.exchange("GET", address, b"/", [], None, {"read": 5.0})
        chunks: list[bytes] = []

        async def read() -> None:
            async for chunk in answer:
                chunks.append(chunk)

        reading = asyncio.ensure_future(read())
        await asyncio.sleep(0.3)
        await transport.aclose()
        try:
            await reading
        except Exception as exc:  # the body was cut: what a fill needs to hear
            return exc
        return b"".join(chunks)

    try:
        result = asyncio.run(run())
    finally:
        origin.stop()
    assert isinstance(result, httpx.RemoteProtocolError), result


def test_origintransport_a_short_body_written_after_its_head_is_handed_over_whole() -> None:
    """Most origins (uvicorn, gunicorn) write a page's head and body apart: a short body of known length is waited
    for and handed over whole; a long one, one of unknown length, or one the origin broke off is streamed."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
    pieces: dict[bytes, list[bytes]] = {
        b"/apart": [head + b"Content-Length: 5\r\n\r\n", b"hello"],
        b"/long": [head + b"Content-Length: 70000\r\n\r\n", b"x" * 70000],
        b"/chunked": [head + b"Transfer-Encoding: chunked\r\n\r\n", b"5\r\nhello\r\n0\r\n\r\n"],
    }

    def answer(method: bytes, path: bytes) -> tuple[list[bytes], bool | str]:
        if path == b"/cut":
            return [head + b"Content-Length: 5\r\n\r\n", b"he"], "reset"
        return pieces[path], False

    origin = RawHttpServer(answer).start()

    async def fetch(path: bytes) -> tuple[bytes | None, bytes | Exception]:
        transport = OriginTransport()
        address = OriginAddress("http", "127.0.0.1", origin.port, b"127.0.0.1")
        answer = await transport.exchange("GET", address, path, [], None, TIMEOUTS)
        try:
            assert answer.received_body() is None  # the body was not there with the head
            whole = await answer.whole_body(65536, 2.0)
            try:
                rest = b"".join([chunk async for chunk in answer])
            except httpx.HTTPError as exc:
                return whole, exc
            return whole, rest
        finally:
            await answer.aclose()
            await transport.aclose()

    try:
        assert asyncio.run(fetch(b"/apart")) == (b"hello", b"")
        assert asyncio.run(fetch(b"/long")) == (None, b"x" * 70000)
        assert asyncio.run(fetch(b"/chunked")) == (None, b"hello")
        whole, cut = asyncio.run(fetch(b"/cut"))
        assert whole is None and isinstance(cut, httpx.RemoteProtocolError)
    finally:
        origin.stop()


def test_origintransport_a_short_body_that_stalls_streams_what_came_then_times_out() -> None:
    """A short body is waited for only briefly: one that stalls gives its head and what came, and then the read
    timeout's error, as any answer does (a person keeps the head's cookie and status)."""

    def answer(method: bytes, path: bytes) -> tuple[bytes, bool | str]:
        return b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhe", False

    origin = RawHttpServer(answer).start()

    async def run() -> tuple[float, bytes]:
        transport = OriginTransport()
        address = OriginAddress("http", "127.0.0.1", origin.port, b"127.0.0.1")
        answer = await transport.exchange("GET", address, b"/", [], None, {"read": 1.0})
        started = time.monotonic()
        came = b""
        try:
            assert await answer.whole_body(65536, 0.3) is None
            waited = time.monotonic() - started
            with pytest.raises(httpx.ReadTimeout):
                async for chunk in answer:
                    came += chunk
            return waited, came
        finally:
            await answer.aclose()
            await transport.aclose()

    try:
        waited, came = asyncio.run(run())
    finally:
        origin.stop()
    assert 0.25 < waited < 0.9 and came == b"he"
