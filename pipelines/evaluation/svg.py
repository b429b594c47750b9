"""The A/B report's charts as inline SVG text, written directly (no plotting library).

Three chart kinds, each returning one ``<svg>`` element sized in CSS pixels:

* ``line_chart``: points joined by lines per series, with an optional ``y = x`` diagonal (the
  reliability curves);
* ``interval_rows``: one horizontal interval with its point per row, around a zero line (metric
  deltas with their bootstrap intervals, per metric or per slice);
* ``interval_groups``: vertical intervals per category and series, with an optional reference
  line (off-policy estimates of each policy).

Axes get at most 8 ticks at multiples of 1, 2 or 5 times a power of ten (``nice_ticks``).
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence

FONT = "font-family='Helvetica,Arial,sans-serif' font-size='11'"
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")

Interval = tuple[float, float, float]  # value, low, high


def nice_ticks(lo: float, hi: float, most: int = 7) -> list[float]:
    """Tick values covering ``[lo, hi]``: the multiples of the smallest step in {1, 2, 5} x 10^k
    that cuts the range into at most ``most`` intervals."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    mag = 10 ** math.floor(math.log10((hi - lo) / most))
    step = next(m * mag for m in (1, 2, 5, 10) if (hi - lo) / (m * mag) <= most)
    first = math.ceil(lo / step - 1e-9)
    return [round(k * step, 12) for k in range(first, math.floor(hi / step + 1e-9) + 1)]


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def _t(x: float, y: float, text: str, anchor: str = "middle", extra: str = "") -> str:
    return (
        f"<text x='{x:.1f}' y='{y:.1f}' text-anchor='{anchor}' {FONT} {extra}>"
        f"{html.escape(text)}</text>"
    )


class Frame:
    """Plot area of a ``width`` x ``height`` chart with data ranges mapped to pixels."""

    def __init__(self, width: int, height: int, left: int, x: tuple[float, float], y=(0.0, 1.0)):
        self.w, self.h, self.left, self.top, self.bottom = width, height, left, 28, 40
        self.x0, self.x1 = x
        self.y0, self.y1 = y
        self.parts = [
            f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
            f"viewBox='0 0 {width} {height}' role='img'>",
            f"<rect width='{width}' height='{height}' fill='white'/>",
        ]

    def px(self, v: float) -> float:
        span = (self.x1 - self.x0) or 1.0
        return self.left + (v - self.x0) / span * (self.w - self.left - 16)

    def py(self, v: float) -> float:
        span = (self.y1 - self.y0) or 1.0
        return self.h - self.bottom - (v - self.y0) / span * (self.h - self.top - self.bottom)

    def add(self, s: str) -> None:
        self.parts.append(s)

    def axes(
        self, title: str, xlabel: str, ylabel: str = "", xticks: bool = True, yticks: bool = True
    ) -> None:
        bottom, right = self.h - self.bottom, self.w - 16
        self.add(_t(self.w / 2, 16, title, extra="font-weight='bold'"))
        for v in nice_ticks(self.x0, self.x1) if xticks else []:
            x = self.px(v)
            self.add(
                f"<line x1='{x:.1f}' y1='{bottom}' x2='{x:.1f}' y2='{bottom + 4}' stroke='#444'/>"
            )
            self.add(_t(x, bottom + 15, _fmt(v)))
        if yticks:
            for v in nice_ticks(self.y0, self.y1):
                y = self.py(v)
                self.add(
                    f"<line x1='{self.left - 4}' y1='{y:.1f}' x2='{self.left}' y2='{y:.1f}' "
                    "stroke='#444'/>"
                )
                self.add(_t(self.left - 6, y + 4, _fmt(v), "end"))
        self.add(
            f"<rect x='{self.left}' y='{self.top}' width='{right - self.left}' "
            f"height='{bottom - self.top}' fill='none' stroke='#444'/>"
        )
        self.add(_t((self.left + right) / 2, self.h - 8, xlabel))
        if ylabel:
            cy = (self.top + bottom) / 2
            self.add(_t(12, cy, ylabel, extra=f"transform='rotate(-90 12 {cy:.1f})'"))

    def hline(self, y: float, color: str = "grey", dash: str = "4 3") -> None:
        self.add(
            f"<line x1='{self.left}' y1='{self.py(y):.1f}' x2='{self.w - 16}' "
            f"y2='{self.py(y):.1f}' stroke='{color}' stroke-dasharray='{dash}'/>"
        )

    def vline(self, x: float, color: str = "grey") -> None:
        self.add(
            f"<line x1='{self.px(x):.1f}' y1='{self.top}' x2='{self.px(x):.1f}' "
            f"y2='{self.h - self.bottom}' stroke='{color}'/>"
        )

    def legend(self, entries: Sequence[tuple[str, str]]) -> None:
        for i, (name, color) in enumerate(entries):
            y = self.top + 14 + 15 * i
            self.add(f"<circle cx='{self.left + 12}' cy='{y - 4}' r='4' fill='{color}'/>")
            self.add(_t(self.left + 22, y, name, "start"))

    def text(self) -> str:
        return "".join([*self.parts, "</svg>"])


def line_chart(
    series: Mapping[str, tuple[Sequence[float], Sequence[float], str]],
    title: str,
    xlabel: str,
    ylabel: str,
    diagonal: bool = False,
) -> str:
    """``series``: ``{name: (xs, ys, color)}``; ``diagonal`` draws ``y = x`` (dashed)."""
    values = [v for xs, ys, _ in series.values() for v in (*xs, *ys)]
    hi = max(values, default=1.0) or 1.0
    f = Frame(520, 420, 56, (0.0, hi * 1.05), (0.0, hi * 1.05))
    f.axes(title, xlabel, ylabel)
    if diagonal:
        f.add(
            f"<line x1='{f.px(0):.1f}' y1='{f.py(0):.1f}' x2='{f.px(hi):.1f}' y2='{f.py(hi):.1f}' "
            "stroke='grey' stroke-dasharray='4 3'/>"
        )
    for xs, ys, color in series.values():
        pts = " ".join(f"{f.px(x):.1f},{f.py(y):.1f}" for x, y in zip(xs, ys, strict=True))
        f.add(f"<polyline points='{pts}' fill='none' stroke='{color}' stroke-width='1.5'/>")
        for x, y in zip(xs, ys, strict=True):
            f.add(f"<circle cx='{f.px(x):.1f}' cy='{f.py(y):.1f}' r='3' fill='{color}'/>")
    entries = [(n, c) for n, (_, _, c) in series.items()]
    f.legend([*entries, ("perfect calibration", "grey")] if diagonal else entries)
    return f.text()


def interval_rows(
    rows: Sequence[tuple[str, Interval, str]], title: str, xlabel: str, label_width: int = 150
) -> str:
    """One row per ``(label, (value, low, high), color)``: a point and its interval, on an axis
    symmetric around zero (a vertical zero line)."""
    span = max((max(abs(lo), abs(hi)) for _, (_, lo, hi), _ in rows), default=0.0)
    span = max(span, 1e-12) * 1.3
    height = 22 * len(rows) + 76
    f = Frame(660, height, label_width, (-span, span), (len(rows) - 0.5, -0.5))
    f.axes(title, xlabel, yticks=False)
    f.vline(0.0)
    for i, (label, (v, lo, hi), color) in enumerate(rows):
        y = f.py(i)
        f.add(_t(label_width - 6, y + 4, label, "end"))
        f.add(
            f"<line x1='{f.px(lo):.1f}' y1='{y:.1f}' x2='{f.px(hi):.1f}' y2='{y:.1f}' "
            f"stroke='{color}' stroke-width='1.5'/>"
        )
        for end in (lo, hi):
            x = f.px(end)
            f.add(
                f"<line x1='{x:.1f}' y1='{y - 4:.1f}' x2='{x:.1f}' y2='{y + 4:.1f}' stroke='{color}'/>"
            )
        f.add(f"<circle cx='{f.px(v):.1f}' cy='{y:.1f}' r='3.5' fill='{color}'/>")
    return f.text()


def interval_groups(
    categories: Sequence[str],
    series: Mapping[str, Sequence[Interval | None]],
    title: str,
    ylabel: str,
    reference: tuple[str, float] | None = None,
) -> str:
    """Per category, one vertical interval per series (``None``: not drawn), side by side;
    ``reference`` is ``(label, y)`` of a dashed horizontal line."""
    vals = [x for vs in series.values() for iv in vs if iv for x in iv]
    if reference:
        vals.append(reference[1])
    lo, hi = (min(vals), max(vals)) if vals else (0.0, 1.0)
    pad = (hi - lo) * 0.1 or abs(hi) * 0.1 or 1.0
    n = max(len(categories), 1)
    f = Frame(660, 380, 64, (-0.5, n - 0.5), (lo - pad, hi + pad))
    f.axes(title, "", ylabel, xticks=False)
    width = 0.8 / max(len(series), 1)
    colors = {}
    for j, (name, vs) in enumerate(series.items()):
        color = colors[name] = PALETTE[j % len(PALETTE)]
        for i, iv in enumerate(vs):
            if iv is None:
                continue
            v, a, b = iv
            x = f.px(i + (j - (len(series) - 1) / 2) * width)
            f.add(
                f"<line x1='{x:.1f}' y1='{f.py(a):.1f}' x2='{x:.1f}' y2='{f.py(b):.1f}' "
                f"stroke='{color}' stroke-width='1.5'/>"
            )
            f.add(f"<circle cx='{x:.1f}' cy='{f.py(v):.1f}' r='3.5' fill='{color}'/>")
    for i, name in enumerate(categories):
        f.add(_t(f.px(i), f.h - f.bottom + 28, name))
    entries = list(colors.items())
    if reference:
        f.hline(reference[1])
        entries.append((reference[0], "grey"))
    f.legend(entries)
    return f.text()
