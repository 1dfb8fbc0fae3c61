"""The HTML page of ``crawlergate simulate --report``: the recommended L1 size in words, the hit-ratio curves with
the recommendation and the MIN bound marked, and the tables.

    Path("simulate.html").write_text(report_html(report, policies))
"""

from __future__ import annotations

from collections.abc import Sequence

from crawlergate.tools.report import Marker, line_chart, note, page as html_page, paragraph, table
from crawlergate.tools.simulate import PolicyResult, SimulationReport, Trace, ratio_text, size_text


def report_html(report: SimulationReport, policies: Sequence[str]) -> str:
    """The HTML report of ``crawlergate simulate --report``: the recommended L1 size, the hit-ratio curves, Table 5."""
    trace = report.trace
    recommended = report.recommended_l1_bytes if report.caching_helps else None
    nearest = min(
        {result.size_bytes for result in report.curve},
        key=lambda size: abs(size - (recommended or 0)),
        default=None,
    )
    at_recommended = [result for result in report.curve if result.size_bytes == nearest]
    practical = [r for r in at_recommended if r.policy not in ("min", "infinite") and report.result_applies(r)]
    best = max(practical, key=lambda result: result.hit_ratio, default=None)
    bound = next((result for result in at_recommended if result.policy == "min"), None)
    if not report.caching_helps:
        headline = (
            f"Caching will not help this log: even an unlimited cache would answer "
            f"{_percent(report.unlimited_hit_ratio)} of crawler requests"
        )
    elif recommended is None:
        headline = "No L1 size can be recommended: the log has no cacheable crawler requests"
    else:
        headline = f"Recommended L1 size: {size_text(recommended)}"
        if best is not None:
            headline += f", where {best.policy} answers {_percent(best.hit_ratio)} of crawler requests"
        if bound is not None:
            headline += f" (the MIN bound: {_percent(bound.hit_ratio)})"
    rows = []
    for size in dict.fromkeys(result.size_bytes for result in report.results):
        rows.append([size_text(size), *(ratio_text(report, r) for r in report.results if r.size_bytes == size)])
    sections = [
        ("Crawler hit ratio by L1 size", _curve_chart(report, policies, recommended, bound)),
        (
            "Crawler hit ratio by policy (the paper's Table 5)",
            table(["L1 size", *policies], rows) + _static_note(report),
        ),
        ("The log", _trace_table(trace)),
    ]
    return html_page("Cache simulation: how large should L1 be?", headline, sections)


def _curve_chart(
    report: SimulationReport, policies: Sequence[str], recommended: int | None, bound: PolicyResult | None
) -> str:
    if not report.caching_helps:
        return note(
            f"No chart: caching does not help this log. Even an unlimited cache would answer only "
            f"{_percent(report.unlimited_hit_ratio)} of crawler requests; crawlers rarely ask for a page twice here."
        )
    sizes = sorted({result.size_bytes for result in report.curve})
    unit, scale = next(((unit, scale) for unit, scale in _UNITS if sizes and sizes[-1] >= scale), ("bytes", 1.0))
    shown = [policy for policy in policies if policy != "static" or report.trace.days > 1]
    ratios = {(result.policy, result.size_bytes): result.hit_ratio for result in report.curve}
    series = {policy: [ratios.get((policy, size)) for size in sizes] for policy in shown}
    x_markers = [Marker(recommended / scale, f"recommended L1 {size_text(recommended)}")] if recommended else []
    y_markers = [Marker(bound.hit_ratio, f"MIN bound {_percent(bound.hit_ratio)}")] if bound else []
    chart = line_chart(
        [size / scale for size in sizes], series, x_label=f"L1 size ({unit}, log scale)",
        y_label="crawler hit ratio", x_axis="log", y_percent=True, x_markers=x_markers, y_markers=y_markers,
        empty_note="The log has no cacheable crawler requests, so there is no curve to show.",
    )  # fmt: skip
    explain = (
        f"The share of crawler requests each policy answers from L1, by L1 size. The recommendation is the knee of "
        f"the {report.basis} curve, past which more memory buys little; MIN, the clairvoyant policy, bounds them all."
    )
    return paragraph(explain) + chart


def _static_note(report: SimulationReport) -> str:
    if report.trace.days > 1 or not any(result.policy == "static" for result in report.results):
        return ""
    return paragraph("static: n/a (it fills each day with the day before's top pages, and this log has one day).")


def _trace_table(trace: Trace) -> str:
    rows = [
        ["cacheable page requests", f"{trace.requests:,}"],
        ["from crawlers", f"{trace.crawler_requests:,}"],
        ["distinct pages", f"{trace.unique_pages:,}"],
        ["bytes of all pages", size_text(trace.total_bytes)],
        ["days", f"{trace.days:,}"],
    ]
    if trace.sizes_assumed_bytes:
        rows.append(["page size assumed (the log has none)", size_text(trace.sizes_assumed_bytes)])
    return table([], rows)


def _percent(ratio: float) -> str:
    return f"{100 * ratio:.1f} %"


# The unit of a chart's sizes: the largest that keeps its numbers at 1 or more.
_UNITS = (("GB", 1e9), ("MB", 1e6), ("kB", 1e3))
