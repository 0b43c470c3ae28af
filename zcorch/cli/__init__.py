"""zcorch: repeatable experiments on how Linux moves bulk data between two hosts, and what each way costs in CPU.

The modules are zcorch/cli/<command>.py: argparse and what the command prints, the work being one
call into the library. User mistakes (ZcorchError) are printed as one clear message without a traceback;
anything else is a bug and propagates.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

# (subcommand, module whose register(subparsers) sets func=main(args) -> int, one-line help) in the order a user
# meets them. The help lives here, once: `zcorch --help` lists every command without importing its module.
COMMANDS = [
    ("plan", "zcorch.cli.plan", "validate an experiment file and show its cells, runs and duration"),
    ("run", "zcorch.cli.run", "run an experiment (baselines + every cell) into a result set"),
    ("report", "zcorch.cli.report", "write DIR/report.html (findings first, then tables and plots)"),
    ("compare", "zcorch.cli.compare", "compare two result sets cell by cell; exit 1 on a regression, "
                                      "3 when it cannot tell"),
    ("history", "zcorch.cli.history", "every result set under ROOT over time: ROOT/index.html; "
                                      "--check gates the newest sweep (exit 1 regression, 3 cannot tell)"),
    ("export", "zcorch.cli.export", "every result set under ROOT as one Parquet dataset (DuckDB, Spark, polars "
                                    "read it; history and compare too)"),
    ("reproductions", "zcorch.cli.reproductions", "one Markdown table of several studies' reproductions "
                                                  "(docs/reproductions.md)"),
    ("examples", "zcorch.cli.examples", "list the shipped experiment files and notebook; copy one out"),
    ("lab", "zcorch.cli.lab", "two SSH hosts in network namespaces on this machine (root)"),
    ("completion", "zcorch.cli.completion", "print shell code for tab completion (eval it in your shell rc)"),
    ("worker", "zcorch.cli.worker", "internal: one side of a transfer, run on each host by zcorch run"),
]
HELP = {name: text for name, _module, text in COMMANDS}


def summary(doc: "str | None") -> str:
    """A command's description: the first paragraph of its module docstring, its lines joined."""
    return " ".join(line.strip() for line in (doc or "").strip().split("\n\n")[0].splitlines())

def add_command(subparsers: "argparse._SubParsersAction", name: str, doc: "str | None",
                **kwargs) -> argparse.ArgumentParser:
    """The parser of command `name`: its one-line help from HELP, its description from its module's `doc`."""
    return subparsers.add_parser(name, help=HELP[name], description=summary(doc), **kwargs)


EPILOG = """start here:
  zcorch examples copy quickstart .     an experiment file to edit (send modes x receive modes on localhost)
  zcorch plan quickstart.yaml           check it and see its cells, runs and how long it takes
  zcorch run quickstart.yaml            run it: a result set in results/, a summary table on the terminal
  zcorch report results/quickstart-*    report.html: which path is fastest and what it costs in CPU

exit status: 0 ok; 1 a run failed or a regression; 2 a usage or input error; 3 a gate cannot tell
(compare, history --check: too few runs or nights to see the threshold, or incomplete data); 75 the result set is being written by another zcorch run; 130 interrupted."""


def build_parser(command: "str | None" = None) -> argparse.ArgumentParser:
    """The parser, with the options of subcommand `command` only (the others listed by name and help, their
    modules not imported); None builds every subcommand in full (shell completion needs them all)."""
    from zcorch import __version__

    parser = argparse.ArgumentParser(prog="zcorch", description=summary(__doc__), epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-V", "--version", action="version", version=f"zcorch {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="say more (-vv: everything); before the command")
    parser.add_argument("-q", "--quiet", action="count", default=0,
                        help="say less: no progress (-qq: errors only); before the command")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    sub.required = True
    for name, module, text in COMMANDS:
        if command is not None and name != command:
            sub.add_parser(name, help=text, add_help=False)  # listed only; never parsed (not the command)
            continue
        importlib.import_module(module).register(sub)
    return parser


def command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub)command `args` were parsed for (`zcorch examples copy`'s...), else the top level's."""
    found = parser
    for dest in ("command", "action"):
        subs = [a for a in found._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, dest, None)
        if not subs or name not in subs[0].choices:
            break
        found = subs[0].choices[name]
    return found


def chosen_command(argv: "list[str]") -> str:
    """The subcommand argv names (its first word that is not a top-level option), or "" when none."""
    for word in argv:
        if word == "--":
            return ""
        if not word.startswith("-"):
            return word if word in HELP else ""
    return ""


def main(argv: "list[str] | None" = None) -> int:
    from zcorch.errors import ZcorchError

    argv = sys.argv[1:] if argv is None else argv
    # The worker runs on bare hosts and on the hot path: skip importing every other stage.
    if argv[:1] == ["worker"]:
        from zcorch.worker import cli as worker

        return worker.main(argv[1:])
    from zcorch.cli.console import guard_streams, setup_logging

    guard_streams()
    from zcorch.cli.completion import autocomplete, completing

    # Completion (argcomplete's environment) needs every subcommand's options; a command run needs its own.
    parser = build_parser(None if completing() else chosen_command(argv))
    autocomplete(parser)  # only when the shell asks: completes and exits
    args, extra = parser.parse_known_args(argv)
    if extra:   # said by the command's own parser: its usage, not the top level's
        command_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    global _quick_exit
    _quick_exit = bool(getattr(args, "quick_exit", False))
    setup_logging(args.verbose, args.quiet)
    try:
        return int(args.func(args) or 0)
    except ZcorchError as exc:
        print(f"zcorch {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        print(f"zcorch {args.command}: interrupted", file=sys.stderr)
        return 130


# Set by a command with nothing left to clean up (quick_exit=True): run() skips the interpreter's teardown.
_quick_exit = False


def run() -> None:
    """The program's entry point (the `zcorch` script, `python -m zcorch`): main(), then its exit status."""
    code = main()
    if _quick_exit:
        import logging

        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):   # a reader gone (a closed pipe): nothing more reaches it anyway
                pass
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
