"""Trusted proxies: the client address taken from X-Forwarded-For only through proxies the settings trust."""

from __future__ import annotations

import pytest

from crawlergate.gate.forwarded import TrustedProxies


@pytest.mark.parametrize(
    ("peer", "forwarded", "client"),
    [
        pytest.param("203.0.113.1", b"1.2.3.4", "203.0.113.1", id="untrusted-peer-speaks-for-itself"),
        pytest.param("127.0.0.1", b"", "127.0.0.1", id="trusted-peer-without-header"),
        pytest.param("127.0.0.1", b"198.51.100.7", "198.51.100.7", id="one-hop"),
        pytest.param("127.0.0.1", b"6.6.6.6, 198.51.100.7, 10.0.0.2", "198.51.100.7", id="spoofed-left-part-ignored"),
        pytest.param("127.0.0.1", b"garbage", "garbage", id="not-an-address"),
        pytest.param(None, b"1.2.3.4", None, id="no-peer"),
        pytest.param("127.0.0.1", b"127.0.0.1", "127.0.0.1", id="loopback-from-a-proxy-on-this-machine"),
        pytest.param("10.0.0.7", b"127.0.0.1", "10.0.0.7", id="loopback-from-a-proxy-elsewhere-is-a-forgery"),
        pytest.param("10.0.0.7", b"127.0.0.1, 10.0.0.2", "10.0.0.2", id="loopback-behind-two-remote-proxies"),
        # One client is one address however a front writes it (a port, brackets, a zone): else a port per
        # request would be a client per request, each with a fill budget of its own.
        pytest.param("127.0.0.1", b"198.51.100.7:5123", "198.51.100.7", id="ipv4-with-port"),
        pytest.param("127.0.0.1", b"[2001:db8::7]:443", "2001:db8::7", id="ipv6-bracketed-with-port"),
        pytest.param("127.0.0.1", b"[2001:db8::7]", "2001:db8::7", id="ipv6-bracketed"),
        pytest.param("127.0.0.1", b"fe80::1%eth3", "fe80::1", id="ipv6-zone"),
    ],
)
def test_forwarded_client(peer: str | None, forwarded: bytes, client: str | None) -> None:
    trusted = TrustedProxies(["127.0.0.1", "10.0.0.0/8"])
    headers = [(b"x-forwarded-for", forwarded)] if forwarded else []
    assert trusted.client(peer, headers) == client


def test_forwarded_membership() -> None:
    trusted = TrustedProxies(["::1", "10.0.0.0/8"])
    assert "10.1.2.3" in trusted and "::1" in trusted
    assert "11.0.0.1" not in trusted and "not an ip" not in trusted and "" not in trusted
    assert "127.0.0.1" not in TrustedProxies([])


@pytest.mark.parametrize(
    ("headers", "client"),
    [
        pytest.param([(b"x-real-ip", b"203.0.113.5")], "203.0.113.5", id="x-real-ip"),
        pytest.param([(b"forwarded", b"for=203.0.113.5;proto=https")], "203.0.113.5", id="forwarded"),
        pytest.param([(b"forwarded", b'for="[2001:db8::7]:443", for=10.0.0.2')], "2001:db8::7", id="forwarded-chain"),
        pytest.param([(b"forwarded", b"for=_hidden")], "_hidden", id="forwarded-obfuscated-is-no-local-client"),
        pytest.param([(b"forwarded", b"proto=https")], "127.0.0.1", id="forwarded-without-for"),
        # Two clients named: the front set one, the client wrote the other, which cannot be told apart (review).
        pytest.param(
            [(b"x-forwarded-for", b"66.249.66.1"), (b"x-real-ip", b"203.0.113.5")], None, id="two-clients-nobody"
        ),
        pytest.param(
            [(b"x-forwarded-for", b"198.51.100.7, 203.0.113.5"), (b"x-real-ip", b"203.0.113.5")],
            "203.0.113.5",
            id="a-front-that-sets-both-agrees",
        ),
        # A front that sets one header passes on the others as the client wrote them: none makes it local.
        pytest.param(
            [(b"x-forwarded-for", b"127.0.0.1"), (b"x-real-ip", b"203.0.113.5")], "203.0.113.5", id="forged-xff"
        ),
        pytest.param([(b"x-forwarded-for", b""), (b"x-real-ip", b"203.0.113.5")], "203.0.113.5", id="empty-xff"),
        pytest.param(
            [(b"x-real-ip", b"::1"), (b"x-forwarded-for", b"::1"), (b"forwarded", b"for=203.0.113.5")],
            "203.0.113.5",
            id="forged-both-behind-forwarded",
        ),
        pytest.param(
            [(b"x-forwarded-for", b"203.0.113.5"), (b"x-real-ip", b"127.0.0.1")], "203.0.113.5", id="forged-real-ip"
        ),
        pytest.param(
            [(b"x-forwarded-for", b"127.0.0.1"), (b"x-real-ip", b"127.0.0.1")], "127.0.0.1", id="the-machines-own"
        ),
    ],
)
def test_forwarded_client_from_other_fronts_headers(headers: list[tuple[bytes, bytes]], client: str | None) -> None:
    # A front that sends X-Real-IP or Forwarded, not X-Forwarded-For: its visitors are not local clients.
    assert TrustedProxies(["127.0.0.1", "10.0.0.0/8"]).client("127.0.0.1", headers) == client
