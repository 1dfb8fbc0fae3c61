from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from crawlergate import CrawlerGateMiddleware, CrawlerGateWSGI
from crawlergate.config import CacheSettings, L2Settings, ServerSettings, Settings

GOOGLEBOT = {"user-agent": "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"}
FIREFOX = {"user-agent": "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0"}


def render(path: str) -> tuple[int, list[tuple[str, str]], bytes]:
    """The pages of a small site, shared by its WSGI and ASGI versions."""
    if path.startswith("/t/"):
        body = f"<html>thread {path[3:]} " + "post " * 500 + "</html>"
        return 200, [("Content-Type", "text/html; charset=utf-8")], body.encode()
    if path == "/personal":
        return 200, [("Content-Type", "text/html"), ("Set-Cookie", "guest=1")], b"<p>hi</p>"
    if path == "/broken":
        return 503, [("Content-Type", "text/plain")], b"down"
    return 404, [("Content-Type", "text/plain")], b"no such page"


class WsgiSite:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.down = False

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        self.calls.append(dict(environ))
        status, headers, body = render(environ["PATH_INFO"]) if not self.down else render("/broken")
        start_response(f"{status} X", headers)
        return [body]


def asgi_site() -> Starlette:
    async def page(request: Request) -> Response:
        status, headers, body = render(request.url.path)
        return Response(body, status_code=status, headers=dict(headers))

    return Starlette(routes=[Route("/{path:path}", page, methods=["GET", "HEAD", "POST"])])


@pytest.fixture
def wsgi_site() -> WsgiSite:
    return WsgiSite()


def _settings(tmp_path: Path, **sections: Any) -> Settings:
    return Settings(l2=L2Settings(cache_dir=str(tmp_path / "l2")), **sections)


def _client(gate: CrawlerGateWSGI) -> httpx.Client:
    return httpx.Client(transport=httpx.WSGITransport(app=gate), base_url="http://forum.test")


def test_wsgi_crawler_miss_hit_304_head(wsgi_site: WsgiSite, tmp_path: Path) -> None:
    gate = CrawlerGateWSGI(wsgi_site, settings=_settings(tmp_path))
    with _client(gate) as client:
        miss = client.get("/t/1", headers=GOOGLEBOT)
        hit = client.get("/t/1", headers=GOOGLEBOT)
        not_modified = client.get("/t/1", headers={**GOOGLEBOT, "if-none-match": hit.headers["etag"]})
        head = client.head("/t/1", headers=GOOGLEBOT)
        identity = client.get("/t/1", headers={**GOOGLEBOT, "accept-encoding": "identity"})
    assert (miss.headers["x-crawlergate"], hit.headers["x-crawlergate"]) == ("miss", "l1-hit")
    assert hit.text.startswith("<html>thread 1") and hit.headers["content-encoding"] == "gzip"
    assert not_modified.status_code == 304
    assert head.content == b"" and head.headers["x-crawlergate"] == "l1-hit"
    assert "content-encoding" not in identity.headers and identity.text == hit.text
    assert len(wsgi_site.calls) == 1
    guest = wsgi_site.calls[0]
    # No public_url: the fill asks for the address the request arrived at (SERVER_NAME), never the client's Host.
    assert "HTTP_COOKIE" not in guest and guest["HTTP_HOST"] == "forum.test"
    gate.close()


def test_wsgi_fill_is_an_outside_visitor_of_the_public_url(wsgi_site: WsgiSite, tmp_path: Path) -> None:
    gate = CrawlerGateWSGI(
        wsgi_site, settings=_settings(tmp_path, server=ServerSettings(public_url="https://f.example"))
    )
    with _client(gate) as client:
        client.get("/t/1", headers={**GOOGLEBOT, "host": "evil.test", "x-forwarded-for": "203.0.113.9"})
        client.get("/t/2", headers=GOOGLEBOT)
    first, second = wsgi_site.calls
    assert (first["HTTP_HOST"], first["HTTP_X_FORWARDED_HOST"], first["HTTP_X_FORWARDED_PROTO"]) == (
        "f.example",
        "f.example",
        "https",
    )
    assert first["wsgi.url_scheme"] == "https" and first["HTTP_ACCEPT_ENCODING"] == "gzip"
    # The trusted local client forwards for 203.0.113.9; a loopback visitor is never the fill's address.
    assert first["REMOTE_ADDR"] == first["HTTP_X_FORWARDED_FOR"] == "203.0.113.9"
    assert second["REMOTE_ADDR"] == second["HTTP_X_FORWARDED_FOR"] == "192.0.2.1"
    gate.close()


def test_wsgi_humans_pass_and_prefetch(wsgi_site: WsgiSite, tmp_path: Path) -> None:
    gate = CrawlerGateWSGI(wsgi_site, settings=_settings(tmp_path))
    with _client(gate) as client:
        client.get("/t/1", headers=GOOGLEBOT)
        key = gate.core.keys.key_for(b"/t/1")
        assert key is not None
        gate.cache.l1.delete(key.digest)
        human = client.get("/t/1", headers=FIREFOX)
        gate.drain()
        crawler = client.get("/t/1", headers=GOOGLEBOT)
        logged_in = client.get("/t/1", headers={**GOOGLEBOT, "cookie": "sessionid=alice"})
    assert human.headers["x-crawlergate"] == "pass"
    assert crawler.headers["x-crawlergate"] == "l1-hit"
    assert logged_in.headers["x-crawlergate"] == "pass"
    assert gate.core.stats()["human"]["prefetches"] == 1  # type: ignore[index]


def test_wsgi_origin_failure_serves_stale(wsgi_site: WsgiSite, tmp_path: Path) -> None:
    gate = CrawlerGateWSGI(
        wsgi_site, settings=_settings(tmp_path, cache=CacheSettings(ttl_seconds=0.001, max_stale_seconds=0))
    )
    with _client(gate) as client:
        client.get("/t/1", headers=GOOGLEBOT)
        wsgi_site.down = True
        stale = client.get("/t/1", headers=GOOGLEBOT)
        down = client.get("/t/2", headers=GOOGLEBOT)
    assert stale.headers["x-crawlergate"] == "stale"
    assert down.status_code == 503
    gate.close()


def test_wsgi_site_exception_is_502(tmp_path: Path) -> None:
    def broken(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        raise RuntimeError("database gone")

    gate = CrawlerGateWSGI(broken, settings=_settings(tmp_path))
    with _client(gate) as client:
        response = client.get("/t/1", headers=GOOGLEBOT)
        stats = client.get("/_crawlergate/stats").json()
    assert response.status_code == 502
    assert stats["crawler"]["errors"] == 1
    gate.close()


def test_wsgi_concurrent_misses_make_one_call(tmp_path: Path) -> None:
    release = threading.Event()
    calls: list[str] = []

    def slow(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        calls.append(environ["PATH_INFO"])
        release.wait(5)
        start_response("200 OK", [("Content-Type", "text/html")])
        return [b"<p>slow page</p>"]

    gate = CrawlerGateWSGI(slow, settings=_settings(tmp_path))
    results: list[str] = []

    def crawl() -> None:
        try:
            with _client(gate) as client:
                results.append(client.get("/t/9", headers=GOOGLEBOT).text)
        except Exception as exc:  # shown in the assertion below
            results.append(repr(exc))

    threads = [threading.Thread(target=crawl) for _ in range(20)]
    for thread in threads:
        thread.start()
    while not calls:
        threading.Event().wait(0.01)
    threading.Event().wait(0.1)
    release.set()
    for thread in threads:
        thread.join(10)
    assert calls == ["/t/9"]
    assert results == ["<p>slow page</p>"] * 20
    gate.close()


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def real_wsgi_server(wsgi_site: WsgiSite, tmp_path: Path) -> Iterator[str]:
    gate = CrawlerGateWSGI(wsgi_site, settings=_settings(tmp_path / "wsgi"))
    server = make_server("127.0.0.1", 0, gate, server_class=_ThreadingServer, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    gate.close()


SEQUENCE = [
    ("GET", "/t/1", GOOGLEBOT),
    ("GET", "/t/1", GOOGLEBOT),
    ("HEAD", "/t/1", GOOGLEBOT),
    ("GET", "/t/1", FIREFOX),
    ("GET", "/t/2", FIREFOX),
    ("GET", "/t/2", GOOGLEBOT),
    ("GET", "/t/2", {**GOOGLEBOT, "cookie": "sessionid=x"}),
    ("GET", "/personal", GOOGLEBOT),
    ("GET", "/nowhere", GOOGLEBOT),
    ("GET", "/nowhere", GOOGLEBOT),
    ("GET", "/css/site.css", GOOGLEBOT),
    ("POST", "/t/1", GOOGLEBOT),
    ("GET", "/_crawlergate/healthz", GOOGLEBOT),
]


@pytest.mark.anyio
async def test_wsgi_under_a_real_server_matches_the_asgi_gate(real_wsgi_server: str, tmp_path: Path) -> None:
    asgi_gate = CrawlerGateMiddleware(asgi_site(), settings=_settings(tmp_path / "asgi"))
    asgi_outcomes, wsgi_outcomes = [], []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi_gate), base_url="http://forum.test") as client:
        for method, path, headers in SEQUENCE:
            response = await client.request(method, path, headers=headers)
            client.cookies.clear()
            asgi_outcomes.append((response.status_code, response.headers["x-crawlergate"]))
    with httpx.Client(base_url=real_wsgi_server) as client:
        for method, path, headers in SEQUENCE:
            response = client.request(method, path, headers=headers)
            client.cookies.clear()
            wsgi_outcomes.append((response.status_code, response.headers["x-crawlergate"]))
    assert wsgi_outcomes == asgi_outcomes
    assert [outcome for _, outcome in wsgi_outcomes][:3] == ["miss", "l1-hit", "l1-hit"]


def test_wsgi_fill_deadline_holds_when_the_site_hangs(tmp_path: Path) -> None:
    import threading
    import time

    release = threading.Event()

    def hanging_site(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if environ["PATH_INFO"] == "/hang":
            release.wait(10)  # bounded: the test releases it
        start_response("200 OK", [("Content-Type", "text/html")])
        return [b"<p>late page</p>"]

    settings = _settings(tmp_path, cache=CacheSettings(fill_timeout_seconds=0.3))
    gate = CrawlerGateWSGI(hanging_site, settings=settings)
    try:
        with _client(gate) as client:
            started = time.perf_counter()
            hung = client.get("/hang", headers=GOOGLEBOT)
            elapsed = time.perf_counter() - started
            health = client.get("/_crawlergate/healthz")
            release.set()
            for _ in range(100):  # the fill finishes in the background and stores the page
                if gate.cache.l2.contains(gate.core.keys.key_for(b"/hang").digest):  # type: ignore[union-attr]
                    break
                time.sleep(0.05)
            later = client.get("/hang", headers=GOOGLEBOT)
    finally:
        release.set()
        gate.close()
    assert hung.status_code == 504 and elapsed < 3
    assert health.status_code == 200
    assert later.headers["x-crawlergate"] in ("l1-hit", "l2-hit") and later.text == "<p>late page</p>"
