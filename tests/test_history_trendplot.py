"""The history page's trend plots drawn by helper processes (zcorch.analysis.trendplot.TrendWorkers): the same
PNG bytes as drawn in-process, and a worker that fails loses no plot (write_index draws the rest itself)."""
import subprocess
import sys
import time

import pytest

from test_history import READ, nights
from zcorch.analysis.history import PLOTS_DIR, build_history, trend_cells, trend_spec, write_index
from zcorch.analysis.trendplot import TrendWorkers, png


@pytest.fixture
def history(tmp_path):
    root = tmp_path / "r"
    # two experiments of several cells: more plots than one worker's share, each with a step
    for name in ("a", "b"):
        nights(root / name, name, [[(READ, 2.0)]] * 4 + [[(READ, 1.0)]] * 2)
    return build_history(root, reports=False)


def plots_of(out):
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted((out / PLOTS_DIR).rglob("*.png"))}


def in_process(history, tmp_path):
    out = tmp_path / "in-process"
    write_index(history, out)
    return plots_of(out)


def test_workers_draw_the_plots_drawn_in_process(history, tmp_path):
    specs = [trend_spec(exp, ch) for exp, ch in trend_cells(history)]
    assert len(specs) >= 2
    with TrendWorkers() as workers:
        assert workers.procs, "no worker started"
        workers.draw(specs)
        assert workers.collect() == [png(s) for s in specs]
    out = tmp_path / "workers"
    with TrendWorkers() as workers:
        write_index(history, out, workers)
    assert plots_of(out) == in_process(history, tmp_path) != {}
    assert (out / "index.html").read_text().count(f'{PLOTS_DIR}/') >= len(specs)


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_worker_killed_loses_no_plot(history, tmp_path, when):
    # a real fault: the worker processes killed (SIGKILL) before they get their plots, or just after
    expected = in_process(history, tmp_path)
    out = tmp_path / "killed"
    with TrendWorkers() as workers:
        if when == "before":
            for proc in workers.procs:
                proc.kill()
                proc.wait()
            write_index(history, out, workers)
        else:
            draw = workers.draw

            def draw_then_kill(specs):
                draw(specs)
                workers.procs[0].kill()
            workers.draw = draw_then_kill
            write_index(history, out, workers)
    assert plots_of(out) == expected


def test_a_worker_answering_garbage_loses_no_plot(history, tmp_path):
    # a real process in the worker's place that reads its share and answers what no worker writes
    expected = in_process(history, tmp_path)
    out = tmp_path / "garbage"
    with TrendWorkers() as workers:
        workers.procs[0].kill()
        workers.procs[0].wait()
        workers.procs[0] = subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stdin.buffer.read(); sys.stdout.write('not a pickle')"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        write_index(history, out, workers)
    assert plots_of(out) == expected


def test_no_worker_at_all_draws_in_process(history, tmp_path):
    expected = in_process(history, tmp_path)
    out = tmp_path / "none"
    with TrendWorkers(count=0) as workers:
        write_index(history, out, workers)
    assert plots_of(out) == expected


def test_a_worker_not_ready_when_the_plots_are_asked_for_draws_none_and_is_ended(history, tmp_path):
    # a real process in the second worker's place that never says it is ready (a worker still importing on a
    # busy machine): the ready worker draws every plot, the other is ended instead of making the page wait
    expected = in_process(history, tmp_path)
    out = tmp_path / "not-ready"
    with TrendWorkers(count=2) as workers:
        workers.procs[1].kill()
        workers.procs[1].wait()
        slow = workers.procs[1] = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while not workers.ready[0] and time.monotonic() < deadline:   # until the real worker has warmed up
            workers._read_ready()
            time.sleep(0.05)
        assert workers.ready == [True, False]
        write_index(history, out, workers)
        assert slow.wait(timeout=10) != 0   # ended, not waited for
        assert workers.shares[1] == [] and len(workers.shares[0]) >= 2
    assert plots_of(out) == expected
