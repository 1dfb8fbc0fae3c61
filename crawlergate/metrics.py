"""Counts and time-to-first-byte histograms, per request class, crawler family and cache level.

A leaf module: it imports nothing from crawlergate, so every layer can count into it. Every figure
is a named 64-bit integer in one flat array (times in microseconds). A gate with several worker
processes gives each one its array in a file of a shared folder (``shared_dir``), mapped into memory:
a worker only ever writes its own file, and ``stats`` or ``metrics`` asked of any worker sums every
file, so the figures are the whole server's whichever worker answers (prometheus_client's
multiprocess mode, without its per-sample files).

    metrics.record("crawler", "l1-hit", ttfb_ms=0.4, family="Googlebot", tag="search")
    metrics.snapshot()["crawler"]["hit_ratio"]
"""

from __future__ import annotations

import math
import mmap
import os
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

CLASSES = ("crawler", "human", "suspect")
# X-Crawlergate outcomes, plus "error" for a request the gate answered with 5xx of its own, "refused" for a
# crawler's miss answered 503 (the overload valve, or a cache-only policy) and "denied" for a 403 by policy.
OUTCOMES = ("l1-hit", "l2-hit", "miss", "stale", "pass", "error", "refused", "denied", "direct")
# "direct": a crawler hit the front server answered from the published tree (front/directlog.py).
HITS = ("l1-hit", "l2-hit", "direct")

# Histogram buckets grow by 5 % from 10 µs: 1 % resolution would cost memory for no decision,
# 5 % keeps a p99 within 5 % of the truth up to ~10 minutes with about 350 buckets.
_BUCKET_BASE_MS = 0.01
_BUCKET_GROWTH = 1.05
_LOG_GROWTH = math.log(_BUCKET_GROWTH)
_BUCKETS = 350

# Prometheus histogram buckets: the usual latency ladder, from half a millisecond to ten seconds.
PROMETHEUS_BOUNDS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_BOUNDS_MS = tuple(bound * 1000 for bound in PROMETHEUS_BOUNDS_S)

# Counters a process can name: three histograms take 1,050; families (a few hundred in the shipped
# rules) times outcomes and the not-stored reasons take the rest. 128 KiB a worker.
CAPACITY = 16384
# Names past the capacity all count here, so a flood of new names cannot grow memory.
OVERFLOW = "overflow"
# The tag of operators' agents whose request signature was verified (crawlergate.suspect.signatures).
SIGNED_AGENT = "signed-agent"
# Counters whose name starts so are summed as a maximum, not a total.
_MAX_PREFIX = "max:"
_COUNTS_SUFFIX = ".counts"
_NAMES_SUFFIX = ".names"


class Classified(Protocol):
    """What the classifier made of a request (crawlergate.classify.Verdict)."""

    @property
    def kind(self) -> str: ...
    @property
    def family(self) -> str: ...
    @property
    def tag(self) -> str: ...


def bucket_index(ms: float) -> int:
    """The log bucket of a duration in milliseconds."""
    index = int(math.log(ms / _BUCKET_BASE_MS) / _LOG_GROWTH) + 1 if ms > _BUCKET_BASE_MS else 0
    return min(index, _BUCKETS - 1)


class Histogram:
    """A log-bucketed latency histogram in milliseconds: its percentiles, mean and Prometheus buckets."""

    __slots__ = ("counts", "count", "total_ms", "max_ms")

    def __init__(self, counts: list[int] | None = None, total_ms: float = 0.0, max_ms: float = 0.0) -> None:
        self.counts = counts if counts is not None else [0] * _BUCKETS
        self.count = sum(self.counts)
        self.total_ms = total_ms
        self.max_ms = max_ms

    def add(self, ms: float) -> None:
        self.counts[bucket_index(ms)] += 1
        self.count += 1
        self.total_ms += ms
        if ms > self.max_ms:
            self.max_ms = ms

    def percentile(self, fraction: float) -> float:
        """The upper bound of the bucket holding the given fraction of samples (0 when empty)."""
        if not self.count:
            return 0.0
        rank = max(1, math.ceil(fraction * self.count))
        seen = 0
        for index, count in enumerate(self.counts):
            seen += count
            if seen >= rank:
                return min(_BUCKET_BASE_MS * _BUCKET_GROWTH**index, self.max_ms)
        return self.max_ms  # pragma: no cover

    def cumulative_ms(self, bounds_ms: tuple[float, ...]) -> list[int]:
        """Samples at or below each bound (Prometheus ``le`` buckets), from the fine log buckets."""
        counts, total, index = [], 0, 0
        for bound in bounds_ms:
            while index < _BUCKETS and _BUCKET_BASE_MS * _BUCKET_GROWTH**index <= bound * (1 + 1e-9):
                total += self.counts[index]
                index += 1
            counts.append(total)
        return counts

    def summary(self) -> dict[str, float]:
        return {
            "p50": round(self.percentile(0.50), 3),
            "p90": round(self.percentile(0.90), 3),
            "p99": round(self.percentile(0.99), 3),
            "mean": round(self.total_ms / self.count, 3) if self.count else 0.0,
            "max": round(self.max_ms, 3),
        }


class CounterArray:
    """Named 64-bit counters in one flat array: in memory, or in a file that other processes read.

    A file-backed array is two files: ``NAME.counts`` (the values, mapped into memory) and
    ``NAME.names`` (one name a line, in slot order, each written before its slot is first counted).
    """

    def __init__(self, path: Path | None = None, *, capacity: int = CAPACITY) -> None:
        self.path = path
        self.capacity = capacity
        self._names_path: Path | None = None
        if path is None:
            self.values = memoryview(bytearray(8 * capacity)).cast("q")
        else:
            with open(path.with_suffix(_COUNTS_SUFFIX), "w+b") as counts:
                counts.truncate(8 * capacity)
                # The mapping outlives the file object (mmap keeps its own descriptor) and the process keeps
                # it to the end: a worker's counters are read by the others until the server stops.
                self.values = memoryview(mmap.mmap(counts.fileno(), 8 * capacity)).cast("q")
            self._names_path = path.with_suffix(_NAMES_SUFFIX)
            self._names_path.write_text("", encoding="utf-8")
        self.slots: dict[str, int] = {}
        self._lock = threading.Lock()
        self.slot(OVERFLOW)

    def slot(self, name: str) -> int:
        """The slot of ``name``, given one on first use (the overflow slot once all are taken)."""
        found = self.slots.get(name)
        if found is not None:
            return found
        return self.slot_range(name, 1)

    def slot_range(self, name: str, length: int) -> int:
        """The first of ``length`` consecutive slots named ``name#0`` … (a histogram's buckets)."""
        with self._lock:
            found = self.slots.get(name if length == 1 else f"{name}#0")
            if found is not None:
                return found
            first = len(self.slots)
            if first + length > self.capacity:
                return self.slots[OVERFLOW]
            names = [name] if length == 1 else [f"{name}#{index}" for index in range(length)]
            if self._names_path is not None:  # rare (a name's first use): the file is opened each time
                with open(self._names_path, "a", encoding="utf-8") as names_file:
                    names_file.write("".join(f"{each}\n" for each in names))
            for offset, each in enumerate(names):
                self.slots[each] = first + offset
            return first

    def totals(self) -> dict[str, int]:
        values = self.values
        # A name's first use adds a slot from another thread (the dashboard's sampler reads from its own).
        with self._lock:
            slots = list(self.slots.items())
        return {name: values[index] for name, index in slots}


def read_shared(directory: Path) -> dict[str, int]:
    """The counters of every process that counted into ``directory``, summed (``max:`` names: the largest)."""
    totals: dict[str, int] = {}
    for names_path in sorted(directory.glob("*" + _NAMES_SUFFIX)):
        try:
            names = names_path.read_text(encoding="utf-8").split("\n")[:-1]  # a line still being written is left
            data = names_path.with_suffix(_COUNTS_SUFFIX).read_bytes()
        except OSError:
            continue  # a process that is starting or whose files were removed
        values = memoryview(data[: 8 * (len(data) // 8)]).cast("q")
        _merge(totals, zip(names, values, strict=False))
    return totals


def clear_shared(directory: Path) -> None:
    """Remove the counters a previous run left in ``directory`` (creating it if needed)."""
    directory.mkdir(parents=True, exist_ok=True)
    for path in [*directory.glob("*" + _NAMES_SUFFIX), *directory.glob("*" + _COUNTS_SUFFIX)]:
        path.unlink(missing_ok=True)


def _merge(totals: dict[str, int], pairs: Iterable[tuple[str, int]]) -> None:
    for name, value in pairs:
        if name.startswith(_MAX_PREFIX):
            totals[name] = max(totals.get(name, 0), value)
        else:
            totals[name] = totals.get(name, 0) + value


class Metrics:
    """All counters of one gate process; with ``shared_dir``, its figures sum every process counting there."""

    def __init__(self, shared_dir: str | os.PathLike[str] | None = None) -> None:
        self.started_at = time.time()
        self.shared_dir = Path(shared_dir) if shared_dir else None
        own = None
        if self.shared_dir is not None:
            self.shared_dir.mkdir(parents=True, exist_ok=True)
            own = self.shared_dir / f"{os.getpid()}-{id(self):x}"
        self.counters = counters = CounterArray(own)
        self._values = counters.values
        self._lock = threading.Lock()
        self._outcome_slots = {kind: {outcome: counters.slot(f"req|{kind}|{outcome}") for outcome in OUTCOMES}
                               for kind in CLASSES}  # fmt: skip
        self._ttfb_slots = {kind: _HistogramSlots(counters, f"ttfb|{kind}") for kind in CLASSES}
        self._origin_time_slots = {kind: counters.slot(f"origin_us|{kind}") for kind in CLASSES}
        self._origin = _HistogramSlots(counters, "origin")
        # (class, outcome, family, tag) -> the slots such a request counts into; bounded by the rules' families.
        self._plans: dict[tuple[str, str, str, str], tuple[int, int, _HistogramSlots]] = {}
        self._saved_slot = counters.slot("saved_us")
        self._name_sets: dict[tuple[str, ...], tuple[int, ...]] = {}

    def record(
        self, kind: str, outcome: str, ttfb_ms: float, family: str = "", tag: str = "", saved_ms: float = 0.0
    ) -> None:
        """Count one answered request; called once per request, after its first body byte.

        ``family`` and ``tag`` name a crawler's family; ``saved_ms`` is the origin time a hit spared (the
        stored page's generation time).
        """
        plan = self._plans.get((kind, outcome, family, tag))
        if plan is None:
            plan = self._plan(kind, outcome, family, tag)
        request_slot, family_slot, ttfb = plan
        values = self._values
        with self._lock:
            values[request_slot] += 1
            ttfb.add(values, ttfb_ms)
            if family_slot >= 0:
                values[family_slot] += 1
            if saved_ms:
                values[self._saved_slot] += int(saved_ms * 1000)

    def _plan(self, kind: str, outcome: str, family: str, tag: str) -> tuple[int, int, _HistogramSlots]:
        """The slots one kind of request counts into, worked out once (the request path only adds)."""
        family_slot = self.counters.slot(f"family|{family}|{tag}|{outcome}") if family else -1
        plan = (self._outcome_slots[kind][outcome], family_slot, self._ttfb_slots[kind])
        self._plans[(kind, outcome, family, tag)] = plan
        return plan

    def record_for(self, verdict: Classified, outcome: str, started: float, saved_ms: float = 0.0) -> float:
        """``record`` a classified request (its class, and a crawler's family) with the TTFB measured from
        ``started``, a ``time.perf_counter()`` reading; returns the TTFB (ms)."""
        elapsed_ms = (time.perf_counter() - started) * 1000
        self.record(verdict.kind, outcome, elapsed_ms, verdict.family, verdict.tag, saved_ms)
        return elapsed_ms

    def add_origin_time(self, kind: str, ms: float) -> None:
        """Count the site's time answering a request passed to it, to its last body byte (as fills are timed)."""
        with self._lock:
            self._values[self._origin_time_slots[kind]] += int(ms * 1000)

    def record_origin(self, ms: float) -> None:
        """Count one guest sub-request (a fill, for a crawler or a regeneration) and its time to the whole answer."""
        with self._lock:
            self._origin.add(self._values, ms)
            self._values[self._origin_time_slots["crawler"]] += int(ms * 1000)

    def count(self, name: str, amount: int = 1) -> None:
        """Add to a named counter: origin_errors, corrupt_pages, prefetch_useful, evictions_l1, not_stored|REASON …"""
        slot = self.counters.slot(name)
        with self._lock:
            self._values[slot] += amount

    def count_all(self, names: tuple[str, ...]) -> None:
        """Add one to each of ``names`` (a suspect's reasons): their slots are worked out once per set of names."""
        slots = self._name_sets.get(names)
        if slots is None:
            if len(self._name_sets) > 4096:
                self._name_sets.clear()
            slots = self._name_sets[names] = tuple(self.counters.slot(name) for name in names)
        values = self._values
        with self._lock:
            for slot in slots:
                values[slot] += 1

    def requests(self, kind: str) -> int:
        """Requests of class ``kind`` this process answered so far."""
        values = self._values
        return sum(values[slot] for slot in self._outcome_slots[kind].values())

    def count_prefetch(self) -> None:
        self.count("prefetches")

    def count_not_stored(self, reason: str) -> None:
        self.count(f"not_stored|{reason}")

    def count_store_error(self, kind: str) -> None:
        self.count(f"store_errors|{kind}")

    def totals(self) -> dict[str, int]:
        """Every counter, summed over the processes that share this one's folder (or this process's own)."""
        if self.shared_dir is None:
            return self.counters.totals()
        return read_shared(self.shared_dir)

    def prometheus(
        self, gauges: dict[str, float] | None = None, more_counters: dict[str, tuple[str, int]] | None = None
    ) -> str:
        """The counters in the Prometheus text exposition format (version 0.0.4); ``more_counters`` adds others
        (name: (help, value)), kept elsewhere."""
        return prometheus_text(self.totals(), gauges or {}, more_counters or {})

    def snapshot(self) -> dict[str, Any]:
        """The stats JSON: per class requests, hits per level, misses, hit ratio and TTFB percentiles; per
        family requests and hits; origin requests, time and the time hits saved; prefetches and evictions."""
        data = stats_from(self.totals())
        data["uptime_s"] = round(time.time() - self.started_at, 1)
        # Worker processes whose counters are summed here (those that stopped during the run included).
        data["processes"] = len(list(self.shared_dir.glob("*" + _NAMES_SUFFIX))) if self.shared_dir else 1
        return data


class _HistogramSlots:
    """A histogram's slots in a CounterArray: the buckets, the sum and the maximum (µs)."""

    __slots__ = ("first", "sum", "max")

    def __init__(self, counters: CounterArray, name: str) -> None:
        self.first = counters.slot_range(name, _BUCKETS)
        self.sum = counters.slot(f"{name}|sum_us")
        self.max = counters.slot(f"{_MAX_PREFIX}{name}|max_us")

    def add(self, values: memoryview, ms: float) -> None:
        values[self.first + bucket_index(ms)] += 1
        micros = int(ms * 1000)
        values[self.sum] += micros
        if micros > values[self.max]:
            values[self.max] = micros


def histogram_of(totals: Mapping[str, int], name: str) -> Histogram:
    """A histogram from summed counters."""
    counts = [totals.get(f"{name}#{index}", 0) for index in range(_BUCKETS)]
    return Histogram(
        counts, totals.get(f"{name}|sum_us", 0) / 1000, totals.get(f"{_MAX_PREFIX}{name}|max_us", 0) / 1000
    )


def _families(totals: Mapping[str, int]) -> dict[str, dict[str, Any]]:
    families: dict[str, dict[str, Any]] = {}
    for name, value in totals.items():
        if name.startswith("family|") and value:
            _, family, tag, outcome = name.split("|", 3)
            entry = families.setdefault(family, {"tag": tag, "requests": 0, "hits": 0, "outcomes": {}})
            entry["requests"] += value
            entry["outcomes"][outcome] = entry["outcomes"].get(outcome, 0) + value
            if outcome in HITS:
                entry["hits"] += value
    return dict(sorted(families.items(), key=lambda item: (-item[1]["requests"], item[0])))


def _signed_agents(families: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    return {name: entry["requests"] for name, entry in families.items() if entry["tag"] == SIGNED_AGENT}


def _named(totals: Mapping[str, int], prefix: str) -> dict[str, int]:
    return {name[len(prefix) :]: value for name, value in sorted(totals.items()) if name.startswith(prefix) and value}


def stats_from(totals: Mapping[str, int]) -> dict[str, Any]:
    """The stats JSON from (summed) counters."""
    origin = histogram_of(totals, "origin")
    origin_ms = {kind: totals.get(f"origin_us|{kind}", 0) / 1000 for kind in CLASSES}
    families = _families(totals)
    data: dict[str, Any] = {
        "origin_fetches": origin.count,
        "origin_errors": totals.get("origin_errors", 0),
        "origin": {
            "requests": origin.count,
            "errors": totals.get("origin_errors", 0),
            "ttfb_ms": origin.summary(),
            "seconds": {kind: round(ms / 1000, 3) for kind, ms in origin_ms.items()},
        },
        "origin_time_saved_s": round(totals.get("saved_us", 0) / 1e6, 3),
        "corrupt_pages": totals.get("corrupt_pages", 0),
        "not_stored": _named(totals, "not_stored|"),
        "prefetches": {"issued": totals.get("prefetches", 0), "useful": totals.get("prefetch_useful", 0)},
        "evictions": {"l1": totals.get("evictions_l1", 0), "l2": totals.get("evictions_l2", 0)},
        "families": families,
        "signed_agents": {
            "verified": totals.get("signatures|verified", 0),
            "unverified": totals.get("signatures|invalid", 0),
            "pending": totals.get("signatures|pending", 0),
            "reasons": _named(totals, "signature|"),
            "operators": _signed_agents(families),
        },
        "evidence": {
            "suspects": totals.get("suspects|evidence", 0),
            "unverified_claimants": totals.get("claimants|unverified", 0),
            "reasons": _named(totals, "evidence|"),
        },
        "refused": {
            "valve": totals.get("refused|valve", 0),
            "cache_only": totals.get("refused|cache-only", 0),
            "fill_budget": totals.get("refused|fill-budget", 0),
        },
    }
    for kind in CLASSES:
        outcomes = {outcome: totals.get(f"req|{kind}|{outcome}", 0) for outcome in OUTCOMES}
        hits = outcomes["l1-hit"] + outcomes["l2-hit"] + outcomes["direct"]
        lookups = hits + outcomes["miss"] + outcomes["stale"]
        data[kind] = {
            "requests": sum(outcomes.values()),
            "l1_hits": outcomes["l1-hit"],
            "l2_hits": outcomes["l2-hit"],
            "direct_hits": outcomes["direct"],
            "misses": outcomes["miss"],
            "stale": outcomes["stale"],
            "passes": outcomes["pass"],
            "errors": outcomes["error"],
            "refused": outcomes["refused"],
            "denied": outcomes["denied"],
            "hit_ratio": round(hits / lookups, 4) if lookups else 0.0,
            "prefetches": totals.get("prefetches", 0) if kind == "human" else 0,
            "store_errors": totals.get(f"store_errors|{kind}", 0),
            "ttfb_ms": histogram_of(totals, f"ttfb|{kind}").summary(),
        }
    requests = sum(data[kind]["requests"] for kind in CLASSES)
    origin_total = sum(origin_ms.values())
    data["crawler_share"] = {
        "requests": round(data["crawler"]["requests"] / requests, 4) if requests else 0.0,
        "origin_time": round(origin_ms["crawler"] / origin_total, 4) if origin_total else 0.0,
    }
    return data


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus_text(
    totals: Mapping[str, int], gauges: Mapping[str, float], more_counters: Mapping[str, tuple[str, int]]
) -> str:
    """Summed counters in the Prometheus text exposition format (version 0.0.4)."""
    lines = [
        "# HELP crawlergate_requests_total Requests answered, by class and X-Crawlergate outcome.",
        "# TYPE crawlergate_requests_total counter",
    ]
    for kind in CLASSES:
        for outcome in OUTCOMES:
            count = totals.get(f"req|{kind}|{outcome}", 0)
            lines.append(f'crawlergate_requests_total{{class="{kind}",outcome="{outcome}"}} {count}')
    lines += [
        "# HELP crawlergate_family_requests_total Crawler requests answered, by family, its tag and outcome.",
        "# TYPE crawlergate_family_requests_total counter",
    ]
    for name, count in sorted(totals.items()):
        if name.startswith("family|") and count:
            _, family, tag, outcome = name.split("|", 3)
            labels = f'family="{_label(family)}",tag="{_label(tag)}",outcome="{outcome}"'
            lines.append(f"crawlergate_family_requests_total{{{labels}}} {count}")
    histograms = [
        ("crawlergate_ttfb_seconds", "Time from the request to its first body byte.", "ttfb", True),
        ("crawlergate_origin_fetch_seconds", "Time of a guest sub-request to the site, to its whole answer.",
         "origin", False),
    ]  # fmt: skip
    for metric, text, name, by_class in histograms:
        lines += [f"# HELP {metric} {text}", f"# TYPE {metric} histogram"]
        for kind in CLASSES if by_class else ("",):
            histogram = histogram_of(totals, f"{name}|{kind}" if by_class else name)
            label = f'class="{kind}",' if by_class else ""
            for bound, count in zip(PROMETHEUS_BOUNDS_S, histogram.cumulative_ms(_BOUNDS_MS), strict=True):
                lines.append(f'{metric}_bucket{{{label}le="{bound:g}"}} {count}')
            lines.append(f'{metric}_bucket{{{label}le="+Inf"}} {histogram.count}')
            selector = "{" + label.rstrip(",") + "}" if label else ""
            lines.append(f"{metric}_sum{selector} {histogram.total_ms / 1000:.6f}")
            lines.append(f"{metric}_count{selector} {histogram.count}")
    origin = histogram_of(totals, "origin")
    counters_of_gate = {
        "crawlergate_origin_fetches_total": ("Guest sub-requests sent to the site.", origin.count),
        "crawlergate_origin_errors_total": ("Guest sub-requests that failed.", totals.get("origin_errors", 0)),
        "crawlergate_corrupt_pages_total": ("Stored pages that failed their checksum.", totals.get("corrupt_pages", 0)),
        "crawlergate_prefetches_total": ("Pages human views copied from L2 into L1.", totals.get("prefetches", 0)),
        "crawlergate_prefetches_useful_total": (
            "Prefetched pages a crawler then found in L1.",
            totals.get("prefetch_useful", 0),
        ),
    }
    for key, (text, count) in (counters_of_gate | dict(more_counters)).items():
        lines += [f"# HELP {key} {text}", f"# TYPE {key} counter", f"{key} {count}"]
    labelled: list[tuple[str, str, str, Mapping[str, float]]] = [
        ("crawlergate_store_errors_total", "Cache store failures treated as misses.", "class",
         {kind: totals.get(f"store_errors|{kind}", 0) for kind in CLASSES}),
        ("crawlergate_not_stored_total", "Crawler requests whose page was not stored, by reason.", "reason",
         _named(totals, "not_stored|")),
        ("crawlergate_evictions_total", "Pages a cache level dropped to stay within its size.", "level",
         {"l1": totals.get("evictions_l1", 0), "l2": totals.get("evictions_l2", 0)}),
        ("crawlergate_origin_seconds_total", "Time the site spent answering, by the class it answered for.",
         "class", {kind: totals.get(f"origin_us|{kind}", 0) / 1e6 for kind in CLASSES}),
        ("crawlergate_evidence_total", "Suspects' requests by the evidence (rule) that counted against them.",
         "reason", _named(totals, "evidence|")),
        ("crawlergate_refused_total", "Crawler and suspect misses answered 503 to spare the site, by what refused.",
         "by", {by: totals.get(f"refused|{by}", 0) for by in ("valve", "cache-only", "fill-budget")}),
        ("crawlergate_signatures_total", "Requests with a Web Bot Auth signature, by what it came to.", "result",
         {result: totals.get(f"signatures|{result}", 0) for result in ("verified", "invalid", "pending")}),
        ("crawlergate_signed_agents_total", "Requests of operators' agents whose signature was verified.",
         "operator", _signed_agents(_families(totals))),
    ]  # fmt: skip
    for metric, text, label, values in labelled:
        lines += [f"# HELP {metric} {text}", f"# TYPE {metric} counter"]
        for value_label, value in values.items():
            lines.append(f'{metric}{{{label}="{value_label}"}} {value:.15g}')
    saved = totals.get("saved_us", 0) / 1e6
    lines += [
        "# HELP crawlergate_suspects_total Requests made suspects by evidence (unverified claimants counted apart).",
        "# TYPE crawlergate_suspects_total counter",
        f"crawlergate_suspects_total {totals.get('suspects|evidence', 0)}",
        "# HELP crawlergate_unverified_claimants_total Requests claiming a search engine's crawler from elsewhere.",
        "# TYPE crawlergate_unverified_claimants_total counter",
        f"crawlergate_unverified_claimants_total {totals.get('claimants|unverified', 0)}",
        "# HELP crawlergate_origin_seconds_saved_total Origin time crawler hits spared (each page's generation time).",
        "# TYPE crawlergate_origin_seconds_saved_total counter",
        f"crawlergate_origin_seconds_saved_total {saved:.15g}",
    ]
    for key, gauge in gauges.items():
        lines += [f"# TYPE {key} gauge", f"{key} {gauge:.15g}"]
    return "\n".join(lines) + "\n"
