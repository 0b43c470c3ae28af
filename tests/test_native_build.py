"""native/build.py as deploy runs it on a bare host: `python3 native/build.py --out DIR` must leave
an importable DIR/zcorch/_native*.so (built from a copy of native/, as a deploy uploads it)."""
from __future__ import annotations

import glob
import importlib.machinery
import os
import shutil
import subprocess
import sys

import pytest

from fixtures_worker import REPO
from zcorch.params import param


@pytest.mark.slow
def test_standalone_build_into_a_directory(tmp_path):
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler (scripts/install-system-deps installs build-essential)")
    shutil.copytree(os.path.join(REPO, "native"), tmp_path / "native",
                    ignore=shutil.ignore_patterns("_build", "__pycache__"))
    out = tmp_path / "out"
    # What an earlier build left: a module under another suffix would shadow (or be shadowed by) the new one.
    (out / "zcorch").mkdir(parents=True)
    stale = [out / "zcorch" / f"_native{suffix}" for suffix in importlib.machinery.EXTENSION_SUFFIXES]
    for path in stale:
        path.write_bytes(b"stale")
    p = subprocess.run([sys.executable, "native/build.py", "--out", str(out)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    built = glob.glob(str(out / "zcorch" / "_native*.so"))
    assert len(built) == 1 and p.stdout.strip() == built[0]
    assert os.listdir(out / "zcorch") == [os.path.basename(built[0])]  # no build debris, no stale module
    # The name pip gives it (cffi compiles against the stable ABI on a CPython that is no debug build), so
    # an in-place build and `pip install -e .` never leave two modules of which Python imports the older.
    if ".abi3.so" in importlib.machinery.EXTENSION_SUFFIXES and not hasattr(sys, "gettotalrefcount"):
        assert os.path.basename(built[0]) == "_native.abi3.so"
    # importable on its own (no repo on the path): the module the worker loads remotely
    check = ("import zcorch._native as n; "
             "print(n.lib.zc_mode_count(0), n.lib.zc_mode_count(1), n.__file__, "
             "n.lib.zc_mode_caps(0, b'mmap') == n.lib.ZC_CAP_FILE_SOURCE | n.lib.ZC_CAP_MAPPABLE_SOURCE)")
    q = subprocess.run([sys.executable, "-c", check], cwd=out, env={"PATH": os.environ["PATH"], "PYTHONPATH": str(out)},
                       capture_output=True, text=True, timeout=30)
    assert q.returncode == 0, q.stderr
    modes = [str(len(param(key).choices)) for key in ("send_mode", "recv_mode")]  # the table lists the registry's
    assert q.stdout.split()[:2] == modes and q.stdout.split()[2] == built[0]
    assert q.stdout.split()[3] == "True"  # the capability API is part of every build
