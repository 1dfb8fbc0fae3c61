"""``crawlergate demo``: the paper's experiment on this machine, end to end, in about two minutes.

Starts the demo forum and ``crawlergate serve`` in front of it on loopback (embedded L1 unless
memcached is configured; L2 in the run's folder), warms L2 with every thread's first page,
generates a synthetic trace, replays it against the forum directly and through the gate, and
prints the comparison (throughput, crawler and human TTFB, hit ratios) with the path of an HTML
report. ``--serve`` leaves both running for a person to browse.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from crawlergate.classify import Classifier
from crawlergate.config import Settings
from crawlergate.demo.forum import THREADS_PER_PAGE
from crawlergate.demo.seed import seed_database
from crawlergate.demo.trace import TraceSpec, forum_target, structure_of, thread_target, write_trace
from crawlergate.errors import CrawlerGateError
from crawlergate.front.nginx import nginx_include
from crawlergate.progress import Progress
from crawlergate.tools.logparse import LogReader
from crawlergate.tools.replay import (
    ReplayRequest,
    ReplayResult,
    comparison,
    format_summary,
    rate_change,
    replay,
    requests_from_log,
    run_replay,
    time_change,
)
from crawlergate.tools.replayreport import (
    comparison_headline,
    outcome_charts,
    run_names,
    runs_table,
    speed_words,
    throughput_charts,
    ttfb_sections,
    ttfb_table,
)
from crawlergate.tools.report import page, paragraph, table

WARMING_AGENT = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"
# The open-loop latency phase offers the forum this share of the throughput it reached on its own.
LATENCY_LOAD = 0.75

# The demo forum's site profile (rules/sites/demo-forum.toml): its write rules.
DEMO_SITE_PROFILE = "demo-forum"
# Koehl & Wang 2012, section 6: through the gate, crawlers' mean TTFB 118x shorter, humans' 31 % shorter,
# 1.84x the throughput. As speedups (before / after), the form replay.comparison gives.
PAPER_SPEEDUPS = {"crawler": 118.0, "human": 1 / (1 - 0.31), "throughput": 1.84}
# How the runs are named in the printout and the report (format_summary shows 28 characters of a name).
ALONE, GATED = "forum alone", "via crawlergate"


@dataclass(frozen=True, slots=True)
class DemoSpec:
    """The size of the run; the defaults finish in about two minutes on two cores."""

    threads: int = 1000
    requests: int = 1600
    work_ms: float = 20.0
    concurrency: int = 8
    crawler_share: float = 0.68
    seed: int = 2012
    # "nginx": nginx with the include of `crawlergate nginx-config` in front of the gate, the forum's pages at
    # plain URLs, so announced crawlers are answered from the published tree (direct hits).
    front: str = ""


@dataclass(frozen=True, slots=True)
class Experiment:
    """What one run measured: closed-loop and open-loop replays (forum, then gate) and the gate's counters."""

    closed: list[ReplayResult]
    opened: list[ReplayResult]
    stats: dict[str, dict[str, int]]
    folder: Path
    forum: str
    gate: str


def run_demo(spec: DemoSpec, settings: Settings, folder: Path | None, *, serve: bool) -> int:
    """Run the experiment, print the comparison; returns the exit status."""
    # SIGTERM ends the demo as Ctrl-C does: the forum and the gate it started stop with it.
    signal.signal(signal.SIGTERM, _interrupt)
    with running_experiment(spec, settings, folder) as experiment:
        report = experiment.folder / "report.html"
        report.write_text(demo_report(experiment), encoding="utf-8")
        print(_comparison(experiment.closed, experiment.opened, experiment.stats))
        print(f"\nreport: {report}")
        if serve:
            say(
                f"serving until Ctrl-C: the forum on {experiment.forum}, the gate on {experiment.gate}, "
                f"its dashboard on {experiment.gate}/_crawlergate/"
            )
            _wait_for_signal()
    return 0


@contextlib.contextmanager
def running_experiment(spec: DemoSpec, settings: Settings, folder: Path | None) -> Iterator[Experiment]:
    """Start the forum and the gate, warm, replay; the servers run until the block ends."""
    folder = folder or Path(tempfile.mkdtemp(prefix="crawlergate-demo-"))
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / "forum.sqlite3"
    say(f"demo folder: {folder}")
    say(f"seeding a forum of {spec.threads:,} threads ({spec.work_ms:g} ms of CPU a page)")
    seed_database(db, threads=spec.threads, seed=spec.seed)
    forum_port, gate_port = free_port(), free_port()
    processes: list[subprocess.Popen[bytes]] = []
    try:
        processes.append(_start([
            "demo", "forum", "--port", str(forum_port), "--threads", str(spec.threads), "--seed", str(spec.seed),
            "--work-ms", str(spec.work_ms), "--db", str(db),
        ], folder / "forum.err"))  # fmt: skip
        _wait_for(forum_port, processes[-1], folder / "forum.err")
        gate_command = ["serve", "--origin", f"http://127.0.0.1:{forum_port}", "--port", str(gate_port)]
        gate_command += ["--cache-dir", str(folder / "l2")]
        # The gate runs on the demo's own settings (its --config and CRAWLERGATE_* included), whole, with
        # the forum's write rules: a reply marks its thread changed.
        gate_settings = _with_site(settings, DEMO_SITE_PROFILE)
        plain = spec.front == "nginx"
        if plain:
            gate_settings = _with_front(gate_settings, folder, forum_port)
        processes.append(_start(gate_command, folder / "gate.err", gate_settings.to_environ()))
        _wait_for(gate_port, processes[-1], folder / "gate.err")
        forum, gate = f"http://127.0.0.1:{forum_port}", f"http://127.0.0.1:{gate_port}"
        say(f"forum on {forum}, crawlergate on {gate}")
        admin = gate
        if plain:
            front_port = free_port()
            processes.append(start_nginx_front(folder, front_port, gate_port, gate_settings))
            _wait_for(front_port, processes[-1], folder / "nginx" / "error.log")
            gate = f"http://127.0.0.1:{front_port}"
            say(f"nginx with crawlergate's include on {gate}: announced crawlers from the published tree")

        warm = _warming_requests(db, plain=plain)
        say(f"warming L2 with all {len(warm):,} pages of the forum")
        with Progress("warming L2", total=len(warm), unit=" pages") as progress:
            run_replay(replay(warm, gate, concurrency=4, on_progress=lambda done, _: progress.update(done)))

        trace = folder / "trace.log"
        write_trace(
            trace,
            TraceSpec(
                requests=spec.requests,
                crawler_share=spec.crawler_share,
                page_cost_us=int(spec.work_ms * 1000),
                seed=spec.seed,
                plain_urls=plain,
            ),
            structure_of(db),
        )
        requests = requests_from_log(LogReader(trace), Classifier.from_settings(settings.classify))
        stats_url = f"{admin}{settings.admin.prefix}/stats"
        before = httpx.get(stats_url, timeout=10).json()
        say(f"1. throughput: {len(requests):,} requests of {trace.name} with {spec.concurrency} clients as fast as "
            "they are answered, straight to the forum, then through crawlergate")  # fmt: skip
        closed = [
            _replay(requests, url, label=f"{name}, full speed", concurrency=spec.concurrency)
            for name, url in ((ALONE, forum), (GATED, gate))
        ]
        # Latency is compared at the same offered load, in open loop: the log's pace, sped up so that it
        # asks the bare forum for 75 % of what it just managed.
        sample = requests[: max(1, len(requests) // 2)]
        rate = LATENCY_LOAD * closed[0].summary()["throughput_rps"]
        speed = sample[-1].offset_s / (len(sample) / rate) if sample[-1].offset_s > 0 and rate > 0 else 1.0
        say(f"2. latency: {len(sample):,} requests at the log's pace x{speed:,.0f} (~{rate:,.0f} requests/s), "
            "straight to the forum, then through crawlergate")  # fmt: skip
        opened = [
            _replay(sample, url, label=f"{name}, same load", speed=speed)
            for name, url in ((ALONE, forum), (GATED, gate))
        ]
        if plain:
            time.sleep(1.0)  # nginx flushes its direct-hit log every 250 ms, the gate reads it four times a second
        stats = _difference(httpx.get(stats_url, timeout=10).json(), before)
        yield Experiment(closed, opened, stats, folder, forum, gate)
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def say(text: str) -> None:
    print(f"crawlergate demo: {text}", file=sys.stderr, flush=True)


def _difference(after: dict[str, Any], before: dict[str, Any]) -> dict[str, dict[str, int]]:
    """The gate's counters for the replay alone (the warming is not counted)."""
    counters = ("l1_hits", "l2_hits", "direct_hits", "misses", "stale", "prefetches")
    return {kind: {name: after[kind][name] - before[kind][name] for name in counters} for kind in ("crawler", "human")}


def _comparison(closed: list[ReplayResult], opened: list[ReplayResult], stats: dict[str, dict[str, int]]) -> str:
    crawler = stats["crawler"]
    hits = crawler["l1_hits"] + crawler["l2_hits"] + crawler.get("direct_hits", 0)
    lookups = hits + crawler["misses"] + crawler["stale"]
    direct, gated = (result.summary() for result in closed)
    slow, fast = (result.summary() for result in opened)

    def speedup(kind: str) -> str:
        before, after = slow[kind]["ttfb_ms"]["mean"], fast[kind]["ttfb_ms"]["mean"]
        return f"{before:,.2f} → {after:,.2f} ms: the gate answered {kind}s {time_change(before, after)}"

    human_before = slow["human"]["ttfb_ms"]["mean"]
    human_change = 1 - fast["human"]["ttfb_ms"]["mean"] / human_before if human_before else 0.0
    return "\n".join(
        [
            "",
            "1. as fast as possible (closed loop)",
            format_summary(closed),
            "",
            "2. at the same offered load (open loop, latency from the schedule)",
            format_summary(opened, same_load=True),
            "",
            "result, forum alone → behind crawlergate:",
            f"  throughput        {direct['throughput_rps']:,.1f} → {gated['throughput_rps']:,.1f} requests/s: "
            f"{rate_change(direct['throughput_rps'], gated['throughput_rps'])} behind the gate; paper 1.84× more",
            f"  crawler mean TTFB {speedup('crawler')}; paper 118× faster",
            f"  human mean TTFB   {speedup('human')}, {abs(human_change):.0%} "
            f"{'lower' if human_change >= 0 else 'higher'}; paper 31 % lower",
            f"  crawler hit ratio {hits / lookups if lookups else 0:.1%} ({crawler['l1_hits']:,} L1, "
            f"{crawler['l2_hits']:,} L2, {_direct(crawler)}{crawler['misses']:,} misses); "
            f"{stats['human']['prefetches']:,} human-induced prefetches",
        ]
    )


def demo_report(experiment: Experiment) -> str:
    """The demo's HTML report: the result in words beside the paper's, then the runs' tables and charts."""
    closed, opened = experiment.closed, experiment.opened
    latency, throughput = comparison(opened), comparison(closed)
    rows = []
    for kind in ("crawler", "human"):
        before, after = (latency[run][kind]["ttfb_ms"]["mean"] for run in ("first", "second"))
        rows.append([
            f"{kind} mean TTFB, same load", f"{before:,.2f} ms", f"{after:,.2f} ms",
            speed_words(latency["ratios"][f"{kind}_mean_ttfb_speedup"]), speed_words(PAPER_SPEEDUPS[kind]),
        ])  # fmt: skip
    rate = throughput["ratios"]["throughput"]
    rows.append([
        "throughput, full speed", f"{throughput['first']['throughput_rps']:,.1f} requests/s",
        f"{throughput['second']['throughput_rps']:,.1f} requests/s", f"{rate:,.2f}×" if rate else "not measured",
        f"{PAPER_SPEEDUPS['throughput']:.2f}×",
    ])  # fmt: skip
    crawler = experiment.stats["crawler"]
    hits = crawler["l1_hits"] + crawler["l2_hits"] + crawler.get("direct_hits", 0)
    lookups = hits + crawler["misses"] + crawler["stale"]
    header = ["measure", ALONE, GATED, "this run", "the paper"]
    versus = table(header, rows, text_columns=(0,)) + paragraph(
        f"The gate answered {hits / lookups if lookups else 0:.1%} of crawler requests from its cache "
        f"({crawler['l1_hits']:,} from L1, {crawler['l2_hits']:,} from L2, {crawler['misses']:,} misses). "
        "The paper: Koehl & Wang, 2012, on a production forum."
    )
    runs = [*closed, *opened]
    names = run_names(runs)
    open_names, closed_names = run_names(opened), run_names(closed)
    sections = [
        ("This run and the paper", versus),
        ("Runs", runs_table(runs, names)),
        ("TTFB by class (ms)", ttfb_table(runs, names)),
        *ttfb_sections(opened, open_names, when=", at the same load"),
        ("Throughput, as fast as the clients go", throughput_charts(closed, closed_names)),
        ("Outcomes (the X-Crawlergate header)", outcome_charts(runs, names)),
    ]
    lead = (
        f"A synthetic forum trace replayed against the demo forum alone, then through crawlergate: TTFB (time to "
        f"first byte) at the same offered load, {opened[0].requests:,} requests at the log's pace; throughput with "
        f"{closed[0].requests:,} requests sent as fast as the clients are answered."
    )
    return page("crawlergate demo: the paper's experiment on this machine", comparison_headline(opened, closed),
                sections, lead=lead)  # fmt: skip


def _replay(
    requests: list[ReplayRequest], url: str, *, label: str, concurrency: int = 8, speed: float | None = None
) -> ReplayResult:
    with Progress(f"replay, {label}", total=len(requests), unit=" requests") as progress:
        result = run_replay(replay(requests, url, concurrency=concurrency, speed=speed,
                                    on_progress=lambda done, _: progress.update(done)))  # fmt: skip
    result.label = label
    return result


def _direct(crawler: Mapping[str, int]) -> str:
    direct = crawler.get("direct_hits", 0)
    return f"{direct:,} answered by nginx from the published tree, " if direct else ""


def _with_front(settings: Settings, folder: Path, forum_port: int) -> Settings:
    """The gate's settings with the published tree on and nginx's direct-hit log read."""
    front = dataclasses.replace(settings.front, publish=True, direct_log=str(folder / "nginx" / "direct.log"))
    server = dataclasses.replace(settings.server, origin=f"http://127.0.0.1:{forum_port}")
    return dataclasses.replace(settings, front=front, server=server, l2=dataclasses.replace(settings.l2,
                               cache_dir=str(folder / "l2")))  # fmt: skip


def start_nginx_front(folder: Path, port: int, gate_port: int, settings: Settings) -> subprocess.Popen[bytes]:
    """Debian's nginx with the include `crawlergate nginx-config` writes, in front of the gate, in the run's folder."""
    binary = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if binary is None:
        raise CrawlerGateError("demo --front nginx needs nginx (apt-get install nginx).")
    prefix = folder / "nginx"
    for name in ("include", "body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (prefix / name).mkdir(parents=True, exist_ok=True)
    classifier = Classifier.from_settings(settings.classify)
    include = nginx_include(settings, gate=f"127.0.0.1:{gate_port}", direct_log=prefix / "direct.log",
                            classifier=classifier)  # fmt: skip
    for name, text in include.files.items():
        (prefix / "include" / name).write_text(text)
    temp = "\n".join(f"    {kind}_temp_path {prefix / kind};" for kind in ("proxy", "fastcgi", "uwsgi", "scgi"))
    user = "user root;\n" if os.geteuid() == 0 else ""  # as root, workers would be nobody, shut out of the folder
    (prefix / "nginx.conf").write_text(
        f"{user}worker_processes 1;\ndaemon off;\npcre_jit on;\npid {prefix}/nginx.pid;\n"
        f"error_log {prefix}/error.log;\n"
        f"events {{ worker_connections 1024; }}\nhttp {{\n    access_log off;\n"
        f"    client_body_temp_path {prefix / 'body'};\n{temp}\n"
        f"    include {prefix}/include/crawlergate-http.conf;\n"
        f"    server {{\n        listen 127.0.0.1:{port};\n        include {prefix}/include/crawlergate-server.conf;\n"
        f"        location ^~ {settings.admin.prefix} {{ proxy_pass http://crawlergate_gate; }}\n    }}\n}}\n"
    )
    return subprocess.Popen([binary, "-c", str(prefix / "nginx.conf"), "-p", str(prefix)], stderr=subprocess.DEVNULL)


def _warming_requests(db: Path, *, plain: bool = False) -> list[ReplayRequest]:
    structure = structure_of(db)
    targets = ["/"] + [
        forum_target(forum, page, plain=plain)
        for forum in structure.forums
        for page in range(1, max(1, math.ceil(len(structure.threads_by_forum[forum]) / THREADS_PER_PAGE)) + 1)
    ]
    targets += [thread_target(thread, page, plain=plain) for thread, pages in structure.threads
                for page in range(1, pages + 1)]  # fmt: skip
    return [ReplayRequest("GET", target, WARMING_AGENT, "crawler", 0.0) for target in targets]


def _with_site(settings: Settings, profile: str) -> Settings:
    if profile in settings.cache.sites:
        return settings
    return dataclasses.replace(
        settings, cache=dataclasses.replace(settings.cache, sites=(*settings.cache.sites, profile))
    )


def _start(arguments: list[str], errors: Path, settings: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    environment = {key: value for key, value in os.environ.items() if key != "CRAWLERGATE_SERVER_PORT"}
    environment.update(settings or {})
    with errors.open("wb") as stream:
        return subprocess.Popen([sys.executable, "-m", "crawlergate", *arguments], stderr=stream, env=environment)


def _wait_for(port: int, process: subprocess.Popen[bytes], errors: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise CrawlerGateError(f"A demo server stopped at start: {errors.read_text().strip()[-500:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise CrawlerGateError(f"A demo server did not start on port {port} within 60 s; see {errors}.")


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_signal() -> None:
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            signal.pause()


def _interrupt(number: int, frame: object) -> None:
    raise KeyboardInterrupt
