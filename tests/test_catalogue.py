"""The page catalogue and what it changes: marked pages are served until regenerated, invalidate, restarts."""

from __future__ import annotations

import io
import json
import multiprocessing
import socket
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

import crawlergate.gate.catalogue as dirty_module
from crawlergate.adapters.asgi import CrawlerGateMiddleware
from crawlergate.adapters.wsgi import CrawlerGateWSGI
from crawlergate.cli import main
from crawlergate.config import AdminSettings, CacheSettings, L2Settings, Settings
from crawlergate.demo.forum import create_forum
from crawlergate.demo.seed import seed_database
from crawlergate.errors import ConfigError
from crawlergate.gate.catalogue import PageCatalogue
from tests.conftest import CountedSteps, ServerThread
from tests.visitors import FIREFOX, GOOGLEBOT

pytestmark = pytest.mark.anyio

TOKEN = "s3cret-token"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class Forum:
    """A site whose thread pages change when a reply is posted."""

    def __init__(self) -> None:
        self.replies: dict[str, int] = {}
        self.fetches = 0

    def app(self) -> Starlette:
        async def thread(request: Request) -> HTMLResponse:
            self.fetches += 1
            number = request.query_params.get("t", "0")
            return HTMLResponse(f"<p>thread {number}, {self.replies.get(number, 0)} replies</p>")

        return Starlette(routes=[Route("/showthread.php", thread)])


@pytest.fixture
def index(tmp_path: Path) -> Iterator[PageCatalogue]:
    dirty = PageCatalogue(tmp_path / "dirty.sqlite3", refresh_s=0)
    dirty.start()
    yield dirty
    dirty.close()


def test_catalogue_marks_are_idempotent_and_patterns_read_queries_as_sets(index: PageCatalogue) -> None:
    # Stored URLs have their parameters sorted, as the cache keys make them.
    stored = ("/showthread.php?t=1", "/showthread.php?t=12", "/showthread.php?page=2&t=12", "/showthreadXphp")
    for target in (*stored, "/index.php?action=history&title=Moon", "/index.php?title=Moon"):
        index.record_stored(target, target)  # the digest is the target here
    assert index.mark(["/showthread.php?t=1", "/nowhere"], "api") == 1  # only pages the cache holds
    first = index.dirty_since("/showthread.php?t=1")
    assert first is not None
    assert index.mark(["/showthread.php?t=1"], "write-rule") == 1 and index.dirty_since("/showthread.php?t=1") == first
    # A query is a set of parameters, in any order; "&*" allows others; "?" and "." are themselves.
    assert sorted(index.matching("/showthread.php?t=12&*")) == ["/showthread.php?page=2&t=12", "/showthread.php?t=12"]
    assert index.matching("/showthread.php?t=12") == ["/showthread.php?t=12"]
    assert sorted(index.matching("/showthread.php?t=1*")) == ["/showthread.php?t=1", "/showthread.php?t=12"]
    assert sorted(index.matching("/index.php?title=Moon&*")) == [
        "/index.php?action=history&title=Moon",
        "/index.php?title=Moon",
    ]
    assert index.matching("/showthread?php*") == [] and len(index.matching("/showthread.php*")) == 3
    index.record_stored("/showthread.php?t=1", "/showthread.php?t=1")  # regenerated: clean again
    assert index.dirty_since("/showthread.php?t=1") is None and len(index.dirty_digests()) == 0


def test_catalogue_marks_survive_a_restart_and_reach_other_processes(tmp_path: Path) -> None:
    path = tmp_path / "dirty.sqlite3"
    worker_a, worker_b = PageCatalogue(path, refresh_s=0), PageCatalogue(path, refresh_s=0)
    worker_a.start()
    worker_b.start()
    worker_a.record_stored("d1", "/t/1")
    worker_a.record_stored("d2", "/t/2")
    assert worker_b.dirty_since("d1") is None
    worker_a.mark(["d1"], "api")
    worker_b.upkeep()  # what each worker runs every refresh_s, off its request path
    assert worker_b.dirty_since("d1") is not None  # the other worker sees it
    worker_b.record_stored("d1", "/t/1")
    worker_a.upkeep()
    assert worker_a.dirty_since("d1") is None  # and its regeneration is seen back
    worker_b.mark(["d2"], "purge")
    worker_a.close()
    worker_b.close()
    restarted = PageCatalogue(path)
    restarted.start()
    assert restarted.dirty_since("d2") is not None and restarted.dirty_since("d1") is None
    restarted.close()


def _start_catalogue(path: str) -> str:
    catalogue = PageCatalogue(Path(path))
    try:
        catalogue.start()
    except ConfigError as exc:
        return str(exc)
    catalogue.close()
    return ""


def test_catalogue_started_by_several_processes_at_once_opens_in_each(tmp_path: Path) -> None:
    # gunicorn's workers start together: one may find the new file busy while another creates it.
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        for attempt in range(8):
            path = str(tmp_path / f"{attempt}" / "dirty.sqlite3")
            assert pool.map(_start_catalogue, [path] * 4) == [""] * 4


def test_catalogue_index_in_an_unusable_folder_is_a_config_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="not usable"):
        PageCatalogue(blocker / "dirty.sqlite3").start()


def _gate(forum: Forum, tmp_path: Path, clock: Clock, **cache: float) -> CrawlerGateMiddleware:
    settings = Settings(
        l2=L2Settings(cache_dir=str(tmp_path / "l2")),
        cache=CacheSettings(**cache),  # type: ignore[arg-type]
        admin=AdminSettings(token=TOKEN),
    )
    return CrawlerGateMiddleware(forum.app(), settings=settings, clock=clock)


def _client(gate: CrawlerGateMiddleware) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=gate), base_url="http://forum.test")


async def test_catalogue_page_is_served_until_regenerated_then_filled_past_max_stale(tmp_path: Path) -> None:
    forum, clock = Forum(), Clock()
    gate = _gate(forum, tmp_path, clock, max_stale_seconds=3600)
    async with _client(gate) as client:
        first = await client.get("/showthread.php?t=7", headers=GOOGLEBOT)
        forum.replies["7"] = 1  # a person replied
        assert gate.mark_changed("/showthread.php?t=7") == 1
        clock.now += 600
        served = await client.get("/showthread.php?t=7", headers=GOOGLEBOT)
        assert served.headers["x-crawlergate"] == "l1-hit" and served.text == first.text  # the stored copy
        assert int(served.headers["age"]) >= 600 and forum.fetches == 1
        assert gate.stats()["dirty"] == 1
        clock.now += 3601  # staler than max_stale_seconds: the next crawler's request fills it
        fresh = await client.get("/showthread.php?t=7", headers=GOOGLEBOT)
        assert fresh.headers["x-crawlergate"] == "miss" and "1 replies" in fresh.text
        assert gate.stats()["dirty"] == 0
    gate.core.close()


async def test_catalogue_expired_page_is_served_within_max_stale(tmp_path: Path) -> None:
    forum, clock = Forum(), Clock()
    gate = _gate(forum, tmp_path, clock, ttl_seconds=60, max_stale_seconds=600)
    async with _client(gate) as client:
        await client.get("/showthread.php?t=1", headers=GOOGLEBOT)
        clock.now += 300  # past its lifetime, within max_stale: served, not refetched at peak
        assert (await client.get("/showthread.php?t=1", headers=GOOGLEBOT)).headers["x-crawlergate"] == "l1-hit"
        clock.now += 400
        assert (await client.get("/showthread.php?t=1", headers=GOOGLEBOT)).headers["x-crawlergate"] == "miss"
    assert forum.fetches == 2
    gate.core.close()


async def test_invalidate_needs_the_token_and_marks_urls_and_patterns(tmp_path: Path) -> None:
    forum, clock = Forum(), Clock()
    gate = _gate(forum, tmp_path, clock)
    bearer = {"authorization": f"Bearer {TOKEN}"}
    async with _client(gate) as client:
        for number in ("1", "12", "13", "2"):
            await client.get(f"/showthread.php?t={number}", headers=GOOGLEBOT)
        body = {"urls": ["https://forum.example.org/showthread.php?t=2"], "patterns": ["/showthread.php?t=1*"]}
        refused = await client.post("/_crawlergate/invalidate", json=body)
        wrong = await client.post("/_crawlergate/invalidate", json=body, headers={"authorization": "Bearer nope"})
        assert refused.status_code == wrong.status_code == 401
        assert refused.headers["www-authenticate"] == "Bearer" and gate.stats()["dirty"] == 0
        marked = await client.post("/_crawlergate/invalidate", json=body, headers=bearer)
        assert marked.status_code == 200 and marked.json() == {"marked": 4}
        again = await client.post("/_crawlergate/invalidate", json={"urls": ["/showthread.php?t=2"]}, headers=bearer)
        assert again.json() == {"marked": 1}  # idempotent: still one page
        bad = await client.post("/_crawlergate/invalidate", content=b"{not json", headers=bearer)
        wrong_shape = await client.post("/_crawlergate/invalidate", json={"urls": "/t/1"}, headers=bearer)
        get = await client.get("/_crawlergate/invalidate", headers=bearer)
        assert (bad.status_code, wrong_shape.status_code, get.status_code) == (400, 400, 405)
    assert gate.stats()["dirty"] == 4
    gate.core.close()


async def test_invalidate_without_a_configured_token_is_refused_even_from_loopback(tmp_path: Path) -> None:
    settings = Settings(l2=L2Settings(cache_dir=str(tmp_path / "l2")))
    gate = CrawlerGateMiddleware(Forum().app(), settings=settings)
    transport = httpx.ASGITransport(app=gate, client=("127.0.0.1", 5000))
    async with httpx.AsyncClient(transport=transport, base_url="http://forum.test") as client:
        answer = await client.post("/_crawlergate/invalidate", json={"urls": ["/t/1"]})
    assert answer.status_code == 403 and "admin.token" in answer.json()["error"]
    gate.core.close()


def test_invalidate_through_the_wsgi_gate_and_marks_seen_after_a_restart(tmp_path: Path) -> None:
    def site(environ, start_response):  # type: ignore[no-untyped-def]
        start_response("200 OK", [("Content-Type", "text/html")])
        return [b"<p>page</p>"]

    settings = Settings(l2=L2Settings(cache_dir=str(tmp_path / "l2")), admin=AdminSettings(token=TOKEN))
    gate = CrawlerGateWSGI(site, settings=settings)
    with httpx.Client(transport=httpx.WSGITransport(app=gate), base_url="http://forum.test") as client:
        client.get("/t/1", headers=GOOGLEBOT)
        answer = client.post(
            "/_crawlergate/invalidate",
            content=json.dumps({"patterns": ["/t/*"]}),
            headers={"authorization": f"Bearer {TOKEN}", "content-type": "application/json"},
        )
    assert answer.json() == {"marked": 1}
    gate.close()
    restarted = CrawlerGateWSGI(site, settings=settings)
    restarted.start()
    assert restarted.stats()["dirty"] == 1
    restarted.close()


def test_invalidate_command_marks_pages_on_a_running_gate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(l2=L2Settings(cache_dir=str(tmp_path / "l2")), admin=AdminSettings(token=TOKEN))
    gate = CrawlerGateMiddleware(Forum().app(), settings=settings)
    server = ServerThread(gate).start()
    try:
        httpx.get(f"{server.url}/showthread.php?t=3", headers=GOOGLEBOT)
        monkeypatch.delenv("CRAWLERGATE_ADMIN_TOKEN", raising=False)
        assert main(["invalidate", "/showthread.php?t=3", "--url", server.url]) != 0
        assert "admin token" in capsys.readouterr().err
        argv = ["invalidate", "/showthread.php?t=3", "--pattern", "/showthread.php*", "--url", server.url]
        assert main([*argv, "--token", TOKEN]) == 0
        assert "marked 1 page(s) changed" in capsys.readouterr().out
        assert main([*argv, "--token", "wrong"]) != 0 and "401" in capsys.readouterr().err
    finally:
        server.stop()


async def test_write_rule_a_reply_marks_its_thread_and_crawlers_keep_the_stored_copy(tmp_path: Path) -> None:
    db = tmp_path / "forum.sqlite3"
    seed_database(db, threads=50, seed=3)
    forum = create_forum(db, threads=50, seed=3, work_ms=0.1, rounds_per_ms=100)
    clock = Clock()
    settings = Settings(l2=L2Settings(cache_dir=str(tmp_path / "l2")), cache=CacheSettings(sites=("demo-forum",)))
    gate = CrawlerGateMiddleware(forum, settings=settings, clock=clock)
    async with _client(gate) as crawler, _client(gate) as person:
        stored = await crawler.get("/showthread.php?t=5", headers=GOOGLEBOT)
        other = await crawler.get("/showthread.php?t=50", headers=GOOGLEBOT)  # t=5* would wrongly take it
        await crawler.get("/", headers=GOOGLEBOT)
        await crawler.get("/showthread.php?t=5&page=2", headers=GOOGLEBOT)  # stored as ?page=2&t=5
        await person.post("/login", data={"member": "4"})
        reply = await person.post("/newreply.php", data={"t": "5"})
        assert reply.status_code == 303 and reply.headers["x-crawlergate"] == "pass"
        await gate.drain()  # the marks are written off the request path
        assert gate.stats()["dirty"] == 3  # both pages of the thread and the front page (no listing was stored)
        clock.now += 120
        again = await crawler.get("/showthread.php?t=5", headers=GOOGLEBOT)
        assert again.headers["x-crawlergate"] == "l1-hit" and again.text == stored.text
        clock.now += 60
        later = await crawler.get("/showthread.php?t=5", headers=GOOGLEBOT)
        assert int(again.headers["age"]) >= 120 and int(later.headers["age"]) == int(again.headers["age"]) + 60
        assert gate.core.catalogue.dirty_since(gate.core.keys.key_for_url("/showthread.php?t=50").digest) is None  # type: ignore[union-attr]
        refused = await crawler.post("/newreply.php", data={"t": "7"})  # a guest's reply fails: nothing marked
        await gate.drain()
        assert refused.status_code == 403 and gate.stats()["dirty"] == 3
    assert other.status_code == 200
    gate.core.close()


def _exchange_raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        raw.sendall(request)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = raw.recv(65536)
            if not chunk:
                break
            answer += chunk
        return answer


def test_purge_requests_as_mediawiki_and_wordpress_send_them(tmp_path: Path) -> None:
    async def page(request: Request) -> HTMLResponse:
        return HTMLResponse(f"<p>{request.url.path}</p>")

    site = Starlette(routes=[Route("/{path:path}", page)])
    settings = Settings(l2=L2Settings(cache_dir=str(tmp_path / "l2")))
    gate = CrawlerGateMiddleware(site, settings=settings)
    server = ServerThread(gate).start()
    try:
        for path in ("/wiki/Main_Page", "/wiki/Other", "/2026/11/hello-world/", "/2026/11/second/", "/about/"):
            httpx.get(server.url + path, headers=GOOGLEBOT)
        # MediaWiki's SquidPurgeClient: HTTP/1.0, the absolute URL as the request target.
        mediawiki = _exchange_raw(
            server.port,
            b"PURGE http://wiki.example.org/wiki/Main_Page HTTP/1.0\r\nConnection: Keep-Alive\r\n"
            b"Proxy-Connection: Keep-Alive\r\nUser-Agent: MediaWiki/1.39.6 SquidPurgeClient\r\n"
            b"Host: wiki.example.org\r\n\r\n",
        )
        assert mediawiki.startswith(b"HTTP/1.1 200 ") and mediawiki.endswith(b'{"marked": 1}')
        # WordPress Proxy Cache Purge: one URL (X-Purge-Method: default), or a regex of them.
        one = httpx.request("PURGE", server.url + "/about/", headers={"X-Purge-Method": "default"})
        month = httpx.request("PURGE", server.url + "/2026/11/.*", headers={"X-Purge-Method": "regex"})
        assert one.json() == {"marked": 1} and month.json() == {"marked": 2}
        bad = httpx.request("PURGE", server.url + "/(", headers={"X-Purge-Method": "regex"})
        assert bad.status_code == 400
        assert gate.stats()["dirty"] == 4
    finally:
        server.stop()
        gate.core.close()


async def test_purge_from_an_untrusted_address_is_refused(tmp_path: Path) -> None:
    forum = Forum()
    gate = CrawlerGateMiddleware(forum.app(), settings=Settings(l2=L2Settings(cache_dir=str(tmp_path / "l2"))))
    async with _client(gate) as client:
        await client.get("/showthread.php?t=1", headers=GOOGLEBOT)
    transport = httpx.ASGITransport(app=gate, client=("203.0.113.9", 4000))
    async with httpx.AsyncClient(transport=transport, base_url="http://forum.test") as outsider:
        refused = await outsider.request("PURGE", "/showthread.php?t=1")
    assert refused.status_code == 403 and gate.stats()["dirty"] == 0 and forum.fetches == 1
    gate.core.close()


def test_catalogue_damaged_index_is_moved_aside_and_the_gate_starts(tmp_path: Path) -> None:
    (tmp_path / "l2").mkdir()
    (tmp_path / "l2" / "dirty.sqlite3").write_bytes(bytes(range(256)) * 64)
    gate = CrawlerGateWSGI(lambda environ, start: [], settings=Settings(l2=L2Settings(cache_dir=str(tmp_path / "l2"))))
    gate.start()
    assert gate.stats()["dirty"] == 0
    assert [path.name.startswith("dirty.sqlite3.damaged-") for path in (tmp_path / "l2").iterdir()].count(True) == 1
    gate.close()


def _invalidate(client: httpx.Client, pattern: str) -> int:
    answer = client.post(
        "/_crawlergate/invalidate",
        content=json.dumps({"patterns": [pattern]}),
        headers={"authorization": f"Bearer {TOKEN}", "content-type": "application/json"},
    )
    return int(answer.json()["marked"])


@pytest.mark.parametrize("loss", ["damaged", "removed"])
def test_a_catalogue_begun_anew_is_told_the_pages_l2_holds(tmp_path: Path, loss: str) -> None:
    fetches: list[str] = []

    def site(environ, start_response):  # type: ignore[no-untyped-def]
        fetches.append(environ["PATH_INFO"])
        start_response("200 OK", [("Content-Type", "text/html")])
        return [f"<p>page {environ['PATH_INFO']}</p>".encode()]

    folder = tmp_path / "l2"
    settings = Settings(l2=L2Settings(cache_dir=str(folder)), admin=AdminSettings(token=TOKEN))
    gate = CrawlerGateWSGI(site, settings=settings)
    with httpx.Client(transport=httpx.WSGITransport(app=gate), base_url="http://forum.test") as client:
        for number in range(5):
            assert client.get(f"/t/{number}", headers=GOOGLEBOT).status_code == 200
    gate.close()
    assert gate.core.relearning is not None and gate.core.relearning.learned == 0  # a new folder: nothing to tell
    for suffix in ("", "-wal", "-shm"):
        (folder / f"dirty.sqlite3{suffix}").unlink(missing_ok=True)
    if loss == "damaged":
        (folder / "dirty.sqlite3").write_bytes(bytes(range(256)) * 64)
    restarted = CrawlerGateWSGI(site, settings=settings)
    restarted.start()
    relearning = restarted.core.relearning
    assert relearning is not None and relearning.done.wait(10)
    assert (relearning.learned, relearning.unknown) == (5, 0)
    with httpx.Client(transport=httpx.WSGITransport(app=restarted), base_url="http://forum.test") as client:
        assert _invalidate(client, "/t/*") == 5  # unknown to the new catalogue without the pass: 0
        assert client.get("/t/3", headers=GOOGLEBOT).headers["x-crawlergate"].startswith("l2-hit")
    assert fetches == [f"/t/{number}" for number in range(5)]  # marked pages are served until regenerated
    restarted.close()
    again = CrawlerGateWSGI(site, settings=settings)
    again.start()
    assert again.core.relearning is None and again.stats()["dirty"] == 5  # told once
    again.close()


def test_pages_stored_without_their_target_are_counted_not_told(tmp_path: Path) -> None:
    from crawlergate.gate.relearn import Relearning
    from crawlergate.page import Page
    from crawlergate.stores.disk import DiskStore

    store = DiskStore(tmp_path / "l2", max_bytes=10**8)
    store.start()
    page = Page(200, b"\x1f\x8b", "text/html", 'W/"x"', 1.0, 1.0, 2.0)
    store.set(f"{1:032x}", page.to_bytes("/t/1"))
    store.set(f"{2:032x}", page.to_bytes())  # an older version's page: no target kept
    store.set(f"{3:032x}", b"not a page")
    catalogue = PageCatalogue(tmp_path / "l2" / "dirty.sqlite3")
    catalogue.start()
    assert not catalogue.knows_stored_pages()
    relearning = Relearning(store, catalogue)
    relearning.start()
    assert relearning.done.wait(10)
    assert (relearning.learned, relearning.unknown) == (1, 2)
    assert catalogue.matching("/t/*") == [f"{1:032x}"] and catalogue.knows_stored_pages()
    relearning.close()
    catalogue.close()
    store.close()


def test_an_older_versions_catalogue_knows_its_pages_without_a_pass(tmp_path: Path) -> None:
    path = tmp_path / "dirty.sqlite3"
    database = sqlite3.connect(path)
    database.execute(  # crawlergate 0.x's, before regeneration
        "CREATE TABLE pages (digest TEXT PRIMARY KEY, target TEXT NOT NULL, stored_at REAL NOT NULL, "
        "dirty_since REAL, reason TEXT, demand REAL NOT NULL DEFAULT 0, demand_at REAL, regenerated_at REAL, "
        "seq INTEGER NOT NULL DEFAULT 0)"
    )
    database.execute("INSERT INTO pages (digest, target, stored_at) VALUES ('d1', '/t/1', 1.0)")
    database.commit()
    database.close()
    catalogue = PageCatalogue(path)
    catalogue.start()
    assert catalogue.knows_stored_pages() and catalogue.matching("/t/*") == ["d1"]
    catalogue.close()


def test_rows_of_pages_gone_from_l2_go_too_but_a_marked_one_stays(tmp_path: Path) -> None:
    from crawlergate.config import MIN_L2_BYTES

    def site(environ, start_response):  # type: ignore[no-untyped-def]
        start_response("404 Not Found", [("Content-Type", "text/html")])  # an attacker's URLs: stored 404s
        return [b"<p>no such page</p>"]

    folder = tmp_path / "l2"
    settings = Settings(l2=L2Settings(cache_dir=str(folder), max_bytes=MIN_L2_BYTES), admin=AdminSettings(token=TOKEN))
    gate = CrawlerGateWSGI(site, settings=settings)
    with httpx.Client(transport=httpx.WSGITransport(app=gate), base_url="http://forum.test") as client:
        client.get("/junk/0", headers=GOOGLEBOT)
        gate.filler.writer.flush()
        assert _invalidate(client, "/junk/0") == 1
        for number in range(1, 300):
            client.get(f"/junk/{number}", headers=GOOGLEBOT)
    gate.filler.writer.flush()
    stored = len(gate.core.cache.l2)
    gate.core.catalogue.flush_gone()
    database = sqlite3.connect(folder / "dirty.sqlite3")
    targets = {target for (target,) in database.execute("SELECT target FROM pages")}
    database.close()
    assert stored < 100 and len(targets) <= stored + 1  # 300 stored, the cap's pages kept
    assert "/junk/0" in targets and "/junk/299" in targets  # marked: kept for the fill that follows its mark
    gate.close()


def catalogue_steps(folder: Path, pages: int) -> list[int]:
    """The SQLite steps of the catalogue's work on ``pages`` pages: stored, asked for by crawlers and the demand
    written, marked, and what changed read back."""
    catalogue = PageCatalogue(folder / f"dirty-{pages}.sqlite3", refresh_s=0, clock=lambda: 1000.0)
    catalogue.start()
    counted = CountedSteps(catalogue._connection)  # type: ignore[arg-type]
    catalogue._connection = counted  # type: ignore[assignment]
    digests = [f"{number:032x}" for number in range(pages)]

    def write_demand() -> None:
        for digest in [*digests, "never-stored"]:
            catalogue.count_demand(digest)
        catalogue.flush_demand()

    steps = []
    for work in (
        lambda: catalogue.record_stored_many([(digest, f"/t/{digest}", None) for digest in digests]),
        write_demand,
        lambda: catalogue.mark(digests[:-1], "test"),
        lambda: catalogue.refresh(),
    ):
        before = counted.steps
        work()
        steps.append(counted.steps - before)
    assert catalogue.demand(digests[0]) == 1.0
    assert len(catalogue.dirty_digests()) == pages - 1
    catalogue._connection = counted.connection
    catalogue.close()
    return steps


def test_catalogue_work_on_2000_pages_takes_as_many_steps_as_on_3(tmp_path: Path) -> None:
    """Written a row at a time, the demand of 10,000 pages held the catalogue for 3.4 s under a storm of crawler
    hits, and PURGE, marks and stored pages waited (each row waited for the GIL again)."""
    assert catalogue_steps(tmp_path, 2000) == catalogue_steps(tmp_path, 3)


def test_catalogue_times_come_back_as_the_very_doubles(tmp_path: Path) -> None:
    """SQLite writes a real number into JSON with 15 digits: a mark's time would come back 10 µs off, and a page
    the file calls marked would be unmarked in memory."""
    marked_at = 1795788768.6990945
    catalogue = PageCatalogue(tmp_path / "dirty.sqlite3", refresh_s=0, clock=lambda: marked_at)
    catalogue.start()
    catalogue.record_stored_many([("d", "/t/1", None), ("e", "/t/2", None)])
    catalogue.mark(["d", "e"], "edit")
    assert catalogue.dirty_since("d") == marked_at
    catalogue.clear("d", marked_at - 2e-6)  # fetched just before the mark: the mark stays
    assert catalogue.dirty_since("d") == marked_at and catalogue.marked_now("d")
    catalogue.record_stored_many([("e", "/t/2", marked_at - 2e-6)])
    assert catalogue.dirty_since("e") == marked_at
    catalogue.count_demand("d")
    catalogue.flush_demand()
    other = PageCatalogue(tmp_path / "dirty.sqlite3", refresh_s=0)
    other.start()
    assert other.dirty_digests() == ["d", "e"] and other.dirty_since("e") == marked_at
    other.close()
    catalogue.close()


def test_catalogue_reads_many_rows_a_page_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dirty_module, "_PAGE_ROWS", 7)
    catalogue = PageCatalogue(tmp_path / "dirty.sqlite3", refresh_s=0)
    catalogue.start()
    digests = [f"{number:032x}" for number in range(30)]
    catalogue.record_stored_many([(digest, f"/t/{digest}", None) for digest in digests])
    assert catalogue.mark(digests, "edit") == 30
    assert sorted(catalogue.matching("/t/*")) == digests
    other = PageCatalogue(tmp_path / "dirty.sqlite3", refresh_s=0)
    other.start()
    assert sorted(other.dirty_digests()) == digests
    catalogue.record_stored_many([(digest, f"/t/{digest}", None) for digest in digests[:14]])
    other.refresh()
    assert sorted(other.dirty_digests()) == digests[14:]
    other.close()
    catalogue.close()


def test_catalogue_a_mark_during_a_fill_survives_the_store(index: PageCatalogue) -> None:
    index.record_stored("d", "/t/1")
    fill_began = index.clock()
    index.mark(["d"], "purge")  # an edit's PURGE arrives while the page is being fetched
    index.record_stored("d", "/t/1", fetched_at=fill_began - 1)
    assert index.dirty_since("d") is not None
    index.record_stored("d", "/t/1", fetched_at=index.clock() + 1)  # a fill that began after the mark
    assert index.dirty_since("d") is None


def test_catalogue_a_busy_index_never_fails_a_fill_nor_waits_on_the_request_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "dirty.sqlite3"
    monkeypatch.setattr(dirty_module, "WAIT_S", 0.2)
    index = PageCatalogue(path, refresh_s=0)
    index.start()
    index.record_stored("d", "/t/1")
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        started = time.monotonic()
        index.record_stored("e", "/t/2")  # logged, not raised
        assert index.dirty_since("d") is None and time.monotonic() - started < 2
        with pytest.raises(dirty_module.IndexUnavailable):
            index.mark(["d"], "api")
    finally:
        other.execute("ROLLBACK")
        other.close()
        index.close()


async def test_invalidate_refuses_bodies_it_cannot_use_with_400(tmp_path: Path) -> None:
    gate = _gate(Forum(), tmp_path, Clock())
    bearer = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
    async with _client(gate) as client:
        surrogate = await client.post("/_crawlergate/invalidate", content=b'{"urls": ["/\\ud800"]}', headers=bearer)
        deep = await client.post("/_crawlergate/invalidate", content=b"[" * 100_000, headers=bearer)
        many = await client.post("/_crawlergate/invalidate", json={"patterns": ["*"] * 1001}, headers=bearer)
    assert (surrogate.status_code, deep.status_code, many.status_code) == (400, 400, 400)
    gate.core.close()


def test_purge_of_a_raw_utf8_target_marks_its_page(tmp_path: Path) -> None:
    def site(environ, start_response):  # type: ignore[no-untyped-def]
        start_response("200 OK", [("Content-Type", "text/html")])
        return [b"<p>page</p>"]

    def environ(method: str, target: bytes, **extra: str) -> dict[str, object]:
        # As gunicorn hands a request over: the target's raw bytes, decoded as latin-1 (PEP 3333).
        text = target.decode("latin-1")
        return {"REQUEST_METHOD": method, "PATH_INFO": text, "RAW_URI": text, "QUERY_STRING": "",
                "REMOTE_ADDR": "127.0.0.1", "wsgi.input": io.BytesIO(), "wsgi.url_scheme": "http",
                "SERVER_NAME": "forum.test", "SERVER_PORT": "80", **extra}  # fmt: skip

    gate = CrawlerGateWSGI(site, settings=Settings(l2=L2Settings(cache_dir=str(tmp_path / "l2"))))
    crawler = environ("GET", b"/wiki/Caf%C3%A9", HTTP_USER_AGENT=GOOGLEBOT["user-agent"])
    assert b"".join(gate(crawler, lambda status, headers: None)) == b"<p>page</p>"
    purge = environ("PURGE", "/wiki/Café".encode())  # raw UTF-8 bytes in the target
    assert b"".join(gate(purge, lambda status, headers: None)) == b'{"marked": 1}'
    gate.close()


async def test_catalogue_crawler_demand_is_counted_off_the_request_path_and_decays(tmp_path: Path) -> None:
    forum, clock = Forum(), Clock()
    gate = _gate(forum, tmp_path, clock)
    async with _client(gate) as client:
        for target in ("/showthread.php?t=1",) * 3 + ("/showthread.php?t=2",):
            await client.get(target, headers=GOOGLEBOT)
        await client.get("/showthread.php?t=1", headers=FIREFOX)  # people are not crawler demand
        clock.now += 31  # the next crawler request finds the counts due, and writes them in the background
        await client.get("/showthread.php?t=2", headers=GOOGLEBOT)
        await gate.drain()
    dirty = gate.core.catalogue
    one, two = (gate.core.keys.key_for_url(f"/showthread.php?t={n}") for n in (1, 2))
    assert one is not None and two is not None
    assert (dirty.demand(one.digest), dirty.demand(two.digest)) == (3.0, 2.0)
    clock.now += 86400
    assert dirty.demand(one.digest) == pytest.approx(1.5)  # halved after a day
    gate.core.close()


def test_catalogue_index_write_ahead_log_stays_bounded(index: PageCatalogue) -> None:
    from crawlergate.gate.catalogue import WAL_MAX_BYTES

    largest = 0
    for batch in range(40):  # 20,000 pages stored and marked, as a crawl of new pages and a wave of edits
        for number in range(500):
            index.record_stored(f"{batch:04d}{number:028d}", f"/t/{batch}/{number}", fetched_at=1.0)
        index.mark([f"{batch:04d}{number:028d}" for number in range(0, 500, 3)], "api")
        wal = index.path.with_name(index.path.name + "-wal")
        largest = max(largest, wal.stat().st_size if wal.exists() else 0)
    assert largest <= WAL_MAX_BYTES * 1.5, largest  # SQLite's own default left 4 MB behind
