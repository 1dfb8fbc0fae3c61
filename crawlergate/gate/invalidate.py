"""Invalidation: marking stored pages changed, from the API, a site's HTTP PURGE or a write rule.

A marked page is still served to crawlers until the off-peak run regenerates it (or it is too stale);
the mark goes into this machine's page catalogue and, beside the page, into a shared memcached L1 for
the other machines. A page that varies by device is marked with its device copies, and a stored
permanent redirect leads one hop to the page it names (WordPress's ``/?p=ID`` to the permalink).

    invalidation = Invalidation(settings, keys=keys, catalogue=catalogue, cache=cache, ...)   # wiring.py
    invalidation.mark_changed("/showthread.php?t=12*")
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from urllib.parse import unquote, urlsplit

from crawlergate.cache import TwoLevelCache
from crawlergate.config import Settings
from crawlergate.devices import DeviceClasses, variant_key
from crawlergate.gate.answer import Response, json_response, plain_response
from crawlergate.gate.catalogue import IndexUnavailable, PageCatalogue
from crawlergate.gate.forwarded import TrustedProxies
from crawlergate.gate.origin import PublicSite
from crawlergate.gate.writes import WriteRules
from crawlergate.keys import CacheKey, KeyMaker
from crawlergate.stores.published import PublishedTree

logger = logging.getLogger(__name__)

# How long a mark waits for the filled pages on their way to the catalogue.
FLUSH_WAIT_S = 5.0


class Invalidation:
    """Marks the pages of one gate changed.

    Parameters:
        settings: the gate's (``admin.purgers``, the time a shared mark is kept, trusted proxies).
        keys: URL to cache key; ``catalogue`` holds the marks; ``cache`` the stored pages.
        devices: the device classes whose copies are marked with a page.
        writes: the write rules: the pages a successful unsafe request changes.
        public: the public site: a Location on it names a page of this site.
        clock: wall-clock time, as the catalogue's.
        published: the tree a front server answers crawlers from, when the gate keeps one.
        flush_fills: waits until the pages filled so far are in the catalogue (gate/pagewriter.py), so a mark
            never misses a page a crawler was just answered with.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        keys: KeyMaker,
        catalogue: PageCatalogue,
        cache: TwoLevelCache,
        devices: DeviceClasses,
        writes: WriteRules,
        public: PublicSite | None,
        clock: Callable[[], float],
        published: PublishedTree | None = None,
        flush_fills: Callable[[float], bool] | None = None,
    ) -> None:
        self.keys = keys
        self.flush_fills = flush_fills
        self.published = published
        self.catalogue = catalogue
        self.cache = cache
        self.devices = devices
        self.writes = writes
        self.public = public
        self.clock = clock
        self._purgers = TrustedProxies(settings.admin.purgers)
        self._trusted = TrustedProxies(settings.server.trusted_proxies)
        # A mark shared in memcached lasts as long as a marked page may still be served.
        self._shared_mark_s = settings.cache.max_stale_seconds + settings.cache.ttl_seconds

    def mark_changed(self, url_or_pattern: str, reason: str = "api") -> int:
        """Mark stored pages changed: crawlers keep the stored copy until it is regenerated (or too stale).

        ``url_or_pattern`` is a path with its query (``/showthread.php?t=12``), or a pattern where ``*``
        matches any run of characters (``/showthread.php?t=12*``). Returns the pages marked.
        """
        if "*" in url_or_pattern:
            return self.invalidate([], [url_or_pattern], reason)
        return self.invalidate([url_or_pattern], [], reason)

    def invalidate(self, urls: list[str], patterns: list[str], reason: str = "api") -> int:
        """Mark the stored pages of ``urls`` and those matching ``patterns`` changed; returns how many, once each."""
        self._fills_written()
        keys = [key for key in map(self.keys.key_for_url, urls) if key is not None]
        digests = self._with_variants([*keys, *self._redirect_targets(keys)])
        for pattern in patterns:
            digests.update(dict.fromkeys(self.catalogue.matching(pattern)))
        return self._mark(list(digests), reason)

    def purge(
        self, peer: str | None, headers: Iterable[tuple[bytes, bytes]], raw_path: bytes, query: bytes
    ) -> Response:
        """Answer a site's HTTP PURGE: mark the URL's page changed (or, with ``X-Purge-Method: regex``, every
        stored page whose /path?query the URL's path and query match as a regular expression, as WordPress's
        Proxy Cache Purge sends them). Only from ``admin.purgers``; it reads SQLite: call it off the event loop.
        """
        if self._trusted.untrusted_front(peer, headers):
            refusal = (
                b"PURGE is refused: this address forwards for another client, and server.trusted_proxies lacks it.\n"
            )
            return plain_response(403, refusal, outcome=b"pass")
        client = self._trusted.client(peer, headers)
        if client is None or client not in self._purgers:
            return plain_response(403, b"PURGE is not allowed from this address.\n", outcome=b"pass")
        self._fills_written()
        regex = any(name == b"x-purge-method" and value.strip().lower() == b"regex" for name, value in headers)
        try:
            if regex:
                target = raw_path.decode("latin-1") + ("?" + query.decode("latin-1") if query else "")
                marked = self._mark(self.catalogue.matching_regex(unquote(target)), "purge")
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

    def _fills_written(self) -> None:
        """Wait for the pages filled so far to be in the catalogue: a mark must find a page crawlers were answered
        with a moment ago."""
        if self.flush_fills is not None and not self.flush_fills(FLUSH_WAIT_S):
            logger.warning("marking pages while the last filled pages are still being written: a mark may miss them")

    def _mark(self, digests: list[str], reason: str) -> int:
        """Mark pages in this machine's catalogue, and beside them in a shared memcached L1 for the others.

        A published page leaves the tree first, so the front server never answers with a page the gate knows
        changed, and again after the mark, for a fill that published it meanwhile.
        """
        if self.published is not None:
            self.published.unpublish(digests)
        marked = self.catalogue.mark(digests, reason)
        if self.published is not None:
            self.published.unpublish(digests)
        if digests:
            self.cache.share_marks(digests, self.clock(), self._shared_mark_s)
        return marked

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
            target = self.keys.key_for_url(location) if location else None
            if target is not None and target != key:
                targets.append(target)
        return targets
