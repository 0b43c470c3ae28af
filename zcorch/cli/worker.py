"""`zcorch worker ...`: one side of a transfer (zcorch.worker.cli, which also runs as `python3 -m zcorch.worker`).

Only lists the command in `zcorch --help`: zcorch.cli.main hands `zcorch worker ...` to zcorch.worker.cli.main.
"""
from __future__ import annotations

import argparse
from zcorch.cli import add_command


def register(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    p = add_command(subparsers, "worker", __doc__, add_help=False)
    p.add_argument("argv", nargs=argparse.REMAINDER, help="recv|send|info [flags]; see `zcorch worker --help`")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    from zcorch.worker.cli import main as worker_main

    return worker_main(args.argv)
