"""Analysis of result sets: tidy frames (frames), statistics (stats), plots, the HTML report, compare.

    import zcorch
    df = zcorch.load("results/quickstart")          # one row per run
    zcorch.summarize(df, by=["send_mode", "recv_mode"])
    samples = zcorch.load_samples("results/quickstart")   # one row per per-interval sample
"""
from __future__ import annotations

from zcorch.analysis.frames import load_baselines, load_meta
from zcorch.analysis.load import load
from zcorch.analysis.samples import load_samples
from zcorch.analysis.stats import summarize

__all__ = ["load", "load_baselines", "load_meta", "load_samples", "summarize"]
