"""Write ``examples/access.log``: two days of a small forum's nginx access log, the same bytes every run.

The offline tools (``analyze``, ``simulate``, ``classify --log``, ``replay``) need a log to be tried
on before a reader hands them their own. This one is nginx's default ``combined`` format exactly as
nginx writes it (``$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent
"$http_referer" "$http_user_agent"``, no response-time field), local time at ``+0100``, for
Tuesday 11 and Wednesday 12 March 2025:

* people (documentation addresses, 192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24; the browsers'
  real user agents) arrive on a diurnal curve (4 am trough, noon and evening peaks), land on the
  front page or, from a search engine, on a thread, read a few pages, and fetch the style sheet,
  script, logo and icon on a first visit (a ``304`` when they come back); a few log in and reply
  (``POST``), one follows a link to a deleted thread (``404``), a scanner probes for ``/.env``;
* crawlers (Googlebot, Bingbot, GPTBot, ClaudeBot, Applebot, YandexBot, AhrefsBot, SemrushBot,
  PerplexityBot, Meta's and DuckDuckGo's; their real user agents, from their operators' address
  ranges) fetch ``robots.txt`` and the sitemap, then pages: the search engines at a steady pace
  with conditional requests (``304``), the AI and SEO crawlers in bursts that sweep old threads.
  They make a few percent of the requests, as on most sites.

The paths are the demo forum's (``crawlergate demo forum``: ``/t/N``, ``/f/N``,
``/member.php?u=N``, 1,000 threads), so ``crawlergate replay examples/access.log`` against
``crawlergate demo --serve`` fetches real pages. Run from the repository root::

    python scripts/make_sample_log.py [--out examples/access.log] [--seed 2025]
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

SEED = 2025
START = datetime(2025, 3, 11, tzinfo=timezone(timedelta(hours=1)))
DAYS = 2
THREADS = 1000  # the demo forum's default
FORUMS = 4
MEMBERS = 333
HOST = "https://forum.example.org"
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
# People's sessions started in each local hour, relative: a 4 am trough, a noon peak, an evening crest.
DIURNAL = (2.0, 1.3, 0.8, 0.5, 0.4, 0.5, 1.0, 2.0, 3.2, 4.2, 4.8, 5.3,
           5.8, 5.6, 5.0, 4.8, 4.7, 4.9, 5.4, 6.0, 6.4, 5.8, 4.6, 3.2)  # fmt: skip
SESSIONS_PER_DAY = 100
STATIC = (("/static/forum.css", 8412), ("/static/forum.js", 23107), ("/static/logo.png", 4870), ("/favicon.ico", 1150))
BROWSERS = (
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/134.0.0.0 Safari/537.36",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/133.0.0.0 Safari/537.36",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/134.0.0.0 "
    "Safari/537.36",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:136.0) Gecko/20100101 Firefox/136.0",
    "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.3 "
    "Safari/605.1.15",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 18_3_2 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) "
    "Version/18.3.1 Mobile/15E148 Safari/604.1",
    "Mozilla/5.0 (Linux; Android 10; K) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/134.0.0.0 Mobile Safari/537.36",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/134.0.0.0 "
    "Safari/537.36 Edg/134.0.0.0",
    "Mozilla/5.0 (Linux; Android 14; SAMSUNG SM-S911B) AppleWebKit/537.36 (KHTML, like Gecko) "
    "SamsungBrowser/27.0 Chrome/125.0.0.0 Mobile Safari/537.36",
)
BROWSER_WEIGHTS = (22, 8, 9, 8, 3, 7, 18, 14, 7, 4)
PEOPLE_NETWORKS = ("192.0.2.", "198.51.100.", "203.0.113.")
SEARCH_REFERERS = ("https://www.google.com/", "https://www.google.com/", "https://www.google.com/",
                   "https://www.bing.com/", "https://duckduckgo.com/")  # fmt: skip
LINK_REFERERS = ("https://www.reddit.com/", "https://news.ycombinator.com/", "https://t.co/", "https://chatgpt.com/")


@dataclass(frozen=True, slots=True)
class Crawler:
    """One crawler: its user agent, addresses, requests a day and how it spreads them."""

    user_agent: str
    networks: tuple[str, ...]
    per_day: int
    bursty: bool = False  # a sweep of old threads within minutes, else a steady pace
    revalidates: bool = False  # sends If-Modified-Since: some answers are 304
    sitemap: bool = False
    days: tuple[int, ...] = (0, 1)  # the days it comes


CRAWLERS = (
    Crawler("Mozilla/5.0 (Linux; Android 6.0.1; Nexus 5X Build/MMB29P) AppleWebKit/537.36 (KHTML, like Gecko) "
            "Chrome/134.0.6998.165 Mobile Safari/537.36 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
            ("66.249.66.", "66.249.68."), 7, revalidates=True, sitemap=True),
    Crawler("Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)", ("66.249.66.",), 2,
            revalidates=True),
    Crawler("Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; bingbot/2.0; "
            "+http://www.bing.com/bingbot.htm) Chrome/116.0.1938.76 Safari/537.36",
            ("40.77.167.", "207.46.13.", "157.55.39."), 4, revalidates=True, sitemap=True),
    Crawler("Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; GPTBot/1.2; +https://openai.com/gptbot)",
            ("20.171.207.",), 8, bursty=True, days=(1,)),
    Crawler("Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; ClaudeBot/1.0; "
            "+claudebot@anthropic.com)", ("216.73.216.",), 4, bursty=True),
    Crawler("Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_5) AppleWebKit/605.1.15 (KHTML, like Gecko) "
            "Version/13.1.1 Safari/605.1.15 (Applebot/0.1; +http://www.apple.com/go/applebot)",
            ("17.241.219.", "17.241.75."), 2),
    Crawler("Mozilla/5.0 (compatible; YandexBot/3.0; +http://yandex.com/bots)", ("213.180.203.", "5.255.231."), 2),
    Crawler("Mozilla/5.0 (compatible; AhrefsBot/7.0; +http://ahrefs.com/robot/)", ("54.36.148.", "5.39.1."), 7,
            bursty=True, days=(0,)),
    Crawler("Mozilla/5.0 (compatible; SemrushBot/7~bl; +http://www.semrush.com/bot.html)", ("185.191.171.",), 3,
            bursty=True, days=(1,)),
    Crawler("Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; PerplexityBot/1.0; "
            "+https://perplexity.ai/perplexitybot)", ("44.221.181.",), 2, days=(0,)),
    Crawler("meta-externalagent/1.1 (+https://developers.facebook.com/docs/sharing/webmasters/crawler)",
            ("57.141.0.",), 3, bursty=True, days=(1,)),
    Crawler("DuckDuckBot/1.1; (+http://duckduckgo.com/duckduckbot.html)", ("20.191.45.",), 2, days=(0,)),
)  # fmt: skip


@dataclass(order=True, slots=True)
class Request:
    """One line of the log, before formatting."""

    time: float  # seconds since START
    address: str = field(compare=False)
    method: str = field(compare=False)
    path: str = field(compare=False)
    status: int = field(compare=False)
    size: int = field(compare=False)
    referer: str = field(compare=False)
    user_agent: str = field(compare=False)
    protocol: str = field(compare=False, default="HTTP/1.1")

    def line(self) -> str:
        when = START + timedelta(seconds=self.time)
        stamp = f"{when.day:02d}/{MONTHS[when.month - 1]}/{when.year}:{when:%H:%M:%S} +0100"
        request = f"{self.method} {self.path} {self.protocol}"
        return (
            f'{self.address} - - [{stamp}] "{request}" {self.status} {self.size} "{self.referer}" "{self.user_agent}"'
        )


class Forum:
    """The pages: their sizes (stable per URL, the front page changing), popular threads and links."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self._sizes: dict[str, int] = {}

    def size(self, path: str) -> int:
        if path == "/":
            return 11200 + self.rng.randrange(-400, 400)  # the recently active list changes all day
        if path not in self._sizes:
            page = random.Random(f"{SEED}:{path}")
            if path.startswith("/t/"):
                self._sizes[path] = page.randrange(5200, 26000)
            elif path.startswith("/f/"):
                self._sizes[path] = page.randrange(7800, 9900)
            elif path.startswith("/member.php"):
                self._sizes[path] = page.randrange(3900, 4600)
            else:
                self._sizes[path] = page.randrange(1500, 3000)
        return self._sizes[path]

    def pages_of(self, thread: int) -> int:
        return 1 + random.Random(f"{SEED}:pages:{thread}").choice((0, 0, 0, 0, 1, 1, 2, 4))

    def popular_thread(self) -> int:
        """Recent threads are read most: a heavy-tailed distance back from the newest."""
        back = int(self.rng.paretovariate(0.9)) - 1
        return THREADS - back if back < THREADS else self.rng.randrange(1, THREADS + 1)

    def any_thread(self) -> int:
        return self.rng.randrange(1, THREADS + 1)

    def thread_path(self, thread: int) -> str:
        pages = self.pages_of(thread)
        page = 1 if pages == 1 or self.rng.random() < 0.7 else self.rng.randrange(2, pages + 1)
        return f"/t/{thread}" if page == 1 else f"/t/{thread}/page/{page}"


def diurnal_start(rng: random.Random, day: int) -> float:
    hour = rng.choices(range(24), weights=DIURNAL)[0]
    return (day * 24 + hour) * 3600 + rng.uniform(0, 3600)


def people(rng: random.Random, forum: Forum) -> list[Request]:
    """Sessions of people: a pool of visitors, regulars coming back, each session a few page views."""
    visitors = [
        (f"{rng.choice(PEOPLE_NETWORKS)}{rng.randrange(2, 255)}", rng.choices(BROWSERS, weights=BROWSER_WEIGHTS)[0])
        for _ in range(140)
    ]
    loyalty = [1 / (rank + 1) ** 0.5 for rank in range(len(visitors))]  # a few regulars, many passers-by
    seen: set[tuple[str, str]] = set()
    out: list[Request] = []
    starts = sorted(diurnal_start(rng, day) for day in range(DAYS) for _ in range(SESSIONS_PER_DAY))
    broken_link_at = {rng.randrange(len(starts)) for _ in range(2)}
    for number, start in enumerate(starts):
        visitor = rng.choices(visitors, weights=loyalty)[0]
        address, agent = visitor
        protocol = "HTTP/2.0" if rng.random() < 0.85 else "HTTP/1.1"

        def hit(at: float, method: str, path: str, status: int, size: int, referer: str) -> None:
            out.append(Request(at, address, method, path, status, size, referer, agent, protocol))  # noqa: B023

        now = start
        entry = rng.random()
        if number in broken_link_at:
            path, referer = "/t/1043", rng.choice(LINK_REFERERS)  # a thread deleted since the link was made
            hit(now, "GET", path, 404, 3126, referer)
            now += rng.uniform(2, 6)
            referer, path = f"{HOST}{path}", "/"
        elif entry < 0.45:
            path, referer = forum.thread_path(forum.popular_thread()), rng.choice(SEARCH_REFERERS)
        elif entry < 0.60:
            path, referer = forum.thread_path(forum.popular_thread()), rng.choice(LINK_REFERERS)
        else:
            path, referer = "/", "-"
        views = 1 + min(int(rng.expovariate(1 / 2.2)), 9)
        member = rng.random() < 0.04
        for view in range(views):
            hit(now, "GET", path, 200, forum.size(path), referer)
            if view == 0:
                if visitor not in seen:
                    for asset, size in STATIC:
                        hit(now + rng.uniform(0.05, 0.6), "GET", asset, 200, size, f"{HOST}{path}")
                elif rng.random() < 0.6:
                    for asset, _ in STATIC[:2]:
                        hit(now + rng.uniform(0.05, 0.6), "GET", asset, 304, 0, f"{HOST}{path}")
                seen.add(visitor)
            if member and view == 0:
                now += rng.uniform(5, 20)
                hit(now, "GET", "/login", 200, 2841, f"{HOST}{path}")
                now += rng.uniform(8, 25)
                hit(now, "POST", "/login", 302, 0, f"{HOST}/login")
                path, referer = "/", f"{HOST}/login"
                now += rng.uniform(0.2, 0.8)
                hit(now, "GET", path, 200, forum.size(path), referer)
            referer = f"{HOST}{path}"
            now += rng.lognormvariate(3.4, 0.8)  # tens of seconds reading
            path = _next_page(rng, forum, path)
        if member:
            thread = path.split("/")[2] if path.startswith("/t/") else str(forum.popular_thread())
            now += rng.uniform(60, 240)
            hit(now, "POST", "/newreply.php", 302, 0, f"{HOST}/t/{thread}")
            hit(now + rng.uniform(0.2, 0.6), "GET", f"/t/{thread}", 200, forum.size(f"/t/{thread}"), referer)
    # Someone's scanner, looking for secrets and a WordPress login, behind a browser's user agent.
    scanner = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/91.0.4472.124 "
    at = 27 * 3600 + 17 * 60 + 3
    for offset, path in enumerate(("/.env", "/wp-login.php", "/.git/config")):
        out.append(Request(at + offset * 0.4, "198.51.100.77", "GET", path, 404, 162, "-", scanner + "Safari/537.36"))
    return out


def _next_page(rng: random.Random, forum: Forum, path: str) -> str:
    roll = rng.random()
    if path == "/" or roll < 0.15:
        return f"/f/{rng.randrange(1, FORUMS + 1)}" if roll < 0.3 else forum.thread_path(forum.popular_thread())
    if path.startswith("/f/"):
        return forum.thread_path(forum.popular_thread())
    if roll < 0.25:
        return f"/member.php?u={rng.randrange(1, MEMBERS + 1)}"
    if roll < 0.45:
        return "/"
    return forum.thread_path(forum.popular_thread())


def crawler_page(rng: random.Random, forum: Forum, deep: bool) -> str:
    roll = rng.random()
    if roll < 0.12:
        return "/"
    if roll < 0.27:
        forum_id = rng.randrange(1, FORUMS + 1)
        page = rng.randrange(1, 12) if deep else 1
        return f"/f/{forum_id}" if page == 1 else f"/f/{forum_id}/page/{page}"
    if roll < 0.36:
        return f"/member.php?u={rng.randrange(1, MEMBERS + 1)}"
    thread = forum.any_thread() if deep or rng.random() < 0.3 else forum.popular_thread()
    return forum.thread_path(thread)


def crawlers(rng: random.Random, forum: Forum) -> list[Request]:
    out: list[Request] = []
    for crawler in CRAWLERS:
        fetched: set[str] = set()
        for day in crawler.days:
            address = f"{rng.choice(crawler.networks)}{rng.randrange(1, 255)}"

            def hit(at: float, path: str, status: int, size: int) -> None:
                out.append(Request(at, address, "GET", path, status, size, "-", crawler.user_agent))  # noqa: B023

            if crawler.bursty:
                start = day * 86400 + rng.uniform(0, 86400 - 1800)
                times = sorted(start + rng.uniform(0, 900) for _ in range(crawler.per_day))
            else:
                times = sorted(day * 86400 + rng.uniform(0, 86400) for _ in range(crawler.per_day))
            hit(times[0] - rng.uniform(1, 30), "/robots.txt", 200, 412)
            if crawler.sitemap:
                hit(times[0] - rng.uniform(0.2, 1), "/sitemap.xml", 200, 21873)
            for at in times:
                path = crawler_page(rng, forum, crawler.bursty)
                if crawler.revalidates and path in fetched and path != "/" and rng.random() < 0.7:
                    hit(at, path, 304, 0)
                else:
                    hit(at, path, 200, forum.size(path))
                fetched.add(path)
    # Google's renderer fetches the style sheet and script of a page it indexes, now and then.
    for asset, size in STATIC[:2]:
        out.append(Request(40000 + rng.uniform(0, 60), "66.249.68.3", "GET", asset, 200, size, "-",
                           CRAWLERS[0].user_agent))  # fmt: skip
    return out


def make_log(seed: int = SEED) -> list[str]:
    """The log's lines, in the order nginx writes them (by time)."""
    rng = random.Random(seed)
    forum = Forum(rng)
    requests = sorted(people(rng, forum) + crawlers(rng, forum))
    return [request.line() for request in requests if 0 <= request.time < DAYS * 86400]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=Path("examples/access.log"), help="the log to write")
    parser.add_argument("--seed", type=int, default=SEED, help=f"the random seed (default: {SEED})")
    args = parser.parse_args()
    lines = make_log(args.seed)
    args.out.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    size = args.out.stat().st_size
    print(f"{args.out}: {len(lines):,} lines, {size / 1024:,.0f} KB, {START:%d %b %Y} and the day after")


if __name__ == "__main__":
    main()
