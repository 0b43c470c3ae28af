"""The history page at a fleet's scale (zcorch.analysis.history.trend_cells, zcorch.analysis.sparkline): a
sparkline in every cell's row, trend plots only for the cells whose verdict changed, regressions first."""
import math

import numpy as np

from zcorch.analysis.detector import Comparison
from zcorch.analysis.history import TREND_PLOTS_MAX, CellHistory, ExperimentHistory, History, trend_cells
from zcorch.analysis.sparkline import sparkline
from zcorch.analysis.steps import fit_steps


def cell(name, verdict, change):
    y = np.full(6, 10.0)
    ch = CellHistory(name, name, y, y - 0.1, y + 0.1, np.full(6, 0.95), np.full(6, 5), np.zeros(6, dtype=int),
                     fit_steps(y, np.full(6, 0.05)))
    if verdict is not None:
        ch.comparison = Comparison(verdict, change, 10.0, 10.0 * (1 + change / 100), 0.001, "", 5, 1, [0, 1, 2], 5)
    return ch


def history(cells_per_exp):
    exps = [ExperimentHistory(f"exp @ pair{i}", [], cells, "gbit_s") for i, cells in enumerate(cells_per_exp)]
    return History(".", "gbit_s", 3.0, 0.005, exps)


def test_a_small_page_plots_every_cell():
    h = history([[cell("a", "unchanged", 0.1), cell("b", None, math.nan)]])
    assert [ch.cell for _, ch in trend_cells(h)] == ["a", "b"]


def test_a_fleet_page_plots_the_changed_cells_bad_first_and_at_most_the_cap():
    quiet = [cell(f"q{i}", "unchanged", 0.5) for i in range(TREND_PLOTS_MAX * 3)]
    changed = [cell("imp", "improved", 20.0), cell("ns", "cannot tell", -4.0), cell("r1", "regressed", -5.0),
               cell("r2", "regressed", -30.0), cell("f", "failed", math.nan)]
    picked = [ch.cell for _, ch in trend_cells(history([quiet[:20] + changed[:3], quiet[20:] + changed[3:]]))]
    assert picked[:3] == ["f", "r2", "r1"] and set(picked) == {"f", "r2", "r1", "imp", "ns"}
    many = [cell(f"r{i}", "regressed", -5.0 - i) for i in range(TREND_PLOTS_MAX + 5)]
    picked = [ch.cell for _, ch in trend_cells(history([quiet, many]))]
    assert picked == [f"r{i}" for i in range(TREND_PLOTS_MAX + 4, 4, -1)]   # the largest changes


def test_the_sparkline_draws_the_series_and_escapes_its_title():
    y = np.array([10.0, 10.1, np.nan, 9.9, 10.0, 8.0, 8.1])
    svg = str(sparkline(y, [(0, 5, 10.0), (5, 7, 8.05)], [5], [False, False, True, False, False, False, False], True,
                        'cell <b>"x"</b>'))
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert svg.count("<polyline") == 2            # broken where a night has no ok run
    assert svg.count('stroke="#999"') == 2        # the fitted levels
    assert svg.count('fill="#d62728"') == 1       # the newest night, bad
    assert "<b>" not in svg and "&lt;b&gt;" in svg
    empty = str(sparkline([np.nan, np.nan], [], [], [True, True], False, "none"))
    assert "<polyline" not in empty and empty.count('stroke-width="2"') == 2
