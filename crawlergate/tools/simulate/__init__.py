"""Offline cache-policy simulation over an access log: how big must L1 be, and what does each policy give?

The log is parsed once into a compact trace (a page number and a class bit per request, a size per
page, a day per request) that is cached on disk, so later runs skip parsing. Only crawler
requests count as hits or misses, the way the gate serves only crawlers; human requests for pages
matter only where a policy lets them load L1 (the paper's human-induced prefetching). Policies,
all by bytes (Broder, Najork & Wiener 2003 define the classic ones; Koehl & Wang 2012 Table 5):

    lru        least recently used, crawler requests only
    lru+human  LRU where human requests also load and refresh pages (only crawler requests are counted)
    clock      second-chance approximation of LRU
    random     evict a random page
    static     yesterday's most crawled pages, fixed for the day
    min        Belady's clairvoyant policy: evict the page whose next crawler request is farthest away
               (by bytes this is a near-optimal bound; humans may load pages, as in lru+human)
    infinite   unlimited size: only first requests miss (a page seen by anyone before is a hit)

    trace = load_trace(Path("access.log"), classifier, keys)
    simulate(trace, "lru", 120_000_000).hit_ratio
"""

from __future__ import annotations

from crawlergate.tools.simulate.policies import (
    POLICIES,
    PolicyResult,
    knee,
    simulate,
    size_sweep,
)
from crawlergate.tools.simulate.report import (
    HOPELESS_HIT_RATIO,
    SimulationReport,
    default_sizes,
    format_report,
    ratio_text,
    run_simulation,
    size_text,
)
from crawlergate.tools.simulate.trace import (
    ASSUMED_PAGE_BYTES,
    PARALLEL_MIN_BYTES,
    STORED_STATUSES,
    TRACE_VERSION,
    Trace,
    load_trace,
    parse_trace,
)

__all__ = [
    "ASSUMED_PAGE_BYTES",
    "HOPELESS_HIT_RATIO",
    "PARALLEL_MIN_BYTES",
    "POLICIES",
    "PolicyResult",
    "STORED_STATUSES",
    "SimulationReport",
    "TRACE_VERSION",
    "Trace",
    "default_sizes",
    "format_report",
    "knee",
    "load_trace",
    "parse_trace",
    "ratio_text",
    "run_simulation",
    "simulate",
    "size_sweep",
    "size_text",
]
