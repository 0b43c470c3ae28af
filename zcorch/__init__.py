"""zcorch: declarative experiments on how Linux moves bulk data between two hosts.
Stdlib-only at import time (deployed with the worker); the analysis API is imported on first use."""
from __future__ import annotations

from zcorch._version import __version__
from zcorch.errors import ZcorchError

# Public analysis entry points, resolved lazily (see __getattr__).
_LAZY = {
    "load": "zcorch.analysis.load",
    "load_baselines": "zcorch.analysis.frames",
    "load_meta": "zcorch.analysis.frames",
    "load_samples": "zcorch.analysis.samples",
    "summarize": "zcorch.analysis.stats",
    "mode_table": "zcorch.analysis.stats",
    "load_manifest": "zcorch.analysis.frames",
    "find_result_sets": "zcorch.analysis.history",
    "report_figures": "zcorch.analysis.plots",
}

__all__ = ["__version__", "ZcorchError", *_LAZY]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
