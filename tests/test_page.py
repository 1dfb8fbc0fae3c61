from __future__ import annotations

import gzip

import pytest

from crawlergate.page import CorruptPage, Page


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
