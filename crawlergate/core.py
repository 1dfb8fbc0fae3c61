"""GateCore: the gate's decisions, free of any server interface, shared by the ASGI and WSGI adapters.

Whitenoise's split: one framework-free engine, thin adapters. The core builds the components from
Settings (classifier, cache keys, the two cache levels, metrics) and answers the questions every
request asks: is it admin, too long, to pass, or a crawler's cacheable page; is a stored page still
fresh; may a response be stored and for how long.

    core = GateCore(settings)
    decision = core.decide("GET", "/t/1", b"/t/1", b"", headers)
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from crawlergate.admin import AdminEndpoints
from crawlergate.cache import TwoLevelCache
from crawlergate.classify import HUMAN, Classifier, Verdict
from crawlergate.config import Settings
from crawlergate.errors import OriginError, OriginTimeout
from crawlergate.keys import CacheKey, KeyMaker
from crawlergate.metrics import Metrics
from crawlergate.origin import OriginResponse, PageTooLarge
from crawlergate.page import Page, parse_http_date
from crawlergate.serve import Response, page_response, plain_response
from crawlergate.stores.base import Store
from crawlergate.stores.disk import DiskStore
from crawlergate.stores.memcached import MemcachedStore
from crawlergate.stores.memory import MemoryStore

# Statuses stored besides 200, each with its own lifetime (DESIGN.md, "Storable").
_REDIRECTS = (301, 308)
_GONE = (404, 410)


class Route(enum.Enum):
    """Which way a request goes."""

    ADMIN = "admin"  # the /_crawlergate/ endpoints
    TOO_LONG = "too-long"  # refused with 414
    PASS = "pass"  # to the site untouched
    CRAWLER = "crawler"  # a crawler's cacheable GET/HEAD: answered from the cache


class RequestHeaders:
    """The request headers the gate looks at, read in one pass over the raw (name, value) pairs."""

    __slots__ = ("user_agent", "cookie", "authorization", "accept_encoding", "if_none_match", "if_modified_since")

    def __init__(self, headers: Iterable[tuple[bytes, bytes]]) -> None:
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


@dataclass(frozen=True, slots=True)
class Decision:
    """What the gate makes of one request."""

    route: Route
    verdict: Verdict
    key: CacheKey | None
    headers: RequestHeaders

    @property
    def kind(self) -> str:
        return self.verdict.kind


class GateCore:
    """The decisions and components of one gate.

    Parameters:
        settings: all configuration.
        cache: a ready TwoLevelCache; built from settings if None.
        classifier: a ready Classifier; built from settings if None.
        clock: wall-clock time (page ages are persisted in L2), injectable for tests.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        cache: TwoLevelCache | None = None,
        classifier: Classifier | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.metrics = cache.metrics if cache is not None else Metrics()
        self.cache = cache if cache is not None else build_cache(settings, self.metrics)
        self.classifier = classifier or Classifier.from_settings(settings.classify)
        self.keys = KeyMaker.from_settings(settings)
        self.clock = clock
        self.admin = AdminEndpoints(
            prefix=settings.admin.prefix,
            token=settings.admin.token,
            stats=self.stats,
            prometheus=self.prometheus,
            trusted_proxies=settings.server.trusted_proxies,
        )
        # The Host of guest sub-requests.
        self.canonical_host = settings.server.canonical_host or "localhost"
        self._admin_prefix = settings.admin.prefix
        self._started = False
        self._start_lock = threading.Lock()

    def start(self) -> None:
        """Prepare the stores (create the L2 directory); raises ConfigError when it is unusable."""
        with self._start_lock:
            if not self._started:
                self.cache.start()
                self._started = True

    def close(self) -> None:
        self.cache.close()

    def decide(
        self, method: str, path: str, raw_path: bytes, query: bytes, headers: Iterable[tuple[bytes, bytes]]
    ) -> Decision:
        """Route one request: admin, too long, pass through, or a crawler's cacheable page."""
        if not self._started:
            self.start()  # first request of an app that ran no lifespan
        request = RequestHeaders(headers)
        if path == self._admin_prefix or path.startswith(self._admin_prefix + "/"):
            return Decision(Route.ADMIN, HUMAN, None, request)
        if len(raw_path) + len(query) > self.settings.cache.max_target_chars:
            return Decision(Route.TOO_LONG, HUMAN, None, request)
        verdict = self.classifier.classify_request(
            request.user_agent, cookie=request.cookie, authorization=request.authorization
        )
        key = self.keys.key_for(raw_path, query) if method in ("GET", "HEAD") else None
        if verdict.is_crawler and key is not None:
            return Decision(Route.CRAWLER, verdict, key, request)
        return Decision(Route.PASS, verdict, key, request)

    def should_prefetch(self, decision: Decision, status: int) -> bool:
        """A human's successful view of a page that L2 holds (the index answers; no disk access).

        A passed request with a cache key is a human's: a crawler's cacheable GET takes the crawler route.
        """
        key = decision.key
        return decision.route is Route.PASS and key is not None and status == 200 and self.cache.l2.contains(key.digest)

    def is_fresh(self, page: Page) -> bool:
        return not page.is_expired(self.clock())

    def storable_page(self, response: OriginResponse) -> Page | None:
        """The Page to store for a guest response, or None when it must not be stored (DESIGN.md, "Storable")."""
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
        last_modified = response.header("last-modified")
        return Page.from_response(
            response.status,
            response.body,
            content_type=response.header("content-type") or "application/octet-stream",
            generated_at=self.clock(),
            ttl_seconds=ttl,
            last_modified=parse_http_date(last_modified) if last_modified else None,
            headers=tuple((name, value) for name, value in response.headers if name == "location"),
        )

    def stats(self) -> dict[str, object]:
        data = self.metrics.snapshot()
        data["l1"] = {"backend": type(self.cache.l1).__name__}
        data["l2"] = {"pages": len(self.cache.l2), "bytes": self.cache.l2.used_bytes}
        return data

    def prometheus(self) -> str:
        return self.metrics.prometheus(
            {"crawlergate_l2_pages": len(self.cache.l2), "crawlergate_l2_bytes": self.cache.l2.used_bytes}
        )

    def mark_changed(self, url: str) -> int:
        """Drop a page from both levels so the next crawler request refetches it; returns pages dropped."""
        raw_path, _, query = url.partition("?")
        key = self.keys.key_for(raw_path.encode("utf-8", "surrogateescape"), query.encode("utf-8", "surrogateescape"))
        if key is None:
            return 0
        self.cache.invalidate(key)
        return 1

    def after_fill(
        self,
        key: CacheKey,
        result: Page | OriginResponse | None,
        error: OriginError | None,
        stale: Page | None,
        method: str,
        request: RequestHeaders,
    ) -> tuple[Response | None, str]:
        """The crawler's answer once a fill is over, and its outcome; (None, "pass") means: ask the site live.

        Stale beats down: when the site failed, an L2 copy of any age is served.
        """
        if isinstance(error, PageTooLarge):
            return None, "pass"
        if isinstance(result, Page):
            return page_response(result, method, request, outcome=b"miss"), "miss"
        if error is not None or (result is not None and result.status >= 500):
            stale = stale or self.cache.stale_copy(key)
            if stale is not None:
                return page_response(stale, method, request, outcome=b"stale"), "stale"
        if result is not None:
            return (result.status, origin_headers(result), b"" if method == "HEAD" else result.body), "miss"
        status = 504 if isinstance(error, OriginTimeout) else 502
        return plain_response(status, b"The site did not answer.\n", outcome=b"miss"), "error"


def build_cache(settings: Settings, metrics: Metrics) -> TwoLevelCache:
    """L1 and L2 as the settings say: memcached when servers are given, else the embedded LRU."""
    l1: Store
    local_ttl_s = 0.0
    if settings.l1.memcached:
        local_ttl_s = settings.l1.local_ttl_ms / 1000
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
    return TwoLevelCache(l1, l2, metrics, local_ttl_s=local_ttl_s)


def origin_headers(response: OriginResponse) -> list[tuple[bytes, bytes]]:
    """A guest response's headers as sent on to a crawler that asked for an unstored page."""
    headers = [
        (name.encode("latin-1"), value.encode("latin-1"))
        for name, value in response.headers
        if name not in ("content-length", "transfer-encoding", "connection", "content-encoding")
    ]
    headers += [(b"content-length", b"%d" % len(response.body)), (b"x-crawlergate", b"miss")]
    return headers
