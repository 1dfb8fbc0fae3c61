"""The ASGI middleware in front of a site: crawlers served from L1 and L2 (gzip, 304, HEAD), people passed through
and streamed, guest fills sanitised, one origin request for fifty misses, and stale pages when the origin is down."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import shutil
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from crawlergate.adapters.asgi import CrawlerGateMiddleware
from crawlergate.cache import TwoLevelCache
from crawlergate.config import (
    CacheSettings,
    FrontSettings,
    L1Settings,
    L2Settings,
    LogSettings,
    ServerSettings,
    Settings,
)
from crawlergate.errors import ConfigError
from crawlergate.gate.relearn import LOCK_FILE as RELEARN_LOCK_FILE
from crawlergate.metrics import Metrics
from crawlergate.stores.disk import INDEX_FILE, LOADER_LOCK_FILE, DiskStore
from crawlergate.stores.memcached import MemcachedStore
from crawlergate.stores.owner import MARKER_FILE, FolderOwner, claim_folder
from tests.conftest import MemcachedServer, ServerThread
from tests.visitors import FIREFOX, GOOGLEBOT

pytestmark = pytest.mark.anyio

PAGE = "<html><body>" + "a forum thread " * 1200 + "</body></html>"


class Site:
    """A small dynamic site that records what reached it."""

    def __init__(self) -> None:
        self.seen: list[Request] = []
        self.down = False
        self.delay_s = 0.0

    def app(self) -> Starlette:
        async def thread(request: Request) -> Response:
            self.seen.append(request)
            if self.down:
                return PlainTextResponse("database is down", status_code=503)
            await asyncio.sleep(self.delay_s)
            return HTMLResponse(
                PAGE + request.path_params["number"], headers={"last-modified": "Mon, 01 Jan 2024 00:00:00 GMT"}
            )

        async def personal(request: Request) -> Response:
            self.seen.append(request)
            response = HTMLResponse("<p>hello</p>")
            response.set_cookie("session", "guest-session")
            return response

        async def private(request: Request) -> Response:
            self.seen.append(request)
            return HTMLResponse("<p>mine</p>", headers={"cache-control": "private"})

        async def moved(request: Request) -> Response:
            self.seen.append(request)
            return RedirectResponse("/t/1", status_code=301)

        async def stream(request: Request) -> Response:
            async def chunks() -> AsyncIterator[bytes]:
                for _ in range(3):
                    yield b"chunk "

            return StreamingResponse(chunks(), media_type="text/plain")

        async def post(request: Request) -> Response:
            self.seen.append(request)
            return PlainTextResponse("posted")

        return Starlette(
            routes=[
                Route("/t/{number}", thread),
                Route("/personal", personal),
                Route("/members-only", private),
                Route("/old", moved),
                Route("/stream", stream),
                Route("/reply", post, methods=["POST"]),
            ]
        )


@pytest.fixture
def site() -> Site:
    return Site()


@pytest.fixture(params=["memory", pytest.param("memcached", marks=pytest.mark.memcached)])
def l1(request: pytest.FixtureRequest) -> Iterator[L1Settings]:
    """Every gate test runs on both L1 backends: the embedded LRU and a real memcached."""
    if request.param == "memory":
        yield L1Settings()
        return
    server = MemcachedServer()
    server.start()
    yield L1Settings(memcached=(server.address,))
    server.stop()


@pytest.fixture
def make_gate(site: Site, tmp_path: Path, l1: L1Settings) -> Iterator[Callable[..., CrawlerGateMiddleware]]:
    gates: list[CrawlerGateMiddleware] = []

    def make(**sections: Any) -> CrawlerGateMiddleware:
        sections.setdefault("l1", l1)
        settings = Settings(l2=L2Settings(cache_dir=str(tmp_path / "l2")), **sections)
        gates.append(CrawlerGateMiddleware(site.app(), settings=settings))
        return gates[-1]

    yield make
    for gate in gates:
        gate.cache.close()


def _client(gate: CrawlerGateMiddleware) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=gate), base_url="http://forum.test")


async def test_middleware_crawler_miss_then_l1_hit(make_gate: Callable[..., CrawlerGateMiddleware], site: Site) -> None:
    gate = make_gate()
    async with _client(gate) as client:
        first = await client.get("/t/1", headers=GOOGLEBOT)
        second = await client.get("/t/1", headers=GOOGLEBOT)
    assert (first.headers["x-crawlergate"], second.headers["x-crawlergate"]) == ("miss", "l1-hit")
    assert second.text == PAGE + "1"
    assert second.headers["content-encoding"] == "gzip"
    assert second.headers["vary"] == "Accept-Encoding"
    assert second.headers["etag"] == first.headers["etag"]
    assert second.headers["last-modified"] == "Mon, 01 Jan 2024 00:00:00 GMT"
    assert len(site.seen) == 1


async def test_middleware_l2_hit_is_promoted_to_l1(make_gate: Callable[..., CrawlerGateMiddleware]) -> None:
    gate = make_gate()
    async with _client(gate) as client:
        await client.get("/t/1", headers=GOOGLEBOT)
        gate.filler.writer.flush()  # the filled page on disk
        gate.cache.l1.delete(gate.core.keys.key_for(b"/t/1").digest)  # type: ignore[union-attr]
        outcomes = [(await client.get("/t/1", headers=GOOGLEBOT)).headers["x-crawlergate"] for _ in range(2)]
    assert outcomes == ["l2-hit", "l1-hit"]


async def test_middleware_identity_client_gets_decompressed_body(
    make_gate: Callable[..., CrawlerGateMiddleware],
) -> None:
    gate = make_gate()
    async with _client(gate) as client:
        await client.get("/t/1", headers=GOOGLEBOT)
        response = await client.get("/t/1", headers={**GOOGLEBOT, "accept-encoding": "identity"})
        refused = await client.get("/t/1", headers={**GOOGLEBOT, "accept-encoding": "gzip;q=0, br"})
    assert "content-encoding" not in response.headers
    assert response.content == (PAGE + "1").encode()
    assert int(response.headers["content-length"]) == len(PAGE + "1")
    assert "content-encoding" not in refused.headers


async def test_middleware_gzip_bytes_are_served_as_stored(make_gate: Callable[..., CrawlerGateMiddleware]) -> None:
    gate = make_gate()
    async with _client(gate) as client:
        await client.get("/t/1", headers=GOOGLEBOT)
        async with client.stream("GET", "/t/1", headers=GOOGLEBOT) as response:
            raw = b"".join([chunk async for chunk in response.aiter_raw()])
    assert gzip.decompress(raw) == (PAGE + "1").encode()
    assert int(response.headers["content-length"]) == len(raw)


@pytest.mark.parametrize(
    ("header", "value"),
    [
        pytest.param("if-none-match", None, id="etag"),
        pytest.param("if-none-match", "*", id="star"),
        pytest.param("if-modified-since", "Mon, 01 Jan 2024 00:00:00 GMT", id="modified-since"),
    ],
)
async def test_middleware_conditional_get_gives_304(
    make_gate: Callable[..., CrawlerGateMiddleware], header: str, value: str | None
) -> None:
    gate = make_gate()
    async with _client(gate) as client:
        first = await client.get("/t/1", headers=GOOGLEBOT)
        response = await client.get("/t/1", headers={**GOOGLEBOT, header: value or first.headers["etag"]})
        changed = await client.get("/t/1", headers={**GOOGLEBOT, "if-none-match": 'W/"other"'})
    assert response.status_code == 304 and response.content == b""
    assert response.headers["x-crawlergate"] == "l1-hit"
    assert changed.status_code == 200


async def test_middleware_head_has_no_body(make_gate: Callable[..., CrawlerGateMiddleware]) -> None:
    gate = make_gate()
    async with _client(gate) as client:
        miss = await client.head("/t/1", headers=GOOGLEBOT)
        hit = await client.head("/t/1", headers=GOOGLEBOT)
    assert (miss.headers["x-crawlergate"], hit.headers["x-crawlergate"]) == ("miss", "l1-hit")
    assert hit.content == b"" and int(hit.headers["content-length"]) > 0


async def test_middleware_passes_humans_through_and_streams(make_gate: Callable[..., CrawlerGateMiddleware]) -> None:
    gate = make_gate()
    async with _client(gate) as client:
        page = await client.get("/t/1", headers=FIREFOX)
        stream = await client.get("/stream", headers=FIREFOX)
    assert page.headers["x-crawlergate"] == "pass" and page.text == PAGE + "1"
    assert stream.text == "chunk chunk chunk " and stream.headers["x-crawlergate"] == "pass"
    assert gate.stats()["human"]["passes"] == 2


@pytest.mark.parametrize(
    ("method", "path", "headers"),
    [
        pytest.param("POST", "/reply", GOOGLEBOT, id="unsafe-method"),
        pytest.param("GET", "/t/1", {**GOOGLEBOT, "cookie": "sessionid=alice"}, id="session-cookie"),
        pytest.param("GET", "/t/1", {**GOOGLEBOT, "authorization": "Basic YTpi"}, id="authorization"),
        pytest.param("GET", "/login", GOOGLEBOT, id="excluded-path"),
    ],
)
async def test_middleware_passes_what_is_not_for_the_cache(
    make_gate: Callable[..., CrawlerGateMiddleware],
    method: str,
    path: str,
    headers: dict[str, str],
) -> None:
    gate = make_gate()
    async with _client(gate) as client:
        response = await client.request(method, path, headers=headers)
    assert response.headers["x-crawlergate"] == "pass"
    assert len(gate.cache.l2) == 0


async def test_middleware_guest_fill_is_sanitised(make_gate: Callable[..., CrawlerGateMiddleware], site: Site) -> None:
    gate = make_gate()
    headers = {**GOOGLEBOT, "x-forwarded-host": "evil.test", "x-forwarded-for": "6.6.6.6", "host": "evil.test"}
    async with _client(gate) as client:
        await client.get("/t/1?utm_source=poison&fbclid=1", headers=headers)
        gate.filler.writer.flush()  # the filled page on disk
    fill = site.seen[0]
    assert "cookie" not in fill.headers and "authorization" not in fill.headers
    # No public_url: the address the request arrived at, never the client's Host or X-Forwarded-Host.
    assert fill.headers["host"] == fill.headers["x-forwarded-host"] == "forum.test"
    # The test client is loopback, a trusted proxy: the visitor it forwards for is the fill's client.
    assert fill.headers["x-forwarded-for"] == "6.6.6.6" and fill.client is not None and fill.client.host == "6.6.6.6"
    assert fill.headers["accept-encoding"] == "gzip"
    assert str(fill.url.query) == ""
    assert gate.core.keys.key_for(b"/t/1").digest in gate.cache.l2.digests()  # type: ignore[union-attr]


@pytest.mark.parametrize("path", ["/personal", "/members-only"])
async def test_middleware_guest_answers_are_stored_without_their_cookies(
    make_gate: Callable[..., CrawlerGateMiddleware], path: str
) -> None:
    gate = make_gate()
    async with _client(gate) as client:
        miss = await client.get(path, headers=GOOGLEBOT)
        client.cookies.clear()  # a crawler does not keep the guest session cookie
        hit = await client.get(path, headers=GOOGLEBOT)
    assert (miss.headers["x-crawlergate"], hit.headers["x-crawlergate"]) == ("miss", "l1-hit")
    assert "set-cookie" not in miss.headers and "set-cookie" not in hit.headers
    assert "cache-control" not in hit.headers


@pytest.mark.parametrize(
    ("path", "reason"), [("/personal", "set-cookie-strict"), ("/members-only", "cache-control-strict")]
)
async def test_middleware_strict_mode_stores_no_private_answer(
    make_gate: Callable[..., CrawlerGateMiddleware], path: str, reason: str
) -> None:
    gate = make_gate(cache=CacheSettings(storage_mode="rfc9111"))
    outcomes = []
    async with _client(gate) as client:
        for _ in range(2):
            outcomes.append((await client.get(path, headers=GOOGLEBOT)).headers["x-crawlergate"])
            client.cookies.clear()
    assert outcomes == ["miss", "miss"]
    assert len(gate.cache.l2) == 0
    assert gate.stats()["not_stored"] == {reason: 2}


async def test_middleware_redirect_is_stored_with_its_location(make_gate: Callable[..., CrawlerGateMiddleware]) -> None:
    gate = make_gate()
    async with _client(gate) as client:
        await client.get("/old", headers=GOOGLEBOT)
        response = await client.get("/old", headers=GOOGLEBOT)
    assert response.status_code == 301 and response.headers["location"] == "/t/1"
    assert response.headers["x-crawlergate"] == "l1-hit"


async def test_middleware_fifty_concurrent_misses_make_one_origin_request(
    make_gate: Callable[..., CrawlerGateMiddleware], site: Site
) -> None:
    site.delay_s = 0.05
    gate = make_gate()
    async with _client(gate) as client:
        responses = await asyncio.gather(*(client.get("/t/7", headers=GOOGLEBOT) for _ in range(50)))
    assert len(site.seen) == 1
    assert all(response.status_code == 200 and response.text == PAGE + "7" for response in responses)


async def test_middleware_origin_down_serves_stale_from_l2(
    make_gate: Callable[..., CrawlerGateMiddleware], site: Site
) -> None:
    gate = make_gate(cache=CacheSettings(ttl_seconds=0.001, max_stale_seconds=0))
    async with _client(gate) as client:
        await client.get("/t/1", headers=GOOGLEBOT)
        site.down = True
        await asyncio.sleep(0.01)
        stale = await client.get("/t/1", headers=GOOGLEBOT)
        missing = await client.get("/t/2", headers=GOOGLEBOT)
    assert stale.headers["x-crawlergate"] == "stale" and stale.text == PAGE + "1"
    assert missing.status_code == 503 and missing.headers["x-crawlergate"] == "miss"
    assert gate.core.keys.key_for(b"/t/2").digest not in gate.cache.l2.digests()  # type: ignore[union-attr]


async def test_middleware_origin_unreachable_is_502_and_nothing_stored(tmp_path: Path) -> None:
    async def broken(scope: Any, receive: Any, send: Any) -> None:
        raise ConnectionRefusedError("origin is down")

    gate = CrawlerGateMiddleware(broken, settings=Settings(l2=L2Settings(cache_dir=str(tmp_path))))
    transport = httpx.ASGITransport(app=gate)
    async with httpx.AsyncClient(transport=transport, base_url="http://forum.test") as client:
        response = await client.get("/t/1", headers=GOOGLEBOT)
    assert response.status_code == 502
    assert len(gate.cache.l2) == 0


async def test_middleware_human_view_prefetches_l2_copy_into_l1(
    make_gate: Callable[..., CrawlerGateMiddleware],
) -> None:
    gate = make_gate()
    async with _client(gate) as client:
        await client.get("/t/1", headers=GOOGLEBOT)
        gate.filler.writer.flush()  # the filled page on disk
        gate.cache.l1.delete(gate.core.keys.key_for(b"/t/1").digest)  # type: ignore[union-attr]
        await client.get("/t/1", headers=FIREFOX)
        await gate.drain()
        response = await client.get("/t/1", headers=GOOGLEBOT)
    assert response.headers["x-crawlergate"] == "l1-hit"
    assert gate.stats()["human"]["prefetches"] == 1


async def test_middleware_corrupt_l2_page_is_never_served(
    make_gate: Callable[..., CrawlerGateMiddleware], site: Site
) -> None:
    gate = make_gate()
    async with _client(gate) as client:
        await client.get("/t/1", headers=GOOGLEBOT)
        gate.filler.writer.flush()  # the filled page on disk
        key = gate.core.keys.key_for(b"/t/1")
        assert key is not None
        gate.cache.l1.delete(key.digest)
        path = gate.cache.l2.path_for(key.digest)
        path.write_bytes(path.read_bytes()[:-100])  # a crash cut the page short
        response = await client.get("/t/1", headers=GOOGLEBOT)
    assert response.headers["x-crawlergate"] == "miss"
    assert response.text == PAGE + "1"
    assert gate.stats()["corrupt_pages"] == 1
    assert len(site.seen) == 2


async def test_middleware_a_page_file_copied_over_another_pages_is_never_served_for_it(
    make_gate: Callable[..., CrawlerGateMiddleware], site: Site
) -> None:
    """A page keeps the target it was stored for, and is read only for it (nginx keeps each cache file's key): a
    valid file copied or renamed onto another page's (an operator's rsync, a restore) was that page's hit."""
    gate = make_gate()
    async with _client(gate) as client:
        await client.get("/t/1", headers=GOOGLEBOT)
        await client.get("/t/2", headers=GOOGLEBOT)
        gate.filler.writer.flush()
        first, second = gate.core.keys.key_for(b"/t/1"), gate.core.keys.key_for(b"/t/2")
        assert first is not None and second is not None
        gate.cache.l1.delete(second.digest)
        gate.cache.l2.path_for(second.digest).write_bytes(gate.cache.l2.path_for(first.digest).read_bytes())
        response = await client.get("/t/2", headers=GOOGLEBOT)
    assert response.headers["x-crawlergate"] == "miss" and response.text == PAGE + "2"
    assert gate.stats()["corrupt_pages"] == 1


async def test_middleware_a_cache_folder_removed_under_the_gate_is_claimed_again(
    make_gate: Callable[..., CrawlerGateMiddleware], tmp_path: Path
) -> None:
    """An operator empties the cache with rm -rf while the gate runs: the gate fills the folder again, and its
    marker goes back with it, or a gate of another site given the folder would claim it and serve these pages."""
    gate = make_gate(server=ServerSettings(public_url="http://forum.test"))
    async with _client(gate) as client:
        await client.get("/t/1", headers=GOOGLEBOT)
        gate.filler.writer.flush()
        shutil.rmtree(tmp_path / "l2")
        (tmp_path / "l2").mkdir()  # made again by another part first (the regeneration's tables, at a stats)
        await client.get("/t/2", headers=GOOGLEBOT)
        gate.filler.writer.flush()
    assert (tmp_path / "l2" / MARKER_FILE).exists()
    with pytest.raises(ConfigError, match="holds the pages of"):
        claim_folder(tmp_path / "l2", FolderOwner(public_url="http://wiki.test"))


async def test_middleware_unwritable_l2_still_answers(
    make_gate: Callable[..., CrawlerGateMiddleware], tmp_path: Path
) -> None:
    gate = make_gate()
    gate.start()
    key = gate.core.keys.key_for(b"/t/1")
    assert key is not None
    (tmp_path / "l2" / key.digest[:2]).write_text("a file where the shard folder should be")
    async with _client(gate) as client:
        first = await client.get("/t/1", headers=GOOGLEBOT)
        second = await client.get("/t/1", headers=GOOGLEBOT)
    assert first.status_code == 200 and first.text == PAGE + "1"
    assert second.headers["x-crawlergate"] == "l1-hit"  # L1 still took the page
    assert gate.stats()["crawler"]["store_errors"] >= 1


async def test_middleware_stats_hold_when_the_folder_turned_unusable_before_regeneration_opened(
    make_gate: Callable[..., CrawlerGateMiddleware], tmp_path: Path
) -> None:
    """The regeneration's tables open at their first use: a folder that turned unusable since start-up (read-only,
    a full disk) made stats and metrics answer 500 with a traceback. They answer, saying what is unavailable."""
    gate = make_gate()
    gate.start()
    catalogue = tmp_path / "l2" / "dirty.sqlite3"
    catalogue.unlink()
    catalogue.mkdir()  # what cannot be opened as a database, as a read-only folder's file cannot be
    async with _client(gate) as client:
        stats = await client.get("/_crawlergate/stats")
        metrics = await client.get("/_crawlergate/metrics")
    assert stats.status_code == 200 and "not usable" in stats.json()["regeneration"]["error"]
    assert metrics.status_code == 200 and "crawlergate_l2_pages" in metrics.text


async def test_middleware_huge_url_is_refused_cleanly(
    make_gate: Callable[..., CrawlerGateMiddleware], site: Site
) -> None:
    gate = make_gate()
    path = "/t/" + "a" * 100_000  # httpx refuses to send such a URL, so the ASGI call is made by hand
    scope = {
        "type": "http",
        "method": "GET",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"user-agent", GOOGLEBOT["user-agent"].encode())],
        "client": ("127.0.0.1", 5000),
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await gate(scope, receive, send)
    assert sent[0]["status"] == 414
    assert site.seen == []


@pytest.mark.parametrize("path", ["/t/..%2f..%2f..%2fetc%2fpasswd", "/t/%00", "/../../etc/passwd"])
async def test_middleware_path_tricks_stay_inside_the_cache(
    make_gate: Callable[..., CrawlerGateMiddleware], tmp_path: Path, path: str
) -> None:
    gate = make_gate()
    async with _client(gate) as client:
        await client.get(path, headers=GOOGLEBOT)
    gate.filler.writer.flush()  # the page on disk, not a write under way
    l2 = tmp_path / "l2"
    for file in l2.rglob("*"):
        assert file.resolve().is_relative_to(l2.resolve())
        # Pages, the page catalogue, L2's shared index, its loader's and the catalogue's relearning's locks, whose
        # folder it is: nothing named by the URL.
        assert (
            file.is_dir()
            or file.name.endswith(".page")
            or file.name.startswith(("dirty.sqlite3", INDEX_FILE, LOADER_LOCK_FILE, RELEARN_LOCK_FILE, MARKER_FILE))
        )


async def test_middleware_stats_and_healthz(make_gate: Callable[..., CrawlerGateMiddleware]) -> None:
    gate = make_gate()
    async with _client(gate) as client:
        await client.get("/t/1", headers=GOOGLEBOT)
        await client.get("/t/1", headers=GOOGLEBOT)
        stats = (await client.get("/_crawlergate/stats")).json()
        health = await client.get("/_crawlergate/healthz")
    crawler = stats["crawler"]
    assert (crawler["requests"], crawler["l1_hits"], crawler["misses"], crawler["hit_ratio"]) == (2, 1, 1, 0.5)
    assert set(crawler["ttfb_ms"]) >= {"p50", "p90", "p99", "mean"}
    assert set(stats["human"]) >= {"requests", "l1_hits", "l2_hits", "misses", "hit_ratio", "ttfb_ms"}
    assert health.json() == {"status": "ok"}


async def test_middleware_stats_refuse_remote_clients_without_token(
    make_gate: Callable[..., CrawlerGateMiddleware],
) -> None:
    from crawlergate.config import AdminSettings

    gate = make_gate(admin=AdminSettings(token="s3cret"))
    transport = httpx.ASGITransport(app=gate, client=("203.0.113.5", 4000))
    async with httpx.AsyncClient(transport=transport, base_url="http://forum.test") as client:
        refused = await client.get("/_crawlergate/stats")
        allowed = await client.get("/_crawlergate/stats", headers={"authorization": "Bearer s3cret"})
        health = await client.get("/_crawlergate/healthz")
    assert (refused.status_code, allowed.status_code, health.status_code) == (403, 200, 200)


@pytest.mark.memcached
async def test_middleware_with_memcached_l1_survives_memcached_death(
    make_gate: Callable[..., CrawlerGateMiddleware], site: Site, memcached_server: MemcachedServer
) -> None:
    l1 = L1Settings(memcached=(memcached_server.address,), dead_retry_seconds=60, local_ttl_ms=0)
    gate = make_gate(l1=l1)
    async with _client(gate) as client:
        await client.get("/t/1", headers=GOOGLEBOT)
        assert (await client.get("/t/1", headers=GOOGLEBOT)).headers["x-crawlergate"] == "l1-hit"
        gate.filler.writer.flush()  # the filled page in memcached and on disk
        memcached_server.stop()
        outcomes = [(await client.get("/t/1", headers=GOOGLEBOT)).headers["x-crawlergate"] for _ in range(20)]
    assert outcomes == ["l2-hit"] * 20
    assert len(site.seen) == 1
    gate.cache.close()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.memcached
async def test_middleware_memcached_back_is_used_again(
    site: Site, tmp_path: Path, memcached_server: MemcachedServer
) -> None:
    clock = FakeClock()
    metrics = Metrics()
    l1 = MemcachedStore([memcached_server.address], dead_retry_seconds=30, clock=clock)
    cache = TwoLevelCache(l1, DiskStore(tmp_path / "l2", max_bytes=10**8), metrics)
    gate = CrawlerGateMiddleware(site.app(), settings=Settings(), cache=cache)
    async with _client(gate) as client:
        await client.get("/t/1", headers=GOOGLEBOT)
        gate.filler.writer.flush()  # the filled page in memcached and on disk
        memcached_server.stop()
        during = (await client.get("/t/1", headers=GOOGLEBOT)).headers["x-crawlergate"]
        memcached_server.start()
        still_skipped = (await client.get("/t/1", headers=GOOGLEBOT)).headers["x-crawlergate"]
        clock.now += 31
        after = [(await client.get("/t/1", headers=GOOGLEBOT)).headers["x-crawlergate"] for _ in range(2)]
    assert (during, still_skipped) == ("l2-hit", "l2-hit")
    assert after == ["l2-hit", "l1-hit"]  # the first promotes into the new memcached, the second hits it
    cache.close()


async def test_middleware_host_poisoning_does_not_change_the_stored_page(tmp_path: Path) -> None:
    async def echo_host(request: Request) -> Response:
        return HTMLResponse(f"<p>links to {request.headers['host']} {request.url.query}</p>")

    site = Starlette(routes=[Route("/t/{number}", echo_host)])
    gate = CrawlerGateMiddleware(
        site,
        settings=Settings(l2=L2Settings(cache_dir=str(tmp_path)), server=ServerSettings(canonical_host="forum.test")),
    )
    poison = {**GOOGLEBOT, "host": "evil.test", "x-forwarded-host": "evil.test"}
    async with _client(gate) as client:
        first = await client.get("/t/1?utm_campaign=evil", headers=poison)
        second = await client.get("/t/1", headers=GOOGLEBOT)
    assert first.text == second.text == "<p>links to forum.test </p>"
    assert second.headers["x-crawlergate"] == "l1-hit"


async def test_middleware_origin_timeout_is_504_or_stale(
    make_gate: Callable[..., CrawlerGateMiddleware], site: Site
) -> None:
    gate = make_gate(cache=CacheSettings(fill_timeout_seconds=0.05, ttl_seconds=0.001, max_stale_seconds=0))
    async with _client(gate) as client:
        await client.get("/t/1", headers=GOOGLEBOT)
        site.delay_s = 1.0
        await asyncio.sleep(0.01)
        stale = await client.get("/t/1", headers=GOOGLEBOT)
        timeout = await client.get("/t/2", headers=GOOGLEBOT)
    assert stale.headers["x-crawlergate"] == "stale" and stale.text == PAGE + "1"
    assert timeout.status_code == 504
    assert gate.stats()["crawler"]["errors"] == 1


async def test_middleware_stats_behind_a_local_proxy_judge_the_forwarded_client(
    make_gate: Callable[..., CrawlerGateMiddleware],
) -> None:
    gate = make_gate()
    # An nginx on the same host: the peer is loopback, the visitor is not.
    async with _client(gate) as client:
        visitor = await client.get("/_crawlergate/stats", headers={"x-forwarded-for": "203.0.113.9"})
        local = await client.get("/_crawlergate/stats", headers={"x-forwarded-for": "127.0.0.1"})
    assert visitor.status_code == 403
    assert local.status_code == 200


async def test_middleware_prometheus_metrics(make_gate: Callable[..., CrawlerGateMiddleware]) -> None:
    gate = make_gate()
    async with _client(gate) as client:
        await client.get("/t/1", headers=GOOGLEBOT)
        await client.get("/t/1", headers=GOOGLEBOT)
        response = await client.get("/_crawlergate/metrics")
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = response.text
    assert 'crawlergate_requests_total{class="crawler",outcome="l1-hit"} 1' in text
    assert 'crawlergate_requests_total{class="crawler",outcome="miss"} 1' in text
    assert 'crawlergate_ttfb_seconds_count{class="crawler"} 2' in text
    assert 'crawlergate_ttfb_seconds_bucket{class="crawler",le="+Inf"} 2' in text
    assert "crawlergate_origin_fetches_total 1" in text and "crawlergate_l2_pages 1" in text
    buckets = [
        int(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith('crawlergate_ttfb_seconds_bucket{class="crawler"')
    ]
    assert buckets == sorted(buckets)


def _raw_site(answers: list[list[Message]]) -> ASGIApp:
    """An ASGI site that plays back one list of messages per request, as a misbehaving server would send them."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        for message in answers.pop(0):
            await send(message)

    return app


def _start(headers: list[tuple[bytes, bytes]] | None = None) -> Message:
    return {
        "type": "http.response.start",
        "status": 200,
        "headers": [(b"content-type", b"text/html"), *(headers or [])],
    }


async def test_middleware_half_page_is_never_stored_and_stale_beats_it(tmp_path: Path) -> None:
    whole = [_start(), {"type": "http.response.body", "body": b"<p>whole page</p>"}]
    cut = [_start(), {"type": "http.response.body", "body": b"<p>half", "more_body": True}]
    short = [_start([(b"content-length", b"100")]), {"type": "http.response.body", "body": b"<p>short</p>"}]
    clock = [1000.0]
    gate = CrawlerGateMiddleware(
        _raw_site([whole, cut, short, cut]),
        settings=Settings(
            l2=L2Settings(cache_dir=str(tmp_path)), cache=CacheSettings(ttl_seconds=10, max_stale_seconds=0)
        ),
        clock=lambda: clock[0],
    )
    async with _client(gate) as client:
        first = await client.get("/t/1", headers=GOOGLEBOT)
        clock[0] += 60  # expired: the next crawler request refetches
        stale = [await client.get("/t/1", headers=GOOGLEBOT) for _ in range(2)]
        nothing = await client.get("/t/2", headers=GOOGLEBOT)
    assert first.text == "<p>whole page</p>"
    assert [(r.headers["x-crawlergate"], r.text) for r in stale] == [("stale", "<p>whole page</p>")] * 2
    assert nothing.status_code == 502
    assert gate.stats()["not_stored"] == {"incomplete": 3}
    found = gate.cache.lookup(gate.core.keys.key_for(b"/t/1"))  # type: ignore[arg-type]
    assert found is not None and found.page.body() == b"<p>whole page</p>"


async def test_middleware_stores_the_sites_gzip_as_it_came(tmp_path: Path) -> None:
    body = b"<p>" + b"a guest page " * 200 + b"</p>"
    site_gzip = gzip.compress(body, mtime=77)
    answer = [_start([(b"content-encoding", b"gzip")]), {"type": "http.response.body", "body": site_gzip}]
    gate = CrawlerGateMiddleware(_raw_site([answer]), settings=Settings(l2=L2Settings(cache_dir=str(tmp_path))))
    async with _client(gate) as client:
        miss = await client.get("/t/1", headers=GOOGLEBOT)
        hit = await client.get("/t/1", headers=GOOGLEBOT)
        identity = await client.get("/t/1", headers={**GOOGLEBOT, "accept-encoding": "identity"})
    assert miss.headers["content-encoding"] == hit.headers["content-encoding"] == "gzip"
    assert hit.content == body and identity.content == body
    found = gate.cache.lookup(gate.core.keys.key_for(b"/t/1"))  # type: ignore[arg-type]
    assert found is not None and found.page.body_gz == site_gzip


async def test_middleware_big_pages_are_compressed_off_the_event_loop(tmp_path: Path) -> None:
    import threading

    big = b"<p>" + bytes(range(256)) * 4096 + b"</p>"  # 1 MB that gzip cannot shrink much
    answers = [[_start(), {"type": "http.response.body", "body": big}]]
    gate = CrawlerGateMiddleware(_raw_site(answers), settings=Settings(l2=L2Settings(cache_dir=str(tmp_path))))
    judged_in: list[str] = []
    judge = gate.filler.judge_fill

    def recording(*args: Any) -> Any:
        judged_in.append(threading.current_thread().name)
        return judge(*args)

    gate.filler.judge_fill = recording  # type: ignore[method-assign]
    async with _client(gate) as client:
        miss = await client.get("/t/1", headers=GOOGLEBOT)
        identity = await client.get("/t/1", headers={**GOOGLEBOT, "accept-encoding": "identity"})
    assert miss.content == big and identity.content == big
    assert judged_in and judged_in[0] != threading.main_thread().name


async def test_middleware_empty_200_never_replaces_a_stored_page(tmp_path: Path) -> None:
    whole = [_start(), {"type": "http.response.body", "body": b"<p>whole page</p>"}]
    empty = [_start(), {"type": "http.response.body", "body": b""}]
    clock = [1000.0]
    gate = CrawlerGateMiddleware(
        _raw_site([whole, empty]),
        settings=Settings(
            l2=L2Settings(cache_dir=str(tmp_path)), cache=CacheSettings(ttl_seconds=10, max_stale_seconds=0)
        ),
        clock=lambda: clock[0],
    )
    async with _client(gate) as client:
        await client.get("/t/1", headers=GOOGLEBOT)
        clock[0] += 60
        stale = await client.get("/t/1", headers=GOOGLEBOT)
    assert (stale.headers["x-crawlergate"], stale.text) == ("stale", "<p>whole page</p>")
    assert gate.stats()["not_stored"] == {"empty": 1}


async def test_middleware_app_mounted_under_a_prefix_is_filled_as_mounted(tmp_path: Path) -> None:
    from starlette.routing import Mount

    async def post(request: Request) -> Response:
        return HTMLResponse("<p>a post</p>")

    # The blog knows only its own paths; Starlette's Mount gives it root_path /blog (the ASGI SCRIPT_NAME).
    blog = Starlette(routes=[Route("/post", post)])
    gate = CrawlerGateMiddleware(blog, settings=Settings(l2=L2Settings(cache_dir=str(tmp_path / "l2"))))
    site = Starlette(routes=[Mount("/blog", app=gate)])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=site), base_url="http://forum.test") as client:
        crawler = [await client.get("/blog/post", headers=GOOGLEBOT) for _ in range(2)]
        person = await client.get("/blog/post", headers=FIREFOX)
    assert [answer.status_code for answer in crawler] == [200, 200]
    assert [answer.headers["x-crawlergate"] for answer in crawler] == ["miss", "l1-hit"]
    assert crawler[1].text == person.text == "<p>a post</p>"


def test_a_fill_sees_the_lifespan_state_and_the_app_around_the_gate(tmp_path: Path) -> None:
    # Starlette's documented patterns: a lifespan that yields state (request.state.db), and the gate added with
    # add_middleware, where request.app is the Starlette app; a fill without them failed (a crawler's 502).
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, str]]:
        yield {"db": "the database"}

    async def page(request: Request) -> HTMLResponse:
        return HTMLResponse(f"<p>{request.state.db}, {type(request.app).__name__}</p>")

    site = Starlette(routes=[Route("/t/{number}", page)], lifespan=lifespan)
    site.add_middleware(CrawlerGateMiddleware, settings=Settings(l2=L2Settings(cache_dir=str(tmp_path / "l2"))))
    server = ServerThread(site).start()
    try:
        for headers in (GOOGLEBOT, FIREFOX):
            answer = httpx.get(f"{server.url}/t/1", headers=headers)
            assert answer.status_code == 200 and answer.text == "<p>the database, Starlette</p>"
        assert httpx.get(f"{server.url}/t/1", headers=GOOGLEBOT).headers["x-crawlergate"].startswith("l1-hit")
    finally:
        server.stop()


async def test_an_event_stream_is_passed_to_a_crawler_not_waited_for(tmp_path: Path) -> None:
    async def events(request: Request) -> StreamingResponse:
        async def stream() -> AsyncIterator[bytes]:
            for number in range(20):
                yield f"data: {number}\n\n".encode()
                await asyncio.sleep(0.01)

        return StreamingResponse(stream(), media_type="text/event-stream")

    site = Starlette(routes=[Route("/events", events)])
    gate = CrawlerGateMiddleware(site, settings=Settings(l2=L2Settings(cache_dir=str(tmp_path / "l2"))))
    async with _client(gate) as client:
        for _ in range(2):
            answer = await client.get("/events", headers=GOOGLEBOT)
            assert answer.text.count("data:") == 20 and answer.headers["x-crawlergate"].startswith("pass")
    assert gate.stats()["not_stored"].get("stream") == 2
    gate.core.close()


async def test_fills_without_a_public_url_say_once_which_host_they_ask_as(
    make_gate: Callable[..., CrawlerGateMiddleware], caplog: pytest.LogCaptureFixture
) -> None:
    gate = make_gate()
    async with _client(gate) as client:
        for number in range(3):
            await client.get(f"/t/{number}", headers=GOOGLEBOT)
    said = [record.getMessage() for record in caplog.records if "public_url is not set" in record.getMessage()]
    assert len(said) == 1 and "as http://forum.test," in said[0]


async def test_an_apps_exception_in_a_fill_is_logged_with_its_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def boom(request: Request) -> HTMLResponse:
        raise RuntimeError("the database is down")

    site = Starlette(routes=[Route("/boom/{number}", boom)])
    gate = CrawlerGateMiddleware(site, settings=Settings(l2=L2Settings(cache_dir=str(tmp_path / "l2"))))
    async with _client(gate) as client:
        for number in range(3):
            # Starlette's error middleware answered 500, then raised: the crawler gets the site's own answer.
            assert (await client.get(f"/boom/{number}", headers=GOOGLEBOT)).status_code == 500
    said = [record for record in caplog.records if record.levelname == "ERROR" and record.exc_info]
    assert len(said) == 1 and "the database is down" in said[0].getMessage()  # once a minute, not once a fill
    gate.core.close()


async def test_a_persons_request_the_site_fails_before_answering_is_logged_as_500(tmp_path: Path) -> None:
    """The server answers 500 for an app that raised before its answer: the access log says so (not nothing)."""

    async def broken(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("the database is down")

    log = tmp_path / "access.log"
    settings = Settings(l2=L2Settings(cache_dir=str(tmp_path / "l2")), log=LogSettings(access_log=str(log)))
    gate = CrawlerGateMiddleware(broken, settings=settings)
    async with _client(gate) as client:
        with pytest.raises(RuntimeError, match="database"):
            await client.get("/t/1", headers={**FIREFOX, "cookie": "session=1"})
    gate.core.close()
    gate.runtime.access_log.close()  # type: ignore[union-attr]
    line = log.read_text()
    assert '"GET /t/1 HTTP/1.1" 500 0 ' in line and line.count("\n") == 1


async def test_a_crawler_on_a_unix_socket_without_a_public_url_gets_the_live_site(tmp_path: Path) -> None:
    """uvicorn names no server address on a unix socket: with nothing to ask as, the crawler's request goes to the
    site (it got 502 before), and nothing is stored."""
    site = Starlette(routes=[Route("/t/{number}", lambda request: HTMLResponse("<p>page</p>"))])
    gate = CrawlerGateMiddleware(site, settings=Settings(l2=L2Settings(cache_dir=str(tmp_path / "l2"))))

    async def on_a_unix_socket(scope: Scope, receive: Receive, send: Send) -> None:
        await gate({**scope, "server": None}, receive, send)

    transport = httpx.ASGITransport(app=on_a_unix_socket)
    async with httpx.AsyncClient(transport=transport, base_url="http://evil.example") as client:
        page = await client.get("/t/1", headers=GOOGLEBOT)
    gate.core.close()
    assert page.status_code == 200 and page.headers["x-crawlergate"] == "pass" and page.text == "<p>page</p>"
    assert not any((tmp_path / "l2").rglob("*.page"))


async def test_a_persons_head_request_is_logged_with_no_body_sent(tmp_path: Path) -> None:
    """Starlette writes a HEAD answer's body and the server drops it: the log counts what went, nothing."""
    site = Starlette(routes=[Route("/t/{number}", lambda request: HTMLResponse("<p>page</p>"))])
    log = tmp_path / "access.log"
    settings = Settings(l2=L2Settings(cache_dir=str(tmp_path / "l2")), log=LogSettings(access_log=str(log)))
    gate = CrawlerGateMiddleware(site, settings=settings)
    async with _client(gate) as client:
        await client.head("/t/1", headers={**FIREFOX, "cookie": "session=1"})
        await client.get("/t/1", headers={**FIREFOX, "cookie": "session=1"})
    gate.core.close()
    gate.runtime.access_log.close()  # type: ignore[union-attr]
    head, get = log.read_text().splitlines()
    assert '"HEAD /t/1 HTTP/1.1" 200 0 ' in head and '"GET /t/1 HTTP/1.1" 200 11 ' in get


@pytest.mark.parametrize("front", ["x-forwarded-for", "x-real-ip", "forwarded"])
async def test_admin_and_purge_refuse_visitors_of_a_front_trusted_proxies_lacks(tmp_path: Path, front: str) -> None:
    """With server.trusted_proxies emptied, an nginx on this machine still forwards for the world: its visitors
    must not be taken for this machine's own clients."""
    site = Starlette(routes=[Route("/t/{number}", lambda request: HTMLResponse("<p>page</p>"))])
    settings = Settings(l2=L2Settings(cache_dir=str(tmp_path / "l2")), server=ServerSettings(trusted_proxies=()))
    gate = CrawlerGateMiddleware(site, settings=settings)
    visitor = {front: "for=203.0.113.5" if front == "forwarded" else "203.0.113.5"}
    async with _client(gate) as client:  # from 127.0.0.1, as through an nginx on this machine
        await client.get("/t/1", headers=GOOGLEBOT)
        assert (await client.get("/_crawlergate/stats", headers=visitor)).status_code == 403
        refused = await client.request("PURGE", "/t/1", headers=visitor)
        assert refused.status_code == 403 and "trusted_proxies" in refused.text
        assert (await client.get("/_crawlergate/stats")).status_code == 200  # the machine's own
        assert (await client.request("PURGE", "/t/1")).json() == {"marked": 1}
    gate.core.close()


@pytest.mark.parametrize("front", [b"x-real-ip", b"forwarded"])
async def test_admin_refuses_visitors_of_a_front_that_names_them_without_x_forwarded_for(
    tmp_path: Path, front: bytes
) -> None:
    site = Starlette(routes=[Route("/t/{number}", lambda request: HTMLResponse("<p>page</p>"))])
    gate = CrawlerGateMiddleware(site, settings=Settings(l2=L2Settings(cache_dir=str(tmp_path / "l2"))))
    visitor = {front.decode(): "203.0.113.5" if front == b"x-real-ip" else "for=203.0.113.5"}
    async with _client(gate) as client:  # from 127.0.0.1, as through an nginx on this machine
        await client.get("/t/1", headers=GOOGLEBOT)
        assert (await client.get("/_crawlergate/stats", headers=visitor)).status_code == 403
        assert (await client.request("PURGE", "/t/1", headers=visitor)).status_code == 403
        assert (await client.get("/_crawlergate/stats")).status_code == 200  # the machine's own
    gate.core.close()


async def test_a_fill_ends_with_its_page_not_with_the_apps_background_tasks(tmp_path: Path) -> None:
    done = asyncio.Event()

    async def after() -> None:
        await asyncio.sleep(2)
        done.set()

    async def page(request: Request) -> HTMLResponse:
        return HTMLResponse("<p>page</p>", background=BackgroundTask(after))

    site = Starlette(routes=[Route("/t/{number}", page)])
    gate = CrawlerGateMiddleware(site, settings=Settings(l2=L2Settings(cache_dir=str(tmp_path / "l2"))))
    async with _client(gate) as client:
        started = time.monotonic()
        answer = await client.get("/t/1", headers=GOOGLEBOT)
        waited_s = time.monotonic() - started
    assert answer.status_code == 200 and answer.text == "<p>page</p>" and waited_s < 1.5  # not the task's 2 s
    await asyncio.wait_for(done.wait(), 5)  # the app's task still ran to its end
    gate.core.close()


async def test_a_page_too_big_to_store_is_not_fetched_twice_for_each_crawler(tmp_path: Path) -> None:
    # Filled, too big, then passed: the site built it twice a crawler; remembered, the next crawlers go straight.
    built: list[str] = []

    async def export(request: Request) -> Response:
        built.append(request.url.path)
        return Response(b"x" * 200_000, media_type="text/csv")

    site = Starlette(routes=[Route("/export", export)])
    settings = Settings(l2=L2Settings(cache_dir=str(tmp_path / "l2"), page_max_bytes=100_000))
    gate = CrawlerGateMiddleware(site, settings=settings)
    async with _client(gate) as client:
        answers = [await client.get("/export", headers=GOOGLEBOT) for _ in range(3)]
    assert all(len(answer.content) == 200_000 for answer in answers)
    assert len(built) == 4  # the first crawler's fill and its own request, then one request each
    assert gate.stats()["not_stored"] == {"too-big": 3}
    gate.core.close()


async def test_a_page_whose_app_raises_just_after_it_is_stored(tmp_path: Path) -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/html")]})
        await send({"type": "http.response.body", "body": b"<p>page</p>"})
        raise RuntimeError("after the page")

    gate = CrawlerGateMiddleware(app, settings=Settings(l2=L2Settings(cache_dir=str(tmp_path / "l2"))))
    async with _client(gate) as client:
        first = await client.get("/t/1", headers=GOOGLEBOT)
        second = await client.get("/t/1", headers=GOOGLEBOT)
    assert first.status_code == 200 and first.text == "<p>page</p>"
    assert second.headers["x-crawlergate"].startswith("l1-hit")
    gate.core.close()


@pytest.mark.parametrize(
    ("direct_log", "said"),
    [("", "front.publish without front.direct_log"), ("/no/such/folder/direct.log", "its folder does not exist")],
)
async def test_a_published_tree_whose_direct_hits_go_uncounted_is_said_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, direct_log: str, said: str
) -> None:
    """An operator's typo in front.direct_log (or none) left nginx's direct hits uncounted without a word."""
    site = Starlette(routes=[Route("/t/{number}", lambda request: HTMLResponse("<p>page</p>"))])
    front = FrontSettings(publish=True, direct_log=direct_log)
    gate = CrawlerGateMiddleware(site, settings=Settings(l2=L2Settings(cache_dir=str(tmp_path / "l2")), front=front))
    gate.start_serving()
    await gate.aclose()
    assert any(said in record.getMessage() for record in caplog.records if record.levelname == "WARNING")
