"""`zcorch export ROOT DEST`: every result set under ROOT as one hive-partitioned Parquet dataset in DEST.

Incremental, atomic and safe from several exports at once; DuckDB, pandas and others read it without zcorch,
and `zcorch history DEST` / `zcorch compare --dataset DEST` read it too. The layout: zcorch.analysis.export
and docs/dataset.md.
"""
from __future__ import annotations

import argparse
import sys

from zcorch.cli import add_command


def register(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    p = add_command(subparsers, "export", __doc__, epilog="exit status: 0 ok; 2 input error; 75 another export held DEST too long")
    p.add_argument("root", help="directory searched for result sets at any depth")
    p.add_argument("dest", help="the dataset directory (made when missing; a symbolic link is refused)")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    from zcorch.analysis.export import export_results  # pyarrow, pandas: only when exporting

    def warn(message: str) -> None:
        print(f"zcorch export: warning: {message}", file=sys.stderr)

    result = export_results(args.root, args.dest, warn)
    for why in result.skipped:
        warn(f"skipped: {why}")
    for note in result.notes:
        print(f"zcorch export: {note}")
    print(f"zcorch export: {result.line()}")
    return 0
