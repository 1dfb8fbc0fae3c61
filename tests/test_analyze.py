"""`crawlergate analyze` on access logs: the hourly profile of crawlers and people, and the quiet hours it suggests,
sensible for small logs, parts of a day and any time zone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crawlergate.classify import Classifier
from crawlergate.config import ClassifySettings
from crawlergate.tools.analyze import profile_log
from crawlergate.tools.logparse import LogReader
from tests.visitors import FIREFOX_UA, GOOGLEBOT_UA


def _line(agent: str, target: str, hour: int, second: int, micros: int) -> str:
    stamp = f"10/Oct/2000:{hour:02d}:00:{second:02d} +0000"
    return f'1.2.3.4 - - [{stamp}] "GET {target} HTTP/1.1" 200 10 "-" "{agent}" {micros}\n'


@pytest.fixture
def log(tmp_path: Path) -> Path:
    lines = []
    for hour in range(24):
        humans = 1 if hour == 4 else 10  # the trough is at four in the morning
        lines += [_line(FIREFOX_UA, f"/t/{n}", hour, n, 100) for n in range(humans)]
        lines += [_line(GOOGLEBOT_UA, f"/t/{hour * 2 + n}", hour, 10 * n, 160_000) for n in range(2)]
    path = tmp_path / "access.log"
    path.write_text("".join(lines) + "not a line\n")
    return path


def test_analyze_profile(log: Path) -> None:
    classifier = Classifier.from_settings(ClassifySettings())
    profile = profile_log(LogReader(log), classifier)
    assert profile.by_hour["crawler"] == [2] * 24
    assert profile.by_hour["human"][4] == 1 and profile.off_peak_hour == 4
    assert profile.share.share("crawler", "requests") == pytest.approx(48 / (48 + 231))
    assert profile.share.share("crawler", "time") > 0.99
    assert len(profile.pages_crawled) == 48 and len(profile.pages_all) == 48
    gaps = profile.arrivals["Googlebot"].summary()
    assert gaps["gaps"] == 47
    # 24 gaps of 10 s within an hour, 23 of 3590 s from :10 of one hour to :00 of the next.
    assert gaps["median_s"] == 10.0
    assert gaps["mean_s"] == pytest.approx((24 * 10 + 23 * 3590) / 47, abs=0.01)


def test_cli_analyze(log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from crawlergate.cli import main

    out_json, out_html = tmp_path / "a.json", tmp_path / "a.html"
    assert main(["analyze", str(log), "--json", str(out_json), "--report", str(out_html)]) == 0
    text = capsys.readouterr().out
    assert "off-peak hour for regeneration: 04:00" in text and "1 malformed" in text
    data = json.loads(out_json.read_text())
    assert data["off_peak_hour"] == 4 and data["crawler_breadth"] == 1.0
    assert data["crawler_families"]["Googlebot"]["pages"] == 48
    html = out_html.read_text()
    assert 'class="chart"' in html and "the off-peak hour is 04:00 UTC" in html and "off-peak 04:00" in html


def test_analyze_part_of_a_day_suggests_only_hours_it_covers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from crawlergate.cli import main

    path = tmp_path / "afternoon.log"
    path.write_text("".join(_line(FIREFOX_UA, "/t/1", hour, 0, 100) * (hour - 10) for hour in (14, 15, 16)))
    assert main(["analyze", str(path), "--json", "-"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)  # only JSON on standard output
    assert data["off_peak_hour"] == 14
    assert "no data" in captured.err and "among the 3 hours the log covers" in captured.err


@pytest.mark.parametrize(
    "lines",
    [
        pytest.param([_line(GOOGLEBOT_UA, "/t/1", 3, 0, 100)], id="one-request"),
        pytest.param([_line(FIREFOX_UA, "/only", hour, 0, 100) for hour in range(24)], id="one-page"),
    ],
)
def test_cli_tiny_logs_give_sensible_answers(tmp_path: Path, capsys: pytest.CaptureFixture[str], lines) -> None:
    from crawlergate.cli import main

    path = tmp_path / "tiny.log"
    path.write_text("".join(lines))
    for command in (["analyze"], ["simulate", "--no-cache"], ["classify", "--log"]):
        assert main([*command, str(path)]) == 0, command
        out = capsys.readouterr().out
        assert "Traceback" not in out and "1 B" not in out


def test_analyze_compares_hours_per_day_in_utc(tmp_path: Path) -> None:
    # 36 hours from midnight UTC: hours 0-11 are seen on two days with 40 human requests a day, the
    # others on one day with 60. The quietest hour a day is within 0-11, though its total is 80.
    lines = []
    for offset in range(36):
        day, hour = divmod(offset, 24)
        count = 40 if hour < 12 else 60
        stamp = f"{10 + day:02d}/Oct/2000:{hour:02d}:00:00 +0000"
        lines += [f'1.2.3.4 - - [{stamp}] "GET /t/{n} HTTP/1.1" 200 10 "-" "{FIREFOX_UA}" 100\n' for n in range(count)]
    zone = '1.2.3.4 - - [10/Oct/2000:14:25:01 -0500] "GET / HTTP/1.1" 200 10 "-" "Firefox/1" 100\n'
    path = tmp_path / "days.log"
    path.write_text("".join(lines) + zone)
    profile = profile_log(LogReader(path), Classifier.from_settings(ClassifySettings()))
    assert profile.off_peak_hour == 0
    assert profile.humans_per_day(0) == 40 and profile.humans_per_day(13) == 60
    assert profile.by_hour["human"][19] == 61  # 14:25 at -0500 is 19:25 UTC


def test_analyze_counts_an_hour_without_requests_inside_the_log_as_quiet(tmp_path: Path) -> None:
    # Two whole days of a small site: ten people an hour, none at all at 04:00, and 03:00 busy on the first day
    # only. An hour the log spans is data even when nobody came: 04:00 is the quietest, 03:00 has 6 a day.
    lines = []
    for day in (10, 11):
        for hour in range(24):
            count = 0 if hour == 4 else 12 if hour == 3 and day == 10 else 0 if hour == 3 else 10
            stamp = f"{day:02d}/Oct/2000:{hour:02d}:30:00 +0000"
            lines += [
                f'1.2.3.4 - - [{stamp}] "GET /t/{n} HTTP/1.1" 200 10 "-" "{FIREFOX_UA}" 100\n' for n in range(count)
            ]
    path = tmp_path / "small.log"
    path.write_text("".join(lines))
    profile = profile_log(LogReader(path), Classifier.from_settings(ClassifySettings()))
    assert profile.hours_with_data() == list(range(24))
    assert profile.off_peak_hour == 4
    assert profile.humans_per_day(3) == 6 and profile.humans_per_day(12) == 10
