"""What a pass may ask of the origin: fetches at once, fetches a second, and fewer when it slows down.

``Throttle`` starts at one fetch at once and measures the origin's answer time: its normal level is
the lowest median of recent fetches seen in the pass. While answers stay within ``factor`` times
that level it allows one more fetch at once, up to ``limit``; when they rise above, it halves
(TCP's additive increase, multiplicative decrease), and at one fetch it also waits as long as a
fetch took before the next, so the origin spends at most half its time on the pass. ``Pacing``
keeps to a rate.

    throttle = Throttle(limit=4, factor=2.0)
    await throttle.acquire()
    ...
    throttle.release(seconds=0.021)
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections import deque

# Fetch times in the median the throttle compares with the normal level.
SAMPLES = 8


class Throttle:
    """At most ``limit`` fetches at once, fewer while the origin answers slower than normal."""

    def __init__(self, limit: int, factor: float) -> None:
        self.limit = limit
        self.factor = factor
        self.allowed = 1
        self.normal_s: float | None = None
        self.backoffs = 0
        self.busiest = 0  # the most fetches at once, for the summary
        self._in_flight = 0
        self._samples: deque[float] = deque(maxlen=SAMPLES)
        self._pause_s = 0.0
        self._changed = asyncio.Condition()

    async def acquire(self, deadline: float) -> None:
        """Take a slot (pausing first while the origin is slow, though never past ``deadline``, monotonic)."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._in_flight < self.allowed)
            self._in_flight += 1
            self.busiest = max(self.busiest, self._in_flight)
        if self._pause_s:
            await asyncio.sleep(max(0.0, min(self._pause_s, deadline - time.monotonic())))

    async def release(self) -> None:
        async with self._changed:
            self._in_flight -= 1
            self._changed.notify_all()

    def observe(self, seconds: float) -> None:
        """One fetch took ``seconds``: adjust the fetches allowed at once."""
        self._samples.append(seconds)
        if len(self._samples) < SAMPLES:
            return
        median = statistics.median(self._samples)
        self._samples.clear()
        if self.normal_s is None or median < self.normal_s:
            self.normal_s = median
        if median > self.factor * self.normal_s:
            self.backoffs += 1
            if self.allowed == 1:
                self._pause_s = median
            self.allowed = max(1, self.allowed // 2)
        else:
            self._pause_s = 0.0
            self.allowed = min(self.limit, self.allowed + 1)


class Pacing:
    """Starts at most ``rate`` fetches a second (no limit when 0), and keeps the origin's time spent on them to
    ``share`` of the time that passes (no limit when 0): a fetch that took 20 ms at a share of 0.05 lets the
    next start 400 ms after it began. Time is the budget that matters: a slow page costs more than a fast one."""

    def __init__(self, rate: float, share: float = 0.0) -> None:
        self._interval = 1.0 / rate if rate > 0 else 0.0
        self._share = share
        self._next = 0.0
        self._free_at = 0.0
        self._lock = asyncio.Lock()

    async def wait(self, deadline: float = math.inf) -> bool:
        """Wait for the next fetch's turn; False, at once, when that turn comes after ``deadline`` (monotonic)."""
        if not self._interval and not self._share:
            return True
        async with self._lock:
            now = time.monotonic()
            start = max(self._next, self._free_at)
            if start >= deadline:
                return False
            if start > now:
                await asyncio.sleep(start - now)
            self._next = max(now, self._next) + self._interval
        return True

    def spent(self, began: float, seconds: float) -> None:
        """A fetch that began at ``began`` (``time.monotonic()``) took the origin ``seconds``."""
        if self._share:
            self._free_at = max(self._free_at, began) + seconds / self._share
