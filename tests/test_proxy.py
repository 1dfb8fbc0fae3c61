"""The standalone proxy (`crawlergate serve`) in front of the demo forum: every method forwarded, cookies and
redirects kept for people, cached pages for crawlers, and the serve process started, stopped and reported."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from crawlergate.adapters.inapp import AsgiOrigin
from crawlergate.adapters.proxy import ReverseProxy, create_app
from crawlergate.config import CacheSettings, L2Settings, ServerSettings, Settings
from crawlergate.demo.forum import create_forum
from crawlergate.errors import OriginError
from crawlergate.gate.origin import PublicSite
from tests.conftest import RawHttpServer, ServerThread, free_port, proxy_thread, serve_process, wait_until_healthy
from tests.visitors import FIREFOX, FIREFOX_LINES, GOOGLEBOT

pytestmark = pytest.mark.e2e

MB = 1024 * 1024


@pytest.fixture(scope="module")
def forum(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """The demo forum on uvicorn, with little work per page so the tests stay quick."""
    db = tmp_path_factory.mktemp("forum") / "forum.sqlite3"
    server = ServerThread(create_forum(db, threads=200, work_ms=1, rounds_per_ms=1000)).start()
    yield server
    server.stop()


def echo_app() -> Starlette:
    async def echo(request: Request) -> Response:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
        return JSONResponse(
            {"method": request.method, "headers": dict(request.headers), "received": size, "query": request.url.query}
        )

    async def download(request: Request) -> Response:
        total = int(request.query_params["mb"]) * MB

        async def chunks() -> AsyncIterator[bytes]:
            block = b"x" * (64 * 1024)
            for _ in range(total // len(block)):
                yield block

        return StreamingResponse(chunks(), media_type="application/octet-stream")

    methods = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
    return Starlette(routes=[Route("/echo/{rest:path}", echo, methods=methods), Route("/download", download)])


@pytest.fixture(scope="module")
def echo() -> Iterator[ServerThread]:
    server = ServerThread(echo_app()).start()
    yield server
    server.stop()


def _proxy(origin: str, tmp_path: Path, **server: object) -> ServerThread:
    return proxy_thread(origin, tmp_path, cache=CacheSettings(ttl_seconds=0.5, max_stale_seconds=0), **server)


@pytest.fixture
def forum_proxy(forum: ServerThread, tmp_path: Path) -> Iterator[ServerThread]:
    proxy = _proxy(forum.url, tmp_path)
    yield proxy
    proxy.stop()


@pytest.fixture
def echo_proxy(echo: ServerThread, tmp_path: Path) -> Iterator[ServerThread]:
    proxy = _proxy(echo.url, tmp_path, max_body_bytes=512 * MB)  # the large upload below, past the default
    yield proxy
    proxy.stop()


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"])
def test_proxy_forwards_every_method(echo_proxy: ServerThread, method: str) -> None:
    response = httpx.request(method, f"{echo_proxy.url}/echo/a%2Fb?x=1&y=2", content=b"body", headers=FIREFOX)
    assert response.status_code == 200
    data = response.json()
    assert data["method"] == method
    assert data["query"] == "x=1&y=2"
    assert response.headers["x-crawlergate"] == "pass"


def test_proxy_head_has_no_body(echo_proxy: ServerThread) -> None:
    response = httpx.head(f"{echo_proxy.url}/echo/x", headers=FIREFOX)
    assert response.status_code == 200 and response.content == b""


def test_proxy_drops_hop_by_hop_and_sets_forwarded_headers(echo_proxy: ServerThread) -> None:
    headers = {**FIREFOX, "connection": "keep-alive, x-secret-hop", "x-secret-hop": "1", "te": "trailers"}
    headers["x-forwarded-for"] = "203.0.113.7"
    seen = httpx.get(f"{echo_proxy.url}/echo/x", headers=headers).json()["headers"]
    assert "x-secret-hop" not in seen and "te" not in seen
    # The test client is on loopback, a trusted proxy by default: its X-Forwarded-For is extended.
    assert seen["x-forwarded-for"] == "203.0.113.7, 127.0.0.1"
    assert seen["x-forwarded-proto"] == "http"
    assert seen["x-forwarded-host"] == f"127.0.0.1:{echo_proxy.port}"


def test_proxy_ignores_forwarded_headers_from_untrusted_clients(echo: ServerThread, tmp_path: Path) -> None:
    proxy = _proxy(echo.url, tmp_path, trusted_proxies=())
    try:
        spoofed = {**FIREFOX, "x-forwarded-for": "1.2.3.4", "x-forwarded-host": "evil.test"}
        seen = httpx.get(f"{proxy.url}/echo/x", headers=spoofed).json()["headers"]
    finally:
        proxy.stop()
    assert seen["x-forwarded-for"] == "127.0.0.1"
    assert seen["x-forwarded-host"] == f"127.0.0.1:{proxy.port}"


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_proxy_streams_large_bodies_both_ways(echo_proxy: ServerThread) -> None:
    size_mb = 256
    before = _rss_bytes()

    def upload() -> Iterator[bytes]:
        block = b"u" * (64 * 1024)
        for _ in range(size_mb * MB // len(block)):
            yield block

    sent = httpx.post(f"{echo_proxy.url}/echo/upload", content=upload(), headers=FIREFOX, timeout=120)
    assert sent.json()["received"] == size_mb * MB
    received = 0
    with httpx.stream("GET", f"{echo_proxy.url}/download?mb={size_mb}", headers=FIREFOX, timeout=120) as response:
        for chunk in response.iter_raw():
            received += len(chunk)
    assert received == size_mb * MB
    # Client, proxy and origin all live in this process: none of them held the body.
    assert _rss_bytes() - before < 64 * MB


def test_proxy_preserves_cookies_and_redirects_for_humans(forum_proxy: ServerThread) -> None:
    with httpx.Client(base_url=forum_proxy.url, headers=FIREFOX) as client:
        login = client.post("/login", data={"member": "3"})
        assert login.status_code == 303 and login.headers["location"] == "/"
        assert login.headers["set-cookie"].startswith("sessionid=3.")
        page = client.get("/showthread.php?t=5")
    assert "unread messages" in page.text and page.headers["x-crawlergate"] == "pass"


def test_proxy_logged_in_crawler_agent_never_gets_the_guest_page(forum_proxy: ServerThread) -> None:
    with httpx.Client(base_url=forum_proxy.url) as client:
        client.get("/showthread.php?t=5", headers=GOOGLEBOT)
        assert client.get("/showthread.php?t=5", headers=GOOGLEBOT).headers["x-crawlergate"] == "l1-hit"
        client.post("/login", data={"member": "3"}, headers=FIREFOX)
        page = client.get("/showthread.php?t=5", headers=GOOGLEBOT)
    assert page.headers["x-crawlergate"] == "pass"
    assert "unread messages" in page.text


def test_proxy_crawlers_get_cached_pages(forum_proxy: ServerThread) -> None:
    with httpx.Client(base_url=forum_proxy.url, headers=GOOGLEBOT) as client:
        outcomes = [client.get("/showthread.php?t=9&utm_source=x").headers["x-crawlergate"] for _ in range(3)]
        page = client.get("/showthread.php?t=9")
    assert outcomes == ["miss", "l1-hit", "l1-hit"]
    assert "<h2>" in page.text and "unread" not in page.text


def test_proxy_origin_down_stale_or_502(tmp_path: Path) -> None:
    origin = ServerThread(echo_app()).start()
    proxy = _proxy(origin.url, tmp_path)
    try:
        with httpx.Client(base_url=proxy.url, headers=GOOGLEBOT) as client:
            assert client.get("/echo/cached").headers["x-crawlergate"] == "miss"
            origin.stop()
            time.sleep(0.6)  # past the page's 0.5 s lifetime: the gate must ask the origin again
            stale = client.get("/echo/cached")
            missing = client.get("/echo/never-cached")
            human = client.get("/echo/cached", headers=FIREFOX)
    finally:
        proxy.stop()
    assert stale.status_code == 200 and stale.headers["x-crawlergate"] == "stale"
    assert missing.status_code == 502
    assert human.status_code == 502 and human.headers["x-crawlergate"] == "pass"
    assert len(list((tmp_path / "l2").rglob("*.page"))) == 1  # only the one good page was ever stored


def test_serve_subprocess_start_serve_sigterm(forum: ServerThread, tmp_path: Path) -> None:
    port = free_port()
    cache_dir = tmp_path / "l2"
    process = subprocess.Popen(
        [sys.executable, "-m", "crawlergate", "serve", "--origin", forum.url, "--port", str(port)]
        + ["--cache-dir", str(cache_dir)],
        stderr=subprocess.PIPE,
        text=True,
        env={key: value for key, value in os.environ.items() if not key.startswith("CRAWLERGATE_")},
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/showthread.php?t=3", headers=GOOGLEBOT)
                break
            except httpx.TransportError:
                assert process.poll() is None and time.monotonic() < deadline, "serve did not start"
                time.sleep(0.1)
        assert response.status_code == 200 and response.headers["x-crawlergate"] == "miss"
        process.send_signal(signal.SIGTERM)
        _, startup = process.communicate(timeout=30)
        assert process.returncode == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert f"listening on http://127.0.0.1:{port} for {forum.url}" in startup
    assert f"access log {cache_dir / 'access.log'}" in startup
    assert "Traceback" not in startup
    assert "stopped on SIGTERM" in startup
    assert not [path for path in cache_dir.rglob("*") if path.name.startswith(".tmp-")]
    assert len(list(cache_dir.rglob("*.page"))) == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["serve"], "No origin", id="no-origin"),
        pytest.param(["serve", "--origin", "ftp://x"], "Must be an http:// or https:// URL", id="bad-origin"),
        pytest.param(["serve", "--origin", "http://x", "--cache-dir", "/proc/nope"], "not usable", id="bad-cache-dir"),
    ],
)
def test_serve_bad_start_is_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    from crawlergate.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_serve_refuses_an_access_log_it_cannot_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from crawlergate.cli import main

    config = tmp_path / "gate.toml"
    config.write_text('[log]\naccess_log = "/proc/nope/access.log"\n')
    argv = ["serve", "--origin", "http://x", "--port", str(free_port()), "--cache-dir", str(tmp_path / "l2")]
    assert main([*argv, "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "Access log '/proc/nope/access.log' cannot be written" in err and "Traceback" not in err


def test_serve_port_in_use(forum: ServerThread, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from crawlergate.cli import main

    argv = ["serve", "--origin", forum.url, "--port", str(forum.port), "--cache-dir", str(tmp_path)]
    assert main(argv) == 2
    assert "Cannot listen on 127.0.0.1" in capsys.readouterr().err


def test_cli_stats_of_a_running_gate(forum_proxy: ServerThread, capsys: pytest.CaptureFixture[str]) -> None:
    from crawlergate.cli import main

    httpx.get(f"{forum_proxy.url}/showthread.php?t=2", headers=GOOGLEBOT)
    httpx.get(f"{forum_proxy.url}/showthread.php?t=2", headers=GOOGLEBOT)
    assert main(["stats", "--url", forum_proxy.url]) == 0
    out = capsys.readouterr().out
    assert "crawler" in out and "50.0%" in out and "origin: 1 guest fills" in out
    assert main(["stats", "--url", forum_proxy.url, "--json"]) == 0
    assert '"l1_hits": 1' in capsys.readouterr().out


def test_cli_stats_unreachable(capsys: pytest.CaptureFixture[str]) -> None:
    from crawlergate.cli import main

    assert main(["stats", "--url", f"http://127.0.0.1:{free_port()}"]) == 2
    assert "Cannot reach" in capsys.readouterr().err


def test_cli_stats_and_invalidate_pointed_at_the_site_say_so(capsys: pytest.CaptureFixture[str]) -> None:
    """A site that answers 200 with HTML wherever it is asked: a wrong --url, said in a sentence."""
    from crawlergate.cli import main

    async def anything(request: Request) -> Response:
        return Response("<p>the site</p>", media_type="text/html")

    site = ServerThread(Starlette(routes=[Route("/{path:path}", anything, methods=["GET", "POST"])])).start()
    try:
        assert main(["stats", "--url", site.url.removeprefix("http://")]) == 2
        assert "something other than crawlergate's JSON" in capsys.readouterr().err
        assert main(["invalidate", "--url", site.url, "--token", "t", "/"]) == 2
        assert "something other than crawlergate's JSON" in capsys.readouterr().err
    finally:
        site.stop()


def site_app() -> Starlette:
    """A site that names its own address in redirects and redirects http to https, as real sites do."""

    def own_address(request: Request) -> str:
        host, port = request.scope["server"]
        return f"http://{host}:{port}"

    async def after_form(request: Request) -> Response:
        return Response(status_code=303, headers={"location": own_address(request) + "/done?x=1"})

    async def refresh(request: Request) -> Response:
        return Response("wait", headers={"refresh": f"0; url={own_address(request)}/done"})

    async def secure(request: Request) -> Response:
        if request.headers.get("x-forwarded-proto") != "https":
            return Response(status_code=301, headers={"location": f"https://{request.headers['host']}/secure"})
        return Response("<p>secure page</p>", media_type="text/html")

    async def page(request: Request) -> Response:
        response = Response(
            "<p>indexing rules</p>",
            media_type="text/html",
            headers={"x-robots-tag": "noindex", "link": '<https://site.example/page>; rel="canonical"'},
        )
        response.set_cookie("csrftoken", "guest-token")
        return response

    async def host(request: Request) -> Response:
        return JSONResponse(dict(request.headers))

    return Starlette(
        routes=[
            Route("/form", after_form, methods=["POST"]),
            Route("/refresh", refresh),
            Route("/secure", secure),
            Route("/page", page),
            Route("/host", host),
        ]
    )


@pytest.fixture(scope="module")
def site() -> Iterator[ServerThread]:
    server = ServerThread(site_app()).start()
    yield server
    server.stop()


@pytest.mark.parametrize("public_url", ["", "https://forum.example"])
def test_proxy_redirects_naming_the_origin_stay_on_the_gate(
    site: ServerThread, tmp_path: Path, public_url: str
) -> None:
    proxy = _proxy(site.url, tmp_path, public_url=public_url)
    try:
        with httpx.Client(base_url=proxy.url, headers=FIREFOX) as client:
            moved = client.post("/form")
            refresh = client.get("/refresh")
    finally:
        proxy.stop()
    expected = public_url or proxy.url
    assert moved.status_code == 303 and moved.headers["location"] == f"{expected}/done?x=1"
    assert refresh.headers["refresh"] == f"0; url={expected}/done"


@pytest.mark.parametrize(("forward_host", "seen_host"), [("client", "gate.example:8443"), ("origin", None)])
def test_proxy_sends_the_clients_host_unless_told_otherwise(
    site: ServerThread, tmp_path: Path, forward_host: str, seen_host: str | None
) -> None:
    proxy = _proxy(site.url, tmp_path, forward_host=forward_host)
    try:
        seen = httpx.get(f"{proxy.url}/host", headers={**FIREFOX, "host": "gate.example:8443"}).json()
    finally:
        proxy.stop()
    assert seen["host"] == (seen_host or f"127.0.0.1:{site.port}")
    assert seen["x-forwarded-host"] == "gate.example:8443"


def test_proxy_answers_carry_one_date_and_one_server(site: ServerThread, tmp_path: Path) -> None:
    proxy = _proxy(site.url, tmp_path)
    try:
        # Separate requests: a client that kept the page's cookie would be a session, passed to the site.
        answers = [httpx.get(f"{proxy.url}/page", headers=agent) for agent in (FIREFOX, GOOGLEBOT, GOOGLEBOT)]
    finally:
        proxy.stop()
    assert [answer.headers["x-crawlergate"] for answer in answers] == ["pass", "miss", "l1-hit"]
    for answer in answers:
        assert len(answer.headers.get_list("date")) == 1 and len(answer.headers.get_list("server")) == 1


def test_proxy_crawlers_get_indexing_headers_and_no_cookie_on_hits(site: ServerThread, tmp_path: Path) -> None:
    proxy = _proxy(site.url, tmp_path, public_url="https://site.example")
    try:
        with httpx.Client(base_url=proxy.url, headers=GOOGLEBOT) as client:
            miss, hit = client.get("/page"), client.get("/page")
    finally:
        proxy.stop()
    assert (miss.headers["x-crawlergate"], hit.headers["x-crawlergate"]) == ("miss", "l1-hit")
    for answer in (miss, hit):
        assert answer.headers["x-robots-tag"] == "noindex"
        assert answer.headers["link"] == '<https://site.example/page>; rel="canonical"'
        assert "set-cookie" not in answer.headers


def test_proxy_behind_tls_front_fills_as_https_and_never_serves_a_redirect_to_self(
    site: ServerThread, tmp_path: Path
) -> None:
    front = {**GOOGLEBOT, "x-forwarded-proto": "https", "x-forwarded-for": "66.249.66.1"}
    gate = _proxy(site.url, tmp_path / "right", public_url="https://forum.example")
    misconfigured = _proxy(site.url, tmp_path / "wrong", public_url="http://forum.example")
    try:
        right = [httpx.get(f"{gate.url}/secure", headers=front) for _ in range(2)]
        wrong = [httpx.get(f"{misconfigured.url}/secure", headers=front) for _ in range(2)]
        stats = httpx.get(f"{misconfigured.url}/_crawlergate/stats").json()
    finally:
        gate.stop()
        misconfigured.stop()
    assert [(r.status_code, r.headers["x-crawlergate"]) for r in right] == [(200, "miss"), (200, "l1-hit")]
    # The fill of an http public URL is redirected to https://same-url: never stored, never handed on;
    # the crawler's own request, with its real scheme, is answered by the live site.
    assert [(r.status_code, r.headers["x-crawlergate"]) for r in wrong] == [(200, "pass"), (200, "pass")]
    assert stats["not_stored"] == {"redirect-to-self": 2}


SMUGGLED = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 35\r\n\r\n<script>alert('poisoned')</script>"


def misbehaving_answer(method: bytes, path: bytes) -> tuple[bytes | list[bytes], bool]:
    """What a keep-alive origin that misbehaves as some servers do sends, one answer per path."""
    return _misbehaving(method, path), path.startswith(b"/cut")  # a cut answer closes, as a crashed worker's


def _misbehaving(method: bytes, path: bytes) -> bytes | list[bytes]:
    def page(body: bytes, extra: bytes = b"") -> bytes:
        return b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n%s\r\n" % (len(body), extra)

    if path == b"/reflect":  # sends the body on HEAD too, as simple servers do
        return page(SMUGGLED) + SMUGGLED
    if path == b"/cllong":  # more bytes than its Content-Length
        return page(b"hello") + b"hello" + SMUGGLED
    if path == b"/cllong-head":  # more bytes than its Content-Length: the head of another answer, unfinished
        return (
            page(b"hello") + b"hello" + b"HTTP/1.1 302 Found\r\nLocation: http://evil.example/\r\nSet-Cookie: e=1\r\n"
        )
    if path == b"/late":  # more bytes than its Content-Length, in a later write
        return [page(b"hi") + b"hi", SMUGGLED]
    if path == b"/cut-chunked":  # the origin dies mid-body
        return b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhalf \r\n"
    if path == b"/cut-length":
        return b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 1000\r\n\r\nhalf a page"
    if path == b"/both":  # Content-Length and chunked at once
        return b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    if path == b"/status-999":  # httptools reads any three digits
        return b"HTTP/1.1 999 Whatever\r\nContent-Type: text/html\r\nContent-Length: 2\r\n\r\nhi"
    if path == b"/bomb":
        bomb = gzip.compress(b"\0" * (20 * MB), compresslevel=9)
        return page(bomb, b"Content-Encoding: gzip\r\n")[: -len(b"\r\n")] + b"\r\n" + bomb
    body = b"<p>page " + path + b"</p>"
    return page(body) + (body if method != b"HEAD" else b"")


@pytest.fixture
def raw_origin() -> Iterator[RawHttpServer]:
    origin = RawHttpServer(misbehaving_answer).start()
    yield origin
    origin.stop()


def test_proxy_leftover_bytes_of_an_origin_never_become_a_stored_page(
    raw_origin: RawHttpServer, tmp_path: Path
) -> None:
    proxy = _proxy(raw_origin.url, tmp_path, public_url="https://site.example")
    try:
        with httpx.Client(base_url=proxy.url) as client:
            client.head("/reflect", headers=FIREFOX)  # a person plants a response after the HEAD answer
            home = client.get("/home", headers=GOOGLEBOT)  # the next fill
            client.get("/cllong", headers=GOOGLEBOT)  # a fill that leaves a response behind
            victim = client.get("/victim", headers=GOOGLEBOT)
            again = [client.get(path, headers=GOOGLEBOT) for path in ("/home", "/victim")]
    finally:
        proxy.stop()
    assert home.text == "<p>page /home</p>" and victim.text == "<p>page /victim</p>"
    assert [answer.text for answer in again] == ["<p>page /home</p>", "<p>page /victim</p>"]
    assert all(answer.headers["x-crawlergate"] == "l1-hit" for answer in again)


def test_proxy_a_status_http_does_not_have_is_a_broken_origin(raw_origin: RawHttpServer, tmp_path: Path) -> None:
    """A 999 (httptools reads any three digits) is the origin's fault: a 502 for a person and a crawler alike, on a
    connection that serves the next request."""
    proxy = _proxy(raw_origin.url, tmp_path)
    try:
        with httpx.Client(base_url=proxy.url, timeout=10) as client:
            answers = [client.get("/status-999", headers=who) for who in (FIREFOX, GOOGLEBOT)]
            after = client.get("/after", headers=GOOGLEBOT)
    finally:
        proxy.stop()
    assert [answer.status_code for answer in answers] == [502, 502]
    assert after.status_code == 200 and after.text == "<p>page /after</p>"


def test_proxy_inside_another_app_still_fills_as_the_gate_does() -> None:
    """A fill that reaches the proxy the ASGI way (the proxy wrapped in another app, so no ``fetch_for_fill``) fails as
    the origin's failure, never as a 502 page posing as the site's, on a connection of its own."""
    proxy = ReverseProxy(f"http://127.0.0.1:{free_port()}")  # nobody listens there

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        await proxy(scope, receive, send)

    async def fill() -> None:
        try:
            public = PublicSite.from_url("https://site.example")
            await AsgiOrigin(wrapped, public=public, max_bytes=MB).fetch_guest("/t/1")
        finally:
            await proxy.aclose()

    with pytest.raises(OriginError, match="cannot be reached"):
        asyncio.run(fill())


@pytest.mark.parametrize("path", ["/cllong", "/cllong-head"])
def test_proxy_bytes_past_an_answers_length_never_join_it(raw_origin: RawHttpServer, tmp_path: Path, path: str) -> None:
    """The answer ends where its Content-Length says, as nginx reads it: what follows in the same read, even the
    head of another answer, adds no header and no byte to the page a crawler is served or a person gets."""
    proxy = _proxy(raw_origin.url, tmp_path)
    try:
        with httpx.Client(base_url=proxy.url) as client:
            filled, served = (client.get(path, headers=GOOGLEBOT) for _ in range(2))
            person = client.get(path, headers=FIREFOX)
    finally:
        proxy.stop()
    for answer in (filled, served, person):
        assert answer.status_code == 200 and answer.content == b"hello"
        assert "location" not in answer.headers and "set-cookie" not in answer.headers
    assert [filled.headers["x-crawlergate"], served.headers["x-crawlergate"]] == ["miss", "l1-hit"]


def test_proxy_bytes_an_origin_sends_late_never_become_the_next_fills_page(
    raw_origin: RawHttpServer, tmp_path: Path
) -> None:
    """A page longer than its Content-Length whose rest comes in a later write: on a connection kept alive it
    would arrive after the next fill's request went out, and be read as that page (fills are single-use)."""
    proxy = _proxy(raw_origin.url, tmp_path)
    try:
        with httpx.Client(base_url=proxy.url) as client:
            late = client.get("/late", headers=GOOGLEBOT)
            victims = [client.get(f"/victim{number}", headers=GOOGLEBOT) for number in range(3)]
            time.sleep(0.2)
            again = [client.get(f"/victim{number}", headers=GOOGLEBOT) for number in range(3)]
    finally:
        proxy.stop()
    assert late.text == "hi"
    expected = [f"<p>page /victim{number}</p>" for number in range(3)]
    assert [answer.text for answer in victims] == expected and [answer.text for answer in again] == expected


@pytest.mark.parametrize(("keep_alive", "connections"), [(False, 6), (True, 1)])
def test_proxy_fills_keep_their_connections_only_when_told(
    raw_origin: RawHttpServer, tmp_path: Path, keep_alive: bool, connections: int
) -> None:
    """Six misses, one at a time: six connections to the origin, or one with ``server.fill_keep_alive``."""
    proxy = _proxy(raw_origin.url, tmp_path, fill_keep_alive=keep_alive)
    try:
        with httpx.Client(base_url=proxy.url) as client:
            pages = [client.get(f"/kept{number}", headers=GOOGLEBOT) for number in range(6)]
    finally:
        proxy.stop()
    assert [page.text for page in pages] == [f"<p>page /kept{number}</p>" for number in range(6)]
    assert raw_origin.accepted == connections


@pytest.mark.parametrize("who", ["crawler", "person"])
def test_proxy_an_origin_that_closes_after_each_answer_unannounced_fails_nobody(tmp_path: Path, who: str) -> None:
    """Connections the origin closes after each answer, without ``Connection: close``, are kept idle until their close
    is read: a request sent on one is sent again on a new connection, never on another idle one closed as well."""

    def closing(method: bytes, path: bytes) -> tuple[bytes, bool]:
        body = b"<p>page %s</p>" % path
        return b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body), True

    origin = RawHttpServer(closing).start()
    proxy = _proxy(origin.url, tmp_path, fill_keep_alive=True)
    headers = GOOGLEBOT if who == "crawler" else {**FIREFOX, "cookie": "session=1"}

    def visit(worker: int) -> list[tuple[int, str, str]]:
        with httpx.Client(base_url=proxy.url, timeout=10) as client:
            paths = [f"/w{worker}/p{number}" for number in range(15)]
            return [
                (answer.status_code, answer.text, path)
                for path in paths
                for answer in [client.get(path, headers=headers)]
            ]

    try:
        with ThreadPoolExecutor(8) as pool:
            answers = [answer for answers in pool.map(visit, range(8)) for answer in answers]
    finally:
        proxy.stop()
        origin.stop()
    assert [(status, text) for status, text, _ in answers] == [(200, f"<p>page {path}</p>") for _, _, path in answers]


def test_proxy_fills_kept_alive_still_drop_bytes_past_an_answers_end(raw_origin: RawHttpServer, tmp_path: Path) -> None:
    """A connection kept for fills is given up when its answer brought more than its Content-Length, in the same read
    or in a later write that comes while it is idle: the next fills read their own pages."""
    proxy = _proxy(raw_origin.url, tmp_path, fill_keep_alive=True)
    try:
        with httpx.Client(base_url=proxy.url) as client:
            leaving = [client.get(path, headers=GOOGLEBOT) for path in ("/cllong", "/late")]
            time.sleep(0.2)  # the late write arrives on an idle connection
            victims = [client.get(f"/victim{number}", headers=GOOGLEBOT) for number in range(3)]
    finally:
        proxy.stop()
    assert [answer.text for answer in leaving] == ["hello", "hi"]
    assert [answer.text for answer in victims] == [f"<p>page /victim{number}</p>" for number in range(3)]
    assert raw_origin.accepted == 3  # /cllong's and /late's given up, one kept for the victims


def test_proxy_refuses_targets_and_hosts_an_origin_must_not_see(raw_origin: RawHttpServer, tmp_path: Path) -> None:
    proxy = _proxy(raw_origin.url, tmp_path)
    try:
        answers = []
        # A person's browser headers (a client without its headers would be a suspect, answered from the cache).
        for request in (
            b"GET * HTTP/1.1\r\nHost: a\r\n" + FIREFOX_LINES + b"\r\n",
            b"OPTIONS * HTTP/1.1\r\nHost: a\r\n" + FIREFOX_LINES + b"\r\n",
            b"GET /x HTTP/1.1\r\nHost: good.example\r\nHost: evil.example\r\n" + FIREFOX_LINES + b"\r\n",
        ):
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as raw:
                raw.sendall(request)
                answers.append(raw.recv(65536).split(b"\r\n", 1)[0])
        both = httpx.get(f"{proxy.url}/both", headers=FIREFOX)
    finally:
        proxy.stop()
    assert answers == [b"HTTP/1.1 400 Bad Request"] * 3
    # Content-Length and Transfer-Encoding at once is how responses are split (RFC 9112 6.3): refused, as
    # nginx refuses it ("upstream sent Content-Length and Transfer-Encoding at the same time").
    assert both.status_code == 502


def test_proxy_gzip_bomb_is_too_big_to_store(raw_origin: RawHttpServer, tmp_path: Path) -> None:
    proxy = _proxy(raw_origin.url, tmp_path)
    try:
        answer = httpx.get(f"{proxy.url}/bomb", headers={**GOOGLEBOT, "accept-encoding": "gzip"})
        stats = httpx.get(f"{proxy.url}/_crawlergate/stats").json()
    finally:
        proxy.stop()
    # Over l2.page_max_bytes once decompressed: passed on as the site sent it, never stored or inflated here.
    assert answer.headers["x-crawlergate"] == "pass" and len(answer.content) == 20 * MB
    assert stats["not_stored"] == {"too-big": 1}
    assert not list((tmp_path / "l2").rglob("*.page"))


def test_proxy_client_leaving_a_stream_releases_the_origin(tmp_path: Path) -> None:
    closed = threading.Event()

    async def endless(request: Request) -> Response:
        async def chunks() -> AsyncIterator[bytes]:
            try:
                for _ in range(600):  # bounded: at most a minute
                    yield b"tick\n"
                    await asyncio.sleep(0.1)
            finally:
                closed.set()

        return StreamingResponse(chunks(), media_type="text/plain")

    origin = ServerThread(Starlette(routes=[Route("/stream", endless)])).start()
    proxy = _proxy(origin.url, tmp_path)
    try:
        with httpx.stream("GET", f"{proxy.url}/stream", headers=FIREFOX) as response:
            next(response.iter_raw())
        assert closed.wait(10), "the origin stream outlived the client"
    finally:
        proxy.stop()
        origin.stop()


def test_proxy_address_claims_of_untrusted_clients_never_reach_the_origin(echo: ServerThread, tmp_path: Path) -> None:
    proxy = _proxy(echo.url, tmp_path, trusted_proxies=())
    claims = {
        "x-real-ip": "1.2.3.4",
        "forwarded": "for=1.2.3.4;proto=https",
        "x-client-ip": "1.2.3.4",
        "true-client-ip": "1.2.3.4",
        "cf-connecting-ip": "1.2.3.4",
    }
    try:
        seen = httpx.get(f"{proxy.url}/echo/x", headers={**FIREFOX, **claims}).json()["headers"]
    finally:
        proxy.stop()
    assert not set(claims) & set(seen)
    assert seen["x-forwarded-for"] == "127.0.0.1"


@pytest.mark.parametrize("path", ["/cut-chunked", "/cut-length"])
def test_proxy_half_a_page_is_never_stored_or_handed_on(raw_origin: RawHttpServer, tmp_path: Path, path: str) -> None:
    proxy = _proxy(raw_origin.url, tmp_path)
    try:
        with httpx.Client(base_url=proxy.url, headers=GOOGLEBOT) as client:
            answers = [client.get(path) for _ in range(2)]
        stats = httpx.get(f"{proxy.url}/_crawlergate/stats").json()
    finally:
        proxy.stop()
    # Never a 200 with a Content-Length rewritten to the truncated size: nothing stored, 502.
    assert [answer.status_code for answer in answers] == [502, 502]
    assert stats["not_stored"] == {"incomplete": 2} and stats["origin_errors"] == 2
    assert not list((tmp_path / "l2").rglob("*.page"))


def test_proxy_followers_of_an_unstorable_fill_never_share_its_cookie(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    async def cookie_page(request: Request) -> Response:
        await asyncio.sleep(0.2)  # long enough for the crawlers to pile up behind one fill
        response = Response("<p>page</p>", media_type="text/html")
        response.set_cookie("session", f"for-{request.headers['x-forwarded-for']}")
        return response

    origin = ServerThread(Starlette(routes=[Route("/page", cookie_page)])).start()
    settings = Settings(
        server=ServerSettings(origin=origin.url),
        l2=L2Settings(cache_dir=str(tmp_path / "l2")),
        cache=CacheSettings(storage_mode="rfc9111"),
    )
    proxy = ServerThread(create_app(settings)).start()
    try:
        with ThreadPoolExecutor(20) as pool:
            answers = list(pool.map(lambda _: httpx.get(f"{proxy.url}/page", headers=GOOGLEBOT), range(20)))
    finally:
        proxy.stop()
        origin.stop()
    assert all(answer.status_code == 200 for answer in answers)
    assert not any("set-cookie" in answer.headers for answer in answers)


def _two_workers(forum: ServerThread, tmp_path: Path, config_text: str) -> contextlib.AbstractContextManager[str]:
    return serve_process(forum.url, tmp_path, config_text, workers=2)


def test_serve_workers_run_on_the_settings_serve_was_given(forum: ServerThread, tmp_path: Path) -> None:
    with _two_workers(forum, tmp_path, '[admin]\nprefix = "/_gate"\n') as gate:
        # A new connection each time: both workers answer some.
        answers = [httpx.get(f"{gate}/_gate/stats").status_code for _ in range(20)]
    assert answers == [200] * 20


def test_serve_workers_see_the_same_marks(forum: ServerThread, tmp_path: Path) -> None:
    with _two_workers(forum, tmp_path, '[admin]\ntoken = "t0k"\n') as gate:
        stored = httpx.get(f"{gate}/showthread.php?t=4", headers=GOOGLEBOT)
        marked = httpx.post(
            f"{gate}/_crawlergate/invalidate",
            json={"urls": ["/showthread.php?t=4"]},
            headers={"authorization": "Bearer t0k"},
        )
        # Each request on a new connection, so both workers answer: each reads the marks the other made.
        dirty = [httpx.get(f"{gate}/_crawlergate/stats").json()["dirty"] for _ in range(20)]
        again = [httpx.get(f"{gate}/showthread.php?t=4", headers=GOOGLEBOT) for _ in range(6)]
    assert stored.headers["x-crawlergate"] == "miss" and marked.json() == {"marked": 1}
    assert dirty == [1] * 20
    assert {answer.headers["x-crawlergate"] for answer in again} <= {"l1-hit", "l2-hit"}
    assert all(answer.text == stored.text and "age" in answer.headers for answer in again)


def test_serve_warns_at_start_up_when_nothing_answers_at_the_origin_or_memcached(tmp_path: Path) -> None:
    """A newcomer's serve in front of a site (or beside a memcached) not started yet: a warning line now, not silence
    until a 502 (or an L1 that never hits)."""
    port, silent, memcached = free_port(), f"http://127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    environment = {key: value for key, value in os.environ.items() if not key.startswith("CRAWLERGATE_")}
    environment["CRAWLERGATE_L1_MEMCACHED"] = memcached
    argv = ["serve", "--origin", silent, "--port", str(port), "--cache-dir", str(tmp_path / "l2")]
    process = subprocess.Popen([sys.executable, "-m", "crawlergate", *argv], env=environment, stderr=subprocess.PIPE)
    try:
        wait_until_healthy(process, f"http://127.0.0.1:{port}")
        person = httpx.get(f"http://127.0.0.1:{port}/", headers=FIREFOX)
        assert person.status_code == 502
    finally:
        process.terminate()
        _, errors = process.communicate(timeout=30)
    assert f"warning: nothing answers at {silent}".encode() in errors
    assert f"warning: memcached at {memcached} does not answer".encode() in errors
