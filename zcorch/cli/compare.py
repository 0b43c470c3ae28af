"""`zcorch compare BASE CANDIDATE`: did a sweep get slower? (for nightly runs and CI)

Per cell (matched by cell id) the medians, the change in % and a significance test; the verdicts are
explained in zcorch.analysis.compare. Exit status 1 when any cell regressed or failed, else 0.
"""
from __future__ import annotations

import argparse

from zcorch.cli.options import add_regression_options, check_regression_options
from zcorch.analysis.compare import compare_frames, regressed, render
from zcorch.analysis.load import load


def register(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    p = subparsers.add_parser("compare", help="compare two result sets cell by cell; exit 1 on a regression",
                              description=__doc__.splitlines()[0])
    p.add_argument("base", help="base result set")
    p.add_argument("candidate", help="candidate result set")
    p.add_argument("--format", choices=["text", "markdown", "json"], default="text")
    add_regression_options(p, "compare")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    check_regression_options(args)
    table = compare_frames(load(args.base), load(args.candidate), args.metric, args.threshold, args.alpha)
    print(render(table, args.format, str(args.base), str(args.candidate)), end="")
    return 1 if regressed(table) else 0
