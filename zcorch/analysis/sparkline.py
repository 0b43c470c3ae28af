"""A cell's nightly series as a small inline SVG for the history page (matplotlib would take minutes for a fleet's
thousands): the trend plot's numbers; only numbers computed here and the escaped label go into the markup."""
from __future__ import annotations

from typing import Sequence

import numpy as np
from markupsafe import Markup, escape

WIDTH, HEIGHT = 120, 26   # CSS pixels
_SX, _SY = 1000, 200      # the drawing's own integer grid (viewBox), scaled to WIDTH x HEIGHT
_PAD = 16                 # grid units kept free above and below the line


def _ints(values: np.ndarray) -> "list[int]":
    return np.rint(values).astype(np.int64).tolist()


def sparkline(median: Sequence[float], levels: "Sequence[tuple[int, int, float]]", steps: Sequence[int],
              failed: Sequence[bool], bad: bool, title: str) -> Markup:
    """The SVG of one series: `median` per night (NaN: no ok run), `levels` (start, end, level), `steps` where a
    level begins, `failed` nights, `bad` newest night, `title` the tooltip."""
    y = np.asarray(median, dtype="float64")
    n = len(y)
    known = np.isfinite(y)
    parts = [f'<svg class="spark" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {_SX} {_SY}" '
             f'preserveAspectRatio="none" role="img" aria-label="{escape(title)}"><title>{escape(title)}</title>']
    if n and known.any():
        lo, hi = float(np.min(y[known])), float(np.max(y[known]))
        for _, _, level in levels:
            lo, hi = min(lo, level), max(hi, level)
        span = hi - lo if hi > lo else (abs(hi) or 1.0)
        mid = (hi + lo) / 2 if hi > lo else hi

        def gy(v):
            return _SY / 2 - (np.asarray(v, dtype="float64") - mid) / span * (_SY - 2 * _PAD)

        def gx(i):
            return (np.asarray(i, dtype="float64") + 0.5) / n * _SX

        for start, end, level in levels:
            x0, x1, yl = _ints(gx(np.array([start - 0.5, end - 0.5]))) + _ints(gy([level]))
            parts.append(f'<line x1="{x0}" y1="{yl}" x2="{x1}" y2="{yl}" stroke="#999" stroke-width="6" '
                         'vector-effect="non-scaling-stroke"/>')
        for s in steps:
            xs = _ints(gx([s - 0.5]))[0]
            parts.append(f'<line x1="{xs}" y1="0" x2="{xs}" y2="{_SY}" stroke="#d62728" stroke-width="1" '
                         'vector-effect="non-scaling-stroke"/>')
        # one polyline per run of consecutive nights with an ok run
        idx = np.flatnonzero(known)
        runs = np.split(idx, np.flatnonzero(np.diff(idx) > 1) + 1)
        xs, ys = _ints(gx(np.arange(n))), _ints(gy(np.where(known, y, mid)))
        for r in runs:
            if len(r) > 1:   # consecutive nights: one slice of each coordinate
                a, b = int(r[0]), int(r[-1]) + 1
                pts = " ".join(map("{},{}".format, xs[a:b], ys[a:b]))
                parts.append(f'<polyline points="{pts}" fill="none" stroke="#1f77b4" stroke-width="1" '
                             'vector-effect="non-scaling-stroke"/>')
        if known[-1]:
            parts.append(f'<ellipse cx="{xs[-1]}" cy="{ys[-1]}" rx="{int(_SX * 3 / WIDTH)}" ry="{int(_SY * 3 / HEIGHT)}" '
                         f'fill="{"#d62728" if bad else "#1f77b4"}"/>')
    for i in np.flatnonzero(np.asarray(failed, dtype=bool)).tolist():
        x = int(round((i + 0.5) / n * _SX))
        parts.append(f'<line x1="{x}" y1="{_SY - 30}" x2="{x}" y2="{_SY}" stroke="#d62728" stroke-width="2" '
                     'vector-effect="non-scaling-stroke"/>')
    parts.append("</svg>")
    return Markup("".join(parts))
