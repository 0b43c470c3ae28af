"""Sources and sinks are judged on what was opened, not on their name (native/core/openpath.c).

The worker opens a source or a sink once, following no link in any component, and decides on the descriptor
(fstat: a regular file or an allowed device; fstatfs: a data filesystem). The race tests run the real worker
core in a child in its own network and mount namespaces (tests/safety/_openat_child.py): an escape would
change only that namespace's /proc/sys/net/ipv4/tcp_fin_timeout, and its mounts vanish with it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from fixtures_worker import needs_native, run_pair
from zcorch.errors import WorkerError
from zcorch.worker import native

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_openat_child.py")
RACE_ITERATIONS = 1500
LAYOUT_ITERATIONS = 2000
# a control tries its race until it escapes, for at most this long: idle, it escapes within a second; a machine
# busy with other tests gives the swapper fewer turns, and a fixed number of tries was once not enough
CONTROL_SECONDS = 120


def child(mode: str, d, *args: str, isolated: bool = True) -> dict:
    """Run _openat_child.py; `isolated`: in network and mount namespaces of its own (root)."""
    if isolated and shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) (util-linux)")
    p = subprocess.run([*(["unshare", "-n", "-m", "--"] if isolated else []), sys.executable, CHILD, mode, str(d),
                        *args], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


@needs_native
@pytest.mark.root
@pytest.mark.slow
def test_the_rename_race_never_reaches_proc_sys_or_dev_full(tmp_path):
    (tmp_path / "naive").mkdir()
    control = child("naive", tmp_path / "naive", str(CONTROL_SECONDS))
    print("control (check the name, then open):", control)
    # the harness is real: check-the-name-then-open loses this race (in the child's own network namespace)
    assert control["escaped"] and control["fin_after"] == "7", control
    (tmp_path / "w").mkdir()
    counts = child("race", tmp_path / "w", str(RACE_ITERATIONS))
    print("rename race:", counts)
    assert counts["iterations"] >= 500, counts
    assert counts["sink_escapes"] == 0 and counts["source_escapes"] == 0, counts
    assert counts["fin_after"] == counts["fin_before"], counts
    # the race was run both ways: a real directory opened, a swapped-in link refused
    assert counts["sink_opened"] > 0 and counts["sink_refused"] > 0, counts
    assert counts["source_opened"] > 0 and counts["source_refused"] > 0, counts
    # and the component walk a kernel without openat2 gets
    (tmp_path / "walk").mkdir()
    walk = child("walk", tmp_path / "walk", str(RACE_ITERATIONS * 4))
    print("rename race, component walk:", walk)
    assert walk["sink_escapes"] == 0 and walk["source_escapes"] == 0, walk
    assert walk["sink_opened"] > 0 and walk["sink_refused"] > 0, walk
    assert walk["source_opened"] > 0 and walk["source_refused"] > 0, walk


@needs_native
@pytest.mark.slow
def test_the_layout_never_writes_outside_its_directory_while_it_is_swapped_for_a_link(tmp_path):
    """`zcorch worker layout` creates and grows files beneath one descriptor of its directory, opened following
    no link: the directory swapped (renameat2 RENAME_EXCHANGE, in a loop) with a link to another directory
    never gets a byte written, created or replaced in that other directory."""
    (tmp_path / "naive").mkdir()
    control = child("naive-layout", tmp_path / "naive", str(CONTROL_SECONDS), isolated=False)
    print("layout control (check the name, then create):", control)
    # the harness is real: judging the directory's name, then creating by name, writes outside
    assert control["escaped"] and "new.dat" in control["outside"], control
    for how in ("openat2", "walk"):
        (tmp_path / how).mkdir()
        counts = child("layout", tmp_path / how, str(LAYOUT_ITERATIONS), *(["walk"] if how == "walk" else []),
                       isolated=False)
        print(f"layout rename race ({how}):", counts)
        assert counts["iterations"] >= 500, counts
        assert counts["escapes"] == 0 and counts["outside"] == ["victim.dat"], counts
        # the race was run both ways: the real directory written (new files, grown files), the link refused
        assert counts["created"] > 0 and counts["grown"] > 0 and counts["refused"] > 0, counts
        # (the component walk may see the link as "not a directory" when it is swapped back before it looks)
        assert all("symbolic link: refused" in why or "is not a directory" in why for why in counts["refusals"]), counts


@needs_native
def test_the_layout_refuses_a_link_in_any_component_and_says_what_a_device_is(tmp_path):
    from zcorch.worker.cli import layout

    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "real" / "lf").symlink_to(tmp_path / "elsewhere")
    for walk in (False, True):
        with pytest.raises(WorkerError, match="symbolic link: refused") as exc:
            layout(str(tmp_path / "link" / "f"), 4096, walk=walk)
        assert exc.value.code == 40
        with pytest.raises(WorkerError, match="exists and is a symbolic link: refused"):
            layout(str(tmp_path / "real" / "lf"), 4096, walk=walk)
        with pytest.raises(WorkerError, match="/no-dir does not exist"):
            layout(str(tmp_path / "no-dir" / "f"), 4096, walk=walk)
        with pytest.raises(WorkerError, match="is on proc, a kernel interface"):
            layout("/proc/sys/net/ipv4/zcorch-layout-test", 4096, walk=walk)
    assert list((tmp_path / "real").iterdir()) == [tmp_path / "real" / "lf"] and not (tmp_path / "elsewhere").exists()
    with pytest.raises(WorkerError, match="exists and is a character device"):
        layout("/dev/null", 4096)
    out = layout(str(tmp_path / "real" / "f"), 10000)
    assert out["created"] and (tmp_path / "real" / "f").read_bytes() == native.mem_pattern(0, 10000)


@needs_native
def test_the_layout_grows_only_a_short_pattern_file_of_its_own_user(tmp_path):
    from zcorch.worker.cli import layout

    mine, other, theirs = tmp_path / "mine", tmp_path / "other", tmp_path / "theirs"
    for f in (mine, theirs):
        f.write_bytes(native.mem_pattern(0, 4096))
    other.write_bytes(b"x" * 4096)
    if os.geteuid() == 0:
        os.chown(theirs, 65534, 65534)
    out = layout(str(mine), 8192, grow=True)
    assert out["created"] and out["grown_from"] == 4096 and mine.read_bytes() == native.mem_pattern(0, 8192)
    assert layout(str(other), 8192, grow=True)["created"] is False and other.read_bytes() == b"x" * 4096
    if os.geteuid() == 0:   # another user's file holding the pattern: never replaced
        assert layout(str(theirs), 8192, grow=True)["created"] is False and theirs.stat().st_size == 4096


@needs_native
@pytest.mark.root
def test_bind_mounted_kernel_paths_are_refused_on_their_filesystem_and_tmpfs_is_taken(tmp_path):
    v = child("mounts", tmp_path)
    for key in ("bind_dir_sink", "bind_file_sink", "bind_dir_sink_walk", "receiver_bind"):
        assert v[key].startswith("refused 1:") and "is on proc, a kernel interface" in v[key], (key, v[key])
    assert v["sysfs_source"].startswith("refused 1:") and "on sysfs" in v["sysfs_source"]
    assert v["dev_full_source"].startswith("refused 1:") and "character device (1:7)" in v["dev_full_source"]
    assert v["dev_zero_source"] == "opened"   # /dev/zero by its number, wherever its node is
    assert v["tmpfs_bytes"] == 1 << 20 and v["tmpfs_size"] == 1 << 20
    assert v["fin_changed"] is False


@needs_native
@pytest.mark.parametrize("walk", [False, True], ids=["openat2", "component-walk"])
def test_a_symlink_in_any_component_is_refused(tmp_path, walk):
    real = tmp_path / "real"
    real.mkdir()
    (real / "f").write_bytes(b"data")
    (tmp_path / "link").symlink_to(real)
    (real / "lf").symlink_to(real / "f")
    for path in (tmp_path / "link" / "f", real / "lf"):
        for what in ("source", "sink"):
            with pytest.raises(WorkerError) as exc:
                native.open_file(str(path), what, create=True, walk=walk)
            assert exc.value.code == 40 and "is a symbolic link: refused" in str(exc.value)   # ELOOP
    fd = native.open_file(str(real / "f"), "source", walk=walk)
    assert os.read(fd, 10) == b"data"
    os.close(fd)


@needs_native
def test_the_receiver_and_sender_refuse_a_linked_path_and_create_nothing_through_it(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(WorkerError, match="symbolic link"):
        native.Receiver("127.0.0.1", 0, "read", sink=str(tmp_path / "link" / "out"), bytes=4096, timeout=2)
    assert not (real / "out").exists()
    (real / "src").write_bytes(b"x" * 4096)
    with pytest.raises(WorkerError, match="symbolic link"):
        native.send("127.0.0.1", 1, "write", source=str(tmp_path / "link" / "src"), bytes=4096, timeout=2)


@needs_native
def test_a_regular_file_on_this_ext4_or_tmpfs_is_accepted_and_devices_by_number(tmp_path):
    sink = tmp_path / "sink"
    sink.write_bytes(b"old content that is truncated")
    _, got = run_pair("write", "read", send_kw=dict(source="mem", bytes=1 << 20), recv_kw=dict(sink=str(sink)))
    assert got["bytes"] == 1 << 20 and sink.stat().st_size == 1 << 20
    for path, what in (("/dev/null", "sink"), ("/dev/zero", "source"), ("/dev/urandom", "source")):
        os.close(native.open_file(path, what))
    with pytest.raises(WorkerError, match="not /dev/null: refused"):
        native.open_file("/dev/zero", "sink")
    os.close(native.open_file("/dev/zero", "sink", devices=True))   # --allow-device-sink
    with pytest.raises(WorkerError, match="is a directory"):
        native.open_file(str(tmp_path), "source")


@needs_native
def test_a_fifo_is_a_source_but_never_a_sink(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # as a sink, a FIFO would feed whatever program reads it: refused on its O_PATH descriptor, before any open
    with pytest.raises(WorkerError, match="neither a regular file nor one of the devices"):
        native.open_file(str(fifo), "sink")
    # as a source it is the user's own pipe (the open waits for a writer: this end holds one)
    writer = os.open(fifo, os.O_RDWR)
    try:
        os.close(native.open_file(str(fifo), "source"))
    finally:
        os.close(writer)


def test_the_worker_cli_reports_a_linked_sink_as_an_error_event(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    p = subprocess.run([sys.executable, "-m", "zcorch.worker", "recv", "--listen", "127.0.0.1:0", "--mode", "read",
                        "--sink", str(tmp_path / "link" / "out"), "--bytes", "4096"],
                       capture_output=True, text=True, timeout=60)
    event = json.loads(p.stdout.strip().splitlines()[-1])
    assert p.returncode == 1 and event["event"] == "error" and event["code"] == "ELOOP", p.stdout
    assert not (tmp_path / "real" / "out").exists()


def test_the_scratch_directory_is_handed_to_the_workers_as_its_real_path(tmp_path):
    """A workdir reached through a link (a linked /home) still works: the workers get the real path, in which a
    link put later is refused."""
    from zcorch.worker.remote import prepare_scratch

    (tmp_path / "real").mkdir()
    (tmp_path / "home").symlink_to(tmp_path / "real")
    info = prepare_scratch(str(tmp_path / "home" / "wd"), ["in"])
    assert "error" not in info and info["path"] == str(tmp_path / "real" / "wd" / "scratch"), info
    os.close(native.open_file(info["path"] + "/in/sink", "sink", create=True))
