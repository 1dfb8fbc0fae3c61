"""Speed of `crawlergate simulate`: parsing a log (first run), and each policy on the parsed trace.

    python scripts/bench_simulate.py LOG [--sizes 120MB,250MB,500MB] [--repeats 3]

Rates are cacheable page requests of the trace per second (crawler and human requests alike, as
the paper's monitor counted its trace); medians of the repeats.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from pathlib import Path

from crawlergate.classify import Classifier
from crawlergate.config import Settings, parse_size
from crawlergate.keys import KeyMaker
from crawlergate.tools.simulate import POLICIES, parse_trace, simulate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--sizes", default="120MB,250MB,500MB")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    settings = Settings()
    classifier = Classifier.from_settings(settings.classify)
    keys = KeyMaker.from_settings(settings)
    started = time.perf_counter()
    trace = parse_trace(args.log, classifier, keys)
    parsed = time.perf_counter() - started
    print(
        f"parse: {trace.lines:,} lines in {parsed:.2f} s = {trace.lines / parsed:,.0f} lines/s; "
        f"{trace.requests:,} cacheable requests ({trace.crawler_requests:,} crawler) to {trace.unique_pages:,} pages"
    )
    sizes = [parse_size(size) for size in args.sizes.split(",")]
    print(f"{'policy':<11}" + "".join(f"{size / 1e6:>10.0f}MB hit   req/s" for size in sizes))
    for policy in POLICIES:
        row = f"{policy:<11}"
        for size in sizes:
            times = []
            for _ in range(args.repeats):
                begun = time.perf_counter()
                result = simulate(trace, policy, size)
                times.append(time.perf_counter() - begun)
            row += f"{result.hit_ratio:>14.2%}{trace.requests / statistics.median(times):>10,.0f}"
        print(row)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak memory of this process: {peak_mb:.0f} MB (parsing workers are separate processes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
