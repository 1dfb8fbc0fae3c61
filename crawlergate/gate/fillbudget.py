"""A budget of new pages that suspects may make the site fill, per network (nginx's limit_req, by /24).

A fake Googlebot, or a scraper behind a browser's user agent, can ask for a thousand URLs the cache
has never seen (``?n=1``, ``?n=2``, ...): each is a fill, and a page in L2. Suspects (unverified
claimants, and clients the evidence convicts) get a token bucket per network, the /24 of an IPv4
address or the /48 of an IPv6 one, since such clients hop between neighbouring addresses: a fill
takes a token, tokens come back at ``per_minute``, at most ``burst`` are saved. Past it, a miss is
answered as a cache-only one (a stored copy of any age, else 503 with Retry-After). Verified
crawlers and people are never budgeted.

    budget = FillBudget(per_minute=30, burst=60)
    budget.take("203.0.113.7", now=time.monotonic())   # True: fill; False: spare the site
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from crawlergate.suspect.sketch import network_of

# Networks whose buckets are remembered (the least recently seen forgotten first: a full bucket again).
NETWORKS_REMEMBERED = 65536


class FillBudget:
    """Token buckets of fills, one per network; ``per_minute`` 0 is no budget."""

    def __init__(self, *, per_minute: float, burst: int) -> None:
        self.per_minute = per_minute
        self.burst = burst
        self._buckets: OrderedDict[str, list[float]] = OrderedDict()  # network -> [tokens, when]
        self._lock = threading.Lock()

    def take(self, client: str | None, now: float) -> bool:
        """Whether a suspect at ``client`` may make the site fill one more page now (taking a token)."""
        if self.per_minute <= 0 or not client:
            return True
        network = network_of(client)
        with self._lock:
            bucket = self._buckets.get(network)
            if bucket is None:
                if len(self._buckets) >= NETWORKS_REMEMBERED:
                    self._buckets.popitem(last=False)
                bucket = self._buckets[network] = [float(self.burst), now]
            else:
                self._buckets.move_to_end(network)
                bucket[0] = min(float(self.burst), bucket[0] + (now - bucket[1]) * self.per_minute / 60)
                bucket[1] = now
            if bucket[0] < 1:
                return False
            bucket[0] -= 1
            return True
