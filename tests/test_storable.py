"""Which answers the gate stores: guest pages only, each refusal named, lifetimes from the site or the defaults, and
the stored page keeping what crawlers need and no cookie."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from crawlergate.config import CacheSettings
from crawlergate.errors import ConfigError
from crawlergate.gate.origin import OriginResponse
from crawlergate.gate.storable import NOT_STORED_REASONS, StoragePolicy
from crawlergate.keys import KeyMaker
from crawlergate.page import Page
from crawlergate.rules import default_rules_dir, load_cache_rules

NOW = 1_700_000_000.0
TRAC_GUEST = (
    ("content-type", "text/html;charset=utf-8"),
    ("cache-control", "must-revalidate"),
    ("expires", "Fri, 01 Jan 1999 00:00:00 GMT"),
    ("set-cookie", "trac_form_token=0123; httponly; Path=/"),
    ("set-cookie", "trac_session=4567; expires=Wed, 20 Jan 2027 00:00:00 GMT; httponly; Path=/"),
)
DJANGO_FORM = (
    ("content-type", "text/html; charset=utf-8"),
    ("vary", "Cookie"),
    ("set-cookie", "csrftoken=abc; expires=Mon, 22 Nov 2027 00:00:00 GMT; Max-Age=31449600; Path=/; SameSite=Lax"),
)
MEDIAWIKI_ARTICLE = (
    ("content-type", "text/html; charset=UTF-8"),
    ("cache-control", "private, must-revalidate, max-age=0"),
    ("vary", "Accept-Encoding, Cookie"),
    ("content-language", "en"),
    ("last-modified", "Mon, 20 Nov 2023 10:00:00 GMT"),
)


def _answer(status: int = 200, headers: tuple[tuple[str, str], ...] = (), body: bytes = b"<p>page</p>", **extra):
    return OriginResponse(status, headers, body, **extra)


def _judge(response: OriginResponse, target: str = "/page", **settings: object):
    return StoragePolicy(CacheSettings(**settings)).judge(response, target, now=NOW)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("headers", "strict_reasons"),
    [
        pytest.param(TRAC_GUEST, {"set-cookie-strict", "cache-control-strict"}, id="trac-every-page"),
        pytest.param(DJANGO_FORM, {"set-cookie-strict", "vary-strict"}, id="django-form-page"),
        pytest.param(MEDIAWIKI_ARTICLE, {"cache-control-strict", "vary-strict"}, id="mediawiki-article"),
        pytest.param((("cache-control", "no-cache"),), {"cache-control-strict"}, id="no-cache"),
        pytest.param((("cache-control", 'private="set-cookie"'),), {"cache-control-strict"}, id="private-field"),
        pytest.param((("expires", "0"),), {"cache-control-strict"}, id="expires-not-a-date"),
    ],
)
def test_storable_guest_pages_of_real_sites_are_stored_only_in_guest_mode(
    headers: tuple[tuple[str, str], ...], strict_reasons: set[str]
) -> None:
    guest = _judge(_answer(headers=headers))
    assert guest.storable and guest.ttl_seconds == CacheSettings().ttl_seconds
    assert guest.set_aside
    strict = _judge(_answer(headers=headers), storage_mode="rfc9111")
    assert {label for label, _ in strict.reasons} == strict_reasons


@pytest.mark.parametrize(
    ("response", "target", "reason"),
    [
        pytest.param(_answer(headers=(("cache-control", "no-store, private"),)), "/page", "no-store", id="no-store"),
        pytest.param(_answer(headers=(("vary", "*"),)), "/page", "vary-star", id="vary-star"),
        pytest.param(_answer(302, (("location", "/elsewhere"),), b""), "/page", "status", id="found-302"),
        pytest.param(_answer(403), "/page", "status", id="forbidden"),
        pytest.param(_answer(503), "/page", "origin-error", id="unavailable"),
        pytest.param(_answer(body=b""), "/page", "empty", id="empty-200"),
        pytest.param(_answer(complete=False), "/page", "incomplete", id="cut-off"),
        pytest.param(
            _answer(301, (("location", "https://forum.example/page?a=1"),), b""),
            "/page?a=1",
            "redirect-to-self",
            id="https-redirect-to-self",
        ),
        pytest.param(
            _answer(308, (("location", "/./page"),), b""), "/page", "redirect-to-self", id="relative-redirect-to-self"
        ),
    ],
)
def test_storable_refuses_with_a_named_reason(response: OriginResponse, target: str, reason: str) -> None:
    verdict = _judge(response, target)
    assert not verdict.storable
    assert reason in {label for label, _ in verdict.reasons}
    assert all(label in NOT_STORED_REASONS for label, _ in verdict.reasons)


@pytest.mark.parametrize(
    ("status", "headers", "ttl"),
    [
        pytest.param(200, (("cache-control", "public, max-age=600"),), 600, id="max-age"),
        pytest.param(200, (("cache-control", "s-maxage=18000, must-revalidate, max-age=0"),), 18000, id="s-maxage"),
        pytest.param(200, (("expires", "Tue, 14 Nov 2023 22:30:00 GMT"),), 1000, id="future-expires"),
        pytest.param(200, (("cache-control", "max-age=0"),), 86400, id="zero-means-default"),
        pytest.param(301, (("location", "/new"), ("cache-control", "max-age=31536000")), 3600, id="redirect-capped"),
        pytest.param(404, (), 600, id="gone-default"),
    ],
)
def test_storable_lifetime_from_the_site_or_the_defaults(
    status: int, headers: tuple[tuple[str, str], ...], ttl: float
) -> None:
    verdict = _judge(_answer(status, headers))
    assert verdict.storable and verdict.ttl_seconds == pytest.approx(ttl)


def test_storable_page_keeps_what_crawlers_need_and_no_cookie() -> None:
    headers = (
        *DJANGO_FORM,
        ("x-robots-tag", "noindex"),
        ("link", '<https://forum.example/t/1>; rel="canonical"'),
        ("date", "Mon, 20 Nov 2023 10:00:00 GMT"),
        ("server", "gunicorn"),
    )
    response = _answer(headers=headers)
    policy = StoragePolicy(CacheSettings())
    page = policy.page(response, policy.judge(response, "/t/1", now=NOW), now=NOW)
    kept = dict(page.headers)
    assert kept == {
        "x-robots-tag": "noindex",
        "link": '<https://forum.example/t/1>; rel="canonical"',
        "vary": "Accept-Encoding, Cookie",
    }
    assert page.content_type == "text/html; charset=utf-8"


def test_storable_page_keeps_the_sites_gzip_as_it_came() -> None:
    body = b"<p>" + b"words " * 500 + b"</p>"
    site_gzip = gzip.compress(body, mtime=1234)
    response = _answer(body=body, body_gz=site_gzip)
    policy = StoragePolicy(CacheSettings())
    page = policy.page(response, policy.judge(response, "/t/1", now=NOW), now=NOW)
    assert page.body_gz == site_gzip and page.body() == body
    # The ETag comes from the content, so a regenerated page with another gzip mtime keeps it.
    again = Page.from_response(200, body, content_type="text/html", generated_at=NOW, ttl_seconds=1)
    assert page.etag == again.etag


@pytest.mark.parametrize(
    ("target", "location"),
    [
        pytest.param("/plus?q=a+b", "/plus?q=a+b", id="same-spelling"),
        pytest.param("/reorder?a=2&b=1", "https://site.example/reorder?b=1&a=2", id="parameter-order"),
        pytest.param("/t?x=1", "/t?x=1&utm_source=feed", id="tracking-parameter"),
        pytest.param("/caf%C3%A9", "/caf%c3%a9", id="escape-case"),
    ],
)
def test_storable_redirect_to_the_same_key_is_a_loop(target: str, location: str) -> None:
    keys = KeyMaker(load_cache_rules(default_rules_dir() / "cache.toml"), admin_prefix="/_crawlergate")
    policy = StoragePolicy(CacheSettings(), keys)
    verdict = policy.judge(_answer(301, (("location", location),), b""), target, now=NOW)
    assert [label for label, _ in verdict.reasons] == ["redirect-to-self"]


def test_storable_per_path_max_age_sets_a_200_pages_lifetime(tmp_path: Path) -> None:
    rules = tmp_path / "cache.toml"
    shipped = (default_rules_dir() / "cache.toml").read_text()
    rules.write_text(
        shipped
        + '\n[[max_age]]\npath = "/"\nseconds = 600\n\n[[max_age]]\npath = "/showthread.php"\nseconds = 604800\n'
    )
    policy = StoragePolicy(CacheSettings(), KeyMaker(load_cache_rules(rules), admin_prefix="/_crawlergate"))
    html = [("content-type", "text/html")]
    front = policy.judge(OriginResponse(200, html, b"<p>front</p>"), "/", now=NOW)
    thread = policy.judge(OriginResponse(200, html, b"<p>t</p>"), "/showthread.php?t=3", now=NOW)
    other = policy.judge(OriginResponse(200, html, b"<p>m</p>"), "/member.php?u=1", now=NOW)
    own = policy.judge(OriginResponse(200, [*html, ("cache-control", "max-age=60")], b"<p>f</p>"), "/", now=NOW)
    gone = policy.judge(OriginResponse(404, html, b"no"), "/", now=NOW)
    assert (front.ttl_seconds, thread.ttl_seconds, other.ttl_seconds) == (600, 604800, 86400)
    assert own.ttl_seconds == 60 and gone.ttl_seconds == 600  # the site's own lifetime wins; 404s keep theirs
    rules.write_text('[[max_age]]\npath = "/"\nseconds = -1\n')
    with pytest.raises(ConfigError, match="positive"):
        load_cache_rules(rules)


def test_storable_dokuwiki_profile_stores_guest_pages_despite_no_store() -> None:
    from crawlergate.rules import load_site_profiles

    html = [("content-type", "text/html"), ("cache-control", "no-store, no-cache, must-revalidate")]
    answer = OriginResponse(200, html, b"<p>wiki:syntax</p>")
    rules = default_rules_dir() / "cache.toml"
    plain = StoragePolicy(CacheSettings(), KeyMaker(load_cache_rules(rules), admin_prefix="/_crawlergate"))
    profiles = load_site_profiles("", ["dokuwiki"])
    dokuwiki = KeyMaker(load_cache_rules(rules, profiles), admin_prefix="/_crawlergate")
    assert [label for label, _ in plain.judge(answer, "/doku.php?id=wiki:syntax", now=NOW).reasons] == ["no-store"]
    verdict = StoragePolicy(CacheSettings(), dokuwiki).judge(answer, "/doku.php?id=wiki:syntax", now=NOW)
    assert verdict.storable and any("ignore_no_store" in reason for reason in verdict.set_aside)
    strict = StoragePolicy(CacheSettings(storage_mode="rfc9111"), dokuwiki)
    assert not strict.judge(answer, "/doku.php?id=wiki:syntax", now=NOW).storable  # a strict cache stays strict
    assert dokuwiki.key_for(b"/doku.php", b"id=wiki:syntax&do=edit") is None
    assert dokuwiki.key_for(b"/doku.php", b"do=login") is None
