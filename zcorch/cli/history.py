"""`zcorch history ROOT`: every result set under ROOT over time, one page (ROOT/index.html) for nightly sweeps.

Per experiment the sweeps (date, git revision, kernel, hosts, status, report), per cell a trend plot of the
median with its CI and the detected change points, and the newest sweep against the preceding stable
segment; the analysis is zcorch.analysis.history. With --check the exit status is 1 when the newest sweep
of any experiment regressed (the cells, by how much and since which sweep are printed), else 0.
"""
from __future__ import annotations

import argparse
import sys

from zcorch.cli.options import add_regression_options, check_regression_options


def register(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    p = subparsers.add_parser("history", help="every result set under ROOT over time: ROOT/index.html; "
                                              "--check exits 1 on a regression of the newest sweep",
                              description=__doc__.splitlines()[0])
    p.add_argument("root", help="directory searched for result sets at any depth")
    p.add_argument("-o", "--output", metavar="OUT", help="write OUT/index.html (default ROOT/index.html)")
    p.add_argument("--check", action="store_true",
                   help="exit 1 when the newest sweep of an experiment is a significant regression")
    add_regression_options(p, "follow")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    from zcorch.analysis.history import build_history, render_text, write_index  # pandas, matplotlib

    check_regression_options(args)
    history = build_history(args.root, args.metric, args.threshold, args.alpha)
    for warning in history.warnings:
        print(f"zcorch history: warning: {warning}", file=sys.stderr)
    write_index(history, args.output)
    print(render_text(history), end="")
    return 1 if args.check and history.bad else 0
