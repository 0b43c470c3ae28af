"""Every file shipped in experiments/ validates and plans."""
from __future__ import annotations

import glob
import os

import pytest

from zcorch.plan import load_plan
from zcorch.cli.plan import render

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FILES = sorted(glob.glob(os.path.join(ROOT, "experiments", "*.yaml")))


def test_the_studies_are_there():
    names = {os.path.basename(f) for f in FILES}
    assert {"quickstart.yaml", "schutt-2006.yaml", "splice-write-benchmark.yaml", "sendfile-pinning-2001.yaml",
            "zero-copy-output-2011.yaml", "ext4-nodelalloc-2011.yaml"} <= names


@pytest.mark.parametrize("path", FILES, ids=os.path.basename)
def test_experiment_file_validates_and_plans(path):
    plan = load_plan(path)
    assert plan.cells and len(plan.runs) == len(plan.cells) * plan.experiment.repeats
    assert not [w for w in plan.warnings if "matches no cell" in w]
    assert "estimated duration" in render(plan)


def test_quickstart_covers_every_send_mode_with_compatible_receive_modes():
    plan = load_plan(os.path.join(ROOT, "experiments", "quickstart.yaml"))
    exp = plan.experiment
    assert exp.hosts.localhost and exp.repeats == 3 and exp.order == "interleave"
    assert exp.baselines.iperf3 and exp.baselines.dd
    pairs = {(c.params["send_mode"], c.params["recv_mode"]) for c in plan.cells}
    assert {s for s, _ in pairs} == {"write", "mmap", "sendfile", "splice", "vmsplice", "msg_zerocopy"}
    assert len(pairs) == len(plan.cells) == 24
    assert all(c.params["bytes"] == 64 << 20 and c.params["buffer"] == 128 << 10 for c in plan.cells)
    from zcorch.plan import estimate
    assert estimate(plan).total_s < 60
