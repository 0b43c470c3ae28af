"""`zcorch examples`: the experiment files and the notebook that ship with zcorch; `copy NAME DIR` writes one out."""
from __future__ import annotations

import argparse
from zcorch.cli import add_command


def register(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    p = add_command(subparsers, "examples", __doc__)
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    sub.add_parser("list", help="list them (the default)")
    cp = sub.add_parser("copy", help="write one into DIR (never overwrites)")
    name = cp.add_argument("name", help="an example's name (zcorch examples lists them), e.g. quickstart")
    name.completer = _names   # argcomplete: the examples' names, not the files of the current directory
    cp.add_argument("dir", nargs="?", default=".", help="where to write it (default: here)")
    p.set_defaults(func=main, action="list")
    return p


def _names(**_kwargs) -> "list[str]":
    from zcorch.examples import examples

    return list(examples())


def main(args: argparse.Namespace) -> int:
    from zcorch.examples import copy_example, examples

    if args.action == "copy":
        print(copy_example(args.name, args.dir))
        return 0
    items = examples()
    width = max(len(n) for n in items)
    for ex in items.values():
        print(f"{ex.name:<{width}}  {ex.kind:<10}  {ex.description}")
    print(f"\ncopy one: zcorch examples copy NAME [DIR]   then: zcorch plan NAME.yaml; zcorch run NAME.yaml")
    return 0
