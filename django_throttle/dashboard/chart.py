"""The dashboard's chart: rejections over time per rule, as inline SVG drawn on the server."""

from __future__ import annotations

from typing import Any

from django.utils import dateformat
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext_lazy as _

from .queries import local_time

PALETTE = (
    "#2a78b5",
    "#d1495b",
    "#3a9b5c",
    "#e8a33d",
    "#7a5195",
    "#00a5a8",
    "#c7622b",
    "#5c6b73",
    "#999999",
)

WIDTH, HEIGHT = 900, 240
LEFT, RIGHT, TOP, BOTTOM = 48, 12, 12, 26


def _nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, ... at least value."""
    step = 1
    while True:
        for factor in (1, 2, 5):
            if step * factor >= value:
                return step * factor
        step *= 10


def chart_svg(data: dict[str, Any], tick_format: str) -> SafeString:
    """Rejections over time, one line per rule, as inline SVG."""
    buckets = data["buckets"]
    n = len(buckets)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    peak = max((max(s["counts"]) for s in data["series"]), default=0)
    top = _nice_ceiling(max(peak, 1))

    def x(i: int) -> float:
        return LEFT + plot_w * i / max(n - 1, 1)

    def y(v: float) -> float:
        return TOP + plot_h * (1 - v / top)

    parts = []
    for value in (0, top / 2, top):
        label = f"{value:g}"
        parts.append(
            format_html(
                '<line class="grid" x1="{}" x2="{}" y1="{}" y2="{}"/>'
                '<text class="axis" x="{}" y="{}" text-anchor="end">{}</text>',
                LEFT,
                WIDTH - RIGHT,
                f"{y(value):.1f}",
                f"{y(value):.1f}",
                LEFT - 6,
                f"{y(value) + 4:.1f}",
                label,
            )
        )
    for i in sorted({0, n // 2, n - 1}) if n else ():
        anchor = "start" if i == 0 else "end" if i == n - 1 else "middle"
        parts.append(
            format_html(
                '<text class="axis" x="{}" y="{}" text-anchor="{}">{}</text>',
                f"{x(i):.1f}",
                HEIGHT - 6,
                anchor,
                dateformat.format(local_time(buckets[i]), tick_format),
            )
        )
    for number, item in enumerate(data["series"]):
        points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(item["counts"]))
        parts.append(
            format_html(
                '<polyline class="series" data-rule="{}" stroke="{}" points="{}">'
                "<title>{}: {}</title></polyline>",
                item["rule"],
                PALETTE[number % len(PALETTE)],
                points,
                item["rule"],
                sum(item["counts"]),
            )
        )
    title = _("Rejections over time per rule")
    return format_html(
        '<svg class="throttle-chart" viewBox="0 0 {} {}" role="img" aria-label="{}" '
        'xmlns="http://www.w3.org/2000/svg">{}</svg>',
        WIDTH,
        HEIGHT,
        title,
        mark_safe("".join(parts)),  # each part built with format_html
    )


def legend(data: dict[str, Any]) -> SafeString:
    return format_html_join(
        "",
        '<li><span class="swatch" style="background:{}"></span>{} <small>({})</small></li>',
        (
            (PALETTE[i % len(PALETTE)], item["rule"], sum(item["counts"]))
            for i, item in enumerate(data["series"])
        ),
    )
