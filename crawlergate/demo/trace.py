"""A synthetic access log of the demo forum that looks like the paper's site (sections 2.2–2.3).

Humans arrive on a diurnal curve (a noon peak, a dip at six, a crest at nine, a trough at four in
the morning), pick threads by Zipf popularity, read a few pages with "active–inactive" pacing,
fetch the style sheet now and then, are logged in some of the time (their member name is the log's
``%u`` field) and sometimes reply, which changes a thread page. Crawlers (Googlebot, bingbot,
Yandex, Baidu, GPTBot, ClaudeBot … with their real user agents) sweep the site breadth-first from
the front page at a near-uniform pace with occasional bursts, reaching most threads. The log is
Apache combined with a trailing ``%D`` (microseconds, estimated from the page's cost).

    write_trace(Path("forum.log"), TraceSpec(requests=20_000), structure_of(db_path))
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import random
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from crawlergate.demo.forum import POSTS_PER_PAGE, THREADS_PER_PAGE
from crawlergate.demo.seed import EPOCH

# Traces start at midnight UTC of the seeded forum's "now", so hours of the log are hours of the day.
TRACE_START = EPOCH - EPOCH % 86_400

# Relative human activity per hour of day, read off the paper's Figure 3.
DIURNAL = (
    0.35, 0.25, 0.18, 0.12, 0.10, 0.12, 0.20, 0.35, 0.55, 0.75, 0.90, 0.97,
    1.00, 0.95, 0.90, 0.85, 0.80, 0.78, 0.72, 0.80, 0.90, 0.95, 0.80, 0.55,
)  # fmt: skip

# (user agent, share of crawler requests); shares follow the paper's Table 2 ordering, plus AI crawlers.
CRAWLERS = (
    ("Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)", 0.30),
    ("Mozilla/5.0 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)", 0.14),
    ("Mozilla/5.0 (compatible; YandexBot/3.0; +http://yandex.com/bots)", 0.08),
    ("Mozilla/5.0 (compatible; Baiduspider/2.0; +http://www.baidu.com/search/spider.html)", 0.08),
    ("Mozilla/5.0 (compatible; Yahoo! Slurp; http://help.yahoo.com/help/us/ysearch/slurp)", 0.05),
    ("Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; GPTBot/1.2; +https://openai.com/gptbot)", 0.12),
    ("Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; ClaudeBot/1.0; +claudebot@anthropic.com)", 0.08),
    ("Mozilla/5.0 (compatible; AhrefsBot/7.0; +http://ahrefs.com/robot/)", 0.06),
    ("Mozilla/5.0 (compatible; SemrushBot/7~bl; +http://www.semrush.com/bot.html)", 0.05),
    ("CCBot/2.0 (https://commoncrawl.org/faq/)", 0.04),
)
BROWSERS = (
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:133.0) Gecko/20100101 Firefox/133.0",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko)"
    " Version/18.1 Safari/605.1.15",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like"
    " Gecko) Version/18.1 Mobile/15E148 Safari/604.1",
    "Mozilla/5.0 (Linux; Android 10; K) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Mobile Safari/537.36",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko)"
    " Chrome/131.0.0.0 Safari/537.36 Edg/131.0.0.0",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class TraceSpec:
    """What to generate. ``crawler_share`` is of page views (the paper's replayed trace: 68 %)."""

    requests: int = 20_000
    duration_s: float = 86_400.0
    crawler_share: float = 0.68
    logged_in_share: float = 0.2
    reply_share: float = 0.02
    static_share: float = 0.3
    zipf_exponent: float = 1.0
    page_cost_us: int = 20_000
    # Crawlers follow where humans go (the paper's premise for human-induced prefetching): this share
    # of crawler requests revisits a page people viewed within the last `follow_window_s`.
    follow_share: float = 0.5
    follow_window_s: float = 3600.0
    seed: int = 2012
    # Thread and forum pages at /t/12/page/2 and /f/3 instead of /showthread.php?t=12&page=2 (the forum serves
    # both): a front server answers only query-less URLs from disk.
    plain_urls: bool = False


def thread_target(thread: int, page: int, *, plain: bool = False) -> str:
    """A thread page's URL, as the paper's vBulletin wrote it or plain."""
    if plain:
        return f"/t/{thread}" + (f"/page/{page}" if page > 1 else "")
    return f"/showthread.php?t={thread}" + (f"&page={page}" if page > 1 else "")


def forum_target(forum: int, page: int, *, plain: bool = False) -> str:
    """A forum listing page's URL, as the paper's vBulletin wrote it or plain."""
    if plain:
        return f"/f/{forum}" + (f"/page/{page}" if page > 1 else "")
    return f"/forumdisplay.php?f={forum}" + (f"&page={page}" if page > 1 else "")


@dataclass(frozen=True, slots=True)
class ForumStructure:
    """What a crawler can discover: forums, and per forum its threads (most recent first) with page counts."""

    forums: tuple[int, ...]
    threads_by_forum: dict[int, tuple[tuple[int, int], ...]]
    members: int

    @property
    def threads(self) -> list[tuple[int, int]]:
        return [thread for forum in self.forums for thread in self.threads_by_forum[forum]]


def structure_of(db_path: Path) -> ForumStructure:
    """Read the forum's structure from its database."""
    connection = sqlite3.connect(db_path)
    try:
        forums = tuple(row[0] for row in connection.execute("SELECT id FROM forums ORDER BY id"))
        by_forum: dict[int, list[tuple[int, int]]] = {forum: [] for forum in forums}
        for thread, forum, replies in connection.execute(
            "SELECT id, forum_id, replies FROM threads ORDER BY last_post_at DESC"
        ):
            by_forum[forum].append((thread, replies // POSTS_PER_PAGE + 1))
        members = int(connection.execute("SELECT COUNT(*) FROM members").fetchone()[0])
    finally:
        connection.close()
    return ForumStructure(forums, {forum: tuple(threads) for forum, threads in by_forum.items()}, members)


def write_trace(
    path: Path, spec: TraceSpec, structure: ForumStructure, on_progress: Callable[[int], None] | None = None
) -> int:
    """Write the trace, sorted by time; returns the number of lines."""
    rng = random.Random(spec.seed)
    crawler_views = round(spec.requests * spec.crawler_share)
    humans = list(_humans(spec, structure, spec.requests - crawler_views, random.Random(rng.random())))
    viewed = [(when, line.target) for when, line in humans if line.method == "GET" and line.target.startswith("/show")]
    recent = ([when for when, _ in viewed], [target for _, target in viewed])
    streams: list[Iterable[tuple[float, _Line]]] = [humans]
    for user_agent, count in _split(crawler_views, CRAWLERS):
        streams.append(_crawler(spec, structure, user_agent, count, random.Random(rng.random()), recent))
    lines = 0
    with path.open("w", encoding="utf-8") as handle:
        for when, line in heapq.merge(*streams):
            handle.write(_format(when, line))
            lines += 1
            if on_progress is not None and lines % 10_000 == 0:
                on_progress(lines)
    return lines


@dataclass(frozen=True, slots=True, order=True)
class _Line:
    method: str
    target: str
    status: int
    size: int
    user_agent: str
    user: str
    host: str
    micros: int


def _crawler(
    spec: TraceSpec,
    structure: ForumStructure,
    user_agent: str,
    count: int,
    rng: random.Random,
    recent: tuple[list[float], list[str]],
) -> Iterator[tuple[float, _Line]]:
    """A breadth-first sweep from the front page at a near-uniform pace, with bursts; restarts when done.

    Some requests instead revisit a page people viewed recently (found from the front page's list
    of active threads): that is what makes human-induced prefetching pay.
    """
    times, targets = recent
    if count <= 0:
        return
    host = f"66.249.{rng.randrange(64, 80)}.{rng.randrange(1, 255)}"
    offsets: list[float] = []
    when = rng.random()
    while len(offsets) < count:
        burst = rng.randrange(2, 8) if rng.random() < 0.05 else 1
        for _ in range(min(burst, count - len(offsets))):
            offsets.append(when)
            when += 0.05 if burst > 1 else rng.uniform(0.7, 1.3)
    scale = spec.duration_s / when  # the sweep spans the whole trace, bursts included
    urls = itertools.cycle(_breadth_first(structure, spec.plain_urls))
    for offset in offsets:
        moment = TRACE_START + offset * scale
        target = next(urls)
        if rng.random() < spec.follow_share:
            newest = bisect.bisect_right(times, moment)
            oldest = bisect.bisect_left(times, moment - spec.follow_window_s)
            if oldest < newest:
                target = targets[rng.randrange(oldest, newest)]
        yield moment, _page_line("GET", target, user_agent, "-", host, spec, rng)


def _breadth_first(structure: ForumStructure, plain: bool = False) -> Iterator[str]:
    yield "/"
    for forum in structure.forums:
        pages = max(1, math.ceil(len(structure.threads_by_forum[forum]) / THREADS_PER_PAGE))
        for page in range(1, pages + 1):
            yield forum_target(forum, page, plain=plain)
    for forum in structure.forums:
        for thread, pages in structure.threads_by_forum[forum]:
            for page in range(1, pages + 1):
                yield thread_target(thread, page, plain=plain)


def _humans(
    spec: TraceSpec, structure: ForumStructure, count: int, rng: random.Random
) -> Iterator[tuple[float, _Line]]:
    """Sessions on a diurnal curve; each session reads Zipf-popular threads page by page."""
    threads = structure.threads
    rng.shuffle(threads)  # popularity rank is not thread age
    weights = list(itertools.accumulate(1 / (rank**spec.zipf_exponent) for rank in range(1, len(threads) + 1)))
    sessions: list[tuple[float, _Line]] = []
    views = 0
    while views < count:
        start = _diurnal_time(spec.duration_s, rng)
        host = f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"
        user_agent = rng.choice(BROWSERS)
        user = f"member{rng.randrange(1, structure.members + 1)}" if rng.random() < spec.logged_in_share else "-"
        when = start
        length = min(count - views, 1 + int(rng.expovariate(1 / 5)))
        thread, pages = threads[bisect.bisect(weights, rng.random() * weights[-1]) % len(threads)]
        page = 1
        for number in range(length):
            if number == 0 and rng.random() < 0.3:
                target = "/"
            else:
                if page > pages or rng.random() < 0.35:
                    thread, pages = threads[bisect.bisect(weights, rng.random() * weights[-1]) % len(threads)]
                    page = 1
                target = thread_target(thread, page, plain=spec.plain_urls)
                page += 1
            sessions.append((when, _page_line("GET", target, user_agent, user, host, spec, rng)))
            if rng.random() < spec.static_share:
                sessions.append((when + 0.05, _Line("GET", "/static/forum.css", 200, 102, user_agent, user, host, 100)))
            if user != "-" and target.startswith(("/showthread", "/t/")) and rng.random() < spec.reply_share:
                reply = _Line("POST", f"/newreply.php?t={thread}", 303, 0, user_agent, user, host, spec.page_cost_us)
                sessions.append((when + 20, reply))
            views += 1
            # Active reading, with now and then a long inactive gap (the paper's "active–inactive" pacing).
            when += rng.expovariate(1 / 25) if rng.random() > 0.1 else rng.expovariate(1 / 600)
    sessions.sort()
    for when, line in sessions:
        yield TRACE_START + min(when, spec.duration_s), line


def _diurnal_time(duration_s: float, rng: random.Random) -> float:
    while True:
        moment = rng.random() * duration_s
        if rng.random() < DIURNAL[int(moment // 3600) % 24]:
            return moment


def _page_line(
    method: str, target: str, user_agent: str, user: str, host: str, spec: TraceSpec, rng: random.Random
) -> _Line:
    micros = int(spec.page_cost_us * rng.uniform(0.8, 1.4))
    return _Line(method, target, 200, rng.randrange(4_000, 60_000), user_agent, user, host, micros)


def _split(total: int, shares: tuple[tuple[str, float], ...]) -> list[tuple[str, int]]:
    weight = sum(share for _, share in shares)
    counts = [(agent, int(total * share / weight)) for agent, share in shares]
    counts[0] = (counts[0][0], counts[0][1] + total - sum(count for _, count in counts))
    return counts


def _format(when: float, line: _Line) -> str:
    stamp = time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(when))
    size = str(line.size) if line.size else "-"
    return (
        f'{line.host} - {line.user} [{stamp}] "{line.method} {line.target} HTTP/1.1" {line.status} {size} '
        f'"-" "{line.user_agent}" {line.micros}\n'
    )
