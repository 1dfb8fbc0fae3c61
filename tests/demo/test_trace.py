"""The synthetic trace the demo replays has the paper's shape: its mix of crawlers and people, crawlers
sweeping breadth first day and night, people on a daily curve and Zipf popularity, the same every run."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from crawlergate.classify import Classifier
from crawlergate.config import ClassifySettings
from crawlergate.demo.seed import seed_database
from crawlergate.demo.trace import TraceSpec, structure_of, write_trace
from crawlergate.tools.logparse import LogReader


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("trace")
    seed_database(folder / "forum.sqlite3", threads=400, seed=5)
    path = folder / "forum.log"
    write_trace(path, TraceSpec(requests=6000, seed=5), structure_of(folder / "forum.sqlite3"))
    return path


def test_trace_is_a_parseable_timed_log_in_time_order(trace: Path) -> None:
    reader = LogReader(trace)
    records = list(reader)
    assert reader.malformed == 0 and reader.format.has_duration
    assert [r.timestamp for r in records] == sorted(r.timestamp for r in records)
    assert records[-1].timestamp - records[0].timestamp > 20 * 3600


def test_trace_has_the_papers_mix(trace: Path) -> None:
    classifier = Classifier.from_settings(ClassifySettings())
    records = list(LogReader(trace))
    pages = [r for r in records if r.method == "GET" and not r.path.startswith("/static/")]
    crawler_pages = sum(classifier.classify(r.user_agent).is_crawler for r in pages)
    assert crawler_pages / len(pages) == pytest.approx(0.68, abs=0.01)
    assert any(r.method == "POST" and r.path == "/newreply.php" for r in records)
    assert any(r.path == "/static/forum.css" for r in records)


def test_trace_crawlers_sweep_breadth_first_and_reach_most_threads(trace: Path, tmp_path: Path) -> None:
    classifier = Classifier.from_settings(ClassifySettings())
    sweep = tmp_path / "sweep.log"
    write_trace(sweep, TraceSpec(requests=6000, seed=5, follow_share=0.0), structure_of(trace.parent / "forum.sqlite3"))
    googlebot = [r.target for r in LogReader(sweep) if classifier.classify(r.user_agent).family == "Googlebot"]
    assert googlebot[0] == "/"
    assert googlebot[1].startswith("/forumdisplay.php")
    crawled = {target.split("t=")[1].split("&")[0] for target in googlebot if target.startswith("/showthread")}
    assert len(crawled) > 0.8 * 400


def test_trace_humans_follow_a_diurnal_curve_and_zipf_popularity(trace: Path) -> None:
    classifier = Classifier.from_settings(ClassifySettings())
    humans = [r for r in LogReader(trace) if not classifier.classify(r.user_agent).is_crawler]
    by_hour = Counter(int(r.timestamp // 3600) % 24 for r in humans)
    assert by_hour[12] > 3 * by_hour[4]
    threads = Counter(r.target for r in humans if r.target.startswith("/showthread"))
    top = threads.most_common(10)
    assert top[0][1] > 5 * (sum(threads.values()) / len(threads))


def test_trace_crawlers_follow_where_humans_go(trace: Path) -> None:
    classifier = Classifier.from_settings(ClassifySettings())
    records = list(LogReader(trace))
    human_threads = {r.target for r in records if not classifier.classify(r.user_agent).is_crawler}
    crawler_threads = [r.target for r in records if classifier.classify(r.user_agent).is_crawler]
    followed = sum(target in human_threads for target in crawler_threads) / len(crawler_threads)
    assert followed > 0.4


def test_trace_spans_the_whole_duration_for_crawlers(trace: Path) -> None:
    classifier = Classifier.from_settings(ClassifySettings())
    hours = Counter(
        int(r.timestamp // 3600) % 24 for r in LogReader(trace) if classifier.classify(r.user_agent).is_crawler
    )
    assert min(hours[hour] for hour in range(24)) > 0.5 * max(hours.values())


def test_trace_is_reproducible(trace: Path, tmp_path: Path) -> None:
    again = tmp_path / "again.log"
    write_trace(again, TraceSpec(requests=6000, seed=5), structure_of(trace.parent / "forum.sqlite3"))
    assert again.read_bytes() == trace.read_bytes()


def test_cli_demo_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from crawlergate.cli import main

    out = tmp_path / "t.log"
    argv = ["demo", "trace", "--out", str(out), "--requests", "500", "--threads", "100", "--db", str(tmp_path / "f.db")]
    assert main(argv) == 0
    assert "wrote" in capsys.readouterr().out
    assert sum(1 for _ in LogReader(out)) >= 500
