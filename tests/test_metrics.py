"""The figures: histogram percentiles within 5 %, hit ratios, several processes' figures summed through a shared
folder, and Prometheus text that parses and holds every family."""

from __future__ import annotations

import sys
import threading

import pytest
from prometheus_client.parser import text_string_to_metric_families

from crawlergate.metrics import CounterArray, Histogram, Metrics, read_shared


def test_histogram_percentiles_within_five_percent() -> None:
    histogram = Histogram()
    for value in range(1, 1001):
        histogram.add(float(value))
    summary = histogram.summary()
    assert summary["p50"] == pytest.approx(500, rel=0.05)
    assert summary["p99"] == pytest.approx(990, rel=0.05)
    assert summary["mean"] == pytest.approx(500.5)
    assert summary["max"] == 1000.0


def test_histogram_empty_and_tiny_values() -> None:
    histogram = Histogram()
    assert histogram.summary()["p50"] == 0.0
    histogram.add(0.0)
    histogram.add(0.001)
    assert histogram.percentile(1.0) <= 0.01


def test_histogram_cumulative_buckets() -> None:
    histogram = Histogram()
    for value in (0.3, 0.8, 3.0, 40.0):
        histogram.add(value)
    assert histogram.cumulative_ms((0.5, 1.0, 5.0, 100.0)) == [1, 2, 3, 4]


def test_metrics_snapshot_hit_ratio_counts_only_lookups() -> None:
    metrics = Metrics()
    metrics.record("crawler", "l1-hit", 1.0)
    metrics.record("crawler", "l2-hit", 2.0)
    metrics.record("crawler", "miss", 100.0)
    metrics.record("crawler", "pass", 50.0)
    crawler = metrics.snapshot()["crawler"]
    assert crawler["requests"] == 4 and crawler["hit_ratio"] == pytest.approx(2 / 3, abs=1e-4)
    assert metrics.snapshot()["human"]["hit_ratio"] == 0.0


def test_metrics_shared_folder_sums_processes_and_takes_the_largest_maximum(tmp_path) -> None:
    first, second = Metrics(tmp_path), Metrics(tmp_path)
    first.record("crawler", "l1-hit", 2.0, family="Googlebot", tag="search", saved_ms=40.0)
    second.record("crawler", "miss", 9.0, family="Googlebot", tag="search")
    second.record("human", "pass", 30.0)
    second.add_origin_time("human", 30.0)
    second.record_origin(25.0)
    for metrics in (first, second):
        data = metrics.snapshot()
        assert data["processes"] == 2
        assert data["crawler"]["requests"] == 2 and data["crawler"]["l1_hits"] == 1 and data["crawler"]["misses"] == 1
        assert data["crawler"]["ttfb_ms"]["max"] == 9.0 and data["human"]["passes"] == 1
        assert data["families"]["Googlebot"] == {
            "tag": "search",
            "requests": 2,
            "hits": 1,
            "outcomes": {"l1-hit": 1, "miss": 1},
        }
        assert data["origin"]["requests"] == 1
        assert data["origin"]["seconds"] == {"crawler": 0.025, "human": 0.03, "suspect": 0.0}
        assert data["origin_time_saved_s"] == 0.04
        assert data["crawler_share"] == {"requests": 0.6667, "origin_time": 0.4545}
    # What each process answered itself stays its own (the regeneration window counts human requests so).
    assert first.requests("crawler") == 1 and second.requests("human") == 1


def test_metrics_names_past_the_capacity_count_as_overflow(tmp_path) -> None:
    counters = CounterArray(tmp_path / "one", capacity=4)
    assert counters.slot("a") == 1 and counters.slot("b") == 2 and counters.slot("c") == 3
    assert counters.slot("d") == 0 and counters.slot_range("histogram", 3) == 0
    counters.values[counters.slot("d")] += 1
    assert read_shared(tmp_path) == {"overflow": 1, "a": 0, "b": 0, "c": 0}


def test_metrics_reader_skips_a_name_still_being_written(tmp_path) -> None:
    counters = CounterArray(tmp_path / "one")
    counters.values[counters.slot("whole")] += 3
    with open(tmp_path / "one.names", "a") as names:
        names.write("half-writ")
    assert read_shared(tmp_path)["whole"] == 3 and "half-writ" not in read_shared(tmp_path)


def test_metrics_prometheus_text_parses_and_holds_every_family(tmp_path) -> None:
    metrics = Metrics(tmp_path)
    metrics.record("crawler", "l2-hit", 1.0, family='Odd "bot"', tag="other")
    metrics.count("evictions_l2", 2)
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(metrics.prometheus({"crawlergate_l2_pages": 3}))
        for sample in family.samples
    }
    labels = (("family", 'Odd "bot"'), ("outcome", "l2-hit"), ("tag", "other"))
    assert samples[("crawlergate_family_requests_total", labels)] == 1
    assert samples[("crawlergate_evictions_total", (("level", "l2"),))] == 2
    assert samples[("crawlergate_l2_pages", ())] == 3


def test_counter_totals_read_while_another_thread_names_new_counters() -> None:
    """The dashboard's sampler reads the totals in its own thread while requests name new counters."""
    counters = CounterArray(capacity=20_000)
    named = threading.Event()

    def name_counters() -> None:
        for number in range(15_000):
            counters.slot(f"req|crawler|{number}")
        named.set()

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        naming = threading.Thread(target=name_counters)
        naming.start()
        while not named.is_set():
            counters.totals()
        naming.join()
    finally:
        sys.setswitchinterval(switch)
    assert len(counters.totals()) == 15_001
