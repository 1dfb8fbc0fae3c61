"""Debian's nginx in front of ``crawlergate serve`` in front of the demo forum, with the shipped config
(deploy/nginx/crawlergate.conf) on a loopback port instead of TLS on 443."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from crawlergate.demo.forum import create_forum
from tests.conftest import ServerThread, free_port, serve_process, wait_until_healthy
from tests.visitors import FIREFOX, GOOGLEBOT

pytestmark = pytest.mark.e2e

CONFIG = Path(__file__).parent.parent / "deploy" / "nginx" / "crawlergate.conf"
# Another loopback address, which the gate does not trust as a proxy (it trusts 127.0.0.1 and ::1): a visitor
# from elsewhere, as far as nginx and the gate can tell.
VISITOR = "127.0.0.2"


def _nginx_config(tmp_path: Path, nginx_port: int, gate_port: int, redirect_port: int, gate_dir: Path) -> Path:
    include = tmp_path / "include"
    # Crawlers' user agents learned from a log, long ones: the shipped file must size nginx's map hash for them.
    agents_log = tmp_path / "site-access.log"
    agents_log.write_text("".join(
        f'203.0.113.{n} - - [24/Nov/2026:18:30:00 +0000] "GET /t/{n} HTTP/1.1" 200 10 "-" '
        f'"Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; Googlebot/2.{n}; '
        f'+http://www.google.com/bot.html) Chrome/131.0.6778.{n} Safari/537.36"\n'
        for n in range(20)
    ))  # fmt: skip
    subprocess.run(
        [sys.executable, "-m", "crawlergate", "nginx-config", "--out", str(include), "--gate", f"127.0.0.1:{gate_port}",
         "--cache-dir", str(gate_dir / "l2"), "--direct-log", str(tmp_path / "direct.log"),
         "--origin", "http://127.0.0.1", "--agents-from", str(agents_log)],
        check=True, capture_output=True,
    )  # fmt: skip
    site = CONFIG.read_text()
    replaced = {
        "listen 443 ssl http2;": f"listen 127.0.0.1:{nginx_port};",
        "listen 80;": f"listen 127.0.0.1:{redirect_port};",
        "include /etc/nginx/crawlergate/": f"include {include}/",
        "root /srv/forum;": f"root {tmp_path};",
        "ssl_certificate /etc/ssl/certs/forum.example.pem;": "",
        "ssl_certificate_key /etc/ssl/private/forum.example.key;": "",
    }
    for shipped, here in replaced.items():
        assert shipped in site, f"{CONFIG} no longer holds {shipped!r}: update this test with it"
        site = site.replace(shipped, here)
    assert "include /etc/nginx/crawlergate" not in site, "the test must point every include at its own copy"
    (tmp_path / "site.conf").write_text(site)
    temp = {name: tmp_path / name for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi")}
    for folder in temp.values():
        folder.mkdir()
    main = f"""
user root;
worker_processes 1;
daemon off;
pid {tmp_path}/nginx.pid;
error_log {tmp_path}/error.log;
events {{ worker_connections 256; }}
http {{
    access_log {tmp_path}/nginx-access.log;
    client_body_temp_path {temp["body"]};
    proxy_temp_path {temp["proxy"]};
    fastcgi_temp_path {temp["fastcgi"]};
    uwsgi_temp_path {temp["uwsgi"]};
    scgi_temp_path {temp["scgi"]};
    include {tmp_path}/site.conf;
}}
"""
    (tmp_path / "nginx.conf").write_text(main)
    return tmp_path / "nginx.conf"


@pytest.fixture(scope="module")
def forum(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    server = ServerThread(create_forum(tmp_path_factory.mktemp("forum") / "forum.sqlite3", threads=30, work_ms=1))
    yield server.start()
    server.stop()


def test_nginx_front_serves_crawlers_from_the_gate_and_keeps_admin_closed(
    forum: ServerThread, nginx_binary: str, tmp_path: Path
) -> None:
    gate_dir, nginx_dir = tmp_path / "gate", tmp_path / "nginx"
    nginx_dir.mkdir()
    (nginx_dir / "static").mkdir()
    (nginx_dir / "static" / "site.css").write_text("body { color: black }")
    with serve_process(forum.url, gate_dir, "[regenerate]\nenabled = false\n") as gate:
        gate_port = int(gate.rsplit(":", 1)[1])
        nginx_port = free_port()
        redirect_port = free_port()
        config = _nginx_config(nginx_dir, nginx_port, gate_port, redirect_port, gate_dir)
        checked = subprocess.run([nginx_binary, "-t", "-c", str(config), "-p", str(nginx_dir)], capture_output=True)
        assert checked.returncode == 0, checked.stderr.decode()
        nginx = subprocess.Popen([nginx_binary, "-c", str(config), "-p", str(nginx_dir)], stderr=subprocess.DEVNULL)
        front = f"http://127.0.0.1:{nginx_port}"
        try:
            wait_until_healthy(nginx, front, seconds=20)  # the gate's healthz, through nginx
            visitor = httpx.Client(transport=httpx.HTTPTransport(local_address=VISITOR))
            # Crawlers: the gate's cached page, through nginx, compressed once.
            first = visitor.get(front + "/showthread.php?t=3", headers=GOOGLEBOT)
            again = visitor.get(front + "/showthread.php?t=3", headers=GOOGLEBOT)
            assert (first.headers["x-crawlergate"], again.headers["x-crawlergate"]) == ("miss", "l1-hit")
            assert again.headers["content-encoding"] == "gzip" and again.text == first.text and "<html" in again.text
            # People: the live forum; static files straight from nginx.
            person = visitor.get(front + "/showthread.php?t=3", headers={**FIREFOX, "x-forwarded-for": "6.6.6.6"})
            assert person.headers["x-crawlergate"] == "pass" and person.status_code == 200
            static = visitor.get(front + "/static/site.css")
            assert static.text == "body { color: black }" and "x-crawlergate" not in static.headers
            # Straight to the gate, a visitor's own X-Forwarded-For is not believed.
            visitor.get(gate + "/showthread.php?t=4", headers={**FIREFOX, "x-forwarded-for": "7.7.7.7"})
            # The admin endpoints: closed by nginx to the visitor, open to this machine; healthz to everyone.
            assert visitor.get(front + "/_crawlergate/stats").status_code == 403
            assert visitor.get(front + "/_crawlergate/").status_code == 403
            assert visitor.get(front + "/_crawlergate").status_code == 403
            moved = visitor.get(f"http://127.0.0.1:{redirect_port}/showthread.php?t=3", headers=GOOGLEBOT)
            assert moved.status_code == 301 and moved.headers["location"].startswith("https://127.0.0.1")
            assert visitor.get(front + "/_crawlergate/healthz").status_code == 200
            assert httpx.get(front + "/_crawlergate/stats").status_code == 200
            visitor.close()
        finally:
            nginx.send_signal(signal.SIGQUIT)
            nginx.wait(timeout=20)
    # The gate logged the visitor's own address: the one nginx saw, never what the visitor claimed.
    log = (gate_dir / "l2" / "access.log").read_text().splitlines()
    clients = {line.split()[0] for line in log}
    assert clients == {VISITOR}, log
