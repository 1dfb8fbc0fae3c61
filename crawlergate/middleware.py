"""CrawlerGateMiddleware: pure ASGI. Crawlers get cached guest pages; everyone else gets the site.

The flow (DESIGN.md, "The request, end to end"): admin paths go to the admin endpoints; anything
that is not a cacheable GET/HEAD, carries a session cookie or credentials, or comes from a human
passes through untouched (streaming preserved), and a human's page view then prefetches the page
into L1 off the response path. A crawler is answered from L1, then L2, else from one guest
sub-request per key, whose page is stored when storable. If the origin fails and L2 has the page,
the stored copy is served as ``stale``. Every response carries ``X-Crawlergate``.

    app = CrawlerGateMiddleware(site, settings=load_settings("crawlergate.toml"))
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from pathlib import Path

import anyio
import httpx
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from crawlergate.admin import AdminEndpoints
from crawlergate.cache import TwoLevelCache
from crawlergate.classify import Classifier
from crawlergate.config import Settings
from crawlergate.errors import OriginError, OriginTimeout
from crawlergate.keys import CacheKey, KeyMaker
from crawlergate.metrics import Metrics
from crawlergate.origin import OriginClient, OriginResponse, PageTooLarge
from crawlergate.page import Page, parse_http_date
from crawlergate.rules import load_cache_rules, resolve_rule_files
from crawlergate.serve import serve_page, simple_response
from crawlergate.stores.base import Store
from crawlergate.stores.disk import DiskStore
from crawlergate.stores.memcached import MemcachedStore
from crawlergate.stores.memory import MemoryStore

logger = logging.getLogger(__name__)

# Statuses stored besides 200, each with its own lifetime (DESIGN.md, "Storable").
_REDIRECTS = (301, 308)
_GONE = (404, 410)


class CrawlerGateMiddleware:
    """Wrap an ASGI site so crawlers are served from the two-level cache.

    Parameters:
        app: the site (or, in the standalone proxy, the reverse-proxy app).
        settings: all configuration; ``Settings()`` works on a laptop.
        cache: a ready TwoLevelCache (tests, or several gates sharing one); built from settings if None.
        classifier: a ready Classifier; built from settings if None.
        origin: how guest pages are fetched; an in-process call to ``app`` if None.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        settings: Settings,
        cache: TwoLevelCache | None = None,
        classifier: Classifier | None = None,
        origin: OriginClient | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.app = app
        self.settings = settings
        self.metrics = cache.metrics if cache is not None else Metrics()
        self.cache = cache if cache is not None else build_cache(settings, self.metrics)
        self.classifier = classifier or Classifier.from_settings(settings.classify)
        rules_path = resolve_rule_files(settings.classify.rules_dir, (settings.cache.rules_file,), ())[0]
        self.keys = KeyMaker(load_cache_rules(rules_path), admin_prefix=settings.admin.prefix)
        self.origin = origin or OriginClient(
            httpx.ASGITransport(app=app, raise_app_exceptions=False),
            canonical_host=settings.server.canonical_host or "localhost",
            timeout_s=settings.cache.fill_timeout_seconds,
            max_bytes=settings.l2.page_max_bytes,
        )
        self.admin = AdminEndpoints(prefix=settings.admin.prefix, token=settings.admin.token, stats=self.stats)
        self._clock = clock
        self._started = False
        self._background: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        """Prepare the stores (create the L2 directory); raises ConfigError when it is unusable."""
        if not self._started:
            self.cache.start()
            self._started = True

    async def drain(self) -> None:
        """Wait for background work (prefetches) to finish, e.g. before shutdown."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    def stats(self) -> dict[str, object]:
        data = self.metrics.snapshot()
        data["l1"] = {"backend": type(self.cache.l1).__name__}
        data["l2"] = {"pages": len(self.cache.l2), "bytes": self.cache.l2.used_bytes}
        return data

    def mark_changed(self, url_or_pattern: str) -> int:
        """Drop a page from the cache so the next crawler request refetches it; returns pages dropped."""
        raw_path, _, query = url_or_pattern.partition("?")
        key = self.keys.key_for(raw_path.encode("utf-8", "surrogateescape"), query.encode("utf-8", "surrogateescape"))
        if key is None:
            return 0
        self.cache.invalidate(key)
        return 1

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, self._lifespan_receive(receive), send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self._started:
            self.start()
        started = time.perf_counter()
        path: str = scope["path"]
        prefix = self.settings.admin.prefix
        if path == prefix or path.startswith(prefix + "/"):
            await self.admin(scope, receive, send)
            return

        raw_path: bytes = scope.get("raw_path") or path.encode("utf-8")
        query: bytes = scope.get("query_string", b"")
        if len(raw_path) + len(query) > self.settings.cache.max_target_chars:
            await simple_response(send, 414, b"URI Too Long\n", outcome=b"pass")
            self.metrics.record("human", "pass", _ms_since(started))
            return

        request = _RequestHeaders(scope["headers"])
        verdict = self.classifier.classify_request(
            request.user_agent, cookie=request.cookie, authorization=request.authorization
        )
        method = scope["method"]
        key = self.keys.key_for(raw_path, query) if method in ("GET", "HEAD") else None
        if not verdict.is_crawler or key is None:
            status = await self._pass(scope, receive, send, verdict.kind, started)
            # Only pages L2 holds can be prefetched; the index answers without touching the disk.
            if key is not None and status == 200 and not verdict.is_crawler and self.cache.l2.contains(key.digest):
                self._in_background(self._prefetch(key))
            return
        await self._serve_crawler(scope, receive, send, key, request, started)

    async def _serve_crawler(
        self, scope: Scope, receive: Receive, send: Send, key: CacheKey, request: _RequestHeaders, started: float
    ) -> None:
        method = scope["method"]
        # L1 is called inline: the embedded store answers in microseconds, and memcached is bounded by
        # its 50 ms socket timeout and the dead-server back-off. Worker threads measured slower for
        # memcached too (3,000 vs 5,000 hits/s, scripts/bench_gate.py): pymemcache spends ~100 µs of
        # Python per 17 KB get, which threads cannot overlap under the GIL. L2 reads the disk: a thread.
        found = self.cache.lookup_l1(key) or await anyio.to_thread.run_sync(self.cache.lookup_l2, key)
        if found is not None and not found.page.is_expired(self._clock()):
            await serve_page(send, found.page, method, request, outcome=f"{found.level}-hit".encode())
            self.metrics.record("crawler", f"{found.level}-hit", _ms_since(started))
            return
        stale = found.page if found is not None else None
        try:
            result = await self.cache.single_flight(key, lambda: self._fill(key))
        except PageTooLarge:
            result = None
        except OriginError as exc:
            stale = stale or await anyio.to_thread.run_sync(self.cache.stale_copy, key)
            if stale is not None:
                await serve_page(send, stale, method, request, outcome=b"stale")
                self.metrics.record("crawler", "stale", _ms_since(started))
                return
            status = 504 if isinstance(exc, OriginTimeout) else 502
            await simple_response(send, status, b"The site did not answer.\n", outcome=b"miss")
            self.metrics.record("crawler", "error", _ms_since(started))
            return
        if isinstance(result, Page):
            await serve_page(send, result, method, request, outcome=b"miss")
            self.metrics.record("crawler", "miss", _ms_since(started))
            return
        if isinstance(result, OriginResponse) and result.status >= 500:
            stale = stale or await anyio.to_thread.run_sync(self.cache.stale_copy, key)
            if stale is not None:
                await serve_page(send, stale, method, request, outcome=b"stale")
                self.metrics.record("crawler", "stale", _ms_since(started))
                return
        if isinstance(result, OriginResponse):
            await _send_origin_response(send, result, method)
            self.metrics.record("crawler", "miss", _ms_since(started))
            return
        # Too large to store: the crawler gets the live site, as a human would.
        await self._pass(scope, receive, send, "crawler", started)

    async def _fill(self, key: CacheKey) -> Page | OriginResponse:
        """One guest sub-request; the stored Page when storable, else the response as it came."""
        self.metrics.origin_fetches += 1
        try:
            response = await self.origin.fetch_guest(key.target)
        except OriginError:
            self.metrics.origin_errors += 1
            raise
        page = self._storable_page(response)
        if page is None:
            if response.status >= 500:
                self.metrics.origin_errors += 1
            return response
        await anyio.to_thread.run_sync(self.cache.store, key, page)
        return page

    def _storable_page(self, response: OriginResponse) -> Page | None:
        cache = self.settings.cache
        if response.status == 200:
            ttl = cache.ttl_seconds
        elif response.status in _REDIRECTS:
            ttl = cache.redirect_ttl_seconds
        elif response.status in _GONE:
            ttl = cache.not_found_ttl_seconds
        else:
            return None
        if response.header("set-cookie") is not None:
            return None
        control = ",".join(response.all("cache-control")).lower()
        if "private" in control or "no-store" in control:
            return None
        if response.status == 200 and not response.body:
            return None
        length = response.header("content-length")
        if length is not None and length.isdigit() and int(length) != len(response.body):
            return None
        kept = tuple((name, value) for name, value in response.headers if name == "location")
        last_modified = response.header("last-modified")
        return Page.from_response(
            response.status,
            response.body,
            content_type=response.header("content-type") or "application/octet-stream",
            generated_at=self._clock(),
            ttl_seconds=ttl,
            last_modified=parse_http_date(last_modified) if last_modified else None,
            headers=kept,
        )

    async def _pass(self, scope: Scope, receive: Receive, send: Send, kind: str, started: float) -> int:
        status = 0
        first_body = True

        async def send_marked(message: Message) -> None:
            nonlocal status, first_body
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-crawlergate", b"pass")]
            elif message["type"] == "http.response.body" and first_body:
                first_body = False
                self.metrics.record(kind, "pass", _ms_since(started))
            await send(message)

        await self.app(scope, receive, send_marked)
        return status

    async def _prefetch(self, key: CacheKey) -> None:
        await anyio.to_thread.run_sync(self.cache.prefetch, key)

    def _in_background(self, work: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _lifespan_receive(self, receive: Receive) -> Receive:
        async def wrapped() -> Message:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.start()
            elif message["type"] == "lifespan.shutdown":
                await self.drain()
                await self.origin.aclose()
                self.cache.close()
            return message

        return wrapped


def build_cache(settings: Settings, metrics: Metrics) -> TwoLevelCache:
    """L1 and L2 as the settings say: memcached when servers are given, else the embedded LRU."""
    l1: Store
    if settings.l1.memcached:
        l1 = MemcachedStore(
            settings.l1.memcached,
            connect_timeout_s=settings.l1.connect_timeout_ms / 1000,
            timeout_s=settings.l1.timeout_ms / 1000,
            dead_retry_seconds=settings.l1.dead_retry_seconds,
            item_max_bytes=settings.l1.item_max_bytes,
        )
    else:
        l1 = MemoryStore(settings.l1.max_bytes, item_max_bytes=settings.l1.item_max_bytes)
    l2 = DiskStore(Path(settings.cache_dir), max_bytes=settings.l2.max_bytes, page_max_bytes=settings.l2.page_max_bytes)
    return TwoLevelCache(l1, l2, metrics)


class _RequestHeaders:
    """The request headers the gate looks at, read in one pass."""

    __slots__ = ("user_agent", "cookie", "authorization", "accept_encoding", "if_none_match", "if_modified_since")

    def __init__(self, headers: list[tuple[bytes, bytes]]) -> None:
        self.user_agent = b""
        self.cookie = b""
        self.authorization = False
        self.accept_encoding = b""
        self.if_none_match = b""
        self.if_modified_since = b""
        for name, value in headers:
            if name == b"user-agent":
                self.user_agent = value
            elif name == b"cookie":
                self.cookie = self.cookie + b"; " + value if self.cookie else value
            elif name == b"authorization":
                self.authorization = True
            elif name == b"accept-encoding":
                self.accept_encoding = value
            elif name == b"if-none-match":
                self.if_none_match = value
            elif name == b"if-modified-since":
                self.if_modified_since = value


async def _send_origin_response(send: Send, response: OriginResponse, method: str) -> None:
    headers = [
        (name.encode("latin-1"), value.encode("latin-1"))
        for name, value in response.headers
        if name not in ("content-length", "transfer-encoding", "connection", "content-encoding")
    ]
    body = b"" if method == "HEAD" else response.body
    headers += [(b"content-length", str(len(response.body)).encode()), (b"x-crawlergate", b"miss")]
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000
