"""Off-peak regeneration end to end: the demo forum, real passes, the window on an injected clock, the lease,
the budget measured at the origin, a pass killed half-way, and two `serve` processes sharing one cache."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Route

from crawlergate.adapters.asgi import CrawlerGateMiddleware
from crawlergate.adapters.proxy import create_app
from crawlergate.adapters.wsgi import CrawlerGateWSGI
from crawlergate.cli import main
from crawlergate.config import (
    AdminSettings,
    CacheSettings,
    L1Settings,
    L2Settings,
    RegenerateSettings,
    ServerSettings,
    Settings,
)
from crawlergate.demo.forum import create_forum
from crawlergate.demo.run import free_port
from crawlergate.demo.seed import seed_database
from crawlergate.errors import ConfigError
from crawlergate.gate.catalogue import PageCatalogue
from crawlergate.page import Page
from crawlergate.regenerate.lease import Lease
from crawlergate.regenerate.regenerator import Selection
from crawlergate.regenerate.state import RegenerationState
from crawlergate.regenerate.window import Window, crontab_weekdays, quietest_hour
from crawlergate.stores.disk import DiskStore
from crawlergate.wiring import DIRTY_INDEX_FILE
from tests.conftest import MemcachedServer, ServerThread
from tests.visitors import GOOGLEBOT

pytestmark = pytest.mark.anyio

TOKEN = "s3cret-token"
# 2026-11-23 12:00 UTC: the windows below open at 04:00 UTC.
NOON = datetime(2026, 11, 23, 12, 0, tzinfo=UTC).timestamp()


class Clock:
    def __init__(self, now: float = NOON) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _settings(tmp_path: Path, **regenerate: Any) -> Settings:
    return Settings(
        server=ServerSettings(public_url="http://forum.test"),
        l2=L2Settings(cache_dir=str(tmp_path / "l2")),
        cache=CacheSettings(sites=("demo-forum",)),
        admin=AdminSettings(token=TOKEN),
        regenerate=RegenerateSettings(
            **{"window": "04:00", "timezone": "UTC", "rate": 0.0, "origin_share": 0.0, **regenerate}
        ),
    )


def _client(gate: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=gate), base_url="http://forum.test")


class Origin:
    """A site that says how it was asked: pages by name, a version to change them, fetches at once measured."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.version = 1
        self.delay_s = delay_s
        self.in_flight = 0
        self.busiest = 0
        self.fetched: list[str] = []
        self.special: dict[str, Response] = {}

    def app(self) -> Starlette:
        async def page(request: Request) -> Response:
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            self.fetched.append(target)
            self.in_flight += 1
            self.busiest = max(self.busiest, self.in_flight)
            try:
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
            finally:
                self.in_flight -= 1
            special = self.special.get(request.url.path)
            if special is not None:
                return special
            return HTMLResponse(f"<p>{target} version {self.version}</p>")

        return Starlette(routes=[Route("/{path:path}", page)])


async def test_a_reply_is_served_old_until_the_window_then_new_and_an_unchanged_page_keeps_its_etag(
    tmp_path: Path,
) -> None:
    db = tmp_path / "forum.sqlite3"
    seed_database(db, threads=30, seed=3)
    forum = create_forum(db, threads=30, seed=3, work_ms=0.1, rounds_per_ms=100)
    clock = Clock()
    gate = CrawlerGateMiddleware(forum, settings=_settings(tmp_path), clock=clock)
    job = gate.regeneration
    async with _client(gate) as crawler, _client(gate) as person:
        before = await crawler.get("/showthread.php?t=5", headers=GOOGLEBOT)
        quiet = await crawler.get("/showthread.php?t=9", headers=GOOGLEBOT)
        await person.post("/login", data={"member": "4"})
        assert (await person.post("/newreply.php", data={"t": "5"})).status_code == 303
        await gate.drain()
        assert gate.mark_changed("/showthread.php?t=9") == 1  # marked, but nothing changed on it
        clock.now += 3600
        kept = await crawler.get("/showthread.php?t=5", headers=GOOGLEBOT)
        assert kept.text == before.text and kept.headers["etag"] == before.headers["etag"]

        clock.now = datetime(2026, 11, 24, 3, 59, tzinfo=UTC).timestamp()
        assert job.tick() is None  # not yet
        clock.now += 90
        opened = job.tick()
        assert opened == datetime(2026, 11, 24, 4, 0, tzinfo=UTC).timestamp()
        summary = await job.run_window(opened)
        assert summary is not None and summary.errors == 0
        assert summary.changed >= 1 and summary.unchanged == 1 and summary.remaining == 0
        assert job.tick() is None  # this window is served

        after = await crawler.get("/showthread.php?t=5", headers=GOOGLEBOT)
        assert after.headers["x-crawlergate"] == "l1-hit" and after.text != before.text
        assert after.headers["etag"] != before.headers["etag"]
        same = await crawler.get("/showthread.php?t=9", headers={**GOOGLEBOT, "if-none-match": quiet.headers["etag"]})
        assert same.status_code == 304 and same.headers["etag"] == quiet.headers["etag"]
        since = await crawler.get(
            "/showthread.php?t=9", headers={**GOOGLEBOT, "if-modified-since": quiet.headers["last-modified"]}
        )
        assert since.status_code == 304  # Last-Modified kept too

        stats = (await crawler.get("/_crawlergate/stats", headers={"authorization": f"Bearer {TOKEN}"})).json()
        regeneration = stats["regeneration"]
        assert stats["dirty"] == 0 and regeneration["last_window"]["pages"] == summary.pages
        assert regeneration["last_window"]["scheduled_start"] == opened
        assert regeneration["next_window"] == datetime(2026, 11, 25, 4, 0, tzinfo=UTC).timestamp()
        metrics = (await crawler.get("/_crawlergate/metrics", headers={"authorization": f"Bearer {TOKEN}"})).text
        assert "crawlergate_dirty_pages 0" in metrics
        assert f"crawlergate_regeneration_last_pages {summary.pages}" in metrics
        assert "crawlergate_revalidations_changed_total 0" in metrics
    gate.core.close()


def test_regenerate_command_against_a_running_gate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    origin = Origin()
    site = ServerThread(origin.app()).start()
    settings = Settings(
        server=ServerSettings(origin=site.url),
        l2=L2Settings(cache_dir=str(tmp_path / "l2")),
        admin=AdminSettings(token=TOKEN),
        regenerate=RegenerateSettings(enabled=False),
    )
    gate = create_app(settings)
    server = ServerThread(gate).start()
    argv = ["regenerate", "--origin", site.url, "--cache-dir", str(tmp_path / "l2")]
    try:
        first = httpx.get(f"{server.url}/t/1", headers=GOOGLEBOT)
        httpx.get(f"{server.url}/t/2", headers=GOOGLEBOT)
        origin.version = 2
        assert main(["invalidate", "/t/1", "--url", server.url, "--token", TOKEN]) == 0
        capsys.readouterr()
        assert httpx.get(f"{server.url}/t/1", headers=GOOGLEBOT).text == first.text  # until regenerated
        assert main([*argv, "--dirty", "--json", str(tmp_path / "pass.json")]) == 0
        out = capsys.readouterr().out
        assert "1 page tried: 1 changed" in out and "0 marked pages wait" in out
        assert json.loads((tmp_path / "pass.json").read_text())["changed"] == 1
        # The serving process drops its in-memory copy when it next reads the index (within refresh_s).
        deadline = time.monotonic() + 5
        while "version 2" not in httpx.get(f"{server.url}/t/1", headers=GOOGLEBOT).text:
            assert time.monotonic() < deadline, "the gate kept serving the old copy"
            time.sleep(0.05)
        assert "version 1" in httpx.get(f"{server.url}/t/2", headers=GOOGLEBOT).text  # not marked: untouched
        stats = httpx.get(f"{server.url}/_crawlergate/stats", headers={"authorization": f"Bearer {TOKEN}"}).json()
        assert stats["regeneration"]["last_window"]["changed"] == 1
        assert stats["regeneration"]["last_window"]["scheduled_start"] is None

        assert main([*argv, "/t/2", "/t/3", "t/4?x"]) == 0  # given URLs: stored or not
        out = capsys.readouterr().out
        assert "2 pages tried: 2 changed" in out and "1 of the URLs given are not cacheable" in out
        site.stop()
        assert main([*argv, "--all"]) == 1  # the origin answered none: the pass could not run
        captured = capsys.readouterr()
        assert "origin errors" in captured.out and "answered none" in captured.err
        assert main([*argv, "--all", "/t/1"]) == 2 and "not both" in capsys.readouterr().err
        assert main([*argv, "--json", str(tmp_path / "no" / "x.json")]) == 2
        assert "Cannot write the summary" in capsys.readouterr().err
        assert main(["regenerate", "--origin", site.url, "--cache-dir", str(tmp_path / "typo")]) == 2
        assert "No cache at" in capsys.readouterr().err and not (tmp_path / "typo").exists()
    finally:
        server.stop()
        site.stop()


async def test_what_a_fetch_leaves_behind_removed_stored_as_404_kept_on_errors(tmp_path: Path) -> None:
    origin = Origin()
    clock = Clock()
    gate = CrawlerGateMiddleware(origin.app(), settings=_settings(tmp_path), clock=clock)
    pages = ["/same", "/changed", "/gone", "/gone-for-good", "/broken"]
    async with _client(gate) as crawler:
        for page in pages:
            assert (await crawler.get(page, headers=GOOGLEBOT)).status_code == 200
        old = {page: (await crawler.get(page, headers=GOOGLEBOT)).headers["etag"] for page in pages}
        origin.special = {
            "/same": HTMLResponse("<p>/same version 1</p>"),
            "/gone": PlainTextResponse("gone", status_code=404),
            "/gone-for-good": PlainTextResponse("gone", status_code=410, headers={"cache-control": "no-store"}),
            "/broken": PlainTextResponse("down", status_code=500),
        }
        origin.version = 2
        assert gate.runtime.invalidation.invalidate(pages, []) == 5
        summary = await gate.regeneration.regenerator.run(Selection(dirty=True))
        assert (summary.changed, summary.unchanged, summary.gone, summary.removed, summary.errors) == (1, 1, 1, 1, 1)
        assert summary.remaining == 1 and summary.error_samples
        assert (await crawler.get("/same", headers=GOOGLEBOT)).headers["etag"] == old["/same"]
        assert (await crawler.get("/gone", headers=GOOGLEBOT)).status_code == 404  # stored as such
        key = gate.core.keys.key_for_url("/gone-for-good")
        assert key is not None and not gate.cache.l2.path_for(key.digest).exists()  # removed
        broken = await crawler.get("/broken", headers=GOOGLEBOT)
        assert broken.status_code == 200 and broken.headers["etag"] == old["/broken"]  # the old copy stays
        assert gate.stats()["dirty"] == 1  # and its mark
    gate.core.close()


async def test_a_budget_of_n_regenerates_exactly_the_n_most_wanted_pages_at_bounded_concurrency(
    tmp_path: Path,
) -> None:
    origin = Origin(delay_s=0.002)
    gate = CrawlerGateMiddleware(
        origin.app(), settings=_settings(tmp_path, concurrency=3, max_pages=40, revalidate_pages=0)
    )
    gate.start()
    count = 10_000
    for number in range(count):
        key = gate.core.keys.key_for_url(f"/t/{number}")
        assert key is not None
        page = Page.from_response(200, b"<p>old</p>", content_type="text/html", generated_at=NOON, ttl_seconds=1e9)
        gate.filler.writer.write_blocking(key, page, gate.cache.hold(key, page), None)  # as a fill stores it
    gate.filler.writer.flush()
    # Crawler demand: page 100 + i asked for i times (i = 1..100); the others never.
    for wanted in range(1, 101):
        key = gate.core.keys.key_for_url(f"/t/{100 + wanted}")
        assert key is not None
        for _ in range(wanted):
            gate.core.catalogue.count_demand(key.digest)
    gate.core.catalogue.flush_demand()
    assert gate.mark_changed("/t/*") == count
    summary = await gate.regeneration.regenerator.run(Selection(dirty=True))
    assert summary.pages == 40 and summary.changed == 40
    assert sorted(origin.fetched) == sorted(f"/t/{100 + wanted}" for wanted in range(61, 101))
    assert summary.remaining == count - 40 and gate.stats()["dirty"] == count - 40
    assert origin.busiest <= 3 and summary.busiest <= 3
    gate.core.close()


async def test_the_pass_keeps_to_its_share_of_the_origins_time(tmp_path: Path) -> None:
    origin = Origin(delay_s=0.01)
    gate = CrawlerGateMiddleware(origin.app(), settings=_settings(tmp_path, origin_share=0.25, revalidate_pages=0))
    async with _client(gate) as crawler:
        for number in range(12):
            await crawler.get(f"/t/{number}", headers=GOOGLEBOT)
    assert gate.mark_changed("/t/*") == 12
    summary = await gate.regeneration.regenerator.run(Selection(dirty=True))
    assert summary.pages == 12
    # The origin worked for origin_seconds; the pass let at least three times that pass beside it (a floor only:
    # a slow machine makes it longer, never shorter).
    assert summary.seconds >= 0.9 * (summary.origin_seconds / 0.25 - summary.origin_seconds / 12 / 0.25)
    gate.core.close()


async def test_revalidation_finds_unannounced_changes_and_learns_change_rates(tmp_path: Path) -> None:
    origin = Origin()
    clock = Clock()
    gate = CrawlerGateMiddleware(
        origin.app(), settings=_settings(tmp_path, revalidate_pages=4, max_pages=4), clock=clock
    )
    async with _client(gate) as crawler:
        for number in range(6):
            for _ in range(number + 1):
                await crawler.get(f"/t/{number}", headers=GOOGLEBOT)
        gate.core.catalogue.flush_demand()
        regenerator = gate.regeneration.regenerator
        origin.version = 2  # every page changed, and nobody said so
        origin.fetched.clear()
        clock.now += 86400
        summary = await regenerator.run(Selection(dirty=True, revalidate=True))
        assert summary.revalidated == 4 and summary.revalidations_changed == 4
        assert len(set(origin.fetched)) == 4 and "/t/5" in origin.fetched  # the most wanted come first
        served = await crawler.get("/t/5", headers=GOOGLEBOT)
        assert "version 2" in served.text
        histories = gate.regeneration.state.histories()
        assert sum(history.changes for history in histories.values()) == 4
        yesterday = set(origin.fetched)
        origin.fetched.clear()
        clock.now += 86400
        second = await regenerator.run(Selection(dirty=False, revalidate=True))
        # The schedule runs on from its credits: a page not fetched yesterday comes up now.
        assert second.revalidated == 4 and set(origin.fetched) - yesterday
        totals = gate.regeneration.status()
        assert totals["last_window"] is None  # passes outside a window or the command record nothing
    gate.core.close()


def test_the_auto_window_is_the_quietest_hour_and_4_am_until_a_day_is_counted(tmp_path: Path) -> None:
    state = RegenerationState(tmp_path / DIRTY_INDEX_FILE)
    state.start()
    clock = Clock()
    window = Window(RegenerateSettings(window="auto", timezone="UTC"), state, clock=clock)
    assert window.hour(clock.now) == (4, False)
    first = int(clock.now // 3600) - 7 * 24
    for hour in range(first, first + 7 * 24):
        # A diurnal profile: busiest at 15:00 UTC, quietest at 03:00.
        local = hour % 24
        state.add_human_requests(hour, round(1000 + 900 * math.cos(2 * math.pi * (local - 15) / 24)))
    clock.now += 86400  # the next day: learned again
    assert window.hour(clock.now) == (3, True)
    day = datetime.fromtimestamp(clock.now, UTC).replace(hour=3, minute=0, second=30).timestamp()
    assert window.opened_at(day - 60) is None and window.opened_at(day) == day - 30
    assert window.next_start(day - 60) == day - 30 and window.per_day(day) == 1
    state.close()
    assert quietest_hour({}, clock.now, UTC) is None
    assert quietest_hour({int(clock.now // 3600) - 5: 10}, clock.now, UTC) is None  # less than a day


def test_a_cron_window_and_bad_windows(tmp_path: Path) -> None:
    state = RegenerationState(tmp_path / DIRTY_INDEX_FILE)
    state.start()
    weekdays = Window(RegenerateSettings(window="30 3 * * 1-5", timezone="UTC", max_seconds=600), state)
    saturday = datetime(2026, 11, 28, 3, 35, tzinfo=UTC).timestamp()
    monday = datetime(2026, 11, 30, 3, 35, tzinfo=UTC).timestamp()
    assert weekdays.opened_at(saturday) is None and weekdays.opened_at(monday) == monday - 300
    assert weekdays.opened_at(monday + 600) is None  # ten minutes long
    assert weekdays.per_day(monday) == pytest.approx(5 / 7)
    for bad in ("61 3 * * *", "0 4 * * 8", "0 4 * * 5-2/0"):
        with pytest.raises(ConfigError, match="regenerate.window"):
            Window(RegenerateSettings(window=bad), state)
    # Crontab's Sunday is 0 or 7; APScheduler 3's 0 is Monday: the days are translated, not taken as numbers.
    assert crontab_weekdays("1-5") == "mon,tue,wed,thu,fri" and crontab_weekdays("0") == crontab_weekdays("7") == "sun"
    assert crontab_weekdays("*/2") == "sun,tue,thu,sat" and crontab_weekdays("5-7") == "sun,fri,sat"
    state.close()


def test_the_lease_lets_one_holder_at_a_time_and_takes_over_from_a_dead_one(
    tmp_path: Path, memcached_server: MemcachedServer
) -> None:
    state = RegenerationState(tmp_path / DIRTY_INDEX_FILE)
    state.start()
    first, second = Lease(state, None, ttl_s=60), Lease(state, None, ttl_s=60)
    assert first.take() is None and second.take() == first.holder
    first.release()
    assert second.take() is None
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = Lease(state, None, ttl_s=60)
    orphan.holder = f"{orphan.holder.split(':')[0]}:{dead.pid}:killed"
    second.release()
    assert orphan.take() is None and first.take() is None  # its process is gone: taken over
    gate = create_app(
        Settings(
            server=ServerSettings(origin="http://127.0.0.1:9"),
            l1=L1Settings(memcached=(memcached_server.address,)),
            l2=L2Settings(cache_dir=str(tmp_path / "l2")),
        )
    )
    shared = [Lease(state, gate.cache.l1, ttl_s=60) for _ in range(2)]
    assert shared[0].take() is None and shared[1].take() == shared[0].holder
    shared[0].release()
    assert shared[1].take() is None
    shared[1].release()
    gate.core.close()
    state.close()


def _populate(cache_dir: Path, origin_url: str, pages: int) -> None:
    """Store ``pages`` pages through a gate on ``cache_dir`` and mark them all changed."""
    settings = Settings(
        server=ServerSettings(origin=origin_url),
        l2=L2Settings(cache_dir=str(cache_dir)),
        regenerate=RegenerateSettings(enabled=False),
    )
    gate = create_app(settings)
    server = ServerThread(gate).start()
    try:
        with httpx.Client(base_url=server.url, headers=GOOGLEBOT) as client:
            for number in range(pages):
                assert client.get(f"/t/{number}").status_code == 200
        assert gate.mark_changed("/t/*") == pages
    finally:
        server.stop()


def test_a_pass_killed_half_way_loses_no_mark_and_leaves_no_half_page(tmp_path: Path) -> None:
    origin = Origin()
    site = ServerThread(origin.app()).start()
    cache_dir = tmp_path / "l2"
    try:
        _populate(cache_dir, site.url, 300)
        origin.version, origin.delay_s = 2, 0.02
        origin.fetched.clear()
        command = [sys.executable, "-m", "crawlergate", "regenerate", "--origin", site.url]
        command += ["--cache-dir", str(cache_dir), "--concurrency", "2", "--rate", "0", "--origin-share", "0"]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while len(origin.fetched) < 60:
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.01)
        process.send_signal(signal.SIGKILL)
        process.wait()
    finally:
        site.stop()
    for leftover in cache_dir.rglob(".tmp-*"):  # a killed write's, met by the next start a while later
        os.utime(leftover, (time.time() - 120, time.time() - 120))
    store = DiskStore(cache_dir, max_bytes=1 << 30)
    store.start()
    assert store.wait_loaded(30)  # the load drops the temporary files of writes that cannot be under way
    assert not [name for _, _, files in os.walk(cache_dir) for name in files if name.startswith(".tmp-")]
    index = PageCatalogue(cache_dir / DIRTY_INDEX_FILE)
    index.start()
    dirty = set(index.dirty_digests())
    regenerated = 0
    for digest in store.digests():
        page = Page.from_bytes(store.get(digest) or b"", verify=True)  # every file whole
        if b"version 2" in page.body():
            regenerated += 1
        else:
            assert digest in dirty  # not regenerated: still marked
    assert 0 < regenerated < 300 and len(dirty) >= 300 - regenerated
    index.close()


def test_two_serve_processes_never_regenerate_at_once(tmp_path: Path) -> None:
    origin = Origin(delay_s=0.01)
    site = ServerThread(origin.app()).start()
    cache_dir = tmp_path / "l2"
    processes: list[subprocess.Popen[bytes]] = []
    try:
        _populate(cache_dir, site.url, 80)
        origin.version = 2
        origin.fetched.clear()
        origin.busiest = 0
        environment = {
            **os.environ,
            "CRAWLERGATE_REGENERATE_ENABLED": "true",
            "CRAWLERGATE_REGENERATE_WINDOW": "* * * * *",  # a window opens every minute, 50 s long
            "CRAWLERGATE_REGENERATE_MAX_SECONDS": "50",
            "CRAWLERGATE_REGENERATE_CHECK_SECONDS": "0.2",
            "CRAWLERGATE_REGENERATE_CONCURRENCY": "2",
            "CRAWLERGATE_REGENERATE_RATE": "0",
            "CRAWLERGATE_REGENERATE_ORIGIN_SHARE": "0",
            "CRAWLERGATE_REGENERATE_REVALIDATE_PAGES": "0",
        }
        ports = [free_port(), free_port()]
        for port in ports:
            command = [sys.executable, "-m", "crawlergate", "serve", "--origin", site.url, "--port", str(port)]
            command += ["--cache-dir", str(cache_dir)]
            processes.append(
                subprocess.Popen(command, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            )
        deadline = time.monotonic() + 60
        for port in ports:  # both listening before counting: a window may open as soon as one has started
            while True:
                try:
                    httpx.get(f"http://127.0.0.1:{port}/_crawlergate/healthz", timeout=5)
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, f"serve on port {port} did not start"
                    time.sleep(0.1)
        regenerated = 0
        while regenerated < 80:
            assert time.monotonic() < deadline, f"{regenerated} of 80 pages regenerated"
            time.sleep(0.2)
            regenerated = len({target for target in origin.fetched})
        time.sleep(1)  # both processes have ticked several times since
        assert len(origin.fetched) == 80  # each page once: one pass, in one process
        assert origin.busiest <= 2
        for port in ports:
            stats = httpx.get(f"http://127.0.0.1:{port}/_crawlergate/stats").json()
            # A window that opened in the test's first seconds may have been cut short: the next minute's did the rest.
            assert stats["dirty"] == 0 and stats["regeneration"]["last_window"]["pages"] >= 1
            assert stats["regeneration"]["running"] is False
    finally:
        for process in processes:
            process.terminate()
        logs = [process.communicate(timeout=20)[1].decode() for process in processes]
        site.stop()
    assert not any("Traceback" in log for log in logs), "\n".join(log for log in logs if "Traceback" in log)
    # One window did it all, or (started late in a minute) one cut short at its end and the next minute's: never
    # two at once (each page fetched once, at most `concurrency` fetches in flight, checked above).
    assert sum(log.count("regeneration window opened") for log in logs) in (1, 2), logs


def test_the_wsgi_gate_regenerates_in_its_background_thread(tmp_path: Path) -> None:
    version = {"now": 1}

    def site(environ, start_response):  # type: ignore[no-untyped-def]
        start_response("200 OK", [("Content-Type", "text/html")])
        return [f"<p>{environ['PATH_INFO']} version {version['now']}</p>".encode()]

    clock = Clock()
    gate = CrawlerGateWSGI(site, settings=_settings(tmp_path), clock=clock)
    with httpx.Client(transport=httpx.WSGITransport(app=gate), base_url="http://forum.test") as client:
        client.get("/t/1", headers=GOOGLEBOT)
        version["now"] = 2
        gate.mark_changed("/t/1")
        clock.now = datetime(2026, 11, 24, 4, 5, tzinfo=UTC).timestamp()
        job = gate.regeneration
        job.tick_blocking()
        deadline = time.monotonic() + 10
        while job.running:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert "version 2" in client.get("/t/1", headers=GOOGLEBOT).text
        assert job.status()["last_window"]["changed"] == 1
    gate.close()


async def test_a_pass_stopped_before_its_revalidations_keeps_their_credit(tmp_path: Path) -> None:
    origin = Origin(delay_s=0.05)
    gate = CrawlerGateMiddleware(
        origin.app(), settings=_settings(tmp_path, revalidate_pages=4, origin_share=0.01, concurrency=2)
    )
    async with _client(gate) as crawler:
        for number in range(14):
            await crawler.get(f"/t/{number}", headers=GOOGLEBOT)
    gate.core.catalogue.flush_demand()
    assert gate.mark_changed("/t/1*") == 5  # t=1, 10..13
    regenerator = gate.regeneration.regenerator
    summary = await regenerator.run(Selection(dirty=True, revalidate=True), time_limit_s=1.0)
    # The first two fetches cost the origin 0.1 s: at a share of 0.01 the next may start 10 s later, after the
    # limit, so the pass ends there (it does not sleep through it and fetch late).
    assert summary.pages <= 2 and summary.stopped == "time limit" and summary.revalidated == 0
    credits = [history.credit for history in gate.regeneration.state.histories().values()]
    assert credits and all(credit >= 0 for credit in credits)  # no turn spent on a page not fetched
    regenerator.stop()
    stopped = await regenerator.run(Selection(dirty=True))
    assert stopped.pages == 0 and stopped.stopped == "shutdown"
    gate.core.close()


def test_stats_with_the_job_off_report_the_commands_passes(tmp_path: Path) -> None:
    def site(environ, start_response):  # type: ignore[no-untyped-def]
        start_response("200 OK", [("Content-Type", "text/html")])
        return [b"<p>page</p>"]

    gate = CrawlerGateWSGI(site, settings=_settings(tmp_path, enabled=False))
    with httpx.Client(transport=httpx.WSGITransport(app=gate), base_url="http://forum.test") as client:
        stats = client.get("/_crawlergate/stats").json()
        assert stats["regeneration"]["enabled"] is False and stats["regeneration"]["next_window"] is None
        assert "crawlergate_regeneration_running 0" in client.get("/_crawlergate/metrics").text
    gate.close()


def test_a_page_another_process_stored_is_dropped_from_memory_even_when_marked_again(tmp_path: Path) -> None:
    one, other = PageCatalogue(tmp_path / "dirty.sqlite3"), PageCatalogue(tmp_path / "dirty.sqlite3")
    one.start()
    other.start()
    replaced: list[str] = []
    one.on_replaced = replaced.extend
    other.record_stored("d1", "/t/1")
    other.mark(["d1"], "api")  # a reply right after the regeneration, before `one` looks
    one.refresh()
    assert replaced == ["d1"]
    one.record_stored("d2", "/t/2")  # its own store: nothing to drop
    one.refresh()
    assert replaced == ["d1"]
    one.close()
    other.close()


def test_windows_as_cron_and_clocks_read_them(tmp_path: Path) -> None:
    state = RegenerationState(tmp_path / DIRTY_INDEX_FILE)
    # Day of month and day of week both given: cron runs on either (the 1st and 15th, and every Monday).
    either = Window(RegenerateSettings(window="0 4 1,15 * 1", timezone="UTC", max_seconds=600), state)
    for day in (datetime(2026, 12, 1, 4, 5, tzinfo=UTC), datetime(2026, 12, 7, 4, 5, tzinfo=UTC)):
        assert either.opened_at(day.timestamp()) == day.timestamp() - 300
    assert either.opened_at(datetime(2026, 12, 8, 4, 5, tzinfo=UTC).timestamp()) is None
    assert crontab_weekdays("7-7") == "sun"
    # The hour the clocks go back: 02:30 comes twice, one window.
    berlin = Window(RegenerateSettings(window="02:30", timezone="Europe/Berlin"), state)
    first = datetime(2026, 10, 25, 0, 30, tzinfo=UTC).timestamp()
    assert berlin.opened_at(first + 60) == first and berlin.opened_at(first + 3660) == first + 3600
    assert berlin.same_window(first, first + 3600) and not berlin.same_window(first, first + 86400)
    # A zone half an hour off UTC: the learnt window opens on its half hour, when the hour counted begins.
    india = Window(RegenerateSettings(window="auto", timezone="Asia/Kolkata"), state)
    start = india.next_start(NOON)
    assert start is not None and datetime.fromtimestamp(start, UTC).minute == 0
    state.close()


async def test_shutdown_lets_a_tick_under_way_end_rather_than_cancel_it(tmp_path: Path) -> None:
    """A tick waiting in its thread for another process's write (two `serve` processes share the state) is let end
    at shutdown: the scheduler logs a tick cancelled there as a failed job, with a traceback."""
    gate = CrawlerGateMiddleware(Origin().app(), settings=_settings(tmp_path))
    gate.start_serving()
    other_process = sqlite3.connect(gate.regeneration.state.path, isolation_level=None)
    other_process.execute("BEGIN IMMEDIATE")
    loop = asyncio.get_running_loop()
    ticking = loop.create_task(gate.regeneration.tick_async())
    await asyncio.sleep(0.3)
    assert not ticking.done()  # waiting for the other process's write
    loop.call_later(1.0, other_process.execute, "COMMIT")
    await gate.aclose()
    other_process.close()
    assert ticking.done() and not ticking.cancelled() and ticking.exception() is None
