"""The replay tools' HTTP client: connections kept alive across every body framing, reconnects after a close, and
errors sorted by kind."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest

from crawlergate.tools.httpclient import ConnectionPool, ReplayError
from tests.conftest import RawHttpServer, free_port

ANSWERS = {
    b"/plain": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Crawlergate: l1-hit\r\n\r\nhello",
    b"/head": b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n",  # answered to HEAD: no body follows
    b"/chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    b"/close": b"HTTP/1.1 404 Not Found\r\nConnection: close\r\nContent-Length: 2\r\n\r\nno",
    b"/notmodified": b'HTTP/1.1 304 Not Modified\r\nETag: "x"\r\n\r\n',
}


@pytest.fixture
def origin() -> Iterator[RawHttpServer]:
    server = RawHttpServer(lambda method, path: (ANSWERS[path], path == b"/close")).start()
    yield server
    server.stop()


def _request(method: str, path: str) -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()


def test_httpclient_keeps_connections_alive_and_reads_every_framing(origin: RawHttpServer) -> None:
    port = origin.port

    async def run() -> list[tuple[int, str]]:
        async with ConnectionPool("127.0.0.1", port, size=1) as pool:
            answers = []
            for method, path in [("GET", "/plain"), ("HEAD", "/head"), ("GET", "/chunked"), ("GET", "/notmodified")]:
                answer = await pool.fetch(_request(method, path), head=method == "HEAD", timeout_s=5)
                assert answer.first_byte <= answer.finished
                answers.append((answer.status, answer.outcome))
            return answers

    assert asyncio.run(run()) == [(200, "l1-hit"), (200, ""), (200, ""), (304, "")]
    assert origin.accepted == 1  # one connection for all four


def test_httpclient_reconnects_after_connection_close(origin: RawHttpServer) -> None:
    port = origin.port

    async def run() -> list[int]:
        async with ConnectionPool("127.0.0.1", port, size=1) as pool:
            return [(await pool.fetch(_request("GET", path), head=False, timeout_s=5)).status
                    for path in ("/close", "/plain", "/close", "/plain")]  # fmt: skip

    assert asyncio.run(run()) == [404, 200, 404, 200]
    assert origin.accepted == 3


def test_httpclient_errors_have_kinds() -> None:
    async def refused() -> None:
        async with ConnectionPool("127.0.0.1", free_port(), size=1) as pool:
            await pool.fetch(_request("GET", "/"), head=False, timeout_s=5)

    with pytest.raises(ReplayError) as error:
        asyncio.run(refused())
    assert error.value.kind == "ConnectError"

    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never answers

    async def timeout() -> None:
        async with ConnectionPool("127.0.0.1", silent.getsockname()[1], size=1) as pool:
            await pool.fetch(_request("GET", "/"), head=False, timeout_s=0.2)

    try:
        with pytest.raises(ReplayError) as error:
            asyncio.run(timeout())
    finally:
        silent.close()
    assert error.value.kind == "timeout"
