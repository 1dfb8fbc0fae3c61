"""Parse speed per log format: `simulate`'s first run (the fast path, one process per core) and record reading.

Writes a synthetic log of each format (nginx combined with X-Forwarded-For and request time, Apache
vhost_combined, Caddy JSON, nginx JSON, IIS W3C) with the same requests, then times
`simulate.parse_trace` on it (what a first `crawlergate simulate` run does) and `LogReader`
iteration (what `analyze`, `classify --log` and `replay` do). Medians of `--repeats`.

    python scripts/bench_logparse.py [--lines 1000000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from crawlergate.classify import Classifier
from crawlergate.config import Settings
from crawlergate.keys import KeyMaker
from crawlergate.tools.logparse import LogReader
from crawlergate.tools.simulate import parse_trace

AGENTS = [
    "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36",
    "Mozilla/5.0 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_1 like Mac OS X) AppleWebKit/605.1.15 Version/17.1 Mobile Safari/604.1",
    "Mozilla/5.0 (X11; Linux x86_64; rv:121.0) Gecko/20100101 Firefox/121.0",
]
START = 1_705_312_800  # 2024-01-15 10:00:00 UTC
Request = tuple[float, str, str, int, int, str, float]


def requests(count: int) -> list[Request]:
    rng = random.Random(2012)
    rows = []
    for index in range(count):
        when = START + index * 0.05
        target = f"/forum/showthread.php?t={int(rng.paretovariate(1.2)) % 50_000}&page={rng.randint(1, 3)}"
        rows.append((when, rng.choice(("GET", "GET", "GET", "POST")), target, 200, rng.randint(2_000, 60_000),
                     rng.choice(AGENTS), rng.random() / 5))  # fmt: skip
    return rows


def nginx_xff(row: Request) -> str:
    when, method, target, status, size, agent, seconds = row
    stamp = datetime.fromtimestamp(when, UTC).strftime("%d/%b/%Y:%H:%M:%S +0000")
    return f'203.0.113.9 - - [{stamp}] "{method} {target} HTTP/1.1" {status} {size} "-" "{agent}" "-" {seconds:.3f}\n'


def apache_vhost(row: Request) -> str:
    when, method, target, status, size, agent, _ = row
    stamp = datetime.fromtimestamp(when, UTC).strftime("%d/%b/%Y:%H:%M:%S +0000")
    return f'forum.example:443 203.0.113.9 - - [{stamp}] "{method} {target} HTTP/1.1" {status} {size} "-" "{agent}"\n'


def caddy(row: Request) -> str:
    when, method, target, status, size, agent, seconds = row
    headers = {"User-Agent": [agent], "Accept": ["*/*"]}
    request = {"remote_ip": "203.0.113.9", "client_ip": "203.0.113.9", "proto": "HTTP/2.0", "method": method,
               "host": "forum.example", "uri": target, "headers": headers}  # fmt: skip
    entry = {"level": "info", "ts": when, "logger": "http.log.access", "msg": "handled request", "request": request,
             "bytes_read": 0, "user_id": "", "duration": seconds, "size": size, "status": status}  # fmt: skip
    return json.dumps(entry, separators=(",", ":")) + "\n"


def nginx_json(row: Request) -> str:
    when, method, target, status, size, agent, seconds = row
    entry = {"time_iso8601": datetime.fromtimestamp(when, UTC).isoformat(timespec="seconds"),
             "remote_addr": "203.0.113.9", "request": f"{method} {target} HTTP/1.1", "status": str(status),
             "body_bytes_sent": str(size), "request_time": f"{seconds:.3f}", "http_referer": "",
             "http_user_agent": agent}  # fmt: skip
    return json.dumps(entry, separators=(",", ":")) + "\n"


def iis(row: Request) -> str:
    when, method, target, status, size, agent, seconds = row
    moment = datetime.fromtimestamp(when, UTC)
    path, _, query = target.partition("?")
    return (f"{moment:%Y-%m-%d %H:%M:%S} 10.0.0.5 {method} {path} {query or '-'} 443 - 203.0.113.9 "
            f"{agent.replace(' ', '+')} - {status} 0 0 {size} {int(seconds * 1000)}\n")  # fmt: skip


IIS_HEADER = (
    "#Software: Microsoft Internet Information Services 10.0\n#Version: 1.0\n"
    "#Fields: date time s-ip cs-method cs-uri-stem cs-uri-query s-port cs-username c-ip cs(User-Agent) "
    "cs(Referer) sc-status sc-substatus sc-win32-status sc-bytes time-taken\n"
)
FORMATS: dict[str, tuple[Callable[[Request], str], str]] = {
    "nginx combined + X-Forwarded-For + $request_time": (nginx_xff, ""),
    "Apache vhost_combined": (apache_vhost, ""),
    "Caddy JSON": (caddy, ""),
    "nginx JSON": (nginx_json, ""),
    "IIS W3C": (iis, IIS_HEADER),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    settings = Settings()
    classifier = Classifier.from_settings(settings.classify)
    keys = KeyMaker.from_settings(settings)
    rows = requests(args.lines)
    print(f"{'format':<52}{'read as':<58}{'simulate lines/s':>18}{'records/s':>12}")
    with tempfile.TemporaryDirectory() as folder:
        for name, (write, header) in FORMATS.items():
            path = Path(folder) / "access.log"
            with path.open("w") as handle:
                handle.write(header)
                handle.writelines(map(write, rows))
            description = LogReader(path).format.description
            fast, slow = [], []
            for _ in range(args.repeats):
                started = time.perf_counter()
                trace = parse_trace(path, classifier, keys)
                fast.append(trace.lines / (time.perf_counter() - started))
                started = time.perf_counter()
                records = sum(1 for _ in LogReader(path))
                slow.append(records / (time.perf_counter() - started))
            print(f"{name:<52}{description[:56]:<58}{statistics.median(fast):>18,.0f}{statistics.median(slow):>12,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
