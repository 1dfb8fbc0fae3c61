"""Several gates sharing a memcached cluster as L1, as on several machines behind a load balancer: three
memcached servers, two ``crawlergate serve`` processes with L2 folders of their own."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from crawlergate.demo.forum import create_forum
from tests.conftest import MemcachedServer, ServerThread, serve_process
from tests.visitors import GOOGLEBOT

pytestmark = [pytest.mark.e2e, pytest.mark.memcached]


@pytest.fixture
def cluster() -> Iterator[list[MemcachedServer]]:
    servers = [MemcachedServer() for _ in range(3)]
    for server in servers:
        server.start()
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def forum(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    server = ServerThread(create_forum(tmp_path_factory.mktemp("forum") / "forum.sqlite3", threads=60, work_ms=1))
    yield server.start()
    server.stop()


def test_two_gates_share_one_memcached_cluster_and_outlive_one_of_its_servers(
    forum: ServerThread, cluster: list[MemcachedServer], tmp_path: Path
) -> None:
    servers = ", ".join(f'"{server.address}"' for server in cluster)
    # A failed server is retried after a second here (10 s by default); the gates trust a page they read for 0.
    config = f"[l1]\nmemcached = [{servers}]\ndead_retry_seconds = 1\nlocal_ttl_ms = 0\n[regenerate]\nenabled = false\n"
    pages = [f"/showthread.php?t={number}" for number in range(1, 31)]
    with ExitStack() as stack:
        first = stack.enter_context(serve_process(forum.url, tmp_path / "a", config))
        second = stack.enter_context(serve_process(forum.url, tmp_path / "b", config))

        def crawl(gate: str) -> list[str]:
            answers = [httpx.get(gate + page, headers=GOOGLEBOT) for page in pages]
            assert [answer.status_code for answer in answers] == [200] * len(pages)
            return [answer.headers["x-crawlergate"] for answer in answers]

        assert crawl(first) == ["miss"] * len(pages)
        # Filled through one gate, an L1 hit through the other, which has none of them in its own L2.
        assert crawl(second) == ["l1-hit"] * len(pages)

        cluster[1].stop()
        # Every crawler request is still answered: the lost server's pages come from L2 (or the site, for the
        # gate whose L2 never had them) and are stored again on the servers that remain.
        during = crawl(second) + crawl(first)
        assert set(during) <= {"l1-hit", "l2-hit", "miss"} and "l1-hit" in during
        assert crawl(second) == ["l1-hit"] * len(pages)  # refilled on the other two

        cluster[1].start()  # on its port again
        time.sleep(1.5)  # past the gates' back-off (1 s): the next call to it empties it and takes it back
        rejoined = crawl(second)
        assert set(rejoined) == {"l1-hit", "l2-hit"}  # its pages come from L2 once, and are stored on it again
        assert crawl(second) == ["l1-hit"] * len(pages) and set(crawl(first)) <= {"l1-hit", "l2-hit"}
        stats = httpx.get(first + "/_crawlergate/stats").json()
        assert stats["crawler"]["errors"] == 0 and stats["crawler"]["misses"] == len(pages)


def test_a_page_marked_through_one_gate_is_changed_for_the_other(
    forum: ServerThread, cluster: list[MemcachedServer], tmp_path: Path
) -> None:
    """Each machine has its own page catalogue; the mark travels beside the page in memcached. With
    max_stale_seconds = 0 a changed page is fetched again at once, which shows that the other gate saw it."""
    servers = ", ".join(f'"{server.address}"' for server in cluster)
    config = (
        f"[l1]\nmemcached = [{servers}]\nlocal_ttl_ms = 200\n[cache]\nmax_stale_seconds = 0\n"
        '[admin]\ntoken = "t0k"\n[regenerate]\nenabled = false\n'
    )
    with ExitStack() as stack:
        first = stack.enter_context(serve_process(forum.url, tmp_path / "a", config))
        second = stack.enter_context(serve_process(forum.url, tmp_path / "b", config))
        for page in ("/showthread.php?t=40", "/showthread.php?t=41"):
            assert httpx.get(first + page, headers=GOOGLEBOT).headers["x-crawlergate"] == "miss"
            assert httpx.get(second + page, headers=GOOGLEBOT).headers["x-crawlergate"] == "l1-hit"
        marked = httpx.post(
            first + "/_crawlergate/invalidate",
            json={"urls": ["/showthread.php?t=40"]},
            headers={"authorization": "Bearer t0k"},
        )
        assert marked.json() == {"marked": 1}
        time.sleep(0.3)  # past the other gate's l1.local_ttl_ms
        assert httpx.get(second + "/showthread.php?t=40", headers=GOOGLEBOT).headers["x-crawlergate"] == "miss"
        assert httpx.get(second + "/showthread.php?t=41", headers=GOOGLEBOT).headers["x-crawlergate"] == "l1-hit"
        # The page fetched again is newer than the mark: both gates take it as it is.
        assert httpx.get(second + "/showthread.php?t=40", headers=GOOGLEBOT).headers["x-crawlergate"] == "l1-hit"
