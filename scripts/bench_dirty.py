"""The dirty index's rates: pages recorded as stored, marks one at a time and in batches, and lookups.

A catalogue of `--pages` stored pages in a fresh SQLite file (WAL, as beside L2), then:

- record:   record_stored of every page (what each fill adds)
- mark one: mark([digest]) for 5,000 pages, one transaction each (an invalidate of one URL)
- mark all: mark(every digest) in one call (an invalidate of many URLs, a pattern, a write rule)
- pattern:  matching("/showthread.php?t=1*") and marking what it finds
- lookup:   dirty_since(digest), the request path's question

    python scripts/bench_dirty.py [--pages 153100]
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import time
from pathlib import Path

from crawlergate.gate.catalogue import PageCatalogue


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=153_100, help="pages in the catalogue (the paper's forum)")
    args = parser.parse_args()
    targets = [f"/showthread.php?t={number}" for number in range(1, args.pages + 1)]
    digests = [hashlib.blake2b(target.encode(), digest_size=16).hexdigest() for target in targets]
    with tempfile.TemporaryDirectory() as folder:
        index = PageCatalogue(Path(folder) / "dirty.sqlite3")
        index.start()
        started = time.perf_counter()
        for digest, target in zip(digests, targets, strict=True):
            index.record_stored(digest, target)
        report("record_stored", len(digests), started)

        singles = digests[:5000]
        started = time.perf_counter()
        for digest in singles:
            index.mark([digest], "api")
        report("mark, one page a call", len(singles), started)

        started = time.perf_counter()
        marked = index.mark(digests, "write-rule")
        report(f"mark, {marked:,} pages in one call", marked, started)

        started = time.perf_counter()
        found = index.matching("/showthread.php?t=1*")
        index.mark(found, "api")
        report(f"pattern /showthread.php?t=1* ({len(found):,} pages) matched and marked", len(found), started)

        started = time.perf_counter()
        for digest in digests:
            index.dirty_since(digest)
        report("dirty_since lookups", len(digests), started)
        index.close()
    return 0


def report(what: str, count: int, started: float) -> None:
    seconds = time.perf_counter() - started
    print(f"{what:<62}{count / seconds:>14,.0f} /s  ({seconds:.3f} s)")


if __name__ == "__main__":
    raise SystemExit(main())
