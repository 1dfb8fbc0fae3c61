"""Self-contained HTML report pages (replay, demo, analyze, simulate), with charts drawn by the vendored uPlot.

A report is one file that opens anywhere, offline: uPlot's script and style (MIT, under
``crawlergate/static/uplot``) are inlined into the page, each chart's data sits in its element as
JSON, and a short script draws them at the width of the page. A page leads with its result in
words, then (heading, HTML) sections of tables and charts.

    html = page("Cache simulation", "Recommended L1: 120 MB", [("Hit ratio", line_chart(...))])
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from typing import Literal

# A colour-blind-safe palette (Okabe & Ito 2008); a run or class keeps its colour across a page's charts.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000", "#F0E442")
# Wide enough to read, narrow enough for a 1280 px laptop window with its scroll bar.
MAX_CHART_PX = 1100
# A table cell longer than this (a user agent, a URL) wraps anywhere, so the table keeps to the page.
LONG_CELL_CHARS = 40

Section = tuple[str, str]
XAxis = Literal["number", "log", "hour"]


@dataclass(frozen=True, slots=True)
class Marker:
    """A labelled line across a chart: vertical at an x value, or horizontal at a y value."""

    at: float
    label: str


def page(title: str, headline: str, sections: Sequence[Section], *, lead: str = "") -> str:
    """A whole HTML page: the title, the headline result in words, an optional lead paragraph, then sections."""
    body = "".join(f"<section><h2>{html.escape(heading)}</h2>{content}</section>" for heading, content in sections)
    lead_html = f'<p class="lead">{html.escape(lead)}</p>' if lead else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{_asset('uPlot.min.css')}{_STYLE}</style></head>"
        f'<body><h1>{html.escape(title)}</h1><p class="headline">{html.escape(headline)}</p>{lead_html}{body}'
        f"<script>/* {_license()} */\n{_asset('uPlot.iife.min.js')}</script><script>{_script()}</script></body></html>"
    )


def table(header: Sequence[str], rows: Sequence[Sequence[object]], *, text_columns: Collection[int] = (0,)) -> str:
    """An HTML table; the columns in ``text_columns`` are aligned left, the others (numbers) right. No header: []."""

    def cells(tag: str, values: Sequence[object]) -> str:
        parts = []
        for index, value in enumerate(map(str, values)):
            kind = "text" if index in text_columns else "num"
            # Only a long cell may break anywhere: letting every cell do so squeezes short ones letter by letter.
            kind += " long" if len(value) > LONG_CELL_CHARS else ""
            parts.append(f'<{tag} class="{kind}">{html.escape(value)}</{tag}>')
        return "".join(parts)

    body = "".join(f"<tr>{cells('td', row)}</tr>" for row in rows)
    head = f"<thead><tr>{cells('th', header)}</tr></thead>" if header else ""
    return f"<table>{head}<tbody>{body}</tbody></table>"


def paragraph(text: str) -> str:
    return f"<p>{html.escape(text)}</p>"


def note(text: str) -> str:
    """A sentence shown where a chart would say nothing (no data, or a flat line)."""
    return f'<p class="note">{html.escape(text)}</p>'


def line_chart(
    x: Sequence[float],
    series: Mapping[str, Sequence[float | None]],
    *,
    x_label: str,
    y_label: str,
    x_axis: XAxis = "number",
    y_percent: bool = False,
    x_range: tuple[float, float] | None = None,
    y_range: tuple[float, float] | None = None,
    x_markers: Sequence[Marker] = (),
    y_markers: Sequence[Marker] = (),
    colors: Sequence[str] | None = None,
    points: bool = False,
    height: int = 320,
    empty_note: str = "No data to chart.",
) -> str:
    """Named series of y values over shared x values (None: no value there), or a note when they are empty or flat.

    ``x_axis="log"`` puts x on a log scale (points at x <= 0 are left out); ``"hour"`` makes it the hours
    of a day. ``x_range`` and ``y_range`` fix the scales, so charts that are compared share them (widened
    to round values: a log range to 1, 2 or 5 times a power of ten).
    """
    if x_axis == "log" and any(value <= 0 for value in x):
        kept = [index for index, value in enumerate(x) if value > 0]
        x = [x[index] for index in kept]
        series = {label: [column[index] for index in kept] for label, column in series.items()}
    values = [value for column in series.values() for value in column if value is not None and math.isfinite(value)]
    if not x or not values:
        return note(empty_note)
    if min(values) == max(values):
        shown = f"{100 * values[0]:.1f} %" if y_percent else f"{values[0]:,.6g}"
        whose = f"{next(iter(series))}: every" if len(series) == 1 else "Every"
        return note(f"{whose} value is {shown} ({y_label}): a chart would be a flat line.")
    colors = colors or PALETTE
    spec = {
        "kind": "line",
        "x": list(x),
        "series": [
            {"label": label, "values": [_finite(value) for value in column], "color": colors[index % len(colors)]}
            for index, (label, column) in enumerate(series.items())
        ],
        "xLabel": x_label,
        "yLabel": y_label,
        "xAxis": x_axis,
        "yPercent": y_percent,
        "xRange": list(x_range) if x_range else None,
        "yRange": list(y_range) if y_range else None,
        "xMarkers": [{"at": marker.at, "label": marker.label} for marker in x_markers],
        "yMarkers": [{"at": marker.at, "label": marker.label} for marker in y_markers],
        "points": points,
        "height": height,
    }
    return _chart(spec)


def bar_chart(
    bars: Mapping[str, float], *, value_label: str, shares: bool = False, empty_note: str = "No data to chart."
) -> str:
    """Horizontal bars, one a row, so their names never overlap; each bar carries its value (and share of the total)."""
    if not bars:
        return note(empty_note)
    total = sum(bars.values())
    shares = shares and total > 0
    labels = [f"{value:,.6g}" + (f" ({value / total:.0%})" if shares else "") for value in bars.values()]
    spec = {
        "kind": "bars",
        # Very long names are cut: the axis must leave room for the bars.
        "labels": [name if len(name) <= 40 else name[:39] + "…" for name in bars],
        "values": [_finite(value) or 0.0 for value in bars.values()],
        "valueLabels": labels,
        "valueLabel": value_label,
        "color": PALETTE[0],
    }
    return _chart(spec)


def join_series(
    series: Mapping[str, Sequence[tuple[float, float]]],
) -> tuple[list[float], dict[str, list[float | None]]]:
    """Series of their own (x, y) points as shared x values and y columns with None where a series has no point."""
    xs = sorted({x for points in series.values() for x, _ in points})
    where = {x: index for index, x in enumerate(xs)}
    columns: dict[str, list[float | None]] = {}
    for name, points in series.items():
        column: list[float | None] = [None] * len(xs)
        for x, y in points:
            column[where[x]] = y
        columns[name] = column
    return xs, columns


def _chart(spec: Mapping[str, object]) -> str:
    data = json.dumps(spec, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    return f'<div class="chart" data-chart="{html.escape(data, quote=True)}"></div>'


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


@cache
def _asset(name: str) -> str:
    text = (files("crawlergate") / "static" / "uplot" / name).read_text(encoding="utf-8")
    # Inlined in a <script> or <style> element, a closing tag in the text would end it early.
    return text.replace("</", "<\\/")


@cache
def _license() -> str:
    # MIT asks that its notice travel with every copy, and each report is one.
    return _asset("LICENSE").replace("*/", "* /").strip()


def _script() -> str:
    return _SCRIPT.replace("__PALETTE__", json.dumps(PALETTE)).replace("__MAX_WIDTH__", str(MAX_CHART_PX))


_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;color:#222;
  max-width:1150px;margin:0 auto;padding:1.2em 1.5em 3em;line-height:1.45;box-sizing:border-box}
h1{font-size:1.55em;margin:.3em 0 .4em}
h2{font-size:1.2em;margin:1.6em 0 .5em;padding-bottom:.2em;border-bottom:1px solid #e3e3e3}
.headline{font-size:1.3em;font-weight:600;margin:.4em 0;padding:.6em .9em;background:#eef5fb;
  border-left:5px solid #0072B2}
.lead{color:#444;margin:.5em 0 1em}
.note{background:#fff7e0;border-left:5px solid #E69F00;padding:.6em .9em}
table{border-collapse:collapse;margin:.6em 0 1em;max-width:100%}
th,td{border:1px solid #d8d8d8;padding:.3em .65em;vertical-align:top}
.long{overflow-wrap:anywhere}
th{background:#f4f4f4;font-weight:600}
.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.text{text-align:left}
pre{white-space:pre-wrap;overflow-wrap:anywhere}
.chart{margin:.4em 0 1.4em;max-width:100%;overflow:hidden}
.chart .u-legend{font-size:13px}
.marker{position:absolute;pointer-events:none}
.marker-x{top:0;bottom:0;border-left:2px dashed #333}
.marker-y{left:0;right:0;border-top:2px dashed #333}
.marker span,.bar-label{position:absolute;white-space:nowrap;font-size:12px;line-height:16px;padding:0 4px;
  color:#111;background:rgba(255,255,255,.88);pointer-events:none}
.bar-label{background:none}
.bar-label.inside{color:#fff}
"""

# Draws every [data-chart] element with uPlot. Ticks fall on round values (1, 2 or 5 times a power of ten,
# hours in steps of 1, 2, 3 or 6), which uPlot's own incrs and values options choose.
_SCRIPT = """
"use strict";
(function () {
  const PALETTE = __PALETTE__;
  const MAX_WIDTH = __MAX_WIDTH__;
  const INCRS = [];
  for (let e = -9; e <= 15; e++) for (const m of [1, 2, 5]) INCRS.push(Number((m * Math.pow(10, e)).toPrecision(1)));
  const PERCENT_INCRS = [0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.5, 1];
  const number = (v) => Number(v.toPrecision(6)).toLocaleString("en-US", {maximumFractionDigits: 9});
  const percent = (v) => Number((100 * v).toPrecision(6)) + " %";
  const hour = (v) => String(v).padStart(2, "0") + ":00";
  const niceMax = (max) => {
    if (!(max > 0)) return 1;
    const step = Math.pow(10, Math.floor(Math.log10(max))) / 2;
    return Math.ceil((max * 1.02) / step) * step;
  };
  const decade = (v) => Math.pow(10, Math.floor(Math.log10(v) + 1e-9));
  // The ends of a log axis: 1, 2 or 5 times a power of ten, at or beyond the data.
  const roundDown = (v) => [5, 2, 1].map((m) => m * decade(v)).find((end) => end <= v * (1 + 1e-9));
  const roundUp = (v) => [1, 2, 5, 10].map((m) => m * decade(v)).find((end) => end >= v * (1 - 1e-9));
  const axisSize = (u, values) => (values ? 18 + 7 * Math.max(2, ...values.map((v) => String(v).length)) : 40);

  // A log axis labels 1, 2 and 5 of each decade, or only the powers of ten when decades are many.
  function logValues(width) {
    return (u, splits) => {
      const scale = u.scales.x;
      const decades = Math.log10(scale.max / scale.min);
      const keep = decades * 3 * 55 > width ? [1] : [1, 2, 5];
      return splits.map((v) => {
        const mantissa = v / decade(v);
        return keep.some((k) => Math.abs(mantissa - k) < 1e-6) ? number(v) : "";
      });
    };
  }

  function element(tag, className, text) {
    const node = document.createElement(tag);
    node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // Does any series' line pass through the box (over-area pixels)? Each segment is taken as its bounding box.
  function crossesData(u, box) {
    const xs = u.data[0];
    for (let s = 1; s < u.series.length; s++) {
      let previous = null;
      for (let i = 0; i < xs.length; i++) {
        if (u.data[s][i] == null) continue;
        const point = [u.valToPos(xs[i], "x"), u.valToPos(u.data[s][i], "y")];
        const from = previous || point;
        if (Math.max(from[0], point[0]) >= box.left && Math.min(from[0], point[0]) <= box.right &&
            Math.max(from[1], point[1]) >= box.top && Math.min(from[1], point[1]) <= box.bottom) return true;
        previous = point;
      }
    }
    return false;
  }

  const overlaps = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;

  // A marker's label goes where it hides no line and no other label: the first free box of the candidates.
  function place(u, label, candidates, taken) {
    const w = label.offsetWidth, h = label.offsetHeight;
    const boxes = candidates.map(([left, top]) => ({left: left, top: top, right: left + w, bottom: top + h}));
    const free = boxes.find((box) => !crossesData(u, box) && !taken.some((other) => overlaps(box, other)));
    const chosen = free || boxes[0];
    taken.push(chosen);
    return chosen;
  }

  function drawMarkers(u, spec) {
    const over = u.over;
    over.querySelectorAll(".marker").forEach((node) => node.remove());
    const width = over.clientWidth, height = over.clientHeight;
    const taken = [];
    const xs = (spec.xMarkers || []).map((marker) => u.valToPos(marker.at, "x"));
    const ys = (spec.yMarkers || []).map((marker) => u.valToPos(marker.at, "y"));
    xs.forEach((x) => taken.push({left: x - 1, right: x + 1, top: 0, bottom: height}));
    ys.forEach((y) => taken.push({left: 0, right: width, top: y - 1, bottom: y + 1}));
    (spec.yMarkers || []).forEach((marker, index) => {
      const y = ys[index];
      const line = element("div", "marker marker-y");
      line.style.top = y + "px";
      const label = element("span", "", marker.label);
      line.appendChild(label);
      over.appendChild(line);
      const w = label.offsetWidth, h = label.offsetHeight;
      const box = place(u, label, [[4, y - h - 2], [4, y + 3], [width - w - 4, y - h - 2], [width - w - 4, y + 3]],
                        taken);
      label.style.left = box.left + "px";
      label.style.top = box.top - y + "px";
    });
    (spec.xMarkers || []).forEach((marker, index) => {
      const x = xs[index];
      const line = element("div", "marker marker-x");
      line.style.left = x + "px";
      const label = element("span", "", marker.label);
      line.appendChild(label);
      over.appendChild(line);
      const w = label.offsetWidth, h = label.offsetHeight;
      const sides = x > width * 0.6 ? [x - w - 4, x + 4] : [x + 4, x - w - 4];
      const tops = [4, height - h - 4, (height - h) / 2, height / 4 - h / 2, (3 * height) / 4 - h / 2];
      const box = place(u, label, sides.flatMap((left) => tops.map((top) => [left, top])), taken);
      label.style.left = box.left - x + "px";
      label.style.top = box.top + "px";
    });
  }

  function lineOptions(spec, width) {
    const xScale = {time: false};
    const xAxis = {label: spec.xLabel, space: 60, incrs: INCRS, values: (u, splits) => splits.map(number)};
    if (spec.xAxis === "log") {
      const [low, high] = spec.xRange || [Math.min(...spec.x), Math.max(...spec.x)];
      const range = [roundDown(low), roundUp(high)];
      if (range[1] <= range[0]) range[1] = range[0] * 10;
      Object.assign(xScale, {distr: 3, log: 10, range: range});
      xAxis.values = logValues(width);
      // uPlot's own filter drops the 2s and 5s of a decade; logValues chooses which to label instead.
      xAxis.filter = (u, splits) => splits;
      delete xAxis.incrs;
      xAxis.space = 30;
    } else if (spec.xAxis === "hour") {
      xScale.range = [0, 23];
      Object.assign(xAxis, {incrs: [1, 2, 3, 6], space: 44, values: (u, splits) => splits.map(hour)});
    } else if (spec.xRange) {
      xScale.range = spec.xRange;
    }
    const yTop = (max) => niceMax(spec.yRange ? spec.yRange[1] : max);
    const yScale = spec.yPercent ? {range: [0, 1]} : {range: (u, min, max) => [0, yTop(max)]};
    return {
      width: width,
      height: spec.height,
      scales: {x: xScale, y: yScale},
      axes: [
        xAxis,
        {label: spec.yLabel, size: axisSize, incrs: spec.yPercent ? PERCENT_INCRS : INCRS,
         values: (u, splits) => splits.map(spec.yPercent ? percent : number)},
      ],
      series: [{label: spec.xLabel}].concat(spec.series.map((s) => ({
        label: s.label, stroke: s.color, width: 2, spanGaps: true, points: {show: spec.points, size: 6},
      }))),
      legend: {live: false},
      cursor: {drag: {x: false, y: false}},
      hooks: {draw: [(u) => drawMarkers(u, spec)]},
    };
  }

  function drawBarLabels(u, spec) {
    const over = u.over;
    over.querySelectorAll(".bar-label").forEach((node) => node.remove());
    const width = over.clientWidth;
    spec.values.forEach((value, index) => {
      const end = u.valToPos(value, "y");
      const label = element("span", "bar-label", spec.valueLabels[index]);
      label.style.top = u.valToPos(index, "x") - 8 + "px";
      over.appendChild(label);
      if (end + 8 + label.offsetWidth > width) {
        label.classList.add("inside");
        label.style.left = end - label.offsetWidth - 4 + "px";
      } else {
        label.style.left = end + 4 + "px";
      }
    });
  }

  function barOptions(spec, width) {
    const count = spec.labels.length;
    const longest = Math.max(...spec.labels.map((label) => label.length));
    return {
      width: width,
      height: 80 + 34 * count,
      scales: {
        x: {time: false, ori: 1, dir: -1, range: [-0.5, count - 0.5]},
        y: {ori: 0, range: (u, min, max) => [0, niceMax(max)]},
      },
      axes: [
        {scale: "x", side: 3, incrs: [1], space: 10, size: Math.min(300, 16 + 7 * longest), grid: {show: false},
         ticks: {show: false}, values: (u, splits) => splits.map((v) => spec.labels[v] || "")},
        {scale: "y", side: 2, label: spec.valueLabel, space: 70, incrs: INCRS,
         values: (u, splits) => splits.map(number)},
      ],
      series: [{}, {label: spec.valueLabel, fill: spec.color, stroke: spec.color,
                    paths: uPlot.paths.bars({size: [0.7, 26]}), points: {show: false}}],
      legend: {show: false},
      cursor: {show: false},
      hooks: {draw: [(u) => drawBarLabels(u, spec)]},
    };
  }

  const charts = [];
  const widthOf = (node) => Math.max(280, Math.min(MAX_WIDTH, node.clientWidth));
  document.querySelectorAll("[data-chart]").forEach((node) => {
    try {
      const spec = JSON.parse(node.dataset.chart);
      const width = widthOf(node);
      const bars = spec.kind === "bars";
      const options = bars ? barOptions(spec, width) : lineOptions(spec, width);
      const data = bars
        ? [spec.labels.map((_, i) => i), spec.values]
        : [spec.x].concat(spec.series.map((s) => s.values));
      const plot = new uPlot(options, data, node);
      node._uplot = plot;  // for the tests, which read the scales a chart settled on
      charts.push([node, plot]);
    } catch (error) {
      node.replaceChildren(element("p", "note", "This chart could not be drawn: " + error));
      console.error(error);
    }
  });
  let pending;
  window.addEventListener("resize", () => {
    clearTimeout(pending);
    const resize = ([node, plot]) => plot.setSize({width: widthOf(node), height: plot.height});
    pending = setTimeout(() => charts.forEach(resize), 150);
  });
})();
"""
