"""One request as every interface hands it to the gate, and what the gate makes of it.

The ASGI middleware builds a Request from the scope, the WSGI middleware from the environ; from
then on nothing in the gate knows which interface it came through: the decision, the flow, the
counts and the access-log line all read this record.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from crawlergate.classify import Verdict
from crawlergate.keys import CacheKey


class Request:
    """The parts of a request the gate reads: the target as sent (``raw_path`` and ``query`` bytes), the
    decoded ``path``, the header pairs (lower-case names), the connection's address and scheme."""

    __slots__ = ("method", "path", "raw_path", "query", "headers", "peer", "scheme", "http_version")

    def __init__(
        self,
        method: str,
        path: str,
        raw_path: bytes,
        query: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        peer: str | None = None,
        scheme: str = "http",
        http_version: str = "1.1",
    ) -> None:
        self.method = method
        self.path = path
        self.raw_path = raw_path
        self.query = query
        self.headers = headers
        self.peer = peer
        self.scheme = scheme
        self.http_version = http_version


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
        "signed",
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
        # A Signature-Input header: the request may be a signed agent's (Web Bot Auth).
        self.signed = False
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
            elif name == b"signature-input":
                self.signed = True


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
