"""Helpers shared by the benchmarks: free ports, waiting for servers, running wrk and reading its report."""

from __future__ import annotations

import re
import socket
import subprocess
import time

from crawlergate.demo.run import free_port

__all__ = ["BROWSER_NAVIGATION", "CHROME", "FIREFOX", "GOOGLEBOT", "PERSON", "free_port", "run_wrk", "wait_for"]

GOOGLEBOT = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"
FIREFOX = "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0"
CHROME = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36"
# What a browser sends on a page load besides its user agent: without it, a person's user agent makes a suspect.
BROWSER_NAVIGATION = (
    "Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
    "Accept-Language: en-US,en;q=0.5",
    "Sec-Fetch-Mode: navigate",
    "Sec-Fetch-Dest: document",
)
# A person's page load as a header mapping (for httpx and http.client): the user agent and the navigation headers.
PERSON = {"User-Agent": FIREFOX, **dict(line.split(": ", 1) for line in BROWSER_NAVIGATION)}


def wait_for(port: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"server on port {port} did not start")


def run_wrk(
    url: str,
    user_agent: str,
    seconds: int,
    connections: int,
    threads: int = 1,
    headers: tuple[str, ...] = (),
    script: str = "",
) -> dict[str, float]:
    """Requests per second, p50/p99/longest latency in ms and non-2xx count of one wrk run; ``headers`` are more
    lines, ``script`` a Lua file that makes the requests."""
    more = [argument for header in headers for argument in ("-H", header)]
    more += ["-s", script] if script else []
    command = [
        "wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency",
        "-H", f"User-Agent: {user_agent}", "-H", "Accept-Encoding: gzip", *more, url,
    ]  # fmt: skip
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
    latency = dict(re.findall(r"^\s+(50|99)%\s+([\d.]+\w+)", output, re.MULTILINE))
    longest = re.search(r"Latency\s+\S+\s+\S+\s+([\d.]+\w+)", output)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    return {
        "rps": rps,
        "p50_ms": _to_ms(latency["50"]),
        "p99_ms": _to_ms(latency["99"]),
        "max_ms": _to_ms(longest.group(1)) if longest else 0.0,
        "errors": float(errors.group(1)) if errors else 0.0,
    }


def _to_ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(\w+)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]
