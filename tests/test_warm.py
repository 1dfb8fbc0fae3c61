"""`crawlergate warm` against the demo forum: every page once, within its concurrency, resumable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crawlergate.cli import main
from crawlergate.demo.forum import create_forum
from crawlergate.demo.seed import seed_database
from tests.conftest import ServerThread

pytestmark = pytest.mark.e2e
THREADS = 120


class CountingOrigin:
    """The demo forum, with its page requests counted and its concurrency measured."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.pages: list[str] = []
        self.in_flight = 0
        self.most_in_flight = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/showthread.php":
            await self.app(scope, receive, send)
            return
        self.pages.append(scope["query_string"].decode())
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


@pytest.fixture
def forum(tmp_path: Path) -> Iterator[tuple[ServerThread, CountingOrigin]]:
    db = tmp_path / "forum.sqlite3"
    seed_database(db, threads=THREADS, seed=5)
    origin = CountingOrigin(create_forum(db, threads=THREADS, seed=5, work_ms=3, rounds_per_ms=100))
    server = ServerThread(origin).start()
    yield server, origin
    server.stop()


def _warm(server: ServerThread, cache: Path, *source: str) -> list[str]:
    return ["warm", *source, "--origin", server.url, "--cache-dir", str(cache)]


def test_warm_fills_every_sitemap_page_once_within_its_concurrency(
    forum: tuple[ServerThread, CountingOrigin], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server, origin = forum
    summary = tmp_path / "warm.json"
    argv = _warm(server, tmp_path / "l2", "--sitemap", f"{server.url}/sitemap.xml", "--concurrency", "3")
    assert main([*argv, "--json", str(summary)]) == 0
    assert f"warm: {THREADS} pages: {THREADS} stored" in capsys.readouterr().out
    assert len(origin.pages) == THREADS and len(set(origin.pages)) == THREADS
    assert 1 < origin.most_in_flight <= 3
    assert main(_warm(server, tmp_path / "l2", "--sitemap", f"{server.url}/sitemap.xml")) == 0
    assert f"0 stored (0.0 MB gzip), {THREADS} already stored" in capsys.readouterr().out
    assert len(origin.pages) == THREADS  # the second warm fetched nothing
    assert '"stored": 120' in summary.read_text()


def test_warm_resumes_after_being_killed_without_refetching(
    forum: tuple[ServerThread, CountingOrigin], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server, origin = forum
    argv = _warm(server, tmp_path / "l2", "--sitemap", f"{server.url}/sitemap.xml")
    environment = {key: value for key, value in os.environ.items() if not key.startswith("CRAWLERGATE_")}
    slowly = [sys.executable, "-m", "crawlergate", *argv, "--rate", "60"]
    process = subprocess.Popen(slowly, env=environment, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while len(origin.pages) < THREADS // 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait(10)
    before = len(origin.pages)
    assert 0 < before < THREADS
    stored = len(list((tmp_path / "l2").rglob("*.page")))
    assert main(argv) == 0  # no rate limit the second time
    out = capsys.readouterr().out
    assert f"{stored:,} already stored" in out
    assert len(origin.pages) - before == THREADS - stored  # only what was not stored yet
    assert len(list((tmp_path / "l2").rglob("*.page"))) == THREADS


def test_warm_from_a_url_file_and_a_log(
    forum: tuple[ServerThread, CountingOrigin], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server, origin = forum
    urls = tmp_path / "urls.txt"
    urls.write_text("# pages to warm\n/showthread.php?t=1\nhttps://forum.example.org/showthread.php?t=2\n\n/login\n")
    assert main(_warm(server, tmp_path / "l2", "--urls", str(urls))) == 0
    out = capsys.readouterr().out
    assert "2 pages: 2 stored" in out and "1 URLs not cacheable" in out
    log = tmp_path / "access.log"
    line = '203.0.113.{n} - - [23/Nov/2026:04:00:0{n} +0000] "{method} {target} HTTP/1.1" {status} 512 "-" "Bot"\n'
    log.write_text(
        line.format(n=1, method="GET", target="/showthread.php?t=3", status=200)
        + line.format(n=2, method="POST", target="/newreply.php", status=303)
        + line.format(n=3, method="GET", target="/showthread.php?t=999999", status=404)
        + line.format(n=4, method="GET", target="/showthread.php?t=1", status=200)
    )
    assert main(_warm(server, tmp_path / "l2", "--log", str(log))) == 0
    assert "2 pages: 1 stored" in capsys.readouterr().out  # t=3 fetched, t=1 already stored
    assert sorted(origin.pages) == ["t=1", "t=2", "t=3"]
    missing = tmp_path / "nowhere.txt"
    assert main(_warm(server, tmp_path / "l2", "--urls", str(missing))) != 0
    assert "Cannot read" in capsys.readouterr().err
