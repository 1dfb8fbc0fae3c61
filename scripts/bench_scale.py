"""`crawlergate serve` on a folder of a million stored pages, beside nginx proxy_cache, in one run.

1. Generates N stored pages straight into an L2 folder (files, the folder's index, the page catalogue), and a
   folder of 10,000 for comparison; `--folder` keeps them for the next run.
2. Starts `serve` on the big folder: seconds to `healthz`, to the first L2 hit, to the end of the background load.
3. Idle CPU of the serving process over `--idle-seconds` after the load, and its RSS beyond the configured L1.
4. L2 hits (wrk, random stored pages, Googlebot) on N and on 10,000 pages, the two in turn: requests/s and p50.
5. Misses (wrk, a new URL per request) through `serve`, once its background load ended, and through nginx
   proxy_cache in front of the same origin (nginx sending one 6 KB page for every URL), `--workers` each,
   alternately, `--rounds` times: medians.
6. Eviction: `serve` restarted with the cap 10 % under what is stored, under an L2-hit load: seconds until the
   folder is under the cap, and wrk's p99 and longest request meanwhile (beside the longest request of the
   L2-hit runs of step 4, without eviction: the machine's own pauses).
7. Marks under a storm of hits: L2 hits for the catalogue's demand interval and 10 s more (past the first write of
   the crawler demand they make), a PURGE of a stored page every 0.25 s beside them: the PURGEs' median and
   slowest (a bulk write a row at a time held the catalogue, and every PURGE waited, for seconds).

Needs wrk and nginx (Debian packages).

    python scripts/bench_scale.py [--pages 1000000] [--folder /var/tmp/scale] [--seconds 5] [--rounds 3] [--workers 2]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gzip
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from benchlib import GOOGLEBOT, free_port, run_wrk, wait_for

from crawlergate.config import load_settings
from crawlergate.gate.catalogue import FLUSH_S, PageCatalogue
from crawlergate.keys import KeyMaker
from crawlergate.page import Page, content_etag
from crawlergate.stores.disk import INDEX_FILE, on_disk
from crawlergate.stores.l2index import L2Index
from crawlergate.stores.owner import MARKER_FILE
from crawlergate.wiring import DIRTY_INDEX_FILE

HERE = Path(__file__).resolve().parent
# Small beside both folders, so that random pages are L2 hits on 10,000 pages as on a million.
L1_BYTES = 256 * 1024
BATCH = 20_000
ADMIN = "/_crawlergate"
BODY = (
    "<!doctype html><html><head><title>Thread {n}</title></head><body>"
    + ("<p>Post {n}: a reply of the kind a forum thread holds, with some words in it.</p>" * 80)
    + "</body></html>"
)

RANDOM_PAGE = """
math.randomseed(os.time())
request = function()
  return wrk.format("GET", "/p/" .. math.random(0, {pages} - 1))
end
"""
NEW_PAGE = """
counter = {start}
request = function()
  counter = counter + 1
  return wrk.format("GET", "/p/" .. counter)
end
"""
ORIGIN_NGINX = """
worker_processes 1;
daemon off;
user root;
pid {prefix}/origin.pid;
error_log {prefix}/origin-error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    server {
        listen 127.0.0.1:{port};
        root {prefix};
        default_type text/html;
        location / { try_files /page.html =404; }
    }
}
"""


def generate(folder: Path, pages: int) -> None:
    """N stored pages as the gate would have stored them, keyed ``/p/<n>``."""
    if (folder / INDEX_FILE).exists():
        index = L2Index(folder / INDEX_FILE)
        index.open()
        stored = index.totals()[0]
        index.close()
        if stored == pages:
            print(f"{folder}: already generated", flush=True)
            return
        # An earlier run's eviction phase took pages away: hits on them would be misses.
        print(f"{folder}: {stored:,} of {pages:,} pages left by an earlier run; generated again", flush=True)
        shutil.rmtree(folder)
    settings = load_settings(environ={}, overrides={"server.origin": "http://127.0.0.1:9"})
    keys = KeyMaker.from_settings(settings)
    folder.mkdir(parents=True)
    index = L2Index(folder / INDEX_FILE)
    index.open()
    catalogue = PageCatalogue(folder / DIRTY_INDEX_FILE)
    catalogue.start()
    now = time.time()
    began = time.monotonic()
    for start in range(0, pages, BATCH):
        rows, stored = [], []
        for number in range(start, min(pages, start + BATCH)):
            key = keys.key_for_url(f"/p/{number}")
            assert key is not None
            body = BODY.replace("{n}", str(number)).encode()
            page = Page(200, gzip.compress(body, 6), "text/html", content_etag(body), now, now, now + 30 * 86400)
            data = page.to_bytes(key.target)
            path = folder / key.digest[:2] / f"{key.digest}.page"
            try:
                path.write_bytes(data)
            except FileNotFoundError:
                path.parent.mkdir()
                path.write_bytes(data)
            rows.append((key.digest, on_disk(len(data)), now))
            stored.append((key.digest, key.target, None))
        with index.writing() as write:
            write.put_many(rows)
        catalogue.record_stored_many(stored)
        done = min(pages, start + BATCH)
        print(f"\rgenerating {folder.name}: {done:,} of {pages:,} pages ({time.monotonic() - began:.0f} s)", end="")
    print(flush=True)
    index.close()
    catalogue.learned_stored_pages()  # as a gate's catalogue is, once told of the folder's pages
    catalogue.close()


def read_every_page(folder: Path) -> None:
    """Each page file read once, so that L2 hits on N pages and on 10,000 compare the gate, not a cold disk."""
    began = time.monotonic()
    for number, shard in enumerate(sorted(path for path in folder.iterdir() if path.is_dir() and len(path.name) == 2)):
        for entry in os.scandir(shard):
            with open(entry.path, "rb") as page:
                page.read()
        if number % 32 == 31:
            print(f"reading every page into the page cache: {number + 1} of 256 folders", flush=True)
    print(f"every page read in {time.monotonic() - began:.0f} s", flush=True)


def start_origin(prefix: Path, port: int) -> subprocess.Popen[bytes]:
    prefix.mkdir(parents=True, exist_ok=True)
    (prefix / "page.html").write_text(BODY.replace("{n}", "x"))
    config = ORIGIN_NGINX.replace("{prefix}", str(prefix)).replace("{port}", str(port))
    (prefix / "origin.conf").write_text(config)
    return subprocess.Popen(["nginx", "-p", str(prefix), "-c", str(prefix / "origin.conf")], stderr=subprocess.DEVNULL)


def start_proxy_cache(prefix: Path, port: int, origin: int, workers: int) -> subprocess.Popen[bytes]:
    (prefix / "cache").mkdir(parents=True, exist_ok=True)
    config = (HERE / "nginx-proxy-cache.conf").read_text()
    for name, value in {"workers": workers, "origin": f"127.0.0.1:{origin}", "port": port, "prefix": prefix}.items():
        config = config.replace("{" + name + "}", str(value))
    (prefix / "nginx.conf").write_text(config)
    return subprocess.Popen(["nginx", "-p", str(prefix), "-c", str(prefix / "nginx.conf")], stderr=subprocess.DEVNULL)


def start_gate(
    folder: Path, port: int, origin: int, max_bytes: int, workers: int = 1, *, fill_keep_alive: bool = False
) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "crawlergate", "serve", "--origin", f"http://127.0.0.1:{origin}"]
    command += ["--port", str(port), "--cache-dir", str(folder), "--workers", str(workers)]
    (folder / MARKER_FILE).unlink(missing_ok=True)  # the folder is this benchmark's, whatever port its origin has
    environment = {key: value for key, value in os.environ.items() if not key.startswith("CRAWLERGATE_")}
    environment |= {"CRAWLERGATE_L2_MAX_BYTES": str(max_bytes), "CRAWLERGATE_L1_MAX_BYTES": str(L1_BYTES)}
    environment |= {"CRAWLERGATE_LOG_ACCESS_LOG": str(folder.parent / f"access-{folder.name}-{port}.log")}
    environment |= {"CRAWLERGATE_SERVER_FILL_KEEP_ALIVE": "true" if fill_keep_alive else "false"}
    return subprocess.Popen(command, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=environment)


def started(gate: subprocess.Popen[bytes], port: int, began: float, pages: int) -> tuple[float, float]:
    """Seconds from ``began`` to healthz answering, and to the first L2 hit."""
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
        healthy = _first(lambda: client.get(f"{ADMIN}/healthz").status_code == 200, gate) - began
        page, crawler = f"/p/{pages // 2}", {"User-Agent": GOOGLEBOT}
        hit = _first(lambda: "hit" in client.get(page, headers=crawler).headers.get("x-crawlergate", ""), gate)
    return healthy, hit - began


def _first(answered: object, gate: subprocess.Popen[bytes]) -> float:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if gate.poll() is not None:
            raise SystemExit("serve exited at start")
        try:
            if answered():  # type: ignore[operator]
                return time.monotonic()
        except httpx.HTTPError:
            pass
        time.sleep(0.01)
    raise SystemExit("serve did not answer within 10 minutes")


def l2_figures(port: int) -> dict[str, float]:
    figures: dict[str, float] = httpx.get(f"http://127.0.0.1:{port}{ADMIN}/stats", timeout=10).json()["l2"]
    return figures


def wait_loaded(port: int) -> float:
    began = time.monotonic()
    while "loading" in l2_figures(port):
        time.sleep(0.1)
    return time.monotonic() - began


def cpu_seconds(pid: int) -> float:
    """User and system CPU of a process and its children so far."""
    total = 0.0
    for process in [pid, *_children(pid)]:
        with open(f"/proc/{process}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _children(pid: int) -> list[int]:
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as children:
            found += [int(child) for child in children.read().split()]
    return [grandchild for child in found for grandchild in (child, *_children(child))]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def wrk_with(script: str, port: int, seconds: int, folder: Path) -> dict[str, float]:
    path = folder / "wrk.lua"
    path.write_text(script)
    return run_wrk(f"http://127.0.0.1:{port}/", GOOGLEBOT, seconds, 16, script=str(path))


def purges_under_hits(port: int, pages: int, folder: Path) -> str:
    """L2 hits on random pages for FLUSH_S + 10 s, and beside them a PURGE every 0.25 s: the PURGEs' times."""
    seconds = int(FLUSH_S) + 10
    times: list[float] = []
    with concurrent.futures.ThreadPoolExecutor(1) as pool, httpx.Client(timeout=120) as client:
        load = pool.submit(wrk_with, RANDOM_PAGE.replace("{pages}", str(pages)), port, seconds, folder)
        while not load.done():
            began = time.perf_counter()
            client.request("PURGE", f"http://127.0.0.1:{port}/p/{len(times) % pages}").raise_for_status()
            times.append((time.perf_counter() - began) * 1000)
            time.sleep(0.25)
        hits = load.result()
    return (
        f"PURGE under {hits['rps']:,.0f} L2 hits/s for {seconds} s: {len(times)} PURGEs, median "
        f"{statistics.median(times):.0f} ms, slowest {max(times):,.0f} ms"
    )


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=1_000_000)
    parser.add_argument("--folder", type=Path, help="keep the generated folders here (default: a temporary one)")
    parser.add_argument("--seconds", type=int, default=5, help="each wrk run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle-seconds", type=int, default=60)
    parser.add_argument("--workers", type=int, default=1, help="of serve and of nginx, for the misses")
    args = parser.parse_args()
    for tool in ("wrk", "nginx"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is needed: apt-get install {tool}")
    work = Path(tempfile.mkdtemp(prefix="crawlergate-scale-"))
    root = args.folder or work
    big, small = root / f"pages-{args.pages}", root / "pages-10000"
    generate(big, args.pages)
    generate(small, 10_000)
    for folder in (big, small):  # what the last run's misses added, gone
        for path in folder.parent.glob(f"access-{folder.name}-*.log*"):
            path.unlink()
    origin_port, gate_port, nginx_port = free_port(), free_port(), free_port()
    processes = [start_origin(work / "origin", origin_port)]
    wait_for(origin_port)
    try:
        cap = 2 * on_disk(4000) * args.pages + (1 << 30)
        began = time.monotonic()
        gate = start_gate(big, gate_port, origin_port, cap)
        healthy, first_hit = started(gate, gate_port, began, args.pages)
        wait_loaded(gate_port)
        loaded = time.monotonic() - began
        print(f"start-up with {args.pages:,} pages: healthz {healthy:.2f} s, first L2 hit {first_hit:.2f} s")
        print(f"the folder's background load ended {loaded:.1f} s after start", flush=True)
        before = cpu_seconds(gate.pid)
        time.sleep(args.idle_seconds)
        idle = (cpu_seconds(gate.pid) - before) / args.idle_seconds
        print(f"idle CPU over {args.idle_seconds} s: {idle:.2%} of a core; RSS {rss_mb(gate.pid):.0f} MB", flush=True)
        read_every_page(big)  # as a server up for a while holds them in the page cache, like the 10,000
        # The two folders in turn, each served by a gate of its own, round after round: no order favours either.
        runs: dict[int, list[dict[str, float]]] = {args.pages: [], 10_000: []}
        for _ in range(args.rounds):
            for folder, pages in ((big, args.pages), (small, 10_000)):
                stop(gate)
                gate = start_gate(folder, gate_port, origin_port, cap)
                started(gate, gate_port, time.monotonic(), pages)
                wait_loaded(gate_port)
                runs[pages].append(wrk_with(RANDOM_PAGE.replace("{pages}", str(pages)), gate_port, args.seconds, work))
                if pages == args.pages:
                    rss_after_hits = rss_mb(gate.pid)
        for pages, measured in runs.items():
            rps, p50, p99 = (statistics.median(run[field] for run in measured) for field in ("rps", "p50_ms", "p99_ms"))
            # The longest of all runs: what the machine's own pauses give, beside the eviction's below.
            longest = max(run["max_ms"] for run in measured)
            figures = f"{rps:,.0f}/s, p50 {p50:.2f} ms, p99 {p99:.1f} ms, longest {longest:.1f} ms"
            print(f"L2 hits on {pages:,} pages: {figures}")
        print(f"RSS after the hits: {rss_after_hits:.0f} MB (L1 {L1_BYTES >> 10} KB)", flush=True)
        stop(gate)
        gate = start_gate(big, gate_port, origin_port, cap, args.workers)
        started(gate, gate_port, time.monotonic(), args.pages)
        wait_loaded(gate_port)  # as the hits: a server up for a while (its start-up is measured above)
        # The same folder, fills on connections kept open (server.fill_keep_alive), beside it.
        kept_port = free_port()
        processes.append(start_gate(big, kept_port, origin_port, cap, args.workers, fill_keep_alive=True))
        proxy = start_proxy_cache(work / "nginx", nginx_port, origin_port, args.workers)
        processes.append(proxy)
        wait_for(nginx_port)
        wait_for(kept_port)
        cases = {"serve": gate_port, "serve, server.fill_keep_alive": kept_port, "nginx": nginx_port}
        misses: dict[str, list[float]] = {name: [] for name in cases}
        for number in range(args.rounds):
            for turn, (name, port) in enumerate(cases.items()):
                start = 10 * args.pages + (number * len(cases) + turn) * 10_000_000
                run = wrk_with(NEW_PAGE.replace("{start}", str(start)), port, args.seconds, work)
                misses[name].append(run["rps"])
        nginx_misses = statistics.median(misses.pop("nginx"))
        for name, measured in misses.items():
            served = statistics.median(measured)
            print(
                f"misses, {args.workers} worker(s) each: {name} {served:,.0f}/s, nginx proxy_cache "
                f"{nginx_misses:,.0f}/s = {served / nginx_misses:.2f}x"
            )
        stored = l2_figures(gate_port)["bytes"]
        stop(gate)
        lowered = int(stored * 0.9)
        gate = start_gate(big, gate_port, origin_port, lowered)
        started(gate, gate_port, time.monotonic(), args.pages)
        began = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            load = pool.submit(wrk_with, RANDOM_PAGE.replace("{pages}", str(args.pages)), gate_port, 20, work)
            while l2_figures(gate_port)["bytes"] > lowered:
                time.sleep(0.05)
            evicted_s = time.monotonic() - began
            under_load = load.result()
        print(
            f"eviction of 10 % ({(stored - lowered) / 1e6:,.0f} MB): under the cap {evicted_s:.1f} s after start; "
            f"L2 hits during the first 20 s {under_load['rps']:,.0f}/s, p99 {under_load['p99_ms']:.1f} ms, "
            f"longest {under_load['max_ms']:.1f} ms"
        )
        stop(gate)
        gate = start_gate(big, gate_port, origin_port, cap)
        started(gate, gate_port, time.monotonic(), args.pages)
        wait_loaded(gate_port)
        print(purges_under_hits(gate_port, args.pages, work), flush=True)
        stop(gate)
    finally:
        for process in processes:
            stop(process)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
