"""`zcorch history ROOT`: every result set under ROOT over time, one page (ROOT/index.html) for nightly sweeps.

The analysis is zcorch.analysis.history (docs/nightly.md); with --check the exit status is the gate's
(zcorch.analysis.gate, as `zcorch compare`). Reports of the sweeps are written only with --reports.
"""
from __future__ import annotations

import argparse
import json
import sys

from zcorch.cli.options import add_regression_options, check_regression_options
from zcorch.errors import ConfigError
from zcorch.analysis.gate import HISTORY_ALPHA, HISTORY_MIN_NIGHTS, HISTORY_THRESHOLD_PCT, describe_codes
from zcorch.cli import add_command


def register(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    p = add_command(subparsers, "history", __doc__,
                    epilog=f"exit status with --check: {describe_codes()}; without it 0 or 2")
    p.add_argument("root", help="directory searched for result sets at any depth, or a dataset `zcorch export` "
                                "wrote (read through DuckDB: the same answers, without loading every set)")
    p.add_argument("-o", "--output", metavar="OUT", help="write OUT/index.html (default ROOT/index.html)")
    p.add_argument("--check", action="store_true",
                   help="exit 1 when the newest sweep of an experiment is a significant regression, 0 when no "
                        "cell regressed and each could have seen a change of the threshold, 3 when it cannot "
                        "tell (a cell that could not, or an incomplete sweep)")
    p.add_argument("--format", choices=["text", "json"], default="text",
                   help="json: one object (experiments, cells, comparisons; with --check the verdict, exit code "
                        "and reason first)")
    p.add_argument("--reports", action="store_true",
                   help="also write each sweep's report.html where it is missing or older than its runs (slow: "
                        "a report a night); without, the page links the reports that are there")
    add_regression_options(p, "follow", HISTORY_THRESHOLD_PCT, HISTORY_ALPHA)
    p.add_argument("--min-nights", type=int, default=HISTORY_MIN_NIGHTS, metavar="N",
                   help="earlier nights at the stable level needed to judge the newest against their spread "
                        f"(default {HISTORY_MIN_NIGHTS}; with fewer its runs are judged against theirs, as compare "
                        "does)")
    # nothing left to clean up once the page and the answer are written (zcorch.cli.run)
    p.set_defaults(func=main, quick_exit=True)
    return p


def main(args: argparse.Namespace) -> int:
    check_regression_options(args)
    if args.min_nights < 2:
        raise ConfigError(f"--min-nights must be >= 2 (a spread needs two nights), got {args.min_nights}")
    from zcorch.analysis.history import as_json, build_history, render_text, write_index  # pandas, numba
    from zcorch.analysis.dataset import dataset_history, is_dataset

    if is_dataset(args.root):
        history = dataset_history(args.root, args.metric, args.threshold, args.alpha, args.min_nights)
    else:
        history = build_history(args.root, args.metric, args.threshold, args.alpha, reports=args.reports,
                                min_nights=args.min_nights)
    for warning in history.warnings:
        print(f"zcorch history: warning: {warning}", file=sys.stderr)
    write_index(history, args.output)
    gate = history.gates()[0] if args.check else None
    if args.format == "json":
        print(json.dumps(as_json(history, gate.as_dict() if gate else None), indent=1))
    else:
        print(render_text(history), end="")
        if gate is not None:
            print(gate.line("zcorch history"))
    return gate.code if gate is not None else 0
