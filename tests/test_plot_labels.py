"""The report's charts never draw one tick label over another (a user reads the cells off them): every chart of
the shipped reproduction sets (the longest labels zcorch draws: study cells with 3-4 varying parameters),
rendered by matplotlib, its labels' own rectangles (rotated with the text) tested pairwise."""
import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

import zcorch
from zcorch.analysis import plots

from fixtures_analysis import copy_result_set

SETS = sorted(p for p in (Path(__file__).parent / "data" / "reproductions").iterdir() if p.is_dir())


def _rectangle(text, renderer) -> np.ndarray:
    """The corners of a label's own box in pixels: turned with the text, centred where matplotlib put it."""
    box = text.get_window_extent(renderer)
    angle = text.get_rotation()
    text.set_rotation(0)
    flat = text.get_window_extent(renderer)
    text.set_rotation(angle)
    w, h, t = flat.width, flat.height, math.radians(angle)
    cx, cy = (box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2
    return np.array([[cx + x * math.cos(t) - y * math.sin(t), cy + x * math.sin(t) + y * math.cos(t)]
                     for x, y in ((-w / 2, -h / 2), (w / 2, -h / 2), (w / 2, h / 2), (-w / 2, h / 2))])


def _intersect(a: np.ndarray, b: np.ndarray, margin: float = 1.0) -> bool:
    """Two convex quadrilaterals overlap by more than `margin` px (separating axis theorem)."""
    for poly in (a, b):
        for i in range(4):
            edge = poly[(i + 1) % 4] - poly[i]
            normal = np.array([-edge[1], edge[0]]) / np.hypot(*edge)
            pa, pb = a @ normal, b @ normal
            if pa.max() <= pb.min() + margin or pb.max() <= pa.min() + margin:
                return False
    return True


def overlapping_labels(fig: Figure) -> list:
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    found = []
    for ax in fig.axes:
        for labels in (ax.get_xticklabels(), ax.get_yticklabels()):
            boxes = [(t.get_text(), _rectangle(t, renderer)) for t in labels if t.get_visible() and t.get_text()]
            found += [(ax.get_title(), a, b) for (a, ra), (b, rb) in itertools.combinations(boxes, 2)
                      if _intersect(ra, rb)]
    return found


def test_the_check_sees_labels_drawn_over_each_other():
    fig = Figure(figsize=(3, 2))
    ax = fig.subplots()
    ax.set_xticks(range(4))
    ax.set_xticklabels([f"send_mode=vmsplice, subblocks={n}" for n in range(4)])
    assert len(overlapping_labels(fig)) >= 3
    ax.set_xticklabels([f"send_mode=vmsplice, subblocks={n}" for n in range(4)], rotation=35, ha="right",
                       rotation_mode="anchor")
    fig.set_size_inches(12, 4)
    assert overlapping_labels(fig) == []   # slanted and spaced: apart, though their upright boxes meet


@pytest.mark.slow
@pytest.mark.parametrize("src", SETS, ids=[p.name for p in SETS])
def test_no_chart_of_a_study_draws_a_label_over_another(src, tmp_path):
    df = zcorch.load(copy_result_set(src, tmp_path / "set"))
    drawn = [p for p in plots.all_plots(df, experiment=src.name) if p.figure is not None]
    assert drawn
    for plot in drawn:
        assert overlapping_labels(plot.figure) == [], plot.name
