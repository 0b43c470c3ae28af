"""The `zcorch` command: one subcommand per stage, each registered from its own module.

The modules are zcorch/cli/<command>.py: argparse and what the command prints, the work being one
call into the library.

User mistakes (ZcorchError) are printed as one clear message without a traceback; anything
else is a bug and propagates.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# (subcommand, module that defines register(subparsers) -> parser with func=main(args) -> int)
COMMANDS = [
    ("worker", "zcorch.cli.worker"),
    ("plan", "zcorch.cli.plan"),
    ("run", "zcorch.cli.run"),
    ("lab", "zcorch.cli.lab"),
    ("report", "zcorch.cli.report"),
    ("compare", "zcorch.cli.compare"),
    ("history", "zcorch.cli.history"),
]


def build_parser() -> argparse.ArgumentParser:
    from zcorch import __version__

    parser = argparse.ArgumentParser(prog="zcorch", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"zcorch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, module in COMMANDS:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:  # a real missing dependency inside the module: a bug
                raise
            continue  # stage not built yet
        mod.register(sub)
    return parser


def main(argv: "list[str] | None" = None) -> int:
    from zcorch.errors import ZcorchError

    argv = sys.argv[1:] if argv is None else argv
    # The worker runs on bare hosts and on the hot path: skip importing every other stage.
    if argv[:1] == ["worker"]:
        from zcorch.worker import cli as worker

        return worker.main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ZcorchError as exc:
        print(f"zcorch {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        print(f"zcorch {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
