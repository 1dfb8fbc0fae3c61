"""GateCore: the gate's decisions, free of any server interface, shared by the ASGI and WSGI adapters.

Whitenoise's split: one framework-free engine, thin adapters. The core builds the components from
Settings (classifier, cache keys, the two cache levels, metrics) and answers the questions every
request asks: is it admin, too long, to pass, or a crawler's cacheable page; is a stored page still
fresh; may a response be stored and for how long.

    core = build_core(settings)   # crawlergate.wiring
    decision = core.decide("GET", "/t/1", b"/t/1", b"", headers)
"""

from __future__ import annotations

import dataclasses
import enum
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from crawlergate.cache import CacheHit, TwoLevelCache
from crawlergate.classify import HUMAN, Classifier, Verdict
from crawlergate.config import Settings
from crawlergate.devices import DeviceClasses, variant_key, varies_by_user_agent
from crawlergate.errors import OriginError, OriginTimeout
from crawlergate.gate.answer import Response, json_response, page_response, plain_response
from crawlergate.gate.dirty import IndexUnavailable, PageCatalogue
from crawlergate.gate.fillbudget import FillBudget
from crawlergate.gate.forwarded import TrustedProxies
from crawlergate.gate.origin import OriginResponse, PageTooLarge, PublicSite
from crawlergate.gate.storable import StoragePolicy, StoreVerdict
from crawlergate.gate.valve import OverloadValve
from crawlergate.gate.writes import WriteRules
from crawlergate.keys import CacheKey, KeyMaker
from crawlergate.page import Page
from crawlergate.suspect.judge import PERSON, Judge
from crawlergate.suspect.policy import Action

# Fills after which a stored copy of any age is better than what the site sent.
_FAILED_FILL = ("origin-error", "incomplete", "empty", "redirect-to-self")
# Answer headers that belong to the guest fill alone, never handed to a crawler.
_PER_RESPONSE_HEADERS = ("content-length", "transfer-encoding", "connection", "content-encoding", "set-cookie")


class Route(enum.Enum):
    """Which way a request goes."""

    ADMIN = "admin"  # the /_crawlergate/ endpoints
    TOO_LONG = "too-long"  # refused with 414
    PASS = "pass"  # to the site untouched
    PURGE = "purge"  # a site's HTTP PURGE: marks pages changed
    CACHE = "cache"  # a crawler's or suspect's cacheable GET/HEAD: answered from the cache
    DENY = "deny"  # refused with 403 by the policy table


class RequestHeaders:
    """The request headers the gate looks at, read in one pass over the raw (name, value) pairs."""

    __slots__ = (
        "user_agent",
        "cookie",
        "authorization",
        "accept_encoding",
        "if_none_match",
        "if_modified_since",
        "range",
        "if_range",
    )

    def __init__(self, headers: Iterable[tuple[bytes, bytes]]) -> None:
        self.user_agent = b""
        self.cookie = b""
        self.authorization = False
        self.accept_encoding = b""
        self.if_none_match = b""
        self.if_modified_since = b""
        self.range = b""
        self.if_range = b""
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
            elif name == b"range":
                self.range = value
            elif name == b"if-range":
                self.if_range = value


@dataclass(frozen=True, slots=True)
class NotStored:
    """A guest answer that was not stored, with the verdict that says why."""

    response: OriginResponse
    verdict: StoreVerdict

    def has(self, reason: str) -> bool:
        return any(label == reason for label, _ in self.verdict.reasons)


@dataclass(frozen=True, slots=True)
class Decision:
    """What the gate makes of one request."""

    route: Route
    verdict: Verdict
    key: CacheKey | None
    headers: RequestHeaders
    # The evidence (rule names) that made a suspect, for the access log.
    reasons: tuple[str, ...] = ()
    # The policy's cache-only: a miss is answered 503, the site untouched.
    cache_only: bool = False
    # The client's address when the judge needed it (a page a person may have asked for): its answer's
    # Set-Cookie is noted for it.
    client: str | None = None

    @property
    def kind(self) -> str:
        return self.verdict.kind


@dataclass(frozen=True, slots=True)
class NeedsFill:
    """The engine's answer to a crawler whose page is not fresh in the cache: fill its key now.

    ``stale`` is the stored copy, served when the fill fails ("stale beats down").
    """

    stale: Page | None


class GateCore:
    """The decisions and components of one gate (assembled from Settings by ``wiring.build_core``).

    Parameters:
        settings: all configuration.
        cache: the two cache levels; its metrics are the gate's.
        classifier: crawler or human.
        keys: URL to cache key, with the site profiles' rules.
        dirty: the marks of changed pages, beside L2.
        judge: evidence, verification and the policy table (crawlergate.suspect).
        valve: the crawler-only overload valve.
        writes: the write rules: the pages a successful unsafe request changes.
        devices: the device classes of pages that vary by user agent (rules/devices.toml).
        clock: wall-clock time (page ages are persisted in L2), injectable for tests.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        cache: TwoLevelCache,
        classifier: Classifier,
        keys: KeyMaker,
        dirty: PageCatalogue,
        judge: Judge,
        valve: OverloadValve,
        writes: WriteRules | None = None,
        devices: DeviceClasses | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.devices = devices or DeviceClasses(())
        self.metrics = cache.metrics
        self.cache = cache
        self.classifier = classifier
        self.keys = keys
        self.dirty = dirty
        self.writes = writes or WriteRules(())
        self.judge = judge
        self.valve = valve
        self._static_extensions = keys.rules.static_extensions
        self._retry_after = str(settings.policy.retry_after_seconds).encode()
        self._budgeted_tags = frozenset(settings.policy.suspect_fill_budget_tags)
        self.fill_budget = FillBudget(
            per_minute=settings.policy.suspect_fills_per_minute, burst=settings.policy.suspect_fill_burst
        )
        self._purgers = TrustedProxies(settings.admin.purgers)
        self._max_stale_s = settings.cache.max_stale_seconds
        self.storage = StoragePolicy(settings.cache, self.keys)
        self.trusted = TrustedProxies(settings.server.trusted_proxies)
        self.clock = clock
        # What starts and stops with the gate besides its stores (the admin dashboard's sampler, wired in wiring.py).
        self.on_start: list[Callable[[], object]] = []
        self.on_close: list[Callable[[], object]] = []
        # The site fills ask for: the public address, else the origin's own (nginx's $proxy_host); None when
        # mounted without public_url, where each fill takes the address its request arrived at.
        public_url = settings.server.public_url or settings.server.origin
        self.public = PublicSite.from_url(public_url) if public_url else None
        self._admin_prefix = settings.admin.prefix
        self._started = False
        self._start_lock = threading.Lock()
        # Figures of parts beside the engine (regeneration): the `stats` section, and Prometheus gauges and counters.
        self.more_stats: Callable[[], dict[str, object]] | None = None
        self.more_metrics: Callable[[], tuple[dict[str, float], dict[str, tuple[str, int]]]] | None = None

    def start(self) -> None:
        """Prepare the stores (create the L2 directory); raises ConfigError when it is unusable."""
        with self._start_lock:
            if not self._started:
                self.cache.start()
                self.dirty.on_replaced = self.cache.forget_local
                self.dirty.start()
                for start in self.on_start:
                    start()
                self._started = True

    def close(self) -> None:
        for close in self.on_close:
            close()
        self.cache.close()
        if self._started:
            self.dirty.flush_demand()
        self.dirty.close()

    def decide(
        self,
        method: str,
        path: str,
        raw_path: bytes,
        query: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        peer: str | None = None,
        scheme: str = "http",
    ) -> Decision:
        """Route one request: admin, too long, pass through, denied, or a crawler's (or suspect's) cacheable page.

        ``peer`` is the connection's address and ``scheme`` its scheme: the judge needs the client behind them.
        """
        if not self._started:
            self.start()  # first request of an app that ran no lifespan
        request = RequestHeaders(headers)
        if self.is_admin_path(path):
            return Decision(Route.ADMIN, HUMAN, None, request)
        if method == "PURGE":
            return Decision(Route.PURGE, HUMAN, None, request)
        if len(raw_path) + len(query) > self.settings.cache.max_target_chars:
            return Decision(Route.TOO_LONG, HUMAN, None, request)
        key = self.keys.key_for(raw_path, query) if method in ("GET", "HEAD") else None
        if (
            key is None
            and 3 * (len(raw_path) + len(query)) > self.settings.cache.max_target_chars
            and method in ("GET", "HEAD")
            and self.keys.too_long_once_normalised(raw_path, query)
        ):
            return Decision(Route.TOO_LONG, HUMAN, None, request)
        if request.authorization or (request.cookie and self.classifier.has_session_cookie(request.cookie)):
            return Decision(Route.PASS, HUMAN, key, request)  # a session: the live site, whatever the evidence
        verdict = self.classifier.classify(request.user_agent)
        judge = self.judge
        client = None
        if verdict.is_crawler:
            if judge.needs_client(verdict):
                client = self.trusted.client(peer, headers)
                judgement = judge.claimant(verdict, client)
            else:
                judgement = judge.judged(verdict)
        elif key is not None and judge.rules is not None:
            client = self.trusted.client(peer, headers)
            judgement = judge.visitor(
                request.user_agent, headers, client, scheme=scheme, proxied=peer in self.trusted, deep=path != "/"
            )
            if judgement is PERSON:
                return Decision(Route.PASS, HUMAN, key, request, client=client)
        else:
            if judge.sketch is not None and method == "GET":
                static = path.lower().endswith(self._static_extensions)
                judge.asset(headers, static, self.trusted.client(peer, headers))
            return Decision(Route.PASS, HUMAN, key, request)
        action = judgement.action
        verdict = judgement.verdict
        if action is Action.DENY:
            return Decision(Route.DENY, verdict, key, request, judgement.reasons)
        if key is None or action is Action.LIVE:
            if key is None and method in ("GET", "HEAD"):
                self.metrics.count_not_stored("excluded")
            return Decision(Route.PASS, verdict, key, request, judgement.reasons)
        # The address of a suspect whose misses are budgeted (FillBudget).
        client = client if verdict.kind == "suspect" and verdict.tag in self._budgeted_tags else None
        return Decision(Route.CACHE, verdict, key, request, judgement.reasons, action is Action.CACHE_ONLY, client)

    def is_admin_path(self, path: str) -> bool:
        return path == self._admin_prefix or path.startswith(self._admin_prefix + "/")

    def client_address(self, peer: str | None, headers: Iterable[tuple[bytes, bytes]]) -> str | None:
        """The visitor's address: the peer, or whom a trusted proxy forwards for."""
        return self.trusted.client(peer, headers)

    def should_prefetch(self, decision: Decision, status: int) -> bool:
        """A human's successful view of a page that L2 holds (the index answers; no disk access)."""
        key = decision.key
        return (
            decision.route is Route.PASS
            and key is not None
            and status == 200
            and decision.verdict.kind == "human"
            and self.cache.l2.contains(key.digest)
        )

    def serve_or_fill(self, key: CacheKey, found: CacheHit | None, now: float) -> CacheHit | NeedsFill:
        """A crawler's cached page to serve, or the instruction to fill its key (with the copy to fall back on).

        FRESH: neither marked changed nor past its lifetime: served. DIRTY: marked changed, or past its
        lifetime, for no longer than ``cache.max_stale_seconds``: still served, as the paper's crawlers
        get the stored copy until the off-peak run regenerates it. Staler than that: filled now.
        """
        if found is None:
            return NeedsFill(None)
        page = found.page
        marked = self.dirty.dirty_since(key.digest)
        shared = found.marked_at
        # A mark another machine left beside the page in memcached counts while the page predates it.
        if shared is not None and shared > page.generated_at and (marked is None or shared < marked):
            marked = shared
        if marked is None and not page.is_expired(now):
            return found
        stale_since = page.expires_at if marked is None else min(marked, page.expires_at)
        if now - stale_since <= self._max_stale_s:
            return found
        return NeedsFill(page)

    def spare_site(
        self, decision: Decision, stale: Page | None, method: str, request: RequestHeaders
    ) -> tuple[Response, str] | None:
        """Before a crawler's fill: the answer to give instead when the site must be spared (a cache-only policy, the
        overload valve, a suspect's spent fill budget), with its outcome; None: fill. A stored copy of any age is
        served before a 503."""
        if decision.cache_only:
            by = "cache-only"
        elif self.valve.shedding():
            by = "valve"
        elif decision.client is not None and not self.fill_budget.take(decision.client, time.monotonic()):
            by = "fill-budget"  # taken last: a token is spent only on a fill that would happen
        else:
            return None
        if stale is not None:
            return page_response(stale, method, request, outcome=b"stale", now=self.clock()), "stale"
        self.metrics.count(f"refused|{by}")
        message = b"The site is busy.\n" if by == "valve" else b"Not stored yet; please come back later.\n"
        return plain_response(503, message, outcome=b"miss", retry_after=self._retry_after), "refused"

    def deny(self) -> Response:
        """The policy's 403."""
        return plain_response(403, b"This site does not serve this client.\n", outcome=b"deny")

    def note_demand(self, key: CacheKey, now: float) -> bool:
        """Count a crawler's request for ``key``; True when the dirty index's upkeep is due (``dirty.upkeep``, to be
        run off the event loop)."""
        self.dirty.count_demand(key.digest)
        return self.dirty.upkeep_due(now)

    def store(self, key: CacheKey, page: Page, fetched_at: float | None = None) -> None:
        """Keep a filled page in both levels and in the catalogue of the dirty index: no longer dirty,
        unless marked after ``fetched_at``, when its fill began."""
        self.cache.store(key, page)
        self.dirty.record_stored(key.digest, key.target, fetched_at)

    def judge_fill(
        self, key: CacheKey, response: OriginResponse, previous: Page | None = None, generation_ms: float = 0.0
    ) -> Page | NotStored:
        """The Page to store for a guest answer, or the answer with every reason it is not stored (counted).

        ``generation_ms`` is how long the site took to answer: kept with the page for the origin time hits save.

        A page with the same body as ``previous``, the copy it replaces, keeps its Last-Modified (its ETag is
        the body's hash): a crawler's conditional request still gets 304.
        """
        now = self.clock()
        verdict = self.storage.judge(response, key.target, now=now)
        if verdict.storable:
            page = self.storage.page(response, verdict, now=now, generation_ms=generation_ms)
            if previous is not None and previous.etag == page.etag and previous.last_modified < page.last_modified:
                page = dataclasses.replace(page, last_modified=previous.last_modified)
            return page
        for label in dict.fromkeys(label for label, _ in verdict.reasons):
            self.metrics.count_not_stored(label)
        return NotStored(response, verdict)

    def stats(self) -> dict[str, object]:
        data = self.metrics.snapshot()
        data["valve"] = {**self.valve.status(), "refused": data.pop("refused")}
        data["evidence"] = {
            **data["evidence"],
            "verified_claimants": self.judge.verified_claimants(data["families"]),
            **self.judge.status(),
        }
        data["dirty"] = self.dirty_count()
        data.update(self.cache.usage())
        if self.more_stats is not None:
            data.update(self.more_stats())
        return data

    def dirty_count(self) -> int:
        """Marked pages the cache still holds (an evicted page's mark stays in the index until it returns); a
        page another worker stored may not be in this worker's L2 index yet: its file says."""
        self.dirty.refresh(wait=False)
        l2 = self.cache.l2
        return sum(1 for digest in self.dirty.dirty_digests() if l2.contains(digest) or l2.path_for(digest).exists())

    def prometheus(self) -> str:
        gauges: dict[str, float] = {
            "crawlergate_l2_pages": len(self.cache.l2),
            "crawlergate_l2_bytes": self.cache.l2.used_bytes,
            "crawlergate_dirty_pages": self.dirty_count(),
            # This process's: the valve is per process, as its count of requests in flight is.
            "crawlergate_valve_shedding": float(self.valve.shedding()),
            "crawlergate_origin_in_flight": self.valve.in_flight,
        }
        counters: dict[str, tuple[str, int]] = {}
        if self.more_metrics is not None:
            more_gauges, counters = self.more_metrics()
            gauges |= more_gauges
        return self.metrics.prometheus(gauges, counters)

    def mark_changed(self, url_or_pattern: str, reason: str = "api") -> int:
        """Mark stored pages changed: crawlers keep the stored copy until it is regenerated (or too stale).

        ``url_or_pattern`` is a path with its query (``/showthread.php?t=12``), or a pattern where ``*``
        matches any run of characters (``/showthread.php?t=12*``). Returns the pages marked.
        """
        if "*" in url_or_pattern:
            return self.invalidate([], [url_or_pattern], reason)
        return self.invalidate([url_or_pattern], [], reason)

    def variant_for(self, key: CacheKey, page: Page | None, request: RequestHeaders) -> CacheKey | None:
        """The key of the requester's device copy when ``page`` (the copy under ``key``) varies by user agent
        and the requester is no desktop; else None, and ``key`` is the one (rules/devices.toml)."""
        if page is None or not page.headers or not varies_by_user_agent(page.headers) or "#" in key.target:
            return None
        device = self.devices.of(request.user_agent)
        return None if device is None else variant_key(key, device)

    def _with_variants(self, keys: Iterable[CacheKey]) -> dict[str, None]:
        """The digests of ``keys`` and of their device copies (only stored ones are marked)."""
        digests: dict[str, None] = {}
        for key in keys:
            digests[key.digest] = None
            digests.update(dict.fromkeys(variant_key(key, device).digest for device in self.devices.classes))
        return digests

    def _own_location(self, location: bytes | str) -> str:
        """The path and query of a Location on this site (relative, or the public host's); else empty."""
        text = location.decode("latin-1") if isinstance(location, bytes) else location
        parts = urlsplit(text.strip())
        if not parts.path.startswith("/") and not parts.netloc:
            return ""
        if parts.netloc and (self.public is None or parts.netloc.lower() != self.public.host.lower()):
            return ""
        return (parts.path or "/") + ("?" + parts.query if parts.query else "")

    def _redirect_targets(self, keys: list[CacheKey]) -> list[CacheKey]:
        """The pages that stored permanent redirects among ``keys`` lead to, one hop, on this site.

        A site names a changed page by a URL that redirects to it: WordPress's comment form names its
        post as /?p=ID, a 301 to the permalink crawlers index; the permalink changed too.
        """
        targets = []
        for key in keys:
            page = self.cache.stale_copy(key)
            if page is None or page.status not in (301, 308):
                continue
            location = self._own_location(next((value for name, value in page.headers if name == "location"), ""))
            target = self.key_for_url(location) if location else None
            if target is not None and target != key:
                targets.append(target)
        return targets

    def invalidate(self, urls: list[str], patterns: list[str], reason: str = "api") -> int:
        """Mark the stored pages of ``urls`` and those matching ``patterns`` changed; returns how many, once each."""
        keys = [key for key in map(self.key_for_url, urls) if key is not None]
        digests = self._with_variants([*keys, *self._redirect_targets(keys)])
        for pattern in patterns:
            digests.update(dict.fromkeys(self.dirty.matching(pattern)))
        return self._mark(list(digests), reason)

    def _mark(self, digests: list[str], reason: str) -> int:
        """Mark pages in this machine's dirty index, and beside them in a shared memcached L1 for the others."""
        marked = self.dirty.mark(digests, reason)
        if digests:
            self.cache.share_marks(digests, self.clock(), self._max_stale_s + self.settings.cache.ttl_seconds)
        return marked

    def purge(
        self, peer: str | None, headers: Iterable[tuple[bytes, bytes]], raw_path: bytes, query: bytes
    ) -> Response:
        """Answer a site's HTTP PURGE: mark the URL's page changed (or, with ``X-Purge-Method: regex``, every
        stored page whose /path?query the URL's path and query match as a regular expression, as WordPress's
        Proxy Cache Purge sends them). Only from ``admin.purgers``; it reads SQLite: call it off the event loop.
        """
        client = self.client_address(peer, headers)
        if client is None or client not in self._purgers:
            return plain_response(403, b"PURGE is not allowed from this address.\n", outcome=b"pass")
        regex = any(name == b"x-purge-method" and value.strip().lower() == b"regex" for name, value in headers)
        try:
            if regex:
                target = raw_path.decode("latin-1") + ("?" + query.decode("latin-1") if query else "")
                marked = self._mark(self.dirty.matching_regex(unquote(target)), "purge")
            else:
                key = self.keys.key_for(raw_path, query)  # the bytes as they came: no second encoding
                marked = 0 if key is None else self._mark(list(self._with_variants([key])), "purge")
        except re.error:
            message = b"X-Purge-Method: regex, but the URL is no regular expression.\n"
            return plain_response(400, message, outcome=b"pass")
        except IndexUnavailable as exc:
            return plain_response(503, f"{exc}\n".encode(), outcome=b"pass", retry_after=b"5")
        return json_response(200, {"marked": marked}, indent=None)

    def after_write(
        self, method: str, path: str, query: bytes, form: dict[str, str] | None, location: bytes = b""
    ) -> int:
        """Mark the pages a successful unsafe request changed, by the write rules; returns how many.

        ``location`` is the answer's Location header: a rule may mark the page it names, on this site.
        """
        urls, patterns = self.writes.marks(method, path, query, form, self._own_location(location))
        return self.invalidate(urls, patterns, "write-rule") if urls or patterns else 0

    def key_for_url(self, url: str) -> CacheKey | None:
        """The cache key of a path with its query (an absolute URL's host is ignored), as a request would have."""
        if url.startswith(("http://", "https://")):
            parts = urlsplit(url)
            url = (parts.path or "/") + ("?" + parts.query if parts.query else "")
        raw_path, _, query = url.partition("?")
        return self.keys.key_for(raw_path.encode("utf-8", "surrogateescape"), query.encode("utf-8", "surrogateescape"))

    def after_fill(
        self,
        key: CacheKey,
        result: Page | NotStored | None,
        error: OriginError | None,
        stale: Page | None,
        method: str,
        request: RequestHeaders,
    ) -> tuple[Response | None, str]:
        """The crawler's answer once a fill is over, and its outcome; (None, "pass") means: ask the site live.

        Stale beats down: when the site failed, or sent half a page, an L2 copy of any age is served.
        A redirect to the URL itself is never handed to a crawler from a fill: the live site answers
        the crawler's own request, which carries its real scheme.
        """
        if isinstance(error, PageTooLarge):
            return None, "pass"
        if isinstance(result, Page):
            return page_response(result, method, request, outcome=b"miss"), "miss"
        if result is None or any(result.has(reason) for reason in _FAILED_FILL):
            stale = stale or self.cache.stale_copy(key)
            if stale is not None:
                return page_response(stale, method, request, outcome=b"stale", now=self.clock()), "stale"
        if result is None or result.has("incomplete"):
            status = 504 if isinstance(error, OriginTimeout) else 502
            return plain_response(status, b"The site did not answer.\n", outcome=b"miss"), "error"
        if result.has("redirect-to-self"):
            return None, "pass"
        response = result.response
        return (response.status, origin_headers(response), b"" if method == "HEAD" else response.body), "miss"


def origin_headers(response: OriginResponse) -> list[tuple[bytes, bytes]]:
    """A guest response's headers as sent on to a crawler that asked for an unstored page (no cookies)."""
    headers = [
        (name.encode("latin-1"), value.encode("latin-1"))
        for name, value in response.headers
        if name not in _PER_RESPONSE_HEADERS
    ]
    headers += [(b"content-length", b"%d" % len(response.body)), (b"x-crawlergate", b"miss")]
    return headers
