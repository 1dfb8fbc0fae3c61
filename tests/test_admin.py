"""The admin endpoints: open to loopback clients or a token only, the dashboard's page and assets under the same
rules, and the series of figures keeping what changed in each interval."""

from __future__ import annotations

import json

import pytest

from crawlergate.admin.dashboard import Dashboard
from crawlergate.admin.endpoints import AdminEndpoints
from crawlergate.metrics import Metrics


def _admin(token: str = "") -> AdminEndpoints:
    return AdminEndpoints(
        prefix="/_crawlergate", token=token, stats=dict, trusted_proxies=("127.0.0.1", "::1", "10.244.0.0/16")
    )


@pytest.mark.parametrize(
    ("peer", "headers", "status"),
    [
        pytest.param("127.0.0.1", [], 200, id="loopback"),
        pytest.param("::1", [], 200, id="loopback-v6"),
        pytest.param("::ffff:127.0.0.1", [], 200, id="v4-mapped-loopback"),
        pytest.param("203.0.113.9", [], 403, id="outside"),
        pytest.param(None, [(b"x-forwarded-for", b"127.0.0.1")], 403, id="unix-socket-is-not-loopback"),
        pytest.param("localhost.evil", [], 403, id="name-that-starts-like-localhost"),
        pytest.param("::1:abcd", [], 403, id="address-that-starts-like-::1"),
        pytest.param("127.0.0.1", [(b"x-forwarded-for", b"203.0.113.9")], 403, id="forwarded-for-a-visitor"),
        pytest.param("10.244.3.7", [(b"x-forwarded-for", b"127.0.0.1")], 403, id="loopback-claimed-by-a-remote-proxy"),
    ],
)
def test_admin_answers_loopback_clients_only(peer: str | None, headers: list[tuple[bytes, bytes]], status: int) -> None:
    assert _admin().respond("/_crawlergate/stats", "GET", peer, headers)[0] == status


def test_admin_token_opens_it_to_others() -> None:
    headers = [(b"authorization", b"Bearer s3cret")]
    assert _admin("s3cret").respond("/_crawlergate/stats", "GET", None, headers)[0] == 200
    assert _admin("s3cret").respond("/_crawlergate/stats", "GET", "203.0.113.9", [])[0] == 403


def _dashboard_admin(metrics: Metrics, clock: list[float]) -> AdminEndpoints:
    dashboard = Dashboard(metrics, prefix="/_crawlergate", clock=lambda: 1_764_000_000 + clock[0],
                          monotonic=lambda: clock[0])  # fmt: skip
    return AdminEndpoints(prefix="/_crawlergate", token="", stats=dict, dashboard=dashboard)


def test_admin_dashboard_page_and_assets_follow_the_admin_rules() -> None:
    admin = _dashboard_admin(Metrics(), [0.0])
    status, headers, body = admin.respond("/_crawlergate/", "GET", "127.0.0.1", [])
    assert status == 200 and b'data-prefix="/_crawlergate"' in body and b"/_crawlergate/static/dashboard.js" in body
    assert dict(headers)[b"content-type"] == b"text/html; charset=utf-8"
    assert admin.respond("/_crawlergate", "GET", "127.0.0.1", [])[0] == 200
    script = admin.respond("/_crawlergate/static/uPlot.iife.min.js", "GET", "127.0.0.1", [])
    assert script[0] == 200 and script[2].startswith(b"/*! https://github.com/leeoniya/uPlot")
    assert admin.respond("/_crawlergate/static/../../etc/passwd", "GET", "127.0.0.1", [])[0] == 404
    for path in ("/_crawlergate/", "/_crawlergate/series", "/_crawlergate/static/dashboard.js"):
        assert admin.respond(path, "GET", "203.0.113.9", [])[0] == 403
    assert admin.respond("/_crawlergate/series", "POST", "127.0.0.1", [])[0] == 405
    assert admin.respond("/_crawlergate/static/dashboard.js", "DELETE", "127.0.0.1", [])[0] == 405


def test_admin_series_keeps_what_changed_in_each_interval() -> None:
    metrics, clock = Metrics(), [0.0]
    admin = _dashboard_admin(metrics, clock)

    def series() -> list[dict]:
        return json.loads(admin.respond("/_crawlergate/series", "GET", "127.0.0.1", [])[2])["points"]

    metrics.record("crawler", "miss", 100.0)
    assert series() == []  # the first reading is the base
    metrics.record("crawler", "l1-hit", 1.0)
    metrics.record("crawler", "l2-hit", 2.0)
    metrics.record("crawler", "miss", 90.0)
    metrics.record("human", "pass", 50.0)
    metrics.add_origin_time("human", 60.0)
    metrics.record_origin(20.0)  # a fill: the site's time for crawlers
    clock[0] = 1.0
    assert series() == []  # too soon for a new point
    clock[0] = 4.0
    (point,) = series()
    assert point["seconds"] == 4.0 and point["crawler"]["requests"] == 3 and point["crawler"]["lookups"] == 3
    assert (point["crawler"]["l1_hits"], point["crawler"]["l2_hits"], point["human"]["requests"]) == (1, 1, 1)
    assert point["crawler"]["ttfb_ms"]["p99"] == pytest.approx(90.0, rel=0.05)  # not the 100 ms before the interval
    assert point["crawler_origin_share"] == 0.25 and point["human"]["ttfb_ms"]["p50"] == pytest.approx(50.0, rel=0.05)
    clock[0] = 7.0
    empty = {"requests": 0, "l1_hits": 0, "l2_hits": 0, "direct_hits": 0, "lookups": 0, "ttfb_ms": None}
    assert series()[-1]["crawler"] == empty
