"""An experiment file can put no device, file or result at risk: refused by `zcorch plan` (exit 2, file:line:col)."""
from __future__ import annotations

import resource
import subprocess
import time

import pytest

from fixtures_analysis import zcorch_cli
from fixtures_fs import external_loop
from fixtures_spec import at
from fixtures_worker import needs_native, run_worker, start_receiver
from zcorch.config.experiment import load_experiment
from zcorch.errors import ConfigError


def plan_cli(path: str) -> subprocess.CompletedProcess:
    """The real `zcorch plan FILE` command, called in this process (its exit status, stdout and stderr as a
    process of its own would give them)."""
    return zcorch_cli("plan", path)


def refused(path: str) -> "list[str]":
    """The problem lines of a refused file (exit status 2, no traceback, nothing on stdout)."""
    r = plan_cli(path)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and r.stdout == ""
    return [line[line.index(path):] for line in r.stderr.splitlines() if path in line]


# ---------------------------------------------------------------- 1. mkfs/mount options name no device

@pytest.mark.parametrize("entry,key", [
    ('{fs: btrfs, loop: {size: 1GiB}, mkfs_options: ["/dev/sda"]}', "mkfs_options[0]"),
    ('{fs: xfs, loop: {size: 1GiB}, mkfs_options: ["-l", "logdev=/dev/sdb,size=10m"]}', "mkfs_options[1]"),
    ('{fs: xfs, loop: {size: 1GiB}, mkfs_options: ["-l", "size=10m,logdev=sdb"]}', "mkfs_options[1]"),
    ('{fs: xfs, loop: {size: 1GiB}, mkfs_options: ["-r", "rtdev=sdb"]}', "mkfs_options[1]"),
    ('{fs: ext4, loop: {size: 1GiB}, mkfs_options: ["-J", "device=UUID=1234"]}', "mkfs_options[1]"),
    ('{fs: ext4, loop: {size: 1GiB}, mkfs_options: ["-O", "journal_dev"]}', "mkfs_options[1]"),
    ('{fs: ext4, loop: {size: 1GiB}, mkfs_options: ["-d", "../../etc"]}', "mkfs_options[1]"),
    ('{fs: btrfs, loop: {size: 1GiB}, mount_options: ["device=/dev/sdb"]}', "mount_options[0]"),
    ('{fs: xfs, loop: {size: 1GiB}, mount_options: ["logdev=sdb"]}', "mount_options[0]"),
    ('{fs: ext4, loop: {size: 1GiB}, mount_options: ["loop"]}', "mount_options[0]"),
    ('{fs: ext4, loop: {size: 1GiB}, mount_options: ["offset=4096"]}', "mount_options[0]"),
])
def test_options_may_not_name_a_device(write_yaml, entry, key):
    path = write_yaml(f"name: t\nfilesystems:\n  one: {entry}\n")
    problems = refused(path)
    assert len(problems) == 1 and at(problems[0], path, 3), problems
    assert f"filesystems.one.{key}" in problems[0] and "may not name a device" in problems[0]


def test_ordinary_options_still_pass(write_yaml):
    path = write_yaml("""
        name: t
        filesystems:
          x: {fs: xfs, loop: {size: 1GiB}, mkfs_options: ["-d", "su=64k,sw=4", "-l", "size=64m"],
              mount_options: [noatime, "logbsize=256k"]}
          e: {fs: ext4, loop: {size: 1GiB}, mkfs_options: ["-b", "4096", "-E", "stride=16"], mount_options: [nodelalloc]}
    """)
    assert plan_cli(path).returncode == 0


# ---------------------------------------------------------------- 2. no device sink, dd scratch, odd source

@pytest.mark.parametrize("text,line,key,needle", [
    ("params: {sink: /dev/vda}", 2, "params.sink", "the sink may only be /dev/null or a device listed"),
    ("params: {sink: //dev/./vda}", 2, "params.sink", "under /dev"),
    ("params: {sink: /dev/shm/../vda}", 2, "params.sink", "under /dev"),
    ("matrix: {sink: [/dev/null, /dev/sdb]}", 2, "matrix.sink[1]", "under /dev"),
    ("params: {sink: /dev/sdb}\nallow_destroy: [/dev/sdc]", 2, "params.sink", "under /dev"),
    ("params: {source: /dev/sda}", 2, "params.source", "the source may only be /dev/zero, /dev/null, /dev/urandom"),
    ("baselines: {dd: {scratch: /dev}}", 2, "baselines.dd.scratch", "must be a real directory"),
    ("baselines: {dd: {scratch: /dev/shm}}", 2, "baselines.dd.scratch", "must be a real directory"),
    ("allow_destroy: [sda]", 2, "allow_destroy[0]", "expected a device path under /dev/"),
    ("allow_destroy: /dev/sda", 2, "allow_destroy", "expected a list of device paths"),
])
def test_device_paths_are_refused(write_yaml, text, line, key, needle):
    path = write_yaml(f"name: t\n{text}\n")
    problems = refused(path)
    assert len(problems) == 1 and at(problems[0], path, line), problems
    assert f" {key}: " in problems[0] and needle in problems[0], problems


def test_allow_destroy_lets_a_listed_device_be_the_sink(write_yaml):
    path = write_yaml("name: t\nallow_destroy: [/dev/sdb]\nparams: {sink: /dev/sdb, source: /dev/zero}\n")
    exp = load_experiment(path)
    assert exp.allow_destroy == ("/dev/sdb",) and exp.params["sink"] == "/dev/sdb"
    assert plan_cli(write_yaml("name: t\nparams: {sink: /dev/null, source: /dev/urandom}\n", "b.yaml")).returncode == 0


@pytest.mark.root
@needs_native
def test_worker_refuses_a_device_sink_unless_allowed(tmp_path):
    """A real loop device (also behind a symlink, even allowed) and /dev/zero: refused; the device is not written."""
    with external_loop(str(tmp_path), "1MiB") as dev:
        link = tmp_path / "innocent-file"
        link.symlink_to(dev)
        for sink in (dev, "/dev/zero"):
            rc, events, _ = run_worker("recv", "--listen", "127.0.0.1:0", "--mode", "read", "--sink", sink)
            assert rc == 1 and events[0]["code"] == "EPERM" and "not /dev/null: refused" in events[0]["message"]
        # behind a link: the worker follows no link in a sink's path (tests/safety/test_safety_openat.py)
        rc, events, _ = run_worker("recv", "--listen", "127.0.0.1:0", "--mode", "read", "--sink", str(link),
                                   "--allow-device-sink")
        assert rc == 1 and events[0]["code"] == "ELOOP" and "symbolic link" in events[0]["message"]
        with open(dev, "rb") as f:
            assert f.read(1 << 20) == bytes(1 << 20)  # untouched
    rx, _ = start_receiver("--listen", "127.0.0.1:0", "--mode", "read", "--sink", "/dev/zero",
                           "--allow-device-sink")  # allowed: it starts
    rx.close()
    rx, _ = start_receiver("--listen", "127.0.0.1:0", "--mode", "read", "--sink", "/dev/null")
    rx.close()


# ---------------------------------------------------------------- 3. caps: counted before expanding

TEN = "[" + ", ".join(str(4096 * (i + 1)) for i in range(10)) + "]"


def test_a_ten_million_cell_matrix_is_refused_in_under_a_second(write_yaml):
    path = write_yaml(f"""
        name: t
        matrix:
          bytes: {TEN}
          buffer: {TEN}
          window: {TEN}
          pipe_size: {TEN}
          subblocks: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
          send_cpu: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
          recv_cpu: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    """)
    t0 = time.monotonic()
    with pytest.raises(ConfigError):  # in-process: the command's interpreter start-up is not the check's time
        load_experiment(path)
    assert time.monotonic() - t0 < 1.0
    problems = refused(path)
    assert len(problems) == 1 and at(problems[0], path, 2), problems
    assert "matrix: 10000000 cells × 1 repeats = 10000000 runs, more than the limit of 1000000" in problems[0]


@pytest.mark.parametrize("text,line,key,needle", [
    ("repeats: 100000000", 2, "repeats", "expected an integer between 1 and 10000"),
    ("repeats: 2000\nmatrix: {buffer: " + TEN + ", window: " + TEN + ", subblocks: [1, 2, 3, 4, 5, 6]}", 3, "matrix",
     "600 cells × 2000 repeats = 1200000 runs, more than the limit of 1000000"),
    ("params: {timeout: 10000000000000000000s}", 2, "params.timeout",
     "expected a duration between 0.001s and 604800s, got 1e+19s"),
    ("params: {timeout: " + "9" * 400 + "}", 2, "params.timeout",  # float('9'*400) is inf
     "expected a duration between 0.001s and 604800s, got infs"),
    ("params: {timeout: 8d}", 2, "params.timeout", "not a duration"),
    ("matrix: {timeout: [1s, 169h]}", 2, "matrix.timeout[1]", "expected a duration between 0.001s and 604800s"),
    ("params: {bytes: 4611686018427387905}", 2, "params.bytes",
     "expected a size between 1 and 4611686018427387904 bytes (4194304TiB), got 4611686018427387905"),
    ("params: {bytes: 99999999999TiB}", 2, "params.bytes", "expected a size between 1 and 4611686018427387904 bytes"),
    ("baselines: {iperf3: {duration: 700000s}}", 2, "baselines.iperf3.duration", "too long"),
    ("filesystems: {x: {fs: ext4, loop: {size: 9999999TiB}}}", 2, "filesystems.x.loop.size", "too large"),
])
def test_caps_are_refused_with_the_limit(write_yaml, text, line, key, needle):
    path = write_yaml(f"name: t\n{text}\n")
    # the CPU the command used (in this process), not the wall clock: a busy machine stretches the wall time
    # of any command, while a cap that expanded the matrix (or looped to a huge count) first would cost CPU
    before = resource.getrusage(resource.RUSAGE_SELF)
    problems = refused(path)
    after = resource.getrusage(resource.RUSAGE_SELF)
    assert (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime) < 5.0
    assert len(problems) == 1 and at(problems[0], path, line), problems
    assert f" {key}: " in problems[0] and needle in problems[0], problems


def test_largest_allowed_values_plan(write_yaml):
    path = write_yaml("name: t\nrepeats: 10000\nparams: {timeout: 168h, bytes: 4611686018427387904}\n")
    r = plan_cli(path)
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------- 4. dd's file: per-user scratch, bounded

def test_dd_defaults_to_the_scratch_directory_and_is_bounded(write_yaml):
    assert load_experiment(write_yaml("name: t\n")).baselines.dd.scratch == "{scratch}"
    path = write_yaml("name: t\nbaselines:\n  dd: {bs: 1MiB, count: 100000}\n", "big.yaml")
    problems = refused(path)
    assert len(problems) == 1 and at(problems[0], path, 3), problems
    assert " baselines.dd.count: bs × count = 104857600000 bytes, more than the limit of 68719476736" in problems[0]


@needs_native
@pytest.mark.root
def test_a_device_listed_in_allow_destroy_is_written_by_a_real_sweep(tmp_path, monkeypatch):
    """`allow_destroy:` is honoured end to end: the runner tells the worker the device sink was allowed."""
    from zcorch.sweep.pipeline import run_sweep
    from zcorch.worker.native import mem_pattern

    monkeypatch.chdir(tmp_path)
    with external_loop(str(tmp_path), "2MiB") as dev:
        exp = tmp_path / "dev.yaml"
        exp.write_text(f"name: dev\nallow_destroy: [{dev}]\nbaselines: false\n"
                       f"params: {{bytes: 1MiB, sink: {dev}, source: mem, timeout: 20s}}\n")
        result = run_sweep(str(exp), output=str(tmp_path / "out"))
        assert result.exit_status == 0, [r.get("reason") for r in result.records]
        with open(dev, "rb") as f:
            assert f.read(1 << 20) == mem_pattern(0, 1 << 20)
