"""Guest sub-requests, whatever the origin: what a fill asks and what the site answered.

A fill looks like an anonymous outside visitor of the public site: no Cookie, no Authorization, no
client forwarding headers of its own; ``Host``, ``X-Forwarded-Host`` and ``X-Forwarded-Proto`` from
``server.public_url``; ``X-Forwarded-For`` the address of the client it fetches for, or a
documentation address (never loopback, so no page is fetched with local rights); and
``Accept-Encoding: gzip``, whose answer is stored as it came once it is known to be whole. The
in-process origins that call the wrapped app, ASGI or WSGI, are in ``crawlergate.adapters.inapp``.

    response = OriginResponse(200, (("content-type", "text/html"),), b"<p>hello</p>")
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from crawlergate import __version__
from crawlergate.errors import OriginError

if TYPE_CHECKING:
    from crawlergate.devices import DeviceClasses

GUEST_USER_AGENT = f"crawlergate/{__version__} (guest page fill)"
_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
logger = logging.getLogger(__name__)

_EVENT_STREAM = re.compile(r"\s*text/event-stream\s*(?:;|$)", re.IGNORECASE)
# The ASGI scope extension that tells the reverse proxy a request is the gate's own fill, whose
# forwarding headers were set by the gate and are sent on as they are.
FILL_EXTENSION = "crawlergate.fill"
# RFC 5737 TEST-NET-1: an address no real client has, for fills no outside client triggered.
DEFAULT_FILL_CLIENT = "192.0.2.1"
# Networks of a site's own clients (RFC 1918, carrier-grade NAT, IPv6 unique local): a site may show them an
# internal view.
_INTERNAL = tuple(
    ipaddress.ip_network(network) for network in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10",
                                                   "fc00::/7")
)  # fmt: skip


class PassedOn(OriginError):
    """The site answered, with a page the gate does not store: the crawler's own request is passed to the site, and
    nothing is refetched in vain. ``reason`` is its ``not_stored`` label; ``of_the_page`` False when the request,
    not the page, is why (the next request of the page is filled)."""

    reason = ""
    of_the_page = True


class PageTooLarge(PassedOn):
    """Raised when a guest page exceeds the size limit, likely a download rather than a page."""

    reason = "too-big"


class EventStream(PassedOn):
    """Raised when a guest answer is an event stream (``text/event-stream``): it never ends, so it is no page, and a
    fill that waited for its end would hold a worker until its timeout."""

    reason = "stream"


class UnknownSite(PassedOn):
    """Raised when a fill has no site to ask as: no ``server.public_url``, and the request came on no socket
    address (a unix socket). The crawler's request goes to the site; a Host a client sends is never asked as."""

    reason = "no-public-url"
    of_the_page = False


class UndecodablePage(PassedOn):
    """Raised when a guest page comes in a content coding the gate cannot read (br, zstd, an unknown one, two
    codings, gzip with bytes after its end): browsers may read it; the gate passes it on as the site sent it."""

    reason = "encoding"


@dataclass(frozen=True, slots=True)
class PublicSite:
    """The site as the world sees it: the Host and scheme a fill carries."""

    scheme: str
    host: str

    @classmethod
    def from_url(cls, url: str) -> PublicSite:
        parts = urlsplit(url)
        return cls(parts.scheme or "http", parts.netloc)

    @classmethod
    def from_server(cls, scheme: str, server: tuple[str, int | str | None] | list[Any]) -> PublicSite:
        """The site at a server's own address (the ASGI ``server`` pair, or SERVER_NAME and SERVER_PORT)."""
        host, port = server[0], server[1]
        name = f"[{host}]" if ":" in host else host
        default = "443" if scheme == "https" else "80"
        return cls(scheme, name if port is None or str(port) == default else f"{name}:{port}")

    @property
    def base(self) -> str:
        return f"{self.scheme}://{self.host}"


@dataclass(frozen=True, slots=True)
class OriginResponse:
    """What the site answered to a guest sub-request; header names are lower-case.

    ``body`` is decoded; ``body_gz`` holds the site's own gzip bytes when it sent gzip (already
    checked by decoding). ``complete`` is False when the body ended before the site said it was
    done or before its Content-Length: such a body is never stored.
    """

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    body_gz: bytes | None = None
    complete: bool = True

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def all(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key == name]


class GuestBody:
    """A guest answer's body as it arrives, bounded in size; ``response`` makes the OriginResponse."""

    def __init__(self, target: str, max_bytes: int) -> None:
        self.target = target
        self.max_bytes = max_bytes
        self.chunks: list[bytes] = []
        self.size = 0

    def started(self, content_type: str) -> None:
        """The answer began with this Content-Type: an event stream is refused before any of its body is read."""
        if _EVENT_STREAM.match(content_type):
            raise EventStream(f"{self.target}: an event stream (text/event-stream), which never ends")

    def add(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.max_bytes:
            raise PageTooLarge(f"{self.target}: more than {self.max_bytes} bytes")
        self.chunks.append(chunk)

    def response(self, status: int, headers: Iterable[tuple[str, str]], *, finished: bool = True) -> OriginResponse:
        listed = tuple(headers)
        raw = b"".join(self.chunks)
        length = next((value.strip() for name, value in listed if name == "content-length"), None)
        complete = finished and (length is None or not length.isdigit() or int(length) == len(raw))
        return _decoded(self.target, OriginResponse(status, listed, raw, complete=complete), self.max_bytes)


def content_type_of(raw_headers: Iterable[tuple[bytes, bytes]]) -> str:
    """The Content-Type of an answer's raw headers (ASGI's, the origin transport's), or ""."""
    return next((value.decode("latin-1") for name, value in raw_headers if name.lower() == b"content-type"), "")


def fill_headers(public: PublicSite, client: str, user_agent: str = GUEST_USER_AGENT) -> list[tuple[str, str]]:
    """The request headers of a fill, as a visitor of the public site would arrive through a front proxy."""
    return [
        ("host", public.host),
        ("x-forwarded-host", public.host),
        ("x-forwarded-proto", public.scheme),
        ("x-forwarded-for", client),
        ("user-agent", user_agent),
        ("accept", _ACCEPT),
        ("accept-encoding", "gzip"),
    ]


@functools.lru_cache(maxsize=4096)  # a crawler's addresses come back, and parsing one takes ~4 µs
def fill_client(address: str | None, default: str) -> str:
    """The address a fill fetches for: the requesting client's, unless there is none or it is no public address
    (loopback, a private network's, link-local): a site may show those an internal view, which must never be
    stored for everyone."""
    if not address:
        return default
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return default
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    internal = ip.is_loopback or ip.is_link_local or ip.is_unspecified or any(ip in net for net in _INTERNAL)
    return default if internal else address


def fill_target(target: str, devices: DeviceClasses | None) -> tuple[str, str]:
    """The URL a fill asks for, and its user agent: a device copy's target ends in ``#class`` (devices.py)."""
    url, _, device_name = target.partition("#")
    device = devices.named(device_name) if device_name and devices is not None else None
    if device is None:
        return url, GUEST_USER_AGENT
    return url, f"{device.fill_user_agent} {GUEST_USER_AGENT}"


def public_site(public: PublicSite | None, arrived_at: PublicSite | None, target: str, said: set[str]) -> PublicSite:
    """The site a fill asks as: the public one, else the server's own address the request arrived at, said once
    (``said``: the addresses said already)."""
    if public is not None:
        return public
    if arrived_at is None:
        if "" not in said:
            said.add("")
            logger.warning(
                "server.public_url is not set, and the server's own address is unknown (a unix socket, whose "
                "server name is the client's Host): crawlers get the live site, nothing is stored. Set "
                "server.public_url (CRAWLERGATE_SERVER_PUBLIC_URL) to the address crawlers use."
            )
        raise UnknownSite(f"{target}: no server.public_url, and no server address to ask as; set server.public_url")
    if arrived_at.base not in said:
        said.add(arrived_at.base)
        logger.warning(
            "server.public_url is not set: fills ask the site for pages as %s, the address its server listens on "
            "(Host and X-Forwarded-Host). A site that checks the Host (Django's ALLOWED_HOSTS) refuses them, and "
            "links it makes absolute point there. Set server.public_url (CRAWLERGATE_SERVER_PUBLIC_URL) to the "
            "address crawlers use, e.g. https://www.example.org.",
            arrived_at.base,
        )
    return arrived_at


def _decoded(target: str, response: OriginResponse, max_bytes: int) -> OriginResponse:
    """Decode the body the site compressed; its gzip bytes, once known to be whole, are kept to be stored.

    The size limit holds for the decoded body too: a small gzip can inflate a thousandfold (a "bomb").
    """
    # Codings in the order applied, over every Content-Encoding line (RFC 9110 5.3: repeated lines are one list).
    listed = (coding.strip() for coding in ",".join(response.all("content-encoding")).lower().split(","))
    codings = [coding for coding in listed if coding not in ("", "identity")]
    if not codings or not response.complete:
        return response
    encoding = codings[0]
    if len(codings) > 1 or encoding not in ("gzip", "x-gzip", "deflate"):
        raise UndecodablePage(f"{target}: the site answered in {', '.join(codings)!r}, which a fill did not ask for")
    try:
        if encoding == "deflate":
            try:
                body = _inflate(response.body, max_bytes)
            except zlib.error:
                body = _inflate(response.body, max_bytes, raw_deflate=True)
            body_gz = None
        else:
            body, body_gz = _inflate(response.body, max_bytes, gzip_wrapped=True), response.body
    except _CutStream as exc:
        raise OriginError(f"{target}: the site sent a broken {encoding} body: {exc}") from exc
    except zlib.error as exc:
        raise UndecodablePage(f"{target}: the site sent a {encoding} body the gate cannot read: {exc}") from exc
    if body is None:
        raise PageTooLarge(f"{target}: more than {max_bytes} bytes once decompressed")
    headers = tuple((k, v) for k, v in response.headers if k not in ("content-encoding", "content-length"))
    return OriginResponse(response.status, headers, body, body_gz=body_gz, complete=True)


class _CutStream(zlib.error):
    """A compressed body that stops before its end: an answer cut short, not one in a coding the gate cannot read."""


def _inflate(data: bytes, max_bytes: int, *, gzip_wrapped: bool = False, raw_deflate: bool = False) -> bytes | None:
    """Decompress at most ``max_bytes`` (None past that); raises _CutStream on a cut stream, zlib.error on a broken
    one.

    gzip may hold several members, one after the other (RFC 1952); "deflate" is zlib-wrapped by the
    standard (RFC 9110 8.4.1.2), but some servers send it raw.
    """
    wbits = zlib.MAX_WBITS | 16 if gzip_wrapped else -zlib.MAX_WBITS if raw_deflate else zlib.MAX_WBITS
    parts: list[bytes] = []
    size = 0
    rest = data
    while rest:
        inflater = zlib.decompressobj(wbits)
        part = inflater.decompress(rest, max_bytes + 1 - size)
        size += len(part)
        if size > max_bytes:
            return None
        if not inflater.eof:
            if inflater.unconsumed_tail:
                return None  # stopped at the limit with input left: larger than allowed
            raise _CutStream("the compressed stream ends early")
        parts.append(part)
        rest = inflater.unused_data if gzip_wrapped else b""
    return b"".join(parts)
