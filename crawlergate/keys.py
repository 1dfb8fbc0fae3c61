"""URL to cache key: which requests are cacheable, and the one normal form of each page's URL.

The key is the normalised path and query alone. The Host header, X-Forwarded-* and the scheme do
not enter it: a gate protects one site, and a client cannot poison the page of a key by sending
another host. Query parameters that do not count (tracking, sessions, anything outside a path's
allow-list) are dropped from the key *and* from the guest sub-request, so a stored page always
matches its key. The digest names the page in L1 and L2; no path on disk is ever built from a URL.

    keys = KeyMaker.from_settings(settings)
    keys.key_for(b"/showthread.php", b"t=12&utm_source=x")  # CacheKey(target="/showthread.php?t=12", ...)
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import quote, unquote, unquote_plus, unquote_to_bytes, urlsplit

from crawlergate.config import Settings
from crawlergate.rules import CacheRules, SiteProfile, load_cache_rules, load_site_profiles, resolve_rule_files

# Keys longer than this are not cached: real page URLs are far shorter, and a long key is an attack
# on the cache's memory rather than a page (memcached itself caps keys at 250 bytes; we hash them).
MAX_TARGET_CHARS = 2048

KEY_MEMO_SIZE = 65536
# Only URLs up to this length are memoised, so the memo holds at most ~65536 x 2 x 512 bytes of URLs
# whatever a client sends; longer (rare) ones are normalised each time.
MEMO_MAX_CHARS = 512

_ESCAPE = re.compile(rb"%([0-9A-Fa-f]{2})")
# Queries made only of these need no decoding or re-encoding.
_PLAIN_QUERY = re.compile(r"[A-Za-z0-9\-._~=&]*")
# Most paths are already in normal form (no escapes, no dot segments): they skip the work.
_ALREADY_NORMAL = re.compile(rb"/[A-Za-z0-9\-._~/:@!$&'()*+,;=]*")
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
# Bytes a query may not hold literally (RFC 3986 3.4: pchar, "/" and "?"), and a '%' that starts no escape.
_QUERY_UNSAFE = re.compile(rb"[^A-Za-z0-9\-._~!$'()*+,;=:@/?%&]")
_STRAY_PERCENT = re.compile(rb"%(?![0-9A-Fa-f]{2})")
_PATH_SESSION = re.compile(rb"(?i);jsessionid=[^/;?]*")
# Characters that may stay literal in a normalised path (RFC 3986 pchar without '%').
_PATH_SAFE = "/:@!$&'()*+,;="


def _name_of(pair: tuple[str, str]) -> str:
    return pair[0]


def _name_in(pair: str) -> str:
    """The parameter's name as the site reads it: ``a+b`` and ``a%20b`` are one name, whose values must keep their
    order (sorted by the spelling, ``a%20b=2&a+b=1`` would reach the site as another page)."""
    return unquote_plus(pair.partition("=")[0], errors="replace")


@dataclass(frozen=True, slots=True)
class CacheKey:
    """A page's identity: ``target`` is what the guest sub-request fetches, ``digest`` names it in the stores."""

    target: str
    digest: str


class KeyMaker:
    """Decides cacheability and builds keys from raw request paths and query strings."""

    def __init__(self, rules: CacheRules, *, admin_prefix: str, max_target_chars: int = MAX_TARGET_CHARS) -> None:
        self.rules = rules
        self._admin_prefix = admin_prefix
        self._max_target_chars = max_target_chars
        # Requests repeat URLs (a hit is a repeat by definition): normalising once per URL saves ~15 µs a request.
        self._memo = functools.lru_cache(maxsize=KEY_MEMO_SIZE)(self._key_for)

    @classmethod
    def from_settings(cls, settings: Settings, profiles: Sequence[SiteProfile] | None = None) -> KeyMaker:
        """The key maker of a gate: the cache rules file and site profiles, the admin prefix never cacheable."""
        path = resolve_rule_files(settings.classify.rules_dir, (settings.cache.rules_file,), ())[0]
        if profiles is None:
            profiles = load_site_profiles(settings.classify.rules_dir, settings.cache.sites)
        return cls(
            load_cache_rules(path, profiles),
            admin_prefix=settings.admin.prefix,
            max_target_chars=settings.cache.max_target_chars,
        )

    def why_not_cacheable(self, raw_path: bytes, query_string: bytes = b"") -> str:
        """A sentence saying why a URL has no key (for ``crawlergate check``); empty when it has one."""
        if len(raw_path) + len(query_string) > self._max_target_chars:
            return f"the URL is longer than {self._max_target_chars} characters"
        path = normalise_path(raw_path)
        if path is None:
            return "the path is not a plain absolute path (NUL byte, or it climbs above the root)"
        if path == self._admin_prefix or path.startswith(self._admin_prefix + "/"):
            return "the path is under the admin prefix"
        if self.rules.include.match(path) is None:
            return "the path matches no [paths] include pattern of the cache rules"
        if self.rules.exclude is not None and self.rules.exclude.match(path) is not None:
            pattern = next((p for p in self.rules.exclude_patterns if fnmatch.fnmatchcase(path, p)), "")
            return f"the path matches the exclude pattern {pattern!r} (cache rules or a site profile)"
        if path.lower().endswith(self.rules.static_extensions):
            return "the path ends in a static file extension ([paths] static_extensions)"
        query = self.normalise_query(path, query_string)
        for pattern in (p[1:] for p in self.rules.exclude_patterns if p.startswith("?")):
            glob = pattern if "=" in pattern else pattern + "=*"
            for pair in query.split("&") if query else ():
                name, _, value = pair.partition("=")
                if fnmatch.fnmatch(f"{unquote(name)}={unquote(value)}".lower(), glob.lower()):
                    return f"the query parameter {unquote(name)!r} matches the [query] exclude pattern {pattern!r}"
        return ""

    def key_for(self, raw_path: bytes, query_string: bytes = b"") -> CacheKey | None:
        """The key of a GET/HEAD request, or None when the URL is not cacheable."""
        length = len(raw_path) + len(query_string)
        if length > self._max_target_chars:
            return None
        if length > MEMO_MAX_CHARS:
            return self._key_for(raw_path, query_string)
        return self._memo(raw_path, query_string)

    def key_for_url(self, url: str) -> CacheKey | None:
        """The key of a path with its query (an absolute URL's host is ignored), as a request would have."""
        if url.startswith(("http://", "https://")):
            parts = urlsplit(url)
            url = (parts.path or "/") + ("?" + parts.query if parts.query else "")
        raw_path, _, query = url.partition("?")
        return self.key_for(raw_path.encode("utf-8", "surrogateescape"), query.encode("utf-8", "surrogateescape"))

    def _key_for(self, raw_path: bytes, query_string: bytes) -> CacheKey | None:
        path = normalise_path(raw_path)
        if path is None or not self.is_cacheable_path(path):
            return None
        query = self.normalise_query(path, query_string)
        if query and self.rules.exclude_params is not None and self._excluded_query(query):
            return None
        target = f"{path}?{query}" if query else path
        if len(target) > self._max_target_chars:
            return None
        return CacheKey(target=target, digest=digest_of(target))

    def too_long_once_normalised(self, raw_path: bytes, query_string: bytes) -> bool:
        """Whether a cacheable URL has no key only because escaping made it longer than the limit (each byte may
        become three characters): a request to refuse, not to pass on unjudged."""
        path = normalise_path(raw_path)
        if path is None or not self.is_cacheable_path(path):
            return False
        query = self.normalise_query(path, query_string)
        return len(path) + 1 + len(query) > self._max_target_chars

    def is_cacheable_path(self, path: str) -> bool:
        if path == self._admin_prefix or path.startswith(self._admin_prefix + "/"):
            return False
        rules = self.rules
        if rules.include.match(path) is None:
            return False
        if rules.exclude is not None and rules.exclude.match(path) is not None:
            return False
        return not path.lower().endswith(rules.static_extensions)

    def normalise_query(self, path: str, query_string: bytes) -> str:
        """Re-encoded parameters that count for this path, sorted by name; the others are dropped.

        Values of one name keep the order they came in: PHP reads ``a[]=zeta&a[]=alpha`` as a list, and
        "first value wins" frameworks read ``x=2&x=1`` as 2, so they are different pages.
        """
        if not query_string:
            return ""
        text = query_string.decode("latin-1")
        keep = self.rules.keep_params.get(path)
        if _PLAIN_QUERY.fullmatch(text):
            # Nothing to decode or re-encode (the common case): split, filter and sort as they stand.
            pairs = [part.partition("=")[::2] for part in text.split("&") if part]
            counted = sorted(((name, value) for name, value in pairs if self._counts(name, keep)), key=_name_of)
            return "&".join(f"{name}={value}" for name, value in counted)
        # Escapes normalised as in paths, bytes a query may not hold escaped, and nothing else touched: the
        # site gets "+", "," and its own byte encoding as the client sent them, or it may redirect to them.
        normalised: list[str] = []
        for part in query_string.split(b"&"):
            if part:
                pair = _normalise_query_part(part)
                name = pair.partition("=")[0]
                if self._counts(unquote(name, errors="replace"), keep):
                    normalised.append(pair)
        return "&".join(sorted(normalised, key=_name_in))

    def _excluded_query(self, query: str) -> bool:
        pattern = self.rules.exclude_params
        assert pattern is not None
        for pair in query.split("&"):
            name, _, value = pair.partition("=")
            if pattern.fullmatch(f"{unquote(name)}={unquote(value)}") is not None:
                return True
        return False

    def _counts(self, name: str, keep: frozenset[str] | None) -> bool:
        if keep is not None and name.lower() not in keep:
            return False
        drop = self.rules.drop_params
        return drop is None or drop.fullmatch(name) is None


def normalise_path(raw_path: bytes) -> str | None:
    """RFC 3986 normal form of a path, or None for one that must not be cached.

    Unreserved characters are decoded, other escapes upper-cased (an encoded slash stays encoded,
    so it never becomes a segment), dot segments removed. NUL bytes, a path that climbs above the
    root, or one that does not start with '/' are refused.
    """
    if _ALREADY_NORMAL.fullmatch(raw_path) and b"/." not in raw_path and b";" not in raw_path:
        return raw_path.decode("ascii")
    # Java servlet session ids ride in the path (/page;jsessionid=...): never part of a page's name.
    raw_path = _PATH_SESSION.sub(b"", raw_path)
    if not raw_path.startswith(b"/") or b"\x00" in raw_path:
        return None
    decoded = _ESCAPE.sub(_normalise_escape, raw_path)
    if b"%00" in decoded:
        return None
    segments: list[bytes] = []
    for segment in decoded.split(b"/")[1:]:
        if segment == b"..":
            if not segments:
                return None
            segments.pop()
        elif segment != b".":
            segments.append(segment)
    if decoded.endswith((b"/.", b"/..")):
        segments.append(b"")
    text = "/" + "/".join(quote(segment, safe=_PATH_SAFE + "%") for segment in segments)
    return text


def _normalise_query_part(part: bytes) -> str:
    part = _STRAY_PERCENT.sub(b"%25", part)
    part = _ESCAPE.sub(_normalise_escape, part)
    return _QUERY_UNSAFE.sub(lambda match: b"%%%02X" % match.group()[0], part).decode("ascii")


def digest_of(target: str) -> str:
    return hashlib.blake2b(target.encode("utf-8", "surrogateescape"), digest_size=16).hexdigest()


def _normalise_escape(match: re.Match[bytes]) -> bytes:
    byte = unquote_to_bytes(match.group())
    if byte[0] in _UNRESERVED:
        return byte
    return match.group().upper()
