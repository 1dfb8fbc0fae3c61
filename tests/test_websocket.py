"""WebSockets through the proxy: messages both ways, closes from either side, headers and subprotocol forwarded,
and a refusing, down, silent or oversized origin handled."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import queue
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse, RedirectResponse
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from crawlergate.adapters.asgi import CrawlerGateMiddleware
from crawlergate.adapters.proxy import ReverseProxy, create_app
from crawlergate.config import L2Settings, ServerSettings, Settings
from crawlergate.demo.run import free_port
from tests.conftest import ServerThread
from tests.visitors import FIREFOX_UA

pytestmark = pytest.mark.e2e

MB = 1024 * 1024


# (tag, close code, close reason, messages received) of each /echo?tag= connection, as the origin saw it.
Closes = queue.Queue[tuple[str, int, str, int]]


def echo_app(closes: Closes) -> Starlette:
    """The origin: echoes text and binary, and reports how each ``/echo?tag=`` connection ended into ``closes``."""

    async def echo(websocket: WebSocket) -> None:
        await websocket.accept()
        received = 0
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                tag = websocket.query_params.get("tag", "")
                closes.put((tag, message.get("code", 1000), message.get("reason") or "", received))
                return
            received += 1
            if message.get("text") is not None:
                await websocket.send_text(message["text"])
            else:
                await websocket.send_bytes(message["bytes"])

    async def server_close(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.receive_text()
        await websocket.close(4000, "the server says goodbye")

    async def headers(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_json(
            {
                "headers": [[name.decode(), value.decode()] for name, value in websocket.scope["headers"]],
                "path": websocket.scope["raw_path"].decode(),
                "query": websocket.url.query,
            }
        )
        await websocket.close()

    async def protocol(websocket: WebSocket) -> None:
        if "chat.v1" not in websocket.scope["subprotocols"] or websocket.cookies.get("session") != "abc":
            await websocket.close()
            return
        await websocket.accept(subprotocol="chat.v1", headers=[(b"set-cookie", b"seen=1; Path=/")])
        await websocket.send_text(websocket.headers.get("x-chat", ""))
        await websocket.close()

    async def big(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_bytes(b"b" * (2 * MB))
        await websocket.receive()

    async def refuse(websocket: WebSocket) -> None:
        await websocket.close()

    async def deny(websocket: WebSocket) -> None:
        await websocket.send_denial_response(PlainTextResponse("no such channel", status_code=404))

    async def redirect(websocket: WebSocket) -> None:
        await websocket.send_denial_response(RedirectResponse("/echo", status_code=307))

    return Starlette(
        routes=[
            WebSocketRoute("/echo", echo),
            WebSocketRoute("/server-close", server_close),
            WebSocketRoute("/headers/{rest:path}", headers),
            WebSocketRoute("/protocol", protocol),
            WebSocketRoute("/big", big),
            WebSocketRoute("/refuse", refuse),
            WebSocketRoute("/deny", deny),
            WebSocketRoute("/redirect", redirect),
        ]
    )


@pytest.fixture(scope="module")
def closes() -> Closes:
    return queue.Queue()


@pytest.fixture(scope="module")
def origin(closes: Closes) -> Iterator[ServerThread]:
    server = ServerThread(echo_app(closes)).start()
    yield server
    server.stop()


def _settings(origin: str, cache_dir: Path) -> Settings:
    return Settings(server=ServerSettings(origin=origin), l2=L2Settings(cache_dir=str(cache_dir)))


@pytest.fixture(scope="module")
def proxy(origin: ServerThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """``crawlergate serve``: the gate around a ReverseProxy to the origin."""
    server = ServerThread(create_app(_settings(origin.url, tmp_path_factory.mktemp("cache")))).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def mounted(closes: Closes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """The gate mounted around the site itself: WebSockets pass through the middleware untouched."""
    app = CrawlerGateMiddleware(echo_app(closes), settings=_settings("", tmp_path_factory.mktemp("cache")))
    server = ServerThread(app).start()
    yield server
    server.stop()


def _ws(server: ServerThread, path: str, **options: Any) -> ClientConnection:
    """A client connection, to be used in a ``with`` block (websockets 17.1 deprecates the bare form)."""
    websocket: ClientConnection = connect(f"ws://127.0.0.1:{server.port}{path}", open_timeout=5, **options)
    return websocket


def _close_seen_by_origin(closes: Closes, tag: str) -> tuple[int, str, int]:
    while True:
        seen, code, reason, received = closes.get(timeout=5)
        if seen == tag:
            return code, reason, received


def _relay_tasks() -> list[asyncio.Task[object]]:
    return [
        task
        for task in gc.get_objects()
        if type(task) is asyncio.Task
        and not task.done()
        and "WebSocketRelay" in getattr(task.get_coro(), "__qualname__", "")
    ]


def _settled(*servers: ServerThread) -> None:
    """Wait until no server holds a connection or an ASGI task and no relay pump runs: nothing is left behind."""
    deadline = time.monotonic() + 5
    while _relay_tasks() or any(
        server.server.server_state.connections or server.server.server_state.tasks for server in servers
    ):
        assert time.monotonic() < deadline, "a connection or task outlived its WebSocket"
        time.sleep(0.01)


@pytest.mark.parametrize("through", ["proxy", "mounted"])
def test_websocket_relays_text_and_binary_both_ways(through: str, request: pytest.FixtureRequest) -> None:
    server: ServerThread = request.getfixturevalue(through)
    with _ws(server, "/echo") as websocket:
        websocket.send("héllo")
        assert websocket.recv(timeout=5) == "héllo"
        websocket.send(b"\x00\xffbinary")
        assert websocket.recv(timeout=5) == b"\x00\xffbinary"
        websocket.send(b"x" * (MB - 1))
        assert websocket.recv(timeout=5) == b"x" * (MB - 1)


@pytest.mark.parametrize("through", ["proxy", "mounted"])
def test_websocket_client_close_reaches_the_origin(
    through: str, request: pytest.FixtureRequest, closes: Closes, origin: ServerThread
) -> None:
    server: ServerThread = request.getfixturevalue(through)
    with _ws(server, f"/echo?tag=client-close-{through}") as websocket:
        websocket.send("ping")
        websocket.recv(timeout=5)
        websocket.close(4001, "the client is done")
    assert _close_seen_by_origin(closes, f"client-close-{through}") == (4001, "the client is done", 1)
    _settled(server, origin)


@pytest.mark.parametrize("through", ["proxy", "mounted"])
def test_websocket_server_close_reaches_the_client(
    through: str, request: pytest.FixtureRequest, origin: ServerThread
) -> None:
    server: ServerThread = request.getfixturevalue(through)
    with _ws(server, "/server-close") as websocket:
        websocket.send("bye?")
        with pytest.raises(ConnectionClosed) as closed:
            websocket.recv(timeout=5)
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4000, "the server says goodbye")
    _settled(server, origin)


def _headers_seen_by_origin(proxy: ServerThread, host: str, headers: dict[str, str]) -> dict[str, Any]:
    """What /headers saw, asked through ``proxy`` by a client that names the site ``host``."""
    sock = socket.create_connection(("127.0.0.1", proxy.port))
    url = f"ws://{host}/headers/a%2Fb?x=1&y=%20"
    with connect(url, sock=sock, open_timeout=5, additional_headers=headers, user_agent_header=None) as websocket:
        seen: dict[str, Any] = json.loads(websocket.recv(timeout=5))
    return seen


def test_websocket_forwards_headers_path_and_query(proxy: ServerThread) -> None:
    headers = {
        "User-Agent": FIREFOX_UA,
        "Cookie": "session=abc",
        "Origin": "https://forum.example",
        "X-Forwarded-For": "203.0.113.7",
    }
    seen = _headers_seen_by_origin(proxy, "forum.example:8443", headers)
    assert seen["path"] == "/headers/a%2Fb" and seen["query"] == "x=1&y=%20"
    got = dict(seen["headers"])
    names = [name for name, _ in seen["headers"]]
    # The client is on loopback, a trusted proxy by default: its X-Forwarded-For is extended, as over HTTP.
    assert got["x-forwarded-for"] == "203.0.113.7, 127.0.0.1"
    assert got["x-forwarded-proto"] == "http"
    assert got["x-forwarded-host"] == "forum.example:8443"
    assert got["host"] == "forum.example:8443"  # server.forward_host = "client", as over HTTP
    assert (got["cookie"], got["origin"], got["user-agent"]) == ("session=abc", headers["Origin"], FIREFOX_UA)
    # The handshake headers are the relay's own, once each, not the client's copies next to them.
    assert [names.count(name) for name in ("host", "upgrade", "connection", "sec-websocket-key")] == [1, 1, 1, 1]
    assert "sec-websocket-extensions" not in names


def test_websocket_forward_host_origin_sends_the_origin_address(origin: ServerThread, tmp_path: Path) -> None:
    settings = Settings(
        server=ServerSettings(origin=origin.url, forward_host="origin"), l2=L2Settings(cache_dir=str(tmp_path))
    )
    proxy = ServerThread(create_app(settings)).start()
    try:
        got = dict(_headers_seen_by_origin(proxy, "forum.example", {})["headers"])
    finally:
        proxy.stop()
    assert got["host"] == f"127.0.0.1:{origin.port}"
    assert got["x-forwarded-host"] == "forum.example"


def test_websocket_negotiates_the_subprotocol_the_origin_chose(proxy: ServerThread) -> None:
    options = {"subprotocols": ["chat.v2", "chat.v1"], "additional_headers": {"Cookie": "session=abc", "X-Chat": "7"}}
    with _ws(proxy, "/protocol", **options) as websocket:
        assert websocket.subprotocol == "chat.v1"
        assert websocket.response is not None and websocket.response.headers["set-cookie"] == "seen=1; Path=/"
        assert websocket.recv(timeout=5) == "7"


@pytest.mark.parametrize("path", ["/refuse", "/deny", "/redirect", "/no-such-route"])
def test_websocket_origin_refuses_the_handshake(
    path: str, proxy: ServerThread, origin: ServerThread, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="crawlergate.adapters.websocket")
    for _ in range(3):
        with pytest.raises(InvalidStatus) as refused:
            _ws(proxy, path)
        assert refused.value.response.status_code == 403
    # Logged at most once a minute, whoever asks: the relay is shared by the module's tests.
    warnings = [record for record in caplog.records if record.name == "crawlergate.adapters.websocket"]
    assert len(warnings) <= 1 and all(w.levelno == logging.WARNING for w in warnings)
    assert all(origin.url in w.getMessage() and path in w.getMessage() for w in warnings)
    _settled(proxy, origin)


def test_websocket_origin_down_refuses_the_handshake(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="crawlergate.adapters.websocket")
    proxy = ServerThread(create_app(_settings(f"http://127.0.0.1:{free_port()}", tmp_path))).start()
    try:
        with pytest.raises(InvalidStatus) as refused:
            _ws(proxy, "/echo")
    finally:
        proxy.stop()
    assert refused.value.response.status_code == 403
    warnings = [record for record in caplog.records if record.name == "crawlergate.adapters.websocket"]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING


def test_websocket_origin_silent_times_out_at_the_connect_timeout() -> None:
    # A socket that listens but never answers: the kernel completes the TCP handshake, nobody the HTTP one.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        proxy = ServerThread(ReverseProxy(f"http://127.0.0.1:{silent.getsockname()[1]}", connect_timeout_s=0.3))
        proxy.start()
        try:
            started = time.monotonic()
            with pytest.raises(InvalidStatus) as refused:
                _ws(proxy, "/echo")
            waited = time.monotonic() - started
        finally:
            proxy.stop()
    assert refused.value.response.status_code == 403
    assert 0.3 <= waited < 3


def test_websocket_oversize_client_message_closes_with_1009(
    proxy: ServerThread, origin: ServerThread, closes: Closes
) -> None:
    with _ws(proxy, "/echo?tag=oversize") as websocket:
        websocket.send(b"x" * (MB + 1))
        with pytest.raises(ConnectionClosed) as closed:
            websocket.recv(timeout=5)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    code, _, received = _close_seen_by_origin(closes, "oversize")
    assert code == 1009 and received == 0  # the message never reached the origin
    _settled(proxy, origin)


def test_websocket_oversize_origin_message_closes_with_1009(proxy: ServerThread, origin: ServerThread) -> None:
    with _ws(proxy, "/big", max_size=4 * MB) as websocket, pytest.raises(ConnectionClosed) as closed:
        websocket.recv(timeout=5)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    _settled(proxy, origin)


def test_websocket_message_size_is_a_proxy_option(origin: ServerThread) -> None:
    proxy = ServerThread(ReverseProxy(origin.url, websocket_max_message_bytes=3 * MB)).start()
    try:
        with _ws(proxy, "/echo", max_size=4 * MB) as websocket:
            websocket.send(b"x" * (2 * MB))
            assert len(websocket.recv(timeout=5)) == 2 * MB
    finally:
        proxy.stop()
