"""Deep input is an input error, never a RecursionError: a 1100-level directory tree under `zcorch history`'s
root, a 200k-deep JSON inventory under `--hosts`. Real trees and files, real `python -m zcorch` processes."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fixtures_analysis import ROOT


def _zcorch(*args):
    return subprocess.run([sys.executable, "-m", "zcorch", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def _remove_chain(top) -> None:
    """The chain of `d` directories below `top`, removed bottom-up by fds: pytest's own clean-up of old temporary
    directories (shutil.rmtree, recursive) would hit the recursion limit on it in a later session."""
    fds = [os.open(top, os.O_RDONLY)]
    try:
        while True:
            try:
                fds.append(os.open("d", os.O_RDONLY, dir_fd=fds[-1]))
            except FileNotFoundError:
                break
        while len(fds) > 1:
            os.close(fds.pop())
            os.rmdir("d", dir_fd=fds[-1])
    finally:
        for fd in fds:
            os.close(fd)


def test_history_of_a_1100_level_tree_is_refused_with_the_reason(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        for _ in range(1100):   # by fds: the path is longer than PATH_MAX long before the bottom
            os.mkdir("d", dir_fd=fd)
            nfd = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        os.close(fd)
        p = _zcorch("history", tmp_path, "-o", tmp_path.parent / "site")
        assert p.returncode == 2, p.stderr[-2000:]
        assert "Traceback" not in p.stderr and "RecursionError" not in p.stderr
        assert "more than 64 levels deep" in p.stderr
    finally:
        _remove_chain(tmp_path)
        assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("shape", ["lists", "objects"])
def test_a_200k_deep_json_inventory_is_refused_with_the_reason(tmp_path, shape):
    inv = tmp_path / "deep.json"
    n = 200_000
    if shape == "lists":
        inv.write_text('{"_meta": {"hostvars": {}}, "all": ' + "[" * n + "]" * n + "}")
    else:
        inv.write_text('{"pairs": ' + '{"a": ' * n + "1" + "}" * n + "}")
    p = _zcorch("plan", ROOT / "experiments" / "quickstart.yaml", "--hosts", inv)
    assert p.returncode == 2, p.stderr[-2000:]
    assert "Traceback" not in p.stderr and "RecursionError" not in p.stderr
    assert "nested more than" in p.stderr
