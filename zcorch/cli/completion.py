"""`zcorch completion bash|zsh|fish|tcsh`: the shell code that completes zcorch's commands and options
(argcomplete). Load it with `eval "$(zcorch completion bash)"` in ~/.bashrc (zsh: the same with zsh)."""
from __future__ import annotations

import argparse
import os
from zcorch.cli import add_command

SHELLS = ("bash", "zsh", "fish", "tcsh")


def register(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    p = add_command(subparsers, "completion", __doc__)
    p.add_argument("shell", choices=SHELLS)
    p.set_defaults(func=main)
    return p


def completing() -> bool:
    """Whether the shell is asking for completions (argcomplete sets _ARGCOMPLETE in its environment)."""
    return "_ARGCOMPLETE" in os.environ


def autocomplete(parser: argparse.ArgumentParser) -> None:
    """Answer the shell's completion request and exit, when there is one."""
    if not completing():
        return
    import argcomplete

    argcomplete.autocomplete(parser)


def main(args: argparse.Namespace) -> int:
    import argcomplete

    print(argcomplete.shellcode(["zcorch"], shell=args.shell), end="")
    return 0
