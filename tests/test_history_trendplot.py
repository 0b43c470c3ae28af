"""The history page's trend plots (zcorch.analysis.trendplot), drawn in the page's own process: every cell
trend_cells picks gets its PNG under PLOTS_DIR, the bytes draw_trend makes of its TrendSpec, linked from the page."""
from __future__ import annotations

import pytest

from test_history import READ, nights
from zcorch.analysis.history import PLOTS_DIR, build_history, trend_cells, trend_spec, write_index
from zcorch.analysis.trendplot import png


@pytest.fixture
def history(tmp_path):
    root = tmp_path / "r"
    for name in ("a", "b"):   # two experiments of several cells, each with a step
        nights(root / name, name, [[(READ, 2.0)]] * 4 + [[(READ, 1.0)]] * 2)
    return build_history(root, reports=False)


@pytest.mark.slow
def test_every_trend_plot_is_written_as_drawn_and_linked_from_the_page(history, tmp_path):
    plotted = trend_cells(history)
    assert len(plotted) >= 2
    out = tmp_path / "site"
    index = write_index(history, out)
    files = {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted((out / PLOTS_DIR).rglob("*.png"))}
    expected = sorted(png(trend_spec(exp, ch)) for exp, ch in plotted)
    assert sorted(files.values()) == expected and all(b.startswith(b"\x89PNG") for b in expected)
    page = index.read_text()
    assert all(rel in page for rel in files)


def test_a_figure_is_drawn_once_a_format_and_saved_as_savefig_saves_it(history):
    """image_bytes (the report's plots and the trend plots) drops savefig's second draw of a figure that
    tight_layout laid out: the same bytes as a plain savefig, one draw instead of two."""
    import io

    from zcorch.analysis.trendplot import draw_trend, image_bytes

    spec = trend_spec(*trend_cells(history)[0])
    plain, fig = draw_trend(spec), draw_trend(spec)
    draws = {id(plain): 0, id(fig): 0}
    for f in (plain, fig):
        f.canvas.mpl_connect("draw_event", lambda event: draws.__setitem__(id(event.canvas.figure),
                                                                          draws[id(event.canvas.figure)] + 1))
    buf = io.BytesIO()
    plain.savefig(buf, format="png", dpi=100)
    assert image_bytes(fig, "png", 100) == buf.getvalue()
    assert draws == {id(plain): 2, id(fig): 1}
