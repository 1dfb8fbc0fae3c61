"""What judging a request costs: the gate's decision with the judge at work against the judge idle.

In one process, GateCore.decide (routing, classification, evidence, verification, policy: everything
before the cache is asked) is timed for the requests the gate sees, with the shipped rules (judged)
and with no evidence and no search-engine ranges (idle: the decision as it was before issue 16).
Rounds alternate the two gates; medians of the rounds are reported, in µs a decision. Then the
behaviour sketch: its bytes, fixed at start, before and after a million distinct addresses, and the
time of one page observed.

    python scripts/bench_judge.py [--rounds 7] [--requests 200000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchlib import CHROME, FIREFOX, GOOGLEBOT

from crawlergate.config import load_settings
from crawlergate.gate.engine import GateCore
from crawlergate.suspect.sketch import BehaviourSketch
from crawlergate.wiring import build_core

NAVIGATION = [
    (b"accept", b"text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"),
    (b"accept-language", b"en-US,en;q=0.5"),
    (b"accept-encoding", b"gzip, deflate, br, zstd"),
    (b"sec-fetch-mode", b"navigate"),
    (b"sec-fetch-dest", b"document"),
]
HOST = [(b"host", b"forum.example")]
PEOPLE = "people's Firefox (forwarded)"
CASES = {
    "Googlebot, from this machine": [*HOST, (b"user-agent", GOOGLEBOT.encode()), (b"accept-encoding", b"gzip")],
    "Googlebot, from Google (forwarded)": [
        *HOST,
        (b"user-agent", GOOGLEBOT.encode()),
        (b"accept-encoding", b"gzip"),
        (b"x-forwarded-for", b"66.249.66.1"),
    ],
    "curl as Chrome (forwarded): suspect": [
        *HOST,
        (b"user-agent", CHROME.encode()),
        (b"accept", b"*/*"),
        (b"x-forwarded-for", b"203.0.113.9"),
    ],
    PEOPLE: [
        *HOST,
        (b"user-agent", FIREFOX.encode()),
        *NAVIGATION,
        (b"x-forwarded-for", b"198.51.100.4"),
    ],
}


def gate(cache_dir: Path, judged: bool) -> GateCore:
    overrides: dict[str, object] = {"l2.cache_dir": str(cache_dir)}
    if not judged:
        no_ranges = cache_dir / "no-ranges.toml"
        no_ranges.parent.mkdir(parents=True, exist_ok=True)
        no_ranges.write_text("")
        overrides |= {"evidence.enabled": False, "verify.ranges_file": str(no_ranges)}
    core = build_core(load_settings(environ={}, overrides=overrides))
    core.start()
    return core


def time_decisions(core: GateCore, headers: list[tuple[bytes, bytes]], requests: int) -> float:
    """µs a decision, over ``requests`` decisions of one page (a person's from 4,096 addresses, each reading a few
    pages: one address alone at this rate would be a suspect)."""
    decide = core.decide
    if headers is CASES[PEOPLE]:
        variants = [[*headers[:-1], (b"x-forwarded-for", b"198.51.%d.%d" % divmod(n, 256))] for n in range(4096)]
    else:
        variants = [headers]
    count = len(variants)
    started = time.perf_counter()
    for number in range(requests):
        decide("GET", "/showthread.php", b"/showthread.php", b"t=7", variants[number % count], "127.0.0.1", "https")
    return (time.perf_counter() - started) * 1e6 / requests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--addresses", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        gates = {"judged": gate(Path(folder) / "judged", True), "idle": gate(Path(folder) / "idle", False)}
        results: dict[tuple[str, str], list[float]] = {}
        for round_number in range(args.rounds):
            for case, headers in CASES.items():
                for name, core in gates.items():
                    results.setdefault((case, name), []).append(time_decisions(core, headers, args.requests))
            print(f"round {round_number + 1}/{args.rounds} done", file=sys.stderr)
        for core in gates.values():
            core.close()
    print(f"\nGateCore.decide, {args.requests:,} decisions x {args.rounds} rounds, medians (µs a decision)")
    print(f"{'request':<38}{'judge idle':>12}{'judged':>10}{'added':>10}")
    for case in CASES:
        idle = statistics.median(results[(case, "idle")])
        judged = statistics.median(results[(case, "judged")])
        print(f"{case:<38}{idle:>12.2f}{judged:>10.2f}{judged - idle:>+10.2f}")

    sketch = BehaviourSketch(8 * 1024 * 1024, half_life_s=60)
    before = sketch.nbytes
    now = time.time()
    started = time.perf_counter()
    for number in range(args.addresses):
        address = f"10.{number >> 16 & 255}.{number >> 8 & 255}.{number & 255}"
        sketch.observe_page(address, referer=False, deep=True, cookie=False, now=now + number / 10_000)
    elapsed = time.perf_counter() - started
    print(
        f"\nbehaviour sketch (evidence.sketch_bytes 8 MiB): {before:,} bytes at start, {sketch.nbytes:,} after "
        f"{args.addresses:,} distinct addresses; {elapsed * 1e6 / args.addresses:.2f} µs a page observed "
        "(address and network)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
