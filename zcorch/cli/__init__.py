"""zcorch: repeatable experiments on how Linux moves bulk data between two hosts, and what each way costs in CPU.

The modules are zcorch/cli/<command>.py: argparse and what the command prints, the work being one
call into the library. User mistakes (ZcorchError) are printed as one clear message without a traceback;
anything else is a bug and propagates.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# (subcommand, module that defines register(subparsers) -> parser with func=main(args) -> int), in the order
# a user meets them: plan and run an experiment, read and compare its results, the lab, then the internals.
COMMANDS = [
    ("plan", "zcorch.cli.plan"),
    ("run", "zcorch.cli.run"),
    ("report", "zcorch.cli.report"),
    ("compare", "zcorch.cli.compare"),
    ("history", "zcorch.cli.history"),
    ("export", "zcorch.cli.export"),
    ("examples", "zcorch.cli.examples"),
    ("lab", "zcorch.cli.lab"),
    ("completion", "zcorch.cli.completion"),
    ("worker", "zcorch.cli.worker"),
]

EPILOG = """start here:
  zcorch examples copy quickstart .     an experiment file to edit (send modes x receive modes on localhost)
  zcorch plan quickstart.yaml           check it and see its cells, runs and how long it takes
  zcorch run quickstart.yaml            run it: a result set in results/, a summary table on the terminal
  zcorch report results/quickstart-*    report.html: which path is fastest and what it costs in CPU

exit status: 0 ok; 1 a run failed or a regression; 2 a usage or input error; 3 a gate's data incomplete
(compare, history --check); 75 the result set is being written by another zcorch run; 130 interrupted."""


def build_parser() -> argparse.ArgumentParser:
    from zcorch import __version__

    parser = argparse.ArgumentParser(prog="zcorch", description=__doc__.splitlines()[0], epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-V", "--version", action="version", version=f"zcorch {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="say more (-vv: everything); before the command")
    parser.add_argument("-q", "--quiet", action="count", default=0,
                        help="say less: no progress (-qq: errors only); before the command")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
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
    from zcorch.cli.console import guard_streams, setup_logging

    guard_streams()
    parser = build_parser()
    from zcorch.cli.completion import autocomplete

    autocomplete(parser)  # only when the shell asks (argcomplete's environment): completes and exits
    args = parser.parse_args(argv)
    setup_logging(args.verbose, args.quiet)
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
