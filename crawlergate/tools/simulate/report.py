"""A simulation run over every policy and size, and its text and JSON."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from crawlergate.tools.simulate.policies import PolicyResult, knee, simulate, size_sweep
from crawlergate.tools.simulate.trace import Trace

# Below this hit ratio of an unlimited cache, no L1 size is worth recommending.
HOPELESS_HIT_RATIO = 0.05


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
        f"to {trace.unique_pages:,} page{'' if trace.unique_pages == 1 else 's'} "
        f"of {size_text(trace.total_bytes)} in all",
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
