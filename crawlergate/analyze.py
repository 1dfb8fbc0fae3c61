"""Trace characterisation: who sends the requests of an access log, and who costs the server time.

The paper's section 2: the crawler share of requests and of server time (its Table 1), the user
agents that cost the most time (its Table 2), and the split per crawler family.

    report = crawler_share(LogReader("access.log"), classifier)
    print(format_share(report))
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from crawlergate.classify import Classifier
from crawlergate.logparse import LogRecord

K = TypeVar("K")


@dataclass(slots=True)
class Tally:
    """Requests and server time (seconds; zero when the log has no time field) of one group."""

    requests: int = 0
    time_s: float = 0.0

    def add(self, duration_s: float | None) -> None:
        self.requests += 1
        if duration_s is not None:
            self.time_s += duration_s


@dataclass(slots=True)
class ShareReport:
    """Counts per class, per crawler family and per user agent."""

    has_time: bool = False
    total: Tally = field(default_factory=Tally)
    by_kind: dict[str, Tally] = field(default_factory=dict)
    by_family: dict[tuple[str, str], Tally] = field(default_factory=dict)
    by_user_agent: dict[str, Tally] = field(default_factory=dict)

    def share(self, kind: str, of: str) -> float:
        """The share (0..1) of all requests (``of="requests"``) or of all server time (``of="time"``) of a class."""
        tally = self.by_kind.get(kind, Tally())
        if of == "requests":
            return tally.requests / self.total.requests if self.total.requests else 0.0
        return tally.time_s / self.total.time_s if self.total.time_s else 0.0

    def top_user_agents(self, count: int) -> list[tuple[str, Tally]]:
        """The user agents that cost the most time (or sent the most requests when the log has no time)."""
        key = (lambda item: item[1].time_s) if self.has_time else (lambda item: item[1].requests)
        return sorted(self.by_user_agent.items(), key=key, reverse=True)[:count]


def crawler_share(records: Iterable[LogRecord], classifier: Classifier) -> ShareReport:
    """Tally a log's requests and server time by class, crawler family and user agent."""
    report = ShareReport()
    classify = classifier.classify
    for record in records:
        verdict = classify(record.user_agent)
        duration = record.duration_s
        if duration is not None:
            report.has_time = True
        report.total.add(duration)
        _tally(report.by_kind, verdict.kind).add(duration)
        if verdict.is_crawler:
            _tally(report.by_family, (verdict.family, verdict.tag)).add(duration)
        _tally(report.by_user_agent, record.user_agent).add(duration)
    return report


def share_as_json(report: ShareReport, classifier: Classifier, top: int) -> dict[str, Any]:
    """The report as plain JSON-able data."""
    kinds = {
        kind: {
            "requests": report.by_kind.get(kind, Tally()).requests,
            "request_share": report.share(kind, "requests"),
            "time_s": report.by_kind.get(kind, Tally()).time_s if report.has_time else None,
            "time_share": report.share(kind, "time") if report.has_time else None,
        }
        for kind in ("crawler", "human")
    }
    return {
        "requests": report.total.requests,
        "has_time": report.has_time,
        "time_s": report.total.time_s if report.has_time else None,
        "classes": kinds,
        "families": [
            {"family": family, "tag": tag, "requests": tally.requests, "time_s": tally.time_s}
            for (family, tag), tally in sorted(report.by_family.items(), key=lambda item: -item[1].requests)
        ],
        "top_user_agents": [
            {
                "user_agent": user_agent,
                "class": classifier.classify(user_agent).kind,
                "requests": tally.requests,
                "time_s": tally.time_s,
            }
            for user_agent, tally in report.top_user_agents(top)
        ],
    }


def format_share(report: ShareReport, classifier: Classifier, top: int) -> str:
    """The report as the paper's Tables 1 and 2, plus the split per crawler family."""
    lines = [f"{report.total.requests:,} requests"]
    header = f"{'class':<10}{'requests':>14}{'share':>9}"
    if report.has_time:
        header += f"{'time (s)':>14}{'share':>9}"
    lines += ["", header]
    for kind in ("crawler", "human"):
        tally = report.by_kind.get(kind, Tally())
        row = f"{kind:<10}{tally.requests:>14,}{report.share(kind, 'requests'):>9.2%}"
        if report.has_time:
            row += f"{tally.time_s:>14,.1f}{report.share(kind, 'time'):>9.2%}"
        lines.append(row)
    if not report.has_time:
        lines.append("(the log has no time field, so shares of server time cannot be given)")

    if report.by_family:
        time_header = f"{'time (s)':>12}" if report.has_time else ""
        lines += ["", f"{'crawler family':<32}{'tag':<16}{'requests':>12}{time_header}"]
        for (family, tag), tally in sorted(report.by_family.items(), key=lambda item: -item[1].requests):
            row = f"{family[:31]:<32}{tag:<16}{tally.requests:>12,}"
            lines.append(row + (f"{tally.time_s:>12,.1f}" if report.has_time else ""))

    by = "time" if report.has_time else "requests"
    time_column = f"{'time (s)':>12}" if report.has_time else ""
    lines += ["", f"top {top} user agents by {by}", f"{'class':<9}{'requests':>10}{time_column}  user agent"]
    for user_agent, tally in report.top_user_agents(top):
        kind = classifier.classify(user_agent).kind
        row = f"{kind:<9}{tally.requests:>10,}" + (f"{tally.time_s:>12,.1f}" if report.has_time else "")
        lines.append(f"{row}  {user_agent[:100] or '(empty)'}")
    return "\n".join(lines)


def _tally(table: dict[K, Tally], key: K) -> Tally:
    tally = table.get(key)
    if tally is None:
        tally = table[key] = Tally()
    return tally
