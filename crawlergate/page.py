"""A stored guest page: gzip body plus the metadata needed to serve it, in one self-checking blob.

The same bytes go to L1 and L2, so a page read from either is served without another lookup. The
blob carries the body's length and a CRC-32 of the whole record, metadata and body, so a page cut
short or damaged on disk (a crash, a full disk, a flipped bit) is detected on read and never served;
the status is range-checked too.

    page = Page.from_response(200, body, content_type="text/html", generated_at=time.time())
    Page.from_bytes(page.to_bytes()) == page
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import struct
import zlib
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime

# CGP2: the CRC covers metadata and body (CGP1's covered the body alone; such pages read as corrupt
# and are fetched again).
_MAGIC = b"CGP2"
_HEADER = struct.Struct("!4sII")
# gzip level 6 is zlib's default: within a few percent of level 9 at a third of the CPU.
GZIP_LEVEL = 6
# A page's metadata is its status, validators and kept headers: far below this in any page stored.
MAX_META_BYTES = 1 << 20


class CorruptPage(ValueError):
    """Raised when stored bytes are not a whole page, likely because a write was cut short."""


@dataclass(frozen=True, slots=True, weakref_slot=True)
class Page:
    """One cached response: status, gzip body, validators and the headers worth keeping."""

    status: int
    body_gz: bytes
    content_type: str
    etag: str
    last_modified: float
    generated_at: float
    expires_at: float
    headers: tuple[tuple[str, str], ...] = ()
    # How long the site took to answer the fill: what each crawler hit on this page spares the origin.
    generation_ms: float = 0.0
    # The validators and kept headers as sent, worked out at the page's first answer (gate/answer.py): a page
    # held in memory answers many crawlers. Not stored, not compared.
    wire_headers: tuple[tuple[bytes, bytes], ...] | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def from_response(
        cls,
        status: int,
        body: bytes,
        *,
        content_type: str,
        generated_at: float,
        ttl_seconds: float,
        last_modified: float | None = None,
        headers: tuple[tuple[str, str], ...] = (),
        body_gz: bytes | None = None,
        generation_ms: float = 0.0,
        origin_etag: str | None = None,
    ) -> Page:
        """Compress a response once (``mtime=0``, so equal bodies give equal bytes) and hash it for the ETag.

        ``body_gz`` is the site's own gzip of ``body``, stored as it came instead of compressing again.
        ``origin_etag`` is the site's own ETag: a strong one is kept (weakened, see ``page_etag``), so a
        crawler that revalidates with the site's validator gets 304 from the cache as from the site.
        """
        return cls(
            status=status,
            body_gz=body_gz if body_gz is not None else gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0),
            content_type=content_type,
            etag=page_etag(body, origin_etag),
            last_modified=float(int(last_modified if last_modified is not None else generated_at)),
            generated_at=generated_at,
            expires_at=generated_at + ttl_seconds,
            headers=headers,
            generation_ms=round(generation_ms, 3),
        )

    def body(self) -> bytes:
        """The decompressed body, for the rare client that does not accept gzip."""
        return gzip.decompress(self.body_gz)

    def is_expired(self, now: float) -> bool:
        return now >= self.expires_at

    def to_bytes(self, target: str = "") -> bytes:
        """The page as stored; ``target``, the cache key's (gate/keys.py), is kept in it to be checked on read."""
        fields = {
            "s": self.status,
            "ct": self.content_type,
            "et": self.etag,
            "lm": self.last_modified,
            "g": self.generated_at,
            "x": self.expires_at,
            "h": self.headers,
            "n": len(self.body_gz),
            "gm": self.generation_ms,
        }
        if target:
            fields["t"] = target
        meta = json.dumps(fields, separators=(",", ":")).encode()
        checksum = zlib.crc32(self.body_gz, zlib.crc32(meta))
        return _HEADER.pack(_MAGIC, len(meta), checksum) + meta + self.body_gz

    @classmethod
    def from_bytes(cls, data: bytes, *, verify: bool = True, target: str | None = None) -> Page:
        """Parse a blob written by ``to_bytes``; raises CorruptPage when it is not whole, or (given the ``target``
        it is read for) when it was stored for another target: a file copied or renamed over another page's, as
        nginx checks the key kept in each of its cache files. A page stored without its target passes.

        ``verify=False`` skips the CRC (lengths and ranges are still checked): memcached and the
        in-process store hand back whole values, so only pages read from disk need the checksum.
        """
        try:
            magic, meta_length, checksum = _HEADER.unpack_from(data)
            if magic != _MAGIC:
                raise CorruptPage("not a crawlergate page of this version")
            start = _HEADER.size + meta_length
            if verify and zlib.crc32(memoryview(data)[_HEADER.size :]) != checksum:
                raise CorruptPage("bad checksum")
            meta = json.loads(data[_HEADER.size : start])
            body = data[start:]
            if len(body) != meta["n"]:
                raise CorruptPage(f"body is {len(body)} bytes; expected {meta['n']}")
            stored_for = meta.get("t")
            if target is not None and stored_for is not None and stored_for != target:
                raise CorruptPage(f"stored for {str(stored_for)[:200]!r}")
            status = int(meta["s"])
            if not 200 <= status <= 599:
                raise CorruptPage(f"status {status} is no answer a page can have")
            return cls(
                status=status,
                body_gz=body,
                content_type=str(meta["ct"]),
                etag=str(meta["et"]),
                last_modified=float(meta["lm"]),
                generated_at=float(meta["g"]),
                expires_at=float(meta["x"]),
                headers=tuple((str(name), str(value)) for name, value in meta["h"]),
                generation_ms=float(meta.get("gm", 0.0)),  # pages stored before it was kept: unknown
            )
        except (struct.error, ValueError, KeyError, TypeError) as exc:
            if isinstance(exc, CorruptPage):
                raise
            raise CorruptPage(str(exc)) from exc


def stored_for(path: str) -> tuple[str, float] | None:
    """The target a page file was stored for and when its page was generated, read from its metadata alone;
    None for a page stored before pages kept their target, or a file that is not a page (its body unread: the
    checksum is verified when the page is served)."""
    with open(path, "rb") as file:
        head = file.read(_HEADER.size)
        try:
            magic, meta_length, _ = _HEADER.unpack(head)
            if magic != _MAGIC or meta_length > MAX_META_BYTES:
                return None
            meta = json.loads(file.read(meta_length))
            target, generated_at = meta["t"], float(meta["g"])
        except (struct.error, ValueError, KeyError, TypeError):
            return None
    return (target, generated_at) if isinstance(target, str) and target.startswith("/") else None


def page_etag(body: bytes, origin_etag: str | None) -> str:
    """The site's strong ETag made weak, else one from the content (``content_etag``).

    Weak because the gzip and identity representations share it (nginx weakens a strong ETag when it
    compresses, for the same reason); If-None-Match compares weakly, so the site's tag still matches.
    A weak ETag of the site's is not kept: it may stay while the bytes change, and the regenerator
    tells changed pages by their ETag.
    """
    tag = (origin_etag or "").strip()
    if len(tag) >= 2 and tag[0] == tag[-1] == '"' and '"' not in tag[1:-1] and tag.isascii():
        return "W/" + tag
    return content_etag(body)


def content_etag(body: bytes) -> str:
    """A weak validator from the content alone: a regenerated page with the same bytes keeps its ETag.

    Weak (RFC 9110 8.8.3) because the gzip and identity representations share it.
    """
    return 'W/"' + hashlib.blake2b(body, digest_size=12).hexdigest() + '"'


# An IMF-fixdate has 29 characters: longer values are parsed each time rather than kept.
_REMEMBERED_DATE_CHARS = 64


def parse_http_date(value: str) -> float | None:
    """An HTTP date as a timestamp; None when it is none. The same dates come again and again (a site's
    Last-Modified, a crawler's If-Modified-Since) and the e-mail parser takes ~10 µs: the last ones are kept."""
    return _parsed_http_date(value) if len(value) <= _REMEMBERED_DATE_CHARS else _parse_http_date(value)


def _parse_http_date(value: str) -> float | None:
    try:
        return parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


_parsed_http_date = functools.lru_cache(maxsize=1024)(_parse_http_date)
