"""An access log as a compact trace for the simulator: a page number and a class bit per request, a size per
page, a day per request; parsed in parallel for big logs and cached on disk."""

from __future__ import annotations

import hashlib
import itertools
import multiprocessing
import os
import pickle
from array import array
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crawlergate.classify import Classifier
from crawlergate.errors import ConfigError
from crawlergate.keys import KeyMaker
from crawlergate.tools.logparse import LogReader, split_request

# Bumped when the cached trace's layout changes, so old files are ignored.
TRACE_VERSION = 5


# Statuses the gate stores (crawlergate.gate.storable): what simulate lets into the cache.
STORED_STATUSES = frozenset({"200", "301", "308", "404", "410"})


# The paper's average gzip page (section 5): the size assumed when a log records none.
ASSUMED_PAGE_BYTES = 14_000


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

    A page's size is the byte count of its first answer with a body in the log (a HEAD's 0 is no size). A large
    plain log is cut into byte ranges parsed by ``workers`` processes (default: one per core); a gzipped one is
    read in one.
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
            if not sizes[number] and size.isdigit():
                # A page first seen by a HEAD (or a line before the log gained its byte field) weighs what its
                # first answer with a body says.
                sizes[number] = int(size)
            # Lines share their time with the line before more often than not: the day is read when it changes.
            if when != last_when:
                last_when = when
                day = day_of(when) or 0
                if day != last_day or not day_runs:
                    day_runs.append((len(pages), day))
                    last_day = day
            bit = is_crawler.get(user_agent)
            if bit is None:
                # "-" is the log's "none", which the gate takes for a person (analyze and classify --log do too).
                agent = (
                    user_agent.replace('\\"', '"') if "\\" in user_agent else "" if user_agent == "-" else user_agent
                )
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
            elif not sizes[number]:
                sizes[number] = size
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


def _cache_file(path: Path, log_format: str, rules: str, cache_dir: Path) -> Path:
    """The cached trace's name: it changes with the log file, its format and the rules that shaped it."""
    stat = path.stat()
    # ctime and inode too: a file rewritten with the same size and a restored mtime is another log.
    identity = (
        f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ctime_ns}|{stat.st_ino}|{log_format}|{rules}"
        f"|{TRACE_VERSION}"
    )
    return cache_dir / (hashlib.blake2b(identity.encode(), digest_size=12).hexdigest() + ".trace")
