"""How much of what `crawlergate replay` reports is the replay client itself, measured against wrk.

A gate serving a 17 KB page as an L1 hit (scripts/bench_gate.py's "gate" case, its own process) is
loaded in turn by wrk (C) and by replay, side by side, `--rounds` times; medians are reported:

- overhead: one connection, p50 TTFB of replay (and of a plain httpx loop, the client replay used
  before) against wrk's p50 latency on the same URL and user agent;
- throughput: 32 connections, requests/s of replay against wrk;
- schedule: an open-loop replay at 2,000 requests/s for `--seconds`, how late requests left.

    python scripts/bench_replay.py [--seconds 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from benchlib import GOOGLEBOT, free_port, run_wrk, wait_for

from crawlergate.tools.replay import ReplayRequest, replay, run_replay

HERE = Path(__file__).resolve().parent


def _requests(count: int, rate: float | None = None) -> list[ReplayRequest]:
    return [ReplayRequest("GET", "/t/1", GOOGLEBOT, "crawler", index / rate if rate else 0.0) for index in range(count)]


async def _httpx_p50(url: str, count: int) -> float:
    samples = []
    async with httpx.AsyncClient() as client:
        for _ in range(count):
            started = time.perf_counter()
            async with client.stream("GET", url, headers={"user-agent": GOOGLEBOT, "accept-encoding": "gzip"}) as r:
                first = time.perf_counter()
                async for _ in r.aiter_raw():
                    pass
            samples.append((first - started) * 1000)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    port = free_port()
    rows: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as cache_dir:
        server = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "bench_gate.py"),
                "--serve",
                "gate",
                "--port",
                str(port),
                "--cache-dir",
                cache_dir,
            ]  # fmt: skip
        )
        try:
            wait_for(port)
            url = f"http://127.0.0.1:{port}"
            run_wrk(f"{url}/t/1", GOOGLEBOT, 1, 4)  # fills the cache
            for round_number in range(args.rounds):
                wrk_one = run_wrk(f"{url}/t/1", GOOGLEBOT, args.seconds, 1)
                ours_one = run_replay(replay(_requests(3000), url, concurrency=1)).summary()
                before_one = asyncio.run(_httpx_p50(f"{url}/t/1", 3000))
                wrk_many = run_wrk(f"{url}/t/1", GOOGLEBOT, args.seconds, 32)
                ours_many = run_replay(replay(_requests(int(wrk_many["rps"] * args.seconds)), url, concurrency=32))
                paced = run_replay(replay(_requests(2000 * args.seconds, rate=2000), url, speed=1.0))
                lateness = sorted(paced.send_lateness_ms)
                figures = {
                    "wrk p50 ms, 1 connection": wrk_one["p50_ms"],
                    "replay p50 TTFB ms, 1 connection": ours_one["crawler"]["ttfb_ms"]["p50"],
                    "httpx loop p50 TTFB ms, 1 connection": before_one,
                    "wrk requests/s, 32 connections": wrk_many["rps"],
                    "replay requests/s, 32 connections": ours_many.summary()["throughput_rps"],
                    "open loop 2,000/s: late p50 ms": lateness[len(lateness) // 2],
                    "open loop 2,000/s: late p99 ms": lateness[int(len(lateness) * 0.99)],
                    "open loop 2,000/s: late max ms": lateness[-1],
                    "open loop 2,000/s: achieved requests/s": paced.summary()["throughput_rps"],
                }
                for name, value in figures.items():
                    rows.setdefault(name, []).append(value)
                print(f"round {round_number + 1}/{args.rounds} done", file=sys.stderr)
        finally:
            server.terminate()
            server.wait(timeout=10)
    print(f"\nmedians of {args.rounds} rounds, {args.seconds} s each, a 17 KB L1 hit on loopback")
    for name, values in rows.items():
        print(f"{name:<44}{statistics.median(values):>12,.3f}")
    overhead = statistics.median(rows["replay p50 TTFB ms, 1 connection"]) - statistics.median(
        rows["wrk p50 ms, 1 connection"]
    )
    print(f"replay's own overhead at p50: {overhead:+.3f} ms against wrk")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
