"""The history page's trend plots: what one shows (TrendSpec) and how it is drawn (draw_trend), and image_bytes,
which saves every figure of the analysis. Only numpy and matplotlib (lazily) are imported here."""
from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Tuple

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 100


@dataclass
class TrendSpec:
    """Everything one trend plot shows (zcorch.analysis.history.trend_spec makes it of a cell's history)."""
    median: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    levels: List[Tuple[int, int, float]]   # fitted (start, end, level) drawn; [] when too few points for a fit
    steps: List[Tuple[int, Optional[float]]]   # (first index of the new level, change % or None: level before 0)
    dead: np.ndarray                       # sweeps where every run of the cell failed
    regression_at_newest: bool
    ticks: List[int]
    tick_labels: List[str]
    ylabel: str
    title: str


def draw_trend(spec: TrendSpec) -> "Figure":
    """The medians with their CIs, fitted levels, steps with their change, failed sweeps, a regressed newest."""
    from matplotlib.figure import Figure
    from matplotlib.transforms import blended_transform_factory

    med = spec.median
    n = len(med)
    x = np.arange(n)
    fig = Figure(figsize=(5.8, 3.6))
    ax = fig.add_subplot()
    have = np.isfinite(med)
    low = np.where(np.isfinite(spec.ci_low), med - spec.ci_low, 0.0)
    high = np.where(np.isfinite(spec.ci_high), spec.ci_high - med, 0.0)
    ax.errorbar(x[have], med[have], yerr=[low[have], high[have]], fmt="o", ms=4, capsize=3, color="C0",
                label="median, CI (order statistics; level per sweep in the table)")
    for k, (start, end, level) in enumerate(spec.levels):
        ax.hlines(level, start - 0.4, end - 0.6, colors="0.45", linewidth=1.5, label="fitted level" if k == 0 else None)
    top = blended_transform_factory(ax.transData, ax.transAxes)
    for k, (start, change) in enumerate(spec.steps):
        ax.axvline(start - 0.5, color="C3", linestyle="--", linewidth=1.2, label="change point" if k == 0 else None)
        if change is not None:
            ax.text(start - 0.45, 0.97, f"{change:+.1f}%", transform=top, color="C3", fontsize=8, va="top", ha="left")
    if spec.dead.any():
        ax.plot(x[spec.dead], np.full(int(spec.dead.sum()), 0.03), "x", color="C3", ms=8, transform=top,
                label="all runs failed")
    if spec.regression_at_newest:
        ax.plot([n - 1], [med[n - 1]], "o", ms=9, mfc="none", mec="C3", mew=2, label="regression")
    ax.set_xlim(-0.6, n - 0.4)
    ax.set_xticks(spec.ticks, spec.tick_labels, fontsize=7)
    ax.set_ylabel(spec.ylabel)
    ax.margins(y=0.15)
    ax.grid(True, alpha=0.3)
    ax.set_title(spec.title, fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=5, frameon=False,
              handlelength=1.5, columnspacing=1.0)
    fig.tight_layout()
    return fig


def png(spec: TrendSpec) -> bytes:
    """The trend plot as PNG bytes."""
    return image_bytes(draw_trend(spec), "png", DPI)


def image_bytes(fig: "Figure", fmt: str = "png", dpi: int = DPI) -> bytes:
    """The figure as PNG or SVG bytes, its final layout kept (tight_layout's placeholder engine would draw twice)."""
    import matplotlib
    from matplotlib.layout_engine import PlaceHolderLayoutEngine

    if isinstance(fig.get_layout_engine(), PlaceHolderLayoutEngine):
        # None, not an rc file's autolayout or constrained layout, which would lay the figure out again
        with matplotlib.rc_context({"figure.autolayout": False, "figure.constrained_layout.use": False}):
            fig.set_layout_engine(None)
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=dpi)
    return buf.getvalue()
