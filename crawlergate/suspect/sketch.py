"""What clients did lately, per address and per network, in memory fixed at start whatever their number.

Each table is a fixed array of slots; a client's slot is one of two places its hash names
(two choices, like cuckoo hashing). A newcomer whose two places are both taken wears one of the
holders down instead of evicting it: the lighter holder loses one page with probability
1.08^-pages (HeavyKeeper, Yang et al. 2018), and only an idle or worn-down holder is replaced.
A sweep of a million one-request addresses thus churns the light slots and leaves the heavy
hitters, which are the ones the evidence is about, in place. Counts decay exponentially, so
"pages" reads as pages per minute and a half (half-life one minute by default).

    sketch = BehaviourSketch(total_bytes=8 << 20, half_life_s=60)
    address_counts, network_counts = sketch.observe_page("203.0.113.7", referer=False, deep=True, cookie=False,
                                                         now=time.time())
    # each [pages, assets, deep_without_referer, cookies_offered, cookies_returned], decayed to now
"""

from __future__ import annotations

import functools
import ipaddress
import math
import random
from array import array

from crawlergate.suspect.evidence import BEHAVIOUR_FIELDS

PAGES, ASSETS, DEEP_WITHOUT_REFERER, COOKIES_OFFERED, COOKIES_RETURNED = range(len(BEHAVIOUR_FIELDS))
_FIELDS = len(BEHAVIOUR_FIELDS)
# A slot: the key's fingerprint (8 bytes), the time of its last update and its counts (8 bytes each).
SLOT_BYTES = 8 + 8 + 8 * _FIELDS
_DECAY_BASE = 1.08
# The site's own static files seen pass through, remembered for about an hour.
_SITE_ASSETS_HALF_LIFE_S = 3600.0


class _Table:
    """Decaying counts for keys, in ``capacity`` slots."""

    __slots__ = ("capacity", "fingerprints", "updated", "counts", "_decay_per_s", "_random")

    def __init__(self, capacity: int, half_life_s: float, seed: int) -> None:
        self.capacity = capacity
        self.fingerprints = array("q", bytes(8 * capacity))
        self.updated = array("d", bytes(8 * capacity))
        self.counts = array("d", bytes(8 * capacity * _FIELDS))
        self._decay_per_s = math.log(2) / half_life_s
        self._random = random.Random(seed)

    @property
    def nbytes(self) -> int:
        return sum(len(part) * part.itemsize for part in (self.fingerprints, self.updated, self.counts))

    def add(self, key: str, field: int, amount: float, now: float) -> None:
        slot = self._slot(key, now, create=True)
        if slot >= 0:
            self.counts[slot * _FIELDS + field] += amount

    def add_page(self, key: str, deep_without_referer: bool, cookie: bool, now: float) -> list[float] | None:
        """Count a page for ``key``; its counts after it (None when it has no slot: a light newcomer)."""
        slot = self._slot(key, now, create=True)
        if slot < 0:
            return None
        base = slot * _FIELDS
        counts = self.counts
        counts[base + PAGES] += 1.0
        if deep_without_referer:
            counts[base + DEEP_WITHOUT_REFERER] += 1.0
        if cookie:
            counts[base + COOKIES_RETURNED] += 1.0
        return counts[base : base + _FIELDS].tolist()

    def read(self, key: str, now: float) -> list[float] | None:
        slot = self._slot(key, now, create=False)
        if slot < 0:
            return None
        base = slot * _FIELDS
        return self.counts[base : base + _FIELDS].tolist()

    def _slot(self, key: str, now: float, *, create: bool) -> int:
        """The slot holding ``key`` brought up to ``now`` (decayed), or -1; with ``create``, one made for it."""
        digest = hash(key)
        fingerprint = (digest & 0x7FFF_FFFF_FFFF_FFFF) | 1
        first = digest % self.capacity
        second = (digest // self.capacity) % self.capacity
        fingerprints = self.fingerprints
        if fingerprints[first] == fingerprint:
            slot = first
        elif fingerprints[second] == fingerprint:
            slot = second
        elif not create:
            return -1
        else:
            slot = self._claim(first, second, fingerprint, now)
            if slot < 0:
                return -1
        self._decay(slot, now)
        return slot

    def _claim(self, first: int, second: int, fingerprint: int, now: float) -> int:
        for slot in (first, second):
            if self.fingerprints[slot] == 0:
                return self._reset(slot, fingerprint, now)
        self._decay(first, now)
        self._decay(second, now)
        counts = self.counts
        lighter = first if counts[first * _FIELDS + PAGES] <= counts[second * _FIELDS + PAGES] else second
        pages = counts[lighter * _FIELDS + PAGES]
        if pages >= 1 and self._random.random() < _DECAY_BASE**-pages:
            pages -= 1
            counts[lighter * _FIELDS + PAGES] = pages
        if pages < 1 and counts[lighter * _FIELDS + ASSETS] < 1:
            return self._reset(lighter, fingerprint, now)
        return -1

    def _reset(self, slot: int, fingerprint: int, now: float) -> int:
        self.fingerprints[slot] = fingerprint
        self.updated[slot] = now
        base = slot * _FIELDS
        for field in range(_FIELDS):
            self.counts[base + field] = 0.0
        return slot

    def _decay(self, slot: int, now: float) -> None:
        elapsed = now - self.updated[slot]
        if elapsed <= 0.05:
            return  # requests in a burst: not worth a pass over the counts
        factor = math.exp(-elapsed * self._decay_per_s)
        base = slot * _FIELDS
        counts = self.counts
        counts[base : base + _FIELDS] = array("d", [count * factor for count in counts[base : base + _FIELDS]])
        self.updated[slot] = now


class BehaviourSketch:
    """Recent behaviour per client address and per network, in ``total_bytes`` (split between the two)."""

    def __init__(self, total_bytes: int, half_life_s: float, *, seed: int = 2012) -> None:
        capacity = max(total_bytes // (2 * SLOT_BYTES), 16)
        self.addresses = _Table(capacity, half_life_s, seed)
        self.networks = _Table(capacity, half_life_s, seed + 1)
        self._site_assets = 0.0
        self._site_assets_at = 0.0

    @property
    def nbytes(self) -> int:
        """The memory of both tables' arrays."""
        return self.addresses.nbytes + self.networks.nbytes

    def observe_page(
        self, address: str, *, referer: bool, deep: bool, cookie: bool, now: float
    ) -> tuple[list[float] | None, list[float] | None]:
        """Count a page request of ``address``; the counts of the address and of its network after it."""
        bare = deep and not referer
        return (
            self.addresses.add_page(client_of(address), bare, cookie, now),
            self.networks.add_page(network_of(address), bare, cookie, now),
        )

    def observe_asset(self, address: str, now: float) -> None:
        self.addresses.add(client_of(address), ASSETS, 1.0, now)
        self.networks.add(network_of(address), ASSETS, 1.0, now)
        self._site_assets = self.site_assets(now) + 1.0
        self._site_assets_at = now

    def observe_cookie_offered(self, address: str, now: float) -> None:
        self.addresses.add(client_of(address), COOKIES_OFFERED, 1.0, now)
        self.networks.add(network_of(address), COOKIES_OFFERED, 1.0, now)

    def site_assets(self, now: float) -> float:
        """Static files of the site seen lately (decayed over about an hour): none behind an nginx serving them."""
        elapsed = max(now - self._site_assets_at, 0.0)
        return self._site_assets * math.pow(0.5, elapsed / _SITE_ASSETS_HALF_LIFE_S)

    def counts(self, address: str, now: float) -> list[float] | None:
        return self.addresses.read(client_of(address), now)

    def network_counts(self, address: str, now: float) -> list[float] | None:
        return self.networks.read(network_of(address), now)


def client_of(address: str) -> str:
    """The key of one client: an IPv4 address, or the /64 of an IPv6 one (a home line gets a /64 or more, and
    picks a new address in it at will)."""
    return address if ":" not in address else _prefix(address, 4)


@functools.lru_cache(maxsize=4096)
def _prefix(address: str, groups: int) -> str:
    try:
        ip = ipaddress.ip_address(address.partition("%")[0])  # an IPv6 zone ("%eth0") is no part of the network
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped) if groups == 4 else str(ip.ipv4_mapped).rpartition(".")[0]
    return ip.exploded[: 5 * groups - 1]


def network_of(address: str) -> str:
    """The /24 of an IPv4 address, the /48 of an IPv6 one (their first three groups), as a key."""
    if ":" not in address:
        return address.rpartition(".")[0]
    return _prefix(address, 3)
