"""Stored pages: a deterministic gzip round trip, an ETag of the content alone, and a checksum that detects any
damaged byte, metadata included."""

from __future__ import annotations

import gzip

import pytest

from crawlergate.page import CorruptPage, Page, parse_http_date


def _page(body: bytes = b"<html>hello</html>") -> Page:
    return Page.from_response(200, body, content_type="text/html", generated_at=1000.5, ttl_seconds=60)


def test_page_roundtrip_and_gzip_is_deterministic() -> None:
    page = _page()
    assert Page.from_bytes(page.to_bytes()) == page
    assert page.body() == b"<html>hello</html>"
    assert page.body_gz == _page().body_gz
    assert gzip.decompress(page.body_gz) == page.body()
    assert page.last_modified == 1000.0
    assert page.is_expired(1060.5) and not page.is_expired(1060.0)


def test_page_is_read_only_for_the_target_it_was_stored_for() -> None:
    page = _page()
    stored = page.to_bytes("/t/1?page=2")
    assert Page.from_bytes(stored, target="/t/1?page=2") == page
    with pytest.raises(CorruptPage, match="stored for '/t/1.page=2'"):
        Page.from_bytes(stored, target="/t/2")
    assert Page.from_bytes(page.to_bytes(), target="/t/2") == page  # stored before targets were kept: read


def test_page_etag_depends_on_content_only() -> None:
    assert _page(b"a").etag == Page.from_response(200, b"a", content_type="x", generated_at=5, ttl_seconds=1).etag
    assert _page(b"a").etag != _page(b"b").etag
    assert _page().etag.startswith('W/"')


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: data[:-5], id="truncated"),
        pytest.param(lambda data: data[:-1] + bytes([data[-1] ^ 1]), id="bit-flip"),
        pytest.param(lambda data: b"XXXX" + data[4:], id="bad-magic"),
        pytest.param(lambda data: data[:10], id="cut-in-header"),
        pytest.param(lambda data: b"", id="empty"),
    ],
)
def test_page_damaged_bytes_are_detected(damage) -> None:
    with pytest.raises(CorruptPage):
        Page.from_bytes(damage(_page().to_bytes()))


def test_page_checksum_covers_metadata() -> None:
    data = bytearray(_page().to_bytes())
    status_at = data.index(b'"s":200') + len(b'"s":')
    data[status_at : status_at + 3] = b"203"  # a flipped digit in the metadata, body untouched
    with pytest.raises(CorruptPage, match="checksum"):
        Page.from_bytes(bytes(data))


def test_page_random_bit_flips_are_always_detected() -> None:
    import random

    rng = random.Random(11)
    original = _page(b"<html>" + b"text " * 400 + b"</html>").to_bytes()
    for _ in range(1000):
        data = bytearray(original)
        position = rng.randrange(len(data))
        data[position] ^= 1 << rng.randrange(8)
        with pytest.raises(CorruptPage):
            Page.from_bytes(bytes(data))


def test_page_status_out_of_range_is_corrupt_even_unverified() -> None:
    page = Page.from_response(20, b"x", content_type="text/html", generated_at=1, ttl_seconds=1)
    with pytest.raises(CorruptPage, match="status 20"):
        Page.from_bytes(page.to_bytes(), verify=False)


def test_http_dates_are_read_the_same_whether_kept_or_not() -> None:
    date = "Fri, 27 Nov 2026 11:31:10 GMT"
    assert parse_http_date(date) == parse_http_date(date) == 1795779070.0  # the second from what was kept
    assert parse_http_date("Friday, 27-Nov-26 11:31:10 GMT") == 1795779070.0  # RFC 850, obsolete but allowed
    padded = date + " " * 100  # too long to keep: parsed each time, to the same answer
    assert parse_http_date(padded) == 1795779070.0
    assert parse_http_date("not a date") is None
    assert parse_http_date("x" * 10_000) is None
