from __future__ import annotations

import re
from pathlib import Path

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
