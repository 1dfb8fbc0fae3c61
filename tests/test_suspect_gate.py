"""Suspects, the policy table and the overload valve through both adapters, in front of the engine suite's site."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from wsgiref.simple_server import make_server

import pytest

from crawlergate import CrawlerGateMiddleware, CrawlerGateWSGI
from crawlergate.cli import main
from crawlergate.config import load_settings
from crawlergate.suspect.ranges import load_ranges
from tests.conftest import ServerThread
from tests.test_engine import Clock, Running, Site, _QuietHandler, _ThreadingServer
from tests.visitors import BYTESPIDER, FIREFOX, GOOGLEBOT, GPTBOT, SUSPECT, UPTIME_ROBOT

pytestmark = pytest.mark.e2e

POLICY = """
[class]
suspect = "cache"
[family]
"Monitors and uptime checks" = "live"
Bytespider = "deny"
OpenAI = "cache-only"
"""


def _start(kind: str, tmp_path: Path, overrides: dict[str, object]) -> tuple[Running, object]:
    site, clock = Site(), Clock()
    settings = load_settings(
        environ={},
        overrides={
            "l2.cache_dir": str(tmp_path / "l2"),
            "cache.sites": ("demo-forum",),
            "cache.fill_timeout_seconds": 2,
            "log.access_log": str(tmp_path / "access.log"),
            **overrides,
        },
    )
    if kind == "asgi":
        gate: CrawlerGateMiddleware | CrawlerGateWSGI = CrawlerGateMiddleware(site.asgi, settings=settings, clock=clock)
        server = ServerThread(gate).start()
        return Running(server.url, site, clock, gate), server
    gate = CrawlerGateWSGI(site.wsgi, settings=settings, clock=clock)
    wsgi = make_server("127.0.0.1", 0, gate, server_class=_ThreadingServer, handler_class=_QuietHandler)
    threading.Thread(target=wsgi.serve_forever, daemon=True).start()
    return Running(f"http://127.0.0.1:{wsgi.server_port}", site, clock, gate), wsgi


def _stop(running: Running, server: object) -> None:
    running.site.release.set()
    if isinstance(server, ServerThread):
        server.stop()
    else:
        server.shutdown()  # type: ignore[attr-defined]
        server.server_close()  # type: ignore[attr-defined]
        running.gate.close()  # type: ignore[union-attr]


@pytest.fixture(params=["asgi", "wsgi"])
def judged(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Running]:
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    running, server = _start(
        request.param, tmp_path, {"policy.rules_file": str(policy), "server.trusted_proxies": ("127.0.0.1",)}
    )
    yield running
    _stop(running, server)


def _log_tails(running: Running, tmp_path: Path) -> list[str]:
    gate = running.gate
    assert gate.access_log is not None
    gate.access_log.close()
    return [line.split(" ", 9)[-1] for line in (tmp_path / "access.log").read_text().splitlines()]


def test_a_scraper_borrowing_a_browser_user_agent_gets_the_cache_a_member_never(
    judged: Running, tmp_path: Path
) -> None:
    with judged.client() as client:
        first = client.get("/showthread.php?t=1", headers=SUSPECT)
        second = client.get("/showthread.php?t=1", headers=SUSPECT)
        person = client.get("/showthread.php?t=1", headers=FIREFOX)
        member = client.get("/showthread.php?t=1", headers={**SUSPECT, "cookie": "sessionid=4.abc"})
        asset = client.get("/static/forum.css", headers=SUSPECT)  # not a page: the site's
        stats = client.get("/_crawlergate/stats").json()
    assert [r.headers["x-crawlergate"] for r in (first, second, person, member, asset)] == [
        "miss",
        "l1-hit",
        "pass",
        "pass",
        "pass",
    ]
    assert judged.fetches("/showthread.php") == 3  # the fill, the person, the member
    assert stats["suspect"]["requests"] == 2 and stats["suspect"]["l1_hits"] == 1
    assert stats["evidence"]["suspects"] == 2
    # httpx asks for gzip; on loopback (a secure origin) a current Chrome would send fetch metadata.
    assert stats["evidence"]["reasons"] == {"accept-not-html": 2, "no-accept-language": 2, "no-sec-fetch": 2}
    tails = _log_tails(judged, tmp_path)
    assert tails[0].endswith('miss "suspect:hidden" "accept-not-html,no-accept-language,no-sec-fetch"')
    assert tails[2].endswith('pass "human" "-"')


def test_policy_live_deny_and_cache_only(judged: Running, tmp_path: Path) -> None:
    with judged.client() as client:
        monitor = client.get("/showthread.php?t=2", headers=UPTIME_ROBOT)
        denied = client.get("/showthread.php?t=2", headers=BYTESPIDER)
        only_stored = client.get("/showthread.php?t=3", headers=GPTBOT)
        client.get("/showthread.php?t=3", headers=GOOGLEBOT)  # now stored
        stored = client.get("/showthread.php?t=3", headers=GPTBOT)
        stats = client.get("/_crawlergate/stats").json()
    assert (monitor.status_code, monitor.headers["x-crawlergate"]) == (200, "pass")
    assert (denied.status_code, denied.headers["x-crawlergate"]) == (403, "deny")
    assert (only_stored.status_code, only_stored.headers["retry-after"]) == (503, "120")
    assert (stored.status_code, stored.headers["x-crawlergate"]) == (200, "l1-hit")
    assert judged.fetches("/showthread.php?t=2") == 1 and judged.fetches("/showthread.php?t=3") == 1
    assert stats["crawler"]["denied"] == 1 and stats["crawler"]["refused"] == 1
    assert stats["valve"]["refused"] == {"valve": 0, "cache_only": 1, "fill_budget": 0}


def test_a_fake_googlebot_is_an_unverified_claimant_served_from_the_cache(judged: Running) -> None:
    with judged.client() as client:
        fake = [client.get("/showthread.php?t=4", headers={**GOOGLEBOT, "x-forwarded-for": "203.0.113.9"})
                for _ in range(2)]  # fmt: skip
        real = client.get("/showthread.php?t=4", headers={**GOOGLEBOT, "x-forwarded-for": "66.249.66.1"})
        stats = client.get("/_crawlergate/stats").json()
    assert [r.headers["x-crawlergate"] for r in (*fake, real)] == ["miss", "l1-hit", "l1-hit"]
    assert stats["evidence"]["unverified_claimants"] == 2 and stats["evidence"]["verified_claimants"] == 1
    assert stats["suspect"]["requests"] == 2 and stats["families"]["Googlebot"]["requests"] == 1
    assert judged.fetches("/showthread.php?t=4") == 1


def test_without_evidence_people_by_user_agent_pass_as_before(tmp_path: Path) -> None:
    running, server = _start("asgi", tmp_path, {"evidence.enabled": False})
    try:
        with running.client() as client:
            answer = client.get("/showthread.php?t=1", headers=SUSPECT)
    finally:
        _stop(running, server)
    assert answer.headers["x-crawlergate"] == "pass"


def test_ranges_command_refreshes_a_family_from_a_url_and_keeps_it_when_the_list_is_broken(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    google = b'{"prefixes": [{"ipv4Prefix": "66.249.64.0/27"}, {"ipv6Prefix": "2001:4860:4801:10::/64"}]}'
    lists = {"/googlebot.json": google, "/moved": b"<html>moved</html>"}

    async def published(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return
        body = lists.get(scope["path"], b"")
        await send({"type": "http.response.start", "status": 200 if body else 404, "headers": []})
        await send({"type": "http.response.body", "body": body})

    server = ServerThread(published).start()
    out = tmp_path / "ranges.toml"
    try:
        assert (
            main(["ranges", "--family", "Googlebot", "--source", f"{server.url}/googlebot.json", "--out", str(out)])
            == 0
        )
        refreshed = load_ranges(out)
        assert refreshed.verify("Googlebot", "66.249.64.5") and not refreshed.verify("Googlebot", "66.249.90.1")
        assert refreshed.verify("Bingbot", "157.55.39.1")  # the other families as they were
        assert main(["ranges", "--family", "Googlebot", "--source", f"{server.url}/moved", "--out", str(out)]) == 1
        assert main(["ranges", "--family", "Googlebot", "--source", f"{server.url}/gone", "--out", str(out)]) == 1
    finally:
        server.stop()
    err = capsys.readouterr().err
    assert "'<html>moved</html>' is not an address" in err and "answered 404" in err
    assert load_ranges(out).verify("Googlebot", "66.249.64.5")  # a broken list never replaces a good one
    assert main(["ranges"]) == 2 and "Give --out" in capsys.readouterr().err


def test_policy_command_denies_the_families_robots_txt_shuts_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    robots = tmp_path / "robots.txt"
    robots.write_text(
        "User-agent: GPTBot\nDisallow: /\n\nUser-agent: CCBot\nUser-agent: Bytespider\nDisallow: /\n\n"
        "User-agent: Googlebot\nDisallow: /search\n\nUser-agent: *\nDisallow: /admin\n# the end\n"
    )
    assert main(["policy", "--robots", str(robots)]) == 0
    table = capsys.readouterr().out
    assert '"OpenAI" = "deny"' in table and '"CCBot" = "deny"' in table and '"Bytespider" = "deny"' in table
    assert "Googlebot" not in table
    policy = tmp_path / "policy.toml"
    assert main(["policy", "--robots", str(robots), "--out", str(policy)]) == 0
    assert main(["policy", "--robots", str(tmp_path / "none.txt")]) == 2


def test_a_url_that_escaping_makes_too_long_is_refused_not_passed_unjudged(judged: Running) -> None:
    with judged.client() as client:
        answer = client.get("/member.php?u=1&x=" + '"' * 2800, headers=SUSPECT)
    assert answer.status_code == 414 and judged.fetches("/member.php") == 0


def test_serve_refuses_broken_rules_before_it_listens(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "evidence.toml"
    broken.write_text("threshold = [\n")
    misspelt = tmp_path / "ranges.toml"
    misspelt.write_text('[[engine]]\nfamily = "Googlbot"\nprefixes = ["66.249.64.0/19"]\n')
    config = tmp_path / "gate.toml"
    for text in (f'[evidence]\nrules_file = "{broken}"\n', '[verify]\nranges_file = "nowhere.toml"\n',
                 f'[verify]\nranges_file = "{misspelt}"\n'):  # fmt: skip
        config.write_text(text)
        argv = ["serve", "--origin", "http://127.0.0.1:9", "--port", "9", "--cache-dir", str(tmp_path / "l2")]
        assert main([*argv, "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "not valid TOML" in err and "nowhere.toml' does not exist" in err and "listening" not in err
    assert "Googlbot: no such crawler family" in err
