"""`python -m zcorch`: the command line.

Started inside a source checkout (the current directory, first on sys.path, holds a zcorch/ tree whose worker
core is not built) while zcorch is installed elsewhere (a wheel), the installed package is the one meant, as
the `zcorch` script finds it: the command runs again under Python's -P (no current directory on sys.path)."""
import importlib.machinery
import os
import sys


def _installed_elsewhere() -> bool:
    """Whether this package is a source tree in the current directory without its native module while another
    zcorch is importable from the rest of sys.path."""
    tree = os.path.dirname(os.path.abspath(__file__))
    if sys.flags.safe_path or os.path.realpath(os.path.dirname(tree)) != os.path.realpath(os.getcwd()):
        return False
    if any(name.startswith("_native") and name.endswith((".so", ".pyd")) for name in os.listdir(tree)):
        return False
    here = os.path.realpath(os.getcwd())
    rest = [p for p in sys.path if p and os.path.realpath(p) != here]
    spec = importlib.machinery.PathFinder.find_spec("zcorch", rest)
    return spec is not None and spec.origin is not None and \
        os.path.realpath(os.path.dirname(spec.origin)) != os.path.realpath(tree)


if __name__ == "__main__":
    if _installed_elsewhere():
        os.execv(sys.executable, [sys.executable, "-P", "-m", "zcorch", *sys.argv[1:]])
    from zcorch.cli import run

    run()
