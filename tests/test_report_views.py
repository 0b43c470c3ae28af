"""Small-multiple report views: the default view from the varying parameters, declared `report: {views}`
(validated at file:line), CPU ids as integers, one chart instead of one per combination."""
from __future__ import annotations


import numpy as np
import pandas as pd
import pytest

import zcorch
from zcorch.analysis import plots
from zcorch.analysis.report import build_report, results_section
from zcorch.config.experiment import parse_experiment
from zcorch.config.views import View
from zcorch.errors import ConfigError


def pinning_frame() -> pd.DataFrame:
    """The pinning study's shape: sendfile/64KiB vs write/8KiB × three (send_cpu, recv_cpu) cases."""
    rows = []
    for mode, buf, speed in (("sendfile", 65536, 15.0), ("write", 8192, 10.0)):
        for sc, rc in ((np.nan, np.nan), (0.0, 1.0), (0.0, 0.0)):
            for r in range(3):
                gbit = speed + r - (3 if sc == rc == 0 else 0)
                rows.append(dict(cell=f"{mode}-{sc}-{rc}", repeat=r, status="ok", send_mode=mode, recv_mode="read",
                                 buffer=float(buf), send_cpu=sc, recv_cpu=rc, gbit_s=gbit, mb_s=gbit * 125))
    return pd.DataFrame(rows)


def test_the_pinning_study_is_one_chart_with_its_cases_along_x():
    df = pinning_frame()
    view, folded = plots.default_view(df)
    assert (view.x, view.hue, view.facet, folded) == (("send_cpu", "recv_cpu"), ("send_mode",), (), ["buffer"])
    (plot,) = plots.views(df)
    assert plot.figure is not None and len([a for a in plot.figure.axes if a.get_visible()]) == 1
    ticks = [t.get_text() for t in plot.figure.axes[0].get_xticklabels()]
    assert ticks == ["send_cpu=none, recv_cpu=none", "send_cpu=0, recv_cpu=0", "send_cpu=0, recv_cpu=1"]
    legend = [t.get_text() for t in plot.figure.legends[0].get_texts()]
    assert legend == ["sendfile (buffer=64KiB)", "write (buffer=8KiB)"]
    # the tables follow: one table, the modes as rows, the pinning cases as columns, CPU ids as integers
    res = results_section(df)
    ((label, table),) = res["tables"]
    assert label == "" and table.header[1:] == ticks
    assert [r[0] for r in table.rows] == ["sendfile (buffer=64KiB)", "write (buffer=8KiB)"]
    assert not any(".0" in str(c) for c in table.header)


def test_varying_parameters_become_panels_when_not_linked():
    rows = []
    for mode in ("write", "vmsplice"):
        for sb in (1, 64, 256):
            for gift in (False, True):
                if mode == "write" and gift:
                    continue
                rows += [dict(cell=f"{mode}{sb}{gift}", status="ok", send_mode=mode, recv_mode="read", subblocks=sb,
                              gift=gift, gbit_s=5.0 + r) for r in range(2)]
    df = pd.DataFrame(rows)
    view, _ = plots.default_view(df)
    assert (view.x, view.hue, view.facet) == (("subblocks",), ("send_mode",), ("gift",))
    (plot,) = plots.views(df)
    titles = [a.get_title() for a in plot.figure.axes if a.get_visible()]
    assert titles == ["gift=false", "gift=true"]


def test_a_declared_view_is_drawn_as_declared(small_set):
    df = zcorch.load(small_set)
    declared = (View(("buffer",), ("recv_mode",), ("send_mode",), "send_cpu_s_per_gib", "sender CPU"),)
    (plot,) = plots.views(df, declared, None, "quickstart-small")
    visible = [a for a in plot.figure.axes if a.get_visible()]
    assert [a.get_title() for a in visible] == ["send_mode=sendfile", "send_mode=splice", "send_mode=write"]
    assert visible[0].get_xlabel() == "buffer" and "s/GiB" in visible[0].get_ylabel()
    assert "sender CPU" in plot.title


@pytest.mark.slow
def test_the_report_draws_the_experiments_views(small_set):
    exp = small_set / "experiment.yaml"
    exp.write_text(exp.read_text() + "report:\n  views:\n    - {x: buffer, hue: send_mode, facet: recv_mode, "
                                     "metric: mb_s, title: by buffer}\n")
    page = build_report(small_set)
    assert "quickstart-small: by buffer" in page
    assert page.count('<img src="data:image/png') >= 4


YAML = """\
name: t
params: {source: /dev/zero}
matrix: {send_mode: [write, splice]}
report:
  views:
"""


@pytest.mark.parametrize("view, line, needle", [
    ("    - {x: send_mod}\n", 6, "report.views[0].x: `send_mod` is not a parameter; did you mean `send_mode`"),
    ("    - {hue: send_mode}\n", 6, "report.views[0]: missing `x:`"),
    ("    - {x: buffer, metric: gbits}\n", 6, "report.views[0].metric: `gbits` is not a metric"),
    ("    - {x: buffer, hue: buffer}\n", 6, "`buffer` is used twice"),
    ("    - {x: buffer, colour: send_mode}\n", 6, "report.views[0].colour: unknown key"),
    ("    - {x: buffer, facet: [gift, sendcpu]}\n", 6, "report.views[0].facet[1]: `sendcpu` is not a parameter"),
])
def test_view_mistakes_are_reported_at_file_line(view, line, needle):
    with pytest.raises(ConfigError) as info:
        parse_experiment(YAML + view, "exp.yaml")
    assert needle in str(info.value) and f"exp.yaml:{line}:" in str(info.value), str(info.value)


def test_views_parse():
    exp = parse_experiment(YAML + "    - {x: [send_cpu, recv_cpu], hue: send_mode, facet: gift, metric: mb_s}\n",
                           "exp.yaml")
    assert exp.views == (View(("send_cpu", "recv_cpu"), ("send_mode",), ("gift",), "mb_s"),)
