"""One site's pages per cache folder: default folders per site or app, and a marker that refuses another site."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

from crawlergate.adapters.proxy import create_app
from crawlergate.config import L2Settings, ServerSettings, Settings, default_cache_root
from crawlergate.demo.run import free_port
from crawlergate.errors import ConfigError
from crawlergate.stores.disk import DiskStore
from crawlergate.stores.owner import MARKER_FILE, SITES_FOLDER, FolderOwner, claim_folder, read_owner, site_folder
from tests.conftest import ServerThread, wait_until_healthy
from tests.visitors import GOOGLEBOT

REPO = Path(__file__).resolve().parent.parent

STARLETTE_PROJECT = """
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.responses import HTMLResponse
from starlette.routing import Route

from crawlergate import CrawlerGateMiddleware
from crawlergate.config import Settings


async def home(request):
    return HTMLResponse("<h1>Hello from NAME</h1>")


app = Starlette(routes=[Route("/", home)])
app.add_middleware(CrawlerGateMiddleware, settings=Settings())  # FastAPI's way too
if __name__ == "__main__":
    uvicorn.run(app, port=int(sys.argv[1]), log_level="warning")
"""

FLASK_PROJECT = """
import sys
from wsgiref.simple_server import WSGIRequestHandler, make_server

from flask import Flask

from crawlergate import CrawlerGateWSGI
from crawlergate.config import Settings

app = Flask(__name__)


@app.get("/")
def home():
    return "<h1>Hello from NAME</h1>"


app.wsgi_app = CrawlerGateWSGI(app.wsgi_app, settings=Settings())


class Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


make_server("127.0.0.1", int(sys.argv[1]), app, handler_class=Quiet).serve_forever()
"""


@contextlib.contextmanager
def _project(folder: Path, source: str, command: list[str], cwd: Path) -> Iterator[str]:
    """A newcomer's project: ``app.py`` in its own folder, run from ``cwd`` with default settings."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "app.py").write_text(textwrap.dedent(source).replace("NAME", folder.name))
    port = free_port()
    environment = {key: value for key, value in os.environ.items() if not key.startswith("CRAWLERGATE_")}
    environment["CRAWLERGATE_REGENERATE_ENABLED"] = "false"
    environment["PYTHONPATH"] = str(REPO)
    argv = [arg.replace("PORT", str(port)) for arg in command]
    process = subprocess.Popen([sys.executable, *argv], cwd=cwd, env=environment, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(process, url, seconds=30)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=20)


def _crawl(url: str) -> tuple[str, str]:
    answer = httpx.get(url + "/", headers=GOOGLEBOT)
    return answer.headers["x-crawlergate"].split(";")[0], answer.text


def test_apps_with_default_settings_never_serve_each_others_pages(tmp_path: Path) -> None:
    """The newcomer's laptop: Starlette and Flask apps with the middleware and no settings, started from one
    folder with one launcher; and one app started in two ways keeps its pages."""
    blog, wiki, shop = tmp_path / "blog", tmp_path / "wiki", tmp_path / "shop"
    with _project(blog, STARLETTE_PROJECT, ["blog/app.py", "PORT"], tmp_path) as url:
        assert _crawl(url) == ("miss", "<h1>Hello from blog</h1>")
    with _project(wiki, STARLETTE_PROJECT, ["wiki/app.py", "PORT"], tmp_path) as url:
        assert _crawl(url) == ("miss", "<h1>Hello from wiki</h1>")
        assert _crawl(url) == ("l1-hit", "<h1>Hello from wiki</h1>")
    with _project(shop, FLASK_PROJECT, ["shop/app.py", "PORT"], tmp_path) as url:
        assert _crawl(url) == ("miss", "<h1>Hello from shop</h1>")
        plain = httpx.get(url + "/", headers={"user-agent": "curl/8.5.0"})
        assert plain.text == "<h1>Hello from shop</h1>"
    uvicorn = ["-m", "uvicorn", "--app-dir", str(blog), "app:app", "--port", "PORT"]
    with _project(blog, STARLETTE_PROJECT, uvicorn, REPO) as url:  # another launcher, another folder
        assert _crawl(url) == ("l2-hit", "<h1>Hello from blog</h1>")
    folders = sorted((default_cache_root() / "crawlergate" / SITES_FOLDER).iterdir())
    owners = [read_owner(folder / MARKER_FILE) for folder in folders]
    places = {owner.app.rpartition(" at ")[2] for owner in owners if owner is not None and str(tmp_path) in owner.app}
    assert places == {str(blog / "app.py"), str(wiki / "app.py"), str(shop / "app.py")}


def test_a_gate_of_another_site_refuses_the_folder_in_one_sentence(tmp_path: Path) -> None:
    folder = tmp_path / "l2"
    claim_folder(folder, FolderOwner(origin="http://127.0.0.1:8000"))
    claim_folder(folder, FolderOwner(origin="http://127.0.0.1:8000/"))  # the same site
    with pytest.raises(ConfigError) as refused:
        claim_folder(folder, FolderOwner(origin="http://127.0.0.1:9000"))
    message = str(refused.value)
    assert "\n" not in message and "http://127.0.0.1:8000" in message and "l2.cache_dir" in message
    # The application behind that origin, mounted as middleware: the same site (an app's name never refuses,
    # it changes with a refactor); the marker learns it.
    claim_folder(folder, FolderOwner(app="starlette.applications.Starlette in /home/me/forum"))
    recorded = FolderOwner(origin="http://127.0.0.1:8000", app="starlette.applications.Starlette in /home/me/forum")
    assert read_owner(folder / MARKER_FILE) == recorded


def test_an_origin_may_move_behind_its_public_url(tmp_path: Path) -> None:
    folder = tmp_path / "l2"
    claim_folder(folder, FolderOwner(public_url="https://forum.example.org", origin="http://10.0.0.5:8000"))
    moved = FolderOwner(public_url="https://forum.example.org/", origin="http://10.0.0.6:8000")
    claim_folder(folder, moved)
    assert read_owner(folder / MARKER_FILE) == FolderOwner("https://forum.example.org", "http://10.0.0.6:8000")
    with pytest.raises(ConfigError):
        claim_folder(folder, FolderOwner(public_url="https://wiki.example.org", origin="http://10.0.0.6:8000"))


def test_a_broken_marker_is_an_error_not_a_new_folder(tmp_path: Path) -> None:
    (tmp_path / MARKER_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match="delete it"):
        claim_folder(tmp_path, FolderOwner(origin="http://127.0.0.1:8000"))


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_on_another_sites_folder_stops_with_one_line(tmp_path: Path, workers: str) -> None:
    claim_folder(tmp_path / "l2", FolderOwner(origin="http://127.0.0.1:8000"))
    argv = ["serve", "--origin", "http://127.0.0.1:9000", "--port", str(free_port()), "--workers", workers]
    environment = {key: value for key, value in os.environ.items() if not key.startswith("CRAWLERGATE_")}
    finished = subprocess.run(
        [sys.executable, "-m", "crawlergate", *argv, "--cache-dir", str(tmp_path / "l2")],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
    )
    assert finished.returncode != 0
    assert "Traceback" not in finished.stderr
    assert "holds the pages of http://127.0.0.1:8000" in finished.stderr and "listening" not in finished.stderr


def test_a_configured_folder_from_before_markers_keeps_its_pages(tmp_path: Path) -> None:
    """An existing single-site cache keeps working after the upgrade: its keys and folder are unchanged."""

    async def page(request: Request) -> HTMLResponse:
        return HTMLResponse("<html><body>the forum</body></html>")

    origin = ServerThread(Starlette(routes=[Route("/", page)])).start()

    settings = Settings(server=ServerSettings(origin=origin.url), l2=L2Settings(cache_dir=str(tmp_path / "l2")))
    try:
        gate = ServerThread(create_app(settings)).start()
        assert _crawl(gate.url)[0] == "miss"
        gate.stop()
        (tmp_path / "l2" / MARKER_FILE).unlink()  # as a cache written before markers
        gate = ServerThread(create_app(settings)).start()
        assert _crawl(gate.url) == ("l2-hit", "<html><body>the forum</body></html>")
        gate.stop()
    finally:
        origin.stop()
    assert json.loads((tmp_path / "l2" / MARKER_FILE).read_text())["origin"] == origin.url


def test_default_folders_are_named_after_the_site_and_differ_per_site(tmp_path: Path) -> None:
    one = site_folder(tmp_path, FolderOwner(origin="http://127.0.0.1:8000"))
    other = site_folder(tmp_path, FolderOwner(origin="http://127.0.0.1:8001"))
    assert one.parent == other.parent == tmp_path / SITES_FOLDER and one != other
    assert one.name.startswith("127.0.0.1-8000-")
    assert Settings(server=ServerSettings(public_url="https://Forum.example.org/")).cache_dir.name.startswith(
        "forum.example.org-"
    )


def test_a_gate_on_the_old_shared_folder_never_counts_the_sites_under_it(tmp_path: Path) -> None:
    """The folder older versions shared holds the new per-site folders: a gate given it leaves them alone."""
    inner = DiskStore(site_folder(tmp_path, FolderOwner(origin="http://127.0.0.1:8000")), max_bytes=10**8)
    inner.set("ab" + "0" * 30, b"x" * 5000)
    outer = DiskStore(tmp_path, max_bytes=10**8)
    outer.start()
    assert outer.get("ab" + "0" * 30) is None and outer.digests() == []
    assert inner.get("ab" + "0" * 30) == b"x" * 5000


def test_a_public_url_and_an_origin_alone_are_not_the_same_site(tmp_path: Path) -> None:
    claim_folder(tmp_path / "l2", FolderOwner(public_url="https://blog.example"))
    with pytest.raises(ConfigError, match="the public URL 'https://blog.example' .server.public_url, or a site's"):
        claim_folder(tmp_path / "l2", FolderOwner(origin="http://127.0.0.1:9000"))
    claim_folder(tmp_path / "l2", FolderOwner(public_url="https://blog.example", origin="http://127.0.0.1:9000"))


def test_two_gates_starting_at_once_on_a_new_folder_cannot_both_claim_it(tmp_path: Path) -> None:
    for attempt in range(20):
        folder = tmp_path / f"l2-{attempt}"
        start = threading.Barrier(2)
        refused: list[str] = []

        def claim(
            origin: str, folder: Path = folder, start: threading.Barrier = start, refused: list[str] = refused
        ) -> None:
            start.wait()
            try:
                claim_folder(folder, FolderOwner(origin=origin))
            except ConfigError as exc:
                refused.append(str(exc))

        threads = [threading.Thread(target=claim, args=(f"http://127.0.0.1:{port}",)) for port in (8001, 8002)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(refused) == 1, refused


@pytest.mark.parametrize("content", ["[" * 100_000, "", "[]", "not json"])
def test_a_broken_marker_is_named_in_one_sentence(tmp_path: Path, content: str) -> None:
    (tmp_path / MARKER_FILE).write_text(content)
    with pytest.raises(ConfigError, match="delete it") as refused:
        claim_folder(tmp_path, FolderOwner(origin="http://127.0.0.1:8000"))
    assert "\n" not in str(refused.value)


def test_a_cache_folder_that_is_a_file_is_named_so(tmp_path: Path) -> None:
    (tmp_path / "l2").write_text("")
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        claim_folder(tmp_path / "l2", FolderOwner(origin="http://127.0.0.1:8000"))
    # A path through a file: the file is named, not a marker to delete that is not there.
    with pytest.raises(ConfigError, match=r"l2/pages cannot be made: \S+/l2 is a file\."):
        claim_folder(tmp_path / "l2" / "pages", FolderOwner(origin="http://127.0.0.1:8000"))


def test_a_site_at_a_new_address_is_told_to_delete_the_marker(tmp_path: Path) -> None:
    """The same site moved from http to https: giving it its old address back is no advice; deleting the marker is."""
    claim_folder(tmp_path / "l2", FolderOwner(public_url="http://forum.example"))
    with pytest.raises(ConfigError, match="delete .+crawlergate-site.json to make the folder this gate's") as refused:
        claim_folder(tmp_path / "l2", FolderOwner(public_url="https://forum.example"))
    assert "public_url" not in str(refused.value)
