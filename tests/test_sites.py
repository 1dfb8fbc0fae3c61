"""Several sites behind one serve: the Host picks the site's gate, and no site ever gets another's page."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

from crawlergate.adapters.httpserver import LimitedHttpToolsProtocol
from crawlergate.adapters.proxy import create_server_app
from crawlergate.config import AdminSettings, L2Settings, ServerSettings, Settings, SiteSettings, load_settings
from crawlergate.demo.run import free_port
from crawlergate.errors import ConfigError
from tests.conftest import ServerThread, wait_until_healthy
from tests.visitors import FIREFOX, GOOGLEBOT


def _site(name: str) -> ServerThread:
    """An origin whose every page names the site: the same paths as the other site, other bodies."""

    async def page(request: Request) -> HTMLResponse:
        return HTMLResponse(f"<html><body>{name} {request.url.path}</body></html>")

    return ServerThread(Starlette(routes=[Route("/{path:path}", page)])).start()


@pytest.fixture
def origins() -> Iterator[tuple[ServerThread, ServerThread]]:
    forum, wiki = _site("forum"), _site("wiki")
    yield forum, wiki
    forum.stop()
    wiki.stop()


def _gate(tmp_path: Path, forum: str, wiki: str, **server: object) -> ServerThread:
    settings = Settings(
        server=ServerSettings(**server),  # type: ignore[arg-type]
        admin=AdminSettings(token="secret"),
        l2=L2Settings(cache_dir=str(tmp_path / "l2")),
        sites=(
            SiteSettings(hosts=("forum.example",), origin=forum),
            SiteSettings(hosts=("wiki.example", "www.wiki.example"), origin=wiki),
        ),
    )
    return ServerThread(create_server_app(settings), http=LimitedHttpToolsProtocol).start()


def _crawl(gate: ServerThread, host: str, path: str = "/t/1") -> tuple[str, str]:
    answer = httpx.get(gate.url + path, headers={**GOOGLEBOT, "host": host})
    return answer.headers["x-crawlergate"].split(";")[0], answer.text


def test_two_sites_with_the_same_paths_get_their_own_pages(
    tmp_path: Path, origins: tuple[ServerThread, ServerThread]
) -> None:
    forum, wiki = origins
    gate = _gate(tmp_path, forum.url, wiki.url)
    try:
        assert _crawl(gate, "forum.example") == ("miss", "<html><body>forum /t/1</body></html>")
        assert _crawl(gate, "wiki.example") == ("miss", "<html><body>wiki /t/1</body></html>")
        assert _crawl(gate, "forum.example") == ("l1-hit", "<html><body>forum /t/1</body></html>")
        # An alias, with the port a client adds, is the same site.
        assert _crawl(gate, f"www.wiki.example:{gate.port}") == ("l1-hit", "<html><body>wiki /t/1</body></html>")
        # People reach their own site too.
        person = httpx.get(gate.url + "/t/9", headers={**FIREFOX, "host": "wiki.example"})
        assert person.headers["x-crawlergate"] == "pass" and person.text == "<html><body>wiki /t/9</body></html>"
        stats = httpx.get(gate.url + "/_crawlergate/stats").json()
        sites = stats["sites"]
        assert (sites["forum.example"]["l2"]["pages"], sites["wiki.example"]["l2"]["pages"]) == (1, 1)
        for field in ("requests", "misses", "l1_hits"):
            assert stats["crawler"][field] == sum(site["crawler"][field] for site in sites.values())
        assert stats["crawler"]["requests"] == 4 and stats["human"]["requests"] == 1
        metrics = httpx.get(gate.url + "/_crawlergate/metrics").text
        assert 'crawlergate_requests_total{site="wiki.example",class="crawler",outcome="l1-hit"} 1' in metrics
        # One group per metric (Prometheus's text format): its header once, then every site's samples.
        lines = metrics.splitlines()
        assert lines.count("# TYPE crawlergate_l2_pages gauge") == 1
        start = lines.index("# TYPE crawlergate_l2_pages gauge")
        assert [line.split("{")[0] for line in lines[start + 1 : start + 3]] == ["crawlergate_l2_pages"] * 2
        assert _crawl(gate, "FORUM.example.")[1] == "<html><body>forum /t/1</body></html>"  # the root's dot
        assert (tmp_path / "l2" / "sites" / "forum.example").is_dir()
        overview = httpx.get(gate.url + "/_crawlergate/")
        assert overview.headers["content-type"].startswith("text/html")
        assert f'href="//wiki.example:{gate.port}/_crawlergate/"' in overview.text and "forum.example" in overview.text
        shown = subprocess.run(
            [sys.executable, "-m", "crawlergate", "stats", "--url", gate.url],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        assert shown.startswith("all 2 sites\n") and "\nforum.example\n" in shown and "\nwiki.example\n" in shown
    finally:
        gate.stop()


def test_another_host_is_never_stored_nor_filled(tmp_path: Path, origins: tuple[ServerThread, ServerThread]) -> None:
    forum, wiki = origins
    gate = _gate(tmp_path, forum.url, wiki.url)
    try:
        _crawl(gate, "forum.example")
        answer = httpx.get(gate.url + "/t/1", headers={**GOOGLEBOT, "host": "other.example"})
        assert answer.status_code == 421 and "forum" not in answer.text
        assert httpx.get(gate.url + "/t/1", headers={**GOOGLEBOT, "host": "127.0.0.1"}).status_code == 421
        assert httpx.get(gate.url + "/_crawlergate/healthz", headers={"host": "10.0.0.1"}).status_code == 200
        stats = httpx.get(gate.url + "/_crawlergate/stats").json()
        assert stats["crawler"]["requests"] == 1
        assert [site["l2"]["pages"] for site in stats["sites"].values()] == [1, 0]
    finally:
        gate.stop()
    passing = _gate(tmp_path / "first", forum.url, wiki.url, other_hosts="first")
    try:
        first = [httpx.get(passing.url + "/t/2", headers={**GOOGLEBOT, "host": "other.example"}) for _ in range(2)]
        assert [answer.text for answer in first] == ["<html><body>forum /t/2</body></html>"] * 2
        assert "x-crawlergate" not in first[1].headers  # the site's own answer, not the gate's
        stats = httpx.get(passing.url + "/_crawlergate/stats").json()
        assert stats["crawler"]["requests"] == 0 and stats["sites"]["forum.example"]["l2"]["pages"] == 0
    finally:
        passing.stop()


def test_purge_on_one_site_leaves_the_others_page(tmp_path: Path, origins: tuple[ServerThread, ServerThread]) -> None:
    forum, wiki = origins
    gate = _gate(tmp_path, forum.url, wiki.url)
    try:
        _crawl(gate, "forum.example")
        _crawl(gate, "wiki.example")
        assert httpx.request("PURGE", gate.url + "/t/1", headers={"host": "forum.example"}).status_code == 200
        sites = httpx.get(gate.url + "/_crawlergate/stats").json()["sites"]
        assert (sites["forum.example"]["dirty"], sites["wiki.example"]["dirty"]) == (1, 0)
        assert _crawl(gate, "wiki.example") == ("l1-hit", "<html><body>wiki /t/1</body></html>")
    finally:
        gate.stop()


def test_sites_are_read_from_the_settings_file(tmp_path: Path) -> None:
    config = tmp_path / "crawlergate.toml"
    config.write_text(
        '[l2]\ncache_dir = "/srv/cache"\nmax_bytes = "1GB"\n'
        '[[sites]]\nhosts = ["forum.example", "www.forum.example"]\norigin = "http://127.0.0.1:8001"\n'
        'public_url = "https://forum.example"\nprofiles = ["phpbb"]\n'
        '[[sites]]\nhosts = ["WIKI.example."]\norigin = "http://127.0.0.1:8002"\nmax_bytes = "100MB"\n'
    )
    settings = load_settings(config, environ={})
    forum, wiki = settings.sites
    assert wiki.hosts == ("wiki.example",)
    one = settings.for_site(forum)
    assert (one.server.origin, one.server.public_url, one.cache.sites) == (forum.origin, forum.public_url, ("phpbb",))
    assert one.cache_dir == Path("/srv/cache/sites/forum.example") and one.l2.max_bytes == 500_000_000
    assert settings.for_site(wiki).l2.max_bytes == 100_000_000 and settings.for_site(wiki).l1_namespace
    assert settings.for_site(wiki).l1_namespace != one.l1_namespace
    # The workers of serve read the settings back whole.
    assert load_settings(None, settings.to_environ()) == settings


def test_a_site_has_sections_of_its_own_over_the_top_level_ones(tmp_path: Path) -> None:
    config = tmp_path / "crawlergate.toml"
    config.write_text(
        '[regenerate]\nwindow = "03:30"\nmax_pages = 1000\n'
        '[[sites]]\nhosts = ["forum.example"]\norigin = "http://127.0.0.1:8001"\n'
        "[sites.regenerate]\nmax_pages = 200\n[sites.valve]\nmax_in_flight = 8\n"
        '[[sites]]\nhosts = ["wiki.example"]\norigin = "http://127.0.0.1:8002"\n'
    )
    settings = load_settings(config, environ={})
    forum, wiki = (settings.for_site(site) for site in settings.sites)
    assert (forum.regenerate.max_pages, forum.regenerate.window, forum.valve.max_in_flight) == (200, "03:30", 8)
    assert (wiki.regenerate.max_pages, wiki.valve.max_in_flight) == (1000, settings.valve.max_in_flight)
    assert load_settings(None, settings.to_environ()) == settings
    config.write_text(
        '[[sites]]\nhosts = ["a.example"]\norigin = "http://127.0.0.1:1"\n[sites.regenerate]\npages = 1\n'
    )
    with pytest.raises(ConfigError, match="sites.regenerate.pages"):
        load_settings(config, environ={})


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ('[[sites]]\nhosts = ["a.example"]\n', "sites.origin"),
        ('[[sites]]\nhosts = []\norigin = "http://127.0.0.1:1"\n', "sites.hosts"),
        ('[[sites]]\nhosts = ["a b"]\norigin = "http://127.0.0.1:1"\n', "sites.hosts"),
        ('[[sites]]\nhosts = ["a.example"]\norigin = "http://127.0.0.1:1"\nrules = 1\n', "sites.rules"),
        (
            '[[sites]]\nhosts = ["a.example"]\norigin = "http://127.0.0.1:1"\n'
            '[[sites]]\nhosts = ["A.example"]\norigin = "http://127.0.0.1:2"\n',
            "one site only",
        ),
        ('[front]\npublish = true\n[[sites]]\nhosts = ["a.example"]\norigin = "http://127.0.0.1:1"\n', "publish"),
        ('sites = "a.example"\n', "list of tables"),
        ('[[sites]]\nhosts = ["a.example"]\norigin = "http://127.0.0.1:99999"\n', "The site a.example"),
        (
            '[[sites]]\nhosts = ["a.example"]\norigin = "http://127.0.0.1:1"\n[sites.valve]\nmax_in_flight = -1\n',
            "a.example",
        ),
    ],
)
def test_bad_sites_are_named_in_one_sentence(tmp_path: Path, text: str, complaint: str) -> None:
    config = tmp_path / "crawlergate.toml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=complaint) as refused:
        load_settings(config, environ={})
    assert "\n" not in str(refused.value)


def test_serve_with_two_site_flags(tmp_path: Path, origins: tuple[ServerThread, ServerThread]) -> None:
    forum, wiki = origins
    port = free_port()
    environment = {key: value for key, value in os.environ.items() if not key.startswith("CRAWLERGATE_")}
    argv = ["serve", "--port", str(port), "--workers", "2", "--cache-dir", str(tmp_path / "l2")]
    argv += ["--site", f"forum.example={forum.url}", "--site", f"wiki.example,www.wiki.example={wiki.url}"]
    process = subprocess.Popen([sys.executable, "-m", "crawlergate", *argv], env=environment, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(process, url)
        for host, name in (("forum.example", "forum"), ("www.wiki.example", "wiki"), ("forum.example", "forum")):
            answer = httpx.get(url + "/t/3", headers={**GOOGLEBOT, "host": host})
            assert answer.text == f"<html><body>{name} /t/3</body></html>"
    finally:
        process.terminate()
        _, errors = process.communicate(timeout=30)
    assert b"forum.example -> " + forum.url.encode() in errors and b"for 2 sites" in errors
    assert b"nothing answers" not in errors


def test_serve_refuses_an_origin_beside_sites(tmp_path: Path) -> None:
    argv = ["serve", "--origin", "http://127.0.0.1:1", "--site", "a.example=http://127.0.0.1:2"]
    environment = {key: value for key, value in os.environ.items() if not key.startswith("CRAWLERGATE_")}
    finished = subprocess.run(
        [sys.executable, "-m", "crawlergate", *argv, "--cache-dir", str(tmp_path / "l2")],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
    )
    assert finished.returncode != 0 and "Traceback" not in finished.stderr
    assert "not both" in finished.stderr


def test_a_command_acts_on_the_site_its_origin_names(tmp_path: Path) -> None:
    """warm, regenerate and check build one site's gate: the one whose origin is given, in that site's folder."""
    from crawlergate.adapters.proxy import create_app

    sites = (
        SiteSettings(hosts=("forum.example",), origin="http://127.0.0.1:8001"),
        SiteSettings(hosts=("wiki.example",), origin="http://127.0.0.1:8002"),
    )
    settings = Settings(l2=L2Settings(cache_dir=str(tmp_path / "l2")), sites=sites)
    with pytest.raises(ConfigError, match="http://127.0.0.1:8001, http://127.0.0.1:8002"):
        create_app(settings)
    wiki = create_app(Settings(server=ServerSettings(origin="http://127.0.0.1:8002/"), l2=settings.l2, sites=sites))
    assert wiki.settings.cache_dir == tmp_path / "l2" / "sites" / "wiki.example"
    assert wiki.settings.server.origin == "http://127.0.0.1:8002"


def test_invalidate_and_stats_on_the_command_line_take_a_site(
    tmp_path: Path, origins: tuple[ServerThread, ServerThread]
) -> None:
    forum, wiki = origins
    gate = _gate(tmp_path, forum.url, wiki.url)

    def command(*argv: str) -> subprocess.CompletedProcess[str]:
        environment = {**os.environ, "CRAWLERGATE_ADMIN_TOKEN": "secret"}
        return subprocess.run(
            [sys.executable, "-m", "crawlergate", *argv], capture_output=True, text=True, timeout=60, env=environment
        )

    try:
        for path in ("/t/1", "/t/2"):
            _crawl(gate, "forum.example", path)
            _crawl(gate, "wiki.example", path)
        assert (
            command("invalidate", "--url", gate.url, "http://forum.example/t/1").stdout == "marked 1 page(s) changed\n"
        )
        assert command("invalidate", "--url", gate.url, "--host", "wiki.example", "--pattern", "/t/*").returncode == 0
        sites = httpx.get(gate.url + "/_crawlergate/stats").json()["sites"]
        assert (sites["forum.example"]["dirty"], sites["wiki.example"]["dirty"]) == (1, 2)
        refused = command("invalidate", "--url", gate.url, "--pattern", "/t/*")
        assert refused.returncode != 0 and "send its Host" in refused.stderr and "Traceback" not in refused.stderr
        one = command("stats", "--url", gate.url, "--host", "wiki.example", "--json")
        assert json.loads(one.stdout)["crawler"]["requests"] == 2
    finally:
        gate.stop()


def test_sites_on_one_origin_by_name_get_their_own_pages(tmp_path: Path) -> None:
    """Name-based virtual hosts (a WordPress multisite): one origin, a page per Host at the same path."""

    async def page(request: Request) -> HTMLResponse:
        return HTMLResponse(f"<html><body>{request.headers['host']} {request.url.path}</body></html>")

    origin = ServerThread(Starlette(routes=[Route("/{path:path}", page)])).start()
    settings = Settings(
        sites=(
            SiteSettings(hosts=("blog.example",), origin=origin.url),
            SiteSettings(hosts=("shop.example",), origin=origin.url),
        )
    )
    blog, shop = (settings.for_site(site) for site in settings.sites)
    assert blog.cache_dir != shop.cache_dir and blog.l1_namespace != shop.l1_namespace
    gate = ServerThread(create_server_app(settings), http=LimitedHttpToolsProtocol).start()
    try:
        for _ in range(2):
            assert _crawl(gate, "blog.example")[1] == "<html><body>blog.example /t/1</body></html>"
            assert _crawl(gate, "shop.example")[1] == "<html><body>shop.example /t/1</body></html>"
    finally:
        gate.stop()
        origin.stop()


def test_a_trusted_front_proxy_names_the_site_in_x_forwarded_host(
    tmp_path: Path, origins: tuple[ServerThread, ServerThread]
) -> None:
    """nginx's default Host is its upstream's address: the site is in X-Forwarded-Host, believed from it only."""
    forum, wiki = origins
    headers = {**GOOGLEBOT, "host": "127.0.0.1:8080", "x-forwarded-host": "wiki.example"}
    trusting = _gate(tmp_path / "trusting", forum.url, wiki.url)
    try:
        assert httpx.get(trusting.url + "/t/1", headers=headers).text == "<html><body>wiki /t/1</body></html>"
    finally:
        trusting.stop()
    wary = _gate(tmp_path / "wary", forum.url, wiki.url, trusted_proxies=())
    try:
        assert httpx.get(wary.url + "/t/1", headers=headers).status_code == 421
    finally:
        wary.stop()


def test_serve_checks_each_sites_own_sections_before_it_listens(tmp_path: Path) -> None:
    config = tmp_path / "crawlergate.toml"
    config.write_text(
        '[[sites]]\nhosts = ["a.example"]\norigin = "http://127.0.0.1:1"\n'
        '[[sites]]\nhosts = ["b.example"]\norigin = "http://127.0.0.1:2"\n'
        f'[sites.policy]\nrules_file = "{tmp_path / "missing.toml"}"\n'
    )
    environment = {key: value for key, value in os.environ.items() if not key.startswith("CRAWLERGATE_")}
    argv = ["serve", "--config", str(config), "--port", str(free_port()), "--workers", "2"]
    finished = subprocess.run(
        [sys.executable, "-m", "crawlergate", *argv, "--cache-dir", str(tmp_path / "l2")],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
    )
    assert finished.returncode != 0 and "missing.toml" in finished.stderr
    assert "Traceback" not in finished.stderr and "listening" not in finished.stderr


def test_regenerate_acts_on_the_site_its_origin_names(
    tmp_path: Path, origins: tuple[ServerThread, ServerThread]
) -> None:
    forum, wiki = origins
    gate = _gate(tmp_path, forum.url, wiki.url)
    try:
        _crawl(gate, "wiki.example", "/t/5")
    finally:
        gate.stop()
    config = tmp_path / "crawlergate.toml"
    config.write_text(
        f'[[sites]]\nhosts = ["forum.example"]\norigin = "{forum.url}"\n'
        f'[[sites]]\nhosts = ["wiki.example", "www.wiki.example"]\norigin = "{wiki.url}"\n'
    )
    environment = {key: value for key, value in os.environ.items() if not key.startswith("CRAWLERGATE_")}
    argv = ["regenerate", "--config", str(config), "--origin", wiki.url, "--cache-dir", str(tmp_path / "l2"), "--all"]
    finished = subprocess.run(
        [sys.executable, "-m", "crawlergate", *argv], capture_output=True, text=True, timeout=120, env=environment
    )
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.startswith("regenerate: 1 page tried: 0 changed, 1 unchanged")


def test_sites_sharing_an_origin_cannot_be_picked_by_it() -> None:
    sites = (
        SiteSettings(hosts=("blog.example",), origin="http://127.0.0.1:8001"),
        SiteSettings(hosts=("shop.example",), origin="http://127.0.0.1:8001"),
    )
    with pytest.raises(ConfigError, match="share the origin"):
        Settings(server=ServerSettings(origin="http://127.0.0.1:8001"), sites=sites).one_site()
    assert Settings(sites=sites).for_site(sites[0]).cache_dir != Settings(sites=sites).for_site(sites[1]).cache_dir
    odd = (SiteSettings(hosts=("a_b.example",), origin="http://127.0.0.1:1"),
           SiteSettings(hosts=("a-b.example",), origin="http://127.0.0.1:2"))  # fmt: skip
    assert Settings(sites=odd).for_site(odd[0]).cache_dir != Settings(sites=odd).for_site(odd[1]).cache_dir
