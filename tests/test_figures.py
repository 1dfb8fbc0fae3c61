"""The figures of a running ``crawlergate serve``, with one and two workers: stats JSON and Prometheus text
equal what a test sent, per class, family and outcome, whichever worker answers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from crawlergate.demo.forum import create_forum
from tests.conftest import ServerThread, serve_process

pytestmark = pytest.mark.e2e

GOOGLEBOT = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"
BINGBOT = "Mozilla/5.0 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)"
FIREFOX = "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0"


@pytest.fixture(scope="module")
def forum(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    server = ServerThread(create_forum(tmp_path_factory.mktemp("forum") / "forum.sqlite3", threads=50, work_ms=1))
    yield server.start()
    server.stop()


def _send_known_traffic(gate: str) -> None:
    """5 pages twice by Googlebot, 3 once by Bingbot, 7 page views by a person; each on a new connection."""
    for _ in range(2):
        for thread in range(1, 6):
            assert httpx.get(f"{gate}/showthread.php?t={thread}", headers={"user-agent": GOOGLEBOT}).status_code == 200
    for thread in range(10, 13):
        httpx.get(f"{gate}/showthread.php?t={thread}", headers={"user-agent": BINGBOT})
    for thread in range(20, 27):
        httpx.get(f"{gate}/showthread.php?t={thread}", headers={"user-agent": FIREFOX})


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_figures_equal_the_traffic_sent_whichever_worker_answers(
    forum: ServerThread, tmp_path: Path, workers: int
) -> None:
    with serve_process(forum.url, tmp_path, workers=workers) as gate:
        _send_known_traffic(gate)
        scrapes = [httpx.get(f"{gate}/_crawlergate/metrics").text for _ in range(8)]
        stats = [httpx.get(f"{gate}/_crawlergate/stats").json() for _ in range(8)]
    for text in scrapes:
        samples = _samples(text)

        def requests(kind: str, outcome: str, samples: dict = samples) -> float:
            return samples[("crawlergate_requests_total", (("class", kind), ("outcome", outcome)))]

        hits = requests("crawler", "l1-hit") + requests("crawler", "l2-hit")
        assert (requests("crawler", "miss"), hits, requests("human", "pass")) == (8, 5, 7)
        family = "crawlergate_family_requests_total"
        googlebot = [(("family", "Googlebot"), ("outcome", outcome), ("tag", "search-engine")) for outcome in
                     ("miss", "l1-hit", "l2-hit")]  # fmt: skip
        assert samples[(family, googlebot[0])] == 5
        assert samples.get((family, googlebot[1]), 0) + samples.get((family, googlebot[2]), 0) == 5
        assert samples[(family, (("family", "Bingbot"), ("outcome", "miss"), ("tag", "search-engine")))] == 3
        assert samples[("crawlergate_origin_fetches_total", ())] == 8
        assert samples[("crawlergate_ttfb_seconds_count", (("class", "crawler"),))] == 13
    for data in stats:
        assert data["processes"] == workers
        assert (data["crawler"]["requests"], data["crawler"]["misses"], data["human"]["requests"]) == (13, 8, 7)
        assert data["families"]["Googlebot"]["requests"] == 10 and data["families"]["Googlebot"]["hits"] == 5
        assert data["families"]["Bingbot"] == {
            "tag": "search-engine",
            "requests": 3,
            "hits": 0,
            "outcomes": {"miss": 3},
        }
        assert data["origin"]["requests"] == 8 and data["origin_time_saved_s"] > 0
        assert data["crawler_share"]["requests"] == round(13 / 20, 4)
