"""Experiment-file validation: every error class names file:line:column, the key path, what was expected."""
from __future__ import annotations

import pytest

from fixtures_analysis import zcorch_cli
from fixtures_spec import MINIMAL, at, only_problem, problems_of
from zcorch.errors import ConfigError
from zcorch.config.baselines import BASELINES_OFF, Baselines, DdBaseline, Iperf3Baseline
from zcorch.config.experiment import DEFAULTS, PARAM_KEYS, load_experiment, parse_experiment
from zcorch.config.filesystems import FilesystemConfig
from zcorch.config.hosts import HostSpec


# ---------------------------------------------------------------- what a valid file gives

def test_minimal_file_has_documented_defaults(write_yaml):
    path = write_yaml(MINIMAL)
    exp = load_experiment(path)
    assert exp.name == "t" and exp.path == path and exp.text == MINIMAL
    assert exp.hosts.localhost and exp.repeats == 1 and exp.order == "sequential" and exp.seed == 0
    assert exp.skip_invalid is False and exp.params == {} and exp.matrix == [] and exp.filesystems == {}
    assert exp.base_params() == DEFAULTS
    assert DEFAULTS["buffer"] == 128 * 1024 and DEFAULTS["bytes"] == 1024 ** 3 and DEFAULTS["timeout"] == 60.0
    assert DEFAULTS["window"] is None and DEFAULTS["pipe_size"] is None and DEFAULTS["send_cpu"] is None
    # the seeds always baselined: both kinds on by default, as the run stage does
    assert exp.baselines == Baselines() and exp.baselines.iperf3.per == "pair" and exp.baselines.dd.bs == 1024 ** 2


def test_sizes_and_durations_are_normalised(write_yaml):
    exp = load_experiment(write_yaml("""
        name: units
        params: {bytes: 1GB, buffer: 64K, window: auto, pipe_size: 1MiB, timeout: 500ms}
        matrix:
          buffer: [4096, 64KiB, 1M, 1KB]
          timeout: [5s, 2m, 90]
          window: [null, 2MiB]
    """))
    assert exp.params == {"bytes": 10 ** 9, "buffer": 65536, "window": None, "pipe_size": 1 << 20, "timeout": 0.5}
    axes = {a.key: a.values for a in exp.matrix}
    assert axes == {"buffer": [4096, 65536, 1 << 20, 1000], "timeout": [5.0, 120.0, 90.0], "window": [None, 2 << 20]}


def test_the_issue_example_file_loads_with_filesystems(write_yaml):
    exp = load_experiment(write_yaml("""
        name: fs
        filesystems:
          array:       {path: /mnt/array}
          ext4-loop:   {fs: ext4, loop: {count: 1, size: 2GiB}, mount_options: [noatime]}
          xfs-stripe:  {fs: xfs, loop: {count: 1, size: 2GiB}, mkfs_options: ["-d", "su=64k,sw=4"]}
          btrfs-raid0: {fs: btrfs, raid: raid0, loop: {count: 2, size: 1GiB}}
          md-raid0:    {fs: xfs, raid: raid0, devices: [/dev/sdb, /dev/sdc], allow_destroy: [/dev/sdb, /dev/sdc]}
        matrix:
          filesystem: [ext4-loop, xfs-stripe, btrfs-raid0, array]
        params:
          sink: "{filesystem}/recv.dat"
          sink_state: preallocated
    """))
    assert exp.filesystems["array"] == FilesystemConfig(name="array", path="/mnt/array")
    assert exp.filesystems["array"].existing
    assert exp.filesystems["ext4-loop"] == FilesystemConfig(name="ext4-loop", fs="ext4", loop_count=1,
                                                            loop_size=2 << 30, mount_options=("noatime",))
    assert exp.filesystems["xfs-stripe"].mkfs_options == ("-d", "su=64k,sw=4")
    assert exp.filesystems["md-raid0"].allow_destroy == ("/dev/sdb", "/dev/sdc") and exp.filesystems["md-raid0"].uses_md
    assert exp.filesystems["btrfs-raid0"].loop_count == 2 and not exp.filesystems["btrfs-raid0"].uses_md
    assert exp.params["sink"] == "{filesystem}/recv.dat"


def test_two_host_block(write_yaml):
    exp = load_experiment(write_yaml("""
        name: lab
        hosts:
          sender:   {ssh: root@10.77.0.2, data_address: 10.78.0.2}
          receiver: {ssh: "root@[fd00::3]:2222", data_address: "fd00::3",
                     identity_file: /var/lib/zcorch-lab/id_ed25519, known_hosts: ~/.ssh/known_hosts,
                     ssh_config: /var/lib/zcorch-lab/ssh_config, python: /usr/bin/python3, workdir: ~/.cache/zcorch}
    """))
    assert not exp.hosts.localhost
    assert exp.hosts.sender == HostSpec(ssh="root@10.77.0.2", data_address="10.78.0.2")
    assert exp.hosts.sender.python == "python3" and exp.hosts.sender.workdir == "~/.cache/zcorch"  # defaults
    assert exp.hosts.receiver.workdir == "~/.cache/zcorch" and exp.hosts.receiver.python == "/usr/bin/python3"
    assert exp.hosts.receiver.ssh == "root@[fd00::3]:2222" and exp.hosts.fs_state_dir == "~/.cache/zcorch/fs"


def test_anchors_and_merge_keys(write_yaml):
    exp = load_experiment(write_yaml("""
        name: anchors
        hosts:
          sender: &lab {ssh: lab-sender, data_address: 10.78.0.2, identity_file: /k}
          receiver: {<<: *lab, ssh: lab-receiver, data_address: 10.78.0.3}
    """))
    assert exp.hosts.receiver == HostSpec(ssh="lab-receiver", data_address="10.78.0.3", identity_file="/k")


# ---------------------------------------------------------------- unknown names, with suggestions

def test_unknown_param_key_suggests_closest(write_yaml):
    path = write_yaml("""
        name: t
        params:
          send_mdoe: write
    """)
    p = only_problem(path)
    assert at(p, path, 3, 3)
    assert "params.send_mdoe" in p and "did you mean `send_mode`" in p


@pytest.mark.parametrize("section,line", [
    ("matrix:\n  recv_mdoe: [read]\n", 3),
    ("include:\n  - {buffr: 1MiB}\n", 3),
    ("exclude:\n  - {sorce: mem}\n", 3),
])
def test_unknown_keys_in_every_parameter_section(write_yaml, section, line):
    path = write_yaml("name: t\n" + section)
    p = only_problem(path)
    assert at(p, path, line) and "unknown key" in p and "did you mean" in p


def test_unknown_top_level_and_host_keys(write_yaml):
    path = write_yaml("""
        name: t
        repeat: 3
        hosts:
          sender: {ssh: a, data_address: 10.0.0.1, identiy_file: /k}
          receiver: {ssh: b, data_address: 10.0.0.2}
    """)
    problems = problems_of(path)
    assert len(problems) == 2
    assert at(problems[0], path, 2, 1) and "did you mean `repeats`" in problems[0]   # (or `report`)
    assert at(problems[1], path, 4) and "hosts.sender.identiy_file" in problems[1] and "`identity_file`" in problems[1]


def test_bad_mode_value_names_item_index_and_suggests(write_yaml):
    path = write_yaml("""
        name: t
        matrix:
          send_mode: [write, mmap, sendfle]
    """)
    p = only_problem(path)
    assert at(p, path, 3, 28)
    assert "matrix.send_mode[2]" in p and "did you mean `sendfile`?" in p and "expected one of write" in p


def test_missing_name(write_yaml):
    path = write_yaml("description: x\n")
    p = only_problem(path)
    assert at(p, path, 1) and "missing required key `name`" in p


# ---------------------------------------------------------------- YAML pitfalls

def test_duplicate_key_is_an_error(write_yaml):
    path = write_yaml("""
        name: t
        params:
          buffer: 64KiB
          bytes: 1GiB
          buffer: 1MiB
    """)
    p = only_problem(path)
    assert at(p, path, 5, 3) and "duplicate key `buffer`" in p and "line 3" in p


@pytest.mark.parametrize("line,needle", [
    ("params: {gift: yes}", "`yes` is read by YAML 1.1 as the boolean true"),
    ("params: {fsync: off}", "`off` is read by YAML 1.1 as the boolean false"),
    ("description: no", "`no` is read by YAML 1.1 as the boolean false"),
    ("params: {subblocks: 010}", "`010` is read by YAML 1.1 as the number 8"),
    ("params: {timeout: 1:30}", "`1:30` is read by YAML 1.1 as the number 90"),
    ("params: {send_cpu: 0o7}", "write integers in decimal"),
    ("params: {bytes: 1_000}", "`1_000` is read by YAML 1.1 as the number 1000"),
    ("params: {sink_state: on}", "`on` is read by YAML 1.1 as the boolean true"),
    ("params: {buffer: true}", "expected a size"),
    ("params: {recv_cpu: '3'}", "expected an integer"),
])
def test_yaml_1_1_surprises_are_caught(write_yaml, line, needle):
    path = write_yaml(f"name: t\n{line}\n")
    p = only_problem(path)
    assert at(p, path, 2) and needle in p


def test_quoted_strings_are_fine(write_yaml):
    exp = load_experiment(write_yaml("name: '2006'\ndescription: 'no'\n"))
    assert exp.name == "2006" and exp.description == "no"


def test_syntax_error_has_position(write_yaml):
    path = write_yaml("name: t\nmatrix:\n  buffer: [1, 2\nrepeats: 3\n")
    p = only_problem(path)
    assert p.startswith(path + ":") and "YAML syntax error" in p


@pytest.mark.parametrize("text,needle", [
    ("", "the file is empty"),
    ("- name: t\n", "expected a mapping"),
    ("name: a\n---\nname: b\n", "more than one YAML document"),
    ("name: !!python/object:os.system x\n", "unsupported YAML tag"),
])
def test_not_an_experiment(write_yaml, text, needle):
    p = only_problem(write_yaml(text))
    assert needle in p


def test_unreadable_and_non_utf8_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_experiment(tmp_path / "missing.yaml")
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_experiment(bad)


# ---------------------------------------------------------------- values

@pytest.mark.parametrize("line,needle", [
    ("params: {buffer: 0}", "expected a size between 1 and 1073741824 bytes (1GiB), got 0"),
    ("params: {buffer: 64XB}", "not a size"),
    ("params: {window: 4GiB}", "expected a size between 1 and 1073741823 bytes, got 4294967296"),
    ("params: {subblocks: 0}", "expected an integer between 1 and 1073741824, got 0"),
    ("params: {send_cpu: -1}", "expected an integer between 0 and"),
    ("params: {timeout: 0s}", "expected a duration between 0.001s and 604800s, got 0s"),
    ("params: {timeout: soon}", "not a duration"),
    ("params: {source: relative/file}", "expected `mem`, an absolute path (e.g. /dev/zero) or {scratch}/FILE"),
    ("params: {sink: dev/null}", "expected an absolute path"),
    ("params: {sink: \"/tmp/a\\nb\"}", "control character"),
    ("params: {source: \"/tmp/a\\0b\"}", "control character"),
    ("params: {sink: \"/tmp/{cell}.dat\"}", "a placeholder ({scratch}, {filesystem}) may only start the sink"),
    ("params: {sink: \"{filesystem}\"}", "write {filesystem}/FILE"),
    ("params: {sink: \"/mnt/{filesystem}/x\"}", "a placeholder ({scratch}, {filesystem}) may only start the sink"),
    ("params: {sink_state: stale}", "not a sink state"),
    ("params: {buffer: [64KiB, 1MiB]}", "make it a `matrix:` axis"),
    ("matrix: {buffer: 64KiB}", "expected a list of values"),
    ("matrix: {buffer: []}", "empty list"),
    ("matrix: {buffer: [64KiB, 65536]}", "duplicate value (same as matrix.buffer[0])"),
    ("repeats: 0", "expected an integer between 1 and 10000"),
    ("order: random", "not a run order"),
    ("skip_invalid: 1", "expected true or false"),
    ("name: ../escape", "not a valid name"),
])
def test_value_checks(write_yaml, line, needle):
    text = line if line.startswith("name:") else f"name: t\n{line}"
    path = write_yaml(text + "\n")
    p = only_problem(path)
    assert needle in p, p
    assert at(p, path, 1 if line.startswith("name:") else 2)


def test_every_error_in_a_file_is_reported_at_once(write_yaml):
    path = write_yaml("""
        name: t
        params:
          buffer: 0
          gift: yes
        matrix:
          send_mode: [write, sendfle]
        repeats: -1
        bogus: 1
    """)
    problems = problems_of(path)
    assert len(problems) == 5
    assert [int(p.split(":")[1]) for p in problems] == [3, 4, 6, 7, 8]


def test_cli_exits_2_without_traceback(write_yaml):
    path = write_yaml("name: t\nparams: {send_mdoe: write, buffer: 0}\n")
    r = zcorch_cli("plan", path)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert f"{path}:2:10: params.send_mdoe: unknown key" in r.stderr
    assert f"{path}:2:36: params.buffer: expected a size between 1 and" in r.stderr


# ---------------------------------------------------------------- hosts (values reaching remote commands)

@pytest.mark.parametrize("field,value,needle", [
    ("ssh", "-oProxyCommand=touch", "not a valid host name"),
    ("ssh", "root@host:99999", "port `99999`"),
    ("ssh", "ro ot@host", "not a valid user name"),
    ("ssh", "host;reboot", "not a valid host name"),
    ("data_address", "10.78.0.300", "not a valid host name or IP address"),
    ("data_address", "$(reboot)", "not a valid host name"),
    ("python", "python3 -c evil", "not an interpreter"),
    ("workdir", "relative/dir", "expected an absolute directory or ~/"),
    ("identity_file", "id_rsa", "expected an absolute path or ~/"),
])
def test_host_values_are_checked(write_yaml, field, value, needle):
    sender = {"ssh": "root@10.77.0.2", "data_address": "10.78.0.2", field: value}
    flow = ", ".join(f'{k}: "{v}"' for k, v in sender.items())
    path = write_yaml(f"name: t\nhosts:\n  sender: {{{flow}}}\n  receiver: {{ssh: r, data_address: 10.78.0.3}}\n")
    p = only_problem(path)
    assert at(p, path, 3) and f"hosts.sender.{field}" in p and needle in p


def test_hosts_need_both_roles_and_required_keys(write_yaml):
    path = write_yaml("name: t\nhosts:\n  sender: {ssh: s}\n")
    problems = problems_of(path)
    assert any("missing `receiver:`" in p for p in problems)
    assert any("hosts.sender: missing required key `data_address`" in p for p in problems)
    p = only_problem(write_yaml("name: t\nhosts: local\n", "h2.yaml"))
    assert "expected `localhost` or a mapping" in p


# ---------------------------------------------------------------- filesystems

@pytest.mark.parametrize("entry,needle", [
    ("{fs: ext5, loop: {size: 1GiB}}", "`ext5` is not a filesystem type; did you mean `ext4`"),
    ("{fs: ext4}", "needs exactly one of `path`"),
    ("{fs: ext4, path: /mnt/x, loop: {size: 1GiB}}", "needs exactly one of"),
    ("{path: /mnt/x, fs: ext4}", "`fs` does not apply"),
    ("{fs: ext4, loop: {count: 0, size: 1GiB}}", "loop.count: expected an integer between 1"),
    ("{fs: ext4, loop: {count: 1, size: 0}}", "loop.size: expected a size > 0"),
    ("{fs: ext4, loop: {count: 1}}", "missing required key `size`"),
    ("{fs: ext4, raid: raid7, loop: {count: 3, size: 1GiB}}", "not a RAID level"),
    ("{fs: ext4, raid: raid5, loop: {count: 2, size: 1GiB}}", "raid5 needs at least 3 devices, this configuration"),
    ("{fs: ext4, raid: raid10, loop: {count: 2, size: 1GiB}}", "raid10 needs at least 4 devices"),
    ("{fs: btrfs, raid: raid1c3, loop: {count: 2, size: 1GiB}}", "raid1c3 needs at least 3 devices"),
    ("{fs: xfs, raid: dup, loop: {count: 1, size: 1GiB}}", "`dup` is a btrfs profile"),
    ("{fs: btrfs, raid: raid0, raid_chunk: 64KiB, loop: {count: 2, size: 1GiB}}", "raid_chunk: only for md RAID"),
    ("{fs: ext4, raid: raid0, raid_chunk: 6000, loop: {count: 2, size: 1GiB}}", "multiple of 4KiB"),
    ("{fs: btrfs, raid: raid0, loop: {count: 2, size: 64MiB}}", "loop.size: btrfs needs at least"),
    ("{fs: ext4, raid: raid0, loop: {count: 1, size: 1GiB}}", "raid0 needs at least 2 devices"),
    ("{fs: xfs, raid: single, loop: {count: 1, size: 1GiB}}", "`single` is a btrfs profile"),
    ("{fs: ext4, loop: {count: 2, size: 1GiB}}", "need `raid:`"),
    ("{fs: xfs, devices: [sdb]}", "expected a device path under /dev/"),
    ("{fs: xfs, devices: [/dev/sdb, /dev/sdb]}", "listed twice"),
    ("{fs: xfs, devices: [/dev/sdb], allow_destroy: [/dev/sdc]}", "`/dev/sdc` is not one of this configuration"),
    ("{fs: xfs, loop: {size: 1GiB}, allow_destroy: [/dev/sdb]}", "only applies to `devices`"),
    ("{fs: ext4, loop: {size: 1GiB}, mount_options: [\"noatime,nodelalloc\"]}", "commas"),
    ("{fs: ext4, loop: {size: 1GiB}, mount_options: [\"noatime; reboot\"]}", "shell metacharacters"),
    ("{fs: ext4, loop: {size: 1GiB}, mkfs_options: [\"-O has journal\"]}", "whitespace"),
    ("{fs: ext4, loop: {size: 1GiB}, mkfs_options: \"-O x\"}", "expected a list of mkfs options"),
    ("{fs: xfs, loop: {size: 100MiB}}", "loop.size: xfs needs a filesystem of at least 300MiB"),
])
def test_filesystem_entries(write_yaml, entry, needle):
    path = write_yaml(f"name: t\nfilesystems:\n  one: {entry}\n")
    p = only_problem(path)
    assert at(p, path, 3) and "filesystems.one" in p and needle in p, p


def test_filesystem_values_must_name_an_entry(write_yaml):
    path = write_yaml("""
        name: t
        filesystems:
          ext4-loop: {fs: ext4, loop: {size: 1GiB}}
        params: {sink: "{filesystem}/x"}
        matrix:
          filesystem: [ext4-loop, ext4-lop]
    """)
    p = only_problem(path)
    assert at(p, path, 6, 27) and "matrix.filesystem[1]" in p and "did you mean `ext4-loop`?" in p


# ---------------------------------------------------------------- baselines and include

def test_baselines(write_yaml):
    exp = load_experiment(write_yaml("""
        name: t
        baselines:
          iperf3: {duration: 5s, per: sweep, omit: 2}
          dd: {bs: 32KiB, count: 512k}
    """))
    assert exp.baselines == Baselines(Iperf3Baseline(duration=5.0, per="sweep", omit=2),
                                      DdBaseline(bs=32768, count=512 * 1024, scratch="{scratch}"))
    assert load_experiment(write_yaml("name: t\nbaselines: {dd: false}\n", "b2.yaml")).baselines == \
        Baselines(iperf3=Iperf3Baseline(), dd=None)
    assert load_experiment(write_yaml("name: t\nbaselines: false\n", "b3.yaml")).baselines == BASELINES_OFF
    path = write_yaml("name: t\nbaselines:\n  iperf: {per: cell}\n", "b4.yaml")
    p = only_problem(path)
    assert at(p, path, 3) and "did you mean `iperf3`" in p



@pytest.mark.parametrize("kind,key,value", [
    ("iperf3", "bytes", "1GiB"), ("iperf3", "time", "5s"), ("iperf3", "port", 5202),
    ("iperf3", "idle_timeout", 10), ("iperf3", "enabled", "false"), ("dd", "enabled", "false"),
])
def test_baseline_keys_outside_the_one_schema_are_refused(write_yaml, kind, key, value):
    """The run stage once had its own parser accepting these; there is one schema now and they are not in it."""
    path = write_yaml(f"name: t\nbaselines:\n  {kind}: {{{key}: {value}}}\n")
    p = only_problem(path)
    assert at(p, path, 3) and f"baselines.{kind}.{key}: unknown key `{key}`" in p


def test_filesystem_rules_live_in_one_place(write_yaml):
    """Rules the provisioning stage had on its own (raid5, device minimums) are refused at plan time, file:line."""
    path = write_yaml("""
        name: t
        filesystems:
          r5:
            fs: ext4
            raid: raid5
            loop: {count: 2, size: 1GiB}
        params: {sink: "{filesystem}/x", filesystem: r5}
    """)
    r = zcorch_cli("plan", path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"{path}:5:11: filesystems.r5.raid: raid5 needs at least 3 devices, this configuration has 2" in r.stderr
    ok = load_experiment(write_yaml("name: t\nfilesystems:\n  r5: {fs: ext4, raid: raid5, loop: {count: 3, size: 1GiB}}\n"
                                    "params: {sink: \"{filesystem}/x\", filesystem: r5}\n", "ok.yaml"))
    assert ok.filesystems["r5"].raid == "raid5" and ok.filesystems["r5"].uses_md

def test_include_must_set_every_varying_axis(write_yaml):
    path = write_yaml("""
        name: t
        matrix:
          send_mode: [write, vmsplice]
          buffer: [64KiB, 1MiB]
        include:
          - {send_mode: msg_zerocopy}
    """)
    p = only_problem(path)
    assert at(p, path, 6, 5) and "include[0]" in p and "`buffer` (64KiB, 1MiB)" in p


def test_parse_experiment_from_text():
    exp = parse_experiment("name: t\nparams: {buffer: 1MiB}\n", "stored/experiment.yaml")
    assert exp.path == "stored/experiment.yaml" and exp.params == {"buffer": 1 << 20}
    assert set(exp.base_params()) == set(PARAM_KEYS)


# ---------------------------------------------------------------- the {scratch} placeholder

def test_scratch_placeholder_good_forms_are_kept_as_written(write_yaml):
    exp = load_experiment(write_yaml("""
        name: t
        params:
          source: "{scratch}/src.dat"
        matrix:
          sink: [/dev/null, "{scratch}/sub/dir/recv.dat"]
        baselines:
          dd: {scratch: "{scratch}"}
    """))
    assert exp.params["source"] == "{scratch}/src.dat"
    assert exp.matrix[0].values == ["/dev/null", "{scratch}/sub/dir/recv.dat"]
    assert exp.baselines.dd.scratch == "{scratch}"
    sub = load_experiment(write_yaml('name: t\nbaselines: {dd: {scratch: "{scratch}/dd"}}\n', "sub.yaml"))
    assert sub.baselines.dd.scratch == "{scratch}/dd"


def test_scratch_cell_ids_hash_the_placeholder_not_a_home(write_yaml):
    """The same file gives the same cell ids for every user: ids are computed on the params as written."""
    import hashlib
    import json

    from zcorch.plan import load_plan

    plan = load_plan(write_yaml('name: t\nparams: {send_mode: mmap, source: "{scratch}/s.dat", '
                                'recv_mode: mmap, sink: "{scratch}/r.dat"}\n'))
    (cell,) = plan.cells
    assert cell.params["source"] == "{scratch}/s.dat" and cell.params["sink"] == "{scratch}/r.dat"
    from zcorch.params import ID_OMIT_AT_DEFAULT

    # the parameters added later (sample_interval, streams, ...) at their default are left out of the id
    kept = {k: v for k, v in cell.params.items() if k not in ID_OMIT_AT_DEFAULT or v != ID_OMIT_AT_DEFAULT[k]}
    canonical = json.dumps(kept, sort_keys=True, separators=(",", ":"))
    assert cell.id == hashlib.sha256(canonical.encode()).hexdigest()[:12]


@pytest.mark.parametrize("line,col,needle", [
    ('params: {source: "{scratch}"}', 18, "`{scratch}`: write {scratch}/FILE"),
    ('params: {sink: "{scratch}/"}', 16, "write {scratch}/FILE"),
    ('params: {sink: "{scratch}x.dat"}', 16, "write {scratch}/FILE"),
    ('params: {source: "{scratch}/../etc/passwd"}', 18, "must be followed by a relative path without `..`"),
    ('params: {sink: "{scratch}/a/../../x"}', 16, "without `..`"),
    ('params: {sink: "{scratch}//abs"}', 16, "without `..` (nor `.` or empty components)"),
    ('params: {sink: "{scratch}/./x"}', 16, "without `..`"),
    ('params: {sink: "/tmp/{scratch}/x"}', 16, "a placeholder ({scratch}, {filesystem}) may only start the sink"),
    ('params: {source: "/data/{scratch}"}', 18, "a placeholder ({scratch}) may only start the source"),
    ('params: {sink: "{scratch}/a/{scratch}"}', 16, "a placeholder may only start the sink, once"),
    ('params: {sink: "{scrach}/x"}', 16, "`{scrach}` is not a placeholder; did you mean `{scratch}`?"),
    ('params: {sink: "{tmp}/x"}', 16, "`{tmp}` is not a placeholder (the sink may start with {scratch}, {filesystem})"),
    ('params: {source: "{filesystem}/x"}', 18, "{filesystem} is not allowed in the source"),
    ('params: {sink: "{scratch"}', 16, "did you mean `{scratch}`?"),
    ('params: {sink: "{scratch}/a\\nb"}', 16, "control character"),
    ("params: {sink: {scratch}}", 16, "{scratch} without quotes is a YAML mapping: quote the value"),
    ('baselines: {dd: {scratch: "{scratch}/"}}', 27, "write {scratch}/DIR"),
    ('baselines: {dd: {scratch: "{scratch}/.."}}', 27, "without `..`"),
    ('baselines: {dd: {scratch: "{filesystem}/x"}}', 27, "{filesystem} is not allowed in the dd scratch directory"),
    ('baselines: {dd: {scratch: "tmp"}}', 27, "expected an absolute path (or {scratch} or {scratch}/DIR)"),
])
def test_scratch_placeholder_bad_forms(write_yaml, line, col, needle):
    path = write_yaml(f"name: t\n{line}\n")
    p = only_problem(path)
    assert needle in p, p
    assert at(p, path, 2, col), p


def test_scratch_unquoted_in_a_flow_list_is_a_syntax_error_with_the_fix(write_yaml):
    path = write_yaml("""
        name: t
        matrix:
          sink: [/dev/null, {scratch}/recv.dat]
    """)
    p = only_problem(path)
    assert at(p, path, 3) and "YAML syntax error" in p
    assert p.endswith('quote a value that starts with a placeholder: "{scratch}/FILE"'), p


def test_scratch_problems_in_several_places_are_all_reported_with_lines(write_yaml):
    path = write_yaml("""
        name: t
        params:
          source: "{scratch}/../x"
        matrix:
          sink: [/dev/null, "/tmp/{scratch}"]
        include:
          - {sink: "{scratch}"}
    """)
    problems = problems_of(path)
    assert len(problems) == 3, problems
    assert at(problems[0], path, 3, 11) and "params.source" in problems[0]
    assert at(problems[1], path, 5, 21) and "matrix.sink[1]" in problems[1]
    assert at(problems[2], path, 7, 12) and "include[0].sink" in problems[2]
