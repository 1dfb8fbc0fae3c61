"""The gate's decisions, once, through every adapter: the ASGI middleware under uvicorn and the WSGI middleware
under a threading WSGI server, in front of one site written for both interfaces. The adapters' own tests keep
only what belongs to their interface."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import anyio
import httpx
import pytest

from crawlergate import CrawlerGateMiddleware, CrawlerGateWSGI
from crawlergate.config import AdminSettings, CacheSettings, L2Settings, Settings
from tests.conftest import ServerThread
from tests.visitors import FIREFOX, GOOGLEBOT, SCRIPTED

pytestmark = pytest.mark.e2e

TOKEN = "engine-token"


@dataclass
class Site:
    """A forum in the demo forum's URL scheme; one state, served through WSGI and ASGI alike."""

    fetches: list[str] = field(default_factory=list)
    replies: dict[str, int] = field(default_factory=dict)
    down: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    release: threading.Event = field(default_factory=threading.Event)

    def answer(self, method: str, path: str, query: str, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        with self.lock:
            self.fetches.append(f"{method} {path}?{query}")
        if self.down:
            return 503, [("Content-Type", "text/plain")], b"down for maintenance"
        thread = parse_qs(query).get("t", [""])[0]
        if method == "POST" and path == "/newreply.php":
            thread = parse_qs(body.decode()).get("t", [""])[0]
            self.replies[thread] = self.replies.get(thread, 0) + 1
            return 303, [("Location", f"/showthread.php?t={thread}")], b""
        if path == "/slow":
            self.release.wait(10)
            return 200, [("Content-Type", "text/html")], b"<p>slow</p>"
        if path == "/showthread.php" and thread:
            text = f"<p>thread {thread}, {self.replies.get(thread, 0)} replies</p>" + "post " * 300
            return 200, [("Content-Type", "text/html; charset=utf-8")], text.encode()
        if path == "/personal":
            return 200, [("Content-Type", "text/html"), ("Set-Cookie", "guest=1")], b"<p>hello guest</p>"
        return 404, [("Content-Type", "text/plain")], b"no such page"

    def wsgi(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        status, headers, content = self.answer(
            environ["REQUEST_METHOD"], environ["PATH_INFO"], environ.get("QUERY_STRING", ""), body
        )
        start_response(f"{status} X", headers)
        return [content]

    async def asgi(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        method, path, query = scope["method"], scope["path"], scope["query_string"].decode()
        if path == "/slow":  # the wait must not hold the event loop
            status, headers, content = await anyio.to_thread.run_sync(self.answer, method, path, query, body)
        else:
            status, headers, content = self.answer(method, path, query, body)
        raw = [(name.lower().encode(), value.encode()) for name, value in headers]
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": content})


class Clock:
    def __init__(self) -> None:
        self.now = 2_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Running:
    url: str
    site: Site
    clock: Clock
    gate: CrawlerGateMiddleware | CrawlerGateWSGI

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=20)

    def fetches(self, path: str) -> int:
        return sum(1 for fetch in self.site.fetches if fetch.startswith(f"GET {path}"))


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(params=["asgi", "wsgi"])
def running(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Running]:
    site, clock = Site(), Clock()
    settings = Settings(
        l2=L2Settings(cache_dir=str(tmp_path / "l2")),
        cache=CacheSettings(sites=("demo-forum",), ttl_seconds=3600, max_stale_seconds=600, fill_timeout_seconds=1),
        admin=AdminSettings(token=TOKEN),
    )
    if request.param == "asgi":
        gate: CrawlerGateMiddleware | CrawlerGateWSGI = CrawlerGateMiddleware(site.asgi, settings=settings, clock=clock)
        server = ServerThread(gate).start()
        yield Running(server.url, site, clock, gate)
        site.release.set()
        server.stop()
    else:
        gate = CrawlerGateWSGI(site.wsgi, settings=settings, clock=clock)
        wsgi = make_server("127.0.0.1", 0, gate, server_class=_ThreadingServer, handler_class=_QuietHandler)
        thread = threading.Thread(target=wsgi.serve_forever, daemon=True)
        thread.start()
        yield Running(f"http://127.0.0.1:{wsgi.server_port}", site, clock, gate)
        site.release.set()
        wsgi.shutdown()
        wsgi.server_close()
        gate.close()


def test_engine_crawler_miss_hit_head_and_304(running: Running) -> None:
    with running.client() as client:
        miss = client.get("/showthread.php?t=1", headers=GOOGLEBOT)
        hit = client.get("/showthread.php?t=1&utm_source=x", headers=GOOGLEBOT)  # tracking dropped: same page
        head = client.head("/showthread.php?t=1", headers=GOOGLEBOT)
        unchanged = client.get("/showthread.php?t=1", headers={**GOOGLEBOT, "if-none-match": hit.headers["etag"]})
    assert [r.headers["x-crawlergate"] for r in (miss, hit, head, unchanged)] == ["miss", "l1-hit", "l1-hit", "l1-hit"]
    assert miss.text == hit.text and "thread 1" in hit.text and head.content == b""
    assert unchanged.status_code == 304 and "age" in hit.headers
    assert running.fetches("/showthread.php") == 1


def test_engine_people_sessions_and_other_requests_pass(running: Running) -> None:
    with running.client() as client:
        client.get("/showthread.php?t=2", headers=GOOGLEBOT)
        person = client.get("/showthread.php?t=2", headers=FIREFOX)
        member = client.get("/showthread.php?t=2", headers={**GOOGLEBOT, "cookie": "sessionid=4.abc"})
        client.cookies.clear()
        static = client.get("/static/forum.css", headers=GOOGLEBOT)
        too_long = client.get("/showthread.php?t=" + "9" * 9000, headers=GOOGLEBOT)
    assert [r.headers["x-crawlergate"] for r in (person, member, static, too_long)] == ["pass"] * 4
    assert too_long.status_code == 414 and running.fetches("/showthread.php") == 3


def test_engine_unstorable_answers_never_hand_a_cookie_to_a_crawler(running: Running) -> None:
    with running.client() as client:
        first = client.get("/personal", headers=GOOGLEBOT)
        missing = [client.get("/nowhere", headers=GOOGLEBOT) for _ in range(2)]
    assert "set-cookie" not in first.headers and first.text == "<p>hello guest</p>"
    assert [r.status_code for r in missing] == [404, 404]
    assert [r.headers["x-crawlergate"] for r in missing] == ["miss", "l1-hit"]  # a 404 is stored, briefly


def test_engine_concurrent_misses_make_one_origin_request(running: Running) -> None:
    answers: list[str] = []

    def crawl() -> None:
        with running.client() as client:
            answers.append(client.get("/slow", headers=GOOGLEBOT).text)

    threads = [threading.Thread(target=crawl) for _ in range(8)]
    for thread in threads:
        thread.start()
    while running.fetches("/slow") == 0:
        threading.Event().wait(0.01)
    threading.Event().wait(0.2)  # the others queue behind the first
    running.site.release.set()
    for thread in threads:
        thread.join(20)
    assert answers == ["<p>slow</p>"] * 8 and running.fetches("/slow") == 1


def test_engine_stale_beats_down_and_errors_are_not_stored(running: Running) -> None:
    with running.client() as client:
        client.get("/showthread.php?t=3", headers=GOOGLEBOT)
        running.site.down = True
        running.clock.now += 3600 + 601  # expired, and staler than max_stale: a fill is due
        stale = client.get("/showthread.php?t=3", headers=GOOGLEBOT)
        missing = client.get("/showthread.php?t=4", headers=GOOGLEBOT)
    assert stale.status_code == 200 and stale.headers["x-crawlergate"] == "stale" and "thread 3" in stale.text
    assert missing.status_code == 503 and missing.headers["x-crawlergate"] == "miss"


def test_engine_marked_pages_are_served_until_too_stale(running: Running) -> None:
    with running.client() as client:
        client.get("/showthread.php?t=5", headers=GOOGLEBOT)
        running.site.replies["5"] = 3
        assert running.gate.mark_changed("/showthread.php?t=5") == 1
        running.clock.now += 300
        kept = client.get("/showthread.php?t=5", headers=GOOGLEBOT)
        running.clock.now += 301
        renewed = client.get("/showthread.php?t=5", headers=GOOGLEBOT)
    assert kept.headers["x-crawlergate"] == "l1-hit" and "0 replies" in kept.text and int(kept.headers["age"]) == 300
    assert renewed.headers["x-crawlergate"] == "miss" and "3 replies" in renewed.text


def test_engine_invalidate_purge_and_write_rules_mark_pages(running: Running) -> None:
    bearer = {"authorization": f"Bearer {TOKEN}"}
    with running.client() as client:
        for thread in ("6", "7", "8", "60"):
            client.get(f"/showthread.php?t={thread}", headers=GOOGLEBOT)
        marked = client.post("/_crawlergate/invalidate", json={"urls": ["/showthread.php?t=6"]}, headers=bearer)
        purged = client.request("PURGE", "/showthread.php?t=7")
        reply = client.post("/newreply.php", data={"t": "8"}, headers={**FIREFOX, "cookie": "sessionid=4.abc"})
        client.cookies.clear()
        dirty = _dirty_once_marked(client, 3)
    assert marked.json() == {"marked": 1} and purged.json() == {"marked": 1}
    assert reply.status_code == 303 and reply.headers["x-crawlergate"] == "pass"
    assert dirty == 3  # t=6, t=7, t=8; never t=60


def test_engine_a_programs_anonymous_write_marks_nothing(running: Running) -> None:
    """A script's POST the site answers with 200 or 303 (a board answers a guest's post with "not allowed") is no
    lever on the regeneration budget; a person's, with or without a session, marks."""
    with running.client() as client:
        for thread in ("8", "9"):
            client.get(f"/showthread.php?t={thread}", headers=GOOGLEBOT)
        scripted = client.post(
            "/newreply.php", data={"t": "8"}, headers={"user-agent": "curl/8.5.0", **SCRIPTED["curl"]}
        )
        guest = client.post("/newreply.php", data={"t": "9"}, headers=FIREFOX)
        client.cookies.clear()
        dirty = _dirty_once_marked(client, 1)
    assert scripted.status_code == guest.status_code == 303
    assert dirty == 1  # t=9 only


def _dirty_once_marked(client: httpx.Client, at_least: int) -> int:
    """The gate's count of marked pages, once it reaches ``at_least`` or 2.5 s went by (write rules mark off the
    request path)."""
    dirty = client.get("/_crawlergate/stats").json()["dirty"]
    for _ in range(50):
        if dirty >= at_least:
            break
        threading.Event().wait(0.05)
        dirty = client.get("/_crawlergate/stats").json()["dirty"]
    return int(dirty)
