"""GateCore: the gate's decisions about one request, free of any server interface.

Whitenoise's split: one framework-free engine, thin adapters. The core holds the components
(classifier, judge, cache keys, the two cache levels, the page catalogue, the valve) and answers the
questions every request asks: is it admin, too long, to pass, denied, or a crawler's cacheable page;
is a stored page still fresh or must it be filled; must the site be spared a fill. The sequence that
asks them is ``gate/flow.py``; filling is ``gate/fill.py``, marking pages changed ``gate/invalidate.py``.

    core = build_core(settings)   # crawlergate.wiring
    decision = core.decide(Request("GET", "/t/1", b"/t/1", b"", headers))
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from crawlergate.cache import CacheHit, TwoLevelCache
from crawlergate.classify import HUMAN, Classifier
from crawlergate.config import Settings
from crawlergate.devices import DeviceClasses, variant_key, varies_by_user_agent
from crawlergate.gate.answer import Response, page_response, plain_response
from crawlergate.gate.catalogue import PageCatalogue
from crawlergate.gate.fillbudget import FillBudget
from crawlergate.gate.forwarded import TrustedProxies
from crawlergate.gate.origin import PublicSite
from crawlergate.gate.relearn import Relearning
from crawlergate.gate.request import Decision, Request, RequestHeaders, Route
from crawlergate.gate.valve import OverloadValve
from crawlergate.gate.writes import WriteRules
from crawlergate.keys import CacheKey, KeyMaker
from crawlergate.page import Page
from crawlergate.stores.published import PublishedTree, drop_published
from crawlergate.suspect.judge import PERSON, Judge
from crawlergate.suspect.policy import Action

logger = logging.getLogger(__name__)


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
        catalogue: the stored pages and the marks of changed ones, beside L2.
        judge: evidence, verification and the policy table (crawlergate.suspect).
        valve: the crawler-only overload valve.
        writes: the write rules: the pages a successful unsafe request changes.
        devices: the device classes of pages that vary by user agent (rules/devices.toml).
        clock: wall-clock time (page ages are persisted in L2), injectable for tests.
        published: the tree a front server answers announced crawlers from (``front.publish``), or None.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        cache: TwoLevelCache,
        classifier: Classifier,
        keys: KeyMaker,
        catalogue: PageCatalogue,
        judge: Judge,
        valve: OverloadValve,
        writes: WriteRules | None = None,
        devices: DeviceClasses | None = None,
        clock: Callable[[], float] = time.time,
        published: PublishedTree | None = None,
    ) -> None:
        self.settings = settings
        self.published = published
        self.devices = devices or DeviceClasses(())
        self.metrics = cache.metrics
        self.cache = cache
        self.classifier = classifier
        self.keys = keys
        self.catalogue = catalogue
        self.writes = writes or WriteRules(())
        self.judge = judge
        self.valve = valve
        self._static_extensions = keys.rules.static_extensions
        self._retry_after = str(settings.policy.retry_after_seconds).encode()
        self._budgeted_tags = frozenset(settings.policy.suspect_fill_budget_tags)
        self.fill_budget = FillBudget(
            per_minute=settings.policy.suspect_fills_per_minute, burst=settings.policy.suspect_fill_burst
        )
        self._max_stale_s = settings.cache.max_stale_seconds
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
        self._max_target_chars = settings.cache.max_target_chars
        self._started = False
        self._start_lock = threading.Lock()
        # Told the pages L2 holds when the catalogue began anew (gate/relearn.py).
        self.relearning: Relearning | None = None

    def start(self) -> None:
        """Prepare the stores (create the L2 directory); raises ConfigError when it is unusable."""
        with self._start_lock:
            if not self._started:
                if self.published is None:
                    drop_published(self.cache.l2.root)
                elif self.settings.l1.memcached:
                    logger.warning(
                        "front.publish with a shared memcached L1: a page marked changed on another machine leaves "
                        "this machine's published tree only when it expires; send marks (PURGE, invalidate) to "
                        "every machine."
                    )
                self.cache.start()
                self.catalogue.on_replaced = self.cache.forget_local
                self.cache.l2.on_removed = self.catalogue.forget
                self.catalogue.in_l2 = self.cache.l2.has_file
                self.catalogue.start()
                if not self.catalogue.knows_stored_pages():
                    self.relearning = Relearning(self.cache.l2, self.catalogue)
                    self.relearning.start()
                if self.published is not None:
                    self.published.start(self.catalogue.dirty_digests)
                for start in self.on_start:
                    start()
                self._started = True

    def close(self) -> None:
        for close in self.on_close:
            close()
        self.judge.close()
        if self.relearning is not None:
            self.relearning.close()
        if self.published is not None:
            self.published.close()
        self.cache.close()
        if self._started:
            self.catalogue.flush_demand()
            self.catalogue.flush_gone()
        self.catalogue.close()

    def decide(self, incoming: Request) -> Decision:
        """Route one request: admin, too long, pass through, denied, or a crawler's (or suspect's) cacheable page.

        The judge needs the client behind the connection's address (``peer``) and its ``scheme``.
        """
        if not self._started:
            self.start()  # first request of an app that ran no lifespan
        method, path, raw_path, query = incoming.method, incoming.path, incoming.raw_path, incoming.query
        headers, peer = incoming.headers, incoming.peer
        request = RequestHeaders(headers)
        if path.startswith(self._admin_prefix) and self.is_admin_path(path):
            return Decision(Route.ADMIN, HUMAN, None, request)
        if method == "PURGE":
            return Decision(Route.PURGE, HUMAN, None, request)
        length = len(raw_path) + len(query)
        if length > self._max_target_chars:
            return Decision(Route.TOO_LONG, HUMAN, None, request)
        key = self.keys.key_for(raw_path, query) if method in ("GET", "HEAD") else None
        if (
            key is None
            and 3 * length > self._max_target_chars
            and method in ("GET", "HEAD")
            and self.keys.too_long_once_normalised(raw_path, query)
        ):
            return Decision(Route.TOO_LONG, HUMAN, None, request)
        if request.authorization or (request.cookie and self.classifier.has_session_cookie(request.cookie)):
            return Decision(Route.PASS, HUMAN, key, request)  # a session: the live site, whatever the evidence
        verdict = self.classifier.classify(request.user_agent)
        judge = self.judge
        client = None
        signed = None
        if request.signed:  # a valid signature outweighs the user agent; an invalid one makes a suspect
            client = self.trusted.client(peer, headers)
            signed = judge.signed_agent(method, raw_path + b"?" + query if query else raw_path, headers, client)
        if signed is not None:
            judgement = signed
        elif verdict.is_crawler:
            if judge.needs_client(verdict):
                client = self.trusted.client(peer, headers)
                judgement = judge.claimant(verdict, client)
            else:
                judgement = judge.judged(verdict)
        elif key is not None and judge.rules is not None:
            client = self.trusted.client(peer, headers)
            proxied = peer in self.trusted
            judgement = judge.visitor(
                request.user_agent, headers, client, scheme=incoming.scheme, proxied=proxied, deep=path != "/"
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

    def should_prefetch(self, decision: Decision, status: int) -> bool:
        """A human's successful view of a cacheable page (whether L2 holds it, the prefetch asks off the loop)."""
        key = decision.key
        return decision.route is Route.PASS and key is not None and status == 200 and decision.verdict.kind == "human"

    def serve_or_fill(self, key: CacheKey, found: CacheHit | None, now: float) -> CacheHit | NeedsFill:
        """A crawler's cached page to serve, or the instruction to fill its key (with the copy to fall back on).

        FRESH: neither marked changed nor past its lifetime: served. DIRTY: marked changed, or past its
        lifetime, for no longer than ``cache.max_stale_seconds``: still served, as the paper's crawlers
        get the stored copy until the off-peak run regenerates it. Staler than that: filled now.
        """
        if found is None:
            return NeedsFill(None)
        page = found.page
        marked = self.catalogue.dirty_since(key.digest)
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
        self, decision: Decision, key: CacheKey, stale: Page | None, method: str, request: RequestHeaders
    ) -> tuple[Response, str] | None:
        """Before a crawler's fill of ``key``: the answer to give instead when the site must be spared (a cache-only
        policy, the overload valve, a suspect's spent fill budget), with its outcome; None: fill (the valve counts it
        in flight from now). A stored copy of any age is served before a 503."""
        if decision.cache_only:
            by = "cache-only"
        elif not self.valve.let_through(key.digest):
            by = "valve"
        elif decision.client is not None and not self.fill_budget.take(decision.client, time.monotonic()):
            self.valve.withdrawn(key.digest)
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
        """Count a crawler's request for ``key``; True when the page catalogue's upkeep is due
        (``catalogue.upkeep``, to be run off the event loop)."""
        self.catalogue.count_demand(key.digest)
        return self.catalogue.upkeep_due(now)

    def variant_for(self, key: CacheKey, page: Page | None, request: RequestHeaders) -> CacheKey | None:
        """The key of the requester's device copy when ``page`` (the copy under ``key``) varies by user agent
        and the requester is no desktop; else None, and ``key`` is the one (rules/devices.toml)."""
        if page is None or not page.headers or not varies_by_user_agent(page.headers) or "#" in key.target:
            return None
        device = self.devices.of(request.user_agent)
        return None if device is None else variant_key(key, device)
