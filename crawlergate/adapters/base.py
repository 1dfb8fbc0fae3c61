"""What every gate object offers, whichever interface runs it.

gate.mark_changed("/showthread.php?t=12")
gate.stats()["crawler"]["hit_ratio"]
"""

from __future__ import annotations

from crawlergate.gate.origin import PublicSite
from crawlergate.wiring import GateRuntime


class GateAdapter:
    """A gate's runtime, its parts by name, and the calls a site makes on it."""

    def __init__(self, runtime: GateRuntime) -> None:
        self.runtime = runtime
        self.settings = runtime.settings
        self.core, self.cache, self.filler, self.flow = runtime.core, runtime.core.cache, runtime.filler, runtime.flow
        self.admin, self.access_log, self.regeneration = runtime.admin, runtime.access_log, runtime.regeneration
        self.keys, self.metrics = runtime.core.keys, runtime.core.metrics
        # The site as the last crawler's request named it: what a mounted gate without public_url regenerates as.
        self._arrived_at: PublicSite | None = None
        self._scheduling = False
        # The flow's L1 step, called inline by every adapter (memcached too: threads measured slower, since
        # pymemcache's Python does not overlap under the GIL).
        self.lookup_l1 = self.cache.lookup_l1

    def start(self) -> None:
        """Prepare the stores (create the L2 directory) and the access log; raises ConfigError when unusable."""
        self.runtime.start()

    def stats(self) -> dict[str, object]:
        """The ``stats`` figures (the JSON of ``/_crawlergate/stats``)."""
        return self.runtime.figures.stats()

    def mark_changed(self, url_or_pattern: str) -> int:
        """Mark stored pages changed (a URL, or a pattern with ``*``): crawlers get the stored copy until it is
        regenerated; returns the pages marked."""
        return self.runtime.invalidation.mark_changed(url_or_pattern)
