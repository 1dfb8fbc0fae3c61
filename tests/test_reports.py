"""The HTML reports, opened in headless Chromium: they draw, fit a laptop window, and say their result first."""

from __future__ import annotations

import random
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crawlergate.classify import Classifier
from crawlergate.config import ClassifySettings
from crawlergate.demo.run import Experiment, demo_report
from crawlergate.tools.analyze import profile_html, profile_log
from crawlergate.tools.logparse import LogReader
from crawlergate.tools.replay import ReplayResult, Sample
from crawlergate.tools.replayreport import comparison_headline, report_html
from crawlergate.tools.report import bar_chart, line_chart
from crawlergate.tools.simulate import POLICIES, Trace, run_simulation
from crawlergate.tools.simulatereport import report_html as simulate_html
from tests.browser import chromium, has_horizontal_scroll, screenshot
from tests.visitors import BINGBOT_UA, FIREFOX_UA, GOOGLEBOT_UA


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


def _open(browser: Any, tmp_path: Path, name: str, html: str) -> Any:
    """Open the page, check what every report must do, save screenshots (the window, then the whole page)."""
    path = tmp_path / f"{name}.html"
    path.write_text(html, encoding="utf-8")
    browser.set_window_size(1280, 900)
    browser.get(path.as_uri())
    browser.find_element("css selector", "h1")
    assert not has_horizontal_scroll(browser)
    charts = browser.find_elements("css selector", "[data-chart]")
    assert len(browser.find_elements("css selector", "[data-chart] .uplot")) == len(charts)
    assert len(browser.find_elements("css selector", ".uplot canvas")) >= len(charts)
    assert "could not be drawn" not in browser.find_element("tag name", "body").text
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert not errors, errors
    for heading in browser.find_elements("css selector", "h1, h2"):
        assert "http://" not in heading.text and "127.0.0.1" not in heading.text
    screenshot(browser, name)
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1280, min(int(height) + 140, 8000))
    screenshot(browser, f"{name}-full")
    browser.set_window_size(1280, 900)
    return browser


def _texts(browser: Any, selector: str) -> list[str]:
    """The text of every element matching ``selector``, read in one script: a chart's markers are drawn again when
    it resizes (as for the whole-page screenshot), which would leave elements found one call earlier stale."""
    return list(
        browser.execute_script("return [...document.querySelectorAll(arguments[0])].map((n) => n.innerText);", selector)
    )


def _headline(browser: Any) -> str:
    return str(browser.find_element("css selector", ".headline").text)


def _scale(browser: Any, index: int, key: str) -> list[float]:
    return list(
        browser.execute_script(
            f"const u = document.querySelectorAll('[data-chart]')[{index}]._uplot;"
            f"return [u.scales['{key}'].min, u.scales['{key}'].max];"
        )
    )


def _chart_index(browser: Any, heading: str) -> list[int]:
    """The indexes (among all charts) of the charts in the section headed ``heading``."""
    return list(
        browser.execute_script(
            "const all = [...document.querySelectorAll('[data-chart]')];"
            "const section = [...document.querySelectorAll('section')]"
            "  .find((s) => s.querySelector('h2').textContent === arguments[0]);"
            "return [...section.querySelectorAll('[data-chart]')].map((node) => all.indexOf(node));",
            heading,
        )
    )


def _overlaps(browser: Any, selector: str) -> list[tuple[str, str]]:
    """Pairs of elements matching ``selector`` whose boxes overlap."""
    return [
        tuple(pair)
        for pair in browser.execute_script(
            "const boxes = [...document.querySelectorAll(arguments[0])]"
            "  .map((node) => [node.textContent, node.getBoundingClientRect()]);"
            "const hits = [];"
            "boxes.forEach(([a, p], i) => boxes.slice(i + 1).forEach(([b, q]) => {"
            "  if (p.left < q.right && q.left < p.right && p.top < q.bottom && q.top < p.bottom) hits.push([a, b]);"
            "}));"
            "return hits;",
            selector,
        )
    ]


def _run(
    target: str, label: str, *, crawler_ms: float, human_ms: float, duration_s: float, gated: bool
) -> ReplayResult:
    rng = random.Random(f"{target}{label}")
    result = ReplayResult(target=target, duration_s=duration_s, label=label)
    for index in range(600):
        kind = "crawler" if index % 3 else "human"
        ttfb = rng.lognormvariate(0, 0.5) * (crawler_ms if kind == "crawler" else human_ms)
        outcome = ("l1-hit" if rng.random() < 0.8 else "l2-hit" if rng.random() < 0.7 else "miss") if gated else "none"
        outcome = "pass" if gated and kind == "human" else outcome
        result.samples.append(Sample(kind, outcome, 200, ttfb, ttfb + 1.0, duration_s * rng.random()))
    return result


def _pair(alone: str = "", gated: str = "", *, scale: float = 1.0) -> list[ReplayResult]:
    return [
        _run("http://127.0.0.1:41873", alone, crawler_ms=40, human_ms=45, duration_s=10 * scale, gated=False),
        _run("http://127.0.0.1:52211", gated, crawler_ms=0.8, human_ms=31, duration_s=4 * scale, gated=True),
    ]


def test_report_replay_compare(browser: Any, tmp_path: Path) -> None:
    results = _pair()
    page = _open(browser, tmp_path, "replay-compare", report_html(results))
    headline = _headline(page)
    assert headline == comparison_headline(results)
    assert headline.startswith("Through crawlergate: crawlers ") and "× faster" in headline
    assert "humans " in headline and "% lower TTFB" in headline and "× the throughput" in headline
    for kind in ("Crawler", "Human"):
        (index,) = _chart_index(page, f"{kind} TTFB")
        legend = page.find_elements("css selector", "[data-chart]")[index].text
        assert "site alone" in legend and "through crawlergate" in legend
    crawler, human = _chart_index(page, "Crawler TTFB") + _chart_index(page, "Human TTFB")
    assert _scale(page, crawler, "x") == _scale(page, human, "x")
    first, second = _chart_index(page, "Throughput over time")
    assert _scale(page, first, "y") == _scale(page, second, "y")
    text = page.find_element("tag name", "body").text
    assert "site alone: all 600 answered requests had no X-Crawlergate header" in text
    assert page.find_elements("css selector", ".bar-label") and not _overlaps(page, ".bar-label")


def test_report_replay_single_run(browser: Any, tmp_path: Path) -> None:
    (result,) = _pair()[1:]
    page = _open(browser, tmp_path, "replay-single", report_html([result]))
    summary = result.summary()
    assert _headline(page).startswith(f"{summary['throughput_rps']:,.1f} requests/s; median TTFB: crawlers ")
    assert "humans " in _headline(page)


def test_report_demo_beside_the_paper(browser: Any, tmp_path: Path) -> None:
    counters = {"l1_hits": 300, "l2_hits": 80, "misses": 20, "stale": 0, "prefetches": 12}
    experiment = Experiment(
        closed=_pair("forum alone, full speed", "via crawlergate, full speed"),
        opened=_pair("forum alone, same load", "via crawlergate, same load", scale=1.5),
        stats={"crawler": counters, "human": counters},
        folder=tmp_path,
        forum="http://127.0.0.1:41873",
        gate="http://127.0.0.1:52211",
    )
    page = _open(browser, tmp_path, "demo", demo_report(experiment))
    assert "crawlers" in _headline(page) and "faster" in _headline(page)
    versus = page.find_element("css selector", "section table").text
    assert "118× faster" in versus and "31 % lower TTFB" in versus and "1.84×" in versus
    assert "95.0% of crawler requests" in page.find_element("tag name", "body").text
    (index,) = _chart_index(page, "Crawler TTFB, at the same load")
    legend = page.find_elements("css selector", "[data-chart]")[index].text
    assert "forum alone, same load" in legend and "via crawlergate, same load" in legend


def _analyze_log(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "access.log"
    path.write_text("".join(lines))
    return path


def _line(agent: str, target: str, hour: int, second: int, micros: int) -> str:
    stamp = f"10/Oct/2000:{hour:02d}:00:{second:02d} +0000"
    return f'1.2.3.4 - - [{stamp}] "GET {target} HTTP/1.1" 200 10 "-" "{agent}" {micros}\n'


def test_report_analyze_marks_the_off_peak_hour(browser: Any, tmp_path: Path) -> None:
    lines = []
    for hour in range(24):
        humans = 1 if hour == 4 else 6 + hour % 7  # the trough is at four in the morning
        lines += [_line(FIREFOX_UA, f"/t/{n}", hour, n, 2_000) for n in range(humans)]
        lines += [_line(GOOGLEBOT_UA, f"/t/{hour * 2 + n}", hour, 10 * n, 160_000) for n in range(2)]
        lines += [_line(BINGBOT_UA, f"/t/{hour}", hour, 30, 90_000)]
    lines.append(_line("Agent/" + "x" * 400, "/t/1", 5, 50, 100))  # a cell that must wrap, not widen the page
    classifier = Classifier.from_settings(ClassifySettings())
    profile = profile_log(LogReader(_analyze_log(tmp_path, lines)), classifier)
    page = _open(browser, tmp_path, "analyze", profile_html(profile, classifier, 10))
    headline = _headline(page)
    assert headline.startswith("Crawlers sent ") and "of the server's time" in headline
    assert headline.endswith("the off-peak hour is 04:00 UTC")
    markers = _texts(page, ".marker-x span")
    assert markers == ["off-peak 04:00"]
    (hours,) = _chart_index(page, "Requests per hour of the day (UTC)")
    assert _scale(page, hours, "x") == [0, 23]


def test_report_analyze_of_an_empty_log_says_so(browser: Any, tmp_path: Path) -> None:
    classifier = Classifier.from_settings(ClassifySettings())
    profile = profile_log([], classifier)
    page = _open(browser, tmp_path, "analyze-empty", profile_html(profile, classifier, 10))
    notes = [note.text for note in page.find_elements("css selector", ".note")]
    assert "The log has no requests, so there is no daily pattern to show." in notes
    assert "No crawler requests in this log." in notes


def _simulated_trace(*, repeats: bool) -> Trace:
    """Two days of crawler and human requests over 1,000 pages of 14 kB; without repeats no page is asked twice."""
    rng = random.Random(2012)
    count = 6000
    pages = [min(int(rng.paretovariate(0.8)) - 1, 999) if repeats else index for index in range(count)]
    crawler = [1 if index % 4 else 0 for index in range(count)]
    unique = max(pages) + 1
    return Trace(
        pages=array("I", pages),
        crawler=bytearray(crawler),
        day_runs=[(0, 0), (count // 2, 1)],
        sizes=array("I", [14_000] * unique),
        targets=[f"/t/{page}" for page in range(unique)],
        lines=count,
        malformed=0,
    )


def test_report_simulate_marks_the_recommended_size_and_the_min_bound(browser: Any, tmp_path: Path) -> None:
    trace = _simulated_trace(repeats=True)
    report = run_simulation(trace, [1_400_000, 3_500_000, 7_000_000], POLICIES, 12)
    assert report.caching_helps and report.recommended_l1_bytes
    page = _open(browser, tmp_path, "simulate", simulate_html(report, POLICIES))
    headline = _headline(page)
    assert headline.startswith("Recommended L1 size: ") and "of crawler requests (the MIN bound: " in headline
    (size,) = _texts(page, ".marker-x span")
    (bound,) = _texts(page, ".marker-y span")
    assert size.startswith("recommended L1 ") and size.endswith(" MB") and bound.startswith("MIN bound ")
    assert not _overlaps(page, ".marker span")


def test_report_simulate_where_caching_does_not_help(browser: Any, tmp_path: Path) -> None:
    report = run_simulation(_simulated_trace(repeats=False), [1_400_000], POLICIES, 6)
    assert not report.caching_helps
    page = _open(browser, tmp_path, "simulate-hopeless", simulate_html(report, POLICIES))
    assert _headline(page).startswith("Caching will not help this log")
    assert page.find_element("css selector", ".note").text.startswith("No chart: caching does not help this log.")


@pytest.mark.parametrize(
    ("html", "note"),
    [
        pytest.param(line_chart([], {}, x_label="x", y_label="y"), "No data to chart.", id="empty"),
        pytest.param(
            line_chart([1.0, 2.0], {"a": [0.5, 0.5]}, x_label="x", y_label="hit ratio", y_percent=True),
            "a: every value is 50.0 % (hit ratio): a chart would be a flat line.",
            id="flat",
        ),
        pytest.param(bar_chart({}, value_label="requests", empty_note="Nothing."), "Nothing.", id="no-bars"),
    ],
)
def test_report_chart_without_a_shape_is_a_note(html: str, note: str) -> None:
    assert html == f'<p class="note">{note}</p>'
