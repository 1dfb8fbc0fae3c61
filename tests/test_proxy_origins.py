"""The proxy in front of origins as they are (issue 23): bodies that end when the connection closes,
slow pages for people, pages too big to store, variants by device, the origin's own validators.

Origins here are written to behave as real servers do: a raw socket (HTTP/1.0 style answers, resets),
Python's ``http.server`` (which ends every body by closing), and small Starlette apps.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import http.server
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from crawlergate.adapters.proxy import create_app
from crawlergate.config import CacheSettings, L2Settings, LogSettings, ServerSettings, Settings
from tests.conftest import RawHttpServer, ServerThread, proxy_thread, serve_process
from tests.visitors import FIREFOX, FIREFOX_LINES, GOOGLEBOT, GOOGLEBOT_SMARTPHONE

pytestmark = pytest.mark.e2e

HITS = ("l1-hit", "l2-hit")

CLOSE_BODIES = {
    b"/empty": b"",
    b"/one": b"x",
    b"/64k": b"<p>" + b"k" * (64 * 1024 - 7) + b"</p>",
    b"/5m": b"<p>" + bytes(range(97, 123)) * (5 * 1024 * 1024 // 26) + b"</p>",
}


def close_delimited(method: bytes, path: bytes) -> tuple[bytes, bool | str]:
    """Answers without Content-Length or chunking: each ends when the connection closes (RFC 9112 6.3 rule 8)."""
    if path == b"/moved":
        return b"HTTP/1.0 301 Moved Permanently\r\nLocation: /one\r\n\r\n", True
    if path == b"/reset":  # a worker that crashes mid-page: the connection is reset, not closed
        return b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n<p>half a pa", "reset"
    body = CLOSE_BODIES.get(path, b"<p>page " + path + b"</p>")
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n" + (body if method != b"HEAD" else b""), True


@pytest.fixture
def close_origin() -> Iterator[RawHttpServer]:
    origin = RawHttpServer(close_delimited).start()
    yield origin
    origin.stop()


@pytest.mark.parametrize("path", ["/empty", "/one", "/64k", "/5m", "/moved"])
def test_proxy_close_delimited_answers_are_stored_whole_and_passed_on_framed(
    close_origin: RawHttpServer, tmp_path: Path, path: str
) -> None:
    proxy = proxy_thread(close_origin.url, tmp_path)
    try:
        with httpx.Client(base_url=proxy.url, follow_redirects=False) as client:
            crawler = [client.get(path, headers=GOOGLEBOT) for _ in range(2)]
            # httpx refuses a chunked body without its last chunk: a person's answer must be framed whole.
            person = client.get(path, headers=FIREFOX)
    finally:
        proxy.stop()
    expected = b"" if path == "/moved" else CLOSE_BODIES[path.encode()]
    status = 301 if path == "/moved" else 200
    assert [answer.status_code for answer in crawler] == [status, status]
    assert [answer.content for answer in crawler] == [expected, expected]
    # An empty 200 is never stored (it is counted "empty"): passed on as it came, each time.
    second = ("miss",) if path == "/empty" else HITS
    assert crawler[0].headers["x-crawlergate"] == "miss" and crawler[1].headers["x-crawlergate"] in second
    assert person.status_code == status and person.content == expected
    assert person.headers["x-crawlergate"] == "pass"


def test_proxy_close_delimited_answer_cut_by_a_reset_is_never_stored(
    close_origin: RawHttpServer, tmp_path: Path
) -> None:
    proxy = proxy_thread(close_origin.url, tmp_path)
    try:
        with httpx.Client(base_url=proxy.url) as client:
            crawler = [client.get("/reset", headers=GOOGLEBOT) for _ in range(2)]
            with pytest.raises(httpx.RemoteProtocolError):
                client.get("/reset", headers=FIREFOX)  # cut short as from the origin: no last chunk
        stats = httpx.get(f"{proxy.url}/_crawlergate/stats").json()
    finally:
        proxy.stop()
    assert [answer.status_code for answer in crawler] == [502, 502]
    assert stats["not_stored"] == {"incomplete": 2}
    assert not list((tmp_path / "l2").rglob("*.page"))


class _Http10Handler(http.server.BaseHTTPRequestHandler):
    """Python's http.server as people run it: HTTP/1.0, no Content-Length, the body ends at the close."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.end_headers()
        self.wfile.write(b"<html><body><p>" + self.path.encode() + b"</p>" + b"." * 70000 + b"</body></html>")

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_proxy_http_server_origin_pages_are_cached_for_crawlers(tmp_path: Path) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Http10Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    proxy = proxy_thread(f"http://127.0.0.1:{server.server_address[1]}", tmp_path)
    try:
        with httpx.Client(base_url=proxy.url) as client:
            crawler = [client.get("/thread?t=1", headers=GOOGLEBOT) for _ in range(2)]
            person = client.get("/thread?t=1", headers=FIREFOX)
    finally:
        proxy.stop()
        server.shutdown()
        server.server_close()
    assert [answer.headers["x-crawlergate"] for answer in crawler][0] == "miss"
    assert crawler[1].headers["x-crawlergate"] in HITS
    assert crawler[0].content == crawler[1].content == person.content
    assert person.content.startswith(b"<html><body><p>/thread?t=1</p>") and person.content.endswith(b"</html>")


def _slow_site() -> Starlette:
    async def slow(request: Request) -> Response:
        await asyncio.sleep(float(request.query_params["s"]))
        return HTMLResponse("<p>worth the wait</p>")

    return Starlette(routes=[Route("/report", slow)])


def test_proxy_people_wait_for_a_slow_page_while_a_fill_gives_up_at_its_deadline(tmp_path: Path) -> None:
    # The defaults, as a new user has them: a 45 s export for a person, the 30 s fill deadline for a crawler.
    origin = ServerThread(_slow_site()).start()
    proxy = proxy_thread(origin.url, tmp_path)
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            started = time.monotonic()
            person = pool.submit(httpx.get, f"{proxy.url}/report?s=45", headers=FIREFOX, timeout=90)
            crawler = pool.submit(httpx.get, f"{proxy.url}/report?s=45", headers=GOOGLEBOT, timeout=90)
            crawler_answer = crawler.result()
            crawler_s = time.monotonic() - started
            person_answer = person.result()
    finally:
        proxy.stop()
        origin.stop()
    assert crawler_answer.status_code == 504 and 29 < crawler_s < 40
    assert person_answer.status_code == 200 and person_answer.text == "<p>worth the wait</p>"


def test_proxy_people_time_out_after_the_read_timeout_not_before(tmp_path: Path) -> None:
    origin = ServerThread(_slow_site()).start()
    proxy = proxy_thread(origin.url, tmp_path, origin_read_timeout_seconds=1.0)
    try:
        waited = httpx.get(f"{proxy.url}/report?s=0.5", headers=FIREFOX)
        gave_up = httpx.get(f"{proxy.url}/report?s=3", headers=FIREFOX)
    finally:
        proxy.stop()
        origin.stop()
    assert waited.status_code == 200
    assert gave_up.status_code == 504


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "streamed"])
@pytest.mark.parametrize("rest", [pytest.param(b"", id="cut"), pytest.param(b"zz\r\nnot a chunk\r\n", id="malformed")])
def test_proxy_cut_or_malformed_chunked_upload_never_reaches_the_origin_whole(
    tmp_path: Path, rest: bytes, buffered: bool
) -> None:
    received: list[str] = []

    async def upload(request: Request) -> Response:
        try:
            body = b"".join([chunk async for chunk in request.stream()])
        except ClientDisconnect:
            received.append("cut")
            raise
        received.append(f"whole:{body!r}")
        return Response("stored")

    origin = ServerThread(Starlette(routes=[Route("/upload", upload, methods=["POST"])])).start()
    proxy = proxy_thread(origin.url, tmp_path, buffer_request_bodies=buffered)
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as raw:
            raw.sendall(
                b"POST /upload HTTP/1.1\r\nHost: site.example\r\nCookie: session=1\r\nTransfer-Encoding: chunked\r\n"
                + FIREFOX_LINES
                + b"\r\n5\r\nhello\r\n"
                + rest
            )
            time.sleep(0.3)
        deadline = time.monotonic() + (1 if buffered else 5)
        while not received and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        proxy.stop()
        origin.stop()
    assert received == ([] if buffered else ["cut"])  # read whole first, the origin is never asked


@pytest.mark.parametrize("kind", ["length", "chunked", "close"])
def test_proxy_page_over_the_size_limit_is_passed_to_crawlers_and_counted_too_big(tmp_path: Path, kind: str) -> None:
    page = b"<p>" + b"b" * (9 * 1024 * 1024) + b"</p>"

    def answer(method: bytes, path: bytes) -> tuple[bytes, bool | str]:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"
        if kind == "length":
            return head + b"Content-Length: %d\r\n\r\n" % len(page) + page, False
        if kind == "chunked":
            half = len(page) // 2
            chunks = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (half, page[:half], len(page) - half, page[half:])
            return head + b"Transfer-Encoding: chunked\r\n\r\n" + chunks, False
        return head + b"\r\n" + page, True

    origin = RawHttpServer(answer).start()
    proxy = proxy_thread(origin.url, tmp_path)
    try:
        answers = [httpx.get(f"{proxy.url}/big", headers=GOOGLEBOT, timeout=30) for _ in range(2)]
        stats = httpx.get(f"{proxy.url}/_crawlergate/stats").json()
    finally:
        proxy.stop()
        origin.stop()
    assert [answer.status_code for answer in answers] == [200, 200]
    assert all(answer.content == page and answer.headers["x-crawlergate"] == "pass" for answer in answers)
    assert stats["not_stored"] == {"too-big": 2} and stats["origin_errors"] == 0
    assert not list((tmp_path / "l2").rglob("*.page"))


def test_proxy_event_stream_is_passed_to_crawlers_and_counted_stream(tmp_path: Path) -> None:
    events = [b"data: %d\n\n" % number for number in range(5)]

    def answer(method: bytes, path: bytes) -> tuple[list[bytes], bool | str]:
        return [b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n\r\n", *events], True

    origin = RawHttpServer(answer).start()
    proxy = proxy_thread(origin.url, tmp_path)
    try:
        answers = [httpx.get(f"{proxy.url}/events", headers=GOOGLEBOT, timeout=30) for _ in range(2)]
        stats = httpx.get(f"{proxy.url}/_crawlergate/stats").json()
    finally:
        proxy.stop()
        origin.stop()
    assert all(answer.content == b"".join(events) and answer.headers["x-crawlergate"] == "pass" for answer in answers)
    assert stats["not_stored"] == {"stream": 2} and stats["origin_errors"] == 0


def test_proxy_cached_answers_keep_the_origins_validator_refresh_and_ranges(tmp_path: Path) -> None:
    body = b"<html>" + b"r" * 5000 + b"</html>"

    def answer(method: bytes, path: bytes) -> tuple[bytes, bool | str]:
        head = b'HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nETag: "v42"\r\nRefresh: 30; url=/next\r\n'
        return head + b"Content-Length: %d\r\n\r\n" % len(body) + body, False

    origin = RawHttpServer(answer).start()
    proxy = proxy_thread(origin.url, tmp_path)
    identity = {**GOOGLEBOT, "accept-encoding": "identity"}
    try:
        with httpx.Client(base_url=proxy.url) as client:
            client.get("/p", headers=GOOGLEBOT)
            hit = client.get("/p", headers=GOOGLEBOT)
            revalidated = client.get("/p", headers={**GOOGLEBOT, "if-none-match": '"v42"'})
            first = client.get("/p", headers={**identity, "range": "bytes=0-5"})
            tail = client.get("/p", headers={**identity, "range": "bytes=-7"})
            past = client.get("/p", headers={**identity, "range": "bytes=99999-"})
            several = client.get("/p", headers={**identity, "range": "bytes=0-1,4-5"})
            if_range = client.get("/p", headers={**identity, "range": "bytes=0-5", "if-range": '"v42"'})
    finally:
        proxy.stop()
        origin.stop()
    assert hit.headers["x-crawlergate"] in HITS
    # The origin's strong tag, weakened as nginx does when it compresses: If-None-Match compares weakly.
    assert hit.headers["etag"] == 'W/"v42"' and revalidated.status_code == 304
    assert hit.headers["refresh"] == "30; url=/next" and hit.headers["accept-ranges"] == "bytes"
    assert (first.status_code, first.content, first.headers["content-range"]) == (
        206,
        b"<html>",
        f"bytes 0-5/{len(body)}",
    )
    assert (tail.status_code, tail.content) == (206, b"</html>")
    assert (past.status_code, past.headers["content-range"]) == (416, f"bytes */{len(body)}")
    assert (several.status_code, several.content) == (200, body)
    assert (if_range.status_code, if_range.content) == (200, body)


def _dynamic_serving_site(fetched: list[str]) -> Starlette:
    """A site that serves phones their own page at the same URL, and says so (Vary: User-Agent)."""

    async def page(request: Request) -> Response:
        agent = request.headers.get("user-agent", "")
        fetched.append(agent)
        kind = "mobile" if "Mobile" in agent else "desktop"
        return HTMLResponse(f"<p>{kind} {request.url.path}</p>", headers={"vary": "User-Agent"})

    async def plain(request: Request) -> Response:
        fetched.append(request.headers.get("user-agent", ""))
        return HTMLResponse("<p>one page for all</p>")

    return Starlette(routes=[Route("/plain", plain), Route("/{name}", page)])


def test_proxy_pages_that_vary_by_user_agent_are_cached_per_device(tmp_path: Path) -> None:
    fetched: list[str] = []
    origin = ServerThread(_dynamic_serving_site(fetched)).start()
    gate = create_app(Settings(server=ServerSettings(origin=origin.url), l2=L2Settings(cache_dir=str(tmp_path / "l2"))))
    proxy = ServerThread(gate).start()
    try:
        with httpx.Client(base_url=proxy.url) as client:
            phone = [client.get("/story", headers=GOOGLEBOT_SMARTPHONE) for _ in range(2)]
            desktop = [client.get("/story", headers=GOOGLEBOT) for _ in range(2)]
            fills_of_story = len(fetched)
            plain = [client.get("/plain", headers=agent) for agent in (GOOGLEBOT_SMARTPHONE, GOOGLEBOT)]
            fills_of_plain = len(fetched) - fills_of_story
            marked = gate.mark_changed("/story")
    finally:
        proxy.stop()
        origin.stop()
    assert [answer.text for answer in phone] == ["<p>mobile /story</p>"] * 2
    assert [answer.text for answer in desktop] == ["<p>desktop /story</p>"] * 2
    assert phone[0].headers["x-crawlergate"] == "miss"
    assert [answer.headers["x-crawlergate"] for answer in (phone[1], *desktop)] == ["l1-hit"] * 3
    assert all(answer.headers["vary"] == "Accept-Encoding, User-Agent" for answer in (*phone, *desktop))
    # The page's own copy (desktop) told the gate it varies, then the phone's copy was fetched as a phone.
    assert fills_of_story == 2 and "Mobile" not in fetched[0] and "Mobile" in fetched[1]
    # A page that does not vary is one page for every device: one fill, and the phone's key is the page's.
    assert [answer.text for answer in plain] == ["<p>one page for all</p>"] * 2 and fills_of_plain == 1
    assert marked == 2  # the page and its phone copy


def test_proxy_clients_that_leave_free_their_origin_connections_at_once(tmp_path: Path) -> None:
    """520 requests for a page the origin answers in 40 s, each client gone right after sending: the pool
    (512 connections) is free again at once, and a person's fast page is answered."""

    arrived: list[int] = []
    left: list[int] = []

    async def slow(request: Request) -> Response:
        arrived.append(1)
        for _ in range(400):  # 40 s, unless the gate hangs up
            if await request.is_disconnected():
                left.append(1)
                break
            await asyncio.sleep(0.1)
        return HTMLResponse("<p>late</p>")

    async def fast(request: Request) -> Response:
        return HTMLResponse("<p>fast</p>")

    origin = ServerThread(Starlette(routes=[Route("/slow", slow), Route("/fast", fast)]), backlog=2048).start()
    proxy = proxy_thread(origin.url, tmp_path)
    request = b"GET /slow HTTP/1.1\r\nHost: site.example\r\nCookie: session=1\r\n" + FIREFOX_LINES + b"\r\n"
    try:
        for _ in range(520):
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as raw:
                raw.sendall(request)
        time.sleep(1)
        started = time.monotonic()
        person = httpx.get(f"{proxy.url}/fast", headers={**FIREFOX, "cookie": "session=1"}, timeout=10)
        waited_s = time.monotonic() - started
    finally:
        proxy.stop()
        origin.stop()
    assert person.status_code == 200 and person.text == "<p>fast</p>"
    assert waited_s < 1.0
    # The gate hung up on the origin for every client that left (or never sent it the request at all).
    assert len(arrived) - len(left) <= 5, (len(arrived), len(left))


def test_proxy_a_client_that_leaves_before_its_answer_is_logged_as_nginx_logs_it(tmp_path: Path) -> None:
    """499 (nginx's "client closed request"), with the time it waited: 520 such clients are an attack the access log
    must show."""
    origin = ServerThread(_site_with_a_slow_page(3)).start()
    log = tmp_path / "access.log"
    settings = Settings(
        server=ServerSettings(origin=origin.url),
        l2=L2Settings(cache_dir=str(tmp_path / "l2")),
        log=LogSettings(access_log=str(log)),
    )
    proxy = ServerThread(create_app(settings)).start()
    request = b"GET /slow HTTP/1.1\r\nHost: site.example\r\nCookie: session=1\r\n" + FIREFOX_LINES + b"\r\n"
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as raw:
            raw.sendall(request)
            time.sleep(0.3)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and " 499 " not in (log.read_text() if log.exists() else ""):
            time.sleep(0.1)
    finally:
        proxy.stop()
        origin.stop()
    line = log.read_text()
    assert '"GET /slow HTTP/1.1" 499 0 ' in line and line.count("\n") == 1
    waited_us = int(line.split(" pass ")[0].rsplit(" ", 1)[1])  # the TTFB field, before the outcome
    assert 250_000 <= waited_us < 3_000_000  # from the request to the client's leaving, not the page's 3 s


def _site_with_a_slow_page(seconds: float) -> Starlette:
    """Pages answered at once, but /slow, which takes ``seconds``."""

    async def page(request: Request) -> Response:
        if request.url.path == "/slow":
            await asyncio.sleep(seconds)
        return HTMLResponse(f"<p>{request.url.path}</p>")

    return Starlette(routes=[Route("/{name}", page)])


def test_proxy_three_slow_person_requests_leave_crawler_misses_answered(tmp_path: Path) -> None:
    """Anyone could make the valve refuse every crawler miss site-wide with three requests to a slow URL."""

    origin = ServerThread(_site_with_a_slow_page(seconds=3)).start()
    proxy = proxy_thread(origin.url, tmp_path)
    try:
        for name in ("a", "b", "c", "d", "a", "b", "c", "d"):  # the site's normal: fast pages
            httpx.get(f"{proxy.url}/{name}", headers=FIREFOX)
        with ThreadPoolExecutor(max_workers=3) as pool:
            slow = list(pool.map(lambda _: httpx.get(f"{proxy.url}/slow", headers=FIREFOX, timeout=30), range(3)))
        crawler = [httpx.get(f"{proxy.url}/fresh{n}", headers=GOOGLEBOT) for n in range(8)]
    finally:
        proxy.stop()
        origin.stop()
    assert [answer.status_code for answer in slow] == [200] * 3
    assert [answer.status_code for answer in crawler] == [200] * 8


def test_proxy_fake_googlebot_busting_the_cache_is_held_to_its_fill_budget(tmp_path: Path) -> None:
    """1,000 distinct ?n= from one address outside Google's ranges with Googlebot's user agent."""
    fetched: list[str] = []

    async def page(request: Request) -> Response:
        fetched.append(str(request.url))
        return HTMLResponse("<p>page</p>")

    origin = ServerThread(Starlette(routes=[Route("/thread", page)])).start()
    proxy = proxy_thread(origin.url, tmp_path)
    fake = {**GOOGLEBOT, "x-forwarded-for": "198.51.100.7"}  # through the trusted front (loopback)
    neighbour = {**GOOGLEBOT, "x-forwarded-for": "198.51.100.99"}  # same /24
    other = {**GOOGLEBOT, "x-forwarded-for": "203.0.113.5"}
    try:
        started = time.monotonic()
        with httpx.Client(base_url=proxy.url) as client:
            statuses = Counter(client.get(f"/thread?n={n}", headers=fake).status_code for n in range(1000))
            from_neighbour = client.get("/thread?n=x", headers=neighbour)
            with_a_port = client.get("/thread?n=p", headers={**fake, "x-forwarded-for": "198.51.100.7:5123"})
            elsewhere = client.get("/thread?n=y", headers=other)
            zoned = client.get("/thread?n=z", headers={**GOOGLEBOT, "x-forwarded-for": "fe80::1%eth3"})
            stats = client.get("/_crawlergate/stats").json()
        elapsed_s = time.monotonic() - started
    finally:
        proxy.stop()
        origin.stop()
    # The burst (60), then 30 a minute: the site filled a few dozen pages, not a thousand.
    assert len(fetched) <= 60 + elapsed_s / 2 + 2, (len(fetched), elapsed_s)
    assert statuses[503] >= 900 and statuses[200] + 2 == len(fetched)  # and the two from elsewhere
    assert from_neighbour.status_code == with_a_port.status_code == 503
    assert elsewhere.status_code == zoned.status_code == 200
    assert stats["valve"]["refused"]["fill_budget"] == statuses[503] + 2
    assert len(list((tmp_path / "l2").rglob("*.page"))) <= len(fetched) + 1


def test_serve_two_workers_filling_never_hold_more_than_the_l2_cap_and_a_page(tmp_path: Path) -> None:
    """Two worker processes fill distinct pages for 20 s; the folder is measured every 100 ms."""
    page = HTMLResponse("<p>" + "x" * 20_000 + "</p>")

    async def any_page(request: Request) -> Response:
        return page

    origin = ServerThread(Starlette(routes=[Route("/p/{n}", any_page)])).start()
    cap, page_on_disk = 1_000_000, 4096  # a 20 KB page is about 2 KB of gzip: one block
    largest = 0
    try:
        with serve_process(origin.url, tmp_path, f"[l2]\nmax_bytes = {cap}\n", workers=2) as gate:
            stop = threading.Event()

            def crawl(first: int) -> None:
                with httpx.Client(base_url=gate, headers=GOOGLEBOT) as client:
                    for number in range(first, first + 100_000):  # bounded: 20 s at most
                        if stop.is_set():
                            return
                        client.get(f"/p/{number}")

            crawlers = [threading.Thread(target=crawl, args=(first,)) for first in (0, 1_000_000, 2_000_000)]
            for crawler in crawlers:
                crawler.start()
            deadline = time.monotonic() + 20
            pages = 0
            while time.monotonic() < deadline:
                files = list((tmp_path / "l2").rglob("*.page"))
                on_disk = 0
                for file in files:
                    with contextlib.suppress(FileNotFoundError):
                        on_disk += -(-file.stat().st_size // 4096) * 4096
                largest, pages = max(largest, on_disk), max(pages, len(files))
                time.sleep(0.1)
            stop.set()
            for crawler in crawlers:
                crawler.join()
    finally:
        origin.stop()
    assert pages > 200  # the cap was reached and held while both workers kept filling
    # The folder holds at most the cap and the page being written. The listing above is no snapshot, though:
    # a page evicted after it was counted and the one written meanwhile can both be seen, so one page more.
    assert largest <= cap + 2 * page_on_disk, largest


def test_proxy_limits_one_clients_requests_to_the_origin_when_asked(tmp_path: Path) -> None:
    async def slow(request: Request) -> Response:
        await asyncio.sleep(1)
        return HTMLResponse("<p>done</p>")

    origin = ServerThread(Starlette(routes=[Route("/slow", slow)])).start()
    proxy = proxy_thread(origin.url, tmp_path, origin_requests_per_client=2)
    one = {**FIREFOX, "cookie": "session=1", "x-forwarded-for": "198.51.100.7"}
    other = {**FIREFOX, "cookie": "session=2", "x-forwarded-for": "198.51.100.8"}
    try:
        with ThreadPoolExecutor(max_workers=4) as pool:
            first = [pool.submit(httpx.get, f"{proxy.url}/slow", headers=one, timeout=10) for _ in range(3)]
            time.sleep(0.3)
            elsewhere = pool.submit(httpx.get, f"{proxy.url}/slow", headers=other, timeout=10)
            statuses = sorted(future.result().status_code for future in first)
            later = httpx.get(f"{proxy.url}/slow", headers=one, timeout=10)
    finally:
        proxy.stop()
        origin.stop()
    assert statuses == [200, 200, 503]
    assert elsewhere.result().status_code == 200 and later.status_code == 200


def test_proxy_interim_answers_are_skipped_never_taken_for_the_next_requests(tmp_path: Path) -> None:
    """An origin's 103 Early Hints (or a 100 Continue) comes before the final answer on the same connection:
    taken as the answer, the final one was read as the next person's answer."""

    def answer(method: bytes, path: bytes) -> tuple[bytes, bool | str]:
        if path.startswith(b"/hinted"):
            body = b"<p>private answer of " + path + b"</p>"
            hints = b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
            final = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            return b"HTTP/1.1 100 Continue\r\n\r\n" + hints + final, False
        body = b"<p>page of " + path + b"</p>"
        return b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body), False

    origin = RawHttpServer(answer).start()
    proxy = proxy_thread(origin.url, tmp_path)
    try:
        with httpx.Client(base_url=proxy.url) as alice, httpx.Client(base_url=proxy.url) as bob:
            alices = alice.get("/hinted-alice", headers={**FIREFOX, "cookie": "session=alice"})
            bobs = bob.get("/bobs-page", headers={**FIREFOX, "cookie": "session=bob"})
            crawler = [alice.get("/hinted-page", headers=GOOGLEBOT) for _ in range(2)]
    finally:
        proxy.stop()
        origin.stop()
    assert (alices.status_code, alices.text) == (200, "<p>private answer of /hinted-alice</p>")
    assert (bobs.status_code, bobs.text) == (200, "<p>page of /bobs-page</p>")
    assert [answer.text for answer in crawler] == ["<p>private answer of /hinted-page</p>"] * 2
    assert crawler[1].headers["x-crawlergate"] in HITS


@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_proxy_uploads_whose_clients_leave_free_their_origin_connections(tmp_path: Path, framing: str) -> None:
    """A POST sent whole, then the client hangs up before the origin answers: its connection is freed."""

    async def slow(request: Request) -> Response:
        await request.body()
        for _ in range(100):  # 10 s, unless the gate hangs up
            if await request.is_disconnected():
                break
            await asyncio.sleep(0.1)
        return HTMLResponse("<p>late</p>")

    async def fast(request: Request) -> Response:
        return HTMLResponse("<p>fast</p>")

    app = Starlette(routes=[Route("/slow", slow, methods=["POST"]), Route("/fast", fast)])
    origin = ServerThread(app).start()
    proxy = proxy_thread(origin.url, tmp_path, origin_max_connections=5)
    head = b"POST /slow HTTP/1.1\r\nHost: site.example\r\nCookie: session=1\r\n" + FIREFOX_LINES
    upload = (
        head + b"Content-Length: 5\r\n\r\nhello"
        if framing == "length"
        else head + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    )
    try:
        for _ in range(8):
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as raw:
                raw.sendall(upload)
                time.sleep(0.05)  # the body reaches the origin before the client leaves
        time.sleep(0.5)
        started = time.monotonic()
        person = httpx.get(f"{proxy.url}/fast", headers={**FIREFOX, "cookie": "session=2"}, timeout=10)
        waited_s = time.monotonic() - started
    finally:
        proxy.stop()
        origin.stop()
    assert person.status_code == 200 and waited_s < 1.0


def test_proxy_the_gates_own_504s_never_trip_the_valve(tmp_path: Path) -> None:
    """People's requests that wait for a full pool and get the gate's 504 say nothing of the site's speed."""

    origin = ServerThread(_site_with_a_slow_page(seconds=4)).start()
    proxy = proxy_thread(origin.url, tmp_path, origin_max_connections=2, origin_connect_timeout_seconds=1.0)
    person = {**FIREFOX, "cookie": "session=1"}
    try:
        for name in ("a", "b", "c", "d", "a", "b", "c", "d"):
            httpx.get(f"{proxy.url}/{name}", headers=person)
        with ThreadPoolExecutor(max_workers=5) as pool:
            held = [pool.submit(httpx.get, f"{proxy.url}/slow", headers=person, timeout=10) for _ in range(2)]
            time.sleep(0.3)
            refused = list(pool.map(lambda name: httpx.get(f"{proxy.url}/{name}", headers=person), ("a", "b", "c")))
            crawler = [httpx.get(f"{proxy.url}/fresh{n}", headers=GOOGLEBOT) for n in range(4)]
            assert [future.result().status_code for future in held] == [200, 200]
    finally:
        proxy.stop()
        origin.stop()
    assert [answer.status_code for answer in refused] == [504] * 3
    assert [answer.status_code for answer in crawler] == [200] * 4


def test_proxy_a_304_or_204_with_a_content_length_keeps_the_connection(tmp_path: Path) -> None:
    """RFC 9110 lets a 304 carry the page's Content-Length: passed on, the server in front waited for a body that
    never comes, broke the client's connection and logged a traceback."""

    def answer(method: bytes, path: bytes) -> tuple[bytes, bool | str]:
        if path == b"/not-modified":
            return b'HTTP/1.1 304 Not Modified\r\nETag: "7"\r\nContent-Length: 5000\r\n\r\n', False
        if path == b"/no-content":
            return b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n", False
        return b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok", False

    origin = RawHttpServer(answer).start()
    proxy = proxy_thread(origin.url, tmp_path)
    try:
        with httpx.Client(base_url=proxy.url) as person:
            answers = [person.get(path, headers=FIREFOX) for path in ("/not-modified", "/no-content", "/after")]
        with httpx.Client(base_url=proxy.url) as crawler:
            crawled = [crawler.get(path, headers=GOOGLEBOT) for path in ("/not-modified", "/no-content", "/after")]
    finally:
        proxy.stop()
        origin.stop()
    for got in (answers, crawled):
        assert [answer.status_code for answer in got] == [304, 204, 200]
        assert got[0].headers["etag"] == '"7"' and "content-length" not in got[0].headers
        assert "content-length" not in got[1].headers and got[2].text == "ok"


PAGE = b"<html><body><p>the page</p></body></html>"


def deceiving(method: bytes, path: bytes) -> tuple[bytes, bool | str]:
    """Answers that look like a page and are not what they say: each must never be stored as it looks."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"

    def sized(extra: bytes, body: bytes, status: bytes = b"200 OK") -> bytes:
        top = b"HTTP/1.1 " + status + b"\r\n"
        return top + extra + b"Content-Length: %d\r\n\r\n" % len(body) + (body if method != b"HEAD" else b"")

    if path == b"/te-gzip":  # a transfer coding besides chunked: the body is gzip, not the page
        packed = gzip.compress(PAGE)
        return head + b"Transfer-Encoding: gzip, chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(packed), packed), False
    if path == b"/ce-split":  # one list of codings over two lines (RFC 9110 5.3)
        extra = b"Content-Type: text/html\r\nContent-Encoding: identity\r\nContent-Encoding: gzip\r\n"
        return sized(extra, gzip.compress(PAGE)), False
    if path == b"/br":  # a coding the fill did not ask for: browsers read it, the gate cannot
        return sized(b"Content-Type: text/html\r\nContent-Encoding: br\r\n", b"\x1b\x2a\x00\xf8not-really"), False
    if path == b"/gzip-junk":  # gzip, then bytes that are no gzip member
        return sized(b"Content-Type: text/html\r\nContent-Encoding: gzip\r\n", gzip.compress(PAGE) + b"junk"), False
    if path in (b"/self-relative", b"/dir/self-dotted"):  # a relative redirect to the very URL
        location = b"self-relative" if path == b"/self-relative" else b"../dir/self-dotted"
        return sized(b"Location: " + location + b"\r\n", b"", b"301 Moved Permanently"), False
    if path == b"/untyped":
        return sized(b"", PAGE), False
    if path == b"/claims":  # the site's own X-Crawlergate says nothing of what the gate did
        return sized(b"Content-Type: text/html\r\nX-Crawlergate: l1-hit\r\n", PAGE), False
    if path == b"/huge-head":  # a header of a megabyte: no answer, and never fed whole to the parser
        return sized(b"Content-Type: text/html\r\nLink: <" + b"a" * (1024 * 1024) + b">\r\n", PAGE), False
    return sized(b"Content-Type: text/html\r\n", PAGE), False


@pytest.fixture
def deceiving_origin() -> Iterator[RawHttpServer]:
    origin = RawHttpServer(deceiving).start()
    yield origin
    origin.stop()


def _crawled_twice(origin: RawHttpServer, tmp_path: Path, path: str) -> tuple[list[httpx.Response], dict[str, Any]]:
    proxy = proxy_thread(origin.url, tmp_path)
    try:
        with httpx.Client(base_url=proxy.url, follow_redirects=False, timeout=30) as client:
            answers = [client.get(path, headers={**GOOGLEBOT, "accept-encoding": "gzip"}) for _ in range(2)]
            stats = client.get("/_crawlergate/stats").json()
    finally:
        proxy.stop()
    return answers, stats


@pytest.mark.parametrize("path", ["/te-gzip", "/huge-head"])
def test_proxy_answers_a_cache_cannot_frame_are_refused_never_stored(
    deceiving_origin: RawHttpServer, tmp_path: Path, path: str
) -> None:
    answers, stats = _crawled_twice(deceiving_origin, tmp_path, path)
    assert [(answer.status_code, answer.headers["x-crawlergate"]) for answer in answers] == [(502, "miss")] * 2
    assert stats["not_stored"] == {"origin-error": 2} and not list((tmp_path / "l2").rglob("*.page"))


@pytest.mark.parametrize("path", ["/br", "/gzip-junk"])
def test_proxy_pages_in_a_coding_the_gate_cannot_read_are_passed_on_as_sent(
    deceiving_origin: RawHttpServer, tmp_path: Path, path: str
) -> None:
    answers, stats = _crawled_twice(deceiving_origin, tmp_path, path)
    sent = deceiving(b"GET", path.encode())[0].partition(b"\r\n\r\n")[2]
    assert all(answer.status_code == 200 and answer.headers["x-crawlergate"] == "pass" for answer in answers)
    # The body as the site sent it, coding and all.
    assert [answer.headers["content-encoding"] for answer in answers] == [path.strip("/").split("-")[0]] * 2
    assert [answer.headers["content-length"] for answer in answers] == [str(len(sent))] * 2
    assert stats["not_stored"] == {"encoding": 2} and stats["origin_errors"] == 0


def test_proxy_codings_over_two_header_lines_are_read_as_one_list(
    deceiving_origin: RawHttpServer, tmp_path: Path
) -> None:
    answers, _ = _crawled_twice(deceiving_origin, tmp_path, "/ce-split")
    assert [answer.headers["x-crawlergate"] for answer in answers] == ["miss", "l1-hit"]
    assert all(answer.content == PAGE for answer in answers)  # httpx undoes the gate's one gzip


@pytest.mark.parametrize("path", ["/self-relative", "/dir/self-dotted"])
def test_proxy_a_relative_redirect_to_itself_is_never_stored(
    deceiving_origin: RawHttpServer, tmp_path: Path, path: str
) -> None:
    answers, stats = _crawled_twice(deceiving_origin, tmp_path, path)
    assert [(answer.status_code, answer.headers["x-crawlergate"]) for answer in answers] == [(301, "pass")] * 2
    assert stats["not_stored"] == {"redirect-to-self": 2}


def test_proxy_a_page_without_a_type_is_served_without_one_and_the_sites_claims_are_dropped(
    deceiving_origin: RawHttpServer, tmp_path: Path
) -> None:
    untyped, _ = _crawled_twice(deceiving_origin, tmp_path / "untyped", "/untyped")
    claimed, _ = _crawled_twice(deceiving_origin, tmp_path / "claims", "/claims")
    proxy = proxy_thread(deceiving_origin.url, tmp_path / "person")
    try:
        person = httpx.get(f"{proxy.url}/claims", headers=FIREFOX)
    finally:
        proxy.stop()
    assert [answer.headers["x-crawlergate"] for answer in untyped] == ["miss", "l1-hit"]
    assert all("content-type" not in answer.headers and answer.content == PAGE for answer in untyped)
    assert [answer.headers.get_list("x-crawlergate") for answer in claimed] == [["miss"], ["l1-hit"]]
    assert person.headers.get_list("x-crawlergate") == ["pass"]


def test_proxy_a_site_that_answers_429_gets_its_stored_copy_served_stale(tmp_path: Path) -> None:
    asked: list[bytes] = []

    def tiring(method: bytes, path: bytes) -> tuple[bytes, bool | str]:
        asked.append(path)
        if len(asked) == 1:
            return deceiving(method, b"/page")
        return b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 120\r\nContent-Length: 5\r\n\r\nslow!", False

    origin = RawHttpServer(tiring).start()
    proxy = proxy_thread(origin.url, tmp_path, cache=CacheSettings(ttl_seconds=0.5, max_stale_seconds=0))
    try:
        first = httpx.get(f"{proxy.url}/p", headers=GOOGLEBOT)
        time.sleep(0.7)  # expired: the next request fills, and the site says slow down
        stale = httpx.get(f"{proxy.url}/p", headers=GOOGLEBOT)
        nothing_stored = httpx.get(f"{proxy.url}/new", headers=GOOGLEBOT)
    finally:
        proxy.stop()
        origin.stop()
    assert (first.headers["x-crawlergate"], first.content) == ("miss", PAGE)
    assert (stale.status_code, stale.headers["x-crawlergate"], stale.content) == (200, "stale", PAGE)
    # With no copy stored, the site's own 429 (and its Retry-After) reaches the crawler.
    assert (nothing_stored.status_code, nothing_stored.headers["retry-after"]) == (429, "120")


def test_a_person_who_reads_nothing_lets_go_of_the_origin_after_the_send_timeout(tmp_path: Path) -> None:
    # nginx's send_timeout: a client that reads nothing for that long is dropped, and so is what fed it.
    released = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(30)

    def endless_answer(connection: socket.socket) -> None:
        with connection:
            connection.settimeout(30)
            head = b""
            while b"\r\n\r\n" not in head:
                read = connection.recv(65536)
                if not read:
                    return  # serve's look at the origin when it starts
                head += read
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 1000000000\r\n\r\n")
            deadline = time.monotonic() + 30
            try:
                while time.monotonic() < deadline:
                    connection.sendall(b"x" * 65536)
            except TimeoutError:
                return
            except OSError:
                released.set()

    def endless_origin() -> None:
        with contextlib.suppress(TimeoutError), listener:
            for _ in range(4):
                threading.Thread(target=endless_answer, args=(listener.accept()[0],), daemon=True).start()

    threading.Thread(target=endless_origin, daemon=True).start()
    origin = f"http://127.0.0.1:{listener.getsockname()[1]}"
    request = b"GET /big HTTP/1.1\r\nHost: site.example\r\nCookie: session=1\r\n" + FIREFOX_LINES + b"\r\n"
    with serve_process(origin, tmp_path, "[server]\nsend_timeout_seconds = 1\n") as base, socket.socket() as person:
        person.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        person.connect(("127.0.0.1", int(base.rsplit(":", 1)[1])))
        person.sendall(request)
        assert released.wait(15)  # the origin's connection let go, seconds after the person stopped reading
        person.settimeout(5)
        received = 0
        with contextlib.suppress(ConnectionResetError):
            while read := person.recv(65536):
                received += len(read)
        assert received < 100_000_000  # dropped: what the gate held for it is not sent on


def _upload_site(received: list[tuple[float, bytes]]) -> Starlette:
    async def upload(request: Request) -> Response:
        received.append((time.monotonic(), await request.body()))
        return Response("stored")

    return Starlette(routes=[Route("/upload", upload, methods=["POST"])])


def _answer_of(raw: socket.socket) -> bytes:
    answer = b""
    with contextlib.suppress(ConnectionResetError):
        while b"\r\n\r\n" not in answer and (read := raw.recv(65536)):
            answer += read
    return answer


def test_proxy_a_slow_upload_reaches_the_origin_whole_and_at_once(tmp_path: Path) -> None:
    # nginx's proxy_request_buffering: a body sent slowly holds a connection of the gate's, not an origin worker.
    received: list[tuple[float, bytes]] = []
    origin = ServerThread(_upload_site(received)).start()
    proxy = proxy_thread(origin.url, tmp_path)
    head = b"POST /upload HTTP/1.1\r\nHost: site.example\r\nCookie: session=1\r\nContent-Length: 15\r\n" + FIREFOX_LINES
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as raw:
            raw.sendall(head + b"\r\nhello")
            for piece in (b"hello", b"hello"):
                time.sleep(0.4)
                assert received == []  # the origin is not asked while the body comes
                sent_at = time.monotonic()  # before the send: the origin may have the body before this thread runs on
                raw.sendall(piece)
            answer = _answer_of(raw)
    finally:
        proxy.stop()
        origin.stop()
    assert answer.startswith(b"HTTP/1.1 200") and [body for _, body in received] == [b"hellohellohello"]
    assert received[0][0] >= sent_at


class _QuietWsgiHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the name wsgiref calls it by
        pass


@pytest.mark.parametrize("size", [10, 200 * 1024])  # held in memory, and in a temporary file
def test_proxy_a_chunked_upload_reaches_a_server_that_reads_only_content_length(tmp_path: Path, size: int) -> None:
    """wsgiref (under Django's runserver) reads a body by its Content-Length alone: a chunked upload, read whole
    first, goes on with its length, as nginx sends it, and arrives whole."""

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        received = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"%d %s" % (len(received), environ.get("HTTP_TRANSFER_ENCODING", "-").encode())]

    origin = make_server("127.0.0.1", 0, app, handler_class=_QuietWsgiHandler)
    threading.Thread(target=origin.serve_forever, daemon=True).start()
    proxy = proxy_thread(f"http://127.0.0.1:{origin.server_port}", tmp_path)
    try:
        pieces = [b"x" * (size // 2), b"y" * (size - size // 2)]
        answer = httpx.post(f"{proxy.url}/upload", content=iter(pieces), headers=FIREFOX)
    finally:
        proxy.stop()
        origin.shutdown()
        origin.server_close()
    assert answer.request.headers["transfer-encoding"] == "chunked"
    assert answer.text == f"{size} -"


@pytest.mark.parametrize("case", ["slow", "declared-too-large", "chunked-too-large"])
def test_proxy_a_body_too_slow_or_too_large_is_refused_and_never_reaches_the_origin(tmp_path: Path, case: str) -> None:
    received: list[tuple[float, bytes]] = []
    origin = ServerThread(_upload_site(received)).start()
    proxy = proxy_thread(origin.url, tmp_path, body_timeout_seconds=0.5, max_body_bytes=100)
    head = b"POST /upload HTTP/1.1\r\nHost: site.example\r\nCookie: session=1\r\n" + FIREFOX_LINES
    request = {
        "slow": head + b"Content-Length: 10\r\n\r\nhe",
        "declared-too-large": head + b"Content-Length: 101\r\n\r\n",
        "chunked-too-large": head + b"Transfer-Encoding: chunked\r\n\r\n" + (b"40\r\n" + b"x" * 64 + b"\r\n") * 2,
    }[case]
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as raw:
            raw.sendall(request)
            answer = _answer_of(raw)
    finally:
        proxy.stop()
        origin.stop()
    status = b"408" if case == "slow" else b"413"
    assert answer.startswith(b"HTTP/1.1 " + status) and b"connection: close" in answer.lower()
    assert received == []
