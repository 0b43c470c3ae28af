"""`zcorch history ROOT`: every result set under ROOT over time, one page (ROOT/index.html) for nightly sweeps.

Per experiment the sweeps (date, git revision, kernel, hosts, status, report), per cell a trend plot of the
median with its CI and the detected change points, and the newest sweep against the preceding stable
segment; the analysis is zcorch.analysis.history. With --check the exit status is 1 when the newest sweep
of any experiment regressed (the cells, by how much and since which sweep are printed), else 0.
"""
from __future__ import annotations

import argparse
import sys

from zcorch.analysis.compare import HIGHER_IS_BETTER
from zcorch.errors import ConfigError


def register(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    p = subparsers.add_parser("history", help="every result set under ROOT over time: ROOT/index.html; "
                                              "--check exits 1 on a regression of the newest sweep",
                              description=__doc__.splitlines()[0])
    p.add_argument("root", help="directory searched for result sets at any depth")
    p.add_argument("-o", "--output", metavar="OUT", help="write OUT/index.html (default ROOT/index.html)")
    p.add_argument("--check", action="store_true",
                   help="exit 1 when the newest sweep of an experiment is a significant regression")
    p.add_argument("--metric", choices=sorted(HIGHER_IS_BETTER), default="gbit_s",
                   help="what to follow (default gbit_s; CPU metrics: lower is better)")
    p.add_argument("--threshold", type=float, default=5.0, metavar="PCT",
                   help="ignore changes up to this many percent (default 5, as zcorch compare)")
    p.add_argument("--alpha", type=float, default=0.05, help="significance level (default 0.05)")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    from zcorch.analysis.history import build_history, render_text, write_index  # pandas, matplotlib

    if args.threshold < 0:
        raise ConfigError(f"--threshold must be >= 0, got {args.threshold}")
    if not 0 < args.alpha < 1:
        raise ConfigError(f"--alpha must be between 0 and 1, got {args.alpha}")
    history = build_history(args.root, args.metric, args.threshold, args.alpha)
    for warning in history.warnings:
        print(f"zcorch history: warning: {warning}", file=sys.stderr)
    write_index(history, args.output)
    print(render_text(history), end="")
    return 1 if args.check and history.bad else 0
