"""The HTML page of ``crawlergate replay --report`` (and of the demo): the result in words, then tables and charts.

Path("report.html").write_text(report_html([site_alone, through_gate]))
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from crawlergate.tools.replay import ReplayResult, comparison, factor_words, ms_or_na
from crawlergate.tools.report import PALETTE, bar_chart, join_series, line_chart, page, paragraph, table


def report_html(results: Sequence[ReplayResult]) -> str:
    """The HTML report of ``crawlergate replay --report``: the result in words, tables, TTFB and throughput charts.

    Two runs are the site alone, then through crawlergate, and the headline compares them.
    """
    names = run_names(results)
    if len(results) == 2:
        title, headline = "Replay: the site alone and through crawlergate", comparison_headline(results)
        lead = (
            "The same requests of the log, replayed against the site alone, then through crawlergate. "
            "TTFB is the time to the first byte of an answer."
        )
    elif len(results) == 1:
        title, headline, lead = f"Replay of {results[0].requests:,} requests", single_headline(results[0]), ""
    else:
        title, lead = "Replay", ""
        headline = "; ".join(f"{name}: {single_headline(result)}" for name, result in zip(names, results, strict=True))
    sections = [
        ("Runs", runs_table(results, names)),
        ("TTFB by class (ms)", ttfb_table(results, names)),
        *ttfb_sections(results, names),
        ("Throughput over time", paragraph("Requests answered per second, as the run went.") +
         throughput_charts(results, names)),
        ("Outcomes (the X-Crawlergate header)", outcome_charts(results, names)),
    ]  # fmt: skip
    return page(title, headline, sections, lead=lead)


def run_names(results: Sequence[ReplayResult]) -> list[str]:
    """How a report names each run: its label, else what the run is (a comparison is the site, then the gate)."""
    if len(results) == 2:
        defaults = ["site alone", "through crawlergate"]
    elif len(results) == 1:
        defaults = ["this run"]
    else:
        defaults = [f"run {number}" for number in range(1, len(results) + 1)]
    return [result.label or default for result, default in zip(results, defaults, strict=True)]


def comparison_headline(latency: Sequence[ReplayResult], throughput: Sequence[ReplayResult] | None = None) -> str:
    """ "Through crawlergate: crawlers 52× faster, humans 31 % lower TTFB, 2.41× the throughput".

    Mean TTFB comes from the ``latency`` pair and throughput from the ``throughput`` pair (default: the same).
    """
    ratios = comparison(latency)["ratios"]
    rate = comparison(throughput)["ratios"]["throughput"] if throughput else ratios["throughput"]
    crawlers = speed_words(ratios["crawler_mean_ttfb_speedup"])
    humans = speed_words(ratios["human_mean_ttfb_speedup"])
    rate_text = f"{factor_words(rate)} the throughput" if rate else "throughput not measured"
    return f"Through crawlergate: crawlers {crawlers}, humans {humans}, {rate_text}"


def speed_words(speedup: float | None) -> str:
    """A ratio of mean TTFBs (before / after) in words: "52× faster", "31 % lower TTFB", "as fast", "12 % higher
    TTFB" (a share of the time, as the paper's "31 % lower": 162 → 112 ms is 1.45× faster, not 31 % faster)."""
    if not speedup or speedup <= 0:
        return "not measured (no requests)"
    if abs(speedup - 1) < 0.005:
        return "as fast"
    # Under 2×, a share of the time saved reads better.
    if speedup >= 2:
        return f"{factor_words(speedup)} faster"
    if speedup > 1:
        return f"{round(100 * (1 - 1 / speedup))} % lower TTFB"
    if 1 / speedup >= 2:
        return f"{factor_words(1 / speedup)} slower"
    return f"{round(100 * (1 / speedup - 1))} % higher TTFB"


def single_headline(result: ReplayResult) -> str:
    """ "812.4 requests/s; median TTFB: crawlers 3.21 ms, humans 45.2 ms"."""
    summary = result.summary()
    medians = [
        f"{kind}s {_ms_words(summary[kind]['ttfb_ms']['p50'])}" if summary[kind]["count"] else f"{kind}s none"
        for kind in ("crawler", "human")
    ]
    return f"{summary['throughput_rps']:,.1f} requests/s; median TTFB: {', '.join(medians)}"


def runs_table(results: Sequence[ReplayResult], names: Sequence[str]) -> str:
    rows = []
    for name, result in zip(names, results, strict=True):
        summary = result.summary()
        rows.append([name, result.target, f"{summary['requests']:,}", f"{summary['errors']:,}",
                     f"{summary['duration_s']:,.2f}", f"{summary['throughput_rps']:,.1f}"])  # fmt: skip
    header = ["run", "target", "requests", "errors", "duration (s)", "throughput (requests/s)"]
    return table(header, rows, text_columns=(0, 1))


def ttfb_table(results: Sequence[ReplayResult], names: Sequence[str]) -> str:
    rows = []
    for name, result in zip(names, results, strict=True):
        summary = result.summary()
        for kind in ("crawler", "human"):
            errors = sum(summary[kind]["errors"].values())
            stats = [ms_or_na(summary[kind], stat) for stat in ("p50", "p90", "p99", "mean")]
            rows.append([name, kind, f"{summary[kind]['count']:,}", f"{errors:,}", *stats])
    return table(["run", "class", "answered", "errors", "p50", "p90", "p99", "mean"], rows, text_columns=(0, 1))


def ttfb_sections(results: Sequence[ReplayResult], names: Sequence[str], *, when: str = "") -> list[tuple[str, str]]:
    """One cumulative TTFB chart per class, the runs by name, on one shared x range."""
    cdfs = {kind: [_cdf(result, kind) for result in results] for kind in ("crawler", "human")}
    every = [x for curves in cdfs.values() for curve in curves for x, _ in curve]
    x_range = (min(every), max(every)) if every else None
    sections = []
    for kind, curves in cdfs.items():
        chosen = [index for index, curve in enumerate(curves) if curve]
        x, columns = join_series({names[index]: curves[index] for index in chosen})
        chart = line_chart(
            x, columns, x_label="TTFB (ms, log scale)", y_label="requests answered", x_axis="log", y_percent=True,
            x_range=x_range, colors=[PALETTE[index % len(PALETTE)] for index in chosen],
            empty_note=f"No {kind} request was answered, so there is no {kind} TTFB to show.",
        )  # fmt: skip
        explain = paragraph(f"The share of {kind} requests answered within each time: further left is faster.")
        sections.append((f"{kind.capitalize()} TTFB{when}", explain + chart))
    return sections


def throughput_charts(results: Sequence[ReplayResult], names: Sequence[str]) -> str:
    """One throughput-over-time chart a run, all on the same scales and intervals, so their heights compare."""
    right = max((result.duration_s for result in results), default=0.0)
    width_s = max(right / 60, MIN_INTERVAL_S)
    curves = [result.throughput_over_time(max(1, round(result.duration_s / width_s))) for result in results]
    top = max((y for curve in curves for _, y in curve), default=0.0)
    return "".join(
        line_chart(
            [x for x, _ in curve],
            {name: [y for _, y in curve]},
            x_label="seconds since the start",
            y_label="requests/s",
            x_range=(0.0, right),
            y_range=(0.0, top),
            colors=[PALETTE[index % len(PALETTE)]],
            height=220,
            empty_note=f"{name}: no request was answered.",
        )
        for index, (name, curve) in enumerate(zip(names, curves, strict=True))
    )


def outcome_charts(results: Sequence[ReplayResult], names: Sequence[str]) -> str:
    """What the gate did with each run's requests: bars when there were several outcomes, else a sentence."""
    parts = []
    for name, result in zip(names, results, strict=True):
        outcomes = Counter(sample.outcome for sample in result.samples)
        if len(outcomes) > 1:
            bars = {_OUTCOME_NAMES.get(outcome, outcome): count for outcome, count in outcomes.most_common()}
            parts.append(paragraph(f"{name}:") + bar_chart(bars, value_label="requests", shares=True))
        elif outcomes:
            ((outcome, count),) = outcomes.items()
            said = "no X-Crawlergate header: no gate answered them" if outcome == "none" else f"the outcome {outcome}"
            parts.append(paragraph(f"{name}: all {count:,} answered requests had {said}."))
        else:
            parts.append(paragraph(f"{name}: no request was answered."))
    return "".join(parts)


# The shortest interval a throughput chart counts over: in a few milliseconds a burst of answers reads as
# thousands a second, and that spike would set the scale every compared chart shares.
MIN_INTERVAL_S = 0.25
# The outcome of an answer without an X-Crawlergate header, in words.
_OUTCOME_NAMES = {"none": "none (no header)"}


def _ms_words(value: float) -> str:
    return f"{value:,.0f} ms" if value >= 100 else f"{value:.1f} ms" if value >= 10 else f"{value:.2f} ms"


def _cdf(result: ReplayResult, kind: str) -> list[tuple[float, float]]:
    values = sorted(sample.ttfb_ms for sample in result.samples if sample.kind == kind)
    step = max(1, len(values) // 200)
    return [(max(value, 0.01), (index + 1) / len(values)) for index, value in enumerate(values)][::step]
