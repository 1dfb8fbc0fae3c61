"""Who is the client? The connection's peer, or, behind a trusted proxy, what X-Forwarded-For says.

Only proxies listed in ``server.trusted_proxies`` may speak for a client (RFC 7239 section 8.3
warns that anyone else can write the header). A loopback address is believed only from a proxy on
this machine: from a proxy elsewhere (a trusted pod network, a load balancer that passes the header
on) it is what some client wrote, and would open the loopback-only admin endpoints to it. Used by
the reverse proxy to build the forwarded headers it sends on, and by the admin endpoints, whose
"loopback only" must not let every visitor of an nginx on the same host through.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable

_KNOWN_ADDRESSES = 4096
# Longer X-Forwarded-For values are walked each time: remembered, they could fill memory.
_REMEMBERED_BYTES = 256
# Headers in which a front names the client it forwards for.
FORWARDING = frozenset((b"x-forwarded-for", b"x-real-ip", b"forwarded"))
# The longest address: an IPv6 one with an IPv4 tail and a zone is under 64 characters.
_ADDRESS_CHARS = 64


class TrustedProxies:
    """A set of addresses and networks whose forwarding headers are believed."""

    def __init__(self, entries: Iterable[str]) -> None:
        self._networks = [ipaddress.ip_network(entry, strict=False) for entry in entries]
        # Answers for the addresses seen last: parsing one costs more than the rest of a pass-through's
        # header work. Bounded: emptied when full, so a sweep of addresses only costs the parsing.
        self._known: dict[str, bool] = {}
        # The client behind each (peer, X-Forwarded-For) seen last: a crawler sends the same one for a while.
        self._clients: dict[tuple[str, bytes, bytes, bytes], str | None] = {}

    def __contains__(self, address: object) -> bool:
        if not self._networks or not isinstance(address, str) or not address:
            return False
        known = self._known.get(address)
        if known is None:
            if len(self._known) >= _KNOWN_ADDRESSES:
                self._known.clear()
            known = self._known[address] = self._trusts(address)
        return known

    def _trusts(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in self._networks)

    def untrusted_front(self, peer: str | None, headers: Iterable[tuple[bytes, bytes]]) -> bool:
        """Whether a peer these proxies do not name forwards for someone (a front ``server.trusted_proxies``
        lacks): for admin reads and PURGE, each of its visitors would be it."""
        return peer is not None and peer not in self and any(name in FORWARDING for name, _ in headers)

    def privileged_client(self, peer: str | None, headers: Iterable[tuple[bytes, bytes]]) -> str | None:
        """The client to weigh for admin reads and PURGE: ``client``, but None behind an ``untrusted_front``."""
        return None if self.untrusted_front(peer, headers) else self.client(peer, headers)

    def client(self, peer: str | None, headers: Iterable[tuple[bytes, bytes]]) -> str | None:
        """The client's address: walk X-Forwarded-For from the right while the hops are trusted proxies. A front
        may name the client in X-Real-IP (nginx's realip default) or Forwarded (RFC 7239) instead, and pass on
        whichever of the three it does not set as the client wrote it: each present is walked the same way; the
        one that names another machine wins, so no header a client writes makes it a local client, and when two
        name different machines the client is unknown (None)."""
        if peer is None or peer not in self:
            return peer
        forwarded_for: list[bytes] = []
        real_ip = b""
        nodes: list[bytes] = []
        for name, value in headers:
            if name == b"x-forwarded-for":
                forwarded_for.append(value)
            elif name == b"x-real-ip":
                real_ip = value
            elif name == b"forwarded":
                nodes += _forwarded_for_parameters(value)
        if not (forwarded_for or real_ip or nodes):
            return peer
        key = (peer, b",".join(forwarded_for), real_ip, b",".join(nodes))
        if key in self._clients:
            return self._clients[key]
        if len(self._clients) >= _KNOWN_ADDRESSES:
            self._clients.clear()
        named = [self._forwarded_for(peer, value) for value in key[1:] if value]
        others = {address for address in named if not is_loopback(address)}
        # Two headers naming two clients: the front set one and passed the other on as a client wrote it, and
        # which is which cannot be told. Nobody, then: no client may pick the address it is judged by.
        known = None if len(others) > 1 else others.pop() if others else named[0] if named else peer
        if sum(map(len, key[1:])) <= _REMEMBERED_BYTES:
            self._clients[key] = known
        return known

    def _forwarded_for(self, peer: str, forwarded: bytes) -> str:
        hops = [hop.strip().decode("latin-1") for hop in forwarded.split(b",") if hop.strip()]
        address = peer
        while hops and address in self:
            hop = _plain_address(hops.pop())
            if len(hop) > _ADDRESS_CHARS or (is_loopback(hop) and not is_loopback(address)):
                break  # no address is that long: a forgery, like loopback from afar
            address = hop
        return address


def _forwarded_for_parameters(value: bytes) -> list[bytes]:
    """The ``for=`` nodes of a Forwarded header value, in order (``for="[2001:db8::1]:443"`` unquoted)."""
    nodes = []
    for element in value.split(b","):
        for pair in element.split(b";"):
            name, _, node = pair.strip().partition(b"=")
            if name.lower() == b"for":
                nodes.append(node.strip().strip(b'"'))
    return nodes


def _plain_address(hop: str) -> str:
    """An address as some fronts write it, plain: without a port ("203.0.113.7:5123", "[2001:db8::1]:443"),
    brackets or an IPv6 zone ("fe80::1%eth0"), so one client is one address however it is written."""
    if hop.startswith("["):
        hop = hop[1:].partition("]")[0]
    elif hop.count(":") == 1:
        hop = hop.partition(":")[0]
    return hop.partition("%")[0]


@functools.lru_cache(maxsize=4096)
def is_loopback(host: str | None) -> bool:
    """Whether ``host`` is a loopback address (127.0.0.0/8, ::1, or IPv4-mapped loopback)."""
    # No address at all (a Unix socket) is not loopback: whoever is behind it cannot be told apart.
    if host is None:
        return False
    try:
        return ipaddress.ip_address(host.removeprefix("::ffff:")).is_loopback
    except ValueError:
        return False
