"""The WSGI middleware: fills made as an outside visitor of the public URL, people passed and their views
prefetched, site failures as 502, and pages that vary by device cached per device."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import httpx
import pytest

from crawlergate import CrawlerGateWSGI
from crawlergate.config import CacheSettings, L1Settings, L2Settings, LogSettings, ServerSettings, Settings
from tests.conftest import MemcachedServer
from tests.visitors import FIREFOX, GOOGLEBOT


def render(path: str) -> tuple[int, list[tuple[str, str]], bytes]:
    """The pages of a small site."""
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


@pytest.fixture
def wsgi_site() -> WsgiSite:
    return WsgiSite()


def _settings(tmp_path: Path, **sections: Any) -> Settings:
    return Settings(l2=L2Settings(cache_dir=str(tmp_path / "l2")), **sections)


def _client(gate: CrawlerGateWSGI) -> httpx.Client:
    return httpx.Client(transport=httpx.WSGITransport(app=gate), base_url="http://forum.test")


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
        gate.filler.writer.flush()  # the filled page on disk
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
    assert gate.stats()["human"]["prefetches"] == 1  # type: ignore[index]


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


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_wsgi_app_that_fails_or_never_answers_before_start_response_is_logged_as_500(tmp_path: Path) -> None:
    """The server answers 500 for both; a line with status 0 would be skipped as malformed by `classify --log`."""

    def site(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if environ["PATH_INFO"] == "/no-answer":
            return []
        raise_lazily = environ["PATH_INFO"] == "/lazy-failure"

        def pieces() -> Iterator[bytes]:
            if raise_lazily:
                raise RuntimeError("the database is down")
            start_response("200 OK", [("Content-Type", "text/html")])
            yield b"<p>page</p>"

        return pieces()

    log = tmp_path / "access.log"
    gate = CrawlerGateWSGI(site, settings=_settings(tmp_path, log=LogSettings(access_log=str(log))))
    server = make_server("127.0.0.1", 0, gate, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    person = {**FIREFOX, "cookie": "session=1"}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.server_port}", headers=person) as client:
            seen = [client.get(path).status_code for path in ("/lazy-failure", "/no-answer", "/fine")]
    finally:
        server.shutdown()
        server.server_close()
        gate.close()
    statuses = [line.split('" ', 1)[1].split(" ", 1)[0] for line in log.read_text().splitlines()]
    assert seen == [500, 500, 200] and statuses == ["500", "500", "200"]


def _host_echo(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/html")])
    return [f"<p>{environ['HTTP_HOST']} for {environ['REMOTE_ADDR']}</p>".encode()]


def test_wsgi_a_fill_never_asks_as_the_host_a_client_sent_on_a_unix_socket(tmp_path: Path) -> None:
    """gunicorn on a unix socket makes SERVER_NAME of the client's Host: a fill that asked as it would store the
    attacker's host in a page everyone gets. Without server.public_url the crawler gets the live site instead."""
    gate = CrawlerGateWSGI(_host_echo, settings=_settings(tmp_path))
    unix = httpx.WSGITransport(app=gate, remote_addr="")  # a unix socket's peer has no address
    with httpx.Client(transport=unix, base_url="http://evil.example") as client:
        first = client.get("/t/1", headers=GOOGLEBOT)
        second = client.get("/t/1", headers=GOOGLEBOT)
    gate.close()
    assert first.headers["x-crawlergate"] == second.headers["x-crawlergate"] == "pass"
    assert not any((tmp_path / "l2").rglob("*.page"))


def test_wsgi_a_unix_socket_with_a_client_address_still_names_no_site(tmp_path: Path) -> None:
    """gunicorn's PROXY protocol (or ProxyFix's X-Forwarded-For) gives a unix socket's request a client address;
    its SERVER_NAME is still the client's Host."""
    gate = CrawlerGateWSGI(_host_echo, settings=_settings(tmp_path))

    def gunicorn_on_a_unix_socket(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        with socket.socket(socket.AF_UNIX) as unix:
            return gate({**environ, "gunicorn.socket": unix, "REMOTE_ADDR": "203.0.113.9"}, start_response)

    transport = httpx.WSGITransport(app=gunicorn_on_a_unix_socket)
    with httpx.Client(transport=transport, base_url="http://evil.example") as client:
        page = client.get("/t/1", headers=GOOGLEBOT)
    gate.close()
    assert page.headers["x-crawlergate"] == "pass" and not any((tmp_path / "l2").rglob("*.page"))


@pytest.mark.parametrize("trusted", ["x_host", "x_prefix"])
def test_wsgi_what_proxyfix_takes_from_request_headers_never_names_a_fill(tmp_path: Path, trusted: str) -> None:
    """ProxyFix around the gate makes SERVER_NAME of X-Forwarded-Host and SCRIPT_NAME of X-Forwarded-Prefix,
    which an nginx passes on from the client: the fill asks as the server the request came to, and a request
    mounted by a header is not filled."""
    from werkzeug.middleware.proxy_fix import ProxyFix

    def site(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        start_response("200 OK", [("Content-Type", "text/html")])
        return [f"<p>{environ['HTTP_HOST']} {environ['SCRIPT_NAME']}|{environ['PATH_INFO']}</p>".encode()]

    gate = CrawlerGateWSGI(site, settings=_settings(tmp_path))
    fixed = ProxyFix(gate, **{trusted: 1})  # type: ignore[arg-type]
    forged = {"x-forwarded-host": "evil.example", "x-forwarded-prefix": "/form"}
    with httpx.Client(transport=httpx.WSGITransport(app=fixed), base_url="http://127.0.0.1:8000") as client:
        poisoned = client.get("/form/", headers={**GOOGLEBOT, **forged})
        later = client.get("/form/", headers=GOOGLEBOT)
    gate.close()
    if trusted == "x_host":
        assert poisoned.headers["x-crawlergate"] == "miss" and poisoned.text == "<p>127.0.0.1:8000 |/form/</p>"
    else:
        assert poisoned.headers["x-crawlergate"] == "pass"
    assert later.text == "<p>127.0.0.1:8000 |/form/</p>"


def test_wsgi_a_fill_asks_as_the_socket_the_server_names(tmp_path: Path) -> None:
    """SERVER_ADDR (Apache, nginx's uwsgi and FastCGI parameters) is the socket's; SERVER_NAME may be the Host."""

    def behind_apache(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        return gate({**environ, "SERVER_ADDR": "10.0.0.5", "SERVER_PORT": "80"}, start_response)

    gate = CrawlerGateWSGI(_host_echo, settings=_settings(tmp_path))
    with httpx.Client(transport=httpx.WSGITransport(app=behind_apache), base_url="http://evil.example") as client:
        page = client.get("/t/1", headers=GOOGLEBOT)
    gate.close()
    assert page.headers["x-crawlergate"] == "miss" and page.text == "<p>10.0.0.5 for 192.0.2.1</p>"


@pytest.mark.parametrize("crawler", ["10.1.2.3", "192.168.1.9", "fd00::7", "169.254.0.3", "::ffff:10.0.0.1"])
def test_wsgi_a_fill_for_a_crawler_on_a_private_network_is_asked_for_the_documentation_address(
    tmp_path: Path, crawler: str
) -> None:
    """A site may show internal clients an internal view: never fetched with their address, stored for all."""
    settings = _settings(tmp_path, server=ServerSettings(public_url="https://f.example"))
    gate = CrawlerGateWSGI(_host_echo, settings=settings)
    with httpx.Client(transport=httpx.WSGITransport(app=gate, remote_addr=crawler), base_url="http://f") as client:
        page = client.get("/t/1", headers=GOOGLEBOT)
    gate.close()
    assert page.text == "<p>f.example for 192.0.2.1</p>"


def test_wsgi_fill_deadline_holds_when_the_site_hangs(tmp_path: Path) -> None:
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
                if gate.cache.l2.has_file(gate.core.keys.key_for(b"/hang").digest):  # type: ignore[union-attr]
                    break
                time.sleep(0.05)
            later = client.get("/hang", headers=GOOGLEBOT)
    finally:
        release.set()
        gate.close()
    assert hung.status_code == 504 and elapsed < 3
    assert health.status_code == 200
    assert later.headers["x-crawlergate"] in ("l1-hit", "l2-hit") and later.text == "<p>late page</p>"


def test_wsgi_app_mounted_under_a_prefix_is_filled_as_mounted(tmp_path: Path) -> None:
    from werkzeug.middleware.dispatcher import DispatcherMiddleware

    def blog(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        # The app knows only its own paths: it is mounted at /blog (SCRIPT_NAME), as PEP 3333 says.
        if environ["SCRIPT_NAME"] == "/blog" and environ["PATH_INFO"] == "/post":
            start_response("200 OK", [("Content-Type", "text/html")])
            return [b"<p>a post</p>"]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"no such page"]

    def root(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"root"]

    gate = CrawlerGateWSGI(blog, settings=_settings(tmp_path))
    site = DispatcherMiddleware(root, {"/blog": gate})
    with httpx.Client(transport=httpx.WSGITransport(app=site), base_url="http://forum.test") as client:
        crawler = [client.get("/blog/post", headers=GOOGLEBOT) for _ in range(2)]
        person = client.get("/blog/post", headers=FIREFOX)
    assert [answer.status_code for answer in crawler] == [200, 200]
    assert [answer.headers["x-crawlergate"] for answer in crawler] == ["miss", "l1-hit"]
    assert crawler[1].text == person.text == "<p>a post</p>"


def test_wsgi_a_mount_a_request_header_sets_never_decides_what_is_stored(tmp_path: Path) -> None:
    """gunicorn takes SCRIPT_NAME from a request header (from its forwarded_allow_ips): a suspect asking for /form/
    with ``SCRIPT_NAME: /form`` would have had the home page stored as /form/ for every crawler."""

    def site(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        start_response("200 OK", [("Content-Type", "text/html")])
        return [b"<p>home</p>" if environ["PATH_INFO"] == "/" else b"<p>the form</p>"]

    def like_gunicorn(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        mount = environ.get("HTTP_SCRIPT_NAME", "")
        return gate({**environ, "SCRIPT_NAME": mount, "PATH_INFO": environ["PATH_INFO"][len(mount) :]}, start_response)

    gate = CrawlerGateWSGI(site, settings=_settings(tmp_path))
    with httpx.Client(transport=httpx.WSGITransport(app=like_gunicorn), base_url="http://forum.test") as client:
        poisoned = client.get("/form/", headers={**GOOGLEBOT, "script-name": "/form"})
        later = client.get("/form/", headers=GOOGLEBOT)
    gate.close()
    assert poisoned.headers["x-crawlergate"] == "pass" and poisoned.text == "<p>home</p>"  # what the site made of it
    assert later.headers["x-crawlergate"] == "miss" and later.text == "<p>the form</p>"


def test_wsgi_pages_that_vary_by_user_agent_are_cached_per_device(tmp_path: Path) -> None:
    phone = {
        "user-agent": "Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X) Mobile Safari (compatible; Googlebot/2.1)"
    }

    def site(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        kind = "mobile" if "Mobile" in environ.get("HTTP_USER_AGENT", "") else "desktop"
        start_response("200 OK", [("Content-Type", "text/html"), ("Vary", "User-Agent")])
        return [f"<p>{kind}</p>".encode()]

    gate = CrawlerGateWSGI(site, settings=_settings(tmp_path))
    with _client(gate) as client:
        answers = [client.get("/t/1", headers=agent) for agent in (phone, GOOGLEBOT, phone, GOOGLEBOT)]
    assert [answer.text for answer in answers] == ["<p>mobile</p>", "<p>desktop</p>"] * 2
    assert [answer.headers["x-crawlergate"] for answer in answers] == ["miss", "l1-hit", "l1-hit", "l1-hit"]


def test_wsgi_wordpress_comment_marks_the_post_under_its_permalink(tmp_path: Path) -> None:
    """WordPress names the post of a comment by its ID; crawlers know it by its permalink."""
    permalinks = {"5": "/2024/05/hello/", "6": "/2024/06/other/"}

    def wordpress(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        path, query = environ["PATH_INFO"], environ.get("QUERY_STRING", "")
        if environ["REQUEST_METHOD"] == "POST":
            environ["wsgi.input"].read()
            start_response("302 CacheHit", [("Location", "http://blog.example/2024/05/hello/#comment-9")])
            return [b""]
        if path == "/" and query.startswith("p="):
            start_response("301 Moved Permanently", [("Location", "http://blog.example" + permalinks[query[2:]])])
            return [b""]
        start_response("200 OK", [("Content-Type", "text/html")])
        return [f"<p>{path}</p>".encode()]

    settings = _settings(tmp_path, server=ServerSettings(public_url="http://blog.example"))
    settings = Settings(server=settings.server, l2=settings.l2, cache=CacheSettings(sites=("wordpress",)))
    gate = CrawlerGateWSGI(wordpress, settings=settings)
    with _client(gate) as client:
        for url in ("/2024/05/hello/", "/2024/06/other/", "/?p=6", "/"):
            client.get(url, headers=GOOGLEBOT)
        form = {"comment_post_ID": "5", "comment": "nice"}
        client.post("/wp-comments-post.php", data=form, headers={**FIREFOX, "cookie": "comment_author_x=1"})
        gate.drain()
        # Another post, named only by its ID: the stored 301 of /?p=6 leads to its permalink.
        marked_by_id = gate.runtime.invalidation.invalidate(["/?p=6"], [])

    def marked(url: bytes) -> bool:
        key = gate.core.keys.key_for(url)
        return key is not None and gate.core.catalogue.dirty_since(key.digest) is not None

    assert marked(b"/2024/05/hello/") and marked(b"/")
    assert marked_by_id == 2 and marked(b"/2024/06/other/")


def test_an_event_stream_is_passed_to_a_crawler_not_waited_for_nor_stored(tmp_path: Path) -> None:
    def site(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        start_response("200 OK", [("Content-Type", "text/event-stream")])

        def events() -> Iterator[bytes]:
            for number in range(20):
                yield f"data: {number}\n\n".encode()
                time.sleep(0.05)

        return events()

    settings = Settings(l2=L2Settings(cache_dir=str(tmp_path / "l2")))
    gate = CrawlerGateWSGI(site, settings=settings)
    with httpx.Client(transport=httpx.WSGITransport(app=gate), base_url="http://forum.test") as client:
        for _ in range(2):
            answer = client.get("/events", headers=GOOGLEBOT)
            assert answer.text.count("data:") == 20 and answer.headers["x-crawlergate"].startswith("pass")
    assert gate.stats()["not_stored"].get("stream") == 2
    gate.close()


def test_a_fill_of_a_body_without_end_lets_go_of_its_thread_at_the_timeout(tmp_path: Path) -> None:
    # The caller stops waiting at the timeout; the fill's thread must too, or a few such pages hold every fill thread.
    closed = threading.Event()

    def site(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        start_response("200 OK", [("Content-Type", "text/html")])

        def endless() -> Iterator[bytes]:
            try:
                for _ in range(600):  # a minute at most
                    yield b"<p>more</p>"
                    time.sleep(0.1)
            finally:
                closed.set()

        return endless()

    settings = Settings(l2=L2Settings(cache_dir=str(tmp_path / "l2")), cache=CacheSettings(fill_timeout_seconds=1))
    gate = CrawlerGateWSGI(site, settings=settings)
    with httpx.Client(transport=httpx.WSGITransport(app=gate), base_url="http://forum.test") as client:
        assert client.get("/slow", headers=GOOGLEBOT).status_code == 504
    assert closed.wait(5)
    gate.close()


def test_a_fragment_in_the_raw_target_is_no_part_of_the_page(tmp_path: Path) -> None:
    # gunicorn's RAW_URI keeps a fragment a client sent; the page is the one without it, as for a person.
    site = WsgiSite()
    gate = CrawlerGateWSGI(site, settings=Settings(l2=L2Settings(cache_dir=str(tmp_path / "l2"))))
    raw_targets = iter(["/t/1#reply-5", "/t/1?#top", "/t/1"])

    def gunicorn(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        environ["RAW_URI"] = next(raw_targets)
        return gate(environ, start_response)

    with httpx.Client(transport=httpx.WSGITransport(app=gunicorn), base_url="http://forum.test") as client:
        for _ in range(3):
            answer = client.get("/t/1", headers=GOOGLEBOT)
            assert answer.status_code == 200 and "thread 1" in answer.text
    assert [call["PATH_INFO"] for call in site.calls] == ["/t/1"]  # one fill, the two others hits
    gate.close()


def test_wsgi_two_deployments_of_one_app_with_folders_of_their_own_share_no_memcached_pages(
    tmp_path: Path, memcached_server: MemcachedServer
) -> None:
    """Staging and production of one project on one machine, one memcached, no public URL: production's crawler
    must never get staging's page (outside review)."""

    def deployment(banner: bytes) -> Any:
        def site(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            start_response("200 OK", [("Content-Type", "text/html")])
            return [b"<p>home [" + banner + b"]</p>"]

        return site

    answers = []
    for banner in (b"staging", b"prod"):
        l1 = L1Settings(memcached=(memcached_server.address,), local_ttl_ms=0)
        settings = Settings(l1=l1, l2=L2Settings(cache_dir=str(tmp_path / banner.decode())))
        gate = CrawlerGateWSGI(deployment(banner), settings=settings)
        with httpx.Client(transport=httpx.WSGITransport(app=gate), base_url="http://127.0.0.1:8000") as client:
            answers.append(client.get("/", headers=GOOGLEBOT))
        gate.close()
    assert [answer.headers["x-crawlergate"] for answer in answers] == ["miss", "miss"]
    assert answers[1].text == "<p>home [prod]</p>"
