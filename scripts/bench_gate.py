"""The gate under load: crawler L1 hits against a bare endpoint, and human pass-through overhead.

Each case is a uvicorn server (same settings: one worker, httptools, uvloop; the gate cases on `serve`'s
protocol, crawlergate/adapters/httpserver.py) started in its own
process on loopback, loaded by wrk (a C load generator, so the client does not limit the figures)
with 32 connections. Pairs run alternately, `--rounds` times, and medians are reported:

- bare:      a Starlette endpoint returning a 17 KB gzip page from memory
- gate:      the same page served by CrawlerGateMiddleware as an L1 hit (embedded L1)
- gate-unmeasured: the same with nothing counted (a Metrics that drops every count) and no access log
- gate-measured:   the same as `serve` runs it: counters in a shared folder (summed across workers) and
                   the access log on
- gate-mc:   the same, with L1 on a real memcached (needs the memcached binary)
- gate-unjudged:   the same as gate with the judge idle: no evidence, no search-engine ranges (what a
                   crawler hit cost before issue 16)
- gate-suspect:    an L1 hit for a scraper with a Chrome user agent and curl's headers, from an address a
                   trusted proxy names (evidence from the request and the behaviour sketch, every request)
- site-2ms:  a page costing 2 ms of CPU, for humans, without the gate
- gate-2ms:  the same site behind the gate (human pass-through; a person's browser headers, judged)
- gate-2ms-unjudged: the same with the judge idle

With ``--against DIR`` (a checkout of an earlier commit, e.g. ``git worktree add /tmp/before HEAD~3``)
the gate cases also run as ``NAME@before`` with that checkout's code, alternating with today's, so a
change is measured side by side in one run.

    python scripts/bench_gate.py [--seconds 10] [--rounds 3] [--connections 32] [--against DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import BROWSER_NAVIGATION, CHROME, FIREFOX, GOOGLEBOT, free_port, run_wrk, wait_for

WORDS = [
    "forum",
    "thread",
    "reply",
    "quote",
    "member",
    "posted",
    "about",
    "the",
    "engine",
    "crawler",
    "cache",
    "page",
    "server",
    "time",
]


def page_html(target_gzip_bytes: int = 17_000) -> bytes:
    """A forum-like HTML page whose gzip size is close to the target (the paper's pages averaged ~14 KB gzip)."""
    import gzip

    rng = random.Random(7)
    parts = ["<html><head><title>Thread</title></head><body>"]
    while len(gzip.compress("".join(parts).encode(), mtime=0)) < target_gzip_bytes:
        words = " ".join(rng.choice(WORDS) + str(rng.randrange(1000)) for _ in range(40))
        parts.append(f'<div class="post" id="p{rng.randrange(10**6)}"><p>{words}</p></div>\n')
    parts.append("</body></html>")
    return "".join(parts).encode()


def build_app(name: str, cache_dir: str, memcached: str):  # type: ignore[no-untyped-def]
    import gzip

    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    from crawlergate import CrawlerGateMiddleware
    from crawlergate.config import (
        EvidenceSettings,
        L1Settings,
        L2Settings,
        LogSettings,
        MetricsSettings,
        ServerSettings,
        Settings,
        VerifySettings,
    )
    from crawlergate.wiring import build_cache

    _Uncounted = _uncounted_class()

    html = page_html()
    compressed = gzip.compress(html, mtime=0)

    async def bare(request):  # type: ignore[no-untyped-def]
        return Response(compressed, media_type="text/html", headers={"content-encoding": "gzip"})

    async def page(request):  # type: ignore[no-untyped-def]
        return Response(html, media_type="text/html")

    async def cpu_page(request):  # type: ignore[no-untyped-def]
        deadline = time.perf_counter() + 0.002
        while time.perf_counter() < deadline:
            pass
        return Response(b"<html><body>a 2 ms page</body></html>", media_type="text/html")

    if name == "bare":
        return Starlette(routes=[Route("/t/1", bare)])
    if name == "site-2ms":
        return Starlette(routes=[Route("/t/1", cpu_page)])
    l1 = L1Settings(memcached=(memcached,)) if name == "gate-mc" else L1Settings()
    settings = Settings(l1=l1, l2=L2Settings(cache_dir=cache_dir))
    if name.endswith("-unjudged"):
        no_ranges = Path(cache_dir) / "no-ranges.toml"
        no_ranges.parent.mkdir(parents=True, exist_ok=True)
        no_ranges.write_text("")
        settings = dataclasses.replace(
            settings, evidence=EvidenceSettings(enabled=False), verify=VerifySettings(ranges_file=str(no_ranges))
        )
    if name == "gate-suspect":
        settings = dataclasses.replace(settings, server=ServerSettings(trusted_proxies=("127.0.0.1",)))
    site = Starlette(routes=[Route("/t/1", cpu_page if name.startswith("gate-2ms") else page)])
    if name == "gate-unmeasured":
        return CrawlerGateMiddleware(site, settings=settings, cache=build_cache(settings, _Uncounted()))
    if name == "gate-measured":
        measured = dataclasses.replace(
            settings,
            metrics=MetricsSettings(shared_dir=str(Path(cache_dir) / "metrics")),
            log=LogSettings(access_log=str(Path(cache_dir) / "access.log")),
        )
        return CrawlerGateMiddleware(site, settings=measured)
    return CrawlerGateMiddleware(site, settings=settings)


def _uncounted_class():  # type: ignore[no-untyped-def]
    from crawlergate.metrics import Metrics

    class Uncounted(Metrics):
        """Counts nothing: the baseline that shows what counting costs."""

        def record(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            pass

        def record_for(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            pass

        def count(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            pass

    return Uncounted


def serve(name: str, port: int, cache_dir: str, memcached: str) -> None:
    import uvicorn

    app = build_app(name, cache_dir, memcached)
    # The gate cases on serve's own protocol, which answers a crawler's L1 hit without an ASGI cycle.
    protocol: object = "httptools"
    if name.startswith("gate"):
        from crawlergate.adapters.httpserver import LimitedHttpToolsProtocol

        protocol = LimitedHttpToolsProtocol
    # proxy_headers off, as serve runs it: uvicorn's middleware around the gate would hide it from the protocol.
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        http=protocol,
        loop="uvloop",
        access_log=False,
        proxy_headers=False,
    )


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far (/proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--cases", help="only these cases, comma-separated (default: all)")
    parser.add_argument("--against", help="also run the gate cases with the crawlergate of this checkout (NAME@before)")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", help=argparse.SUPPRESS)
    parser.add_argument("--memcached", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port, args.cache_dir, args.memcached)
        return 0
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is needed: apt-get install -y wrk")

    processes: list[subprocess.Popen[bytes]] = []
    memcached = ""
    person = (FIREFOX, BROWSER_NAVIGATION)
    cases = [
        ("bare", (GOOGLEBOT, ())),
        ("gate", (GOOGLEBOT, ())),
        ("gate-unjudged", (GOOGLEBOT, ())),
        ("gate-suspect", (CHROME, ("Accept: */*", "X-Forwarded-For: 203.0.113.9"))),
        ("gate-unmeasured", (GOOGLEBOT, ())),
        ("gate-measured", (GOOGLEBOT, ())),
        ("site-2ms", person),
        ("gate-2ms", person),
        ("gate-2ms-unjudged", person),
    ]
    if shutil.which("memcached"):
        port = free_port()
        memcached = f"127.0.0.1:{port}"
        processes.append(subprocess.Popen(["memcached", "-l", "127.0.0.1", "-p", str(port), "-m", "64", "-u", "root"]))
        wait_for(port)
        cases.insert(2, ("gate-mc", (GOOGLEBOT, ())))
    if args.cases:
        cases = [case for case in cases if case[0] in args.cases.split(",")]
    if args.against:
        if not (Path(args.against) / "crawlergate" / "__init__.py").is_file():
            raise SystemExit(f"--against {args.against}: no crawlergate package there")
        cases = [
            twin for case in cases for twin in ([case, (case[0] + "@before", case[1])] if "gate" in case[0] else [case])
        ]
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _ in cases}
    with tempfile.TemporaryDirectory() as cache_dir:
        # The servers stop before their folders go: the access log writes its last lines there.
        try:
            ports = {}
            servers: dict[str, subprocess.Popen[bytes]] = {}
            for name, _ in cases:
                ports[name] = free_port()
                command = [
                    sys.executable, __file__, "--serve", name.removesuffix("@before"), "--port", str(ports[name]),
                    "--cache-dir", str(Path(cache_dir) / name), "--memcached", memcached,
                ]  # fmt: skip
                # Each server loads its checkout the same way, from PYTHONPATH: this one's, or --against's.
                code = Path(args.against) if name.endswith("@before") else Path(__file__).resolve().parent.parent
                env = {**os.environ, "PYTHONPATH": str(code.resolve())}
                servers[name] = subprocess.Popen(command, env=env)
                processes.append(servers[name])
            for name, (user_agent, headers) in cases:
                wait_for(ports[name])
                url = f"http://127.0.0.1:{ports[name]}/t/1"
                run_wrk(url, user_agent, 1, 4, headers=headers)  # warm: fills the cache, opens pools
            for round_number in range(args.rounds):
                # Every other round runs the cases backwards: the case run first in a pair measured ~2 % slower.
                for name, (user_agent, headers) in cases if round_number % 2 == 0 else cases[::-1]:
                    url = f"http://127.0.0.1:{ports[name]}/t/1"
                    cpu_before = _cpu_seconds(servers[name].pid)
                    figures = run_wrk(url, user_agent, args.seconds, args.connections, headers=headers)
                    # The server's own CPU per request: steadier than throughput, which wrk shares the machine with.
                    cpu = _cpu_seconds(servers[name].pid) - cpu_before
                    figures["cpu_us"] = cpu * 1e6 / max(figures["rps"] * args.seconds, 1)
                    results[name].append(figures)
                print(f"round {round_number + 1}/{args.rounds} done", file=sys.stderr)
        finally:
            for process in processes:
                process.terminate()
                process.wait(timeout=10)

    print(f"\nwrk, {args.connections} connections, {args.seconds} s x {args.rounds} rounds, medians")
    print(f"{'case':<16}{'requests/s':>14}{'p50 ms':>10}{'p99 ms':>10}{'non-2xx':>10}{'CPU µs/req':>12}")
    median = {name: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for name, runs in results.items()}
    for name, figures in median.items():
        print(
            f"{name:<16}{figures['rps']:>14,.0f}{figures['p50_ms']:>10.2f}{figures['p99_ms']:>10.2f}{figures['errors']:>10.0f}"
            f"{figures['cpu_us']:>12.1f}"
        )
    print()

    def ratio(top: str, bottom: str) -> str:
        return f"{median[top]['rps'] / median[bottom]['rps']:.1%}" if top in median and bottom in median else "n/a"

    print(f"crawler L1 hit vs bare endpoint: {ratio('gate', 'bare')} of throughput")
    for judged, idle, what in (
        ("gate", "gate-unjudged", "crawler L1 hit"),
        ("gate-suspect", "gate-unjudged", "suspect L1 hit"),
        ("gate-2ms", "gate-2ms-unjudged", "human pass-through"),
    ):
        if judged in median and idle in median:
            extra = median[judged]["cpu_us"] - median[idle]["cpu_us"]
            print(f"{what}, judged vs judge idle: {ratio(judged, idle)} of throughput, CPU {extra:+.1f} µs a request")
    print(f"crawler L1 hit, counters shared and access log on vs nothing counted: "
          f"{ratio('gate-measured', 'gate-unmeasured')}")  # fmt: skip
    if "gate-measured" in median and "gate-unmeasured" in median:
        extra = median["gate-measured"]["cpu_us"] - median["gate-unmeasured"]["cpu_us"]
        print(f"  CPU of counting and logging: {extra:+.1f} µs a request "
              f"({extra / median['gate-unmeasured']['cpu_us']:+.1%})")  # fmt: skip
    print(f"crawler L1 hit (memcached) vs bare: {ratio('gate-mc', 'bare')}")
    if "gate-2ms" in median and "site-2ms" in median:
        print(f"human pass-through vs site: {ratio('gate-2ms', 'site-2ms')} of throughput, "
              f"p50 {median['gate-2ms']['p50_ms'] - median['site-2ms']['p50_ms']:+.2f} ms")  # fmt: skip
    for name in median:
        if name.endswith("@before"):
            now = name.removesuffix("@before")
            extra = median[now]["cpu_us"] - median[name]["cpu_us"]
            print(f"{now}, this checkout vs --against: {ratio(now, name)} of throughput, CPU {extra:+.1f} µs a request")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
