"""A small breadth-first crawler as Googlebot does it, and the page comparison the crawl tests use.

The crawler follows same-site ``<a href>`` links over HTML pages, never sends cookies, and skips
what crawlergate's default cache rules exclude (``rules/cache.toml``: excluded paths, static files):
a crawl then measures exactly the pages the gate should serve from its cache.
"""

from __future__ import annotations

import fnmatch
import http.cookiejar
import re
import tomllib
from collections import deque
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit, urlunsplit

import httpx

from tests.visitors import GOOGLEBOT

HITS = ("l1-hit", "l2-hit")

CACHE_RULES = Path(__file__).resolve().parents[2] / "rules" / "cache.toml"


class DefaultRules:
    """The default cache rules' path filter: excluded path patterns and static file extensions."""

    def __init__(self, path: Path = CACHE_RULES) -> None:
        paths = tomllib.loads(path.read_text(encoding="utf-8")).get("paths", {})
        self.exclude = tuple(paths.get("exclude", ()))
        self.static = tuple(extension.lower() for extension in paths.get("static_extensions", ()))

    def excludes(self, path: str) -> bool:
        if path.lower().endswith(self.static):
            return True
        return any(fnmatch.fnmatchcase(path, pattern) for pattern in self.exclude)


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            for name, value in attrs:
                if name == "href" and value:
                    self.hrefs.append(value)


def links_of(html: str) -> list[str]:
    parser = _Links()
    parser.feed(html)
    parser.close()
    return parser.hrefs


def no_cookies_client(base_url: str, headers: dict[str, str], timeout: float = 30.0) -> httpx.Client:
    """An httpx client that never keeps a cookie, as crawlers do not."""
    jar = http.cookiejar.CookieJar(policy=http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
    return httpx.Client(base_url=base_url, headers=headers, cookies=jar, timeout=timeout, follow_redirects=False)


@dataclass
class Fetched:
    url: str
    status: int
    outcome: str
    content_type: str
    cache_control: str
    location: str
    body: str = field(repr=False)

    @property
    def is_html(self) -> bool:
        return self.status == 200 and self.content_type.startswith("text/html")

    @property
    def cacheable(self) -> bool:
        """A page the gate must store: a 200 HTML page the site did not mark no-store."""
        return self.is_html and "no-store" not in self.cache_control.lower()


@dataclass
class Crawl:
    pages: list[Fetched]
    fetched: list[Fetched]

    def html_pages(self) -> list[Fetched]:
        return [page for page in self.pages if page.is_html]

    def hit_ratio(self) -> tuple[float, list[Fetched]]:
        """Share of cacheable pages answered from the cache, and the cacheable pages that were not."""
        cacheable = [page for page in self.pages if page.cacheable]
        missed = [page for page in cacheable if page.outcome not in HITS]
        if not cacheable:
            return 0.0, missed
        return 100.0 * (len(cacheable) - len(missed)) / len(cacheable), missed

    def assert_from_the_cache(self, name: str, *, min_pages: int, min_percent: float, kinds: str = "") -> None:
        """A second pass: at least ``min_pages`` HTML pages, ``min_percent`` of the cacheable ones from the cache."""
        percent, missed = self.hit_ratio()
        cacheable = sum(1 for page in self.pages if page.cacheable)
        print(f"{name}: second pass {percent:.1f} % of {cacheable} cacheable pages from the cache ({kinds})")
        for page in missed:
            print(f"  not from the cache: {page.status} [{page.outcome}] {page.url}")
        assert len(self.html_pages()) >= min_pages, f"{name}: second pass {len(self.html_pages())} HTML pages"
        assert percent >= min_percent, (
            f"{name}: second pass {percent:.1f} % of {cacheable} cacheable pages answered l1-hit/l2-hit "
            f"(need {min_percent} %); not from the cache:\n"
            + "\n".join(f"  {page.status} [{page.outcome}] {page.url}" for page in missed[:20])
        )


def crawl(
    base_url: str,
    *,
    start: str = "/",
    max_pages: int = 150,
    max_fetches: int = 400,
    headers: dict[str, str] | None = None,
    rules: DefaultRules | None = None,
    skip: re.Pattern[str] | None = None,
) -> Crawl:
    """Breadth-first from ``start`` over same-site links; at most ``max_pages`` HTML pages.

    Redirects are not followed automatically: a same-site ``Location`` is queued like a link.
    ``skip`` drops URLs (path and query) matching it, e.g. machine formats of a page.
    """
    rules = rules or DefaultRules()
    site = urlsplit(base_url)
    queue: deque[str] = deque([urljoin(base_url, start)])
    seen = set(queue)
    pages: list[Fetched] = []
    fetched: list[Fetched] = []
    with no_cookies_client(base_url, headers or GOOGLEBOT) as client:
        while queue and len(pages) < max_pages and len(fetched) < max_fetches:
            url = queue.popleft()
            response = client.get(url)
            page = Fetched(
                url=url,
                status=response.status_code,
                outcome=response.headers.get("x-crawlergate", ""),
                content_type=response.headers.get("content-type", ""),
                cache_control=response.headers.get("cache-control", ""),
                location=response.headers.get("location", ""),
                body=response.text if response.headers.get("content-type", "").startswith("text/") else "",
            )
            fetched.append(page)
            targets: list[str] = []
            if page.is_html:
                pages.append(page)
                targets = links_of(page.body)
            elif 300 <= page.status < 400 and page.location:
                targets = [page.location]
            for href in targets:
                target = urljoin(url, href.strip())
                parts = urlsplit(target)
                if parts.scheme != site.scheme or parts.netloc != site.netloc:
                    continue
                target = urlunsplit((parts.scheme, parts.netloc, parts.path or "/", parts.query, ""))
                if target in seen or rules.excludes(parts.path or "/"):
                    continue
                if skip is not None and skip.search(target[len(f"{site.scheme}://{site.netloc}") :]):
                    continue
                seen.add(target)
                queue.append(target)
    return Crawl(pages=pages, fetched=fetched)


# Per-request tokens and clock-dependent text: what may differ between two renderings of one page.
_VOLATILE = [
    # Trac's form token (hidden inputs and the script variable), Django's masked CSRF token.
    (re.compile(r'(name="__FORM_TOKEN"[^>]*?value=")[^"]*'), r"\1TOKEN"),
    (re.compile(r'(form_token\s*[=:]\s*["\'])[^"\']*'), r"\1TOKEN"),
    (re.compile(r'(name="csrfmiddlewaretoken"[^>]*?value=")[^"]*'), r"\1TOKEN"),
    (re.compile(r'(value=")[^"]*("\s+name="csrfmiddlewaretoken")'), r"\1TOKEN\2"),
    # Relative ages: "3 minutes ago", "less than a minute", "(5 hours)".
    (
        re.compile(r"(less than (a|one) (second|minute)|\d+\s+(second|minute|hour|day|week|month|year)s?)"),
        "AGE",
    ),
    # Trac's preferences page shows the guest's new session key (the trac_session cookie's value).
    (re.compile(r'(name="newsid"[^>]*?value=")[^"]*'), r"\1TOKEN"),
    # Times: ISO timestamps (Trac's timeline links) and clock times (Trac shows the current time).
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d(%3A|:)\d\d(%3A|:)\d\d(\.\d+)?(Z|[+-]\d\d(%3A|:)?\d\d)?"), "TIME"),
    (re.compile(r"\b\d{1,2}:\d\d(:\d\d)?(\s?[AP]M)?"), "TIME"),
    # Element ids Trac makes from Python object ids (the workflow graph macro).
    (re.compile(r"(trac-workflow-graph-|graph_)[0-9a-f]{6,}"), r"\1ID"),
]


def normalise(body: str) -> str:
    """The page with its per-request tokens and times replaced by placeholders."""
    for pattern, replacement in _VOLATILE:
        body = pattern.sub(replacement, body)
    return body


def first_difference(a: str, b: str, context: int = 120) -> str:
    """Where two texts first differ, for an assertion message."""
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            start = max(0, index - context)
            return f"at {index}:\n  cached: {a[start : index + context]!r}\n  origin: {b[start : index + context]!r}"
    return f"lengths {len(a)} and {len(b)}"
