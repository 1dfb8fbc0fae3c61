from __future__ import annotations

import pytest

from crawlergate.metrics import Histogram, Metrics


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
