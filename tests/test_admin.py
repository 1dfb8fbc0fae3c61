from __future__ import annotations

import pytest

from crawlergate.admin.endpoints import AdminEndpoints


def _admin(token: str = "") -> AdminEndpoints:
    return AdminEndpoints(prefix="/_crawlergate", token=token, stats=dict, trusted_proxies=("127.0.0.1", "::1"))


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
    ],
)
def test_admin_answers_loopback_clients_only(peer: str | None, headers: list[tuple[bytes, bytes]], status: int) -> None:
    assert _admin().respond("/_crawlergate/stats", "GET", peer, headers)[0] == status


def test_admin_token_opens_it_to_others() -> None:
    headers = [(b"authorization", b"Bearer s3cret")]
    assert _admin("s3cret").respond("/_crawlergate/stats", "GET", None, headers)[0] == 200
    assert _admin("s3cret").respond("/_crawlergate/stats", "GET", "203.0.113.9", [])[0] == 403
