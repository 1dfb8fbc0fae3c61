"""The crawler-only overload valve: is the site saturated, so a crawler's miss should wait?

Saturated means: requests to the site in flight in this process (fills, and people's requests
passed through) at ``max_in_flight``; or the site slow across many pages: over the last
``window_seconds``, the pages answered (at least three different ones) took, in the median,
``slow_factor`` times their own normal time (each page's average over about ten minutes) and over
``slow_ms``. Each page is judged against itself, and votes once however often it is asked for, so a
handful of slow pages (a report, an export, an attacker's pick) cannot trip it: only a site that got
slow does. A page seen for the first time has no normal yet and does not vote. Then crawlers and
suspects that miss both cache levels get 503 with ``Retry-After`` (what Google and Bing document as
"slow down"); people are never refused. With no answer of the site in the window, its slowness is
over: the next miss goes through and measures it again.

A crawler's fill the valve lets through counts among the requests in flight from that moment, not
from when its fetch begins: a burst of misses read in one turn of a busy event loop is decided before
any of their fills has started, and each would otherwise have found the site below its limit.

    valve = OverloadValve(settings.valve)
    if valve.let_through(key.digest): ...  # a crawler's fill; else 503
    valve.entered(key.digest); ...; valve.sample(ttfb_ms=120.0, page=key.digest); valve.left()
    valve.shedding(now=time.monotonic())
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import OrderedDict, deque

from crawlergate.config import ValveSettings

_NORMAL_WINDOW_S = 600.0
_SAMPLES = 4096
# Pages whose normal time is remembered (least recently answered forgotten first).
_PAGES_REMEMBERED = 4096
# Answers of fewer different pages than this in the window say nothing about the site's speed.
_MIN_PAGES = 3
# How long the window's medians stand before they are worked out again. They take one pass over up to
# _SAMPLES answers; done on every miss, that pass was a third of a miss's time under a crawl of new pages.
_RECENT_EVERY_S = 0.25
# How long a fill let through holds its place before it begins: one that never does (its client left, another
# request's fill answered it) gives the place back after this.
_LET_THROUGH_S = 2.0


class OverloadValve:
    """Counts the site's requests in flight and its recent time to first byte, for one gate process."""

    def __init__(self, settings: ValveSettings) -> None:
        self.enabled = settings.enabled
        self.max_in_flight = settings.max_in_flight
        self.slow_factor = settings.slow_factor
        self.slow_ms = settings.slow_ms
        self.window_s = settings.window_seconds
        self.in_flight = 0
        # (when, page, TTFB ms, TTFB over the page's normal) of pages that had a normal.
        self._samples: deque[tuple[float, str, float, float]] = deque(maxlen=_SAMPLES)
        # page -> [normal TTFB ms, when last learned]
        self._pages: OrderedDict[str, list[float]] = OrderedDict()
        # The site's normal over all pages: what the status shows.
        self._normal_ms = 0.0
        self._normal_at = 0.0
        self._lock = threading.Lock()
        self._shedding = False
        self._recent: tuple[float, float, int] | None = None
        self._recent_at: float | None = None
        # page -> [requests let through for it whose fill has not begun, when the last was let through]. A page
        # takes one place however many requests ask for it (they share one fill); each request gives its own share
        # back, once (``entered``, ``withdrawn``).
        self._let_through: dict[str, list[float]] = {}

    def let_through(self, page: str, now: float | None = None) -> bool:
        """Whether a crawler's fill of ``page`` may go to the site (not while shedding); one let through counts as in
        flight until it begins (``entered``), or is ``withdrawn``."""
        if not self.enabled:
            return True
        now = time.monotonic() if now is None else now
        with self._lock:
            if self._saturated(now):
                return False
            waiting = self._let_through.get(page)
            if waiting is None:
                self._let_through[page] = [1, now]
            else:
                waiting[0] += 1
                waiting[1] = now
            return True

    def withdrawn(self, page: str) -> None:
        """A request let through will not fill: another request's fill of ``page`` answers it, or nothing may fill."""
        with self._lock:
            self._given_back(page)

    def entered(self, page: str = "") -> None:
        """A request to the site begins (a fill of ``page``: the place it was let through for is now in flight)."""
        with self._lock:
            self.in_flight += 1
            if page:
                self._given_back(page)

    def _given_back(self, page: str) -> None:
        """(Under the lock.) One request's share of ``page``'s place."""
        waiting = self._let_through.get(page)
        if waiting is not None:
            waiting[0] -= 1
            if waiting[0] <= 0:
                del self._let_through[page]

    def left(self) -> None:
        """A request to the site ended (its time to first byte, if it had one, came through ``sample``)."""
        with self._lock:
            self.in_flight -= 1

    def sample(self, ttfb_ms: float, page: str = "", now: float | None = None) -> None:
        """One time to first byte of the site, for ``page`` (a cache key's digest; "" for none)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self._normal_ms, self._normal_at = self._learned(self._normal_ms, self._normal_at, ttfb_ms, now)
            if not page:
                return
            known = self._pages.get(page)
            if known is None:
                if len(self._pages) >= _PAGES_REMEMBERED:
                    self._pages.popitem(last=False)
                self._pages[page] = [ttfb_ms, now]
                return
            self._pages.move_to_end(page)
            self._samples.append((now, page, ttfb_ms, ttfb_ms / max(known[0], 1.0)))
            known[0], known[1] = self._learned(known[0], known[1], ttfb_ms, now)

    def _learned(self, normal_ms: float, learned_at: float, ttfb_ms: float, now: float) -> tuple[float, float]:
        """An exponential average over about ten minutes, slowed down while saturated so a long overload
        does not become the new normal."""
        if learned_at == 0.0:
            return ttfb_ms, now
        weight = min((now - learned_at) / _NORMAL_WINDOW_S, 1.0)
        if self._shedding:
            weight /= 10
        return normal_ms + (ttfb_ms - normal_ms) * max(weight, 1 / _SAMPLES), now

    def recent(self, now: float) -> tuple[float, float, int] | None:
        """Over the window, one vote per page (its latest answer): the median TTFB, the median of TTFB over the
        page's normal, and the pages that voted; None with fewer than _MIN_PAGES pages. As worked out at most
        _RECENT_EVERY_S ago (under the lock)."""
        if self._recent_at is None or not 0 <= now - self._recent_at < _RECENT_EVERY_S:
            self._recent, self._recent_at = self._worked_out(now), now
        return self._recent

    def _worked_out(self, now: float) -> tuple[float, float, int] | None:
        horizon = now - self.window_s
        samples = self._samples
        while samples and samples[0][0] < horizon:
            samples.popleft()
        latest = {page: (ms, ratio) for _, page, ms, ratio in samples}
        if len(latest) < _MIN_PAGES:
            return None
        return (
            statistics.median(ms for ms, _ in latest.values()),
            statistics.median(ratio for _, ratio in latest.values()),
            len(latest),
        )

    def shedding(self, now: float | None = None) -> bool:
        """Whether crawler misses should be refused now."""
        if not self.enabled:
            return False
        now = time.monotonic() if now is None else now
        with self._lock:
            return self._saturated(now)

    def _saturated(self, now: float) -> bool:
        """(Under the lock.)"""
        saturated = self._in_flight_at(now) >= self.max_in_flight
        if not saturated:
            recent = self.recent(now)
            saturated = recent is not None and recent[1] > self.slow_factor and recent[0] > self.slow_ms
        self._shedding = saturated
        return saturated

    def in_flight_now(self, now: float | None = None) -> int:
        """Requests to the site in flight, with the pages let through whose fill has not begun yet."""
        with self._lock:
            return self._in_flight_at(time.monotonic() if now is None else now)

    def _in_flight_at(self, now: float) -> int:
        """(Under the lock.)"""
        return self.in_flight + self._waiting(now)

    def _waiting(self, now: float) -> int:
        """Pages let through whose fill has not begun (fewer than ``max_in_flight``: none is let through beyond it)."""
        waiting = self._let_through
        if waiting:  # most misses find none: no list to build
            for page in [page for page, (_, at) in waiting.items() if not 0 <= now - at < _LET_THROUGH_S]:
                del waiting[page]
        return len(waiting)

    def status(self) -> dict[str, object]:
        """The valve as it stands now (the window as worked out at most _RECENT_EVERY_S ago)."""
        now = time.monotonic()
        shedding = self.shedding(now)
        with self._lock:
            recent = self.recent(now)
            in_flight = self._in_flight_at(now)
        return {
            "enabled": self.enabled,
            "shedding": shedding,
            "in_flight": in_flight,
            "max_in_flight": self.max_in_flight,
            "recent_ttfb_ms": round(recent[0], 1) if recent is not None else None,
            "recent_slowdown": round(recent[1], 2) if recent is not None else None,
            "recent_pages": recent[2] if recent is not None else 0,
            "normal_ttfb_ms": round(self._normal_ms, 1),
        }
