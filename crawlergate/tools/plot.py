"""Self-contained SVG charts and HTML pages for the reports (replay, analyze, simulate).

No plotting library: a report is one HTML file with inline SVG that opens anywhere, offline.

    page = html_page("Cache simulation", [("Hit ratio by L1 size", line_chart({...}, x_label=..., y_label=...))])
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence

WIDTH, HEIGHT = 760, 360
_MARGIN = (60, 140, 30, 50)  # left, right (the legend), top, bottom
# A colour-blind-safe palette (Okabe & Ito 2008).
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")


def line_chart(
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    x_label: str,
    y_label: str,
    log_x: bool = False,
    y_percent: bool = False,
) -> str:
    """An SVG line chart of named (x, y) series."""
    points = [point for values in series.values() for point in values]
    if not points:
        return "<p>(no data)</p>"
    xs = [math.log10(x) if log_x else x for x, _ in points if not log_x or x > 0]
    x_min, x_max = min(xs), max(xs)
    y_min, y_max = 0.0, 1.0 if y_percent else max(max(y for _, y in points), 1e-9)
    if x_max == x_min:
        x_max = x_min + 1

    def sx(x: float) -> float:
        value = math.log10(x) if log_x else x
        return _MARGIN[0] + (value - x_min) / (x_max - x_min) * (WIDTH - _MARGIN[0] - _MARGIN[1])

    def sy(y: float) -> float:
        return HEIGHT - _MARGIN[3] - (y - y_min) / (y_max - y_min) * (HEIGHT - _MARGIN[2] - _MARGIN[3])

    parts = [_axes(x_label, y_label)]
    for tick in range(6):
        y = y_min + (y_max - y_min) * tick / 5
        label = f"{y:.0%}" if y_percent else _short(y)
        parts.append(f'<text x="{_MARGIN[0] - 6}" y="{sy(y) + 4:.1f}" text-anchor="end" font-size="11">{label}</text>')
    for tick in range(6):
        value = x_min + (x_max - x_min) * tick / 5
        x = 10**value if log_x else value
        y_text = HEIGHT - _MARGIN[3] + 16
        parts.append(f'<text x="{sx(x):.1f}" y="{y_text}" text-anchor="middle" font-size="11">{_short(x)}</text>')
    for index, (name, values) in enumerate(series.items()):
        colour = PALETTE[index % len(PALETTE)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in sorted(values) if not log_x or x > 0)
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{path}"/>')
        legend_y = _MARGIN[2] + 16 * index + 10
        parts.append(
            f'<line x1="{WIDTH - _MARGIN[1] + 12}" y1="{legend_y - 4}" x2="{WIDTH - _MARGIN[1] + 32}" '
            f'y2="{legend_y - 4}" stroke="{colour}" stroke-width="3"/>'
            f'<text x="{WIDTH - _MARGIN[1] + 38}" y="{legend_y}" font-size="12">{html.escape(name)}</text>'
        )
    return _svg(parts)


def bar_chart(bars: Mapping[str, float], *, y_label: str, y_percent: bool = False) -> str:
    """An SVG bar chart of named values."""
    if not bars:
        return "<p>(no data)</p>"
    top = max(max(bars.values()), 1e-9)
    width = (WIDTH - _MARGIN[0] - _MARGIN[1]) / len(bars)
    parts = [_axes("", y_label)]
    for index, (name, value) in enumerate(bars.items()):
        height = value / top * (HEIGHT - _MARGIN[2] - _MARGIN[3])
        x = _MARGIN[0] + index * width
        y = HEIGHT - _MARGIN[3] - height
        colour = PALETTE[index % len(PALETTE)]
        label = f"{value:.1%}" if y_percent else _short(value)
        parts.append(
            f'<rect x="{x + 4:.1f}" y="{y:.1f}" width="{width - 8:.1f}" height="{height:.1f}" fill="{colour}"/>'
        )
        parts.append(
            f'<text x="{x + width / 2:.1f}" y="{y - 4:.1f}" text-anchor="middle" font-size="11">{label}</text>'
        )
        parts.append(
            f'<text x="{x + width / 2:.1f}" y="{HEIGHT - _MARGIN[3] + 16}" text-anchor="middle" font-size="11">'
            f"{html.escape(name)}</text>"
        )
    return _svg(parts)


def html_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    head = "".join(f"<th>{html.escape(str(cell))}</th>" for cell in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(cell))}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def html_page(title: str, sections: Sequence[tuple[str, str]]) -> str:
    """A whole HTML page: a title, then (heading, HTML) sections."""
    body = "".join(f"<h2>{html.escape(heading)}</h2>{content}" for heading, content in sections)
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>"
        "body{font-family:system-ui,sans-serif;max-width:780px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}"
        "th{background:#f4f4f4}svg{background:#fff;border:1px solid #eee}</style></head>"
        f"<body><h1>{html.escape(title)}</h1>{body}</body></html>"
    )


def _axes(x_label: str, y_label: str) -> str:
    left, bottom = _MARGIN[0], HEIGHT - _MARGIN[3]
    return (
        f'<line x1="{left}" y1="{_MARGIN[2]}" x2="{left}" y2="{bottom}" stroke="#444"/>'
        f'<line x1="{left}" y1="{bottom}" x2="{WIDTH - _MARGIN[1]}" y2="{bottom}" stroke="#444"/>'
        f'<text x="{(left + WIDTH) / 2:.0f}" y="{HEIGHT - 8}" text-anchor="middle" font-size="12">'
        f"{html.escape(x_label)}</text>"
        f'<text x="14" y="{HEIGHT / 2:.0f}" text-anchor="middle" font-size="12" '
        f'transform="rotate(-90 14 {HEIGHT / 2:.0f})">{html.escape(y_label)}</text>'
    )


def _svg(parts: list[str]) -> str:
    return f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}">{"".join(parts)}</svg>'


def _short(value: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.3g}"
