"""`zcorch reproductions DIR...`: one Markdown document of the reproduced studies (docs/reproductions.md).

For each result set of an experiment with a `reference:`: the study's figures next to ours with the
configuration that produced each, and its claims' verdicts with the conditions this machine met or not
(zcorch.analysis.published; scripts/reproductions runs the five shipped studies and calls this).
"""
from __future__ import annotations

import argparse

from zcorch.cli import add_command


def register(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    p = add_command(subparsers, "reproductions", __doc__)
    p.add_argument("dirs", nargs="+", metavar="DIR", help="result sets of experiments with a `reference:`, in order")
    p.add_argument("-o", "--output", help="write the document here (default: stdout)")
    p.add_argument("--notes", metavar="FILE", help="Markdown put after the summary (why verdicts differ)")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    from zcorch.analysis import published  # pandas: only when the command runs

    if args.output:
        print(published.write_reproductions(args.dirs, args.output, args.notes))
    else:
        notes = published.read_notes(args.notes) if args.notes else ""
        print(published.reproductions_markdown(args.dirs, notes), end="")
    return 0
