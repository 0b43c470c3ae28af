"""`zcorch compare BASE CANDIDATE`: did a sweep get slower (for nightly runs and CI)? `zcorch compare FLEET`: which
pair of a fleet run differs, in which cells, by how much.

Per cell the medians, the change in % and a significance test (zcorch.analysis.compare), beside what changed on
the hosts (zcorch.analysis.hostdiff); a fleet's pairs each against the others pooled or `--against PAIR`
(zcorch.analysis.pairs). The exit status and the last line are the gate's (zcorch.analysis.gate).
"""
from __future__ import annotations

import argparse

from zcorch.cli.options import add_regression_options, check_regression_options
from zcorch.analysis.gate import DEFAULT_ALPHA, DEFAULT_THRESHOLD_PCT, describe_codes
from zcorch.cli import add_command


def register(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    p = add_command(subparsers, "compare", __doc__, epilog=f"exit status: {describe_codes()}")
    p.add_argument("base", help="base result set (with --dataset: its set id, or the path it had when exported)")
    p.add_argument("candidate", nargs="?", help="candidate result set (none when BASE is a fleet run's directory: "
                                                "its pairs are compared)")
    p.add_argument("--against", metavar="PAIR", help="a fleet: compare each pair with PAIR instead of with the "
                                                     "other pairs pooled")
    p.add_argument("--dataset", metavar="DIR", help="read BASE and CANDIDATE from a dataset `zcorch export` wrote "
                                                    "(through DuckDB; the same answers as from the sets)")
    p.add_argument("--format", choices=["text", "markdown", "json"], default="text")
    add_regression_options(p, "compare", DEFAULT_THRESHOLD_PCT, DEFAULT_ALPHA)
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    # pandas and scipy load here, not with the parser: `zcorch --help` must start at once.
    from zcorch.analysis import pairs
    from zcorch.analysis.compare import render
    from zcorch.errors import ConfigError

    check_regression_options(args)
    if args.dataset is not None and (args.candidate is None or args.against is not None):
        raise ConfigError("--dataset compares two exported sets: give BASE and CANDIDATE (no --against)")
    if args.candidate is None or args.against is not None:   # a fleet's pairs
        if args.candidate is not None:
            raise ConfigError("--against compares the pairs of one fleet directory: give it alone (zcorch compare "
                              "FLEET --against PAIR)")
        comparison = pairs.compare_fleet(args.base, args.metric, args.threshold, args.alpha, args.against)
        if comparison is None:
            print(f"zcorch compare: cannot tell: {args.base}: fewer than two pairs have a result set to compare")
            return pairs.exit_code(None)
        text, gate = pairs.render(comparison, args.format), comparison.gate
    else:
        out = pairs.compare_sets(args.base, args.candidate, args.metric, args.threshold, args.alpha, args.dataset)
        text = render(out.table, args.format, str(args.base), str(args.candidate), out.gate, out.host_changes)
        gate = out.gate
    print(text, end="")
    if args.format != "json":
        print(gate.line("zcorch compare"))
    return gate.code
