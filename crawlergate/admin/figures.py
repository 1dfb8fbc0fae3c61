"""The gate's figures: the ``stats`` JSON and the Prometheus text, gathered from its parts.

The counters are the metrics'; beside them the valve's state, the judge's evidence, L1 and L2 usage,
the pages marked changed, and the regeneration's figures when the gate regenerates.

    figures = GateFigures(core, regeneration=job)   # wiring.py
    figures.stats()["crawler"]["hit_ratio"]
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from crawlergate.gate.catalogue import IndexUnavailable
from crawlergate.gate.engine import GateCore
from crawlergate.regenerate.schedule import OffPeakJob

# How long the figures wait for the filled pages on their way to disk (a second at most: they are figures).
FLUSH_WAIT_S = 1.0


class GateFigures:
    """What ``stats`` and ``metrics`` report for one gate (``regeneration`` adds its section; ``flush_fills`` waits
    for the pages filled so far to be written, so the figures count every page crawlers were answered with)."""

    def __init__(
        self,
        core: GateCore,
        *,
        regeneration: OffPeakJob | None = None,
        flush_fills: Callable[[float], bool] | None = None,
    ) -> None:
        self.core = core
        self.regeneration = regeneration
        self.flush_fills = flush_fills

    def stats(self) -> dict[str, object]:
        core = self.core
        self._fills_written()
        data = core.metrics.snapshot()
        data["valve"] = {**core.valve.status(), "refused": data.pop("refused")}
        data["evidence"] = {
            **data["evidence"],
            "verified_claimants": core.judge.verified_claimants(data["families"]),
            **core.judge.status(),
        }
        data["dirty"] = self.dirty_count()
        data.update(core.cache.usage())
        if self.regeneration is not None:
            try:
                data["regeneration"] = self.regeneration.status()
            except IndexUnavailable as exc:  # the folder turned unusable: the rest of the figures still hold
                data["regeneration"] = {"error": str(exc)}
        return data

    def _fills_written(self) -> None:
        if self.flush_fills is not None:
            self.flush_fills(FLUSH_WAIT_S)

    def dirty_count(self) -> int:
        """Marked pages the cache still holds (an evicted page's mark stays in the catalogue until it returns): each
        page's file says."""
        catalogue, l2 = self.core.catalogue, self.core.cache.l2
        catalogue.refresh(wait=False)
        return sum(1 for digest in catalogue.dirty_digests() if l2.has_file(digest))

    def prometheus(self) -> str:
        core = self.core
        self._fills_written()
        gauges: dict[str, float] = {
            "crawlergate_l2_pages": len(core.cache.l2),
            "crawlergate_l2_bytes": core.cache.l2.used_bytes,
            "crawlergate_dirty_pages": self.dirty_count(),
            # This process's: the valve is per process, as its count of requests in flight is.
            "crawlergate_valve_shedding": float(core.valve.shedding()),
            "crawlergate_origin_in_flight": core.valve.in_flight_now(),
        }
        counters: dict[str, tuple[str, int]] = {}
        if self.regeneration is not None:
            with contextlib.suppress(IndexUnavailable):  # stats says why; the other gauges still hold
                more_gauges, counters = self.regeneration.prometheus()
                gauges |= more_gauges
        return core.metrics.prometheus(gauges, counters)
