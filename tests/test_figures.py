"""The figures of a running ``crawlergate serve``, with one and two workers: stats JSON and Prometheus text
equal what a test sent, per class, family and outcome, whichever worker answers."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from crawlergate import CrawlerGateMiddleware, CrawlerGateWSGI, create_app
from crawlergate.classify import Classifier
from crawlergate.cli import main
from crawlergate.config import L2Settings, LogSettings, RegenerateSettings, ServerSettings, Settings
from crawlergate.demo.forum import create_forum
from crawlergate.gate.accesslog import MAX_FIELD_BYTES, AccessLog
from crawlergate.gate.forwarded import TrustedProxies
from crawlergate.gate.request import Request
from crawlergate.tools.analyze import crawler_share
from crawlergate.tools.logparse import iter_records
from tests.browser import chromium, has_horizontal_scroll, screenshot
from tests.conftest import ServerThread, serve_process
from tests.visitors import BINGBOT_UA, FIREFOX, GOOGLEBOT

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def forum(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    server = ServerThread(create_forum(tmp_path_factory.mktemp("forum") / "forum.sqlite3", threads=50, work_ms=1))
    yield server.start()
    server.stop()


def _send_known_traffic(gate: str) -> None:
    """5 pages twice by Googlebot, 3 once by Bingbot, 7 page views by a person; each on a new connection."""
    for _ in range(2):
        for thread in range(1, 6):
            assert httpx.get(f"{gate}/showthread.php?t={thread}", headers=GOOGLEBOT).status_code == 200
    for thread in range(10, 13):
        httpx.get(f"{gate}/showthread.php?t={thread}", headers={"user-agent": BINGBOT_UA})
    for thread in range(20, 27):
        httpx.get(f"{gate}/showthread.php?t={thread}", headers=FIREFOX)


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_figures_equal_the_traffic_sent_whichever_worker_answers(
    forum: ServerThread, tmp_path: Path, workers: int, capsys: pytest.CaptureFixture[str]
) -> None:
    with serve_process(forum.url, tmp_path, workers=workers) as gate:
        _send_known_traffic(gate)
        scrapes = [httpx.get(f"{gate}/_crawlergate/metrics").text for _ in range(8)]
        stats = [httpx.get(f"{gate}/_crawlergate/stats").json() for _ in range(8)]
        assert main(["stats", "--url", gate]) == 0
    shown = capsys.readouterr().out
    assert "top crawler families: Googlebot 10 (50% hits); Bingbot 3 (0% hits)" in shown
    assert "crawler share: 65.0% of requests" in shown and f"{workers} process(es)" in shown
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


def test_serve_access_log_reads_back_with_the_same_crawler_share_as_stats(
    forum: ServerThread, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with serve_process(forum.url, tmp_path, workers=2) as gate:
        _send_known_traffic(gate)
        stats = httpx.get(f"{gate}/_crawlergate/stats").json()
    log = tmp_path / "l2" / "access.log"  # serve's default: beside L2; SIGTERM wrote what was queued
    lines = log.read_text().splitlines()
    records = list(iter_records(log))
    assert len(lines) == len(records) == 20  # admin requests (healthz, stats) are neither counted nor logged
    crawler_lines = [line for line in lines if "Googlebot" in line or "bingbot" in line]
    assert all(_tail(line)[1] in ("miss", "l1-hit", "l2-hit") for line in crawler_lines)
    assert all(_tail(line)[2] in ("crawler:Googlebot", "crawler:Bingbot") for line in crawler_lines)
    assert all(int(_tail(line)[0]) > 0 for line in lines)  # TTFB in microseconds
    assert {record.status for record in records} == {200}
    assert all(record.duration_s is not None for record in records)
    share = crawler_share(records, Classifier.from_settings(Settings().classify)).share("crawler", "requests")
    assert share == pytest.approx(stats["crawler_share"]["requests"], abs=1e-4)
    assert main(["analyze", str(log), "--json", str(tmp_path / "analyze.json")]) == 0
    capsys.readouterr()


def test_access_log_rotates_by_size_and_follows_a_moved_file(tmp_path: Path) -> None:
    log = AccessLog(tmp_path / "access.log", client_of=TrustedProxies(["127.0.0.1"]).client, max_bytes=2000, backups=2)
    log.start()
    request = Request(
        "GET",
        '/t"x',
        b"/t%22x",
        b'q="\\\xc3\xa9"',
        [(b"user-agent", b"Googlebot\x01"), (b"x-forwarded-for", b"203.0.113.9")],
        "127.0.0.1",
    )
    try:
        for _ in range(3):
            for _ in range(15):
                log.log(request, 200, 10, 0.412, "l1-hit")
            time.sleep(1.2)  # past a flush and the rotation check, both bounded in time
        (tmp_path / "access.log").rename(tmp_path / "moved.log")  # logrotate's create mode
        time.sleep(1.2)
        log.log(request, 200, 10, 0.412, "l1-hit")
    finally:
        log.close()
    assert (tmp_path / "access.log.1").exists() and not (tmp_path / "access.log.3").exists()
    assert (tmp_path / "access.log").read_text().count("\n") == 1
    line = (tmp_path / "access.log.1").read_text().splitlines()[0]
    # The forwarded client from a trusted proxy; quotes, backslashes, control and non-ASCII bytes as nginx writes them.
    assert re.fullmatch(
        r'203\.0\.113\.9 - - \[\d\d/\w{3}/\d{4}:\d\d:\d\d:\d\d \+0000\] "GET /t%22x\?q=\\x22\\x5C\\xC3\\xA9\\x22 '
        r'HTTP/1\.1" 200 10 "-" "Googlebot\\x01" 412 l1-hit "human" "-"',
        line,
    ), line


@pytest.mark.parametrize(
    "front_header",
    [(b"x-forwarded-for", b"203.0.113.9"), (b"x-real-ip", b"203.0.113.9"), (b"forwarded", b'for="203.0.113.9"')],
    ids=["x-forwarded-for", "x-real-ip", "forwarded"],
)
def test_access_log_names_the_client_a_trusted_front_names(tmp_path: Path, front_header: tuple[bytes, bytes]) -> None:
    """Whichever header the front names the client in, the log's client is the one the gate's decisions read."""
    log = AccessLog(tmp_path / "access.log", client_of=TrustedProxies(["127.0.0.1"]).client)
    log.start()
    try:
        log.log(Request("GET", "/", b"/", b"", [front_header], "127.0.0.1"), 200, 10, 0.4, "pass")
        log.log(Request("GET", "/", b"/", b"", [front_header], "198.51.100.7"), 200, 10, 0.4, "pass")
    finally:
        log.close()
    clients = [line.split(" ", 1)[0] for line in (tmp_path / "access.log").read_text().splitlines()]
    assert clients == ["203.0.113.9", "198.51.100.7"]  # an untrusted peer's header names nobody


def test_serve_access_log_stays_under_its_size_in_a_burst(forum: ServerThread, tmp_path: Path) -> None:
    """A crawler burst for 60 s at full speed: the file never passes log.access_max_bytes (one worker: the
    file is rotated before a batch would cross it), the backups are kept, no more."""
    limit = 60_000
    config = f"[log]\naccess_max_bytes = {limit}\naccess_backups = 2\n"
    largest = 0
    with serve_process(forum.url, tmp_path, config) as gate:
        log = tmp_path / "l2" / "access.log"
        stop = threading.Event()

        def burst() -> None:
            with httpx.Client(base_url=gate, headers=GOOGLEBOT) as client:
                for number in range(1_000_000):  # bounded: stopped after 60 s
                    if stop.is_set():
                        return
                    client.get(f"/showthread.php?t={number % 20 + 1}")

        workers = [threading.Thread(target=burst) for _ in range(4)]
        for worker in workers:
            worker.start()
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline:
                with contextlib.suppress(FileNotFoundError):  # between a rotation's rename and the new file
                    largest = max(largest, log.stat().st_size)
                time.sleep(0.1)
        finally:
            stop.set()
            for worker in workers:
                worker.join()
    assert 0 < largest <= limit
    assert (tmp_path / "l2" / "access.log.2").exists() and not (tmp_path / "l2" / "access.log.3").exists()


def test_wsgi_gate_writes_the_access_log_when_configured(tmp_path: Path) -> None:
    def site(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/html")])
        return [b"<p>a page</p>", b"<p>more</p>"]

    settings = Settings(
        l2=L2Settings(cache_dir=str(tmp_path / "l2")), log=LogSettings(access_log=str(tmp_path / "wsgi.log"))
    )
    gate = CrawlerGateWSGI(site, settings=settings)
    with httpx.Client(transport=httpx.WSGITransport(app=gate), base_url="http://site.test") as client:
        client.get("/a page?x=1", headers=GOOGLEBOT)
        client.get("/a page?x=1", headers=GOOGLEBOT)
        client.get("/b", headers={**FIREFOX, "referer": "http://site.test/a"})
    gate.close()
    lines = (tmp_path / "wsgi.log").read_text().splitlines()
    assert [_tail(line)[1:] for line in lines] == [
        ("miss", "crawler:Googlebot", "-"),
        ("l1-hit", "crawler:Googlebot", "-"),
        ("pass", "human", "-"),
    ]
    # The crawler got the stored gzip (40 bytes), the person the site's own 24 bytes.
    assert '"GET /a%20page?x=1 HTTP/1.1" 200 40 "-"' in lines[0]
    assert '"GET /b HTTP/1.1" 200 24 "http://site.test/a"' in lines[2]
    assert [record.status for record in iter_records(tmp_path / "wsgi.log")] == [200, 200, 200]


def test_middlewares_write_no_access_log_unless_configured(tmp_path: Path) -> None:
    settings = Settings(l2=L2Settings(cache_dir=str(tmp_path / "l2")))
    assert CrawlerGateWSGI(lambda environ, start_response: [], settings=settings).access_log is None
    assert CrawlerGateMiddleware(create_forum(tmp_path / "f.sqlite3", threads=1), settings=settings).access_log is None
    assert create_app(dataclasses.replace(settings, server=ServerSettings(origin="http://127.0.0.1:1"))).access_log


def test_dashboard_in_chromium_shows_the_traffic_sent(forum: ServerThread, tmp_path: Path) -> None:
    from selenium.webdriver.support.wait import WebDriverWait

    with serve_process(forum.url, tmp_path, workers=2) as gate, chromium() as driver:
        _send_known_traffic(gate)
        chrome = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36"
        for _ in range(2):  # a script with a browser's user agent: a suspect
            httpx.get(f"{gate}/showthread.php?t=30", headers={"user-agent": chrome, "accept": "*/*"})
        httpx.get(f"{gate}/showthread.php?t=31", headers={**GOOGLEBOT, "x-forwarded-for": "203.0.113.9"})
        driver.get(f"{gate}/_crawlergate/")
        wait = WebDriverWait(driver, 30, poll_frequency=0.2)
        wait.until(lambda d: d.find_element("id", "crawler-requests").text == "13")

        def text(element_id: str) -> str:
            return driver.find_element("id", element_id).text

        hits = int(text("l1-hits")) + int(text("l2-hits"))
        assert (text("human-requests"), text("misses"), hits) == ("7", "8", 5)
        assert text("crawler-hit-ratio") == "38.5 %" and text("share-requests") == "56.5 %"  # 13 of 23
        assert (text("suspect-requests"), text("unverified"), text("valve")) == ("3", "1", "open, 0 refused")
        families = [row.text.split() for row in driver.find_elements("css selector", "#families tbody tr")]
        assert families[0][:3] == ["Googlebot", "search-engine", "10"] and families[1][:3] == [
            "Bingbot",
            "search-engine",
            "3",
        ]
        assert "2 processes" in text("status")
        # The charts come once the history has an interval (two readings two seconds apart, in either worker).
        wait.until(lambda d: len(d.find_elements("css selector", "#chart-rate .uplot canvas")) == 1)
        assert len(driver.find_elements("css selector", ".chart .uplot")) == 4
        assert not has_horizontal_scroll(driver)
        screenshot(driver, "dashboard")


@pytest.mark.anyio
async def test_asgi_gate_without_lifespan_writes_its_access_log(tmp_path: Path) -> None:
    """Django's ASGI app runs no lifespan, and with regeneration off nothing else starts the gate's parts."""
    settings = Settings(
        l2=L2Settings(cache_dir=str(tmp_path / "l2")),
        log=LogSettings(access_log=str(tmp_path / "asgi.log")),
        regenerate=RegenerateSettings(enabled=False),
    )
    gate = CrawlerGateMiddleware(create_forum(tmp_path / "f.sqlite3", threads=3, work_ms=0), settings=settings)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gate), base_url="http://forum.test") as client:
        await client.get("/showthread.php?t=1", headers=GOOGLEBOT)
    assert gate.access_log is not None
    gate.access_log.close()
    (line,) = (tmp_path / "asgi.log").read_text().splitlines()
    assert '"GET /showthread.php?t=1 HTTP/1.1" 200' in line and line.endswith(' miss "crawler:Googlebot" "-"')


def test_access_log_lines_stay_one_bounded_line_whatever_the_request_carries(tmp_path: Path) -> None:
    log = AccessLog(tmp_path / "access.log", client_of=TrustedProxies(["127.0.0.1"]).client)
    forged = b'6.6.6.6 - - [01/Jan/2020:00:00:00 +0000] "GET /forged HTTP/1.1" 200 1 "-" "Googlebot/2.1" 1 miss'
    request = Request(
        "GET",
        "/",
        b"/" + b"a" * 10_000,
        b"",
        [(b"user-agent", b"\xff" * 60_000), (b"referer", b'"\\'), (b"x-forwarded-for", forged)],
        "127.0.0.1",
    )
    short_forgery = Request("GET", "/", request.raw_path, b"", [(b"x-forwarded-for", b'6.6.6.6 - - [x] "GET /f')],
                            "127.0.0.1")  # fmt: skip
    log.start()
    log.log(request, 200, 1, 1.0, "miss")
    log.log(short_forgery, 200, 1, 1.0, "miss")
    log.close()
    line, short = (tmp_path / "access.log").read_bytes().splitlines()
    assert len(line) < 3 * MAX_FIELD_BYTES + 200
    client = line.split(b" ", 1)[0]
    assert client == b"127.0.0.1"  # no address is that long: the forged hop is not believed
    client = short.split(b" ", 1)[0]
    assert client.startswith(b"6.6.6.6\\x20-\\x20-") and b'"' not in client  # one field, not a forged line
    assert line.endswith(b'..." 1000 miss "human" "-"') and b'"\\x22\\x5C"' in line
    record = next(iter_records(tmp_path / "access.log"))
    assert record.status == 200 and record.target.startswith("/aaa")


def _tail(line: str) -> tuple[str, ...]:
    """An access log line's last fields: TTFB (µs), outcome, verdict and reasons."""
    match = re.search(r' (\d+) (\S+) "([^"]*)" "([^"]*)"$', line)
    assert match is not None, line
    return match.groups()
