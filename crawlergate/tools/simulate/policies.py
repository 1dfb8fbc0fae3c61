"""The cache policies the simulator replays a trace through, all by bytes; only crawler requests count."""

from __future__ import annotations

import heapq
import random
from array import array
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from crawlergate.tools.simulate.trace import Trace

POLICIES = ("lru", "lru+human", "clock", "random", "static", "min", "infinite")


_NEVER = 1 << 62


@dataclass(frozen=True, slots=True)
class PolicyResult:
    policy: str
    size_bytes: int
    hits: int
    lookups: int

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0


def simulate(
    trace: Trace, policy: str, size_bytes: int, *, item_max_bytes: int | None = None, seed: int = 2012
) -> PolicyResult:
    """Run one policy with an L1 of ``size_bytes`` over the trace.

    Pages larger than ``item_max_bytes`` never enter L1, as in the gate (memcached's item limit).
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")
    sizes = _admitted_sizes(trace.sizes, size_bytes, item_max_bytes)
    if policy == "lru":
        hits, lookups = _lru(trace.crawler_pages(), None, sizes, size_bytes)
    elif policy == "lru+human":
        hits, lookups = _lru(trace.pages, trace.crawler, sizes, size_bytes)
    elif policy == "clock":
        hits, lookups = _clock(trace.crawler_pages(), sizes, size_bytes)
    elif policy == "random":
        hits, lookups = _random(trace.crawler_pages(), sizes, size_bytes, random.Random(seed))
    elif policy == "static":
        hits, lookups = _static(trace, sizes, size_bytes)
    elif policy == "min":
        hits, lookups = _belady(trace.pages, trace.crawler, sizes, size_bytes)
    else:
        hits, lookups = _infinite(trace.pages, trace.crawler)
    return PolicyResult(policy, size_bytes, hits, lookups)


def _admitted_sizes(sizes: array[int], capacity: int, item_max_bytes: int | None) -> array[int]:
    """Page sizes with those over the item limit made larger than the cache, so no policy admits them."""
    if item_max_bytes is None or item_max_bytes >= capacity or all(size <= item_max_bytes for size in sizes):
        return sizes
    too_big = capacity + 1
    return array("Q", (size if size <= item_max_bytes else too_big for size in sizes))


def size_sweep(trace: Trace, points: int, *, floor_bytes: int = 1) -> list[int]:
    """``points`` L1 sizes on a log scale, from 0.5 % (at least ``floor_bytes``) to 100 % of all pages' bytes."""
    total = max(trace.total_bytes, 1)
    low = min(max(total * 0.005, float(floor_bytes), 1.0), float(total))
    if points <= 1:
        return [total]
    return [int(low * (total / low) ** (index / (points - 1))) for index in range(points)]


def knee(points: Sequence[tuple[int, float]]) -> int | None:
    """The size past which more memory buys little: the point farthest above the chord of the curve.

    Kneedle (Satopää et al. 2011) on the hit ratio against bytes: hit-ratio curves are concave there.
    """
    curve = sorted((float(size), ratio, size) for size, ratio in points)
    if len(curve) < 3:
        return curve[-1][2] if curve else None
    (x0, y0, _), (x1, y1, _) = curve[0], curve[-1]
    if x1 == x0 or y1 <= y0:
        return curve[0][2]
    best = max(curve, key=lambda point: (point[1] - y0) / (y1 - y0) - (point[0] - x0) / (x1 - x0))
    return best[2]


def _lru(pages: array[int], crawler: bytearray | None, sizes: array[int], capacity: int) -> tuple[int, int]:
    cache: OrderedDict[int, int] = OrderedDict()
    touch, evict = cache.move_to_end, cache.popitem
    used = hits = lookups = 0
    flags = crawler if crawler is not None else _ones(len(pages))
    for page, counted in zip(pages, flags, strict=True):
        if counted:
            lookups += 1
        if page in cache:
            touch(page)
            if counted:
                hits += 1
            continue
        size = sizes[page]
        if size > capacity:
            continue
        cache[page] = size
        used += size
        while used > capacity:
            used -= evict(last=False)[1]
    return hits, lookups


def _clock(pages: array[int], sizes: array[int], capacity: int) -> tuple[int, int]:
    referenced: OrderedDict[int, bool] = OrderedDict()
    used = hits = 0
    for page in pages:
        if page in referenced:
            referenced[page] = True
            hits += 1
            continue
        size = sizes[page]
        if size > capacity:
            continue
        while used + size > capacity:
            victim, second_chance = referenced.popitem(last=False)
            if second_chance:
                referenced[victim] = False
            else:
                used -= sizes[victim]
        referenced[page] = False
        used += size
    return hits, len(pages)


def _random(pages: array[int], sizes: array[int], capacity: int, rng: random.Random) -> tuple[int, int]:
    slots: list[int] = []
    where: dict[int, int] = {}
    used = hits = 0
    for page in pages:
        if page in where:
            hits += 1
            continue
        size = sizes[page]
        if size > capacity:
            continue
        while used + size > capacity:
            index = rng.randrange(len(slots))
            victim = slots[index]
            last = slots.pop()
            if index < len(slots):
                slots[index] = last
                where[last] = index
            del where[victim]
            used -= sizes[victim]
        where[page] = len(slots)
        slots.append(page)
        used += size
    return hits, len(pages)


def _static(trace: Trace, sizes: array[int], capacity: int) -> tuple[int, int]:
    by_day: dict[int, Counter[int]] = {}
    ends = [start for start, _ in trace.day_runs[1:]] + ([len(trace.pages)] if trace.day_runs else [])
    for (start, day), end in zip(trace.day_runs, ends, strict=True):
        counts = by_day.setdefault(day, Counter())
        requests = zip(trace.pages[start:end], trace.crawler[start:end], strict=True)
        counts.update(page for page, is_crawler in requests if is_crawler)
    hits = lookups = 0
    for day, counts in sorted(by_day.items()):
        chosen: set[int] = set()
        used = 0
        for page, _ in (by_day.get(day - 1) or Counter()).most_common():
            if used + sizes[page] <= capacity:
                chosen.add(page)
                used += sizes[page]
        lookups += sum(counts.values())
        hits += sum(count for page, count in counts.items() if page in chosen)
    return hits, lookups


def _belady(pages: array[int], crawler: bytearray, sizes: array[int], capacity: int) -> tuple[int, int]:
    next_use = array("q", bytes(8 * len(pages)))  # 8 bytes a request, not a Python int object each
    upcoming: dict[int, int] = {}
    for index in range(len(pages) - 1, -1, -1):
        page = pages[index]
        next_use[index] = upcoming.get(page, _NEVER)
        if crawler[index]:
            upcoming[page] = index
    cached: dict[int, int] = {}
    farthest: list[tuple[int, int]] = []
    used = hits = lookups = 0
    for index, page in enumerate(pages):
        if crawler[index]:
            lookups += 1
        upcoming_use = next_use[index]
        if page in cached:
            if crawler[index]:
                hits += 1
            cached[page] = upcoming_use
            heapq.heappush(farthest, (-upcoming_use, page))
            if len(farthest) > 4 * len(cached) + 1024:
                # Rebuild without the stale entries, so memory follows the cache, not the trace.
                farthest = [(-use, cached_page) for cached_page, use in cached.items()]
                heapq.heapify(farthest)
            continue
        size = sizes[page]
        if upcoming_use == _NEVER or size > capacity:
            continue
        while used + size > capacity and farthest:
            negative, victim = farthest[0]
            if cached.get(victim) != -negative:
                heapq.heappop(farthest)  # stale entry
                continue
            if -negative <= upcoming_use:
                break  # everything cached is needed sooner than this page: do not admit it
            heapq.heappop(farthest)
            del cached[victim]
            used -= sizes[victim]
        if used + size <= capacity:
            cached[page] = upcoming_use
            heapq.heappush(farthest, (-upcoming_use, page))
            used += size
    return hits, lookups


def _infinite(pages: array[int], crawler: bytearray) -> tuple[int, int]:
    seen: set[int] = set()
    hits = lookups = 0
    for page, is_crawler in zip(pages, crawler, strict=True):
        if is_crawler:
            lookups += 1
            if page in seen:
                hits += 1
        seen.add(page)
    return hits, lookups


def _ones(count: int) -> bytes:
    return b"\x01" * count
