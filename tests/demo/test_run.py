"""`crawlergate demo` end to end at a small scale: the forum, the gate (with nginx in front too) and the
comparison it prints, and its servers stopped on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from crawlergate.cli import main

pytestmark = pytest.mark.e2e


def test_demo_end_to_end_at_a_small_scale(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Its gate runs on the demo's settings: an admin prefix of the config's own is where the demo reads stats.
    config = tmp_path / "crawlergate.toml"
    config.write_text('[admin]\nprefix = "/_gate"\n[classify]\nignored_cookies = ["_ga", "consent"]\n')
    argv = ["demo", "--threads", "60", "--requests", "240", "--work-ms", "2", "--concurrency", "4"]
    assert main([*argv, "--dir", str(tmp_path), "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "throughput" in out and "crawler mean TTFB" in out and "human mean TTFB" in out
    assert "crawler hit ratio" in out
    report = tmp_path / "report.html"
    html = report.read_text()
    assert html.count('class="chart"') >= 4 and "Through crawlergate: crawlers " in html and "118× faster" in html
    assert (tmp_path / "trace.log").exists()
    assert list((tmp_path / "l2").rglob("*.page"))


def test_demo_with_nginx_in_front_counts_direct_hits(
    nginx_binary: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["demo", "--front", "nginx", "--threads", "60", "--requests", "240", "--work-ms", "2", "--concurrency", "4"]
    assert main([*argv, "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    direct = re.search(r"([\d,]+) answered by nginx from the published tree", out)
    assert direct is not None and int(direct.group(1).replace(",", "")) > 0, out
    assert list((tmp_path / "l2" / "published").rglob("*.gz"))


def test_demo_serve_names_the_dashboard_and_stops_its_servers_on_sigterm(tmp_path: Path) -> None:
    argv = ["demo", "--threads", "60", "--requests", "240", "--work-ms", "2", "--concurrency", "4", "--serve"]
    environment = {key: value for key, value in os.environ.items() if not key.startswith("CRAWLERGATE_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "crawlergate", *argv, "--dir", str(tmp_path)],
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    with process.stderr:
        try:
            deadline = time.monotonic() + 240
            serving = ""
            while time.monotonic() < deadline and not serving:
                line = process.stderr.readline()
                assert line or process.poll() is None, "the demo ended before serving"
                if "serving until Ctrl-C" in line:
                    serving = line
            urls = re.findall(r"http://127\.0\.0\.1:\d+", serving)
            forum, gate = urls[0], urls[1]
            assert f"its dashboard on {gate}/_crawlergate/" in serving
            assert httpx.get(gate + "/_crawlergate/healthz").status_code == 200
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    for url in (forum, gate):
        with pytest.raises(httpx.TransportError):
            httpx.get(url + "/", timeout=2)
