"""Building a gate from Settings: the one place its components are assembled, started and closed.

The adapters (ASGI and WSGI middleware, the proxy, ``serve``), the demo and the command line all
build their gate here, as one ``GateRuntime`` (uvicorn's ``Config`` shape: built once, handed to
whoever runs it), so a setting means the same thing however the gate runs, and every path starts
and closes the same parts in the same order.

    runtime = GateRuntime(load_settings("crawlergate.toml"), fetch_for_regeneration=origin_fetch)
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from crawlergate.admin.dashboard import Dashboard
from crawlergate.admin.endpoints import AdminEndpoints
from crawlergate.admin.figures import GateFigures
from crawlergate.cache import TwoLevelCache
from crawlergate.classify import Classifier
from crawlergate.config import Settings, default_cache_root
from crawlergate.devices import DEVICES_FILE, load_device_classes
from crawlergate.errors import ConfigError
from crawlergate.front.directlog import DirectLog
from crawlergate.gate.accesslog import AccessLog
from crawlergate.gate.catalogue import PageCatalogue
from crawlergate.gate.engine import GateCore
from crawlergate.gate.fill import Filler
from crawlergate.gate.flow import CrawlerFlow
from crawlergate.gate.invalidate import Invalidation
from crawlergate.gate.origin import OriginResponse
from crawlergate.gate.storable import StoragePolicy
from crawlergate.gate.valve import OverloadValve
from crawlergate.gate.writes import WriteRules
from crawlergate.keys import CacheKey, KeyMaker
from crawlergate.metrics import Metrics
from crawlergate.regenerate.lease import Lease
from crawlergate.regenerate.regenerator import Regenerator
from crawlergate.regenerate.schedule import OffPeakJob, Scheduler
from crawlergate.regenerate.state import RegenerationState
from crawlergate.regenerate.window import Window
from crawlergate.rules import load_site_profiles, rules_folder
from crawlergate.stores.base import Store
from crawlergate.stores.disk import DiskStore
from crawlergate.stores.memcached import MemcachedStore
from crawlergate.stores.memory import MemoryStore
from crawlergate.stores.owner import FolderOwner, app_identity, claim_folder, site_folder, warn_of_shared_folder
from crawlergate.stores.published import PublishedTree, host_folder
from crawlergate.suspect.judge import Judge

# The page catalogue lives beside the L2 pages (a name no page file can have; it was once the dirty index),
# and so does serve's access log.
DIRTY_INDEX_FILE = "dirty.sqlite3"
ACCESS_LOG_FILE = "access.log"
# Held by the one process of a gate that reads the front server's log of direct hits.
DIRECT_LOG_LOCK = ".direct-log.lock"
# How long the catalogue's demand upkeep waits for the filled pages on their way to it.
DEMAND_FLUSH_WAIT_S = 2.0
# How long shutdown waits for the off-peak job's tick under way (a lookup of the lease and the window) to end.
TICK_WAIT_S = 5.0

logger = logging.getLogger(__name__)


def access_log_path(settings: Settings, *, standalone: bool) -> Path | None:
    """Where the access log goes: ``log.access_log``, or beside L2 for ``serve`` (``standalone``); None when off
    (the middlewares' default)."""
    configured = settings.log.access_log
    if configured == "off" or (not configured and not standalone):
        return None
    return Path(configured) if configured else settings.cache_dir / ACCESS_LOG_FILE


def build_access_log(core: GateCore, *, standalone: bool) -> AccessLog | None:
    """The access log of a gate, or None when it is off."""
    settings = core.settings
    path = access_log_path(settings, standalone=standalone)
    if path is None:
        return None
    return AccessLog(
        path,
        client_of=core.trusted.client,
        max_bytes=settings.log.access_max_bytes,
        backups=settings.log.access_backups,
    )


def build_core(
    settings: Settings,
    *,
    cache: TwoLevelCache | None = None,
    classifier: Classifier | None = None,
    clock: Callable[[], float] = time.time,
) -> GateCore:
    """A gate's decisions and components; ``cache`` and ``classifier`` when given are shared, not built."""
    profiles = load_site_profiles(settings.classify.rules_dir, settings.cache.sites)
    classifier = classifier or Classifier.from_settings(
        settings.classify, extra_session_cookies=[name for profile in profiles for name in profile.session_cookies]
    )
    cache = cache if cache is not None else build_cache(settings, Metrics(settings.metrics.shared_dir or None))
    families = (family.name for family in classifier.ruleset.families)
    published = None
    if settings.front.publish:
        published = PublishedTree(cache.l2, host=host_folder(settings.site_url), clock=clock)
    return GateCore(
        settings,
        cache=cache,
        classifier=classifier,
        keys=KeyMaker.from_settings(settings, profiles),
        catalogue=PageCatalogue(settings.cache_dir / DIRTY_INDEX_FILE, clock=clock),
        judge=Judge.from_settings(settings, cache.metrics, families),
        valve=OverloadValve(settings.valve),
        writes=WriteRules(rule for profile in profiles for rule in profile.writes),
        devices=load_device_classes(rules_folder(settings.classify.rules_dir) / DEVICES_FILE),
        clock=clock,
        published=published,
    )


def build_admin(core: GateCore, figures: GateFigures, invalidation: Invalidation) -> AdminEndpoints:
    """The admin endpoints and dashboard of a gate (its stats, metrics and invalidate), started and stopped with it."""
    settings = core.settings
    dashboard = Dashboard(core.metrics, prefix=settings.admin.prefix)
    core.on_start.append(dashboard.start)
    core.on_close.append(dashboard.stop)
    return AdminEndpoints(
        prefix=settings.admin.prefix,
        token=settings.admin.token,
        stats=figures.stats,
        prometheus=figures.prometheus,
        invalidate=invalidation.invalidate,
        trusted_proxies=settings.server.trusted_proxies,
        dashboard=dashboard,
    )


def build_filler(core: GateCore) -> Filler:
    """The filler of a gate: its cache, catalogue, storable rules and valve."""
    return Filler(
        core.cache,
        core.catalogue,
        StoragePolicy(core.settings.cache, core.keys),
        core.valve,
        clock=core.clock,
        timeout_s=core.settings.cache.fill_timeout_seconds,
        published=core.published,
    )


def build_invalidation(core: GateCore, filler: Filler) -> Invalidation:
    """What marks a gate's pages changed: the API, PURGE and the write rules (after the filled pages on their way
    to the catalogue are in it)."""
    return Invalidation(
        core.settings,
        keys=core.keys,
        catalogue=core.catalogue,
        cache=core.cache,
        devices=core.devices,
        writes=core.writes,
        public=core.public,
        clock=core.clock,
        published=core.published,
        flush_fills=filler.writer.flush,
    )


def build_regeneration(
    core: GateCore,
    filler: Filler,
    fetch: Callable[[CacheKey], Awaitable[OriginResponse]],
    *,
    clock: Callable[[], float] = time.time,
) -> OffPeakJob:
    """A gate's regeneration: the pass, its records, the window and the lease; its figures join the gate's stats."""
    settings = core.settings
    state = RegenerationState(settings.cache_dir / DIRTY_INDEX_FILE, clock=clock)
    regenerator = Regenerator(core, filler, fetch, state, settings.regenerate)
    # A lease outlives the longest pass: the window, then the fetches under way when it closed.
    lease_s = settings.regenerate.max_seconds + settings.cache.fill_timeout_seconds + 60
    lease = Lease(state, core.cache.l1, ttl_s=lease_s)
    job = OffPeakJob(
        regenerator,
        state,
        Window(settings.regenerate, state, clock=clock),
        lease,
        core.metrics,
        clock=clock,
    )
    return job


def with_own_folder(settings: Settings, owner: FolderOwner) -> Settings:
    """``settings`` with a middleware's own cache folder and memcached namespace filled in, when they were left
    to their defaults and the site has no URL to derive them from (``Settings.cache_dir`` does it then)."""
    if not owner.app:
        return settings
    if not settings.l2.cache_dir:
        folder = site_folder(default_cache_root() / "crawlergate", owner)
        settings = dataclasses.replace(settings, l2=dataclasses.replace(settings.l2, cache_dir=str(folder)))
    if settings.l1.memcached and not settings.l1.namespace:
        # The app and its folder: two deployments of one app with folders of their own (staging and production
        # on one machine) never share memcached pages, and those sharing a folder share its pages anyway.
        folder = settings.cache_dir.expanduser().resolve()
        namespace = hashlib.blake2b(f"{owner.app}\0{folder}".encode(), digest_size=5).hexdigest()
        settings = dataclasses.replace(settings, l1=dataclasses.replace(settings.l1, namespace=namespace))
        logger.warning(
            "l1.memcached without server.public_url or l1.namespace: its keys are this app's and its L2 folder's "
            "(%s), so a deployment of the same app with a folder at the same path on another machine shares its "
            "pages. Set server.public_url (or l1.namespace) in each.",
            folder,
        )
    return settings


def _claim_again(folder: Path, owner: FolderOwner) -> None:
    """The folder was removed under the gate, which makes it again: its marker back (another site's gate may have
    claimed it meanwhile: then this one's pages go on, and the next start says whose it is)."""
    try:
        claim_folder(folder, owner)
    except (ConfigError, OSError) as exc:
        logger.warning("the cache folder %s was removed and made again, but not claimed: %s", folder, exc)


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
            namespace=settings.l1_namespace,
        )
    else:
        l1 = MemoryStore(settings.l1.max_bytes, item_max_bytes=settings.l1.item_max_bytes)
    l2 = DiskStore(Path(settings.cache_dir), max_bytes=settings.l2.max_bytes, page_max_bytes=settings.l2.page_max_bytes)
    return TwoLevelCache(l1, l2, metrics, local_ttl_s=local_ttl_s)


class GateRuntime:
    """One gate's parts, built once from Settings, started and closed in one order by whoever runs the gate.

    Parameters:
        settings: all configuration.
        fetch_for_regeneration: a regeneration's guest sub-request (the adapter's origin, no visitor).
        cache, classifier: shared ready parts (tests, or several gates on one cache); built if None.
        clock: wall-clock time, injectable for tests.
        standalone: the gate is the server (``serve``): its access log is on unless ``log.access_log`` is "off".
        app: the application a middleware wraps: without a public URL in the settings, it names the default
            cache folder and memcached namespace, so two apps on one machine never share pages.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        fetch_for_regeneration: Callable[[CacheKey], Awaitable[OriginResponse]],
        cache: TwoLevelCache | None = None,
        classifier: Classifier | None = None,
        clock: Callable[[], float] = time.time,
        standalone: bool = False,
        app: object = None,
    ) -> None:
        owner = settings.folder_owner(app_identity(app) if app is not None else "")
        if not settings.l2.cache_dir:
            warn_of_shared_folder(default_cache_root() / "crawlergate", DIRTY_INDEX_FILE)
        settings = with_own_folder(settings, owner)
        if cache is None:
            claim_folder(settings.cache_dir, owner)
        self.settings = settings
        self.core = build_core(settings, cache=cache, classifier=classifier, clock=clock)
        if cache is None:
            self.core.cache.l2.on_folder_made = functools.partial(_claim_again, settings.cache_dir, owner)
        self.filler = build_filler(self.core)
        self.core.catalogue.before_demand = functools.partial(self.filler.writer.flush, DEMAND_FLUSH_WAIT_S)
        self.invalidation = build_invalidation(self.core, self.filler)
        self.access_log = build_access_log(self.core, standalone=standalone)
        self.flow = CrawlerFlow(self.core, self.invalidation, self.access_log)
        self.regeneration = build_regeneration(self.core, self.filler, fetch_for_regeneration, clock=clock)
        self.figures = GateFigures(self.core, regeneration=self.regeneration, flush_fills=self.filler.writer.flush)
        self.admin = build_admin(self.core, self.figures, self.invalidation)
        if settings.front.direct_log:
            direct = DirectLog(
                Path(settings.front.direct_log),
                self.core.classifier,
                self.core.metrics,
                lock=settings.cache_dir / DIRECT_LOG_LOCK,
            )
            self.core.on_start.append(direct.start)
            self.core.on_close.append(direct.close)
        elif settings.front.publish:
            logger.warning(
                "front.publish without front.direct_log: the front server's direct hits are not counted (stats, the "
                "dashboard, the hit ratio). Set front.direct_log to the log its include writes."
            )
        self.scheduler: Scheduler | None = None
        # What the adapter opened beside the parts (the proxy's origin connections), closed first.
        self.async_closers: list[Callable[[], Awaitable[None]]] = []

    def start(self, *, access_log: bool = True) -> None:
        """Prepare the stores (create the L2 directory) and open the access log (unless ``access_log`` is False:
        a WSGI gate opens it at its first request, after a pre-forking server forked); raises ConfigError when one
        is unusable. Starting twice is harmless."""
        if access_log and self.access_log is not None:
            self.access_log.start()
        self.core.start()

    def start_schedule(self, start_scheduler: Callable[[OffPeakJob], Scheduler]) -> None:
        """Start the parts, and the off-peak job when regeneration is on (with the adapter's scheduler)."""
        self.start()
        if self.settings.regenerate.enabled and self.scheduler is None:
            self.scheduler = start_scheduler(self.regeneration)

    async def aclose(self, *, drain: Callable[[], Awaitable[None]] | None = None) -> None:
        """Stop the off-peak job (a pass under way stops between pages: marks stay until a page's new copy is
        stored), let the adapter ``drain`` its background work (it still needs the stores), close what the
        adapter opened, then every part."""
        self.regeneration.stop()
        self._stop_scheduler()
        ticking = self.regeneration.ticking
        if ticking is not None and not ticking.done():
            await asyncio.wait({ticking}, timeout=TICK_WAIT_S)  # a thread's short work: let it end, never cancel it
        task = self.regeneration.task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if drain is not None:
            await drain()
        for close in self.async_closers:
            await close()
        self._close_parts()

    def close(self, *, wait_s: float = 0.0, drain: Callable[[], None] | None = None) -> None:
        """Stop the off-peak job (waiting up to ``wait_s`` for a pass under way to end its fetches), let the
        adapter ``drain`` its background work, then close every part."""
        self._stop_scheduler()
        self.regeneration.stop(wait_s=wait_s)
        if drain is not None:
            drain()
        self._close_parts()

    def _stop_scheduler(self) -> None:
        if self.scheduler is not None:
            self.scheduler.shutdown(wait=False)
            self.scheduler = None

    def _close_parts(self) -> None:
        self.flow.prefetcher.close()
        self.filler.close()
        if self.access_log is not None:
            self.access_log.close()
        self.core.close()
        self.regeneration.state.close()
