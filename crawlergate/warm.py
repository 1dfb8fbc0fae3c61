"""`crawlergate warm`: fill L2 for a new deployment, through the gate's own filler.

The paper pre-generated its whole forum before the cache went live (82 minutes, 8 threads). Here
the pages come from a sitemap (an index of sitemaps too, gzipped or not), a file of URLs, or the
GET requests of an access log; each is fetched as a guest fill would be (same proxy, same storable
rules, same single-flight, same deadline), at most ``concurrency`` at once and ``rate`` a second.
A page L2 already holds is skipped, so a warm that was interrupted picks up where it stopped.

    summary = await warm(create_app(settings), urls, concurrency=8, rate=0)
"""

from __future__ import annotations

import asyncio
import gzip
import time
import xml.etree.ElementTree as ElementTree
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from crawlergate.adapters.asgi import CrawlerGateMiddleware
from crawlergate.errors import CrawlerGateError, OriginError
from crawlergate.gate.fill import NotStored
from crawlergate.keys import CacheKey
from crawlergate.page import Page
from crawlergate.regenerate.budget import Pacing

# Sitemaps (index files included) read at most, and nesting followed at most (the protocol allows one level).
MAX_SITEMAPS = 1000
MAX_SITEMAP_DEPTH = 3
_SITEMAP_NS = "{http://www.sitemaps.org/schemas/sitemap/0.9}"


@dataclass
class WarmSummary:
    """What a warm did."""

    pages: int = 0  # distinct cacheable pages asked for
    stored: int = 0  # fetched and stored now
    skipped: int = 0  # already in L2
    not_cacheable: int = 0  # URLs the cache rules exclude
    errors: int = 0  # the origin failed (the page stays unstored; the next warm tries again)
    bytes_stored: int = 0  # gzip bytes
    origin_seconds: float = 0.0  # summed time of the fetches
    seconds: float = 0.0  # wall time
    not_stored: Counter[str] = field(default_factory=Counter)  # fetched, not storable, by reason

    def as_dict(self) -> dict[str, object]:
        data = {name: getattr(self, name) for name in self.__dataclass_fields__ if name != "not_stored"}
        data["not_stored"] = dict(self.not_stored)
        return data


async def warm(
    gate: CrawlerGateMiddleware,
    urls: Iterable[str],
    *,
    concurrency: int = 8,
    rate: float = 0.0,
    on_progress: Callable[[int, int], None] | None = None,
) -> WarmSummary:
    """Fill every cacheable page of ``urls`` that L2 does not hold; ``rate`` 0 is as fast as ``concurrency`` allows."""
    started = time.monotonic()
    summary = WarmSummary()
    keys: dict[str, CacheKey] = {}
    for url in urls:
        key = gate.core.keys.key_for_url(url)
        if key is None:
            summary.not_cacheable += 1
        else:
            keys.setdefault(key.digest, key)
    summary.pages = len(keys)
    todo = [key for key in keys.values() if not gate.cache.l2.has_file(key.digest)]
    summary.skipped = summary.pages - len(todo)
    slots = asyncio.Semaphore(concurrency)
    pacing = Pacing(rate)
    done = 0

    async def fill(key: CacheKey) -> None:
        nonlocal done
        async with slots:
            await pacing.wait()
            began = time.monotonic()
            try:
                result = await gate.filler.fill(key, lambda: gate.origin.fetch_guest(key.target, client=None))
            except OriginError:
                summary.errors += 1
            else:
                _count(summary, result)
            summary.origin_seconds += time.monotonic() - began
            done += 1
            if on_progress is not None:
                on_progress(done, len(todo))

    await asyncio.gather(*(fill(key) for key in todo))
    summary.seconds = time.monotonic() - started
    return summary


def _count(summary: WarmSummary, result: Page | NotStored) -> None:
    if isinstance(result, Page):
        summary.stored += 1
        summary.bytes_stored += len(result.body_gz)
        return
    for label in dict.fromkeys(label for label, _ in result.verdict.reasons):
        summary.not_stored[label] += 1


async def sitemap_urls(url: str, *, timeout_s: float = 30.0) -> list[str]:
    """The page URLs of a sitemap, following a sitemap index; raises CrawlerGateError when it cannot be read."""
    pages: list[str] = []
    seen: set[str] = set()
    async with httpx.AsyncClient(timeout=timeout_s, follow_redirects=True) as client:
        queue = [(url, 0)]
        while queue:
            location, depth = queue.pop(0)
            if location in seen or len(seen) >= MAX_SITEMAPS:
                continue
            seen.add(location)
            try:
                response = await client.get(location)
            except httpx.HTTPError as exc:
                raise CrawlerGateError(f"Cannot fetch the sitemap {location}: {exc}.") from None
            if response.status_code != 200:
                raise CrawlerGateError(f"The sitemap {location} answered {response.status_code}.")
            body = response.content
            if body[:2] == b"\x1f\x8b":
                body = gzip.decompress(body)
            try:
                root = ElementTree.fromstring(body)
            except ElementTree.ParseError as exc:
                raise CrawlerGateError(f"The sitemap {location} is not XML: {exc}.") from None
            for loc in root.iter(f"{_SITEMAP_NS}loc"):
                text = (loc.text or "").strip()
                if root.tag == f"{_SITEMAP_NS}sitemapindex":
                    if depth < MAX_SITEMAP_DEPTH:
                        queue.append((text, depth + 1))
                elif text:
                    pages.append(text)
    return pages


def file_urls(path: Path) -> list[str]:
    """One URL or /path?query a line; blank lines and # comments skipped."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        raise CrawlerGateError(f"Cannot read {path}: {exc.strerror or exc}.") from None
    if any("\0" in line for line in lines):
        raise CrawlerGateError(f"{path} is not text (it holds NUL bytes): give one URL or /path?query a line.")
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def log_urls(path: Path) -> Iterator[str]:
    """The targets of an access log's successful GET requests, in the order they first appear."""
    from crawlergate.tools.logparse import LogReader

    reader = LogReader(path)
    for record in reader:
        if record.method == "GET" and 200 <= record.status < 400:
            yield record.target
    reader.require_requests()
