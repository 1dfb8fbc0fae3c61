"""One runtime starts and closes a gate, whichever path runs it: the ASGI lifespan (as `serve` runs it, through
uvicorn), the WSGI adapter's close(), `warm` and `regenerate`. Each must close every part it opened."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from crawlergate import CrawlerGateMiddleware, CrawlerGateWSGI, create_app
from crawlergate.adapters import proxy
from crawlergate.cli import main
from crawlergate.config import CacheSettings, L2Settings, LogSettings, RegenerateSettings, ServerSettings, Settings
from crawlergate.demo.forum import create_forum
from crawlergate.demo.seed import seed_database
from crawlergate.wiring import GateRuntime
from tests.conftest import ServerThread
from tests.visitors import FIREFOX, GOOGLEBOT

pytestmark = pytest.mark.e2e


def open_parts(runtime: GateRuntime) -> list[str]:
    """The parts of ``runtime`` still open."""
    parts = {
        "filler pool": not runtime.filler._pool._shutdown,  # type: ignore[attr-defined]
        "access log": runtime.access_log is not None and runtime.access_log._thread is not None,
        "page catalogue": runtime.core.catalogue._connection is not None,
        "regeneration records": runtime.regeneration.state._connection is not None,
        "scheduler": runtime.scheduler is not None,
    }
    return [name for name, still_open in parts.items() if still_open]


@pytest.fixture
def forum(tmp_path: Path) -> Iterator[ServerThread]:
    db = tmp_path / "forum.sqlite3"
    seed_database(db, threads=20, seed=3)
    server = ServerThread(create_forum(db, threads=20, seed=3)).start()
    yield server
    server.stop()


def _settings(tmp_path: Path, **server: Any) -> Settings:
    return Settings(
        server=ServerSettings(**server),
        l2=L2Settings(cache_dir=str(tmp_path / "l2")),
        log=LogSettings(access_log=str(tmp_path / "access.log")),
        regenerate=RegenerateSettings(enabled=True),
    )


def test_runtime_the_asgi_lifespan_closes_every_part(forum: ServerThread, tmp_path: Path) -> None:
    gate = create_app(_settings(tmp_path, origin=forum.url))
    server = ServerThread(gate).start()
    try:
        with httpx.Client(base_url=server.url) as client:
            assert client.get("/showthread.php?t=1", headers=GOOGLEBOT).status_code == 200
        assert open_parts(gate.runtime) == ["filler pool", "access log", "page catalogue", "scheduler"]
    finally:
        server.stop()
    assert open_parts(gate.runtime) == []


def test_runtime_a_mounted_asgi_gate_closes_every_part(forum: ServerThread, tmp_path: Path) -> None:
    gate = CrawlerGateMiddleware(forum.server.config.app, settings=_settings(tmp_path))
    server = ServerThread(gate).start()
    with httpx.Client(base_url=server.url) as client:
        assert client.get("/showthread.php?t=1", headers=GOOGLEBOT).status_code == 200
    server.stop()
    assert open_parts(gate.runtime) == []


def test_runtime_the_wsgi_close_closes_every_part(tmp_path: Path) -> None:
    def site(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("200 OK", [("Content-Type", "text/html")])
        return [b"<p>hello</p>" * 100]

    gate = CrawlerGateWSGI(site, settings=_settings(tmp_path))
    with _wsgi_client(gate) as client:
        assert "hello" in client.get("/t/1", headers=GOOGLEBOT).text
    assert "scheduler" in open_parts(gate.runtime)
    gate.close()
    assert open_parts(gate.runtime) == []


def test_runtime_warm_and_regenerate_close_every_part(
    forum: ServerThread, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[CrawlerGateMiddleware] = []

    def remembered(settings: Settings) -> CrawlerGateMiddleware:
        built.append(create_app(settings))
        return built[-1]

    monkeypatch.setattr(proxy, "create_app", remembered)
    urls = tmp_path / "urls.txt"
    urls.write_text("/showthread.php?t=1\n/showthread.php?t=2\n")
    where = ["--origin", forum.url, "--cache-dir", str(tmp_path / "l2")]
    assert main(["warm", "--urls", str(urls), *where]) == 0
    assert main(["regenerate", "--all", *where]) == 0
    assert len(built) == 2
    for gate in built:
        assert open_parts(gate.runtime) == []
        assert gate.app._transport._open == set()  # type: ignore[attr-defined]  # the origin's connections too


def _forum_wsgi(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    if environ["REQUEST_METHOD"] == "POST":
        environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        start_response("303 See Other", [("Location", "/showthread.php?t=8")])
        return [b""]
    start_response("200 OK", [("Content-Type", "text/html")])
    return [b"<p>thread 8</p>" * 50]


def _wsgi_client(gate: CrawlerGateWSGI) -> httpx.Client:
    return httpx.Client(transport=httpx.WSGITransport(app=gate), base_url="http://forum.test")


def test_runtime_a_wsgi_close_runs_queued_write_marks_before_closing_the_stores(tmp_path: Path) -> None:
    """A reply's marks queued behind other background work are written before close() closes the catalogue."""
    settings = Settings(l2=L2Settings(cache_dir=str(tmp_path / "l2")), cache=CacheSettings(sites=("demo-forum",)))
    gate = CrawlerGateWSGI(_forum_wsgi, settings=settings)

    with _wsgi_client(gate) as client:
        client.get("/showthread.php?t=8", headers=GOOGLEBOT)
        for _ in range(2):  # both background threads busy: the reply's marks wait in the queue
            gate.background(lambda: time.sleep(0.3))
        member = {**FIREFOX, "cookie": "sessionid=4.abc"}
        assert client.post("/newreply.php", data={"t": "8", "message": "hello"}, headers=member).status_code == 303
    gate.close()
    reopened = CrawlerGateWSGI(_forum_wsgi, settings=settings)
    try:
        reopened.start()
        assert reopened.stats()["dirty"] == 1
    finally:
        reopened.close()


@pytest.mark.anyio
async def test_runtime_an_asgi_app_that_fails_after_answering_marks_nothing(tmp_path: Path) -> None:
    """Write rules follow a write the site completed: an app that raises after its last body byte (a failed
    background task) made no change the gate can vouch for."""

    async def failing_forum(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["method"] == "POST":
            await send({"type": "http.response.start", "status": 303, "headers": [(b"location", b"/t/8")]})
            await send({"type": "http.response.body", "body": b""})
            raise RuntimeError("the task after the answer failed")
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/html")]})
        await send({"type": "http.response.body", "body": b"<p>thread 8</p>" * 50})

    settings = Settings(l2=L2Settings(cache_dir=str(tmp_path / "l2")), cache=CacheSettings(sites=("demo-forum",)))
    gate = CrawlerGateMiddleware(failing_forum, settings=settings)
    transport = httpx.ASGITransport(app=gate, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gate.test") as client:
        await client.get("/showthread.php?t=8", headers=GOOGLEBOT)
        form = {"cookie": "sessionid=4.abc", **FIREFOX}
        await client.post("/newreply.php", data={"t": "8"}, headers=form)
    await gate.drain()
    assert gate.stats()["dirty"] == 0 and gate.core.valve.in_flight == 0
    await gate.aclose()


# A fresh interpreter: whether anyio's asyncio backend was imported before and after the lifespan's start-up.
BACKEND_AT_START_UP = """
import asyncio, sys
from crawlergate import CrawlerGateMiddleware
from crawlergate.config import L2Settings, Settings

async def site(scope, receive, send):
    while (await receive())["type"] != "lifespan.shutdown":
        await send({"type": "lifespan.startup.complete"})
    await send({"type": "lifespan.shutdown.complete"})

async def main():
    gate = CrawlerGateMiddleware(site, settings=Settings(l2=L2Settings(cache_dir=sys.argv[1])))
    messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])
    seen = ["anyio._backends._asyncio" in sys.modules]

    async def receive():
        message = next(messages)
        if message["type"] == "lifespan.shutdown":
            seen.append("anyio._backends._asyncio" in sys.modules)
        return message

    async def send(message):
        pass

    await gate({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, receive, send)
    print(*seen)

asyncio.run(main())
"""


def test_runtime_start_up_imports_what_the_first_fill_would_on_the_event_loop(tmp_path: Path) -> None:
    """anyio imports its asyncio backend at the first thread hop: 30 ms of the event loop, once. The gate's
    start-up does it, so it never falls on the first crawler's fill."""
    run = subprocess.run([sys.executable, "-c", BACKEND_AT_START_UP, str(tmp_path / "l2")], capture_output=True,
                         text=True, check=True, timeout=60)  # fmt: skip
    assert run.stdout.split() == ["False", "True"]
