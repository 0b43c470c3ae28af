"""`--set KEY=VALUE` (zcorch.config.overrides through load_experiment): where each key lands, validation by
the file's own validator with errors naming the --set, and the effective document a result set keeps."""
from __future__ import annotations

import dataclasses

import pytest
import yaml

from zcorch.config.experiment import load_experiment, parse_experiment
from zcorch.config.inventory import select
from zcorch.config.overrides import parse_override
from zcorch.errors import ConfigError
from zcorch.plan import expand, load_plan

EXP = """\
# a comment the effective document does not keep
name: t
description: two modes, two buffers
params: &common
  bytes: 1MiB
  sink: /dev/null
  source: /dev/zero
matrix:
  send_mode: [write, sendfile]
  buffer: [64KiB, 128KiB]
include:
  - {send_mode: write, buffer: 1MiB, bytes: 4MiB}
exclude:
  - {send_mode: sendfile, buffer: 128KiB}
repeats: 3
baselines:
  iperf3: {duration: 2s}
  dd: false
"""


@pytest.fixture
def exp_file(write_yaml):
    return write_yaml(EXP)


def set_problems(path, *overrides, hosts=None):
    with pytest.raises(ConfigError) as info:
        expand(load_experiment(path, overrides, hosts))
    assert info.value.exit_status == 2
    return info.value.problems


def runs(plan):
    return [(r.id, r.repeat) for r in plan.runs]


def test_parse_override_reads_the_value_as_yaml():
    ov = parse_override("matrix.send_mode=[write, splice]")
    assert ov.key == "matrix.send_mode" and ov.label == "--set matrix.send_mode=[write, splice]"
    assert [i.text for i in ov.value.items] == ["write", "splice"]
    assert parse_override("window=").value.is_null           # empty: null (window auto)
    assert parse_override("description=a=b").value.text == "a=b"   # only the first = splits
    for bad in ("bytes", "=1", ".bytes=1", "baselines..dd=1"):
        with pytest.raises(ConfigError, match=r"^--set "):
            parse_override(bad)


def test_a_parameter_sets_params_or_replaces_its_matrix_axis(exp_file):
    exp = load_experiment(exp_file, ["bytes=64MiB", "buffer=256KiB", "repeats=1"])
    assert exp.params["bytes"] == 64 << 20 and exp.repeats == 1
    # `buffer` is an axis: it becomes that single value, params stay as they were
    assert [(a.key, a.values) for a in exp.matrix] == [("send_mode", ["write", "sendfile"]), ("buffer", [256 << 10])]
    assert "buffer" not in exp.params
    plan = expand(exp)
    matrix = [c.params for c in plan.cells if c.origin == "matrix"]
    assert [(p["send_mode"], p["buffer"], p["bytes"]) for p in matrix] == [
        ("write", 256 << 10, 64 << 20), ("sendfile", 256 << 10, 64 << 20)]
    # an include that sets a parameter itself keeps its value (it was written to differ)
    (inc,) = [c.params for c in plan.cells if c.origin == "include[0]"]
    assert inc["buffer"] == 1 << 20 and inc["bytes"] == 4 << 20
    assert any("exclude[0] matches no cell" in w for w in plan.warnings)


def test_dotted_keys_set_sections_and_create_what_is_missing(exp_file):
    exp = load_experiment(exp_file, ["params.window=2MiB", "matrix.send_mode=[splice]", "order=shuffle", "seed=7",
                                     "baselines.iperf3.duration=1s", "baselines.dd={bs: 64KiB, count: 16}",
                                     "include=[]", "exclude=[]"])
    assert exp.params["window"] == 2 << 20 and exp.order == "shuffle" and exp.seed == 7
    assert exp.matrix[0].values == ["splice"] and exp.include == [] and exp.exclude == []
    assert exp.baselines.iperf3.duration == 1.0 and (exp.baselines.dd.bs, exp.baselines.dd.count) == (65536, 16)
    exp = load_experiment(exp_file, ["matrix.pipe_size=[64KiB, 1MiB]", "include=[]"])
    assert exp.matrix[-1].values == [65536, 1 << 20]
    # a later --set wins over an earlier one
    assert load_experiment(exp_file, ["bytes=2MiB", "bytes=3MiB"]).params["bytes"] == 3 << 20


def test_errors_name_the_set_and_come_with_the_file_errors(exp_file, write_yaml):
    found = set_problems(exp_file, "bytes=1GX", "byts=1", "baselines.iperf3.duraton=1s", "gift=yes",
                         "repeats=0", "matrix.send_mode=write", "send_mode=[write, splice]", "bytes.x=1",
                         "include.0.bytes=1", "baselines.dd.count=5", "matrix.send_mode=[write, sendfle]")
    expected = [
        "--set bytes=1GX: params.bytes: not a size",
        "--set byts=1: byts: unknown key `byts`; did you mean `bytes`?",
        "--set baselines.iperf3.duraton=1s: baselines.iperf3.duraton: unknown key `duraton`; did you mean `duration`?",
        "--set gift=yes: params.gift: `yes` is read by YAML 1.1 as the boolean true",
        "--set repeats=0: repeats: expected an integer between 1 and 10000, got 0",
        "--set send_mode=[write, splice]: send_mode: one value for every cell; to vary `send_mode`, set a matrix "
        "axis: --set matrix.send_mode=[...]",
        "--set bytes.x=1: bytes.x: `bytes` is a parameter (one value): no key under it",
        "--set include.0.bytes=1: include: `include` is a list: set it whole (--set include=[...])",
        "--set baselines.dd.count=5: baselines.dd: `baselines.dd` is `false`, not a mapping: set it whole",
        "--set matrix.send_mode=[write, sendfle]: matrix.send_mode[1]: `sendfle` is not a send mode; did you mean "
        "`sendfile`?",
    ]
    for text in expected:
        assert sum(p.startswith(text) for p in found) == 1, (text, found)
    # `matrix.send_mode=write` is overridden by the later matrix.send_mode (a later --set wins)
    assert len(found) == len(expected)
    # a problem of the file itself is still named by file:line
    bad = write_yaml(EXP.replace("repeats: 3", "repeats: zero"), "bad.yaml")
    found = set_problems(bad, "bytes=1GX")
    assert found[0].startswith(f"{bad}:15:10: repeats: ") and found[1].startswith("--set bytes=1GX: ")


def test_a_yaml_syntax_error_in_a_value_names_the_set(exp_file):
    (msg,) = set_problems(exp_file, "matrix.send_mode=[write,")
    assert msg.startswith("--set matrix.send_mode=[write,: YAML syntax error")


def test_cell_rules_apply_to_set_values(exp_file):
    """A cell the worker cannot run is refused as if the file said it (the plan names the --set)."""
    found = set_problems(exp_file, "matrix.send_mode=[mmap]", "source=mem")
    assert any("send mode `mmap` reads from a file" in p for p in found), found


def test_set_hosts_is_refused_with_an_inventory(exp_file, tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text("pairs: {here: localhost}\n")
    (msg,) = set_problems(exp_file, "hosts.sender.workdir=/x", hosts=select(str(inv)))
    assert msg.startswith("--set hosts.sender.workdir=/x: hosts: the hosts come from pair `here`")
    # without --hosts, hosts are a section like any other
    remote = load_experiment(exp_file, ["hosts={sender: {ssh: a, data_address: 10.0.0.1}, "
                                        "receiver: {ssh: b, data_address: 10.0.0.2}}"])
    assert remote.hosts.receiver.ssh == "b"


# -- the effective document -------------------------------------------------------------------

def test_effective_document_reads_back_to_what_runs(exp_file, tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text("pairs:\n  lab:\n    sender: {ssh: root@10.77.0.2, data_address: 10.78.0.2, identity_file: k/id}\n"
                   "    receiver: {ssh: root@10.77.0.3, data_address: 10.78.0.3}\n")
    chosen = select(f"{inv}:lab")
    overrides = ["bytes=64MiB", "matrix.buffer=[64KiB]", "repeats=1", "baselines.iperf3.duration=1s"]
    plan = load_plan(exp_file, overrides, chosen)
    exp = plan.experiment
    assert exp.overrides == tuple(overrides) and exp.inventory == chosen
    text = exp.effective_text()
    head = [line for line in text.splitlines() if line.startswith("#")]
    assert head[1] == f"#   file:  {exp_file}"
    assert head[2].startswith(f"#   hosts: pair `lab` of the inventory {inv} (sha256 {chosen.sha256[:16]}")
    assert head[3:] == ["#   --set bytes=64MiB   (params.bytes)", "#   --set matrix.buffer=[64KiB]",
                        "#   --set repeats=1", "#   --set baselines.iperf3.duration=1s"]
    data = yaml.safe_load(text)
    assert data["hosts"]["sender"]["identity_file"] == str(tmp_path / "k" / "id")  # resolved, absolute
    assert list(data)[:3] == ["name", "description", "hosts"]  # hosts where a file writes them
    assert data["params"] == {"bytes": "64MiB", "sink": "/dev/null", "source": "/dev/zero"}
    # read back alone (what --resume and the report read), it is the same experiment and the same runs
    again = expand(parse_experiment(text, "experiment.yaml"))
    assert runs(again) == runs(plan) and again.experiment.hosts == chosen.hosts
    assert again.experiment.effective is None  # no --hosts/--set of its own


def test_no_effective_document_without_hosts_or_set(exp_file):
    exp = load_experiment(exp_file)
    assert exp.effective is None and exp.effective_text() == exp.text and exp.overrides == ()


def test_effective_document_keeps_strings_that_look_like_other_types(write_yaml):
    path = write_yaml("name: t\ndescription: '2011'\nparams: {source: '{scratch}/a.dat', sink: \"/tmp/010\"}\n"
                      "matrix:\n  send_mode: [write]\n  buffer: [64KiB]\nbaselines: {iperf3: false, dd: false}\n")
    exp = load_experiment(path, ["description='yes'"])
    again = parse_experiment(exp.effective_text())
    assert again.description == "yes" and again.params == exp.params


def test_hosts_inventory_without_hosts_says_to_give_them(write_yaml, tmp_path):
    path = write_yaml("name: t\nhosts: inventory\n")
    (msg,) = set_problems(path)
    assert msg.startswith(f"{path}:2:8: hosts: `inventory`: this experiment runs on two hosts you name")
    assert "--hosts INVENTORY[:PAIR]" in msg and "ZCORCH_HOSTS" in msg and "zcorch lab inventory" in msg
    inv = tmp_path / "inv.yaml"
    inv.write_text("pairs: {here: localhost}\n")
    exp = load_experiment(path, hosts=select(str(inv)))
    assert exp.hosts.localhost and exp.hosts_required
    assert yaml.safe_load(exp.effective_text())["hosts"] == "localhost"


def test_a_newline_in_a_set_value_stays_inside_the_comment_header(exp_file):
    exp = load_experiment(exp_file, ['description="two\nname: other"', "repeats=1\n"])
    assert exp.description == "two name: other"
    text = exp.effective_text()
    assert '#   --set description="two\\nname: other"' in text and "#   --set repeats=1\\n" in text
    again = parse_experiment(text)
    assert again.name == "t" and again.description == "two name: other" and again.repeats == 1


def test_the_experiment_is_built_complete_and_frozen(exp_file):
    exp = load_experiment(exp_file, ["repeats=1"])
    # the --set texts and the effective document are in the Experiment as returned, not patched in later
    assert exp.overrides == ("repeats=1",) and exp.inventory is None
    assert exp.effective is not None and "--set repeats=1" in exp.effective
    with pytest.raises(dataclasses.FrozenInstanceError):
        exp.name = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        exp.matrix[0].key = "other"  # type: ignore[misc]
    plain = load_experiment(exp_file)
    assert plain.overrides == () and plain.effective is None


def test_an_empty_baselines_mapping_is_refused_not_guessed(exp_file, write_yaml):
    # `{}` could mean "none" or "the defaults": neither is guessed, in a --set or in the file
    (problem,) = set_problems(exp_file, "baselines={}")
    assert problem.startswith("--set baselines={}: baselines: an empty mapping names no baseline: write "
                              "`baselines: false`"), problem
    bad = write_yaml(EXP.replace("baselines:\n  iperf3: {duration: 2s}\n  dd: false\n", "baselines: {}\n"), "e.yaml")
    (problem,) = set_problems(bad)
    assert problem.startswith(f"{bad}:16:12: baselines: an empty mapping"), problem
    off = expand(load_experiment(exp_file, ["baselines=false"]))
    assert list(off.experiment.baselines.enabled()) == []
