"""The dashboard at the admin prefix: one page, offline, that refreshes itself from ``stats`` and ``series``.

The page and its scripts (uPlot, vendored under ``crawlergate/static/uplot``, and ``dashboard.js``)
are files of the package: nothing is fetched from the internet. ``series`` is the history the
charts draw: every ``SAMPLE_INTERVAL_S`` a thread of each process (started with the gate, or at a
``series`` request when it could not run) reads the summed counters and keeps what changed since
its previous reading: requests, hits per level and TTFB percentiles of the interval. The counters
are the whole server's (``metrics.shared_dir``), so every worker's history tells the same story.

    dashboard = Dashboard(metrics, prefix="/_crawlergate")
    dashboard.respond("/_crawlergate/series")
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

from crawlergate.gate.answer import Response, json_response
from crawlergate.metrics import CLASSES, OUTCOMES, Histogram, Metrics, histogram_of

# The page asks every 2 s; readings closer together than this are not kept.
SAMPLE_INTERVAL_S = 2.0
# Readings kept: an hour at one every 2 s.
SAMPLES_KEPT = 1800

_PACKAGE = Path(__file__).resolve().parent.parent
_ASSETS: dict[str, tuple[Path, bytes]] = {
    "uPlot.iife.min.js": (_PACKAGE / "static" / "uplot" / "uPlot.iife.min.js", b"text/javascript; charset=utf-8"),
    "uPlot.min.css": (_PACKAGE / "static" / "uplot" / "uPlot.min.css", b"text/css; charset=utf-8"),
    "dashboard.js": (_PACKAGE / "admin" / "static" / "dashboard.js", b"text/javascript; charset=utf-8"),
    "dashboard.css": (_PACKAGE / "admin" / "static" / "dashboard.css", b"text/css; charset=utf-8"),
}


class Dashboard:
    """The dashboard page, its assets, and the ``series`` history."""

    def __init__(
        self,
        metrics: Metrics,
        *,
        prefix: str,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metrics = metrics
        self.prefix = prefix
        self._clock = clock
        self._monotonic = monotonic
        self._samples: deque[dict[str, Any]] = deque(maxlen=SAMPLES_KEPT)
        self._previous: Mapping[str, int] | None = None
        self._sampled_at = float("-inf")
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._sampler: threading.Thread | None = None

    def start(self) -> None:
        """Keep the history from now on, in a thread of this process (one wake-up every SAMPLE_INTERVAL_S)."""
        if self._sampler is None:
            self._stopping.clear()
            self._sampler = threading.Thread(target=self._sample_until_stopped, name="crawlergate-series", daemon=True)
            self._sampler.start()

    def stop(self) -> None:
        if self._sampler is not None:
            self._stopping.set()
            self._sampler.join(timeout=5)
            self._sampler = None

    def _sample_until_stopped(self) -> None:
        self.sample()
        while not self._stopping.wait(SAMPLE_INTERVAL_S):
            self.sample()

    def page(self) -> Response:
        body = _page_html().replace("{{PREFIX}}", self.prefix).encode()
        return _file_response(body, b"text/html; charset=utf-8")

    def asset(self, name: str) -> Response | None:
        found = _ASSETS.get(name)
        if found is None:
            return None
        return _file_response(_read(found[0]), found[1], cache_control=b"max-age=3600")

    def series(self) -> Response:
        """The history of the charts: one point per interval since this process began keeping it."""
        self.sample()
        with self._lock:
            points = list(self._samples)
        return json_response(200, {"interval_s": SAMPLE_INTERVAL_S, "points": points}, indent=None)

    def sample(self) -> None:
        """Keep a point if the last was taken at least SAMPLE_INTERVAL_S ago (the first reading only sets the base)."""
        with self._lock:
            now = self._monotonic()
            if now - self._sampled_at < SAMPLE_INTERVAL_S:
                return
            totals = self.metrics.totals()
            if self._previous is not None:
                self._samples.append(_interval(self._previous, totals, now - self._sampled_at, self._clock()))
            self._previous = totals
            self._sampled_at = now


def _interval(before: Mapping[str, int], after: Mapping[str, int], seconds: float, at: float) -> dict[str, Any]:
    """What happened between two readings of the counters."""
    point: dict[str, Any] = {"t": round(at, 3), "seconds": round(seconds, 3)}
    for kind in CLASSES:
        outcomes = {outcome: after.get(f"req|{kind}|{outcome}", 0) - before.get(f"req|{kind}|{outcome}", 0)
                    for outcome in OUTCOMES}  # fmt: skip
        ttfb = _delta_histogram(before, after, f"ttfb|{kind}")
        lookups = outcomes["l1-hit"] + outcomes["l2-hit"] + outcomes["direct"] + outcomes["miss"] + outcomes["stale"]
        point[kind] = {
            "requests": sum(outcomes.values()),
            "l1_hits": outcomes["l1-hit"],
            "l2_hits": outcomes["l2-hit"],
            "direct_hits": outcomes["direct"],
            "lookups": lookups,
            "ttfb_ms": ttfb.summary() if ttfb.count else None,
        }
    origin = {kind: after.get(f"origin_us|{kind}", 0) - before.get(f"origin_us|{kind}", 0) for kind in CLASSES}
    total = sum(origin.values())
    point["crawler_origin_share"] = round(origin["crawler"] / total, 4) if total else None
    return point


def _delta_histogram(before: Mapping[str, int], after: Mapping[str, int], name: str) -> Histogram:
    old, new = histogram_of(before, name), histogram_of(after, name)
    counts = [later - earlier for earlier, later in zip(old.counts, new.counts, strict=True)]
    # The interval's largest sample is unknown; the all-time largest bounds the top bucket.
    return Histogram(counts, new.total_ms - old.total_ms, new.max_ms)


def _file_response(body: bytes, content_type: bytes, *, cache_control: bytes = b"no-store") -> Response:
    headers = [
        (b"content-type", content_type),
        (b"content-length", b"%d" % len(body)),
        (b"cache-control", cache_control),
        (b"x-content-type-options", b"nosniff"),
        # The page runs only its own scripts and talks only to its own gate.
        (b"content-security-policy", b"default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:"),
        (b"x-crawlergate", b"pass"),
    ]
    return 200, headers, body


@cache
def _read(path: Path) -> bytes:
    return path.read_bytes()


@cache
def _page_html() -> str:
    return (_PACKAGE / "admin" / "static" / "dashboard.html").read_text(encoding="utf-8")
