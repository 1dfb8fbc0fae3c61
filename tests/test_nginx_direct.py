"""Debian's nginx with the generated include (``crawlergate nginx-config``) in front of ``crawlergate serve``:
announced crawlers answered from the published tree, everyone else by the gate, nothing stale and nothing
outside the tree ever answered."""

from __future__ import annotations

import functools
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from tests.conftest import ServerThread, free_port, read_corpus, serve_process
from tests.visitors import FIREFOX, GOOGLEBOT

pytestmark = pytest.mark.e2e

DIRECT = "l2-hit; direct"


def _page(request: Request) -> Response:
    path = request.url.path
    if path.startswith("/robots-tagged"):
        return HTMLResponse(f"<html><body>{path}</body></html>", headers={"x-robots-tag": "noindex"})
    if path == "/feed":
        return Response("<rss/>", media_type="application/rss+xml")
    filler = " ".join(f"word{number}" for number in range(400))
    return HTMLResponse(f"<html><body><h1>{path}</h1><p>{filler}</p></body></html>")


@pytest.fixture(scope="module")
def origin() -> Iterator[ServerThread]:
    server = ServerThread(Starlette(routes=[Route("/{path:path}", _page)]))
    yield server.start()
    server.stop()


class Front:
    """nginx with the include, in front of a gate."""

    def __init__(self, url: str, gate: str, folder: Path) -> None:
        self.url = url
        self.gate = gate
        self.folder = folder
        self.client = httpx.Client(timeout=10)

    def get(self, path: str, headers: dict[str, str] | None = None, **options: object) -> httpx.Response:
        return self.client.get(self.url + path, headers=headers or GOOGLEBOT, **options)  # type: ignore[arg-type]

    def raw(self, base: str, path: str, headers: dict[str, str]) -> tuple[httpx.Response, bytes]:
        """An answer with its body exactly as sent (gzip bytes stay gzip)."""
        with self.client.stream("GET", base + path, headers=headers) as response:
            return response, b"".join(response.iter_raw())

    def outcome(self, path: str, headers: dict[str, str] | None = None) -> str:
        return self.get(path, headers).headers.get("x-crawlergate", "")


def _start_nginx(
    binary: str,
    folder: Path,
    port: int,
    gate_port: int,
    cache_dir: Path,
    direct_log: Path,
    agents_log: Path | None = None,
    origin: str = "http://127.0.0.1:1",
) -> subprocess.Popen[bytes]:
    include = folder / "include"
    subprocess.run(
        [sys.executable, "-m", "crawlergate", "nginx-config", "--out", str(include), "--cache-dir", str(cache_dir),
         "--gate", f"127.0.0.1:{gate_port}", "--direct-log", str(direct_log), "--origin", origin,
         *(["--agents-from", str(agents_log)] if agents_log else [])],
        check=True, capture_output=True,
    )  # fmt: skip
    temp = {name: folder / name for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi")}
    for path in temp.values():
        path.mkdir(exist_ok=True)
    # As root (CI), nginx's workers would run as nobody, who cannot enter pytest's private folders.
    user = "user root;" if os.geteuid() == 0 else ""
    (folder / "nginx.conf").write_text(f"""
{user}
worker_processes 1;
daemon off;
pid {folder}/nginx.pid;
error_log {folder}/error.log;
events {{ worker_connections 256; }}
http {{
    include {include}/crawlergate-hash.conf;
    # A site's own map before the include: the hash's sizes were set before it.
    map $http_upgrade $site_connection {{ default upgrade; "" close; }}
    access_log {folder}/access.log;
    client_body_temp_path {temp["body"]};
    proxy_temp_path {temp["proxy"]};
    fastcgi_temp_path {temp["fastcgi"]};
    uwsgi_temp_path {temp["uwsgi"]};
    scgi_temp_path {temp["scgi"]};
    include {include}/crawlergate-http.conf;
    server {{
        listen 127.0.0.1:{port};
        include {include}/crawlergate-server.conf;
        location ^~ /_crawlergate {{
            proxy_pass http://crawlergate_gate;
        }}
    }}
}}
""")
    checked = subprocess.run([binary, "-t", "-c", str(folder / "nginx.conf"), "-p", str(folder)], capture_output=True)
    assert checked.returncode == 0, checked.stderr.decode()
    process = subprocess.Popen([binary, "-c", str(folder / "nginx.conf"), "-p", str(folder)], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/_crawlergate/healthz")
            return process
        except httpx.TransportError:
            assert process.poll() is None and time.monotonic() < deadline, "nginx did not start"
            time.sleep(0.1)


GATE_CONFIG = """
[admin]
token = "test-token"
[regenerate]
enabled = false
[cache]
ttl_seconds = {ttl}
[l2]
max_bytes = {max_bytes}
[front]
publish = true
direct_log = "{direct_log}"
"""


@pytest.fixture
def front(origin: ServerThread, nginx_binary: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Front]:
    """nginx and the gate; ``param``: (ttl, max_bytes), and the user agents of an access log nginx-config reads."""
    ttl, max_bytes, *agents = getattr(request, "param", (86400, 1 << 30))
    gate_dir, nginx_dir = tmp_path / "gate", tmp_path / "nginx"
    nginx_dir.mkdir()
    direct_log = nginx_dir / "direct.log"
    agents_log = None
    if agents:
        agents_log = nginx_dir / "site-access.log"
        agents_log.write_text("".join(_combined_line(user_agent) for user_agent in agents[0]))
    config = GATE_CONFIG.format(ttl=ttl, max_bytes=max_bytes, direct_log=direct_log)
    with serve_process(origin.url, gate_dir, config) as gate:
        port = free_port()
        gate_port = int(gate.rsplit(":", 1)[1])
        nginx = _start_nginx(nginx_binary, nginx_dir, port, gate_port, gate_dir / "l2", direct_log, agents_log)
        front = Front(f"http://127.0.0.1:{port}", gate, gate_dir / "l2")
        try:
            yield front
        finally:
            front.client.close()
            nginx.send_signal(signal.SIGQUIT)
            nginx.wait(timeout=20)


def _combined_line(user_agent: str) -> str:
    escaped = user_agent.replace("\\", "\\\\").replace('"', '\\"')
    return f'192.0.2.7 - - [27/Nov/2026:10:00:00 +0000] "GET /topic/1 HTTP/1.1" 200 512 "-" "{escaped}"\n'


def _published(front: Front, path: str) -> None:
    """Ask as a crawler until the page is stored and published (the first answer is the gate's miss)."""
    assert front.outcome(path) in ("miss", "l1-hit", "l2-hit", DIRECT)
    deadline = time.monotonic() + 5
    while front.outcome(path) != DIRECT:
        assert time.monotonic() < deadline, f"{path} was not published"
        time.sleep(0.05)


def test_a_crawler_hit_from_nginx_is_the_gate_answer_byte_for_byte(front: Front) -> None:
    for path in ("/topic/1", "/", "/forum/"):
        _published(front, path)
        identity = {**GOOGLEBOT, "accept-encoding": "identity"}
        gzip = {**GOOGLEBOT, "accept-encoding": "gzip"}
        direct_gz, direct_gz_body = front.raw(front.url, path, gzip)
        gate_gz, gate_gz_body = front.raw(front.gate, path, gzip)
        assert direct_gz.headers["x-crawlergate"] == DIRECT and gate_gz.headers["x-crawlergate"] == "l1-hit"
        assert direct_gz.headers["content-encoding"] == "gzip" and direct_gz_body == gate_gz_body
        direct_plain, direct_plain_body = front.raw(front.url, path, identity)
        _, gate_plain_body = front.raw(front.gate, path, identity)
        assert "content-encoding" not in direct_plain.headers and direct_plain_body == gate_plain_body
        assert direct_gz.headers["content-type"] == gate_gz.headers["content-type"] == "text/html; charset=utf-8"
        assert direct_gz.headers["last-modified"] == gate_gz.headers["last-modified"]
        assert "accept-encoding" in direct_gz.headers["vary"].lower()
        # Revalidation, by the validators nginx gave.
        etag = direct_gz.headers["etag"]
        assert front.get(path, {**GOOGLEBOT, "if-none-match": etag}).status_code == 304
        since = {**GOOGLEBOT, "if-modified-since": direct_gz.headers["last-modified"]}
        assert front.get(path, since).status_code == 304
        head = front.client.head(front.url + path, headers=GOOGLEBOT)
        assert head.status_code == 200 and head.headers["x-crawlergate"] == DIRECT and head.content == b""


def test_people_sessions_writes_and_suspects_reach_the_gate(front: Front) -> None:
    _published(front, "/topic/2")
    assert front.outcome("/topic/2", FIREFOX) == "pass"
    assert front.outcome("/topic/2", {**GOOGLEBOT, "cookie": "sessionid=abc"}) == "pass"
    assert front.outcome("/topic/2", {**GOOGLEBOT, "authorization": "Basic eDp5"}) == "pass"
    posted = front.client.post(front.url + "/topic/2", headers=GOOGLEBOT, content=b"x=1")
    assert posted.headers["x-crawlergate"] != DIRECT
    suspect = {"user-agent": FIREFOX["user-agent"]}  # a browser's name without a browser's headers
    assert front.outcome("/topic/2", suspect) not in ("", DIRECT)
    # A query string, even one the key rules drop, is the gate's.
    assert front.outcome("/topic/2?utm_source=x") != DIRECT
    # Pages a static server cannot give as the gate would are never published.
    for path in ("/robots-tagged", "/feed"):
        front.get(path)
        assert front.outcome(path) in ("l1-hit", "l2-hit")


def test_a_folder_of_other_pages_or_a_published_file_name_is_never_answered_by_nginx(front: Front) -> None:
    _published(front, "/board/7")
    folder = front.get("/board", follow_redirects=False)
    assert folder.status_code == 200 and folder.headers["x-crawlergate"] != DIRECT  # not nginx's 301 to /board/
    assert "location" not in folder.headers
    raw = front.get("/board/7.gz")
    assert raw.headers.get("x-crawlergate") != DIRECT and raw.content != front.raw(front.url, "/board/7", GOOGLEBOT)[1]


def test_direct_hits_appear_in_stats_within_a_second(front: Front) -> None:
    _published(front, "/topic/3")
    before = httpx.get(front.gate + "/_crawlergate/stats").json()["crawler"]["direct_hits"]
    assert front.outcome("/topic/3") == DIRECT
    deadline = time.monotonic() + 1.0
    while True:
        stats = httpx.get(front.gate + "/_crawlergate/stats").json()
        if stats["crawler"]["direct_hits"] > before:
            break
        assert time.monotonic() < deadline, "the direct hit was not counted within a second"
        time.sleep(0.05)
    assert stats["families"]["Googlebot"]["outcomes"]["direct"] >= 1
    assert 'outcome="direct"' in httpx.get(front.gate + "/_crawlergate/metrics").text


def test_a_marked_or_purged_page_is_never_answered_by_nginx_again(front: Front) -> None:
    _published(front, "/topic/4")
    token = {"authorization": "Bearer test-token"}
    marked = httpx.post(front.gate + "/_crawlergate/invalidate", json={"urls": ["/topic/4"]}, headers=token)
    assert marked.status_code == 200 and marked.json()["marked"] == 1
    assert front.outcome("/topic/4") in ("l1-hit", "l2-hit", "stale")
    _published(front, "/topic/5")
    purged = httpx.request("PURGE", front.gate + "/topic/5")
    assert purged.status_code == 200
    assert front.outcome("/topic/5") != DIRECT


@pytest.mark.parametrize("front", [(7, 1 << 30)], indirect=True)
def test_an_expired_page_leaves_the_tree(front: Front) -> None:
    stored_before = time.monotonic()
    _published(front, "/topic/6")
    # A lifetime of 7 s: the page leaves the tree 1-2 s before it ends (a sweeper that wakes every second).
    time.sleep(max(0.0, stored_before + 7.0 - time.monotonic()))
    assert front.outcome("/topic/6") != DIRECT


@pytest.mark.parametrize("front", [(86400, 160 * 1024)], indirect=True)
def test_an_evicted_page_leaves_the_tree(front: Front) -> None:
    _published(front, "/topic/first")
    for number in range(40):
        front.get(f"/topic/many-{number}")
    file = front.folder / "published" / "127.0.0.1" / "topic" / "first.gz"
    assert not file.exists()
    assert front.outcome("/topic/first") != DIRECT


def test_escapes_dot_segments_links_and_nul_never_reach_outside_the_tree(front: Front, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "passwd.gz").write_bytes(b"SECRET")
    (secret / "passwd").write_bytes(b"SECRET")
    _published(front, "/topic/7")
    tree = front.folder / "published" / "127.0.0.1"
    (tree / "planted").symlink_to(secret)
    (tree / "topic" / "linked.gz").symlink_to(secret / "passwd.gz")
    for path in (
        "/planted/passwd",
        "/topic/linked",
        "/topic/%2e%2e/%2e%2e/%2e%2e/secret/passwd",
        "/topic%2f7",
        "/topic/7%00",
        "/topic/..%2f..%2fsecret/passwd",
        "/topic/../../../../../../../../etc/passwd",
    ):
        answer = front.get(path)
        assert b"SECRET" not in answer.content and b"root:" not in answer.content, path
        assert answer.headers.get("x-crawlergate") != DIRECT, path


def test_a_mark_written_before_a_crash_unpublishes_at_the_next_start(
    origin: ServerThread, nginx_binary: str, tmp_path: Path
) -> None:
    gate_dir, nginx_dir = tmp_path / "gate", tmp_path / "nginx"
    nginx_dir.mkdir()
    config = GATE_CONFIG.format(ttl=86400, max_bytes=1 << 30, direct_log=nginx_dir / "direct.log")
    port = free_port()
    with serve_process(origin.url, gate_dir, config) as gate:
        nginx = _start_nginx(
            nginx_binary, nginx_dir, port, int(gate.rsplit(":", 1)[1]), gate_dir / "l2", nginx_dir / "direct.log"
        )
        front = Front(f"http://127.0.0.1:{port}", gate, gate_dir / "l2")
        try:
            _published(front, "/topic/8")
            serving = [
                int(pid) for pid in subprocess.check_output(["pgrep", "-f", str(gate_dir / "gate.toml")]).split()
            ]
            # The gate dies between writing a mark and taking the page out of the tree: the mark is in the
            # catalogue, the page still published.
            for pid in serving:
                os.kill(pid, signal.SIGKILL)
            with sqlite3.connect(gate_dir / "l2" / "dirty.sqlite3") as database:
                database.execute(
                    "UPDATE pages SET dirty_since = ?, reason = 'api' WHERE target = '/topic/8'", (time.time(),)
                )
            assert (gate_dir / "l2" / "published" / "127.0.0.1" / "topic" / "8.gz").exists()
        finally:
            front.client.close()
            nginx.send_signal(signal.SIGQUIT)
            nginx.wait(timeout=20)
    with serve_process(origin.url, gate_dir, config):
        deadline = time.monotonic() + 5
        while (gate_dir / "l2" / "published" / "127.0.0.1" / "topic" / "8.gz").exists():
            assert time.monotonic() < deadline, "the start-up check left a marked page published"
            time.sleep(0.05)


@functools.cache
def _map_sample() -> list[str]:
    """Search engines and AI crawlers of the corpus, and people, that nginx can be sent (printable ASCII)."""
    crawlers = [ua for kind, ua in read_corpus("corpus-crawlers.tsv.gz") if kind in ("search-engine", "ai-crawler")]
    people = [ua for _, ua in read_corpus("corpus-people.tsv.gz")]
    return [ua for ua in crawlers[::4] + people[::400] if ua.isascii() and ua.isprintable()]


def _direct_exactly_where_the_maps_say_crawler(front: Front, sample: list[str]) -> None:
    from crawlergate.classify import Classifier
    from crawlergate.config import Settings
    from crawlergate.front.nginx import crawler_map, served_families

    classifier = Classifier.from_settings(Settings().classify)
    maps = crawler_map(classifier.ruleset, served_families(Settings(), classifier))
    _published(front, "/topic/sample")
    wrong = []
    for user_agent in sample:
        direct = front.outcome("/topic/sample", {"user-agent": user_agent}) == DIRECT
        if direct != maps.says_crawler(user_agent):
            wrong.append(user_agent)
    assert wrong == []


def test_nginx_reads_the_generated_map_as_python_does(front: Front) -> None:
    """The maps' patterns (tries, atomic groups, look-aheads, \\x escapes) mean the same to nginx's PCRE as to
    Python's re, on a sample of the corpus: a user agent gets the direct answer exactly when the maps say crawler."""
    _direct_exactly_where_the_maps_say_crawler(front, _map_sample())


# The sample as an access log nginx-config learns known user agents from, each as it was and in capitals.
_LEARNED = [*_map_sample(), *(user_agent.upper() for user_agent in _map_sample()[::7])]


@pytest.mark.parametrize("front", [(86400, 1 << 30, _LEARNED)], indirect=True)
def test_known_user_agents_found_by_the_hash_are_answered_as_the_patterns_would(front: Front) -> None:
    """With the crawlers of a site's log found by nginx's hash (``--agents-from``), a user agent still gets the
    direct answer exactly when the maps say crawler: the crawlers in it, in any case, and never the people."""
    include = front.folder.parent.parent / "nginx" / "include"
    assert "map_hash_bucket_size" in (include / "crawlergate-hash.conf").read_text()
    assert (include / "crawlergate-http.conf").read_text().count('" 1;\n') > 100
    _direct_exactly_where_the_maps_say_crawler(front, [*_map_sample(), *(ua.swapcase() for ua in _map_sample()[::5])])


def test_people_reach_the_site_itself_while_the_gate_is_down(
    origin: ServerThread, nginx_binary: str, tmp_path: Path
) -> None:
    """The include names the site as the gate's backup: a gate that is down (a deploy, a crash) costs people
    nothing but the cache."""
    nginx_dir = tmp_path / "nginx"
    nginx_dir.mkdir()
    port, no_gate = free_port(), free_port()
    nginx = _start_nginx(nginx_binary, nginx_dir, port, no_gate, tmp_path / "l2", nginx_dir / "direct.log",
                         origin=origin.url)  # fmt: skip
    try:
        person = httpx.get(f"http://127.0.0.1:{port}/t/1", headers=FIREFOX)
        crawler = httpx.get(f"http://127.0.0.1:{port}/t/1", headers=GOOGLEBOT)
    finally:
        nginx.send_signal(signal.SIGQUIT)
        nginx.wait(timeout=20)
    assert person.status_code == crawler.status_code == 200
    assert "x-crawlergate" not in person.headers and person.text == crawler.text
