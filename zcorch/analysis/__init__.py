"""Analysis of result sets: tidy frames (frames), statistics (stats), plots, the HTML report, compare.

    import zcorch
    df = zcorch.load("results/quickstart")          # one row per run
    zcorch.summarize(df, by=["send_mode", "recv_mode"])
    samples = zcorch.load_samples("results/quickstart")   # one row per per-interval sample

The package itself imports nothing heavy: `zcorch.analysis.gate` (which `compare`'s and `history`'s
argument parsers need for their exit-code text) must not pull pandas and scipy into `zcorch --help`.
The entry points below resolve on first use (PEP 562).
"""
from __future__ import annotations

from zcorch import lazy_attribute

_LAZY = {
    "load": "zcorch.analysis.load",
    "load_baselines": "zcorch.analysis.frames",
    "load_meta": "zcorch.analysis.frames",
    "load_samples": "zcorch.analysis.samples",
    "summarize": "zcorch.analysis.stats",
}

__all__ = list(_LAZY)


def __getattr__(name: str):
    return lazy_attribute(__name__, _LAZY, name)
