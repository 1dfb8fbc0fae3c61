from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from crawlergate.httpserver import HeadLimits, LimitedHttpToolsProtocol
from tests.conftest import ServerThread

pytestmark = pytest.mark.e2e


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ServerThread]:
    monkeypatch.setattr(HeadLimits, "max_bytes", 8192)
    monkeypatch.setattr(HeadLimits, "max_headers", 20)
    monkeypatch.setattr(HeadLimits, "timeout_s", 0.5)

    async def hello(request):  # type: ignore[no-untyped-def]
        return PlainTextResponse("hello")

    thread = ServerThread(Starlette(routes=[Route("/", hello)]), http=LimitedHttpToolsProtocol).start()
    yield thread
    thread.stop()


def _exchange(server: ServerThread, request: bytes, timeout_s: float = 5) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout_s) as raw:
        raw.sendall(request)
        answer = b""
        while chunk := raw.recv(65536):
            answer += chunk
            if b"hello" in answer:
                break
        return answer


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(b"GET / HTTP/1.1\r\nHost: a\r\nCookie: " + b"x" * 20_000 + b"\r\n\r\n", id="huge-header"),
        pytest.param(b"GET / HTTP/1.1\r\nHost: a\r\n" + b"X-A: 1\r\n" * 50 + b"\r\n", id="too-many-headers"),
    ],
)
def test_httpserver_oversized_head_is_refused_with_431(server: ServerThread, request_bytes: bytes) -> None:
    answer = _exchange(server, request_bytes)
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert _exchange(server, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").startswith(b"HTTP/1.1 200 ")


def test_httpserver_slow_head_is_cut_off(server: ServerThread) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
        raw.sendall(b"GET / HTTP/1.1\r\nHost: a\r\n")  # and never the end of the headers
        started = time.monotonic()
        assert raw.recv(1024) == b""  # closed by the server
        assert time.monotonic() - started < 3


def test_httpserver_keep_alive_requests_still_work(server: ServerThread) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
        for _ in range(3):
            raw.sendall(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
            answer = b""
            while b"hello" not in answer:
                answer += raw.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200 ")
            time.sleep(0.3)  # idle between requests is the keep-alive timeout's, not the head's
