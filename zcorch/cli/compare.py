"""`zcorch compare BASE CANDIDATE`: did a sweep get slower? (for nightly runs and CI)

Per cell (matched by cell id) the medians, the change in % and a significance test; the verdicts are
explained in zcorch.analysis.compare. Exit status 1 when any cell regressed or failed, else 0.
"""
from __future__ import annotations

import argparse

from zcorch.analysis.compare import HIGHER_IS_BETTER, compare_frames, regressed, render
from zcorch.analysis.load import load
from zcorch.errors import ConfigError


def register(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    p = subparsers.add_parser("compare", help="compare two result sets cell by cell; exit 1 on a regression",
                              description=__doc__.splitlines()[0])
    p.add_argument("base", help="base result set")
    p.add_argument("candidate", help="candidate result set")
    p.add_argument("--threshold", type=float, default=5.0, metavar="PCT",
                   help="ignore changes up to this many percent (default 5)")
    p.add_argument("--alpha", type=float, default=0.05, help="significance level (default 0.05)")
    p.add_argument("--metric", choices=sorted(HIGHER_IS_BETTER), default="gbit_s",
                   help="what to compare (default gbit_s; CPU metrics: lower is better)")
    p.add_argument("--format", choices=["text", "markdown", "json"], default="text")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    if args.threshold < 0:
        raise ConfigError(f"--threshold must be >= 0, got {args.threshold}")
    if not 0 < args.alpha < 1:
        raise ConfigError(f"--alpha must be between 0 and 1, got {args.alpha}")
    table = compare_frames(load(args.base), load(args.candidate), args.metric, args.threshold, args.alpha)
    print(render(table, args.format, str(args.base), str(args.candidate)), end="")
    return 1 if regressed(table) else 0
