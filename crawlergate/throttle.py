"""Throttle: a warning said at most once an interval, for a failure that repeats with every request or write (a
full disk, a lost index): the log says it, and is not filled with it.

    writes = Throttle(60.0)
    if writes.due():
        logger.warning("L2 write failed: %s", error)
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Throttle:
    """``due()`` is True at its first call, then once ``interval_s`` has passed since the last True."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._next = float("-inf")

    def due(self) -> bool:
        now = self._clock()
        if now < self._next:
            return False
        self._next = now + self.interval_s
        return True
