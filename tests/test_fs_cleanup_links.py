"""Stale-filesystem cleanup judges ownership by what paths resolve to, not by their text.

A crafted state file names a path whose `zcorch-<token>-x` or `fs-<token>` component is a symlink to a
victim's directory: `rm -f` through it would delete the victim's file. Real files, links and `rm`."""
from __future__ import annotations

import json
import os

import pytest

from zcorch.errors import HostError
from zcorch.hosts.local import LocalHost
from zcorch.provision.filesystems import FilesystemManager


def _craft_state(state_dir: str, token: str, resources: list) -> None:
    os.makedirs(state_dir, exist_ok=True)
    os.chmod(state_dir, 0o700)
    path = os.path.join(state_dir, f"zcorch-fs-state-{token}.json")
    with open(path, "w") as f:
        json.dump({"format": "zcorch-fs-state", "version": 1, "token": token,
                   "owner": {"host": "elsewhere", "pid": 1}, "configs": {"x": resources}}, f)
    os.chmod(path, 0o600)


@pytest.fixture
def victim(tmp_path):
    d = tmp_path / "victim"
    d.mkdir()
    (d / "dev0.img").write_text("keep me")
    return d


def test_a_linked_backing_directory_does_not_lead_rm_outside(tmp_path, victim, fs_state_dir):
    loop_dir = tmp_path / "loopdir"
    loop_dir.mkdir()
    (loop_dir / "zcorch-t2-x").symlink_to(victim)
    _craft_state(fs_state_dir, "t2", [{"kind": "backing_file", "path": f"{loop_dir}/zcorch-t2-x/dev0.img"}])
    with pytest.raises(HostError, match="not under zcorch's own directories"):
        FilesystemManager.cleanup_stale(LocalHost(), fs_state_dir)
    assert (victim / "dev0.img").read_text() == "keep me"


def test_a_linked_session_directory_does_not_lead_rm_outside(tmp_path, victim, fs_state_dir):
    os.makedirs(fs_state_dir)
    os.symlink(victim, os.path.join(fs_state_dir, "fs-t3"))
    _craft_state(fs_state_dir, "t3", [{"kind": "backing_file", "path": f"{fs_state_dir}/fs-t3/dev0.img"}])
    with pytest.raises(HostError, match="not under zcorch's own directories"):
        FilesystemManager.cleanup_stale(LocalHost(), fs_state_dir)
    assert (victim / "dev0.img").read_text() == "keep me"


def test_a_link_below_the_runs_directory_does_not_either(tmp_path, victim, fs_state_dir):
    own = os.path.join(fs_state_dir, "fs-t4", "x")
    os.makedirs(own)
    os.symlink(victim, os.path.join(own, "sub"))
    _craft_state(fs_state_dir, "t4", [{"kind": "backing_file", "path": f"{own}/sub/dev0.img"}])
    with pytest.raises(HostError, match="not under zcorch's own directories"):
        FilesystemManager.cleanup_stale(LocalHost(), fs_state_dir)
    assert (victim / "dev0.img").read_text() == "keep me"


def test_a_state_directory_reached_through_a_link_still_cleans_its_own_files(tmp_path, fs_state_dir):
    """The user's own link above the state directory (a linked home) is not what the rule is about."""
    real = tmp_path / "real-home"
    own = real / "state" / "fs-t5" / "x" / "dev0.img"
    own.parent.mkdir(parents=True)
    own.write_text("")
    linked = tmp_path / "linked-home"
    linked.symlink_to(real)
    path = f"{linked}/state/fs-t5/x/dev0.img"
    _craft_state(f"{linked}/state", "t5", [{"kind": "backing_file", "path": path}])
    assert FilesystemManager.cleanup_stale(LocalHost(), f"{linked}/state")[0] == f"removed backing file {path}"
    assert not own.exists()
