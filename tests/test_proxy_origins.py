"""The proxy in front of origins as they are (issue 23): bodies that end when the connection closes,
slow pages for people, pages too big to store, variants by device, the origin's own validators.

Origins here are written to behave as real servers do: a raw socket (HTTP/1.0 style answers, resets),
Python's ``http.server`` (which ends every body by closing), and small Starlette apps.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from crawlergate.adapters.proxy import create_app
from crawlergate.config import CacheSettings, L2Settings, ServerSettings, Settings
from tests.conftest import FIREFOX, RawHttpServer, ServerThread

pytestmark = pytest.mark.e2e

GOOGLEBOT = {"user-agent": "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"}
HITS = ("l1-hit", "l2-hit")

CLOSE_BODIES = {
    b"/empty": b"",
    b"/one": b"x",
    b"/64k": b"<p>" + b"k" * (64 * 1024 - 7) + b"</p>",
    b"/5m": b"<p>" + bytes(range(97, 123)) * (5 * 1024 * 1024 // 26) + b"</p>",
}


def close_delimited(method: bytes, path: bytes) -> tuple[bytes, bool | str]:
    """Answers without Content-Length or chunking: each ends when the connection closes (RFC 9112 6.3 rule 8)."""
    if path == b"/moved":
        return b"HTTP/1.0 301 Moved Permanently\r\nLocation: /one\r\n\r\n", True
    if path == b"/reset":  # a worker that crashes mid-page: the connection is reset, not closed
        return b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n<p>half a pa", "reset"
    body = CLOSE_BODIES.get(path, b"<p>page " + path + b"</p>")
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n" + (body if method != b"HEAD" else b""), True


def _proxy(origin: str, tmp_path: Path, **server: object) -> ServerThread:
    settings = Settings(
        server=ServerSettings(origin=origin, **server),  # type: ignore[arg-type]
        l2=L2Settings(cache_dir=str(tmp_path / "l2")),
        cache=CacheSettings(max_stale_seconds=0),
    )
    return ServerThread(create_app(settings)).start()


@pytest.fixture
def close_origin() -> Iterator[RawHttpServer]:
    origin = RawHttpServer(close_delimited).start()
    yield origin
    origin.stop()


@pytest.mark.parametrize("path", ["/empty", "/one", "/64k", "/5m", "/moved"])
def test_proxy_close_delimited_answers_are_stored_whole_and_passed_on_framed(
    close_origin: RawHttpServer, tmp_path: Path, path: str
) -> None:
    proxy = _proxy(close_origin.url, tmp_path)
    try:
        with httpx.Client(base_url=proxy.url, follow_redirects=False) as client:
            crawler = [client.get(path, headers=GOOGLEBOT) for _ in range(2)]
            # httpx refuses a chunked body without its last chunk: a person's answer must be framed whole.
            person = client.get(path, headers=FIREFOX)
    finally:
        proxy.stop()
    expected = b"" if path == "/moved" else CLOSE_BODIES[path.encode()]
    status = 301 if path == "/moved" else 200
    assert [answer.status_code for answer in crawler] == [status, status]
    assert [answer.content for answer in crawler] == [expected, expected]
    # An empty 200 is never stored (it is counted "empty"): passed on as it came, each time.
    second = ("miss",) if path == "/empty" else HITS
    assert crawler[0].headers["x-crawlergate"] == "miss" and crawler[1].headers["x-crawlergate"] in second
    assert person.status_code == status and person.content == expected
    assert person.headers["x-crawlergate"] == "pass"


def test_proxy_close_delimited_answer_cut_by_a_reset_is_never_stored(
    close_origin: RawHttpServer, tmp_path: Path
) -> None:
    proxy = _proxy(close_origin.url, tmp_path)
    try:
        with httpx.Client(base_url=proxy.url) as client:
            crawler = [client.get("/reset", headers=GOOGLEBOT) for _ in range(2)]
            with pytest.raises(httpx.RemoteProtocolError):
                client.get("/reset", headers=FIREFOX)  # cut short as from the origin: no last chunk
        stats = httpx.get(f"{proxy.url}/_crawlergate/stats").json()
    finally:
        proxy.stop()
    assert [answer.status_code for answer in crawler] == [502, 502]
    assert stats["not_stored"] == {"incomplete": 2}
    assert not list((tmp_path / "l2").rglob("*.page"))


class _Http10Handler(http.server.BaseHTTPRequestHandler):
    """Python's http.server as people run it: HTTP/1.0, no Content-Length, the body ends at the close."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.end_headers()
        self.wfile.write(b"<html><body><p>" + self.path.encode() + b"</p>" + b"." * 70000 + b"</body></html>")

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_proxy_http_server_origin_pages_are_cached_for_crawlers(tmp_path: Path) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Http10Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    proxy = _proxy(f"http://127.0.0.1:{server.server_address[1]}", tmp_path)
    try:
        with httpx.Client(base_url=proxy.url) as client:
            crawler = [client.get("/thread?t=1", headers=GOOGLEBOT) for _ in range(2)]
            person = client.get("/thread?t=1", headers=FIREFOX)
    finally:
        proxy.stop()
        server.shutdown()
        server.server_close()
    assert [answer.headers["x-crawlergate"] for answer in crawler][0] == "miss"
    assert crawler[1].headers["x-crawlergate"] in HITS
    assert crawler[0].content == crawler[1].content == person.content
    assert person.content.startswith(b"<html><body><p>/thread?t=1</p>") and person.content.endswith(b"</html>")
