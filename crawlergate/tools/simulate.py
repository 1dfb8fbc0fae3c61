"""Offline cache-policy simulation over an access log: how big must L1 be, and what does each policy give?

The log is parsed once into a compact trace (a page number and a class bit per request, a size per
page, a day per request) that is cached on disk, so later runs skip parsing. Only crawler
requests count as hits or misses, the way the gate serves only crawlers; human requests for pages
matter only where a policy lets them load L1 (the paper's human-induced prefetching). Policies,
all by bytes (Broder, Najork & Wiener 2003 define the classic ones; Koehl & Wang 2012 Table 5):

    lru        least recently used, crawler requests only
    lru+human  LRU where human requests also load and refresh pages (only crawler requests are counted)
    clock      second-chance approximation of LRU
    random     evict a random page
    static     yesterday's most crawled pages, fixed for the day
    min        Belady's clairvoyant policy: evict the page whose next crawler request is farthest away
               (by bytes this is a near-optimal bound; humans may load pages, as in lru+human)
    infinite   unlimited size: only first requests miss (a page seen by anyone before is a hit)

    trace = load_trace(Path("access.log"), classifier, keys)
    simulate(trace, "lru", 120_000_000).hit_ratio
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import multiprocessing
import os
import pickle
import random
from array import array
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crawlergate.classify import Classifier
from crawlergate.errors import ConfigError
from crawlergate.keys import KeyMaker
from crawlergate.tools.logparse import LogReader, split_request

POLICIES = ("lru", "lru+human", "clock", "random", "static", "min", "infinite")
# Bumped when the cached trace's layout changes, so old files are ignored.
TRACE_VERSION = 5
# Statuses the gate stores (crawlergate.gate.storable): what simulate lets into the cache.
STORED_STATUSES = frozenset({"200", "301", "308", "404", "410"})
_NEVER = 1 << 62
# The paper's average gzip page (section 5): the size assumed when a log records none.
ASSUMED_PAGE_BYTES = 14_000
# Below this hit ratio of an unlimited cache, no L1 size is worth recommending.
HOPELESS_HIT_RATIO = 0.05


@dataclass(slots=True)
class Trace:
    """A log's cacheable page requests in compact form."""

    pages: array[int]  # page number of each request
    crawler: bytearray  # 1 for a crawler request, 0 for a human one
    day_runs: list[tuple[int, int]]  # (index of the first request of a run, its day since the first day)
    sizes: array[int]  # bytes of each page, from the log's byte field
    targets: list[str]  # the page of each page number
    lines: int
    malformed: int
    # How the log was read ("nginx/Apache combined + 1 extra field ..."), and its first malformed line.
    format_description: str = ""
    malformed_example: str = ""
    # Why reading stopped early (a damaged gzip file), or "".
    truncated: str = ""
    # Non-zero when the log gave no sizes and every page is taken to weigh this much.
    sizes_assumed_bytes: int = 0
    # The crawler requests alone, made once for the many policy runs that need only them.
    _crawler_only: array[int] | None = field(default=None, init=False, repr=False, compare=False)

    def crawler_pages(self) -> array[int]:
        if self._crawler_only is None:
            chosen = zip(self.pages, self.crawler, strict=True)
            self._crawler_only = array("I", (page for page, is_crawler in chosen if is_crawler))
        return self._crawler_only

    @property
    def requests(self) -> int:
        return len(self.pages)

    @property
    def unique_pages(self) -> int:
        return len(self.sizes)

    @property
    def crawler_requests(self) -> int:
        return sum(self.crawler)

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)

    def assume_sizes_when_unknown(self, page_bytes: int = ASSUMED_PAGE_BYTES) -> None:
        """Give every page ``page_bytes`` when the log records no response sizes (IIS without sc-bytes)."""
        if self.sizes and not any(self.sizes):
            self.sizes = array("I", [page_bytes] * len(self.sizes))
            self.sizes_assumed_bytes = page_bytes

    @property
    def days(self) -> int:
        return len({day for _, day in self.day_runs})

    def largest_page(self, item_max_bytes: int | None = None) -> int:
        """The largest page that fits L1's item limit: no useful L1 is smaller."""
        fitting = [size for size in self.sizes if item_max_bytes is None or size <= item_max_bytes]
        return max(fitting, default=0)


@dataclass(frozen=True, slots=True)
class PolicyResult:
    policy: str
    size_bytes: int
    hits: int
    lookups: int

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0


def load_trace(
    path: Path,
    classifier: Classifier,
    keys: KeyMaker,
    *,
    log_format: str = "auto",
    cache_dir: Path | None = None,
    rules_fingerprint: str = "",
    on_progress: Callable[[int, int], None] | None = None,
) -> Trace:
    """Parse ``path`` into a Trace, or read the one cached for this file, format and rules.

    ``rules_fingerprint`` names the classification and cache rules (``rules.rules_fingerprint``), so
    a trace parsed under other rules is not reused.
    """
    try:
        path.stat()
    except OSError as exc:
        raise ConfigError(f"Log file '{path}' cannot be read: {exc.strerror}.") from None
    cache_file = _cache_file(path, log_format, rules_fingerprint, cache_dir) if cache_dir is not None else None
    if cache_file is not None and cache_file.exists():
        try:
            with cache_file.open("rb") as handle:
                version, trace = pickle.load(handle)
            if version == TRACE_VERSION and isinstance(trace, Trace):
                return trace
        except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError):
            pass  # a damaged cache file is rebuilt below
    trace = parse_trace(path, classifier, keys, log_format=log_format, on_progress=on_progress)
    if cache_file is not None:
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            temporary = cache_file.with_suffix(f".tmp-{os.getpid()}")
            with temporary.open("wb") as handle:
                pickle.dump((TRACE_VERSION, trace), handle, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(temporary, cache_file)
        except OSError:
            pass  # no cache is only slower
    return trace


def parse_trace(
    path: Path,
    classifier: Classifier,
    keys: KeyMaker,
    *,
    log_format: str = "auto",
    on_progress: Callable[[int, int], None] | None = None,
    workers: int | None = None,
) -> Trace:
    """One pass over the log: cacheable GET/HEAD requests answered 200, as page numbers and class bits.

    A page's size is the byte count of its first request in the log. A large plain log is cut into
    byte ranges parsed by ``workers`` processes (default: one per core); a gzipped one is read in one.
    """
    size = path.stat().st_size
    log_format = LogReader(path, log_format).format.spec  # detected once, from the start of the file
    workers = workers or os.cpu_count() or 1
    with path.open("rb") as handle:
        compressed = handle.read(2) == b"\x1f\x8b"
    if workers < 2 or compressed or size < PARALLEL_MIN_BYTES:
        part = _parse_part(path, classifier, keys, log_format, None, None, on_progress)
        return _merge([part])
    cuts = [size * index // workers for index in range(workers + 1)]
    _FORK_STATE[:] = [classifier, keys]  # forked workers find them here: neither pickles
    try:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            futures = [pool.submit(_parse_forked, path, log_format, a, b) for a, b in itertools.pairwise(cuts)]
            for done, _ in enumerate(as_completed(futures), start=1):
                if on_progress is not None:
                    on_progress(size * done // workers, size)
            parts = [future.result() for future in futures]
    finally:
        _FORK_STATE.clear()
    return _merge(parts)


# Below this a log is parsed in one process: starting workers would cost more than they save.
PARALLEL_MIN_BYTES = 32 * 1024 * 1024
_FORK_STATE: list[Any] = []


@dataclass(slots=True)
class _Part:
    """A byte range of the log, parsed: pages numbered locally, days absolute (Unix time // 86400)."""

    targets: list[str]
    sizes: array[int]
    pages: array[int]
    crawler: bytearray
    day_runs: list[tuple[int, int]]
    lines: int
    malformed: int
    format_description: str
    malformed_example: str
    truncated: str


def _parse_forked(path: Path, log_format: str, start: int, end: int) -> _Part:
    classifier, keys = _FORK_STATE
    return _parse_part(path, classifier, keys, log_format, start, end, None)


def _parse_part(
    path: Path,
    classifier: Classifier,
    keys: KeyMaker,
    log_format: str,
    start: int | None,
    end: int | None,
    on_progress: Callable[[int, int], None] | None,
) -> _Part:
    reader = LogReader(path, log_format, on_progress=on_progress)
    day_of = reader.format.day_of
    # Per-run memos: a log repeats its request lines and user agents, so each is handled once.
    page_of: dict[str, int | None] = {}
    is_crawler: dict[str, int] = {}
    numbers: dict[str, int] = {}
    pages, sizes = array("I"), array("I")
    day_runs: list[tuple[int, int]] = []
    crawler = bytearray()
    targets: list[str] = []
    last_when, last_day = "", -1
    add_page, add_class = pages.append, crawler.append
    for rows in reader.field_rows(start or 0, end):
        for request, status, size, user_agent, when in rows:
            if status not in STORED_STATUSES:
                continue
            number = page_of.get(request, -1)
            if number == -1:
                number = page_of[request] = _page_number(request, size, keys, numbers, targets, sizes)
            if number is None:
                continue
            # Lines share their time with the line before more often than not: the day is read when it changes.
            if when != last_when:
                last_when = when
                day = day_of(when) or 0
                if day != last_day or not day_runs:
                    day_runs.append((len(pages), day))
                    last_day = day
            bit = is_crawler.get(user_agent)
            if bit is None:
                agent = user_agent.replace('\\"', '"') if "\\" in user_agent else user_agent
                bit = is_crawler[user_agent] = 1 if classifier.classify(agent).is_crawler else 0
            add_page(number)
            add_class(bit)
    example = reader.malformed_example
    return _Part(
        targets,
        sizes,
        pages,
        crawler,
        day_runs,
        reader.lines,
        reader.malformed,
        reader.format.description,
        f"line {example[0]:,}: {example[1][:120]!r}" if example else "",
        reader.truncated or "",
    )


def _page_number(
    request: str, size: str, keys: KeyMaker, numbers: dict[str, int], targets: list[str], sizes: array[int]
) -> int | None:
    """The page number of a GET/HEAD request line for a cacheable URL (a new number for a new page), else None."""
    split = split_request(request)
    if split is None or split[0] not in ("GET", "HEAD"):
        return None
    path_part, _, query = split[1].partition("?")
    key = keys.key_for(path_part.encode("utf-8", "surrogateescape"), query.encode("utf-8", "surrogateescape"))
    if key is None:
        return None
    number = numbers.get(key.target)
    if number is None:
        number = numbers[key.target] = len(targets)
        targets.append(key.target)
        sizes.append(int(size) if size.isdigit() else 0)
    return number


def _merge(parts: list[_Part]) -> Trace:
    """One trace from the parts, in log order: global page numbers, days counted from the first."""
    numbers: dict[str, int] = {}
    targets: list[str] = []
    sizes, pages = array("I"), array("I")
    crawler = bytearray()
    day_runs: list[tuple[int, int]] = []
    first_day = min((day for part in parts for _, day in part.day_runs), default=0)
    for part in parts:
        remap = array("I")
        for target, size in zip(part.targets, part.sizes, strict=True):
            number = numbers.get(target)
            if number is None:
                number = numbers[target] = len(targets)
                targets.append(target)
                sizes.append(size)
            remap.append(number)
        for start, day in part.day_runs:
            if not day_runs or day_runs[-1][1] != day - first_day:  # a part may start within a day
                day_runs.append((len(pages) + start, day - first_day))
        if remap == array("I", range(len(remap))):
            pages.extend(part.pages)
        else:
            pages.extend(array("I", map(remap.__getitem__, part.pages)))
        crawler.extend(part.crawler)
        part.pages = array("I")  # let it go before the next part grows the merged arrays
    return Trace(
        pages,
        crawler,
        day_runs,
        sizes,
        targets,
        sum(p.lines for p in parts),
        sum(p.malformed for p in parts),
        parts[0].format_description if parts else "",
        next((p.malformed_example for p in parts if p.malformed_example), ""),
        next((p.truncated for p in parts if p.truncated), ""),
    )


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


def _cache_file(path: Path, log_format: str, rules: str, cache_dir: Path) -> Path:
    """The cached trace's name: it changes with the log file, its format and the rules that shaped it."""
    stat = path.stat()
    # ctime and inode too: a file rewritten with the same size and a restored mtime is another log.
    identity = (
        f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ctime_ns}|{stat.st_ino}|{log_format}|{rules}"
        f"|{TRACE_VERSION}"
    )
    return cache_dir / (hashlib.blake2b(identity.encode(), digest_size=12).hexdigest() + ".trace")


@dataclass(slots=True)
class SimulationReport:
    """Everything ``crawlergate simulate`` prints, writes as JSON and plots."""

    trace: Trace
    results: list[PolicyResult]
    curve: list[PolicyResult]
    recommended_l1_bytes: int | None
    basis: str = "lru+human"  # the policy whose curve the recommendation comes from
    # The hit ratio of an unlimited, clairvoyant cache: below HOPELESS_HIT_RATIO caching does not help.
    unlimited_hit_ratio: float = 0.0

    def result_applies(self, result: PolicyResult) -> bool:
        """False for ``static`` on a log of one day: it fills each day from the day before."""
        return result.policy != "static" or self.trace.days > 1

    @property
    def caching_helps(self) -> bool:
        return self.unlimited_hit_ratio >= HOPELESS_HIT_RATIO

    def as_json(self) -> dict[str, object]:
        trace = self.trace
        return {
            "requests": trace.requests,
            "unique_pages": trace.unique_pages,
            "crawler_requests": trace.crawler_requests,
            "total_page_bytes": trace.total_bytes,
            "lines": trace.lines,
            "malformed": trace.malformed,
            "read_as": trace.format_description,
            "page_bytes_assumed": trace.sizes_assumed_bytes or None,
            "results": [_result_json(result, self.result_applies(result)) for result in self.results],
            "curve": [_result_json(result, self.result_applies(result)) for result in self.curve],
            "recommended_l1_bytes": self.recommended_l1_bytes if self.caching_helps else None,
            "unlimited_hit_ratio": round(self.unlimited_hit_ratio, 6),
            "caching_helps": self.caching_helps,
        }


def default_sizes(trace: Trace, item_max_bytes: int | None = None) -> list[int]:
    """The paper's 120/250/500 MB when the log's pages outweigh them, else 10/25/50 % of the pages' bytes.

    Never below the largest page L1 admits: a cache that cannot hold one page tells nothing.
    """
    total = trace.total_bytes
    if total > 1_000_000_000:
        return [120_000_000, 250_000_000, 500_000_000]
    floor = max(trace.largest_page(item_max_bytes), 1)
    return sorted({max(floor, int(total * share)) for share in (0.10, 0.25, 0.50)})


def run_simulation(
    trace: Trace,
    sizes: Sequence[int],
    policies: Sequence[str],
    curve_points: int,
    *,
    item_max_bytes: int | None = None,
) -> SimulationReport:
    """The table for ``sizes``, a size sweep for the curves, and the knee of the lru+human curve.

    The recommendation is never smaller than the largest page L1 admits.
    """

    def run(policy: str, size: int) -> PolicyResult:
        return simulate(trace, policy, size, item_max_bytes=item_max_bytes)

    results = [run(policy, size) for size in sizes for policy in policies]
    sweep = size_sweep(trace, curve_points, floor_bytes=trace.largest_page(item_max_bytes))
    curve = [run(policy, size) for size in sweep for policy in policies]
    basis = "lru+human" if "lru+human" in policies else (policies[0] if policies else "lru")
    recommended = knee([(result.size_bytes, result.hit_ratio) for result in curve if result.policy == basis])
    if recommended is not None:
        recommended = max(recommended, trace.largest_page(item_max_bytes), 1)
    unlimited = simulate(trace, "infinite", 0).hit_ratio
    return SimulationReport(trace, results, curve, recommended, basis, unlimited)


def format_report(report: SimulationReport, policies: Sequence[str]) -> str:
    """The paper's Table 5: crawler hit ratio per L1 size (rows) and policy (columns)."""
    trace = report.trace
    lines = [
        f"{trace.requests:,} cacheable page requests ({trace.crawler_requests:,} from crawlers) "
        f"to {trace.unique_pages:,} pages of {trace.total_bytes / 1e6:,.1f} MB in all",
    ]
    if trace.sizes_assumed_bytes:
        lines.append(
            f"the log records no response sizes: every page is taken as {size_text(trace.sizes_assumed_bytes)} "
            "(the paper's average gzip page), so the sizes below are in those units"
        )
    lines += [
        "",
        f"{'L1 size':>10}" + "".join(f"{policy:>11}" for policy in policies),
    ]
    for size in dict.fromkeys(result.size_bytes for result in report.results):
        cells = [ratio_text(report, result) for result in report.results if result.size_bytes == size]
        lines.append(f"{size_text(size):>10}" + "".join(f"{cell:>11}" for cell in cells))
    if trace.days < 2 and "static" in policies:
        lines += ["", "static: n/a (it fills each day with the day before's top pages, and this log has one day)"]
    if not report.caching_helps:
        lines += [
            "",
            f"caching will not help this log: even an unlimited cache would answer {report.unlimited_hit_ratio:.1%} "
            "of crawler requests (crawlers rarely ask for a page twice here)",
        ]
    elif report.recommended_l1_bytes is not None:
        knee_of = f"the knee of the {report.basis} curve"
        lines += ["", f"recommended L1 size: {size_text(report.recommended_l1_bytes)} ({knee_of})"]
    return "\n".join(lines)


def ratio_text(report: SimulationReport, result: PolicyResult) -> str:
    return f"{result.hit_ratio:.2%}" if report.result_applies(result) else "n/a"


def _result_json(result: PolicyResult, applies: bool = True) -> dict[str, object]:
    return {
        "policy": result.policy,
        "size_bytes": result.size_bytes,
        "hit_ratio": round(result.hit_ratio, 6),
        # False: the policy cannot run on this log (static on a log of one day); its ratio means nothing.
        "applies": applies,
        "hits": result.hits,
        "lookups": result.lookups,
    }


def size_text(size: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.4g} {unit}"
    return f"{size} B"
