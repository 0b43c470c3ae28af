"""`python -m zcorch`: the command line. Started inside a source checkout without the built worker while zcorch is
installed elsewhere, the installed package is meant: the command runs again under Python's -P."""
import importlib.machinery
import os
import sys


def _installed_elsewhere() -> bool:
    """Whether this is an unbuilt source tree in the cwd while another zcorch is importable."""
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
