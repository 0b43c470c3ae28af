"""The history page's trend plots: what one shows (TrendSpec, plain numbers and text), how it is drawn
(draw_trend, matplotlib), and helper processes that draw them on another CPU (TrendWorkers).

Why the helpers: a fleet's page spends most of its time single-threaded in the query and the change-point
fit; a helper (a fresh `python -c` of this module, never a fork of a process holding DuckDB's or numba's
threads) imports matplotlib meanwhile and then draws its share. A helper that fails costs only time: the
plots it did not return are drawn in-process. Only numpy and matplotlib are imported here.
"""
from __future__ import annotations

import io
import os
import pickle
import select
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 100
# One worker per CPU the page itself does not use (at most two), niced below the page's process. Only the
# workers ready when the plots are asked for draw them (the others are ended): one still importing would
# make the page wait for it.
WORKERS = max(1, min(2, (os.cpu_count() or 1) - 1))
WORKER_NICE = 10
READY = b"R"   # what a worker writes once warmed up, before its plots


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
    """The median with its CI across the sweeps, the fitted levels, the steps marked with the change
    between the levels, sweeps where every run of the cell failed marked ×, a regressed newest circled."""
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
    ax.set_xticks(spec.ticks)
    ax.set_xticklabels(spec.tick_labels, fontsize=7)
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
    buf = io.BytesIO()
    draw_trend(spec).savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def _warm_up() -> None:
    """Imports, fonts and the Agg canvas loaded once, before any plot is asked for."""
    png(TrendSpec(np.array([1.0, 2.0]), np.array([0.5, 1.5]), np.array([1.5, 2.5]), [(0, 2, 1.5)], [(1, 1.0)],
                  np.array([False, False]), True, [0, 1], ["#1", "#2\n01-01 00:00"], "y", "warm-up"))


def serve() -> None:
    """A worker's loop (run by TrendWorkers): warm up, read one pickled list of TrendSpec from stdin, write
    the pickled list of their PNG bytes to stdout."""
    try:
        os.nice(WORKER_NICE)
    except OSError:   # not allowed here: the worker runs at the page's priority
        pass
    _warm_up()
    sys.stdout.buffer.write(READY)
    sys.stdout.buffer.flush()
    specs = pickle.load(sys.stdin.buffer)
    pickle.dump([png(s) for s in specs], sys.stdout.buffer, protocol=pickle.HIGHEST_PROTOCOL)
    sys.stdout.buffer.flush()


class TrendWorkers:
    """Helper processes that draw trend plots (module docstring). start() before the slow part; draw() hands
    them their share and returns; collect() returns each plot's PNG bytes, or None for one a worker did not
    return (drawn in-process by the caller). close() ends any still running (a context manager's exit)."""

    def __init__(self, count: int = WORKERS):
        # the package of this file, first on the worker's path (-P: not the current directory)
        root = str(Path(__file__).resolve().parent.parent.parent)
        code = f"import sys; sys.path.insert(0, {root!r}); from zcorch.analysis.trendplot import serve; serve()"
        self.procs: List[subprocess.Popen] = []
        for _ in range(count):
            try:
                self.procs.append(subprocess.Popen([sys.executable, "-P", "-c", code], stdin=subprocess.PIPE,
                                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
            except OSError:
                break   # no worker: every plot is drawn in-process
        self.shares: List[List[int]] = []
        self.ready: List[bool] = [False] * len(self.procs)   # its READY read
        self.total = 0

    def _read_ready(self) -> None:
        """Which workers have said READY by now (without waiting)."""
        waiting = {proc.stdout.fileno(): k for k, proc in enumerate(self.procs) if not self.ready[k]}
        try:
            readable, _, _ = select.select(list(waiting), [], [], 0)
        except (OSError, ValueError):
            return
        for fd in readable:
            k = waiting[fd]
            try:
                self.ready[k] = os.read(fd, len(READY)) == READY
            except OSError:
                pass

    def draw(self, specs: Sequence[TrendSpec]) -> None:
        """Hand each worker ready now its share of `specs` (every k-th; every worker's when none is ready yet),
        without waiting for the plots; a worker not ready is ended."""
        self.total = len(specs)
        if not self.procs:
            return
        self._read_ready()
        drawing = [k for k in range(len(self.procs)) if self.ready[k]] or list(range(len(self.procs)))
        self.shares = [[] for _ in self.procs]
        for j, k in enumerate(drawing):
            self.shares[k] = list(range(j, len(specs), len(drawing)))
        for k, (proc, share) in enumerate(zip(self.procs, self.shares)):
            if k not in drawing:
                proc.kill()
                continue
            try:
                proc.stdin.write(pickle.dumps([specs[i] for i in share], protocol=pickle.HIGHEST_PROTOCOL))
                proc.stdin.close()
            except OSError:   # the worker is gone (BrokenPipeError): its share is drawn in-process
                pass

    def collect(self) -> List[Optional[bytes]]:
        """Each spec's PNG bytes as drawn by a worker, None where its worker failed."""
        out: List[Optional[bytes]] = [None] * self.total
        for k, (proc, share) in enumerate(zip(self.procs, self.shares)):
            if not share:
                continue
            try:
                data = proc.stdout.read()
                code = proc.wait()
                if not self.ready[k] and data.startswith(READY):
                    data = data[len(READY):]
                pngs = pickle.loads(data) if code == 0 else None
            except (OSError, pickle.UnpicklingError, EOFError, ValueError):
                pngs = None
            if isinstance(pngs, list) and len(pngs) == len(share) and all(isinstance(p, bytes) for p in pngs):
                for i, p in zip(share, pngs):
                    out[i] = p
        return out

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for f in (proc.stdin, proc.stdout):
                try:
                    if f and not f.closed:
                        f.close()
                except OSError:   # a share never written to a worker that died: nothing to flush to
                    pass

    def __enter__(self) -> "TrendWorkers":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
