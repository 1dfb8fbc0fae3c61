"""May a guest fill's answer be stored, for how long, with which headers, and if not, why not.

Storage mode ``guest`` (the default) knows what an ordinary shared cache does not: a stored page is
only ever served to requests without a session, so a guest fill's answer is the guest page by
construction. ``Set-Cookie``, ``private``, ``no-cache``, ``must-revalidate``, ``max-age=0``, a past
``Expires`` and ``Vary: Cookie`` therefore do not stop it (real sites send them on every guest page:
Trac, Django forms, MediaWiki); the cookies are dropped. ``no-store`` and ``Vary: *`` still do.
Mode ``rfc9111`` is a strict shared cache (RFC 9111 section 3) for operators who want one.

    policy = StoragePolicy(settings.cache)
    verdict = policy.judge(response, "/wiki/Start")
    page = policy.page(response, verdict, now=time.time()) if verdict.storable else None
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from crawlergate.config import CacheSettings
from crawlergate.gate.origin import OriginResponse
from crawlergate.keys import KeyMaker, normalise_path
from crawlergate.page import Page, parse_http_date

logger = logging.getLogger(__name__)

# Why a page was not stored: the labels of `stats`, metrics and `crawlergate check`.
NOT_STORED_REASONS = (
    "excluded",  # the URL is not cacheable by the cache rules
    "status",  # a status that is never stored (only 200, 301, 308, 404 and 410 are)
    "no-store",  # Cache-Control: no-store
    "vary-star",  # Vary: *
    "set-cookie-strict",  # rfc9111 mode: the answer sets a cookie
    "cache-control-strict",  # rfc9111 mode: private, no-cache, max-age=0 or a past Expires
    "vary-strict",  # rfc9111 mode: Vary on a request header other than Accept-Encoding
    "empty",  # a 200 without a body
    "incomplete",  # the body ended early, or disagrees with Content-Length
    "too-big",  # larger than l2.page_max_bytes
    "encoding",  # a content coding the gate cannot read (br, zstd, two codings, gzip with bytes after its end)
    "stream",  # an event stream (text/event-stream): it never ends
    "redirect-to-self",  # a redirect to the very URL it answers: stored, it would loop forever
    "origin-error",  # the site failed, timed out or answered 5xx or 429
)

# Statuses stored besides 200, each with its own lifetime.
_REDIRECTS = (301, 308)
_GONE = (404, 410)


@dataclass(frozen=True, slots=True)
class StoreVerdict:
    """Whether and how long an answer is stored: ``reasons`` (label, explanation) are why not."""

    ttl_seconds: float
    reasons: tuple[tuple[str, str], ...] = ()
    # What guest mode stored the page despite, for `crawlergate check`.
    set_aside: tuple[str, ...] = ()

    @property
    def storable(self) -> bool:
        return not self.reasons


class StoragePolicy:
    """Judges guest answers by the storage mode and builds the Page that is stored."""

    def __init__(self, settings: CacheSettings, keys: KeyMaker | None = None) -> None:
        self.settings = settings
        # Redirects are compared by key: a site that redirects to its own spelling of a URL ("+" for
        # "%20", another parameter order) redirects to the page the key names, a loop once stored.
        self._keys = keys
        self.strict = settings.storage_mode == "rfc9111"
        self._ignore_no_store = keys is not None and keys.rules.ignore_no_store
        self._stored_headers = frozenset(name.lower() for name in settings.stored_headers)
        self._self_redirect_logged = False

    def judge(self, response: OriginResponse, target: str, *, now: float) -> StoreVerdict:
        """Every reason the answer to ``target`` must not be stored, or how long it may be."""
        reasons: list[tuple[str, str]] = []
        set_aside: list[str] = []
        status = response.status
        default_ttl = self._status_ttl(status)
        if status == 200 and self._keys is not None:
            default_ttl = self._keys.rules.max_age_for(target.partition("?")[0]) or default_ttl
        if status >= 500 or status == 429:  # 429: the site asks the gate to slow down, as nginx's use_stale http_429
            reasons.append(("origin-error", f"the site answered {status}"))
        elif default_ttl is None:
            reasons.append(("status", f"status {status} is never stored (200, 301, 308, 404 and 410 are)"))
        if 300 <= status < 400 and _redirects_to(response.header("location"), target, self._keys):
            reasons.append(("redirect-to-self", f"Location {response.header('location')} is the URL it answers"))
            self._log_self_redirect(target, response)
        if not response.complete:
            reasons.append(("incomplete", "the body ended before the site finished it or before its Content-Length"))
        elif status == 200 and not response.body:
            reasons.append(("empty", "a 200 without a body"))
        control = _cache_control(response.all("cache-control"))
        if "no-store" in control:
            if self._ignore_no_store and not self.strict:
                set_aside.append("Cache-Control: no-store (the site profile's [storage] ignore_no_store)")
            else:
                reasons.append(("no-store", "Cache-Control: no-store"))
        vary = _vary_tokens(response.all("vary"))
        if "*" in vary:
            reasons.append(("vary-star", "Vary: *"))
        explicit_ttl = _explicit_ttl(control, response.header("expires"), now)
        for label, explanation in self._private_markers(response, control, vary, explicit_ttl):
            if self.strict:
                reasons.append((label, explanation))
            else:
                set_aside.append(explanation)
        if reasons or default_ttl is None:
            return StoreVerdict(0.0, tuple(reasons), tuple(set_aside))
        ttl = default_ttl
        if explicit_ttl is not None and explicit_ttl > 0:
            # A site's own positive lifetime counts; redirects and gone pages never outlive their defaults.
            ttl = explicit_ttl if status == 200 else min(explicit_ttl, default_ttl)
        return StoreVerdict(ttl, (), tuple(set_aside))

    def page(self, response: OriginResponse, verdict: StoreVerdict, *, now: float, generation_ms: float = 0.0) -> Page:
        """The Page to store for an answer judged storable: kept headers only, the site's gzip as it came."""
        kept = [(name, value) for name, value in response.headers if name in self._stored_headers]
        vary = [token for token in _vary_tokens(response.all("vary")) if token != "accept-encoding"]
        if vary:
            kept.append(("vary", ", ".join(["Accept-Encoding", *(_title_case(token) for token in vary)])))
        last_modified = response.header("last-modified")
        return Page.from_response(
            response.status,
            response.body,
            content_type=response.header("content-type") or "",
            generated_at=now,
            ttl_seconds=verdict.ttl_seconds,
            last_modified=parse_http_date(last_modified) if last_modified else None,
            headers=tuple(kept),
            body_gz=response.body_gz,
            generation_ms=generation_ms,
            origin_etag=response.header("etag"),
        )

    def _status_ttl(self, status: int) -> float | None:
        if status == 200:
            return self.settings.ttl_seconds
        if status in _REDIRECTS:
            return self.settings.redirect_ttl_seconds
        if status in _GONE:
            return self.settings.not_found_ttl_seconds
        return None

    def _private_markers(
        self, response: OriginResponse, control: dict[str, str], vary: list[str], explicit_ttl: float | None
    ) -> list[tuple[str, str]]:
        """What makes an answer private to a strict shared cache (RFC 9111 3, 5.2.2)."""
        markers = []
        cookies = response.all("set-cookie")
        if cookies:
            names = ", ".join(cookie.partition("=")[0].strip() for cookie in cookies)
            markers.append(("set-cookie-strict", f"Set-Cookie ({names})"))
        for directive in ("private", "no-cache"):
            if directive in control:
                markers.append(("cache-control-strict", f"Cache-Control: {directive}"))
        if explicit_ttl is not None and explicit_ttl <= 0:
            given = next((f"{name}={control[name]}" for name in ("s-maxage", "max-age") if name in control), None)
            lifetime = f"Cache-Control: {given}" if given else f"Expires: {response.header('expires')} (past)"
            markers.append(("cache-control-strict", lifetime))
        others = [token for token in vary if token not in ("accept-encoding", "*")]
        if others:
            markers.append(("vary-strict", "Vary: " + ", ".join(others)))
        return markers

    def _log_self_redirect(self, target: str, response: OriginResponse) -> None:
        if self._self_redirect_logged:
            return
        self._self_redirect_logged = True
        logger.error(
            "The site redirects the gate's fill of %s to itself (%s, Location: %s): nothing like it is stored. "
            "Set server.public_url to the address crawlers use (https:// behind a TLS front) and make the site "
            "trust X-Forwarded-Proto (Django: SECURE_PROXY_SSL_HEADER). Logged once; counted as redirect-to-self.",
            target,
            response.status,
            response.header("location"),
        )


def _cache_control(values: list[str]) -> dict[str, str]:
    directives: dict[str, str] = {}
    for value in values:
        for item in value.split(","):
            name, _, argument = item.strip().partition("=")
            if name:
                directives.setdefault(name.strip().lower(), argument.strip().strip('"'))
    return directives


def _explicit_ttl(control: dict[str, str], expires: str | None, now: float) -> float | None:
    """The site's own freshness lifetime for a shared cache (RFC 9111 4.2.1), or None when it gives none."""
    for directive in ("s-maxage", "max-age"):
        if directive in control:
            value = control[directive]
            return float(value) if value.isdigit() else 0.0
    if expires is not None:
        when = parse_http_date(expires)
        # An Expires that is not a date ("0", "-1") means already expired (RFC 9111 5.3).
        return when - now if when is not None else 0.0
    return None


def _vary_tokens(values: list[str]) -> list[str]:
    tokens: list[str] = []
    for value in values:
        for item in value.split(","):
            token = item.strip().lower()
            if token and token not in tokens:
                tokens.append(token)
    return tokens


def _title_case(header: str) -> str:
    return "-".join(part.capitalize() for part in header.split("-"))


def _redirects_to(location: str | None, target: str, keys: KeyMaker | None) -> bool:
    """True when a redirect's Location names ``target`` again, whatever scheme and host it carries.

    Keys ignore the host and scheme, so a redirect from http to https (or to another host name) of
    the same path would be served to the crawlers that asked for exactly that URL: a loop.
    """
    if not location:
        return False
    # A relative Location (``x``, ``./x``, ``../dir/x``, ``?page=2``) is read against the URL it answers, as a
    # crawler reads it.
    parts = urlsplit(urljoin("http://site.invalid" + target.partition("#")[0], location.strip()))
    if not parts.path.startswith("/"):
        return False
    raw_path = parts.path.encode("utf-8", "surrogateescape")
    if keys is not None:
        key = keys.key_for(raw_path, parts.query.encode("utf-8", "surrogateescape"))
        if key is not None:
            return key.target == target
    path = normalise_path(raw_path)
    wanted_path, _, wanted_query = target.partition("?")
    return path == wanted_path and parts.query == wanted_query
