"""Counts and time-to-first-byte histograms, per request class and cache level.

A leaf module: it imports nothing from crawlergate, so every layer can count into it. The
counters are plain numbers grouped so that both JSON (``snapshot()``) and Prometheus text can be
written from them without change.

    metrics.record("crawler", "l1-hit", ttfb_ms=0.4)
    metrics.snapshot()["crawler"]["hit_ratio"]
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

CLASSES = ("crawler", "human")
# X-Crawlergate outcomes, plus "error" for a request the gate answered with 5xx of its own.
OUTCOMES = ("l1-hit", "l2-hit", "miss", "stale", "pass", "error")

# Histogram buckets grow by 5 % from 10 µs: 1 % resolution would cost memory for no decision,
# 5 % keeps a p99 within 5 % of the truth up to ~10 minutes with about 350 buckets.
_BUCKET_BASE_MS = 0.01
_BUCKET_GROWTH = 1.05
_LOG_GROWTH = math.log(_BUCKET_GROWTH)
_BUCKETS = 350


# Prometheus histogram buckets: the usual latency ladder, from half a millisecond to ten seconds.
PROMETHEUS_BOUNDS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_BOUNDS_MS = tuple(bound * 1000 for bound in PROMETHEUS_BOUNDS_S)


class Histogram:
    """A log-bucketed latency histogram in milliseconds."""

    __slots__ = ("counts", "count", "total_ms", "max_ms")

    def __init__(self) -> None:
        self.counts = [0] * _BUCKETS
        self.count = 0
        self.total_ms = 0.0
        self.max_ms = 0.0

    def add(self, ms: float) -> None:
        index = int(math.log(ms / _BUCKET_BASE_MS) / _LOG_GROWTH) + 1 if ms > _BUCKET_BASE_MS else 0
        self.counts[min(index, _BUCKETS - 1)] += 1
        self.count += 1
        self.total_ms += ms
        if ms > self.max_ms:
            self.max_ms = ms

    def percentile(self, fraction: float) -> float:
        """The upper bound of the bucket holding the given fraction of samples (0 when empty)."""
        if not self.count:
            return 0.0
        rank = max(1, math.ceil(fraction * self.count))
        seen = 0
        for index, count in enumerate(self.counts):
            seen += count
            if seen >= rank:
                return min(_BUCKET_BASE_MS * _BUCKET_GROWTH**index, self.max_ms)
        return self.max_ms  # pragma: no cover

    def cumulative_ms(self, bounds_ms: tuple[float, ...]) -> list[int]:
        """Samples at or below each bound (Prometheus ``le`` buckets), from the fine log buckets."""
        counts, total, index = [], 0, 0
        for bound in bounds_ms:
            while index < _BUCKETS and _BUCKET_BASE_MS * _BUCKET_GROWTH**index <= bound * (1 + 1e-9):
                total += self.counts[index]
                index += 1
            counts.append(total)
        return counts

    def summary(self) -> dict[str, float]:
        return {
            "p50": round(self.percentile(0.50), 3),
            "p90": round(self.percentile(0.90), 3),
            "p99": round(self.percentile(0.99), 3),
            "mean": round(self.total_ms / self.count, 3) if self.count else 0.0,
            "max": round(self.max_ms, 3),
        }


class ClassCounters:
    """Requests by outcome, TTFB, and background work for one request class."""

    __slots__ = ("outcomes", "ttfb", "prefetches", "store_errors")

    def __init__(self) -> None:
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.ttfb = Histogram()
        self.prefetches = 0
        self.store_errors = 0


class Metrics:
    """All counters of one gate process."""

    def __init__(self) -> None:
        self.started_at = time.time()
        self.classes = {name: ClassCounters() for name in CLASSES}
        self.origin_fetches = 0
        self.origin_errors = 0
        self.corrupt_pages = 0
        # Pages a crawler asked for that were not stored, by reason (crawlergate.gate.storable.NOT_STORED_REASONS).
        self.not_stored: dict[str, int] = {}
        self._lock = threading.Lock()

    def record(self, kind: str, outcome: str, ttfb_ms: float) -> None:
        """Count one answered request; called once per request, after its first body byte."""
        counters = self.classes[kind]
        with self._lock:
            counters.outcomes[outcome] += 1
            counters.ttfb.add(ttfb_ms)

    def record_since(self, kind: str, outcome: str, started: float) -> None:
        """``record`` with the TTFB measured from ``started``, a ``time.perf_counter()`` reading."""
        self.record(kind, outcome, (time.perf_counter() - started) * 1000)

    def requests(self, kind: str) -> int:
        """Requests of class ``kind`` answered so far."""
        with self._lock:
            return sum(self.classes[kind].outcomes.values())

    def count_prefetch(self) -> None:
        self.classes["human"].prefetches += 1

    def count_not_stored(self, reason: str) -> None:
        with self._lock:
            self.not_stored[reason] = self.not_stored.get(reason, 0) + 1

    def count_store_error(self, kind: str) -> None:
        self.classes[kind].store_errors += 1

    def prometheus(
        self, gauges: dict[str, float] | None = None, more_counters: dict[str, tuple[str, int]] | None = None
    ) -> str:
        """The counters in the Prometheus text exposition format (version 0.0.4); ``more_counters`` adds others
        (name: (help, value)), kept elsewhere."""
        lines = [
            "# HELP crawlergate_requests_total Requests answered, by class and X-Crawlergate outcome.",
            "# TYPE crawlergate_requests_total counter",
        ]
        with self._lock:
            for name, counters in self.classes.items():
                for outcome, count in counters.outcomes.items():
                    lines.append(f'crawlergate_requests_total{{class="{name}",outcome="{outcome}"}} {count}')
            lines += [
                "# HELP crawlergate_ttfb_seconds Time from the request to its first body byte.",
                "# TYPE crawlergate_ttfb_seconds histogram",
            ]
            for name, counters in self.classes.items():
                histogram = counters.ttfb
                for bound, count in zip(PROMETHEUS_BOUNDS_S, histogram.cumulative_ms(_BOUNDS_MS), strict=True):
                    lines.append(f'crawlergate_ttfb_seconds_bucket{{class="{name}",le="{bound:g}"}} {count}')
                lines.append(f'crawlergate_ttfb_seconds_bucket{{class="{name}",le="+Inf"}} {histogram.count}')
                lines.append(f'crawlergate_ttfb_seconds_sum{{class="{name}"}} {histogram.total_ms / 1000:.6f}')
                lines.append(f'crawlergate_ttfb_seconds_count{{class="{name}"}} {histogram.count}')
            counters_of_process = {
                "crawlergate_origin_fetches_total": ("Guest sub-requests sent to the site.", self.origin_fetches),
                "crawlergate_origin_errors_total": ("Guest sub-requests that failed.", self.origin_errors),
                "crawlergate_corrupt_pages_total": ("Stored pages that failed their checksum.", self.corrupt_pages),
                "crawlergate_prefetches_total": (
                    "Pages human views copied from L2 into L1.",
                    self.classes["human"].prefetches,
                ),
            }
            for key, (text, count) in (counters_of_process | (more_counters or {})).items():
                lines += [f"# HELP {key} {text}", f"# TYPE {key} counter", f"{key} {count}"]
            lines += ["# HELP crawlergate_store_errors_total Cache store failures treated as misses.",
                      "# TYPE crawlergate_store_errors_total counter"]  # fmt: skip
            for name, counters in self.classes.items():
                lines.append(f'crawlergate_store_errors_total{{class="{name}"}} {counters.store_errors}')
            lines += ["# HELP crawlergate_not_stored_total Crawler requests whose page was not stored, by reason.",
                      "# TYPE crawlergate_not_stored_total counter"]  # fmt: skip
            for reason, count in sorted(self.not_stored.items()):
                lines.append(f'crawlergate_not_stored_total{{reason="{reason}"}} {count}')
        for key, gauge in (gauges or {}).items():
            lines += [f"# TYPE {key} gauge", f"{key} {gauge:.15g}"]
        return "\n".join(lines) + "\n"

    def snapshot(self) -> dict[str, Any]:
        """The stats JSON: per class requests, hits per level, misses, hit ratio and TTFB percentiles."""
        with self._lock:
            data: dict[str, Any] = {
                "uptime_s": round(time.time() - self.started_at, 1),
                "origin_fetches": self.origin_fetches,
                "origin_errors": self.origin_errors,
                "corrupt_pages": self.corrupt_pages,
                "not_stored": dict(sorted(self.not_stored.items())),
            }
            for name, counters in self.classes.items():
                outcomes = counters.outcomes
                lookups = outcomes["l1-hit"] + outcomes["l2-hit"] + outcomes["miss"] + outcomes["stale"]
                hits = outcomes["l1-hit"] + outcomes["l2-hit"]
                data[name] = {
                    "requests": sum(outcomes.values()),
                    "l1_hits": outcomes["l1-hit"],
                    "l2_hits": outcomes["l2-hit"],
                    "misses": outcomes["miss"],
                    "stale": outcomes["stale"],
                    "passes": outcomes["pass"],
                    "errors": outcomes["error"],
                    "hit_ratio": round(hits / lookups, 4) if lookups else 0.0,
                    "prefetches": counters.prefetches,
                    "store_errors": counters.store_errors,
                    "ttfb_ms": counters.ttfb.summary(),
                }
        return data
