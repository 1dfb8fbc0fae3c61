"""Settings: one TOML file, then ``CRAWLERGATE_*`` environment variables, then command-line flags.

This module is the only reader of configuration files and of the environment; every component
takes a ``Settings`` (or one of its sections) built here. Every option has a default that works
on a laptop, so ``Settings()`` is a valid configuration.

    settings = load_settings("crawlergate.toml", os.environ, {"server.port": 9000})
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import json
import math
import os
import re
import tomllib
import typing
import urllib.parse
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from crawlergate.errors import ConfigError
from crawlergate.rules import default_rules_dir
from crawlergate.stores.owner import FolderOwner, site_folder

ENV_PREFIX = "CRAWLERGATE_"
# The config file's path, when no --config is given (how `serve --workers N` hands it to its workers).
CONFIG_PATH_VARIABLE = "CRAWLERGATE_CONFIG"
# A whole Settings, serialised: how `serve` hands its settings to worker processes and the demo to its gate.
SETTINGS_VARIABLE = "CRAWLERGATE_SETTINGS_JSON"
# The smallest L2 cap: a few pages. `max_bytes = 100`, meant as megabytes, would evict every page at start-up.
MIN_L2_BYTES = 64 * 1024

# The defaults of list settings are data in rules/defaults.toml.
with open(default_rules_dir() / "defaults.toml", "rb") as _file:
    _LISTS = tomllib.load(_file)
DEFAULT_SESSION_COOKIES: tuple[str, ...] = tuple(_LISTS["cookies"]["session"])
DEFAULT_IGNORED_COOKIES: tuple[str, ...] = tuple(_LISTS["cookies"]["ignored"])
DEFAULT_STORED_HEADERS: tuple[str, ...] = tuple(_LISTS["headers"]["stored"])
NEVER_STORED_HEADERS = frozenset(name.lower() for name in _LISTS["headers"]["never_stored"])
# An origin's URL: http(s), a host without spaces (they would reach the resolver percent-encoded), an optional path.
_ORIGIN_URL = re.compile(r"https?://[^/\s?#]+(?:[/?#]\S*)?")


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """Where the standalone proxy listens, what it protects, and the site as the world sees it."""

    # The address serve listens on; 0.0.0.0 for every interface (behind a front server, keep loopback).
    host: str = "127.0.0.1"
    # The port serve listens on.
    port: int = 8080
    # Worker processes of serve; they share the caches and sum their figures (one per core; at most four per core).
    workers: int = 1
    # Empty: the gate is mounted inside the site, there is no separate origin.
    origin: str = ""
    # The site as the world sees it, e.g. https://forum.example.org: fills carry its Host and scheme,
    # and the origin's own address in Location headers is rewritten to it. Empty: fills use the
    # origin's address (serve) or the server's own address (mounted), and serve warns.
    public_url: str = ""
    # Old name of public_url's host: "forum.example.org" means public_url "http://forum.example.org".
    canonical_host: str = ""
    # With [[sites]]: a request for a host no site names gets 421 ("refuse"), or goes to the first site's origin
    # untouched ("first"); never looked up, stored or filled either way.
    other_hosts: Literal["refuse", "first"] = "refuse"
    # The Host a person's request carries to the origin: the client's own ("client", nginx's
    # `proxy_set_header Host $host`) or the origin's address ("origin", nginx's default $proxy_host).
    forward_host: Literal["client", "origin"] = "client"
    # X-Forwarded-For of fills that no outside client triggered, or whose client has no public address
    # (loopback, a private network's, link-local): a documentation address (RFC 5737), so no page is
    # fetched with an internal client's rights and stored for everyone.
    fill_client_address: str = "192.0.2.1"
    # Clients whose X-Forwarded-* headers the proxy believes (addresses or networks): a front nginx.
    trusted_proxies: tuple[str, ...] = ("127.0.0.1", "::1")
    # WebSocket messages larger than this close the relayed connection (1009).
    websocket_max_message_bytes: int = 1024 * 1024
    # Bytes a request's head (request line and headers) may hold; past it, 431. With max_headers and
    # header_timeout_seconds: nginx allows 4 x 8 KB of headers and waits 60 s; 64 KB and 10 s leave room
    # for big cookies, not for slowloris.
    max_header_bytes: int = 64 * 1024
    # Header lines a request may have; past it, 431 (see max_header_bytes).
    max_headers: int = 100
    # Seconds a request's head may take to arrive; past it the connection is closed (see max_header_bytes).
    header_timeout_seconds: float = 10.0
    # Seconds a client may leave its connection's send buffer full (reading none of it, or a few hundred bytes a
    # second of a large answer); past it the connection is dropped, and the origin's connection that fed it
    # (nginx's send_timeout, 60 s).
    send_timeout_seconds: float = 60.0
    # Connections served at once by each worker; past this uvicorn answers 503 (its limit_concurrency).
    max_connections: int = 2048
    # Seconds an idle keep-alive connection is kept open.
    keep_alive_seconds: int = 5
    # People's requests to the origin (serve): seconds to wait for a connection (nginx's proxy_connect_timeout).
    # With the read and send timeouts, never a total, so a 45 s export arrives whole (nginx's proxy_read_timeout
    # and proxy_send_timeout, with nginx's 60 s); fills have their own total, cache.fill_timeout_seconds.
    origin_connect_timeout_seconds: float = 5.0
    # Longest silence between two reads of the origin's answer (see origin_connect_timeout_seconds).
    origin_read_timeout_seconds: float = 60.0
    # Longest silence between two writes of a request body to the origin.
    origin_send_timeout_seconds: float = 60.0
    # Read a person's request body whole before asking the origin (nginx's proxy_request_buffering): a client
    # that sends its body slowly then holds a connection of the gate's, not one of the origin's few workers.
    # Bodies over 64 KiB wait in a temporary file (TMPDIR: on a tmpfs /tmp, in memory). false: sent on as it
    # arrives.
    buffer_request_bodies: bool = True
    # Longest pause between two reads of a request body; past it, 408 (nginx's client_body_timeout).
    body_timeout_seconds: float = 60.0
    # The largest request body; past it, 413 (nginx's client_max_body_size, 1 MiB there; sites raise it for
    # uploads). Each connection may hold one body this large in a temporary file.
    max_body_bytes: int = 100 * 1024 * 1024
    # Connections to the origin at once, per worker: people's requests, and the gate's fills (crawlers'
    # misses and regeneration) in a pool of their own, so neither can take the other's. Past the limit a
    # request waits origin_connect_timeout_seconds for a place, then gets 504.
    origin_max_connections: int = 512
    # Connections the gate's own fills (misses, regeneration) may hold at once, per worker; HEAD requests share
    # them, or, with fill_keep_alive, have as many again of their own.
    fill_max_connections: int = 128
    # Fills on connections kept open (nginx's upstream keepalive): about 1.4 times the misses a second, for an
    # origin trusted never to send bytes past an answer's end. Off, each fill has a connection of its own: bytes
    # an origin sends past an answer's Content-Length in a later write (a wrong length from the app) could
    # otherwise be read as the next fill's page and served to every crawler.
    fill_keep_alive: bool = False
    # One client's requests passed to the origin at once, per worker (nginx's limit_conn): past it, 503 with
    # Retry-After. 0: no limit. The client is the address a trusted proxy forwards for.
    origin_requests_per_client: int = 0

    def __post_init__(self) -> None:
        _require(0 < self.port < 65536, "server.port", self.port, "Must be a port number from 1 to 65535.")
        for proxy in self.trusted_proxies:
            try:
                ipaddress.ip_network(proxy, strict=False)
            except ValueError:
                _fail("server.trusted_proxies", proxy, "Each entry must be an IP address or network, e.g. 10.0.0.0/8.")
        _require(self.workers >= 1, "server.workers", self.workers, "Must be a positive integer.")
        most = 4 * (os.cpu_count() or 1)
        _require(self.workers <= most, "server.workers", self.workers, f"Must be at most {most}, 4 per CPU here.")
        _require(
            self.origin_requests_per_client >= 0,
            "server.origin_requests_per_client",
            self.origin_requests_per_client,
            "Must be 0 (no limit) or more.",
        )
        if self.origin and not _ORIGIN_URL.fullmatch(self.origin):
            _fail(
                "server.origin",
                self.origin,
                "Must be an http:// or https:// URL (no spaces), e.g. http://127.0.0.1:8000.",
            )
        if self.origin and not _has_valid_port(self.origin):
            _fail("server.origin", self.origin, "Its port must be a number from 1 to 65535.")
        if self.canonical_host and not self.public_url:
            if not re.fullmatch(r"[^/\s:]+(:\d{1,5})?", self.canonical_host):
                _fail("server.canonical_host", self.canonical_host, "Must be a host name, e.g. forum.example.org.")
            object.__setattr__(self, "public_url", "http://" + self.canonical_host)
        if self.public_url:
            if not re.fullmatch(r"https?://[^/\s?#@]+/?", self.public_url):
                _fail(
                    "server.public_url",
                    self.public_url,
                    "Must be the site's address as the world sees it, scheme and host only, "
                    "e.g. https://forum.example.org.",
                )
            object.__setattr__(self, "public_url", self.public_url.rstrip("/"))
        _require(
            self.forward_host in ("client", "origin"),
            "server.forward_host",
            self.forward_host,
            "Must be 'client' (the client's Host) or 'origin' (the origin's address).",
        )
        try:
            ipaddress.ip_address(self.fill_client_address)
        except ValueError:
            _fail("server.fill_client_address", self.fill_client_address, "Must be an IP address, e.g. 192.0.2.1.")
        for name in (
            "max_header_bytes",
            "max_body_bytes",
            "max_headers",
            "max_connections",
            "keep_alive_seconds",
            "origin_max_connections",
            "fill_max_connections",
        ):
            _require(getattr(self, name) > 0, f"server.{name}", getattr(self, name), "Must be a positive integer.")
        for name in (
            "header_timeout_seconds",
            "send_timeout_seconds",
            "body_timeout_seconds",
            "origin_connect_timeout_seconds",
            "origin_read_timeout_seconds",
            "origin_send_timeout_seconds",
        ):
            _require(getattr(self, name) > 0, f"server.{name}", getattr(self, name), "Must be a positive number.")
        _require(
            self.websocket_max_message_bytes > 0,
            "server.websocket_max_message_bytes",
            self.websocket_max_message_bytes,
            "Must be a positive size.",
        )


@dataclass(frozen=True, slots=True)
class ClassifySettings:
    """How requests are told apart: rule files, session cookies, the memo size."""

    # Empty: the rules shipped with crawlergate.
    rules_dir: str = ""
    # The rule files read from rules_dir, in order: the paper's heuristic, then the crawler list.
    rule_files: tuple[str, ...] = ("heuristic.toml", "crawlers.toml")
    # Further rule files (absolute, or relative to the working directory) merged after rule_files.
    extra_rules: tuple[str, ...] = ()
    # "any": every cookie but the ignored ones means a session and the live site (Varnish's default);
    # "named": only the session_cookies do, for sites whose guests all carry other cookies.
    session_cookie_rule: Literal["any", "named"] = "any"
    # Cookies that are not a session (analytics, consent): a request with only these is a guest.
    ignored_cookies: tuple[str, ...] = DEFAULT_IGNORED_COOKIES
    # Cookie names that mean a session under session_cookie_rule "named" (`*` matches any run of characters).
    session_cookies: tuple[str, ...] = DEFAULT_SESSION_COOKIES
    # User agents whose verdict each process remembers (an LRU; 0: none).
    memo_size: int = 65536

    def __post_init__(self) -> None:
        _require(self.memo_size >= 0, "classify.memo_size", self.memo_size, "Must be zero or a positive integer.")
        _require(bool(self.rule_files), "classify.rule_files", self.rule_files, "Must name at least one rule file.")
        _require(
            self.session_cookie_rule in ("any", "named"),
            "classify.session_cookie_rule",
            self.session_cookie_rule,
            "Must be 'any' (every cookie but the ignored ones) or 'named' (only session_cookies).",
        )


@dataclass(frozen=True, slots=True)
class L1Settings:
    """The fast level: memcached servers, or the embedded in-process LRU when none is given."""

    # memcached servers as HOST:PORT, keys spread by hashing; empty: the embedded in-process LRU.
    memcached: tuple[str, ...] = ()
    # Part of every memcached key, so sites sharing a memcached cluster never serve each other's pages.
    # Empty: derived from server.public_url (or server.origin); set it to tell staging from production.
    namespace: str = ""
    # The embedded LRU's size (memcached's own size is its -m).
    max_bytes: int = 64 * 1024 * 1024
    # memcached's item size limit (-I; its default 1m): pages within 1 KB of it skip L1, as memcached counts
    # its item header too. A page memcached refuses all the same fails alone; the server stays in use.
    item_max_bytes: int = 1024 * 1024
    # Milliseconds to connect to a memcached server; past it the request goes on to L2.
    connect_timeout_ms: float = 50.0
    # The longest wait for a memcached answer (see connect_timeout_ms).
    timeout_ms: float = 50.0
    # A memcached server that failed is skipped this long before it is tried again.
    dead_retry_seconds: float = 10.0
    # With memcached: how long a worker trusts a page it read without asking memcached again. A page
    # changed elsewhere reaches this worker's crawlers at most this late; 0 asks every time.
    local_ttl_ms: float = 1000.0

    def __post_init__(self) -> None:
        _require(self.local_ttl_ms >= 0, "l1.local_ttl_ms", self.local_ttl_ms, "Must be zero or a positive number.")
        if self.namespace and not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", self.namespace):
            _fail("l1.namespace", self.namespace, "Must be 1 to 64 letters, digits, '.', '_' or '-'.")
        for server in self.memcached:
            if not re.fullmatch(r"[^\s:]+:\d{1,5}", server):
                _fail("l1.memcached", server, "Each server must be HOST:PORT, e.g. 127.0.0.1:11211.")
        _require(self.max_bytes > 0, "l1.max_bytes", self.max_bytes, "Must be a positive size.")
        _require(self.item_max_bytes > 0, "l1.item_max_bytes", self.item_max_bytes, "Must be a positive size.")
        for name in ("connect_timeout_ms", "timeout_ms", "dead_retry_seconds"):
            value = getattr(self, name)
            _require(value > 0, f"l1.{name}", value, "Must be a positive number.")


@dataclass(frozen=True, slots=True)
class L2Settings:
    """The large level: gzip files on disk."""

    # Empty: a folder of the site's own in the user's cache directory (XDG_CACHE_HOME or ~/.cache), named after
    # server.public_url, else server.origin, else (middleware) the application.
    cache_dir: str = ""
    # L2's size on disk: past it the least recently used pages are evicted (64KiB at least; a bare number is bytes).
    max_bytes: int = 1024 * 1024 * 1024
    # Pages larger than this, as the origin sends them or once decompressed, are never stored.
    page_max_bytes: int = 8 * 1024 * 1024

    def __post_init__(self) -> None:
        _require(
            self.max_bytes >= MIN_L2_BYTES,
            "l2.max_bytes",
            self.max_bytes,
            'Must be at least 64KiB: a number without a unit is bytes (write "100MB").',
        )
        _require(self.page_max_bytes > 0, "l2.page_max_bytes", self.page_max_bytes, "Must be a positive size.")


@dataclass(frozen=True, slots=True)
class CacheSettings:
    """What crawlers are served from the cache, and for how long."""

    # Relative to classify.rules_dir (the shipped rules when empty), or absolute.
    rules_file: str = "cache.toml"
    # Site profiles from rules/sites/ (trac, django, mediawiki, wordpress, dokuwiki, phpbb, discourse,
    # demo-forum): their excluded paths, query parameters and session cookies are added to the rules.
    sites: tuple[str, ...] = ()
    # "guest": a guest fill is stored despite Set-Cookie, private, no-cache, max-age=0 and Vary: Cookie,
    # because a stored page only ever answers requests without a session (docs/guides/real-sites.md).
    # "rfc9111": a strict shared cache, which stores none of those.
    storage_mode: Literal["guest", "rfc9111"] = "guest"
    # Origin headers stored with a page and sent with it; Set-Cookie and per-response headers never are.
    stored_headers: tuple[str, ...] = DEFAULT_STORED_HEADERS
    # How long a stored page is fresh; after that it is served stale and queued for regeneration.
    ttl_seconds: float = 86400.0
    # The lifetime of stored redirects (301/308): shorter than a page's, as they are cheap and may be mistakes.
    redirect_ttl_seconds: float = 3600.0
    # The lifetime of stored gone pages (404/410): short, for the same reasons as redirect_ttl_seconds.
    not_found_ttl_seconds: float = 600.0
    # The whole time a guest fill may take; past it the crawler gets a stored copy, else 504.
    fill_timeout_seconds: float = 30.0
    # A page marked changed, or past its lifetime, is still served to crawlers (and queued for
    # regeneration) for this long; after that the next crawler's request fills it (0: at once).
    max_stale_seconds: float = 86400.0
    # Longer request targets are refused with 414 (nginx's large_client_header_buffers is 8 KB).
    max_target_chars: int = 8192

    def __post_init__(self) -> None:
        for name in ("ttl_seconds", "redirect_ttl_seconds", "not_found_ttl_seconds", "fill_timeout_seconds"):
            value = getattr(self, name)
            _require(0 < value < math.inf, f"cache.{name}", value, "Must be a positive number, not infinite.")
        _require(
            self.storage_mode in ("guest", "rfc9111"),
            "cache.storage_mode",
            self.storage_mode,
            "Must be 'guest' (guest pages are shared) or 'rfc9111' (a strict shared cache).",
        )
        for name in self.stored_headers:
            if not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", name):
                _fail("cache.stored_headers", name, "Each entry must be a header name, e.g. X-Robots-Tag.")
            if name.lower() in NEVER_STORED_HEADERS:
                _fail("cache.stored_headers", name, "This header belongs to one response and is never stored.")
        for site in self.sites:
            if not re.fullmatch(r"[a-z0-9_-]+", site):
                _fail("cache.sites", site, "Each entry must be a profile name such as trac or wordpress.")
        _require(
            0 <= self.max_stale_seconds < math.inf,
            "cache.max_stale_seconds",
            self.max_stale_seconds,
            "Must be 0 or more, not infinite.",
        )
        _require(self.max_target_chars >= 256, "cache.max_target_chars", self.max_target_chars, "Must be at least 256.")


@dataclass(frozen=True, slots=True)
class AdminSettings:
    """The /_crawlergate/ endpoints."""

    # The path under which the dashboard and the admin endpoints answer.
    prefix: str = "/_crawlergate"
    # The bearer token that lets clients other than loopback reach the admin endpoints (invalidate always needs
    # it); empty: loopback clients only. healthz answers everyone.
    token: str = ""
    # Addresses or networks whose HTTP PURGE requests mark pages changed (MediaWiki's $wgCdnServers,
    # WordPress's Proxy Cache Purge, Drupal's purge module send them). Others get 403.
    purgers: tuple[str, ...] = ("127.0.0.1", "::1")

    def __post_init__(self) -> None:
        if not re.fullmatch(r"(/[A-Za-z0-9._~-]+)+", self.prefix):
            _fail("admin.prefix", self.prefix, "Must be a path such as /_crawlergate, without a trailing slash.")
        for purger in self.purgers:
            try:
                ipaddress.ip_network(purger, strict=False)
            except ValueError:
                _fail("admin.purgers", purger, "Each entry must be an IP address or network, e.g. 10.0.0.5.")


@dataclass(frozen=True, slots=True)
class RegenerateSettings:
    """Off-peak regeneration of changed pages, and revalidation of pages with no change signal."""

    # Regenerate changed pages in the off-peak window (false: only `crawlergate regenerate` does).
    enabled: bool = True
    # "auto": the quietest hour of human traffic the gate has counted (04:00 until a day is counted);
    # "HH:MM" every day; or a five-field cron expression ("30 3 * * 1-5").
    window: str = "auto"
    # Empty: the machine's local time zone; else an IANA name such as Europe/Paris or UTC.
    timezone: str = ""
    # The window's length: a pass stops starting fetches this long after the window opened.
    max_seconds: float = 3600.0
    # Pages a window fetches at most (changed pages first, then revalidations); 0: as many as time allows.
    max_pages: int = 0
    # Fetches at once, and a second, at most: what the origin bears beside its people.
    concurrency: int = 2
    # Fetches a second at most, whatever the concurrency (see concurrency).
    rate: float = 10.0
    # The share of time the origin may spend answering the pass (0: no limit): at 0.05 a 20 ms page is
    # fetched at most every 400 ms. The people using the site meanwhile wait for what the pass takes.
    origin_share: float = 0.05
    # Fewer fetches at once when the origin's answers take this many times their normal time.
    backoff_factor: float = 2.0
    # Pages with no change signal re-fetched a window, chosen by Azar et al.'s optimal rates (0: none).
    revalidate_pages: int = 1000
    # How often each worker looks whether a window is open (and writes the human requests it counted).
    check_seconds: float = 60.0

    def __post_init__(self) -> None:
        window = self.window.strip()
        if window != "auto" and not re.fullmatch(r"([01]?\d|2[0-3]):[0-5]\d", window) and len(window.split()) != 5:
            _fail("regenerate.window", self.window, "Must be 'auto', a time such as 04:30, or a cron expression.")
        if self.timezone:
            try:
                zoneinfo.ZoneInfo(self.timezone)
            except (ValueError, zoneinfo.ZoneInfoNotFoundError):
                rule = "Must be empty (local time) or a zone such as Europe/Paris."
                _fail("regenerate.timezone", self.timezone, rule)
        for name in ("max_seconds", "rate", "origin_share", "backoff_factor", "check_seconds"):
            value = getattr(self, name)
            _require(math.isfinite(value), f"regenerate.{name}", value, "Must be a finite number.")
        _require(0 < self.max_seconds <= 7 * 86400, "regenerate.max_seconds", self.max_seconds, "Must be up to a week.")
        _require(self.check_seconds <= 3600, "regenerate.check_seconds", self.check_seconds, "Must be at most 3600.")
        _require(self.max_pages >= 0, "regenerate.max_pages", self.max_pages, "Must be 0 (no limit) or more.")
        _require(self.concurrency >= 1, "regenerate.concurrency", self.concurrency, "Must be at least 1.")
        _require(self.rate >= 0, "regenerate.rate", self.rate, "Must be 0 (no limit) or a positive number.")
        _require(
            0 <= self.origin_share <= 1, "regenerate.origin_share", self.origin_share, "Must be 0 (no limit) to 1."
        )
        _require(self.backoff_factor > 1, "regenerate.backoff_factor", self.backoff_factor, "Must be more than 1.")
        _require(self.check_seconds > 0, "regenerate.check_seconds", self.check_seconds, "Must be a positive number.")
        _require(self.revalidate_pages >= 0, "regenerate.revalidate_pages", self.revalidate_pages, "Must be 0 or more.")


@dataclass(frozen=True, slots=True)
class MetricsSettings:
    """Where the figures of several worker processes meet."""

    # A folder where each process keeps its counters, so stats and metrics sum them all (gunicorn or
    # uvicorn workers of one site). Empty: each process counts alone; `serve` makes a fresh one per run.
    shared_dir: str = ""


@dataclass(frozen=True, slots=True)
class LogSettings:
    """The access log: one line per request, combined format plus TTFB and the X-Crawlergate outcome."""

    # A file path, or "off". Empty: `serve` writes <cache dir>/access.log, the middlewares write none.
    access_log: str = ""
    # Past this size the file is renamed access.log.1 (and so on) and a new one begun; 0: never.
    access_max_bytes: int = 100 * 1000 * 1000
    # Rotated files kept.
    access_backups: int = 5

    def __post_init__(self) -> None:
        _require(self.access_max_bytes >= 0, "log.access_max_bytes", self.access_max_bytes, "Must be 0 or more.")
        _require(self.access_backups >= 0, "log.access_backups", self.access_backups, "Must be 0 or more.")


@dataclass(frozen=True, slots=True)
class FrontSettings:
    """A front server (nginx) that answers announced crawlers from the published tree (``crawlergate nginx-config``)."""

    # Keep the published tree (<cache dir>/published/<host>): fresh HTML pages laid out by URL for the front
    # server. Off by default: only a front server reads it.
    publish: bool = False
    # The front server's JSON log of the crawler hits it answered from the tree (the include's log_format), read as
    # it grows so stats, metrics and the dashboard count them. Empty: none.
    direct_log: str = ""


@dataclass(frozen=True, slots=True)
class EvidenceSettings:
    """Crawlers behind browser user agents: the evidence that makes a request a suspect (rules/evidence.toml)."""

    # Judge requests by their headers and behaviour too (crawlers behind browser user agents); off: every
    # request the user-agent rules call human gets the live site.
    enabled: bool = True
    # The evidence rules: a file in the rules folder, or a path of your own.
    rules_file: str = "evidence.toml"
    # Memory of the behaviour sketches (per address and per network), whatever the number of clients.
    sketch_bytes: int = 8 * 1024 * 1024
    # Behaviour counts halve in this time: "pages per minute" is about the last minute and a half.
    half_life_seconds: float = 60.0

    def __post_init__(self) -> None:
        _require(
            4096 <= self.sketch_bytes <= 1024**3,
            "evidence.sketch_bytes",
            self.sketch_bytes,
            "Must be between 4KiB and 1GiB (each worker holds it).",
        )
        _require(
            0 < self.half_life_seconds <= 86400,
            "evidence.half_life_seconds",
            self.half_life_seconds,
            "Must be more than 0 and at most 86400 (a day).",
        )


@dataclass(frozen=True, slots=True)
class PolicySettings:
    """What each class and family of crawler gets: cache, cache-only, live or deny (rules/policy.toml)."""

    # A file in the rules folder, or a path of your own (it replaces the shipped one).
    rules_file: str = "policy.toml"
    # Retry-After of a cache-only miss and of the overload valve's 503.
    retry_after_seconds: int = 120
    # New pages the suspects of these tags ("unverified-claimant": a search engine's user agent from outside
    # its addresses; "evidence": a browser's user agent the evidence convicts) may make the site fill, per /24
    # (IPv4) or /48 (IPv6) network: suspect_fills_per_minute, up to suspect_fill_burst saved. Past it, a miss
    # is answered as a cache-only one (a stored copy, else 503). 0 a minute: no budget.
    suspect_fill_budget_tags: tuple[str, ...] = ("unverified-claimant",)
    # The fill budget's rate, per network (see suspect_fill_budget_tags).
    suspect_fills_per_minute: float = 30.0
    # Fills a network may save up and spend at once (see suspect_fill_budget_tags).
    suspect_fill_burst: int = 60

    def __post_init__(self) -> None:
        _require(
            1 <= self.retry_after_seconds <= 86400,
            "policy.retry_after_seconds",
            self.retry_after_seconds,
            "Must be from 1 to 86400 (a day).",
        )
        _require(
            0 <= self.suspect_fills_per_minute <= 1_000_000,
            "policy.suspect_fills_per_minute",
            self.suspect_fills_per_minute,
            "Must be from 0 (no budget) to 1000000.",
        )
        for tag in self.suspect_fill_budget_tags:
            _require(
                tag in ("unverified-claimant", "evidence"),
                "policy.suspect_fill_budget_tags",
                tag,
                "Each must be 'unverified-claimant' or 'evidence'.",
            )
        _require(
            1 <= self.suspect_fill_burst <= 1_000_000,
            "policy.suspect_fill_burst",
            self.suspect_fill_burst,
            "Must be from 1 to 1000000.",
        )


@dataclass(frozen=True, slots=True)
class VerifySettings:
    """Whether a claimed search-engine crawler comes from its engine: published ranges, and reverse DNS."""

    # Empty: the snapshot shipped in rules/ (search-engine-ranges.toml); `crawlergate ranges` writes a fresh one.
    ranges_file: str = ""
    # Also verify by reverse-then-forward DNS (off the request path, cached per address).
    reverse_dns: bool = False
    # How long a DNS answer is believed.
    dns_cache_seconds: float = 86400.0
    # Web Bot Auth: requests their agent's operator signed (HTTP Message Signatures, RFC 9421) are verified
    # against the key directories of the operators in agents_file (empty: rules/agents.toml).
    signatures: bool = True
    # The operators whose signed agents are believed; empty: rules/agents.toml.
    agents_file: str = ""
    # How far a signature's created/expires may be off the gate's clock.
    signature_skew_seconds: float = 60.0
    # How long a verified (operator, key, client address) is believed without checking the signature's bytes:
    # whoever shares that address then counts as the agent. 0: every signature is checked.
    signature_trust_seconds: float = 0.0
    # A key directory is kept for its Cache-Control max-age, within these bounds; fetched within the timeout,
    # at most directory_max_bytes.
    directory_min_seconds: float = 300.0
    # The longest a key directory is kept without being read again (see directory_min_seconds).
    directory_max_seconds: float = 86400.0
    # The whole time a key directory's fetch may take.
    directory_timeout_seconds: float = 5.0
    # A key directory larger than this is refused.
    directory_max_bytes: int = 65536
    # A PEM file of certificate authorities trusted for key directories besides the usual ones (a private or a
    # test CA); empty: the usual ones (certifi's bundle, as httpx).
    directory_ca_file: str = ""

    def __post_init__(self) -> None:
        _require(
            0 < self.dns_cache_seconds <= 30 * 86400,
            "verify.dns_cache_seconds",
            self.dns_cache_seconds,
            "Must be more than 0 and at most 2592000 (30 days).",
        )
        _require(
            0 <= self.signature_skew_seconds <= 3600,
            "verify.signature_skew_seconds",
            self.signature_skew_seconds,
            "Must be 0 to 3600.",
        )
        _require(
            0 <= self.signature_trust_seconds <= 3600,
            "verify.signature_trust_seconds",
            self.signature_trust_seconds,
            "Must be 0 (check every signature) to 3600.",
        )
        _require(
            0 < self.directory_min_seconds <= self.directory_max_seconds <= 30 * 86400,
            "verify.directory_min_seconds",
            self.directory_min_seconds,
            "Must be more than 0 and at most verify.directory_max_seconds (at most 2592000).",
        )
        _require(
            0 < self.directory_timeout_seconds <= 60,
            "verify.directory_timeout_seconds",
            self.directory_timeout_seconds,
            "Must be more than 0 and at most 60.",
        )
        _require(
            1024 <= self.directory_max_bytes <= 1 << 20,
            "verify.directory_max_bytes",
            self.directory_max_bytes,
            "Must be 1024 to 1048576.",
        )


@dataclass(frozen=True, slots=True)
class ValveSettings:
    """The crawler-only overload valve: crawler and suspect misses get 503 while the site is saturated."""

    # Shed crawler misses while the site is saturated (people are never shed).
    enabled: bool = True
    # Requests to the site in flight in one gate process (fills and people's requests) at which it is saturated.
    max_in_flight: int = 64
    # Saturated too when the pages answered over the last window_seconds (three or more, one vote each) took
    # in the median this many times their own normal time (each page's average over ten minutes) and slow_ms.
    slow_factor: float = 4.0
    # The slow answers' floor in milliseconds (see slow_factor).
    slow_ms: float = 500.0
    # The window over which answers' times are taken (see slow_factor).
    window_seconds: float = 10.0

    def __post_init__(self) -> None:
        _require(self.max_in_flight >= 1, "valve.max_in_flight", self.max_in_flight, "Must be 1 or more.")
        _require(self.slow_factor > 1, "valve.slow_factor", self.slow_factor, "Must be more than 1.")
        _require(self.slow_ms >= 0, "valve.slow_ms", self.slow_ms, "Must be 0 or more.")
        _require(
            0 < self.window_seconds <= 3600,
            "valve.window_seconds",
            self.window_seconds,
            "Must be more than 0, at most 3600.",
        )
        _require(self.slow_factor <= 1000, "valve.slow_factor", self.slow_factor, "Must be at most 1000.")
        _require(self.slow_ms <= 3_600_000, "valve.slow_ms", self.slow_ms, "Must be at most 3600000 (an hour).")


@dataclass(frozen=True, slots=True)
class SiteSettings:
    """One of several sites behind one ``serve`` (``[[sites]]``, ``--site HOST=ORIGIN``): a request is this
    site's when its Host is one of ``hosts``; its pages have a folder, a memcached namespace and figures of
    their own. What a site leaves empty it takes from the top-level settings."""

    # The host names this site answers for (its first one names its folder and figures).
    hosts: tuple[str, ...] = ()
    # The site's origin URL, as server.origin.
    origin: str = ""
    # The site as the world sees it, as server.public_url; empty: http:// and its first host.
    public_url: str = ""
    # Site profiles from rules/sites/ (as cache.sites); empty: cache.sites.
    profiles: tuple[str, ...] = ()
    # This site's share of L2; 0: l2.max_bytes divided evenly between the sites.
    max_bytes: int = 0
    # Sections of its own ([sites.regenerate] max_pages = 200): each the top-level section with the site's
    # keys over it; None: the top-level section.
    cache: CacheSettings | None = None
    regenerate: RegenerateSettings | None = None
    policy: PolicySettings | None = None
    evidence: EvidenceSettings | None = None
    valve: ValveSettings | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "hosts", tuple(host.strip().lower().rstrip(".") for host in self.hosts))
        _require(bool(self.hosts), "sites.hosts", list(self.hosts), "Each site needs one host name or more.")
        for host in self.hosts:
            if not re.fullmatch(r"[a-z0-9._-]+(:\d{1,5})?|\[[0-9a-f:.]+\](:\d{1,5})?", host):
                _fail("sites.hosts", host, "Each must be a host name (and a port if not 80/443): wiki.example.org.")
        if not _ORIGIN_URL.fullmatch(self.origin):
            _fail("sites.origin", self.origin, "Each site needs its origin's URL, e.g. http://127.0.0.1:8001.")
        ServerSettings(origin=self.origin, public_url=self.public_url)  # the same checks as the single site's
        _require(self.max_bytes >= 0, "sites.max_bytes", self.max_bytes, "Must be 0 (an even share) or a size.")

    @property
    def name(self) -> str:
        """The site's name in folders, figures and logs: its first host."""
        return self.hosts[0]


@dataclass(frozen=True, slots=True)
class Settings:
    """All of crawlergate's configuration, one section per component."""

    server: ServerSettings = field(default_factory=ServerSettings)
    classify: ClassifySettings = field(default_factory=ClassifySettings)
    l1: L1Settings = field(default_factory=L1Settings)
    l2: L2Settings = field(default_factory=L2Settings)
    cache: CacheSettings = field(default_factory=CacheSettings)
    admin: AdminSettings = field(default_factory=AdminSettings)
    regenerate: RegenerateSettings = field(default_factory=RegenerateSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    log: LogSettings = field(default_factory=LogSettings)
    front: FrontSettings = field(default_factory=FrontSettings)
    evidence: EvidenceSettings = field(default_factory=EvidenceSettings)
    policy: PolicySettings = field(default_factory=PolicySettings)
    verify: VerifySettings = field(default_factory=VerifySettings)
    valve: ValveSettings = field(default_factory=ValveSettings)
    # Several sites behind one serve, each on its own host names; empty: one site, server.origin.
    sites: tuple[SiteSettings, ...] = ()

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for site in self.sites:
            for host in site.hosts:
                _require(host not in seen, "sites.hosts", host, "A host name may belong to one site only.")
                seen.add(host)
        if self.sites and self.front.publish:
            _fail("front.publish", True, "The published tree serves one site: turn it off with [[sites]].")

    def one_site(self) -> Settings:
        """The settings of the site a command acts on: these, or with several sites the one whose origin
        ``server.origin`` names (ConfigError when none, or several, has it)."""
        if not self.sites:
            return self
        wanted = self.server.origin.rstrip("/").lower()
        named = [site for site in self.sites if wanted and site.origin.rstrip("/").lower() == wanted]
        if len(named) == 1:
            return self.for_site(named[0])
        if named:
            raise ConfigError(f"Sites {', '.join(site.name for site in named)} share the origin {wanted}: give the one "
                              "to act on a settings file of its own.")  # fmt: skip
        origins = ", ".join(site.origin for site in self.sites)
        raise ConfigError(f"The settings name several sites: give the --origin of the one to act on ({origins}).")

    def for_site(self, site: SiteSettings) -> Settings:
        """The settings of one site's gate: its origin and URL, and a folder, a memcached namespace, a share of
        L2, shared counters and an access log of its own."""
        name = _SITE_FOLDER.sub("-", site.name)
        if name != site.name:  # "a_b.example" and "a-b.example" are two sites, in two folders
            name += "-" + hashlib.blake2b(site.name.encode(), digest_size=4).hexdigest()
        # Sites may share one origin (name-based virtual hosts, a WordPress multisite): a site is its host name,
        # in its fills' Host (when it has no public URL), its folder and its memcached namespace.
        public_url = site.public_url or f"http://{site.name}"
        server = dataclasses.replace(self.server, origin=site.origin, public_url=public_url, canonical_host="")
        folder = Path(self.l2.cache_dir) if self.l2.cache_dir else default_cache_root() / "crawlergate"
        l2 = dataclasses.replace(
            self.l2,
            cache_dir=str(folder / "sites" / name),
            max_bytes=site.max_bytes or max(1, self.l2.max_bytes // len(self.sites or (site,))),
        )
        namespace = hashlib.blake2b(name.encode(), digest_size=5).hexdigest()
        l1 = dataclasses.replace(self.l1, namespace=f"{self.l1.namespace}-{name}" if self.l1.namespace else namespace)
        metrics = self.metrics
        if metrics.shared_dir:
            metrics = dataclasses.replace(metrics, shared_dir=str(Path(metrics.shared_dir) / name))
        log = self.log
        if log.access_log and log.access_log != "off":
            path = Path(log.access_log)
            log = dataclasses.replace(log, access_log=str(path.with_name(f"{path.stem}.{name}{path.suffix}")))
        cache = site.cache or self.cache
        if site.profiles:
            cache = dataclasses.replace(cache, sites=site.profiles)
        return dataclasses.replace(
            self,
            server=server,
            l1=l1,
            l2=l2,
            metrics=metrics,
            log=log,
            cache=cache,
            regenerate=site.regenerate or self.regenerate,
            policy=site.policy or self.policy,
            evidence=site.evidence or self.evidence,
            valve=site.valve or self.valve,
            sites=(),
        )

    @property
    def site_url(self) -> str:
        """The site as the world sees it: the public URL, else the origin; empty when neither is set."""
        return self.server.public_url or self.server.origin

    @property
    def l1_namespace(self) -> str:
        """The L1 key namespace: as set, else a digest of the public URL (or the origin), else none."""
        if self.l1.namespace:
            return self.l1.namespace
        site = self.site_url
        return hashlib.blake2b(site.lower().encode(), digest_size=5).hexdigest() if site else ""

    def to_environ(self) -> dict[str, str]:
        """These settings as one environment variable, read back whole by ``load_settings`` in another process."""
        return {SETTINGS_VARIABLE: json.dumps(dataclasses.asdict(self))}

    @property
    def cache_dir(self) -> Path:
        """The L2 directory, with the laptop default filled in: a folder of the site's own (middleware without
        a public URL gets its application's, see ``GateRuntime``)."""
        if self.l2.cache_dir:
            return Path(self.l2.cache_dir)
        return site_folder(default_cache_root() / "crawlergate", self.folder_owner())

    def folder_owner(self, app: str = "") -> FolderOwner:
        """Whose cache folder these settings use: the site's URLs, or ``app`` for middleware without them."""
        server = self.server
        return FolderOwner(server.public_url, server.origin, "" if self.site_url else app)


def default_cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """The per-user cache folder (XDG Base Directory specification); ``environ``: the process's by default."""
    xdg = (os.environ if environ is None else environ).get("XDG_CACHE_HOME", "")
    return Path(xdg) if xdg else Path.home() / ".cache"


def _has_valid_port(url: str) -> bool:
    """Whether the URL's host and port can be read (a port over 65535, "abc" or an unclosed "[::1" cannot)."""
    try:
        port = urllib.parse.urlsplit(url).port
    except ValueError:
        return False
    return port is None or port > 0


def load_settings(
    path: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Build Settings from a TOML file, then ``CRAWLERGATE_*`` variables, then dotted-key overrides.

    ``environ`` is the process's environment when not given (a default of ``os.environ`` itself would print
    every variable, secrets too, in ``help(load_settings)``). The later source wins; settings serialised by
    ``Settings.to_environ`` come first of all. Raises ConfigError with a sentence naming the key and the value.
    """
    environ = os.environ if environ is None else environ
    merged: dict[str, Any] = {}
    if environ.get(SETTINGS_VARIABLE):
        _merge(merged, _read_serialised(environ[SETTINGS_VARIABLE]), source=SETTINGS_VARIABLE)
    if path is None and environ.get(CONFIG_PATH_VARIABLE):
        path = environ[CONFIG_PATH_VARIABLE]
    if path is not None:
        _merge(merged, _read_toml(Path(path)), source=str(path))
    _merge(merged, _from_environ(environ), source="environment")
    if overrides:
        _merge(merged, _unflatten(overrides), source="command line")
    return _build_settings(merged)


def parse_size(text: str | int) -> int:
    """Parse a byte size such as ``120MB``, ``1.5GiB``, ``4096`` or ``64k`` into bytes.

    Decimal units (kB, MB, GB) are powers of 1000 as the paper's sizes are; binary units (KiB, MiB, GiB) powers of 1024.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)(b?)\s*", str(text), re.IGNORECASE)
    if match is None:
        raise ValueError(f"not a size: {text!r}")
    number, unit, binary, _ = match.groups()
    base = 1024 if binary else 1000
    power = " kmgt".index(unit.lower() or " ")
    return int(float(number) * base**power)


_SITE_FOLDER = re.compile(r"[^a-z0-9.-]+")
# The sections a site may have of its own.
_SITE_SECTIONS: dict[str, type[Any]] = {
    "cache": CacheSettings,
    "regenerate": RegenerateSettings,
    "policy": PolicySettings,
    "evidence": EvidenceSettings,
    "valve": ValveSettings,
}

_SECTIONS: dict[str, type[Any]] = {
    "server": ServerSettings,
    "classify": ClassifySettings,
    "l1": L1Settings,
    "l2": L2Settings,
    "cache": CacheSettings,
    "admin": AdminSettings,
    "regenerate": RegenerateSettings,
    "metrics": MetricsSettings,
    "log": LogSettings,
    "front": FrontSettings,
    "evidence": EvidenceSettings,
    "policy": PolicySettings,
    "verify": VerifySettings,
    "valve": ValveSettings,
}


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"Config file '{path}' does not exist.") from None
    except OSError as exc:
        raise ConfigError(f"Config file '{path}' cannot be read: {exc.strerror}.") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"Config file '{path}' is not valid TOML: {exc}.") from None
    except UnicodeDecodeError:
        raise ConfigError(f"Config file '{path}' is not text in UTF-8, as TOML must be.") from None


def _read_serialised(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"Environment variable '{SETTINGS_VARIABLE}' is not valid JSON: {exc}.") from None
    if not isinstance(data, dict):
        raise ConfigError(f"Environment variable '{SETTINGS_VARIABLE}' must hold a JSON object of sections.")
    return data


def _from_environ(environ: Mapping[str, str]) -> dict[str, Any]:
    flat: dict[str, str] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or name in (CONFIG_PATH_VARIABLE, SETTINGS_VARIABLE):
            continue
        section, _, key = name[len(ENV_PREFIX) :].lower().partition("_")
        if section not in _SECTIONS or not key:
            raise ConfigError(
                f"Environment variable '{name}' names no setting. Use CRAWLERGATE_<SECTION>_<KEY>, "
                f"with SECTION one of {', '.join(_SECTIONS)}."
            )
        if not value.strip() and _field_type(section, key).startswith(("int", "float", "bool", "Literal")):
            continue  # "CRAWLERGATE_SERVER_WORKERS=" (a compose file's blank): unset, as no number or choice is blank
        flat[f"{section}.{key}"] = value
    return _unflatten(flat)


def _field_type(section: str, key: str) -> str:
    """The annotation of a setting, as written ("int", "str", ...); "" for no such setting."""
    return next((str(f.type) for f in dataclasses.fields(_SECTIONS[section]) if f.name == key), "")


def _unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for dotted, value in flat.items():
        if dotted == "sites":
            nested["sites"] = value
            continue
        section, _, key = dotted.partition(".")
        if not key:
            raise ConfigError(f"Setting '{dotted}' must be written SECTION.KEY, e.g. server.port.")
        nested.setdefault(section, {})[key] = value
    return nested


def _merge(into: dict[str, Any], data: Mapping[str, Any], *, source: str) -> None:
    for section, values in data.items():
        if section == "sites":
            into["sites"] = _site_tables(values, source)
            continue
        if section not in _SECTIONS:
            raise ConfigError(f"Unknown section '{section}' in {source}. Known sections: {', '.join(_SECTIONS)}.")
        if not isinstance(values, Mapping):
            raise ConfigError(f"Section '{section}' in {source} must be a table of settings.")
        known = {f.name for f in dataclasses.fields(_SECTIONS[section])}
        for key, value in values.items():
            if key not in known:
                raise ConfigError(f"Unknown setting '{section}.{key}' in {source}. Known: {', '.join(sorted(known))}.")
            into.setdefault(section, {})[key] = value


def _site_tables(values: Any, source: str) -> list[Mapping[str, Any]]:
    """``[[sites]]``: a list of tables of known keys (a later source's list replaces an earlier one's)."""
    if not isinstance(values, list) or not all(isinstance(table, Mapping) for table in values):
        raise ConfigError(f"'sites' in {source} must be a list of tables: [[sites]] hosts = [...] origin = \"...\".")
    known = {f.name for f in dataclasses.fields(SiteSettings)}
    for table in values:
        unknown = sorted(set(table) - known)
        if unknown:
            raise ConfigError(f"Unknown setting 'sites.{unknown[0]}' in {source}. Known: {', '.join(sorted(known))}.")
    return list(values)


def _build_settings(merged: Mapping[str, Any]) -> Settings:
    sections: dict[str, Any] = {}
    for name, cls in _SECTIONS.items():
        hints = typing.get_type_hints(cls)
        values = {key: _coerce(f"{name}.{key}", raw, hints[key]) for key, raw in merged.get(name, {}).items()}
        sections[name] = cls(**values)
    sites = tuple(_site(table, merged) for table in merged.get("sites", ()))
    return Settings(**sections, sites=sites)


def _site(table: Mapping[str, Any], merged: Mapping[str, Any]) -> SiteSettings:
    """One ``[[sites]]`` table; its sections are the top-level ones with the site's keys over them."""
    try:
        return _site_settings(table, merged)
    except ConfigError as exc:
        hosts = table.get("hosts")
        named = f"The site {', '.join(map(str, hosts))}" if isinstance(hosts, list) and hosts else "A site"
        raise ConfigError(f"{named} ([[sites]]): {exc}") from None


def _site_settings(table: Mapping[str, Any], merged: Mapping[str, Any]) -> SiteSettings:
    hints = typing.get_type_hints(SiteSettings)
    values: dict[str, Any] = {}
    for key, raw in table.items():
        if key not in _SITE_SECTIONS:
            values[key] = _coerce(f"sites.{key}", raw, hints[key])
            continue
        if raw is None:
            continue
        cls = _SITE_SECTIONS[key]
        if not isinstance(raw, Mapping):
            raise ConfigError(f"'sites.{key}' must be a table of {key} settings, e.g. [sites.{key}].")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError(f"Unknown setting 'sites.{key}.{unknown[0]}'. Known: {', '.join(sorted(known))}.")
        section_hints = typing.get_type_hints(cls)
        combined = {**merged.get(key, {}), **raw}
        values[key] = cls(**{name: _coerce(f"sites.{key}.{name}", value, section_hints[name])
                             for name, value in combined.items()})  # fmt: skip
    return SiteSettings(**values)


def _coerce(key: str, raw: Any, target: Any) -> Any:
    try:
        return _convert(key, raw, target)
    except (TypeError, ValueError):
        raise ConfigError(f"Setting '{key}' has value {_shown(raw)}. Must be {_describe(key, target)}.") from None


def _convert(key: str, raw: Any, target: Any) -> Any:
    """Turn a TOML value or an environment string into the field's declared type, or raise ValueError."""
    if target is bool:
        return _to_bool(raw)
    if isinstance(raw, bool):
        raise ValueError(raw)
    if target is int:
        if key.endswith("_bytes"):
            return parse_size(raw)
        if isinstance(raw, float) and not raw.is_integer():
            raise ValueError(raw)
        return int(raw)
    if target is float:
        return float(raw)
    if target is str:
        if not isinstance(raw, str):
            raise ValueError(raw)
        return raw
    if typing.get_origin(target) is Literal:
        if raw not in typing.get_args(target):
            raise ValueError(raw)
        return raw
    items = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(items, list | tuple) or not all(isinstance(item, str) for item in items):
        raise ValueError(raw)
    return tuple(item.strip() for item in items if item.strip())


def _to_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.lower() in {"1", "true", "yes", "on", "0", "false", "no", "off"}:
        return raw.lower() in {"1", "true", "yes", "on"}
    raise ValueError


def _describe(key: str, target: Any) -> str:
    if target is int:
        return "a size such as 64MB or 1GiB" if key.endswith("_bytes") else "an integer"
    if target is float:
        return "a number"
    if target is bool:
        return "true or false"
    if target is str:
        return "a string"
    if typing.get_origin(target) is Literal:
        return "one of " + ", ".join(repr(choice) for choice in typing.get_args(target))
    return "a list of strings (comma-separated in the environment)"


def _shown(value: Any) -> str:
    text = str(value)
    return f"'{text[:80]}…'" if len(text) > 80 else f"'{text}'"


def _fail(key: str, value: Any, rule: str) -> typing.NoReturn:
    raise ConfigError(f"Setting '{key}' has value {_shown(value)}. {rule}")


def _require(condition: bool, key: str, value: Any, rule: str) -> None:
    if not condition:
        _fail(key, value, rule)
