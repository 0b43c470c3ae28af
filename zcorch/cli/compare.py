"""`zcorch compare BASE CANDIDATE`: did a sweep get slower? (for nightly runs and CI)

Per cell (matched by cell id) the medians, the change in % and a significance test; the verdicts are
explained in zcorch.analysis.compare. Exit status: 0 no regression, 1 regression, 2 usage or input
error (a missing result set, a bad option), 3 incomplete (no cell in common, a set that failed or has
fewer ok runs than its plan, a cell on one side only); the last line says which and why
(zcorch.analysis.gate).
"""
from __future__ import annotations

import argparse

from zcorch.cli.options import add_regression_options, check_regression_options
from zcorch.analysis.gate import completeness, describe_codes
from zcorch.cli import HELP


def register(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    p = subparsers.add_parser("compare", help=HELP["compare"],
                              description=__doc__.splitlines()[0], epilog=f"exit status: {describe_codes()}")
    p.add_argument("base", help="base result set (with --dataset: its set id, or the path it had when exported)")
    p.add_argument("candidate", help="candidate result set (likewise)")
    p.add_argument("--dataset", metavar="DIR", help="read both sets from a dataset `zcorch export` wrote "
                                                    "(through DuckDB; the same answers as from the sets)")
    p.add_argument("--format", choices=["text", "markdown", "json"], default="text")
    add_regression_options(p, "compare")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    # pandas and scipy load here, not with the parser: `zcorch --help` must start at once.
    from zcorch.analysis.compare import compare_frames, gate_of, render
    from zcorch.analysis.load import load

    check_regression_options(args)
    if args.dataset is not None:
        from zcorch.analysis.dataset import Dataset  # duckdb: only when reading a dataset

        data = Dataset(args.dataset)
        b, c = data.find(args.base), data.find(args.candidate)
        base, cand = b.completeness(), c.completeness()
        base_runs, cand_runs = data.runs(b.set_id), data.runs(c.set_id)
    else:
        base, cand = completeness(args.base), completeness(args.candidate)
        base_runs, cand_runs = load(args.base), load(args.candidate)
    table = compare_frames(base_runs, cand_runs, args.metric, args.threshold, args.alpha)
    gate = gate_of(table, base, cand)
    print(render(table, args.format, str(args.base), str(args.candidate), gate), end="")
    if args.format != "json":
        print(gate.line("zcorch compare"))
    return gate.code
