"""`zcorch completion bash|zsh|fish|tcsh`: the shell code that completes zcorch's commands and options
(argcomplete). Load it with `eval "$(zcorch completion bash)"` in ~/.bashrc (zsh: the same with zsh)."""
from __future__ import annotations

import argparse

SHELLS = ("bash", "zsh", "fish", "tcsh")


def register(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    p = subparsers.add_parser("completion", help="print shell code for tab completion (eval it in your shell rc)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("shell", choices=SHELLS)
    p.set_defaults(func=main)
    return p


def autocomplete(parser: argparse.ArgumentParser) -> None:
    """Answer the shell's completion request and exit, when there is one (argcomplete sets _ARGCOMPLETE)."""
    import os

    if "_ARGCOMPLETE" not in os.environ:
        return
    import argcomplete

    argcomplete.autocomplete(parser)


def main(args: argparse.Namespace) -> int:
    import argcomplete

    print(argcomplete.shellcode(["zcorch"], shell=args.shell), end="")
    return 0
