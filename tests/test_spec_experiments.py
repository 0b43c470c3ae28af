"""Every file shipped in experiments/ validates and plans; the two-host ones with a lab inventory (`--hosts`)."""
from __future__ import annotations

import glob
import os

import pytest

from zcorch.config.inventory import select
from zcorch.config.reference import baseline_match_keys
from zcorch.errors import ConfigError
from zcorch.lab.netns import LabLayout
from zcorch.plan import load_plan
from zcorch.cli.plan import render

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FILES = sorted(glob.glob(os.path.join(ROOT, "experiments", "*.yaml")))
TWO_HOSTS = {"schutt-2006.yaml", "ext4-nodelalloc-2011.yaml"}   # `hosts: inventory`: they need --hosts


@pytest.fixture(scope="module")
def lab_inventory(tmp_path_factory):
    """The inventory `zcorch lab inventory` prints for the default lab (pure: nothing is brought up)."""
    path = tmp_path_factory.mktemp("inventory") / "lab.yaml"
    path.write_text(LabLayout("default").inventory_yaml())
    return select(str(path))


def test_the_studies_are_there():
    names = {os.path.basename(f) for f in FILES}
    assert {"quickstart.yaml", "schutt-2006.yaml", "splice-write-benchmark.yaml", "sendfile-pinning-2001.yaml",
            "zero-copy-output-2011.yaml", "ext4-nodelalloc-2011.yaml"} <= names


@pytest.mark.parametrize("path", FILES, ids=os.path.basename)
def test_experiment_file_validates_and_plans(path, lab_inventory):
    two_hosts = os.path.basename(path) in TWO_HOSTS
    plan = load_plan(path, hosts=lab_inventory if two_hosts else None)
    assert plan.experiment.hosts_required == two_hosts
    assert plan.experiment.hosts.localhost != two_hosts
    assert plan.cells and len(plan.runs) == len(plan.cells) * plan.experiment.repeats
    assert not [w for w in plan.warnings if "matches no cell" in w]
    assert "estimated duration" in render(plan)


def test_quickstart_covers_every_send_mode_with_compatible_receive_modes():
    plan = load_plan(os.path.join(ROOT, "experiments", "quickstart.yaml"))
    exp = plan.experiment
    assert exp.hosts.localhost and exp.repeats == 3 and exp.order == "interleave"
    assert exp.baselines.iperf3 and exp.baselines.dd
    pairs = {(c.params["send_mode"], c.params["recv_mode"]) for c in plan.cells}
    assert {s for s, _ in pairs} == {"write", "sendfile", "splice", "vmsplice", "msg_zerocopy"}
    assert len(pairs) == len(plan.cells) == 10
    # runs long enough for the host CPU view: a time, not a byte count
    assert all(c.params["duration"] >= 1.0 and c.params["bytes"] is None and c.params["buffer"] == 128 << 10
               for c in plan.cells)
    from zcorch.plan import estimate
    assert estimate(plan).total_s < 60


@pytest.mark.parametrize("path", [f for f in FILES if os.path.basename(f) in TWO_HOSTS], ids=os.path.basename)
def test_two_host_experiments_hard_code_no_hosts_and_say_they_need_them(path, lab_inventory):
    text = open(path).read()
    assert "10.77." not in text and "10.78." not in text and "/var/lib/zcorch-lab" not in text
    with pytest.raises(ConfigError) as info:
        load_plan(path)
    (msg,) = info.value.problems
    assert msg.startswith(f"{path}:") and "--hosts INVENTORY[:PAIR]" in msg and "ZCORCH_HOSTS" in msg
    plan_desc = " ".join(load_plan(path, hosts=lab_inventory).experiment.description.split())
    assert "Needs two hosts" in plan_desc and "--hosts INVENTORY[:PAIR]" in plan_desc


def test_schutt_shrinks_from_the_command_line(lab_inventory):
    """The issue's command: the shipped file, the lab's inventory, a few --set, no edit of the file."""
    path = os.path.join(ROOT, "experiments", "schutt-2006.yaml")
    plan = load_plan(path, ["bytes=64MiB", "repeats=1", "baselines.dd.count=2048", "baselines.iperf3.duration=2s",
                            "matrix.send_mode=[write, splice]", "matrix.recv_mode=[read]", "include=[]"],
                     lab_inventory)
    assert [(c.params["send_mode"], c.params["recv_mode"], c.params["bytes"]) for c in plan.cells] == [
        ("write", "read", 64 << 20), ("splice", "read", 64 << 20)]
    assert plan.experiment.hosts == LabLayout("default").hosts() and len(plan.runs) == 2
    assert plan.experiment.baselines.dd.count == 2048 and plan.experiment.baselines.iperf3.duration == 2.0


STUDIES = {"schutt-2006.yaml", "zero-copy-output-2011.yaml", "splice-write-benchmark.yaml",
           "sendfile-pinning-2001.yaml", "ext4-nodelalloc-2011.yaml"}


@pytest.mark.parametrize("path", [f for f in FILES if os.path.basename(f) in STUDIES], ids=os.path.basename)
def test_every_study_carries_its_published_reference(path, lab_inventory):
    """Each shipped study has a `reference:` whose matches select one cell each of its own matrix (load_plan
    refuses the file otherwise), cites its original publication, not a file around this repository."""
    two_hosts = os.path.basename(path) in TWO_HOSTS
    plan = load_plan(path, hosts=lab_inventory if two_hosts else None)
    ref = plan.experiment.reference
    assert ref is not None and ref.source.title and ref.source.venue and ref.setup   # the README gives no date
    assert ref.claims, "a study's findings are its claims"
    cells = [c.params for c in plan.cells]
    for label, match, of in ref.matches_of():
        hits = [p for p in cells if match.selects(p)]
        if of:   # a baseline's figure: the cells of one configuration of its kind (dd: one filesystem)
            keys = baseline_match_keys(of)
            assert hits and all(len({str(p.get(k)) for p in hits}) == 1 for k in keys), label
        else:
            assert len(hits) == 1, label
    text = open(path).read()
    assert "/work/" not in text and "seeds" not in text
    assert f"{len(ref.figures)} published figures, {len(ref.claims)} claims" in render(plan)


def test_a_reduced_study_keeps_its_reference_and_warns_about_what_it_dropped(lab_inventory):
    path = os.path.join(ROOT, "experiments", "schutt-2006.yaml")
    plan = load_plan(path, ["matrix.send_mode=[write, splice]", "matrix.recv_mode=[read]", "include=[]"],
                     lab_inventory)
    assert plan.experiment.reference is not None
    dropped = [w for w in plan.warnings if "reference." in w]
    assert dropped and all("not measured" in w and "selects no cell" in w for w in dropped)


@pytest.mark.parametrize("name", sorted(TWO_HOSTS))
def test_a_two_host_study_plans_without_its_hosts_also_with_set(name):
    # `zcorch plan FILE --set bytes=...` before the hosts are known: the --set document read back is planned as
    # the file itself is (it once asked for the hosts as soon as a --set was given)
    path = os.path.join(ROOT, "experiments", name)
    for overrides in ([], ["bytes=64MiB"]):
        plan = load_plan(path, overrides, unknown_hosts=True)
        assert plan.experiment.hosts_unknown and plan.runs
