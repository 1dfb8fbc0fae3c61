"""`crawlergate serve` beside nginx proxy_cache, in front of the demo forum, in one run.

- Crawler L1 hits: wrk with Googlebot's user agent on one cached thread page, 32 connections,
  through `crawlergate serve` and through nginx configured to cache crawler requests the same way
  (scripts/nginx-proxy-cache.conf), at 1 and 2 workers each.
- Crawler hits at the static-file limit: the forum's front page, through nginx with the include
  `crawlergate nginx-config` writes (answered from the gate's published tree, its JSON log of
  direct hits on), beside nginx `gzip_static` sending the very same file, and `crawlergate serve`; and
  through nginx with an include made `--agents-from` a site log in which Googlebot asked for pages (its
  user agent then found by nginx's map hash, not the patterns).
- Human pass-through: one request at a time with a person's page-load headers (no queueing, so the
  difference is the proxy's own cost), straight to the forum, whose pages cost 20 ms of CPU, through
  `crawlergate serve` and through a plain nginx proxy_pass, in turn, request by request; with
  `--against DIR`, through the `serve` of another checkout too (a change measured side by side).

- Human pass-through on a Django site (scripts/django_bench_site.py, a 2 ms page with CSRF) under
  gunicorn, with one connection: straight to gunicorn, through `crawlergate serve` and through a
  plain nginx proxy_pass, both with gunicorn's sync workers (which close every connection, so
  each proxied request reconnects) and with its gthread workers (keep-alive to the origin).

Cases run alternately, `--rounds` times; medians are reported. Needs wrk and nginx (Debian packages).

    python scripts/bench_proxy.py [--part forum|django|all] [--seconds 10] [--rounds 3] [--against DIR]
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from benchlib import BROWSER_NAVIGATION, FIREFOX, GOOGLEBOT, PERSON, free_port, run_wrk, wait_for

HERE = Path(__file__).resolve().parent
PAGE = "/showthread.php?t=7"


def start_forum(folder: Path, port: int, work_ms: float) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "crawlergate", "demo", "forum", "--port", str(port)]
    command += ["--work-ms", str(work_ms), "--db", str(folder / "forum.sqlite3")]
    return subprocess.Popen(command, stderr=subprocess.DEVNULL)


def start_gate(
    folder: Path, port: int, origin: int, workers: int, checkout: Path | None = None
) -> subprocess.Popen[bytes]:
    """``serve`` in front of ``origin``; with ``checkout``, run from that checkout's code (``--against``)."""
    command = [sys.executable, "-m", "crawlergate", "serve", "--origin", f"http://127.0.0.1:{origin}"]
    cache = folder / (f"l2-{workers}" if checkout is None else "l2-against")
    command += ["--port", str(port), "--workers", str(workers), "--cache-dir", str(cache)]
    environment = {key: value for key, value in os.environ.items() if not key.startswith("CRAWLERGATE_")}
    if checkout is not None:
        environment["PYTHONPATH"] = str(checkout)
    # A checkout's gate runs from its folder: `python -m` puts the working folder first on the path.
    return subprocess.Popen(command, cwd=checkout, stderr=subprocess.DEVNULL, env=environment)


def start_nginx(folder: Path, port: int, origin: int, workers: int, log: bool) -> subprocess.Popen[bytes]:
    prefix = folder / f"nginx-{workers}"
    (prefix / "cache").mkdir(parents=True)
    template = (HERE / "nginx-proxy-cache.conf").read_text()
    return _run_nginx(prefix, template, {"workers": workers, "origin": f"127.0.0.1:{origin}", "port": port}, log)


def _run_nginx(prefix: Path, template: str, values: dict[str, object], log: bool = False) -> subprocess.Popen[bytes]:
    """nginx with ``template``'s {placeholders} filled in, its files under ``prefix``; ``log``: nginx's default
    access log (combined format, a line written per request), as nginx is shipped, instead of none."""
    config = template.replace("access_log off;", f"access_log {prefix}/access.log combined;") if log else template
    for name, value in {**values, "prefix": prefix}.items():
        config = config.replace("{" + name + "}", str(value))
    (prefix / "nginx.conf").write_text(config)
    return subprocess.Popen(["nginx", "-p", str(prefix), "-c", str(prefix / "nginx.conf")], stderr=subprocess.DEVNULL)


NGINX_WITH_INCLUDE = """
worker_processes 1;
pcre_jit on;
daemon off;
user root;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events { worker_connections 1024; }
http {
    include {prefix}/include/crawlergate-hash.conf;
    access_log off;
    include {prefix}/include/crawlergate-http.conf;
    server {
        listen 127.0.0.1:{port};
        include {prefix}/include/crawlergate-server.conf;
    }
}
"""

NGINX_GZIP_STATIC = """
worker_processes 1;
daemon off;
user root;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    server {
        listen 127.0.0.1:{port};
        root {prefix}/static;
        gzip_static on;
        default_type "text/html; charset=utf-8";
    }
}
"""


def start_direct_front(
    folder: Path, port: int, gate: int, forum: int, learned: bool = False
) -> tuple[list[subprocess.Popen[bytes]], Path]:
    """A gate that publishes its pages and nginx with the generated include in front of it; the gate's L2. ``learned``:
    the include is made with ``--agents-from`` a site's log in which Googlebot asked for pages (found by hash)."""
    name = "direct-learned" if learned else "direct"
    prefix = folder / f"nginx-{name}"
    prefix.mkdir()
    cache = folder / f"l2-{name}"
    config = prefix / "gate.toml"
    config.write_text(f'[front]\npublish = true\ndirect_log = "{prefix / "direct.log"}"\n')
    origin = f"http://127.0.0.1:{forum}"
    command = [sys.executable, "-m", "crawlergate", "serve", "--origin", origin, "--port", str(gate)]
    command += ["--cache-dir", str(cache), "--config", str(config)]
    environment = {key: value for key, value in os.environ.items() if not key.startswith("CRAWLERGATE_")}
    gate_process = subprocess.Popen(command, stderr=subprocess.DEVNULL, env=environment)
    include = [sys.executable, "-m", "crawlergate", "nginx-config", "--out", str(prefix / "include")]
    include += ["--origin", origin, "--cache-dir", str(cache), "--gate", f"127.0.0.1:{gate}"]
    include += ["--direct-log", str(prefix / "direct.log")]
    if learned:
        log = prefix / "site-access.log"
        line = '66.249.66.1 - - [27/Nov/2026:10:00:00 +0000] "GET /t/{} HTTP/1.1" 200 5120 "-" "{}"\n'
        log.write_text("".join(line.format(number, GOOGLEBOT) for number in range(100)))
        include += ["--agents-from", str(log)]
    subprocess.run(include, check=True, capture_output=True, env=environment)
    return [gate_process, _run_nginx(prefix, NGINX_WITH_INCLUDE, {"port": port})], cache


def start_gzip_static(folder: Path, port: int, published: Path, log: bool) -> subprocess.Popen[bytes]:
    """nginx gzip_static sending the published front page as /front.html."""
    prefix = folder / "nginx-static"
    (prefix / "static").mkdir(parents=True)
    shutil.copyfile(published, prefix / "static" / "front.html.gz")
    return _run_nginx(prefix, NGINX_GZIP_STATIC, {"port": port}, log)


NGINX_PLAIN_PROXY = """
worker_processes 1;
daemon off;
user root;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    upstream origin { server {origin}; keepalive 16; }
    server {
        listen 127.0.0.1:{port};
        location / {
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
        }
    }
}
"""


def start_gunicorn(port: int, worker_class: str, page_ms: float) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "gunicorn", "--chdir", str(HERE), "--bind", f"127.0.0.1:{port}", "--workers", "1"]
    if worker_class == "gthread":
        command += ["--worker-class", "gthread", "--threads", "4", "--keep-alive", "30"]
    environment = {**os.environ, "BENCH_PAGE_MS": str(page_ms)}
    return subprocess.Popen([*command, "django_bench_site:application"], stderr=subprocess.DEVNULL, env=environment)


def start_plain_nginx(folder: Path, port: int, origin: int, log: bool = False) -> subprocess.Popen[bytes]:
    prefix = folder / f"nginx-plain-{port}"
    prefix.mkdir(parents=True)
    return _run_nginx(prefix, NGINX_PLAIN_PROXY, {"origin": f"127.0.0.1:{origin}", "port": port}, log)


def bench_django(args: argparse.Namespace) -> None:
    processes: list[subprocess.Popen[bytes]] = []
    results: dict[str, list[dict[str, float]]] = {}
    page = "/item/7/"
    try:
        with tempfile.TemporaryDirectory() as temp:
            folder = Path(temp)
            cases: dict[str, str] = {}
            for worker_class in ("sync", "gthread"):
                origin, gate, nginx = free_port(), free_port(), free_port()
                processes.append(start_gunicorn(origin, worker_class, args.page_ms))
                wait_for(origin, timeout_s=60)
                processes.append(start_gate(folder, gate, origin, 1))
                processes.append(start_plain_nginx(folder, nginx, origin))
                wait_for(gate)
                wait_for(nginx)
                cases[f"{worker_class}: straight to gunicorn"] = f"http://127.0.0.1:{origin}{page}"
                cases[f"{worker_class}: through crawlergate"] = f"http://127.0.0.1:{gate}{page}"
                cases[f"{worker_class}: through nginx"] = f"http://127.0.0.1:{nginx}{page}"
            for round_number in range(args.rounds):
                for name, url in cases.items():
                    figures = run_wrk(url, FIREFOX, args.seconds, 1, headers=BROWSER_NAVIGATION)
                    results.setdefault(name, []).append(figures)
                print(f"round {round_number + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        _stop(processes)
    median = _medians(results)
    print(f"\nHuman pass-through, Django {args.page_ms:g} ms page under gunicorn, wrk 1 connection, "
          f"{args.seconds} s x {args.rounds} rounds, medians")  # fmt: skip
    _print_table(median)
    for worker_class, keep_alive in (("sync", "no keep-alive"), ("gthread", "keep-alive")):
        direct = median[f"{worker_class}: straight to gunicorn"]["p50_ms"]
        ours = median[f"{worker_class}: through crawlergate"]["p50_ms"] - direct
        nginx = median[f"{worker_class}: through nginx"]["p50_ms"] - direct
        print(f"origin {worker_class} ({keep_alive}): crawlergate adds {ours:+.2f} ms p50, nginx {nginx:+.2f} ms")


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        process.wait(timeout=30)


def _medians(results: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    return {name: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for name, runs in results.items()}


def _print_table(median: dict[str, dict[str, float]]) -> None:
    print(f"{'case':<36}{'requests/s':>12}{'p50 ms':>10}{'p99 ms':>10}{'non-2xx':>9}")
    for name, row in median.items():
        print(f"{name:<36}{row['rps']:>12,.0f}{row['p50_ms']:>10.2f}{row['p99_ms']:>10.2f}{row['errors']:>9.0f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("forum", "django", "all"), default="all")
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--work-ms", type=float, default=20.0, help="CPU time of a forum page")
    parser.add_argument("--page-ms", type=float, default=2.0, help="CPU time of the Django page")
    parser.add_argument("--human-requests", type=int, default=300, help="requests per case, pass-through")
    parser.add_argument(
        "--against",
        metavar="DIR",
        help="a checkout of another commit (git worktree add /tmp/before HEAD~3): its `serve` joins the people's "
        "pass-through, request by request beside this one's",
    )
    parser.add_argument(
        "--nginx-logs",
        action="store_true",
        help="the nginx baselines (proxy_cache, gzip_static, proxy_pass) log each request as nginx is shipped "
        "(combined format), as crawlergate does; default: they log nothing",
    )
    args = parser.parse_args()
    for tool in ("wrk", "nginx"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is needed: apt-get install -y {tool}")
    if args.part in ("forum", "all"):
        bench_forum(args)
    if args.part in ("django", "all"):
        bench_django(args)
    return 0


def bench_forum(args: argparse.Namespace) -> None:

    processes: list[subprocess.Popen[bytes]] = []
    results: dict[str, list[dict[str, float]]] = {}
    try:
        with tempfile.TemporaryDirectory() as temp:
            folder = Path(temp)
            forum = free_port()
            processes.append(start_forum(folder, forum, args.work_ms))
            wait_for(forum, timeout_s=60)
            crawler_cases: dict[str, str] = {}
            gate_ports: dict[int, int] = {}
            for workers in (1, 2):
                gate, nginx = free_port(), free_port()
                gate_ports[workers] = gate
                processes.append(start_gate(folder, gate, forum, workers))
                processes.append(start_nginx(folder, nginx, forum, workers, args.nginx_logs))
                crawler_cases[f"crawlergate, {workers} worker(s)"] = f"http://127.0.0.1:{gate}{PAGE}"
                crawler_cases[f"nginx proxy_cache, {workers} worker(s)"] = f"http://127.0.0.1:{nginx}{PAGE}"
                wait_for(gate)
                wait_for(nginx)
            for url in crawler_cases.values():
                warm = httpx.get(url, headers={"user-agent": GOOGLEBOT, "accept-encoding": "gzip"})
                warm.raise_for_status()
            direct_gate, direct_nginx, static_nginx = free_port(), free_port(), free_port()
            started, cache = start_direct_front(folder, direct_nginx, direct_gate, forum)
            learned_gate, learned_nginx = free_port(), free_port()
            processes += started + start_direct_front(folder, learned_nginx, learned_gate, forum, learned=True)[0]
            for port in (direct_gate, direct_nginx, learned_gate, learned_nginx):
                wait_for(port)
            front_page = f"http://127.0.0.1:{direct_nginx}/"
            learned_front_page = f"http://127.0.0.1:{learned_nginx}/"
            _wait_published(front_page)
            _wait_published(learned_front_page)
            published = cache / "published" / "127.0.0.1" / ".index.gz"
            processes.append(start_gzip_static(folder, static_nginx, published, args.nginx_logs))
            wait_for(static_nginx)
            crawler_cases["crawlergate, 1 worker(s), front page"] = f"http://127.0.0.1:{gate_ports[1]}/"
            crawler_cases["nginx + include, direct, front page"] = front_page
            crawler_cases["nginx + include --agents-from, direct"] = learned_front_page
            crawler_cases["nginx gzip_static, same file"] = f"http://127.0.0.1:{static_nginx}/front.html"
            for url in crawler_cases.values():
                httpx.get(url, headers={"user-agent": GOOGLEBOT, "accept-encoding": "gzip"}).raise_for_status()
            plain_nginx = free_port()
            processes.append(start_plain_nginx(folder, plain_nginx, forum, args.nginx_logs))
            wait_for(plain_nginx)
            human_ports = {
                "straight to the forum": forum,
                "through crawlergate": gate_ports[1],
                "through nginx proxy_pass": plain_nginx,
            }
            if args.against:
                against = free_port()
                processes.append(start_gate(folder, against, forum, 1, Path(args.against).resolve()))
                wait_for(against)
                human_ports["through crawlergate of --against"] = against
            for round_number in range(args.rounds):
                for name, url in crawler_cases.items():
                    results.setdefault(name, []).append(run_wrk(url, GOOGLEBOT, args.seconds, args.connections))
                print(f"round {round_number + 1}/{args.rounds} done", file=sys.stderr)
            human = paired_latencies(human_ports, PAGE, args.human_requests)
    finally:
        _stop(processes)

    median = _medians(results)
    print(f"\nwrk, {args.seconds} s x {args.rounds} rounds, medians; crawler cases {args.connections} connections")
    _print_table(median)
    print()
    for workers in (1, 2):
        ours, theirs = median[f"crawlergate, {workers} worker(s)"], median[f"nginx proxy_cache, {workers} worker(s)"]
        print(f"crawler hits, {workers} worker(s): crawlergate at {ours['rps'] / theirs['rps']:.0%} of nginx")
    direct, static = median["nginx + include, direct, front page"], median["nginx gzip_static, same file"]
    print(f"direct crawler hits through nginx with the include: {direct['rps'] / static['rps']:.0%} of gzip_static")
    learned = median["nginx + include --agents-from, direct"]
    print(
        f"the same with Googlebot's user agent learned from a log (--agents-from): "
        f"{learned['rps'] / static['rps']:.0%} of gzip_static"
    )
    print(
        f"\nHuman pass-through, {args.work_ms:g} ms forum page, {args.human_requests} requests each, one at a "
        "time, interleaved (direct, crawlergate, nginx, direct, ...) on keep-alive connections"
    )
    _print_paired(human, "straight to the forum")


def _wait_published(url: str) -> None:
    """Ask as Googlebot until nginx answers from the published tree (the first answer fills the gate)."""
    deadline = time.monotonic() + 30
    while httpx.get(url, headers={"user-agent": GOOGLEBOT}).headers.get("x-crawlergate") != "l2-hit; direct":
        if time.monotonic() > deadline:
            raise SystemExit(f"{url} was never answered from the published tree")
        time.sleep(0.1)


def paired_latencies(ports: dict[str, int], path: str, requests: int) -> dict[str, list[float]]:
    """Milliseconds per request to each port, asked in turn: one request to each, ``requests`` times.

    The base page's own time drifts by a millisecond or more between runs of a few seconds (other
    processes, CPU frequency); taken in turn, neighbouring requests see the same conditions, and the
    median of per-pair differences is the proxy's own cost.
    """
    connections = {name: http.client.HTTPConnection("127.0.0.1", port, timeout=30) for name, port in ports.items()}
    # A person's full page load: a bare browser user agent is a suspect now, answered from the cache.
    headers = {**PERSON, "Accept-Encoding": "gzip"}
    times: dict[str, list[float]] = {name: [] for name in ports}
    for _ in range(requests):
        for name, connection in connections.items():
            started = time.perf_counter()
            connection.request("GET", path, headers=headers)
            answer = connection.getresponse()
            answer.read()
            times[name].append((time.perf_counter() - started) * 1000)
            if answer.status != 200:
                raise SystemExit(f"{name}: status {answer.status}")
            if answer.getheader("x-crawlergate", "pass") != "pass":  # a cache hit would flatter the gate
                raise SystemExit(f"{name}: answered {answer.getheader('x-crawlergate')}, not passed to the site")
    for connection in connections.values():
        connection.close()
    return times


def _print_paired(times: dict[str, list[float]], base: str) -> None:
    print(f"{'case':<36}{'p50 ms':>10}{'p90 ms':>10}{'added, median of pairs':>26}")
    for name, values in times.items():
        deciles = statistics.quantiles(values, n=10)
        added = statistics.median(ours - theirs for ours, theirs in zip(values, times[base], strict=True))
        shown = "" if name == base else f"{added:+.2f} ms"
        print(f"{name:<36}{statistics.median(values):>10.2f}{deciles[8]:>10.2f}{shown:>26}")


if __name__ == "__main__":
    raise SystemExit(main())
