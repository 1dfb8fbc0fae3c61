"""Answering from a stored page: gzip or identity, conditional GET, HEAD; as plain (status, headers, body).

The stored gzip bytes go out as they are to clients that accept gzip (crawlers do); others get
the body decompressed. ``If-None-Match`` (weak comparison, RFC 9110 13.1.2) wins over
``If-Modified-Since``; either may turn the answer into ``304 Not Modified``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from email.utils import formatdate
from typing import Any, Protocol

from crawlergate.page import Page, parse_http_date


class ConditionalHeaders(Protocol):
    accept_encoding: bytes
    if_none_match: bytes
    if_modified_since: bytes
    range: bytes
    if_range: bytes


Response = tuple[int, list[tuple[bytes, bytes]], bytes]
# A response the gate gave itself, and the call that counts and logs it once it is sent: with None when it
# went whole, else the body bytes sent when the client left (LEFT_BEFORE_HEAD: before its head went).
Answered = tuple[Response, Callable[[int | None], None]]
LEFT_BEFORE_HEAD = -1
# A server that answers requests itself awaits this for an answer that must wait (None: the site answers).
Later = Coroutine[Any, Any, Answered | None]
# An ASGI ``send``: the adapters' to give, so the live gate imports no interface's types.
Send = Callable[[dict[str, Any]], Awaitable[None]]
# Bodies larger than this are sent in pieces of this size (the size of a socket's write buffer).
SEND_PIECE_BYTES = 64 * 1024
# Pages up to this size are gzipped, hashed or decompressed on the event loop (tens of microseconds);
# larger ones in a worker thread, so one big page never stalls every other request.
INLINE_PAGE_BYTES = 256 * 1024


def page_response(
    page: Page, method: str, request: ConditionalHeaders, *, outcome: bytes, now: float | None = None
) -> Response:
    """Status, headers and body answering with ``page``, honouring encoding, validators, one range and HEAD.

    ``now`` (a page served from the cache) adds its ``Age`` (RFC 9111 5.1): seconds since it was generated.
    """
    wire = page.wire_headers
    if wire is None:
        wire = _page_headers(page.etag, page.last_modified, page.headers)
        object.__setattr__(page, "wire_headers", wire)  # a memo on a frozen page: it never changes what it says
    headers = [*wire, (b"x-crawlergate", outcome)]
    if now is not None:
        headers.append((b"age", b"%d" % max(0, int(now - page.generated_at))))
    if page.status == 200 and _not_modified(page, request):
        return 304, headers, b""
    if accepts_gzip(request.accept_encoding):
        body = page.body_gz
        headers.append((b"content-encoding", b"gzip"))
    else:
        body = page.body()
    if page.content_type:  # none when the site gave none: the client sniffs, as it would from the site
        headers.append((b"content-type", page.content_type.encode("latin-1")))
    status = page.status
    if request.range and status == 200 and not request.if_range:
        status, body = _ranged(request.range, body, headers)
    headers.append((b"content-length", b"%d" % len(body)))
    return status, headers, b"" if method == "HEAD" else body


def _ranged(wanted: bytes, body: bytes, headers: list[tuple[bytes, bytes]]) -> tuple[int, bytes]:
    """206 with one range of ``body`` (the representation as sent: gzip bytes when gzip was chosen), 416 for
    a range past its end, or 200 and the whole body for anything else (several ranges, another unit): RFC
    9110 14.2 lets a server ignore Range, as nginx does for multiple ranges of a cached answer. An If-Range
    always gets the whole body: our validators are weak, and If-Range needs a strong one (RFC 9110 13.1.5).
    """
    unit, _, spec = wanted.partition(b"=")
    if unit.strip().lower() != b"bytes" or b"," in spec:
        return 200, body
    first, dash, last = spec.strip().partition(b"-")
    size = len(body)
    try:
        if not dash:
            return 200, body
        if first:
            start = int(first)
            end = min(int(last), size - 1) if last else size - 1
        else:  # the last N bytes
            start, end = max(0, size - int(last)), size - 1
    except ValueError:
        return 200, body
    if start < 0 or (last and first and int(last) < start):
        return 200, body
    if start >= size:
        headers.append((b"content-range", b"bytes */%d" % size))
        return 416, b""
    headers.append((b"content-range", b"bytes %d-%d/%d" % (start, end, size)))
    return 206, body[start : end + 1]


def plain_response(status: int, body: bytes, *, outcome: bytes | None, retry_after: bytes | None = None) -> Response:
    """A short plain-text answer of crawlergate's own (errors, refusals); never cached.

    ``outcome`` is the X-Crawlergate value, or None when the gate around this app will add it.
    """
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", b"%d" % len(body)),
        (b"cache-control", b"no-store"),
    ]
    if outcome is not None:
        headers.append((b"x-crawlergate", outcome))
    if retry_after is not None:
        headers.append((b"retry-after", retry_after))
    return status, headers, body


def json_response(
    status: int, body: dict[str, Any], *, extra: list[tuple[bytes, bytes]] | None = None, indent: int | None = 2
) -> Response:
    """A JSON answer of crawlergate's own (admin endpoints, PURGE); never cached."""
    data = json.dumps(body, indent=indent, sort_keys=True).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(data)),
        (b"cache-control", b"no-store"),
        (b"x-crawlergate", b"pass"),
    ]
    return status, headers + (extra or []), data


async def send_response(send: Send, response: Response) -> None:
    """Send a whole response over ASGI; a large body in pieces, so a slow reader holds one piece, not a copy.

    The server waits for a slow client's socket to drain between pieces (uvicorn's flow control), so
    a hundred slow readers of a 7 MB page cost the page once, not 700 MB of write buffers.
    """
    status, headers, body = response
    await send({"type": "http.response.start", "status": status, "headers": headers})
    if len(body) <= SEND_PIECE_BYTES:
        await send({"type": "http.response.body", "body": body})
        return
    for piece, more in pieces(body):
        await send({"type": "http.response.body", "body": piece, "more_body": more})


def pieces(body: bytes) -> Iterator[tuple[bytes, bool]]:
    """``body`` in pieces of SEND_PIECE_BYTES, each with whether more follow."""
    view = memoryview(body)
    for start in range(0, len(body), SEND_PIECE_BYTES):
        yield bytes(view[start : start + SEND_PIECE_BYTES]), start + SEND_PIECE_BYTES < len(body)


@functools.lru_cache(maxsize=4096)
def _page_headers(
    etag: str, last_modified: float, kept: tuple[tuple[str, str], ...]
) -> tuple[tuple[bytes, bytes], ...]:
    headers = [
        (b"etag", etag.encode()),
        (b"last-modified", formatdate(last_modified, usegmt=True).encode()),
        (b"accept-ranges", b"bytes"),
    ]
    if not any(name == "vary" for name, _ in kept):
        headers.append((b"vary", b"Accept-Encoding"))
    return (*headers, *((name.encode("latin-1"), value.encode("latin-1")) for name, value in kept))


@functools.lru_cache(maxsize=256)
def accepts_gzip(accept_encoding: bytes) -> bool:
    """True unless the client leaves gzip out or refuses it with q=0."""
    for item in accept_encoding.lower().split(b","):
        coding, _, params = item.strip().partition(b";")
        if coding in (b"gzip", b"x-gzip", b"*"):
            quality = params.strip()
            return not (quality.startswith(b"q=") and _is_zero(quality[2:]))
    return False


def _not_modified(page: Page, request: ConditionalHeaders) -> bool:
    if request.if_none_match:
        wanted = request.if_none_match.decode("latin-1")
        if wanted.strip() == "*":
            return True
        opaque = page.etag.removeprefix("W/")
        return any(tag.strip().removeprefix("W/") == opaque for tag in wanted.split(","))
    if request.if_modified_since:
        since = parse_http_date(request.if_modified_since.decode("latin-1"))
        return since is not None and page.last_modified <= since
    return False


def _is_zero(text: bytes) -> bool:
    try:
        return float(text) == 0
    except ValueError:
        return False
