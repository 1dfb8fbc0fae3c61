"""How fast Python can answer here at all, beside nginx proxy_cache and `crawlergate serve`, in one run.

A *floor server* does only the I/O of a crawler's answer, on the same event loop and parser as `serve`
(uvloop, httptools), and nothing of the gate's work (no decision, no counters, no log, no store):

- hit:  every request answered with a stored gzip page from memory;
- miss: every request asks the origin for its URL on a new connection, reads the Content-Length body,
        compresses it (gzip level 6, as fills do) and answers;
- pass: a person's request passed on: each client connection has one kept-alive connection to the origin,
        the request's bytes go there as read, and the answer's back as read once it ended.

Each is measured beside nginx proxy_cache (scripts/nginx-proxy-cache.conf, hits from its cache, misses a
new URL each) and `serve` doing the same, all in front of one nginx origin sending a 6 KB page for every
URL, one worker each, alternately, `--rounds` times: medians. The floor says what share of nginx a
Python server on this machine can reach before the gate does anything; a goal above it needs more
than trimming the gate.

Then people's pass-through: the demo forum (a page of `--page-ms` of work, 20 ms as issue 26 measures it)
asked straight, through the pass floor, nginx `proxy_pass` and `serve`, one request to each in turn, with a
browser's navigation headers: the time each adds, as the median of the pairs.

Needs wrk and nginx (Debian packages).

    python scripts/bench_floor.py [--seconds 5] [--rounds 3] [--people 300] [--page-ms 20]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from bench_proxy import _print_paired, paired_latencies, start_forum, start_plain_nginx
from bench_scale import NEW_PAGE, start_gate, start_origin, start_proxy_cache, stop, wrk_with
from benchlib import GOOGLEBOT, free_port, wait_for

HIT_URL = "/p/1"
GZIP_LEVEL = 6


class FloorServer(asyncio.Protocol):
    """One client connection of the floor server: requests parsed by httptools, each answered by ``answer``."""

    stored = b""  # the whole answer of a hit, head and gzip body
    origin: tuple[str, int] | None = None  # misses ask here

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        import httptools

        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_message_complete(self) -> None:
        if self.origin is None:
            self.transport.write(self.stored)
        else:
            asyncio.get_running_loop().create_task(self.fill(self.url))

    async def fill(self, url: bytes) -> None:
        assert self.origin is not None
        reader, writer = await asyncio.open_connection(*self.origin)
        writer.write(b"GET %s HTTP/1.1\r\nHost: origin\r\nConnection: close\r\n\r\n" % url)
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line[15:]) for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:"))
        body = await reader.readexactly(length)
        writer.close()
        compressed = gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0)
        if not self.transport.is_closing():
            self.transport.write(_answer(compressed))


class FloorPass(asyncio.Protocol):
    """One client connection of the pass floor: its requests go to the origin on one kept-alive connection."""

    origin: tuple[str, int] = ("127.0.0.1", 0)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.upstream: asyncio.Transport | None = None
        self.waiting: list[bytes] = []
        asyncio.get_running_loop().create_task(self.connect())

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        self.upstream, _ = await loop.create_connection(lambda: FloorAnswer(self.transport), *self.origin)
        for data in self.waiting:
            self.upstream.write(data)

    def data_received(self, data: bytes) -> None:
        if self.upstream is None:
            self.waiting.append(data)
        else:
            self.upstream.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None:
            self.upstream.close()


class FloorAnswer(asyncio.Protocol):
    """The origin's side of a pass floor's connection: each answer parsed for its end, then sent on whole."""

    def __init__(self, client: asyncio.Transport) -> None:
        import httptools

        self.client = client
        self.parser = httptools.HttpResponseParser(self)
        self.pieces: list[bytes] = []

    def data_received(self, data: bytes) -> None:
        self.pieces.append(data)
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        if not self.client.is_closing():
            self.client.write(b"".join(self.pieces))
        self.pieces = []


def _answer(compressed: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-encoding: gzip\r\ncontent-length: %d\r\n\r\n"
    return head % len(compressed) + compressed


def run_floor_server(port: int, kind: str, origin: int) -> None:
    import uvloop

    protocol: type[asyncio.Protocol] = FloorServer
    if kind == "pass":
        FloorPass.origin = ("127.0.0.1", origin)
        protocol = FloorPass
    elif kind == "miss":
        FloorServer.origin = ("127.0.0.1", origin)
    else:
        page = httpx.get(f"http://127.0.0.1:{origin}{HIT_URL}").content
        FloorServer.stored = _answer(gzip.compress(page, compresslevel=GZIP_LEVEL, mtime=0))

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(protocol, "127.0.0.1", port)
        await server.serve_forever()

    uvloop.run(main())


def start_floor_server(port: int, kind: str, origin: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, __file__, "--floor-server", kind, "--port", str(port), "--origin", str(origin)]
    return subprocess.Popen(command, stderr=subprocess.DEVNULL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=5, help="each wrk run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--people", type=int, default=300, help="requests to each, people's pass-through")
    parser.add_argument("--page-ms", type=float, default=20.0, help="CPU time of the forum's page")
    parser.add_argument("--floor-server", choices=("hit", "miss", "pass"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--origin", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor_server:
        run_floor_server(args.port, args.floor_server, args.origin)
        return 0
    for tool in ("wrk", "nginx"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is needed: apt-get install {tool}")
    work = Path(tempfile.mkdtemp(prefix="crawlergate-floor-"))
    origin = free_port()
    processes = [start_origin(work / "origin", origin)]
    try:
        wait_for(origin)
        ports = {name: free_port() for name in ("floor hit", "floor miss", "nginx proxy_cache", "crawlergate serve")}
        processes.append(start_floor_server(ports["floor hit"], "hit", origin))
        processes.append(start_floor_server(ports["floor miss"], "miss", origin))
        processes.append(start_proxy_cache(work / "nginx", ports["nginx proxy_cache"], origin, 1))
        (work / "l2").mkdir()
        processes.append(start_gate(work / "l2", ports["crawlergate serve"], origin, 1 << 32))
        for port in ports.values():
            wait_for(port, timeout_s=60)
        crawler = {"user-agent": GOOGLEBOT, "accept-encoding": "gzip"}
        for name in ("nginx proxy_cache", "crawlergate serve"):  # the hit page stored
            httpx.get(f"http://127.0.0.1:{ports[name]}{HIT_URL}", headers=crawler).raise_for_status()
        hit_script = work / "hit.lua"
        hit_script.write_text(f'request = function() return wrk.format("GET", "{HIT_URL}") end\n')
        cases = {
            ("hits", "floor"): ports["floor hit"],
            ("hits", "nginx"): ports["nginx proxy_cache"],
            ("hits", "serve"): ports["crawlergate serve"],
            ("misses", "floor"): ports["floor miss"],
            ("misses", "nginx"): ports["nginx proxy_cache"],
            ("misses", "serve"): ports["crawlergate serve"],
        }
        rates: dict[tuple[str, str], list[float]] = {case: [] for case in cases}
        first = 1_000_000
        began = time.monotonic()
        for round_number in range(args.rounds):
            for (part, name), port in cases.items():
                first += 10_000_000  # every miss run asks for URLs nobody asked before
                script = NEW_PAGE.replace("{start}", str(first)) if part == "misses" else hit_script.read_text()
                rates[part, name].append(wrk_with(script, port, args.seconds, work)["rps"])
            print(f"round {round_number + 1}/{args.rounds} done ({time.monotonic() - began:.0f} s)", flush=True)
        people = pass_through(work, args.people, args.page_ms, processes)
    finally:
        for process in processes:
            stop(process)
        shutil.rmtree(work, ignore_errors=True)
    median = {case: statistics.median(values) for case, values in rates.items()}
    print(f"\nwrk, 16 connections, {args.seconds} s x {args.rounds} rounds, medians; one worker each")
    print(f"{'':<8}{'floor':>12}{'nginx':>12}{'serve':>12}{'floor/nginx':>14}{'serve/nginx':>14}{'serve/floor':>14}")
    for part in ("hits", "misses"):
        floor, nginx, serve = (median[part, name] for name in ("floor", "nginx", "serve"))
        print(
            f"{part:<8}{floor:>12,.0f}{nginx:>12,.0f}{serve:>12,.0f}{floor / nginx:>13.2f}x{serve / nginx:>13.2f}x"
            f"{serve / floor:>13.0%}"
        )
    print(f"\nPeople's pass-through, a {args.page_ms:g} ms forum page, {args.people} requests to each in turn")
    _print_paired(people, "straight to the forum")
    return 0


def pass_through(
    work: Path, requests: int, page_ms: float, processes: list[subprocess.Popen[bytes]]
) -> dict[str, list[float]]:
    """Milliseconds per request of a person's page load: straight to the forum, through the pass floor, nginx
    proxy_pass and serve (their processes join ``processes``)."""
    forum = free_port()
    processes.append(start_forum(work, forum, page_ms))
    wait_for(forum, timeout_s=60)
    ports = {"straight to the forum": forum, "pass floor": free_port(), "nginx proxy_pass": free_port()}
    ports["crawlergate serve"] = free_port()
    processes.append(start_floor_server(ports["pass floor"], "pass", forum))
    processes.append(start_plain_nginx(work, ports["nginx proxy_pass"], forum))
    (work / "l2-pass").mkdir()
    processes.append(start_gate(work / "l2-pass", ports["crawlergate serve"], forum, 1 << 32))
    for port in ports.values():
        wait_for(port, timeout_s=60)
    paired_latencies(ports, "/", 20)  # connections and caches warm
    return paired_latencies(ports, "/", requests)


if __name__ == "__main__":
    sys.exit(main())
