"""Cache keys: URLs normalised so equal pages share one digest, tracking parameters dropped but never one that
selects content, and site profiles (WordPress, MediaWiki) adding their own rules."""

from __future__ import annotations

import pytest

from crawlergate.keys import KeyMaker, normalise_path
from crawlergate.rules import default_rules_dir, load_cache_rules, load_site_profiles


@pytest.fixture(scope="module")
def keys() -> KeyMaker:
    return KeyMaker(load_cache_rules(default_rules_dir() / "cache.toml"), admin_prefix="/_crawlergate")


@pytest.mark.parametrize(
    ("raw_path", "query", "target"),
    [
        pytest.param(b"/t/1", b"", "/t/1", id="plain"),
        pytest.param(b"/t/%7e%41", b"", "/t/~A", id="unreserved-decoded"),
        pytest.param(b"/t/caf%c3%a9", b"", "/t/caf%C3%A9", id="escapes-upper-cased"),
        pytest.param(b"/a/./b/../c", b"", "/a/c", id="dot-segments"),
        pytest.param(b"/a%2Fb", b"", "/a%2Fb", id="encoded-slash-stays-encoded"),
        pytest.param(b"/t", b"b=2&a=1", "/t?a=1&b=2", id="sorted-query"),
        pytest.param(b"/t", b"x=2&b=0&x=1", "/t?b=0&x=2&x=1", id="repeated-name-keeps-value-order"),
        pytest.param(b"/t", b"x=1&x=2", "/t?x=1&x=2", id="repeated-name-in-order"),
        pytest.param(
            b"/t", b"a%5B%5D=zeta&b=1&a%5B%5D=alpha", "/t?a%5B%5D=zeta&a%5B%5D=alpha&b=1", id="php-array-keeps-order"
        ),
        pytest.param(b"/t", b"a=1&utm_source=x&fbclid=y&PHPSESSID=z", "/t?a=1", id="tracking-dropped"),
        pytest.param(b"/showthread.php", b"t=12&highlight=x&page=2", "/showthread.php?page=2&t=12", id="allow-list"),
        pytest.param(b"/t", b"q=a%20b&r=", "/t?q=a%20b&r=", id="query-reencoded"),
        # One name as the site reads it, two spellings: its values keep their order (outside review).
        pytest.param(b"/t", b"a+b=1&a%20b=2", "/t?a+b=1&a%20b=2", id="one-name-two-spellings-keep-order"),
        pytest.param(b"/t", b"a%20b=2&a+b=1", "/t?a%20b=2&a+b=1", id="one-name-two-spellings-other-order"),
    ],
)
def test_keys_normalise(keys: KeyMaker, raw_path: bytes, query: bytes, target: str) -> None:
    key = keys.key_for(raw_path, query)
    assert key is not None
    assert key.target == target
    assert len(key.digest) == 32 and all(c in "0123456789abcdef" for c in key.digest)


@pytest.mark.parametrize(
    ("raw_path", "query"),
    [
        pytest.param(b"/_crawlergate/stats", b"", id="admin"),
        pytest.param(b"/css/site.css", b"", id="static"),
        pytest.param(b"/login", b"next=/", id="excluded"),
        pytest.param(b"/../etc/passwd", b"", id="climbs-above-root"),
        pytest.param(b"/a/%2e%2e/%2e%2e/etc", b"", id="encoded-dot-dot"),
        pytest.param(b"/t\x00", b"", id="nul"),
        pytest.param(b"/t%00x", b"", id="encoded-nul"),
        pytest.param(b"relative", b"", id="no-leading-slash"),
        pytest.param(b"/t/" + b"a" * 3000, b"", id="too-long"),
    ],
)
def test_keys_not_cacheable(keys: KeyMaker, raw_path: bytes, query: bytes) -> None:
    assert keys.key_for(raw_path, query) is None


def test_keys_equal_urls_share_a_digest(keys: KeyMaker) -> None:
    first = keys.key_for(b"/t/%7E1", b"b=2&a=1&utm_medium=x")
    second = keys.key_for(b"/t/~1", b"a=1&b=2")
    assert first == second


def test_keys_normalise_path_keeps_trailing_slash() -> None:
    assert normalise_path(b"/a/b/") == "/a/b/"
    assert normalise_path(b"/a/b/..") == "/a/"


@pytest.mark.parametrize("name", ["s", "q", "p", "page", "id", "sid", "ref", "title", "action", "oldid"])
def test_keys_default_rules_never_drop_a_parameter_that_selects_content(keys: KeyMaker, name: str) -> None:
    first = keys.key_for(b"/", f"{name}=one".encode())
    second = keys.key_for(b"/", f"{name}=two".encode())
    assert first is not None and second is not None and first.digest != second.digest
    assert first.target == f"/?{name}=one"


@pytest.mark.parametrize("name", ["utm_source", "utm_campaign", "fbclid", "gclid", "msclkid", "mc_cid", "_hsenc"])
def test_keys_default_rules_drop_tracking_parameters(keys: KeyMaker, name: str) -> None:
    key = keys.key_for(b"/t", f"a=1&{name}=x".encode())
    assert key is not None and key.target == "/t?a=1"


def test_keys_site_profile_adds_excludes_and_dropped_parameters() -> None:
    profiles = load_site_profiles("", ["trac", "phpbb"])
    keys = KeyMaker(load_cache_rules(default_rules_dir() / "cache.toml", profiles), admin_prefix="/_crawlergate")
    assert keys.key_for(b"/prefs/general") is None and keys.key_for(b"/ucp.php", b"mode=login") is None
    assert "exclude pattern" in keys.why_not_cacheable(b"/prefs")
    key = keys.key_for(b"/viewtopic.php", b"t=3&sid=0123abcd&hilit=word")
    assert key is not None and key.target == "/viewtopic.php?t=3"
    assert keys.why_not_cacheable(b"/viewtopic.php") == ""


def test_keys_wordpress_replytocom_pages_are_their_own() -> None:
    # WordPress sends ?replytocom=N pages with noindex, follow: crawlers must get that page, not the post's.
    keys = KeyMaker(
        load_cache_rules(default_rules_dir() / "cache.toml", load_site_profiles("", ["wordpress"])),
        admin_prefix="/_crawlergate",
    )
    post, reply = keys.key_for(b"/2024/05/hello/"), keys.key_for(b"/2024/05/hello/", b"replytocom=12")
    assert post is not None and reply is not None and reply.target == "/2024/05/hello/?replytocom=12"
    assert keys.key_for(b"/", b"p=5&preview=true") is None


@pytest.mark.parametrize(
    ("raw_path", "query", "cacheable"),
    [
        pytest.param(b"/index.php/Main_Page", b"", True, id="article-debian-layout"),
        pytest.param(b"/wiki/Main_Page", b"", True, id="article-short-url"),
        pytest.param(b"/index.php", b"title=Main_Page&action=history", True, id="history"),
        pytest.param(b"/index.php/Special:RecentChanges", b"", False, id="special-path"),
        pytest.param(b"/wiki/Special%3ASearch", b"search=x", False, id="special-encoded"),
        pytest.param(b"/index.php", b"search=foo&title=Special%3ASearch&fulltext=1", False, id="search-form"),
        pytest.param(b"/index.php", b"title=Main_Page&ACTION=Edit", False, id="edit-any-case"),
        pytest.param(b"/index.php", b"title=Special_Report", True, id="not-the-namespace"),
    ],
)
def test_keys_mediawiki_profile_in_every_url_layout(raw_path: bytes, query: bytes, cacheable: bool) -> None:
    profiles = load_site_profiles("", ["mediawiki"])
    keys = KeyMaker(load_cache_rules(default_rules_dir() / "cache.toml", profiles), admin_prefix="/_crawlergate")
    assert (keys.key_for(raw_path, query) is not None) is cacheable
    assert (keys.why_not_cacheable(raw_path, query) == "") is cacheable


def test_keys_from_settings_honour_max_target_chars() -> None:
    from crawlergate.config import CacheSettings, Settings

    keys = KeyMaker.from_settings(Settings(cache=CacheSettings(max_target_chars=8192)))
    long_query = b"q=" + b"x" * 5000
    key = keys.key_for(b"/results", long_query)
    assert key is not None and key.target.endswith("x" * 10)
    assert keys.key_for(b"/page", b"q=" + b"x" * 9000) is None
