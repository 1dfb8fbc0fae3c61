"""The demo forum: a seeded, deterministic site whose pages, 404s, personal logged-in views and replies
behave as a real forum's do."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from crawlergate.demo.forum import create_forum
from crawlergate.demo.seed import post_text, seed_database

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("forum") / "forum.sqlite3"
    seed_database(path, threads=300, seed=7)
    return path


def _client(db: Path) -> httpx.AsyncClient:
    app = create_forum(db, threads=300, seed=7, work_ms=1, rounds_per_ms=100)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://forum.test")


def test_seed_is_deterministic_and_reused(tmp_path: Path) -> None:
    first = seed_database(tmp_path / "a.sqlite3", threads=120, seed=3)
    second = seed_database(tmp_path / "b.sqlite3", threads=120, seed=3)
    assert first == second and first.threads == 120 and first.posts >= 120
    mtime = (tmp_path / "a.sqlite3").stat().st_mtime_ns
    assert seed_database(tmp_path / "a.sqlite3", threads=120, seed=3) == first
    assert (tmp_path / "a.sqlite3").stat().st_mtime_ns == mtime
    assert seed_database(tmp_path / "a.sqlite3", threads=150, seed=3).threads == 150
    assert post_text(42) == post_text(42) != post_text(43)


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        pytest.param("/", "Recently active", id="front"),
        pytest.param("/forumdisplay.php?f=1", "replies", id="forum"),
        pytest.param("/showthread.php?t=5", 'class="post"', id="thread"),
        pytest.param("/t/5", 'class="post"', id="thread-plain"),
        pytest.param("/f/1/page/1", "replies", id="forum-plain"),
        pytest.param("/member.php?u=2", "Joined", id="member"),
        pytest.param("/sitemap.xml", "showthread.php?t=1<", id="sitemap"),
    ],
)
async def test_forum_pages(db: Path, url: str, needle: str) -> None:
    async with _client(db) as client:
        response = await client.get(url)
    assert response.status_code == 200 and needle in response.text
    assert "unread messages" not in response.text


@pytest.mark.parametrize(
    "url", ["/showthread.php?t=999999", "/forumdisplay.php?f=0", "/member.php?u=abc", "/t/999999", "/t/5/page/99"]
)
async def test_forum_missing_pages_are_404(db: Path, url: str) -> None:
    async with _client(db) as client:
        assert (await client.get(url)).status_code == 404


async def test_forum_logged_in_view_is_personal_and_private(db: Path) -> None:
    async with _client(db) as client:
        await client.post("/login", data={"member": "4"})
        page = await client.get("/showthread.php?t=5")
        client.cookies.set("sessionid", "4.forged")
        forged = await client.get("/showthread.php?t=5")
    assert "Logged in as member4" in page.text and "unread messages" in page.text
    assert page.headers["cache-control"] == "private, no-store"
    assert "Logged in" not in forged.text


async def test_forum_reply_changes_the_thread_page(db: Path) -> None:
    async with _client(db) as client:
        guest = await client.post("/newreply.php", data={"t": "5"})
        before = (await client.get("/showthread.php?t=5")).text
        await client.post("/login", data={"member": "4"})
        reply = await client.post("/newreply.php?t=5")
        client.cookies.clear()
        after = (await client.get("/showthread.php?t=5")).text
    assert guest.status_code == 403
    assert reply.status_code == 303 and reply.headers["location"].startswith("/showthread.php?t=5")
    assert before != after
