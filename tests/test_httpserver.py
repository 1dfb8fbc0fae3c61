"""The gate's HTTP server protocol: heads too big or too slow refused, keep-alive and pipelining in order, requests
RFC 9112 forbids refused with 400, and a crawler hit answered as the ASGI path would."""

from __future__ import annotations

import asyncio
import gzip
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import HTMLResponse, PlainTextResponse
from starlette.routing import Route

from crawlergate.adapters.httpserver import HeadLimits, LimitedHttpToolsProtocol
from crawlergate.adapters.proxy import create_app
from crawlergate.config import L2Settings, LogSettings, PolicySettings, ServerSettings, Settings
from tests.conftest import ServerThread
from tests.visitors import GOOGLEBOT_LINES

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


def _serve_front(origin: str, l2: L2Settings, **sections: Any) -> ServerThread:
    """``serve``'s app on its own protocol in front of ``origin`` (``options``: uvicorn's), started."""
    options = sections.pop("options", {})
    settings = Settings(server=ServerSettings(origin=origin), l2=l2, **sections)
    return ServerThread(create_app(settings), http=LimitedHttpToolsProtocol, **options).start()


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


def _answered_hello(raw: socket.socket) -> None:
    answer = b""
    while b"hello" not in answer:
        chunk = raw.recv(65536)
        assert chunk, "closed before the answer"
        answer += chunk


def test_httpserver_idle_connection_is_closed_after_keep_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(HeadLimits, "timeout_s", 5.0)

    async def hello(request):  # type: ignore[no-untyped-def]
        return PlainTextResponse("hello")

    app = Starlette(routes=[Route("/", hello)])
    thread = ServerThread(app, http=LimitedHttpToolsProtocol, timeout_keep_alive=1).start()
    try:
        with socket.create_connection(("127.0.0.1", thread.port), timeout=5) as raw:
            for _ in range(3):  # requests move the deadline on: the connection lives past one keep-alive period
                raw.sendall(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
                _answered_hello(raw)
                time.sleep(0.6)
            started = time.monotonic()
            assert raw.recv(1024) == b""  # idle: closed by the server
            assert 0.2 < time.monotonic() - started < 3
    finally:
        thread.stop()


def test_httpserver_a_slow_head_after_a_request_is_cut_at_its_own_deadline(server: ServerThread) -> None:
    """The head timeout (0.5 s here) is shorter than keep-alive (5 s): a head begun after an answer is cut at the
    head's deadline, not when keep-alive's would have come."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=8) as raw:
        raw.sendall(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        _answered_hello(raw)
        raw.sendall(b"GET / HTTP/1.1\r\nHost: a\r\n")  # and never the end of the headers
        started = time.monotonic()
        assert raw.recv(1024) == b""
        assert time.monotonic() - started < 3


@pytest.fixture
def paced_server() -> Iterator[ServerThread]:
    """Answers whose body comes 0.3 s after the head, an empty 304, and an upload read after 100 Continue."""

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return
        if scope["path"] == "/upload":
            received = b""
            while True:
                message = await receive()
                received += message.get("body", b"")
                if not message.get("more_body"):
                    break
            body = b"got %d" % len(received)
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]}
            )
            await send({"type": "http.response.body", "body": body})
            return
        if scope["path"] == "/unchanged":
            await send({"type": "http.response.start", "status": 304, "headers": [(b"etag", b'"7"')]})
            await send({"type": "http.response.body", "body": b""})
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
        await asyncio.sleep(0.3)
        await send({"type": "http.response.body", "body": b"hello"})

    thread = ServerThread(app, http=LimitedHttpToolsProtocol).start()
    yield thread
    thread.stop()


def test_httpserver_sends_a_head_with_its_first_body_bytes(paced_server: ServerThread) -> None:
    with socket.create_connection(("127.0.0.1", paced_server.port), timeout=5) as raw:
        raw.sendall(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        first = raw.recv(65536)  # one segment: head and body together, after the body's 0.3 s
        assert first.startswith(b"HTTP/1.1 200 ") and first.endswith(b"\r\n\r\nhello")


def test_httpserver_answers_without_body_are_not_held(paced_server: ServerThread) -> None:
    with socket.create_connection(("127.0.0.1", paced_server.port), timeout=5) as raw:
        for method, path in (("GET", "/unchanged"), ("HEAD", "/"), ("GET", "/unchanged")):
            raw.sendall(f"{method} {path} HTTP/1.1\r\nHost: a\r\n\r\n".encode())
            answer = raw.recv(65536)  # a held head would time this out
            assert answer.startswith(b"HTTP/1.1 304 " if path == "/unchanged" else b"HTTP/1.1 200 ")
            assert answer.endswith(b"\r\n\r\n")


def test_httpserver_100_continue_is_not_held(paced_server: ServerThread) -> None:
    with socket.create_connection(("127.0.0.1", paced_server.port), timeout=5) as raw:
        raw.sendall(b"POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
        assert raw.recv(65536).startswith(b"HTTP/1.1 100 ")  # the client waits for it before the body
        raw.sendall(b"data")
        answer = b""
        while b"got" not in answer:
            answer += raw.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"got 4")


def test_httpserver_upload_read_with_its_head_is_not_counted_as_head(paced_server: ServerThread) -> None:
    body = b"u" * 200_000  # more than the 64 KB head limit, sent with the head in one write
    with socket.create_connection(("127.0.0.1", paced_server.port), timeout=5) as raw:
        raw.sendall(b"POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        answer = b""
        while b"got" not in answer:
            answer += raw.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"got 200000")


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(b"GET http://a@evil.example/ HTTP/1.1\r\nHost: a\r\n\r\n", id="absolute-form-with-userinfo"),
        pytest.param(b"GET ftp://a/ HTTP/1.1\r\nHost: a\r\n\r\n", id="absolute-form-not-http"),
        pytest.param(b"GET http:///t HTTP/1.1\r\nHost: a\r\n\r\n", id="absolute-form-without-host"),
        pytest.param(b"GET http://a/ HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", id="absolute-form-two-hosts"),
        pytest.param(b"GET http://a/ HTTP/1.1\r\n\r\n", id="absolute-form-http11-without-host"),
        pytest.param(b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n", id="asterisk"),
        pytest.param(b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", id="two-hosts"),
        pytest.param(b"GET / HTTP/1.1\r\n\r\n", id="http11-without-host"),
        pytest.param(b"GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", id="http10-two-hosts"),
        pytest.param(b"GET / HTTP/1.1\r\nHost:\r\n\r\n", id="empty-host"),
        pytest.param(b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", id="host-with-a-space"),
        pytest.param(b"GET / HTTP/1.1\r\nHost: a@evil.example\r\n\r\n", id="host-with-userinfo"),
        pytest.param(b"GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", id="host-with-a-path"),
        pytest.param(
            b"POST / HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            id="http10-chunked",
        ),
    ],
)
def test_httpserver_requests_rfc9112_forbids_are_refused_with_400(server: ServerThread, request_bytes: bytes) -> None:
    answer = _exchange(server, request_bytes)
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    # What remains allowed: HTTP/1.0 without a Host, an ordinary request.
    assert _exchange(server, b"GET / HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.1 200 ")
    assert _exchange(server, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").startswith(b"HTTP/1.1 200 ")


def test_httpserver_a_target_in_absolute_form_is_read_with_its_authority_as_host(tmp_path: Path) -> None:
    """MediaWiki sends its PURGEs as ``PURGE http://host/wiki/Page HTTP/1.0``: RFC 9112 3.2.2 says a server must
    accept it, and its authority, not a Host header, names the site (as nginx reads it)."""

    async def page(request):  # type: ignore[no-untyped-def]
        return HTMLResponse(f"<p>{request.headers['host']} {request.url.path}?{request.url.query}</p>")

    site = ServerThread(Starlette(routes=[Route("/{path:path}", page)])).start()
    front = _serve_front(site.url, L2Settings(cache_dir=str(tmp_path / "l2")))
    try:
        crawler = b"GET HTTP://wiki.example.org/wiki/Main_Page HTTP/1.1\r\nHost: other\r\n" + GOOGLEBOT_LINES
        (filled,) = _answers(front.port, crawler + b"\r\n", 1)
        person = b"GET http://wiki.example.org:8080?q=1 HTTP/1.1\r\nHost: other\r\nCookie: session=1\r\n\r\n"
        (passed,) = _answers(front.port, person, 1)
        purge = b"PURGE http://wiki.example.org/wiki/Main_Page HTTP/1.0\r\nHost: wiki.example.org\r\n\r\n"
        (purged,) = _answers(front.port, purge, 1)
        # The authority ends at the first "/", "?" or "#" (as nginx reads it): "?x/_crawlergate/..." is a query.
        sneaky = b"GET http://wiki.example.org?x/_crawlergate/stats HTTP/1.1\r\nHost: a\r\nCookie: s=1\r\n\r\n"
        (queried,) = _answers(front.port, sneaky, 1)
    finally:
        front.stop()
        site.stop()
    assert b"x-crawlergate: miss" in filled
    assert b"x-crawlergate: pass" in passed and passed.endswith(b"<p>wiki.example.org:8080 /?q=1</p>")
    assert purged.startswith(b"HTTP/1.1 200 ") and purged.endswith(b'{"marked": 1}')
    assert queried.endswith(b"<p>wiki.example.org /?x/_crawlergate/stats</p>")


@pytest.mark.parametrize("coding", [b"gzip, chunked", b"deflate,chunked"])
def test_httpserver_transfer_codings_but_chunked_are_not_implemented(server: ServerThread, coding: bytes) -> None:
    """A body the parser de-chunks but that stays gzip-coded would reach the origin as if plain: 501, as nginx answers;
    chunked alone, in any case, is read."""
    body = gzip.compress(b"compressed me")
    framed = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    head = b"POST / HTTP/1.1\r\nHost: a\r\nConnection: close\r\nTransfer-Encoding: %s\r\n\r\n"
    assert _exchange(server, head % coding + framed).startswith(b"HTTP/1.1 501 ")
    assert _exchange(server, head % b"Chunked" + framed).startswith(b"HTTP/1.1 405 ")  # the app's: it takes GET only


@pytest.mark.parametrize(("version", "status"), [(b"HTTP/2.0", b"505"), (b"HTTP/1.2", b"400"), (b"HTTP/3.0", b"400")])
def test_httpserver_versions_it_does_not_speak_are_refused(server: ServerThread, version: bytes, status: bytes) -> None:
    """ "GET / HTTP/2.0" in HTTP/1 text, without the Host an HTTP/1.1 request must have: 505, as nginx answers it
    (the parser itself refuses the versions it does not know)."""
    assert _exchange(server, b"GET / " + version + b"\r\n\r\n").startswith(b"HTTP/1.1 " + status + b" ")


@pytest.mark.parametrize(
    "host", [b"forum.example.org", b"forum.example.org:8080", b"127.0.0.1:8080", b"[2001:db8::1]:443", b"[::1]"]
)
def test_httpserver_ordinary_hosts_are_taken(server: ServerThread, host: bytes) -> None:
    assert _exchange(server, b"GET / HTTP/1.1\r\nHost: " + host + b"\r\n\r\n").startswith(b"HTTP/1.1 200 ")


def _gate(tmp_path: Path, **options: Any) -> Iterator[tuple[ServerThread, ServerThread]]:
    """``serve``'s app and protocol (uvicorn ``options``) in front of a site with slow pages, as ``crawlergate serve``
    runs them."""

    async def page(request):  # type: ignore[no-untyped-def]
        if request.url.path == "/slow":
            await asyncio.sleep(0.3)
        elif request.url.path == "/slower":
            await asyncio.sleep(1.5)
        elif request.url.path == "/big":  # three pieces of a write, for a client without gzip
            return HTMLResponse("<html><body>" + "".join(f"<p>{n}</p>" for n in range(20_000)) + "</body></html>")
        return HTMLResponse(f"<html><body>{request.url.path}</body></html>")

    site = ServerThread(Starlette(routes=[Route("/{path:path}", page)])).start()
    front = _serve_front(site.url, L2Settings(cache_dir=str(tmp_path / "l2")), options=options)
    yield front, site
    front.stop()
    site.stop()


@pytest.fixture
def gate(tmp_path: Path) -> Iterator[tuple[ServerThread, ServerThread]]:
    yield from _gate(tmp_path)


@pytest.fixture
def impatient_gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ServerThread, ServerThread]]:
    """The gate with keep-alive at 1 s and the head timeout at 0.5 s, both shorter than the site's /slower page."""
    monkeypatch.setattr(HeadLimits, "timeout_s", 0.5)
    yield from _gate(tmp_path, timeout_keep_alive=1)


def _answers(port: int, data: bytes, count: int, *, bodiless: bool = False) -> list[bytes]:
    """The raw answers to ``count`` requests sent in one write, in the order they came.

    An answer ends where its ``content-length`` says (at its head for ``bodiless``
    HEAD answers): waiting for the server to close would race its keep-alive timeout.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        raw.sendall(data)
        received, answers = b"", []
        while len(answers) < count:
            head_end = received.find(b"\r\n\r\n")
            if head_end >= 0:
                length = 0 if bodiless else int(received.split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
                end = head_end + 4 + length
                if len(received) >= end:
                    answers.append(received[:end])
                    received = received[end:]
                    continue
            chunk = raw.recv(65536)
            if not chunk:
                break
            received += chunk
    return answers


def test_httpserver_answers_a_crawler_hit_in_the_protocol_as_the_asgi_way_would(
    gate: tuple[ServerThread, ServerThread],
) -> None:
    front, _ = gate
    request = b"GET /t/1 HTTP/1.1\r\nHost: a\r\n" + GOOGLEBOT_LINES + b"\r\n"
    miss, hit = _answers(front.port, request, 1)[0], _answers(front.port, request, 1)[0]
    assert b"x-crawlergate: miss" in miss and b"x-crawlergate: l1-hit" in hit
    assert miss.partition(b"\r\n\r\n")[2] == hit.partition(b"\r\n\r\n")[2] == b"<html><body>/t/1</body></html>"
    head = _answers(front.port, request.replace(b"GET", b"HEAD"), 1, bodiless=True)
    assert head[0].endswith(b"\r\n\r\n") and b"content-length: 30" in head[0]
    # HTTP/1.0: answered, then the connection closes.
    with socket.create_connection(("127.0.0.1", front.port), timeout=5) as raw:
        raw.sendall(b"GET /t/1 HTTP/1.0\r\n" + GOOGLEBOT_LINES + b"\r\n")
        answer = b""
        while chunk := raw.recv(65536):
            answer += chunk
    assert b"connection: close" in answer and answer.endswith(b"</html>")
    stats = httpx.get(front.url + "/_crawlergate/stats").json()["crawler"]
    assert (stats["requests"], stats["misses"], stats["l1_hits"]) == (4, 1, 3)


def test_httpserver_a_refusal_to_head_sends_no_body_to_spill_into_the_next_answer(
    gate: tuple[ServerThread, ServerThread], tmp_path: Path
) -> None:
    """The gate's own short answers (a cache-only 503, a 403) to HEAD end at their head on a kept-alive
    connection: a body after it would be read as the start of the next answer."""
    _, site = gate
    policy = tmp_path / "policy.toml"
    policy.write_text('[tag]\nsearch-engine = "cache-only"\n')
    l2 = L2Settings(cache_dir=str(tmp_path / "l2-cache-only"))
    front = _serve_front(site.url, l2, policy=PolicySettings(rules_file=str(policy)))
    try:
        head = b"HEAD /t/9 HTTP/1.1\r\nHost: a\r\n" + GOOGLEBOT_LINES + b"\r\n"
        with socket.create_connection(("127.0.0.1", front.port), timeout=5) as raw:
            raw.sendall(head + head.replace(b"HEAD", b"GET"))
            received = b""
            while received.count(b"HTTP/1.1 ") < 2 or not received.endswith(b"later.\n"):
                chunk = raw.recv(65536)
                if not chunk:
                    break
                received += chunk
    finally:
        front.stop()
    first, _, second = received.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 503") and b"content-length: 40" in first
    assert second.startswith(b"HTTP/1.1 503") and second.endswith(b"Not stored yet; please come back later.\n")


def test_httpserver_keeps_pipelined_answers_in_order(gate: tuple[ServerThread, ServerThread]) -> None:
    """A hit behind a slow answer still under way waits its turn: answers leave in the order asked."""
    front, _ = gate
    hit = b"GET /t/2 HTTP/1.1\r\nHost: a\r\n" + GOOGLEBOT_LINES + b"\r\n"
    _answers(front.port, hit, 1)
    person = b"GET /slow HTTP/1.1\r\nHost: a\r\nUser-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:120.0) Gecko/20100101 "
    person += b"Firefox/120.0\r\nAccept: text/html\r\nAccept-Language: en\r\nSec-Fetch-Mode: navigate\r\n\r\n"
    first, second, third = _answers(front.port, person + hit + hit, 3)
    assert b"x-crawlergate: pass" in first and first.endswith(b"/slow</body></html>")
    assert b"x-crawlergate: l1-hit" in second and second.endswith(b"/t/2</body></html>")
    assert b"x-crawlergate: l1-hit" in third


def test_httpserver_requests_behind_a_fill_wait_their_turn(gate: tuple[ServerThread, ServerThread]) -> None:
    """The protocol writes a fill's answer itself: a person's request and a hit sent behind it are answered after
    it, in order, on the same connection."""
    front, _ = gate
    hit = b"GET /t/3 HTTP/1.1\r\nHost: a\r\n" + GOOGLEBOT_LINES + b"\r\n"
    _answers(front.port, hit, 1)
    fill = b"GET /slow HTTP/1.1\r\nHost: a\r\n" + GOOGLEBOT_LINES + b"\r\n"
    head = fill.replace(b"GET /slow", b"HEAD /t/4")
    person = b"GET /t/5 HTTP/1.1\r\nHost: a\r\nUser-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:120.0) Gecko/20100101 "
    person += b"Firefox/120.0\r\nAccept: text/html\r\nAccept-Language: en\r\nSec-Fetch-Mode: navigate\r\n\r\n"
    first, second, third = _answers(front.port, fill + person + hit, 3)
    assert b"x-crawlergate: miss" in first and first.endswith(b"/slow</body></html>")
    assert b"x-crawlergate: pass" in second and second.endswith(b"/t/5</body></html>")
    assert b"x-crawlergate: l1-hit" in third and third.endswith(b"/t/3</body></html>")
    (head_answer,) = _answers(front.port, head, 1, bodiless=True)  # a HEAD's miss: the head alone
    assert b"x-crawlergate: miss" in head_answer and head_answer.endswith(b"\r\n\r\n")


def test_httpserver_a_fill_whose_crawler_left_is_stored_and_the_server_goes_on(
    gate: tuple[ServerThread, ServerThread],
) -> None:
    front, _ = gate
    request = b"GET /slower HTTP/1.1\r\nHost: a\r\n" + GOOGLEBOT_LINES + b"\r\n"
    with socket.create_connection(("127.0.0.1", front.port), timeout=5) as raw:
        raw.sendall(request)
        time.sleep(0.2)  # the fill is under way; the crawler leaves
    deadline = time.monotonic() + 10
    while b"x-crawlergate: l1-hit" not in (answer := _answers(front.port, request, 1)[0]):
        assert b"x-crawlergate: miss" in answer and time.monotonic() < deadline  # the leader's fill, shared
    assert answer.endswith(b"/slower</body></html>")


def test_httpserver_max_connections_holds_for_answers_that_wait(tmp_path: Path) -> None:
    """uvicorn's ``limit_concurrency`` (``server.max_connections``) turns away a fill past it with 503, as a person's
    request: the protocol's own answers are no way around it."""
    gate = _gate(tmp_path, limit_concurrency=2)
    front, _ = next(gate)
    try:
        clients = []
        for number in range(3):  # the first fill is under way alone; the others come while it waits
            clients.append(socket.create_connection(("127.0.0.1", front.port), timeout=5))
            clients[-1].sendall(b"GET /slower?n=%d HTTP/1.1\r\nHost: a\r\n" % number + GOOGLEBOT_LINES + b"\r\n")
            time.sleep(0.2)
        statuses = [client.recv(12)[9:12] for client in clients]
        for client in clients:
            client.close()
    finally:
        next(gate, None)
    assert b"503" in statuses and b"200" in statuses


def test_httpserver_a_large_page_goes_out_whole_in_pieces(gate: tuple[ServerThread, ServerThread]) -> None:
    """A page larger than one write (here 200 KB once decompressed) leaves in pieces, as the client takes them."""
    front, _ = gate
    request = b"GET /big HTTP/1.1\r\nHost: a\r\nUser-Agent: Googlebot/2.1 (+http://www.google.com/bot.html)\r\n\r\n"
    miss, hit = _answers(front.port, request + request, 2)
    assert b"x-crawlergate: miss" in miss and b"x-crawlergate: l1-hit" in hit
    body = miss.partition(b"\r\n\r\n")[2]
    assert len(body) > 3 * 64 * 1024 and body == hit.partition(b"\r\n\r\n")[2] and body.endswith(b"</html>")


def test_httpserver_a_page_too_large_to_store_is_asked_of_the_site_after_all(tmp_path: Path) -> None:
    """When the fill finds the page too large to store, the crawler's request goes to the site the ASGI way, and
    the request behind it is answered after it."""
    site = ServerThread(Starlette(routes=[Route("/{path:path}", lambda request: HTMLResponse("x" * 5000))])).start()
    front = _serve_front(site.url, L2Settings(cache_dir=str(tmp_path / "l2"), page_max_bytes=1000))
    try:
        request = b"GET /large HTTP/1.1\r\nHost: a\r\n" + GOOGLEBOT_LINES + b"\r\n"
        first, second = _answers(front.port, request + request, 2)
    finally:
        front.stop()
        site.stop()
    for answer in (first, second):
        assert b"x-crawlergate: pass" in answer and answer.endswith(b"x" * 5000)


def test_httpserver_a_crawler_that_leaves_before_its_fill_is_over_is_logged_as_nginx_logs_it(tmp_path: Path) -> None:
    """The fill goes on and stores its page, but the client never got it: 499 with 0 bytes, not 200 "delivered"."""

    async def slow(request):  # type: ignore[no-untyped-def]
        await asyncio.sleep(1)
        return HTMLResponse("<p>a page</p>")

    site = ServerThread(Starlette(routes=[Route("/{path:path}", slow)])).start()
    log = tmp_path / "access.log"
    front = _serve_front(site.url, L2Settings(cache_dir=str(tmp_path / "l2")), log=LogSettings(access_log=str(log)))
    try:
        with socket.create_connection(("127.0.0.1", front.port), timeout=5) as raw:
            raw.sendall(b"GET /left HTTP/1.1\r\nHost: a\r\n" + GOOGLEBOT_LINES + b"\r\n")
            time.sleep(0.3)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and " miss " not in (log.read_text() if log.exists() else ""):
            time.sleep(0.1)
        stayed = _answers(front.port, b"GET /left HTTP/1.1\r\nHost: a\r\n" + GOOGLEBOT_LINES + b"\r\n", 1)
        time.sleep(0.7)  # past the log's flush
    finally:
        front.stop()
        site.stop()
    first, second = log.read_text().splitlines()
    assert '"GET /left HTTP/1.1" 499 0 ' in first and " miss " in first
    assert b"x-crawlergate: l1-hit" in stayed[0] and '"GET /left HTTP/1.1" 200 ' in second


def test_httpserver_a_request_behind_a_hit_in_one_read_is_not_cut_by_keep_alive(
    impatient_gate: tuple[ServerThread, ServerThread],
) -> None:
    """The hit's answer is complete before the next request is read: the connection is busy, not idle, while that
    request (a fill taking longer than keep-alive) is answered."""
    front, _ = impatient_gate
    hit = b"GET /t/1 HTTP/1.1\r\nHost: a\r\n" + GOOGLEBOT_LINES + b"\r\n"
    _answers(front.port, hit, 1)  # stored
    slower = b"GET /slower HTTP/1.1\r\nHost: a\r\n" + GOOGLEBOT_LINES + b"\r\n"
    first, second = _answers(front.port, hit + slower, 2)
    assert b"x-crawlergate: l1-hit" in first
    assert b"x-crawlergate: miss" in second and second.endswith(b"/slower</body></html>")


def test_httpserver_a_head_sent_behind_a_slow_answer_is_timed_from_that_answer(
    impatient_gate: tuple[ServerThread, ServerThread],
) -> None:
    """The start of the next request, sent with the current one, waits its turn: the head timeout runs from the
    current answer, not from when its first bytes came."""
    front, _ = impatient_gate
    slower = b"GET /slower HTTP/1.1\r\nHost: a\r\n" + GOOGLEBOT_LINES + b"\r\n"
    answers = _answers(front.port, slower + b"GET /t/2 HT", 1)
    assert len(answers) == 1 and answers[0].endswith(b"/slower</body></html>")


def test_httpserver_bare_line_ends_do_not_keep_an_idle_connection_open(
    impatient_gate: tuple[ServerThread, ServerThread],
) -> None:
    front, _ = impatient_gate
    with socket.create_connection(("127.0.0.1", front.port), timeout=5) as raw:
        raw.sendall(b"GET /t/3 HTTP/1.1\r\nHost: a\r\n" + GOOGLEBOT_LINES + b"\r\n")
        received = b""
        while not received.endswith(b"</html>"):
            received += raw.recv(65536)
        started = time.monotonic()
        closed = False
        for _ in range(20):  # a line end every 0.3 s, 6 s in all: the server closes long before
            time.sleep(0.3)
            try:
                raw.sendall(b"\r\n")
                closed = raw.recv(1, socket.MSG_DONTWAIT) == b""
            except BlockingIOError:
                continue
            except OSError:
                closed = True
            if closed:
                break
        assert closed and time.monotonic() - started < 3


def test_httpserver_a_body_read_after_its_hit_is_no_head(gate: tuple[ServerThread, ServerThread]) -> None:
    """A crawler's GET with a body is answered from the cache at its head; the body that follows is read as a body
    (never counted against the head's 64 KB), and the connection serves the next request."""
    front, _ = gate
    hit = b"GET /t/4 HTTP/1.1\r\nHost: a\r\n" + GOOGLEBOT_LINES + b"\r\n"
    _answers(front.port, hit, 1)  # stored
    with_body = hit.replace(b"\r\n\r\n", b"\r\nContent-Length: 100000\r\n\r\n")
    with socket.create_connection(("127.0.0.1", front.port), timeout=5) as raw:
        raw.sendall(with_body)
        received = b""
        while not received.endswith(b"</html>"):
            received += raw.recv(65536)
        assert b"x-crawlergate: l1-hit" in received
        raw.sendall(b"z" * 100_000 + hit)
        received = b""
        while not received.endswith(b"</html>"):
            chunk = raw.recv(65536)
            assert chunk, "closed"
            received += chunk
        assert received.startswith(b"HTTP/1.1 200 ") and b"x-crawlergate: l1-hit" in received


@pytest.mark.parametrize(
    "refused",
    [
        pytest.param(b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", id="bad-host-400"),
        pytest.param(b"GET / HTTP/1.1\r\nHost: a\r\n" + b"X-A: 1\r\n" * 150 + b"\r\n", id="too-many-headers-431"),
    ],
)
def test_httpserver_a_refused_request_is_answered_after_the_ones_before_it(
    gate: tuple[ServerThread, ServerThread], refused: bytes
) -> None:
    """Pipelined behind a request still being answered, a request refused at its head gets its refusal after that
    answer, never in its place; what follows the refusal is not read."""
    front, _ = gate
    slow = b"GET /slow HTTP/1.1\r\nHost: a\r\n" + GOOGLEBOT_LINES + b"\r\n"
    after = b"GET /t/5 HTTP/1.1\r\nHost: a\r\n" + GOOGLEBOT_LINES + b"\r\n"
    with socket.create_connection(("127.0.0.1", front.port), timeout=5) as raw:
        raw.sendall(slow + refused + after)
        received = b""
        while chunk := raw.recv(65536):
            received += chunk
    first, _, rest = received.partition(b"</html>")
    assert first.startswith(b"HTTP/1.1 200 ") and first.endswith(b"/slow</body>")
    assert rest.startswith((b"HTTP/1.1 400 ", b"HTTP/1.1 431 ")) and b"connection: close" in rest
    assert rest.count(b"HTTP/1.1 ") == 1
