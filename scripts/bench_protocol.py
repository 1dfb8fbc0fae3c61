"""The CPU of one crawler L1 hit inside `serve`'s protocol, without the network: a deterministic figure.

wrk figures move by ±15 % between runs on a shared 2-core machine, because the socket writes, the
event loop and the load generator share the cores. This runs the protocol `serve` uses
(crawlergate/adapters/httpserver.py) with the standalone proxy's app in-process, on a transport that
only counts the bytes written, and feeds it a Googlebot request for a stored page N times a round:
parsing, the gate's decision and flow, counting, the access-log line and the answer's bytes, and
nothing of the kernel's. The page is filled once first, from a small origin on loopback.

With ``--against DIR`` (a checkout of an earlier commit, e.g. ``git worktree add /tmp/before HEAD~3``)
the same measure runs with that checkout's code too, alternating with this one's, and the ratio is
reported: a change of the hit path measured side by side.

    python scripts/bench_protocol.py [--requests 40000] [--rounds 5] [--against DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchlib import GOOGLEBOT

POST = b"<p>A post in a forum thread, with some words in it.</p>"
PAGE = b"<!doctype html><html><body>" + POST * 300 + b"</body></html>"


class _Origin(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - the standard library's name
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the standard library's name
        pass


class _CountingTransport(asyncio.Transport):
    """A connection whose writes are only counted."""

    def __init__(self) -> None:
        super().__init__()
        self.written = 0
        self.closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += len(data)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 8080)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


async def measure(requests: int, rounds: int) -> list[float]:
    """µs per hit, one figure a round."""
    from uvicorn.config import Config
    from uvicorn.server import ServerState

    from crawlergate.adapters.httpserver import LimitedHttpToolsProtocol
    from crawlergate.adapters.proxy import create_app
    from crawlergate.config import load_settings

    origin = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Origin)
    threading.Thread(target=origin.serve_forever, daemon=True).start()
    folder = tempfile.mkdtemp(prefix="bench-protocol-")
    settings = load_settings(
        None, {}, {"l2.cache_dir": folder, "server.origin": f"http://127.0.0.1:{origin.server_address[1]}"}
    )
    app = create_app(settings)
    # As `serve` runs it: no proxy-headers middleware between the protocol and the gate.
    config = Config(app, http=LimitedHttpToolsProtocol, log_level="warning", lifespan="off", proxy_headers=False)
    config.load()
    state = ServerState()
    app.start_serving()
    request = b"GET /showthread.php?t=7 HTTP/1.1\r\nHost: forum.example\r\nUser-Agent: " + GOOGLEBOT.encode()
    request += b"\r\nAccept-Encoding: gzip\r\n\r\n"
    try:
        filling = LimitedHttpToolsProtocol(config=config, server_state=state, app_state={})
        filling.connection_made(_CountingTransport())
        filling.data_received(request)
        deadline = time.monotonic() + 10
        while filling.cycle is None or not filling.cycle.response_complete:
            if time.monotonic() > deadline:
                raise SystemExit("the page was not filled within 10 s")
            await asyncio.sleep(0.01)
        protocol = LimitedHttpToolsProtocol(config=config, server_state=state, app_state={})
        transport = _CountingTransport()
        protocol.connection_made(transport)
        protocol.data_received(request)
        if transport.written == 0:
            raise SystemExit("the stored page was not answered in the protocol: no hit to measure")
        figures = []
        for _ in range(rounds):
            started = time.perf_counter()
            for _ in range(requests):
                protocol.data_received(request)
            figures.append((time.perf_counter() - started) / requests * 1e6)
        return figures
    finally:
        await app.aclose()
        origin.shutdown()


def _run_in(code: Path, requests: int, rounds: int) -> list[float]:
    """``measure`` in a process that imports crawlergate from ``code``."""
    environment = {**os.environ, "PYTHONPATH": str(code)}
    command = [sys.executable, __file__, "--requests", str(requests), "--rounds", str(rounds), "--raw"]
    done = subprocess.run(command, env=environment, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the measure failed with {code}'s code:\n{done.stderr or done.stdout}")
    return [float(figure) for figure in done.stdout.split()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=40_000, help="hits a round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--against", help="also measure the crawlergate of this checkout, alternating")
    parser.add_argument("--raw", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.raw:
        print(" ".join(f"{figure:.3f}" for figure in asyncio.run(measure(args.requests, args.rounds))))
        return 0
    here = Path(__file__).resolve().parent.parent
    checkouts = {"this checkout": here}
    if args.against:
        if not (Path(args.against) / "crawlergate" / "__init__.py").is_file():
            raise SystemExit(f"--against {args.against}: no crawlergate package there")
        checkouts["--against"] = Path(args.against).resolve()
    figures: dict[str, list[float]] = {name: [] for name in checkouts}
    for round_number in range(args.rounds):
        for name, code in checkouts.items():
            figures[name] += _run_in(code, args.requests, 1)
        print(f"round {round_number + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    print(f"CPU of a crawler L1 hit in serve's protocol, {args.requests:,} hits a round, {args.rounds} rounds")
    for name, values in figures.items():
        print(f"{name:>14}: median {statistics.median(values):6.1f} µs, best {min(values):6.1f} µs")
    if args.against:
        ratio = statistics.median(figures["this checkout"]) / statistics.median(figures["--against"])
        print(f"this checkout takes {ratio:.0%} of --against's time a hit ({1 / ratio:.2f}x the hits a core)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
