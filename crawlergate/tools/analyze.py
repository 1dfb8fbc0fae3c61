"""Trace characterisation: who sends the requests of an access log, and who costs the server time.

The paper's section 2: the crawler share of requests and of server time (its Table 1), the user
agents that cost the most time (its Table 2), the split per crawler family, the daily pattern of
humans and crawlers (its Figure 3) with the off-peak hour, how much of the site crawlers reach,
and how steadily each crawler family arrives.

    report = crawler_share(LogReader("access.log"), classifier)
    print(format_share(report))
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from crawlergate.classify import Classifier, Verdict
from crawlergate.tools.logparse import LogRecord
from crawlergate.tools.report import PALETTE, Marker, bar_chart, line_chart, note, page, paragraph, table

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

    def add(self, record: LogRecord, verdict: Verdict) -> None:
        duration = record.duration_s
        if duration is not None:
            self.has_time = True
        self.total.add(duration)
        _tally(self.by_kind, verdict.kind).add(duration)
        if verdict.is_crawler:
            _tally(self.by_family, (verdict.family, verdict.tag)).add(duration)
        _tally(self.by_user_agent, record.user_agent).add(duration)

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
        report.add(record, classify(record.user_agent))
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
    lines = [f"{report.total.requests:,} request{'' if report.total.requests == 1 else 's'}"]
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
        lines.append(
            "(the log has no response-time field, such as Apache's %D or nginx's $request_time, so shares of "
            "server time cannot be given)"
        )

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


@dataclass(slots=True)
class _Arrivals:
    """Inter-arrival times of one crawler family, kept as running sums (Welford) plus a sample for the median."""

    count: int = 0
    last: float | None = None
    mean: float = 0.0
    m2: float = 0.0
    sample: list[float] = field(default_factory=list)

    def add(self, timestamp: float) -> None:
        if self.last is not None:
            gap = max(0.0, timestamp - self.last)
            self.count += 1
            delta = gap - self.mean
            self.mean += delta / self.count
            self.m2 += delta * (gap - self.mean)
            if len(self.sample) < ARRIVAL_SAMPLE:
                self.sample.append(gap)
            elif (index := hash((self.count, timestamp)) % self.count) < ARRIVAL_SAMPLE:
                self.sample[index] = gap  # reservoir sampling
        self.last = timestamp

    def summary(self) -> dict[str, float]:
        ordered = sorted(self.sample)
        std = math.sqrt(self.m2 / self.count) if self.count else 0.0
        return {
            "gaps": self.count,
            "mean_s": round(self.mean, 3),
            "median_s": round(ordered[len(ordered) // 2], 3) if ordered else 0.0,
            # The coefficient of variation: 1 for random (Poisson) arrivals, near 0 for a steady sweep.
            "cv": round(std / self.mean, 3) if self.mean else 0.0,
        }


# Gaps kept per family for the median; the mean and spread use every gap.
ARRIVAL_SAMPLE = 10_000


@dataclass(slots=True)
class TraceProfile:
    """The paper's section 2 for one log: shares, the daily pattern, crawler breadth and pacing."""

    share: ShareReport
    by_hour: dict[str, list[int]]
    pages_all: set[int] = field(default_factory=set)
    pages_crawled: set[int] = field(default_factory=set)
    pages_by_family: dict[str, set[int]] = field(default_factory=dict)
    arrivals: dict[str, _Arrivals] = field(default_factory=dict)
    # The first and last hour (since 1970, UTC) the log holds: an hour of the day is covered on each day the
    # log spans it, with or without requests, so a quiet hour of a small site counts as quiet, not as unknown,
    # and a log that spans some hours on more days than others compares them per day, not by totals.
    first_hour: int | None = None
    last_hour: int | None = None

    def days_covering(self, hour: int) -> int:
        """How many times the log's span holds this hour of the day."""
        if self.first_hour is None or self.last_hour is None:
            return 0
        first = self.first_hour + (hour - self.first_hour) % 24
        return max(0, (self.last_hour - first) // 24 + 1)

    def hours_with_data(self) -> list[int]:
        """Hours of the day the log's span covers: an hour it never covers says nothing about traffic."""
        return [hour for hour in range(24) if self.days_covering(hour)]

    def humans_per_day(self, hour: int) -> float:
        """Human requests in this hour of the day, on average over the days the log covers it."""
        days = self.days_covering(hour)
        return self.by_hour["human"][hour] / days if days else 0.0

    @property
    def off_peak_hour(self) -> int | None:
        """The UTC hour with the fewest human requests a day, among hours the log covers; None without data."""
        return min(self.hours_with_data(), key=lambda hour: (self.humans_per_day(hour), hour), default=None)

    def breadth(self) -> float:
        return len(self.pages_crawled) / len(self.pages_all) if self.pages_all else 0.0

    def as_json(self, classifier: Classifier, top: int) -> dict[str, Any]:
        data = share_as_json(self.share, classifier, top)
        data["requests_per_hour"] = self.by_hour
        data["off_peak_hour"] = self.off_peak_hour
        data["distinct_pages"] = len(self.pages_all)
        data["crawler_breadth"] = round(self.breadth(), 4)
        data["crawler_families"] = {
            family: {
                "pages": len(pages),
                "breadth": round(len(pages) / len(self.pages_all), 4) if self.pages_all else 0.0,
                "inter_arrival": self.arrivals[family].summary(),
            }
            for family, pages in sorted(self.pages_by_family.items(), key=lambda item: -len(item[1]))
        }
        return data


def profile_log(records: Iterable[LogRecord], classifier: Classifier) -> TraceProfile:
    """One pass over a log for ``crawlergate analyze``."""
    share = ShareReport()
    profile = TraceProfile(share=share, by_hour={"crawler": [0] * 24, "human": [0] * 24})
    classify = classifier.classify
    for record in records:
        verdict = classify(record.user_agent)
        share.add(record, verdict)
        since_epoch = int(record.timestamp // 3600)
        hour = since_epoch % 24
        profile.by_hour[verdict.kind][hour] += 1
        if profile.first_hour is None or since_epoch < profile.first_hour:
            profile.first_hour = since_epoch
        if profile.last_hour is None or since_epoch > profile.last_hour:
            profile.last_hour = since_epoch
        page = hash(record.target)
        profile.pages_all.add(page)
        if verdict.is_crawler:
            profile.pages_crawled.add(page)
            profile.pages_by_family.setdefault(verdict.family, set()).add(page)
            arrivals = profile.arrivals.get(verdict.family)
            if arrivals is None:
                arrivals = profile.arrivals[verdict.family] = _Arrivals()
            arrivals.add(record.timestamp)
    return profile


def format_profile(profile: TraceProfile, classifier: Classifier, top: int) -> str:
    """The share tables, then the daily pattern, breadth and pacing per crawler family."""
    lines = [format_share(profile.share, classifier, top), "", "requests per hour of the day (UTC)"]
    lines.append(f"{'hour':>4}{'humans':>10}{'crawlers':>10}{'days':>6}")
    covered = set(profile.hours_with_data())
    for hour in range(24):
        if hour in covered:
            counts = f"{profile.by_hour['human'][hour]:>10,}{profile.by_hour['crawler'][hour]:>10,}"
            lines.append(f"{hour:>4}{counts}{profile.days_covering(hour):>6}")
        else:
            lines.append(f"{hour:>4}{'no data':>20}")
    off_peak = profile.off_peak_hour
    if off_peak is None:
        lines.append("no off-peak hour can be suggested: the log has no requests")
    elif len(covered) < 24:
        lines.append(
            f"suggested off-peak hour for regeneration: {off_peak:02d}:00 UTC (fewest human requests a day among "
            f"the {len(covered)} hours the log covers; a log of whole days would tell better)"
        )
    else:
        lines.append(f"suggested off-peak hour for regeneration: {off_peak:02d}:00 UTC (fewest human requests a day)")
    lines += [
        "",
        f"crawlers reached {len(profile.pages_crawled):,} of {len(profile.pages_all):,} distinct URLs "
        f"({profile.breadth():.1%})",
        f"{'crawler family':<32}{'URLs':>10}{'breadth':>9}{'mean gap s':>12}{'median s':>10}{'CV':>7}",
    ]
    for family, pages in sorted(profile.pages_by_family.items(), key=lambda item: -len(item[1])):
        gaps = profile.arrivals[family].summary()
        breadth = len(pages) / len(profile.pages_all) if profile.pages_all else 0.0
        lines.append(
            f"{family[:31]:<32}{len(pages):>10,}{breadth:>9.1%}{gaps['mean_s']:>12,.2f}{gaps['median_s']:>10,.2f}"
            f"{gaps['cv']:>7.2f}"
        )
    lines.append("(CV of the gaps: near 0 for a steady sweep, 1 for random arrivals)")
    return "\n".join(lines)


def profile_html(profile: TraceProfile, classifier: Classifier, top: int) -> str:
    """The HTML report of ``crawlergate analyze --report``: who sends the requests, when, and how far crawlers reach."""
    share, off_peak = profile.share, profile.off_peak_hour
    crawler_requests = share.share("crawler", "requests")
    if share.has_time:
        load = f"and {_percent(share.share('crawler', 'time'))} of the server's time"
    else:
        load = "(the log records no response times, so their share of the server's load is unknown)"
    headline = f"Crawlers sent {_percent(crawler_requests)} of {share.total.requests:,} requests {load}"
    headline += f"; the off-peak hour is {off_peak:02d}:00 UTC" if off_peak is not None else ""
    if not share.total.requests:
        headline = "The log has no requests: there is nothing to analyse"
    sections = [
        ("Crawlers and humans", _share_table(share)),
        ("Requests per hour of the day (UTC)", _hours_chart(profile)),
        ("Crawler families", _families(profile)),
        (
            f"Top {top} user agents by {'server time' if share.has_time else 'requests'}",
            _agents(share, classifier, top),
        ),
    ]
    return page("Access-log analysis: crawlers and humans", headline, sections)


def _percent(share: float) -> str:
    return f"{100 * share:.1f} %" if share < 0.995 else f"{100 * share:.2f} %"


def _share_table(share: ShareReport) -> str:
    header = ["class", "requests", "share of requests"]
    header += ["server time (s)", "share of time"] if share.has_time else []
    rows = []
    for kind in ("crawler", "human"):
        tally = share.by_kind.get(kind, Tally())
        row = [kind, f"{tally.requests:,}", _percent(share.share(kind, "requests"))]
        row += [f"{tally.time_s:,.1f}", _percent(share.share(kind, "time"))] if share.has_time else []
        rows.append(row)
    return table(header, rows)


def _hours_chart(profile: TraceProfile) -> str:
    covered = profile.hours_with_data()
    off_peak = profile.off_peak_hour
    series: dict[str, list[float | None]] = {
        f"{kind}s": [
            profile.by_hour[kind][hour] / profile.days_covering(hour) if hour in covered else None for hour in range(24)
        ]
        for kind in ("human", "crawler")
    }
    markers = [Marker(off_peak, f"off-peak {off_peak:02d}:00")] if off_peak is not None else []
    chart = line_chart(
        list(range(24)), series, x_label="hour of the day (UTC)", y_label="requests a day", x_axis="hour",
        x_markers=markers, colors=[PALETTE[1], PALETTE[0]], points=True,
        empty_note="The log has no requests, so there is no daily pattern to show.",
    )  # fmt: skip
    explain = "Requests in each hour, on average over the days the log covers that hour"
    if off_peak is not None:
        explain += f"; the off-peak hour ({off_peak:02d}:00) has the fewest human requests, for regeneration"
    return paragraph(explain + ".") + chart


def _families(profile: TraceProfile) -> str:
    if not profile.pages_by_family:
        return note("No crawler requests in this log.")
    ranked = sorted(profile.pages_by_family.items(), key=lambda item: -len(item[1]))
    total = len(profile.pages_all)
    intro = paragraph(
        f"Crawlers reached {len(profile.pages_crawled):,} of {total:,} distinct URLs ({_percent(profile.breadth())})."
    )
    if len(ranked) > 1:
        intro += bar_chart({family: len(pages) for family, pages in ranked[:10]}, value_label="distinct URLs reached")
    rows = []
    for family, pages in ranked:
        gaps = profile.arrivals[family].summary()
        rows.append([
            family, f"{len(pages):,}", _percent(len(pages) / total if total else 0.0), f"{gaps['mean_s']:,.2f}",
            f"{gaps['median_s']:,.2f}", f"{gaps['cv']:.2f}",
        ])  # fmt: skip
    header = ["family", "URLs", "breadth", "mean gap (s)", "median gap (s)", "CV of gaps"]
    return intro + table(header, rows) + paragraph("CV of the gaps: near 0 for a steady sweep, 1 for random arrivals.")


def _agents(share: ShareReport, classifier: Classifier, top: int) -> str:
    if not share.by_user_agent:
        return note("No requests in this log.")
    rows = []
    for user_agent, tally in share.top_user_agents(top):
        row = [classifier.classify(user_agent).kind, f"{tally.requests:,}"]
        row += [f"{tally.time_s:,.1f}"] if share.has_time else []
        rows.append([*row, user_agent or "(empty)"])
    header = ["class", "requests", *(["time (s)"] if share.has_time else []), "user agent"]
    return table(header, rows, text_columns=(0, len(header) - 1))
