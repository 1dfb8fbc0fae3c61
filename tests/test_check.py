"""`crawlergate check`: why a page is or is not stored and for how long, as a guest of the public URL, with every
reason named and a broken site or input reported in one line, never a traceback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from crawlergate.cli import main
from tests.conftest import ServerThread, free_port

pytestmark = pytest.mark.e2e


def _site() -> Starlette:
    async def page(request: Request) -> Response:
        response = HTMLResponse(
            f"<p>host {request.headers['host']} proto {request.headers['x-forwarded-proto']}</p>",
            headers={"cache-control": "private, max-age=0", "x-robots-tag": "noarchive"},
        )
        response.set_cookie("sessionid", "guest")
        return response

    async def secret(request: Request) -> Response:
        return HTMLResponse("<p>account</p>", headers={"cache-control": "no-store"})

    async def broken(request: Request) -> Response:
        return HTMLResponse("<p>oops</p>", status_code=500)

    return Starlette(routes=[Route("/page", page), Route("/secret", secret), Route("/broken", broken)])


@pytest.fixture(scope="module")
def site() -> Iterator[ServerThread]:
    server = ServerThread(_site()).start()
    yield server
    server.stop()


def test_check_stored_page_says_for_how_long_and_despite_what(
    site: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["check", "/page", "--origin", site.url, "--public-url", "https://forum.example"])
    out = capsys.readouterr().out
    assert code == 0
    assert "stored:  yes, for 1 d (storage mode guest)" in out
    assert "Set-Cookie (sessionid)" in out and "Cache-Control: private" in out
    assert "headers kept with the page: x-robots-tag" in out
    assert "key:     /page" in out


@pytest.mark.parametrize(
    ("path", "flags", "reason"),
    [
        pytest.param("/login", [], "excluded", id="excluded"),
        pytest.param("/secret", [], "no-store", id="no-store"),
        pytest.param("/page", ["--strict"], "set-cookie-strict", id="strict-cookie"),
        pytest.param("/broken", [], "origin-error", id="site-error"),
        pytest.param("/style.css", [], "excluded", id="static"),
    ],
)
def test_check_names_every_reason_and_exits_1(
    site: ServerThread, capsys: pytest.CaptureFixture[str], path: str, flags: list[str], reason: str
) -> None:
    code = main(["check", f"{site.url}{path}", *flags, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1
    assert report["stored"] is False
    assert reason in [item["reason"] for item in report["reasons"]]


def test_check_fills_as_a_guest_of_the_public_url(site: ServerThread, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "/page", "--origin", site.url, "--public-url", "https://forum.example", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["public_url"] == "https://forum.example"
    assert report["fetched"] == f"{site.url}/page"


def test_check_unreachable_site_is_a_reason_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["check", f"http://127.0.0.1:{free_port()}/page"])
    out = capsys.readouterr().out
    assert code == 1 and "origin-error:" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["check", "/page"], "give --origin", id="path-without-origin"),
        pytest.param(["check", "ftp://x/page"], "not an http:// or https:// URL", id="scheme"),
        pytest.param(["check", "page"], "neither a URL nor a path", id="relative"),
        pytest.param(["check", "/p", "--origin", "http://x", "--site", "nope"], "no site profile", id="profile"),
    ],
)
def test_check_bad_input_is_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_check_with_a_site_profile_excludes_its_paths(site: ServerThread, tmp_path: Path, capsys) -> None:
    assert main(["check", f"{site.url}/newticket", "--site", "trac"]) == 1
    assert "excluded: the path matches the exclude pattern '/newticket*'" in capsys.readouterr().out
    assert main(["check", f"{site.url}/index.php?title=Special:Search&search=x", "--site", "mediawiki"]) == 1
    assert (
        "the query parameter 'title' matches the [query] exclude pattern 'title=Special:*'" in capsys.readouterr().out
    )


def test_check_unreachable_origin_is_named_not_a_502_of_ours(capsys: pytest.CaptureFixture[str]) -> None:
    origin = f"http://127.0.0.1:{free_port()}"
    assert main(["check", "/page", "--origin", origin, "--public-url", "https://f.example"]) == 1
    out = capsys.readouterr().out
    assert f"origin-error: the origin {origin} cannot be reached" in out
    assert "no-store" not in out and "answered 502" not in out


@pytest.mark.parametrize(
    ("config", "message"),
    [
        pytest.param('[regenerate]\nwindow = "61 3 * * *"\n', "It is no cron expression", id="cron"),
        pytest.param('[cache]\nrules_file = "missing.toml"\n', "missing.toml", id="cache-rules"),
    ],
)
def test_check_refuses_the_settings_serve_would_refuse(
    site: ServerThread, tmp_path: Path, config: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # An upgrade runs check against the new settings before it restarts the gate (docs: production).
    (tmp_path / "gate.toml").write_text(config)
    assert main(["check", f"{site.url}/page", "--config", str(tmp_path / "gate.toml")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_check_through_the_middleware_says_a_gate_answered(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Pointed at an app wrapped by the middleware, check's guest request is a crawler's to the gate: it is
    answered from the cache, so the report warns that it judges the gate's copy, not the site."""
    from crawlergate import CrawlerGateMiddleware
    from crawlergate.config import load_settings

    settings = load_settings(environ={}, overrides={"l2.cache_dir": str(tmp_path / "l2")})
    wrapped = ServerThread(CrawlerGateMiddleware(_site(), settings=settings)).start()
    try:
        main(["check", "/page", "--origin", wrapped.url, "--json"])
        first = json.loads(capsys.readouterr().out)
        main(["check", "/page", "--origin", wrapped.url])
        text = capsys.readouterr().out
    finally:
        wrapped.stop()
    assert first["gate_outcome"] == "miss"
    assert "warning: a crawlergate gate answered (X-Crawlergate: l1-hit), not the site itself" in text
