"""The crawler-only overload valve: is the site saturated, so a crawler's miss should wait?

Saturated means: requests to the site in flight in this process (fills, and people's requests
passed through) at ``max_in_flight``; or the site's time to first byte over the last
``window_seconds`` above ``slow_factor`` times its normal level (its average over ten minutes)
and above ``slow_ms``. Then crawlers and suspects that miss both cache levels get 503 with
``Retry-After`` (what Google and Bing document as "slow down"); people are never refused.
With no answer of the site in the window, its slowness is over: the next miss goes through and
measures it again.

    valve = OverloadValve(settings.valve)
    valve.entered(); ...; valve.sample(ttfb_ms=120.0); valve.left()   # a request to the site, and its TTFB
    valve.shedding(now=time.monotonic())
"""

from __future__ import annotations

import threading
import time
from collections import deque

from crawlergate.config import ValveSettings

_NORMAL_WINDOW_S = 600.0
_SAMPLES = 4096
# Fewer answers than this in the window say nothing about the site's speed.
_MIN_SAMPLES = 3


class OverloadValve:
    """Counts the site's requests in flight and its recent time to first byte, for one gate process."""

    def __init__(self, settings: ValveSettings) -> None:
        self.enabled = settings.enabled
        self.max_in_flight = settings.max_in_flight
        self.slow_factor = settings.slow_factor
        self.slow_ms = settings.slow_ms
        self.window_s = settings.window_seconds
        self.in_flight = 0
        self._samples: deque[tuple[float, float]] = deque(maxlen=_SAMPLES)  # (when, TTFB ms)
        self._normal_ms = 0.0
        self._normal_at = 0.0
        self._lock = threading.Lock()
        self._shedding = False

    def entered(self) -> None:
        with self._lock:
            self.in_flight += 1

    def left(self) -> None:
        """A request to the site ended (its time to first byte, if it had one, came through ``sample``)."""
        with self._lock:
            self.in_flight -= 1

    def sample(self, ttfb_ms: float, now: float | None = None) -> None:
        """One time to first byte of the site."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self._samples.append((now, ttfb_ms))
            self._learn_normal(ttfb_ms, now)

    def _learn_normal(self, ttfb_ms: float, now: float) -> None:
        """An exponential average over about ten minutes, slowed down while saturated so a long overload
        does not become the new normal."""
        if self._normal_at == 0.0:
            self._normal_ms, self._normal_at = ttfb_ms, now
            return
        weight = min((now - self._normal_at) / _NORMAL_WINDOW_S, 1.0)
        if self._shedding:
            weight /= 10
        self._normal_ms += (ttfb_ms - self._normal_ms) * max(weight, 1 / _SAMPLES)
        self._normal_at = now

    def recent_ms(self, now: float) -> float | None:
        """The mean TTFB over the window, or None with too few answers in it."""
        horizon = now - self.window_s
        samples = self._samples
        while samples and samples[0][0] < horizon:
            samples.popleft()
        if len(samples) < _MIN_SAMPLES:
            return None
        return sum(ms for _, ms in samples) / len(samples)

    def shedding(self, now: float | None = None) -> bool:
        """Whether crawler misses should be refused now."""
        if not self.enabled:
            return False
        now = time.monotonic() if now is None else now
        with self._lock:
            saturated = self.in_flight >= self.max_in_flight
            if not saturated:
                recent = self.recent_ms(now)
                limit = max(self.slow_factor * self._normal_ms, self.slow_ms)
                saturated = recent is not None and recent > limit
            self._shedding = saturated
            return saturated

    def status(self) -> dict[str, object]:
        """The valve as it stands now (worked out afresh: the state a miss last saw may be over)."""
        now = time.monotonic()
        shedding = self.shedding(now)
        with self._lock:
            recent = self.recent_ms(now)
        return {
            "enabled": self.enabled,
            "shedding": shedding,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "recent_ttfb_ms": round(recent, 1) if recent is not None else None,
            "normal_ttfb_ms": round(self._normal_ms, 1),
        }
