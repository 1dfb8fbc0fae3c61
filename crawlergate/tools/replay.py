"""Log replay: send an access log's GET/HEAD requests to a server, with their user agents, and time them.

Two modes. Closed loop (``concurrency``): N clients send requests back to back, as fast as the
server answers, which measures throughput. Open loop (``speed``): each request is sent at its own
time in the log, scaled by ``speed``, whether or not earlier ones have finished, and its latency
is counted from that scheduled time, so a slow server cannot hide its queue behind a slow client
(coordinated omission, Tene's wrk2). Every request is classified exactly as the gate does, and
timed to its first bytes (the status line and headers: TTFB) and to its last. Errors and
timeouts are counted, never fatal.

    result = await replay(requests, "http://127.0.0.1:8080", concurrency=16)
    result.summary()["crawler"]["ttfb_ms"]["p50"]
"""

from __future__ import annotations

import asyncio
import math
import ssl
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from ssl import SSLContext
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

from crawlergate.classify import Classifier
from crawlergate.tools.httpclient import ConnectionPool, ReplayError
from crawlergate.tools.logparse import LogRecord

T = TypeVar("T")
# Characters a request target may carry as they are (RFC 3986 pchar, "/", "?", and "%" of escapes).
_TARGET_SAFE = "/?:@!$&'()*+,;=%~"
# Open-loop replay never has more requests than this in flight: a bound on this process's memory
# and sockets. A server slower than the schedule makes requests wait here, and their latency, counted
# from the schedule, shows it.
MAX_IN_FLIGHT = 512
# How late the client's own timer may wake before the lateness is blamed on the server (asyncio rounds
# sleeps to the millisecond; a busy loop adds a little).
TIMER_SLACK_S = 0.005


@dataclass(frozen=True, slots=True)
class ReplayRequest:
    """One request to replay: method, target, user agent, class, and when the log says it came."""

    method: str
    target: str
    user_agent: str
    kind: str
    offset_s: float


@dataclass(slots=True)
class Sample:
    kind: str
    outcome: str
    status: int
    ttfb_ms: float
    total_ms: float
    finished_s: float


@dataclass(slots=True)
class ReplayResult:
    """Samples of one replay against one target."""

    target: str
    duration_s: float = 0.0
    samples: list[Sample] = field(default_factory=list)
    # How reports name this run; the target URL unless told otherwise.
    label: str = ""
    errors: Counter[str] = field(default_factory=Counter)
    # The errors of each class, by kind.
    class_errors: dict[str, Counter[str]] = field(default_factory=lambda: {"crawler": Counter(), "human": Counter()})
    # Open loop: how late each request left against its schedule, in ms (the client's own accuracy).
    send_lateness_ms: list[float] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return len(self.samples) + sum(self.errors.values())

    def summary(self) -> dict[str, Any]:
        """The replay JSON of the contract (docs/design/index.md, "Contracts"), plus outcomes and totals."""
        classes: dict[str, Any] = {}
        for kind in ("crawler", "human"):
            chosen = [sample for sample in self.samples if sample.kind == kind]
            classes[kind] = {
                "count": len(chosen),
                "ttfb_ms": _percentiles([sample.ttfb_ms for sample in chosen]),
                "total_ms": _percentiles([sample.total_ms for sample in chosen]),
                "outcomes": dict(Counter(sample.outcome for sample in chosen)),
                "errors": dict(self.class_errors[kind]),
                "statuses": {str(k): v for k, v in sorted(Counter(s.status for s in chosen).items())},
            }
        return {
            "target": self.target,
            "label": self.label or self.target,
            "requests": self.requests,
            "errors": sum(self.errors.values()),
            "error_kinds": dict(self.errors),
            "duration_s": round(self.duration_s, 3),
            "throughput_rps": round(len(self.samples) / self.duration_s, 2) if self.duration_s else 0.0,
            **classes,
        }

    def throughput_over_time(self, buckets: int = 60) -> list[tuple[float, float]]:
        """(seconds since start, completed requests per second) in ``buckets`` intervals."""
        if not self.samples or self.duration_s <= 0:
            return []
        width = self.duration_s / buckets
        counts = Counter(min(int(sample.finished_s / width), buckets - 1) for sample in self.samples)
        return [(index * width, counts.get(index, 0) / width) for index in range(buckets)]


def requests_from_log(
    records: Iterable[LogRecord],
    classifier: Classifier,
    *,
    limit: int | None = None,
    path_pattern: Callable[[str], object] | None = None,
    kind: str | None = None,
) -> list[ReplayRequest]:
    """The GET/HEAD requests of a log to replay, classified as the gate does, filtered."""
    chosen: list[ReplayRequest] = []
    first: float | None = None
    for record in records:
        if record.method not in ("GET", "HEAD"):
            continue
        if path_pattern is not None and not path_pattern(record.target):
            continue
        verdict = classifier.classify(record.user_agent).kind
        if kind is not None and verdict != kind:
            continue
        first = record.timestamp if first is None else first
        chosen.append(ReplayRequest(record.method, record.target, record.user_agent, verdict, record.timestamp - first))
        if limit is not None and len(chosen) >= limit:
            break
    return chosen


async def replay(
    requests: Sequence[ReplayRequest],
    base_url: str,
    *,
    concurrency: int = 16,
    speed: float | None = None,
    timeout_s: float = 30.0,
    on_progress: Callable[[int, int], None] | None = None,
    start_at: float | None = None,
) -> ReplayResult:
    """Replay ``requests`` against ``base_url``: closed loop with ``concurrency`` clients, or open loop at ``speed``.

    ``start_at`` (a ``time.time()``) starts the schedule at a given moment, so several processes replaying
    shares of one log keep one clock.
    """
    target = _Target.parse(base_url)
    result = ReplayResult(target=base_url)
    connections = MAX_IN_FLIGHT if speed is not None else concurrency
    async with ConnectionPool(target.host, target.port, size=connections, ssl=target.ssl) as pool:
        if start_at is not None:
            await asyncio.sleep(max(0.0, start_at - time.time()))
        started = time.perf_counter()
        done = 0

        async def one(request: ReplayRequest, scheduled: float) -> None:
            nonlocal done
            head = request.method == "HEAD"
            try:
                answer = await pool.fetch(target.request(request), head=head, timeout_s=timeout_s)
            except ReplayError as exc:
                result.errors[exc.kind] += 1
                result.class_errors[request.kind][exc.kind] += 1
            else:
                result.samples.append(
                    Sample(
                        kind=request.kind,
                        outcome=answer.outcome or "none",
                        status=answer.status,
                        ttfb_ms=(answer.first_byte - scheduled) * 1000,
                        total_ms=(answer.finished - scheduled) * 1000,
                        finished_s=answer.finished - started,
                    )
                )
            done += 1
            if on_progress is not None and (done % 200 == 0 or done == len(requests)):
                on_progress(done, len(requests))

        if speed is None:
            queue = iter(requests)

            async def worker() -> None:
                for request in queue:
                    await one(request, time.perf_counter())

            await asyncio.gather(*(worker() for _ in range(min(concurrency, max(len(requests), 1)))))
        else:
            gate = asyncio.Semaphore(MAX_IN_FLIGHT)
            tasks = []
            # Logs are not always in time order (Apache writes a request when it ends, stamped when it
            # began; rotated files get joined out of order): the schedule is the log's times, sorted.
            ordered = sorted(requests, key=lambda request: request.offset_s)
            first = ordered[0].offset_s if ordered else 0.0
            for request in ordered:
                scheduled = started + (request.offset_s - first) / speed
                delay = scheduled - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                woke = time.perf_counter()
                # The event loop's timers wake a millisecond or two late: that is this client's delay, not
                # the server's, so a small lateness is not counted. Waiting for a free slot below (the
                # server is behind) and any larger lateness still are.
                if woke - scheduled < TIMER_SLACK_S:
                    scheduled = woke
                result.send_lateness_ms.append((woke - (started + (request.offset_s - first) / speed)) * 1000)
                await gate.acquire()
                task = asyncio.create_task(one(request, scheduled))
                task.add_done_callback(lambda _: gate.release())
                tasks.append(task)
            await asyncio.gather(*tasks)
        result.duration_s = time.perf_counter() - started
    return result


def run_replay(work: Coroutine[Any, Any, T]) -> T:
    """Run a replay on uvloop when it is installed (uvicorn[standard] brings it), else on asyncio's loop.

    uvloop wakes timers and answers sockets with less of the client's own delay: an open-loop
    schedule at 2,000 requests/s leaves on time within 0.06 ms at the median (0.4 ms on asyncio's).
    """
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] is a dependency
        return asyncio.run(work)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(work)


@dataclass(frozen=True, slots=True)
class _Target:
    """Where requests go, and the bytes every request shares."""

    host: str
    port: int
    prefix: str
    authority: str
    ssl: SSLContext | None

    @classmethod
    def parse(cls, base_url: str) -> _Target:
        parts = urlsplit(base_url)
        secure = parts.scheme == "https"
        port = parts.port or (443 if secure else 80)
        return cls(
            host=parts.hostname or "127.0.0.1",
            port=port,
            prefix=parts.path.rstrip("/"),
            authority=parts.netloc.rpartition("@")[2],
            ssl=ssl.create_default_context() if secure else None,
        )

    def request(self, request: ReplayRequest) -> bytes:
        agent = request.user_agent.replace("\r", " ").replace("\n", " ")
        target = request.target
        if "://" in target[:12]:  # absolute form, as proxies log it: the path and query are the page
            parts = urlsplit(target)
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        # A log keeps what the client sent, spaces and quotes included; the wire needs them escaped.
        target = self.prefix + quote(target if target.startswith("/") else "/" + target, safe=_TARGET_SAFE)
        # A person's request carries what their browser sends on a page load, as it did when the log was written:
        # without it the gate would take the replayed people for scrapers borrowing their user agents.
        navigation = _NAVIGATION if request.kind == "human" else ""
        return (
            f"{request.method} {target} HTTP/1.1\r\nHost: {self.authority}\r\nUser-Agent: {agent}\r\n"
            f"Accept-Encoding: gzip\r\n{navigation}\r\n"
        ).encode("latin-1", "replace")


_NAVIGATION = (
    "Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8\r\nAccept-Language: en-US,en;q=0.5\r\n"
    "Sec-Fetch-Mode: navigate\r\nSec-Fetch-Dest: document\r\nSec-Fetch-Site: none\r\n"
)


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": 0.0, "p90": 0.0, "p99": 0.0, "mean": 0.0}
    ordered = sorted(values)

    def rank(fraction: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))]

    return {
        "p50": round(rank(0.50), 3),
        "p90": round(rank(0.90), 3),
        "p99": round(rank(0.99), 3),
        "mean": round(sum(ordered) / len(ordered), 3),
    }


def format_summary(results: Sequence[ReplayResult], *, same_load: bool = False) -> str:
    """A table of throughput and TTFB per class for each target, with ratios when there are two; ``same_load``:
    both were sent at one offered load, so their throughput is that load's and no ratio of it is given."""
    summaries = [result.summary() for result in results]
    lines = [f"{'':<26}" + "".join(f"{summary['label'][-28:]:>30}" for summary in summaries)]

    def row(label: str, values: list[str]) -> None:
        lines.append(f"{label:<26}" + "".join(f"{value:>30}" for value in values))

    row("requests (errors)", [f"{s['requests']:,} ({s['errors']:,})" for s in summaries])
    row("throughput (requests/s)", [f"{s['throughput_rps']:,.1f}" for s in summaries])
    for kind in ("crawler", "human"):
        for stat in ("p50", "p99", "mean"):
            row(f"{kind} TTFB {stat} (ms)", [ms_or_na(s[kind], stat) for s in summaries])
        row(f"{kind} outcomes", [_outcomes(s[kind]["outcomes"]) for s in summaries])
        row(f"{kind} statuses", [_outcomes(s[kind]["statuses"]) for s in summaries])
        if any(s[kind]["errors"] for s in summaries):
            row(f"{kind} errors", [_outcomes(s[kind]["errors"]) or "none" for s in summaries])
    if len(summaries) == 2:
        first, second = summaries
        name = second["label"]
        lines.append("")
        if not same_load:
            throughput = rate_change(first["throughput_rps"], second["throughput_rps"])
            lines.append(f"throughput: {name} served {throughput} than {first['label']}")
        for kind in ("crawler", "human"):
            a, b = first[kind]["ttfb_ms"]["mean"], second[kind]["ttfb_ms"]["mean"]
            lines.append(f"{kind}s: {name} answered {time_change(a, b)} ({a:,.2f} → {b:,.2f} ms mean TTFB)")
    return "\n".join(lines)


def time_change(before_ms: float, after_ms: float) -> str:
    """ "52× faster", "2.3× slower" or "as fast": a direction in words, whichever way the times go."""
    if before_ms <= 0 or after_ms <= 0:
        return "n/a (no requests)"
    if abs(before_ms - after_ms) < 0.005 * max(before_ms, after_ms):
        return "as fast"
    if after_ms < before_ms:
        return f"{factor_words(before_ms / after_ms)} faster"
    return f"{factor_words(after_ms / before_ms)} slower"


def rate_change(before: float, after: float) -> str:
    """ "1.84× more requests/s" or "2.1× fewer requests/s"."""
    if before <= 0 or after <= 0:
        return "n/a (no requests)"
    if after >= before:
        return f"{factor_words(after / before)} more requests/s"
    return f"{factor_words(before / after)} fewer requests/s"


def factor_words(factor: float) -> str:
    return f"{factor:,.0f}×" if factor >= 10 else f"{factor:,.2f}×"


def comparison(results: Sequence[ReplayResult]) -> dict[str, Any]:
    """The --compare JSON: both summaries and the ratios (the paper's Figures 8 and 9)."""
    first, second = (result.summary() for result in results)
    ratios = {
        "throughput": _safe_ratio(second["throughput_rps"], first["throughput_rps"]),
        **{
            f"{kind}_mean_ttfb_speedup": _safe_ratio(first[kind]["ttfb_ms"]["mean"], second[kind]["ttfb_ms"]["mean"])
            for kind in ("crawler", "human")
        },
    }
    return {"first": first, "second": second, "ratios": ratios}


def ms_or_na(summary: dict[str, Any], stat: str) -> str:
    # No answered request of the class (all failed, or none in the log): no time to show.
    return f"{summary['ttfb_ms'][stat]:,.2f}" if summary["count"] else "n/a"


def _outcomes(outcomes: dict[str, int]) -> str:
    return " ".join(f"{name}:{count}" for name, count in sorted(outcomes.items(), key=lambda item: -item[1])[:3])


def _safe_ratio(top: float, bottom: float) -> float | None:
    return round(top / bottom, 3) if bottom else None
