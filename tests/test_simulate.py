"""`crawlergate simulate`: the cache policies (LRU, Belady's MIN, CLOCK, random, static…) on textbook strings and
traces, bounded in bytes, and the size sweep with its knee."""

from __future__ import annotations

import json
from array import array
from pathlib import Path

import pytest
from hypothesis import given, settings as hypothesis_settings, strategies as st

from crawlergate.classify import Classifier
from crawlergate.config import ClassifySettings
from crawlergate.keys import KeyMaker
from crawlergate.rules import default_rules_dir, load_cache_rules
from crawlergate.tools.simulate import POLICIES, Trace, knee, load_trace, parse_trace, simulate, size_sweep
from tests.visitors import FIREFOX_UA, GOOGLEBOT_UA

# Silberschatz, Operating System Concepts, the reference string of the page-replacement chapter.
TEXTBOOK = [7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1]


def _trace(pages: list[int], crawler: list[int] | None = None, days: list[int] | None = None, size: int = 1) -> Trace:
    count = len(pages)
    return Trace(
        pages=array("I", pages),
        crawler=bytearray(crawler if crawler is not None else [1] * count),
        day_runs=_runs(days or [0] * count),
        sizes=array("I", [size] * (max(pages) + 1)),
        targets=[f"/p{page}" for page in range(max(pages) + 1)],
        lines=count,
        malformed=0,
    )


def _runs(days: list[int]) -> list[tuple[int, int]]:
    return [(index, day) for index, day in enumerate(days) if index == 0 or days[index - 1] != day]


def test_simulate_lru_on_the_textbook_string() -> None:
    # Textbook LRU with 3 frames: 12 faults, so 8 hits.
    result = simulate(_trace(TEXTBOOK), "lru", 3)
    assert (result.hits, result.lookups) == (8, 20)


def test_simulate_belady_on_the_textbook_string() -> None:
    # By hand (README of tests): classic OPT faults 9 times; MIN that may decline to admit a page never
    # needed again (4 at step 8, 7 at step 18) faults 8 times: 12 hits.
    assert simulate(_trace(TEXTBOOK), "min", 3).hits == 12


def test_simulate_clock_gives_a_second_chance() -> None:
    # 1 2 3 fill; 1 is referenced; 4 sweeps past 1 (clearing it) and evicts 2; so 1 survives and hits.
    assert simulate(_trace([1, 2, 3, 1, 4, 1]), "clock", 3).hits == 2
    assert simulate(_trace([1, 2, 3, 1, 4, 2, 5, 1]), "clock", 3).hits == 1


def test_simulate_respects_bytes() -> None:
    trace = _trace([0, 1, 0, 1], size=60)
    assert simulate(trace, "lru", 100).hits == 0  # two 60-byte pages never fit together
    assert simulate(trace, "lru", 120).hits == 2


def test_simulate_random_is_seeded_and_bounded() -> None:
    trace = _trace(TEXTBOOK)
    first, second = simulate(trace, "random", 3, seed=1), simulate(trace, "random", 3, seed=1)
    assert first == second
    assert first.hits <= simulate(trace, "infinite", 3).hits


def test_simulate_static_uses_yesterdays_most_crawled_pages() -> None:
    # Day 0: page 1 three times, page 2 once. Day 1: pages 1, 2, 3 once each; one page fits.
    trace = _trace([1, 1, 1, 2, 1, 2, 3], days=[0, 0, 0, 0, 1, 1, 1])
    result = simulate(trace, "static", 1)
    assert (result.hits, result.lookups) == (1, 7)


def test_simulate_humans_load_pages_only_where_the_policy_says() -> None:
    # A human views page 5, then a crawler asks for it.
    trace = _trace([5, 5], crawler=[0, 1])
    assert simulate(trace, "lru", 10).hits == 0
    assert simulate(trace, "lru+human", 10).hits == 1
    assert simulate(trace, "infinite", 10).hits == 1
    assert simulate(trace, "lru+human", 10).lookups == 1


def test_simulate_lru_human_never_worse_when_humans_lead_crawlers() -> None:
    pages, crawler = [], []
    for step in range(2000):
        hot = step % 50
        pages += [100 + hot, 100 + hot, step % 400]  # a human view, a crawler following it, a crawler sweep
        crawler += [0, 1, 1]
    trace = _trace(pages, crawler)
    for size in (5, 20, 60, 200):
        assert simulate(trace, "lru+human", size).hit_ratio >= simulate(trace, "lru", size).hit_ratio
        assert simulate(trace, "lru+human", 20).hit_ratio > simulate(trace, "lru", 20).hit_ratio


@pytest.mark.parametrize("size", [2, 3, 5, 8])
def test_simulate_min_and_infinite_bound_the_practical_policies(size: int) -> None:
    trace = _trace(TEXTBOOK * 3, crawler=[1, 0, 1, 1] * 15)
    practical = [simulate(trace, policy, size).hit_ratio for policy in ("lru", "lru+human", "clock", "random")]
    assert simulate(trace, "min", size).hit_ratio >= max(practical)
    assert simulate(trace, "infinite", size).hit_ratio >= simulate(trace, "min", size).hit_ratio


def test_simulate_unknown_policy() -> None:
    with pytest.raises(ValueError, match="unknown policy"):
        simulate(_trace([1]), "fifo", 1)


def test_simulate_size_sweep_and_knee() -> None:
    sizes = size_sweep(_trace([0, 1, 2], size=1000), 5)
    assert sizes[0] < sizes[-1] == 3000 and sizes == sorted(sizes)
    assert knee([(1, 0.1), (2, 0.6), (3, 0.7), (4, 0.75), (5, 0.78)]) == 2


@pytest.fixture(scope="module")
def parsing() -> tuple[Classifier, KeyMaker]:
    keys = KeyMaker(load_cache_rules(default_rules_dir() / "cache.toml"), admin_prefix="/_crawlergate")
    return Classifier.from_settings(ClassifySettings()), keys


def _line(agent: str, target: str, status: int = 200, size: int = 1000, method: str = "GET") -> str:
    return f'1.2.3.4 - - [10/Oct/2000:13:55:36 +0000] "{method} {target} HTTP/1.1" {status} {size} "-" "{agent}" 1500\n'


def test_parse_trace_keeps_cacheable_pages_and_counts_malformed(tmp_path: Path, parsing) -> None:
    log = tmp_path / "access.log"
    log.write_text(
        _line(GOOGLEBOT_UA, "/t/1?utm_source=x")
        + "garbage that is not a log line\n\n"
        + _line(FIREFOX_UA, "/t/1")
        + _line(GOOGLEBOT_UA, "/style.css")
        + _line(GOOGLEBOT_UA, "/t/2", status=500)
        + _line(GOOGLEBOT_UA, "/t/2", method="POST")
        + _line(GOOGLEBOT_UA, "/t/3", size=5000)
        + _line(GOOGLEBOT_UA, "/t/3", size=9000)
        + '1.2.3.4 - - [10/Oct/2000:13:55:36 +0000] "GET /t/4 HTTP/1.1" 200 10 "-" "cut'
    )
    trace = parse_trace(log, *parsing)
    assert trace.targets == ["/t/1", "/t/3"]
    assert list(trace.pages) == [0, 0, 1, 1]
    assert list(trace.crawler) == [1, 0, 1, 1]
    assert list(trace.sizes) == [1000, 5000]
    assert (trace.lines, trace.malformed) == (10, 2)


def test_parse_trace_sizes_a_page_by_its_first_answer_with_a_body(tmp_path: Path, parsing) -> None:
    """A HEAD's 0 bytes is no size: a page that weighs nothing would never be evicted in the simulation."""
    log = tmp_path / "access.log"
    log.write_text(
        _line(GOOGLEBOT_UA, "/t/1", size=0, method="HEAD")
        + _line(GOOGLEBOT_UA, "/t/1", size=20_000)
        + _line(GOOGLEBOT_UA, "/t/1", size=7)
    )
    assert list(parse_trace(log, *parsing).sizes) == [20_000]


def test_parse_trace_takes_a_missing_user_agent_for_a_person(tmp_path: Path, parsing) -> None:
    """ "-" is the log's "none", a person's as the gate, analyze and classify --log take it."""
    log = tmp_path / "access.log"
    log.write_text(_line("-", "/t/1") + _line(GOOGLEBOT_UA, "/t/1"))
    assert list(parse_trace(log, *parsing).crawler) == [0, 1]


def test_parse_trace_admits_the_statuses_the_gate_stores(tmp_path: Path, parsing) -> None:
    log = tmp_path / "access.log"
    statuses = [200, 301, 302, 304, 308, 403, 404, 410, 500, 503]
    log.write_text("".join(_line(GOOGLEBOT_UA, f"/s/{status}", status=status) for status in statuses))
    assert parse_trace(log, *parsing).targets == ["/s/200", "/s/301", "/s/308", "/s/404", "/s/410"]


def test_load_trace_reuses_the_cached_form(tmp_path: Path, parsing) -> None:
    log = tmp_path / "access.log"
    log.write_text(_line(GOOGLEBOT_UA, "/t/1") * 3)
    first = load_trace(log, *parsing, cache_dir=tmp_path / "cache", rules_fingerprint="r1")
    cached = list((tmp_path / "cache").iterdir())
    assert len(cached) == 1
    second = load_trace(log, *parsing, cache_dir=tmp_path / "cache", rules_fingerprint="r1")
    assert list(second.pages) == list(first.pages)
    cached[0].write_bytes(b"damaged")
    assert list(load_trace(log, *parsing, cache_dir=tmp_path / "cache", rules_fingerprint="r1").pages) == [0, 0, 0]
    load_trace(log, *parsing, cache_dir=tmp_path / "cache", rules_fingerprint="other rules")
    assert len(list((tmp_path / "cache").iterdir())) == 2


def test_cli_simulate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from crawlergate.cli import main

    log = tmp_path / "access.log"
    log.write_text("".join(_line(GOOGLEBOT_UA if n % 3 else FIREFOX_UA, f"/t/{n % 7}") for n in range(200)))
    out_json, out_html = tmp_path / "sim.json", tmp_path / "sim.html"
    argv = [
        "simulate",
        str(log),
        "--sizes",
        "2kB,5kB",
        "--json",
        str(out_json),
        "--report",
        str(out_html),
        "--no-cache",
    ]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "lru+human" in text and "recommended L1 size" in text
    data = json.loads(out_json.read_text())
    assert data["requests"] == 200 and data["unique_pages"] == 7
    assert {result["policy"] for result in data["results"]} == set(POLICIES)
    assert {result["size_bytes"] for result in data["results"]} == {2000, 5000}
    assert all(0 <= result["hit_ratio"] <= 1 for result in data["results"])
    html = out_html.read_text()
    assert 'class="chart"' in html and "Recommended L1 size: " in html


def test_cli_simulate_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    from crawlergate.cli import main

    with pytest.raises(SystemExit):
        main(["simulate", "x.log", "--policies", "fifo"])
    assert "unknown policy fifo" in capsys.readouterr().err
    assert main(["simulate", "/nonexistent.log"]) == 2


def test_parse_trace_in_parallel_equals_one_pass(tmp_path: Path, parsing, monkeypatch: pytest.MonkeyPatch) -> None:
    from crawlergate.tools import simulate as simulate_module

    log = tmp_path / "access.log"
    days = ["10/Oct/2000", "11/Oct/2000", "12/Oct/2000"]
    with log.open("w") as handle:
        for n in range(3000):
            size = 0 if n < 1500 and n % 5 == 0 else 100 + n % 50  # HEADs' zeros, their pages sized later
            line = _line(GOOGLEBOT_UA if n % 4 else FIREFOX_UA, f"/t/{(n * 7) % 211}?page={n % 3}", size=size)
            handle.write(line.replace("10/Oct/2000", days[n * 3 // 3000]))
        handle.write("a malformed line\n")
    monkeypatch.setattr(simulate_module, "PARALLEL_MIN_BYTES", 0)
    one = parse_trace(log, *parsing, workers=1)
    three = parse_trace(log, *parsing, workers=3)
    assert (one.targets, list(one.pages), one.crawler, one.day_runs, one.sizes) == (
        three.targets,
        list(three.pages),
        three.crawler,
        three.day_runs,
        three.sizes,
    )
    assert all(one.sizes)
    assert one.day_runs == [(0, 0), (1000, 1), (2000, 2)]
    assert (three.lines, three.malformed) == (3001, 1)


@hypothesis_settings(max_examples=150, deadline=None)
@given(
    pages=st.lists(st.integers(0, 30), min_size=1, max_size=300),
    page_bytes=st.integers(1, 5000),
    slots=st.integers(1, 32),
)
def test_simulate_lru_is_monotonic_in_size_for_equal_pages(pages: list[int], page_bytes: int, slots: int) -> None:
    # LRU is a stack algorithm (Mattson et al. 1970): with pages of one size, a larger cache holds a
    # superset of a smaller one's pages at every step, so its hit ratio can never be lower.
    trace = _trace(pages, size=page_bytes)
    smaller = simulate(trace, "lru", slots * page_bytes)
    larger = simulate(trace, "lru", (slots + 1) * page_bytes)
    assert larger.hits >= smaller.hits


def test_simulate_pages_over_the_item_limit_never_enter_l1() -> None:
    trace = _trace([0, 1, 0, 1, 0, 1])
    trace.sizes = array("I", [100, 40_000_000])
    unlimited = simulate(trace, "lru", 50_000_000)
    limited = simulate(trace, "lru", 50_000_000, item_max_bytes=1024 * 1024)
    assert (unlimited.hits, limited.hits) == (4, 2)  # the 40 MB download no longer holds L1
