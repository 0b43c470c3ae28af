"""The worker judges what a source, sink or command file is on its own host.

Real worker processes (`python -m zcorch.worker`) and real files, links and loop devices. A path with a link
in any component is refused as such (ELOOP: the worker follows none, tests/safety/test_safety_openat.py); a
path that names a kernel file or a device itself is refused on what was opened (EPERM), before any byte moves,
so nothing on this machine changes."""
from __future__ import annotations

import os
import stat
import subprocess

import pytest

from fixtures_fs import external_loop
from fixtures_worker import needs_native, parse_events, run_worker, worker_argv, worker_env
from test_guards import refused
from zcorch.worker import native

FIN_TIMEOUT = "/proc/sys/net/ipv4/tcp_fin_timeout"


def _refused(events: list, needle: str) -> bool:
    return len(events) == 1 and events[0]["event"] == "error" and events[0]["code"] == "EPERM" \
        and needle in events[0]["message"]


def _linked(events: list) -> bool:
    return len(events) == 1 and events[0]["event"] == "error" and events[0]["code"] == "ELOOP" \
        and "is a symbolic link: refused" in events[0]["message"]


@needs_native
def test_a_sink_under_proc_or_sys_is_refused_also_behind_a_link(tmp_path):
    before = open(FIN_TIMEOUT).read()
    link = tmp_path / "innocent"
    link.symlink_to(FIN_TIMEOUT)
    dir_link = tmp_path / "dir"
    dir_link.symlink_to("/proc/sys/net/ipv4")
    for sink in (FIN_TIMEOUT, str(link), f"{dir_link}/tcp_fin_timeout", "/proc/self/root/proc/sys/net/ipv4/x",
                 "/sys/kernel/mm/transparent_hugepage/enabled"):
        rc, events, _ = run_worker("recv", "--listen", "127.0.0.1:0", "--mode", "read", "--sink", sink,
                                   "--allow-device-sink")  # a device permission is no permission for /proc
        direct = not sink.startswith((str(tmp_path), "/proc/self"))
        assert rc == 1 and (_refused(events, "kernel interface") if direct else _linked(events)), (sink, events)
    assert open(FIN_TIMEOUT).read() == before


@needs_native
def test_a_source_under_proc_is_refused(tmp_path):
    link = tmp_path / "src"
    link.symlink_to("/proc/self/environ")
    rc, events, _ = run_worker("send", "--connect", "127.0.0.1:9", "--mode", "write", "--source", "/proc/1/environ")
    assert rc == 1 and _refused(events, "kernel interface"), events
    for source in ("/proc/self/environ", str(link)):   # /proc/self is a link itself
        rc, events, _ = run_worker("send", "--connect", "127.0.0.1:9", "--mode", "write", "--source", source)
        assert rc == 1 and _linked(events), events


@pytest.mark.root
@needs_native
def test_a_source_that_resolves_to_a_block_device_is_refused(tmp_path):
    """A symlink, /proc/self/root/dev/..., and /dev/fd/N all reach the loop device: none is read."""
    with external_loop(str(tmp_path), "1MiB") as dev:
        link = tmp_path / "looks-like-a-file"
        link.symlink_to(dev)
        rc, events, _ = run_worker("send", "--connect", "127.0.0.1:9", "--mode", "write", "--source", dev)
        assert rc == 1 and _refused(events, "block device"), (dev, events)
        for source in (str(link), f"/proc/self/root{dev}"):
            rc, events, _ = run_worker("send", "--connect", "127.0.0.1:9", "--mode", "write", "--source", source)
            assert rc == 1 and _linked(events), (source, events)
        fd = os.open(dev, os.O_RDONLY)
        try:
            p = subprocess.run(worker_argv("send", "--connect", "127.0.0.1:9", "--mode", "write", "--source",
                                           f"/dev/fd/{fd}"), env=worker_env(), capture_output=True, text=True,
                               timeout=30, pass_fds=(fd,))
        finally:
            os.close(fd)
        assert p.returncode == 1 and _linked(parse_events(p.stdout)), p.stdout
        # the allowed devices stay allowed under another name: a node of the same number (not a link)
        zero = tmp_path / "zero"
        os.mknod(zero, 0o600 | stat.S_IFCHR, os.makedev(1, 5))
        fd = native.open_file(str(zero), "source")
        assert os.read(fd, 4) == bytes(4)
        os.close(fd)


def test_command_files_are_checked_too(tmp_path):
    link = tmp_path / "out"
    link.symlink_to(FIN_TIMEOUT)
    rc, events, _ = run_worker("command", "--stdout", str(link), "--", "true")
    assert rc == 1 and _linked(events), events
    rc, events, _ = run_worker("command", "--stdout", FIN_TIMEOUT, "--", "true")
    assert rc == 1 and _refused(events, "kernel interface"), events
    rc, events, _ = run_worker("command", "--stdin", "/dev/full", "--", "true")
    assert rc == 1 and _refused(events, "character device (1:7)"), events
    rc, events, _ = run_worker("layout", "--path", "/proc/sys/net/ipv4/tcp_fin_timeout", "--bytes", "2")
    assert rc == 1 and _refused(events, "kernel interface"), events


@pytest.mark.parametrize("text,key", [
    ("params: {sink: /proc/sys/net/ipv4/tcp_fin_timeout}", "params.sink"),
    ("params: {sink: //proc/./sys/vm/x}", "params.sink"),
    ("params: {sink: /tmp/../sys/kernel/x}", "params.sink"),
    ("params: {source: /proc/kcore}", "params.source"),
    ("matrix: {sink: [/tmp/a, /sys/x]}", "matrix.sink[1]"),
    ("baselines: {dd: {scratch: /proc/sys}}", "baselines.dd.scratch"),
    ("filesystems: {k: {path: /proc/sys/net/ipv4}}", "filesystems.k.path"),
    ("filesystems: {k: {fs: ext4, loop: {size: 1GiB}, mountpoint: /sys/kernel}}", "filesystems.k.mountpoint"),
    ("filesystems: {k: {fs: ext4, loop: {size: 1GiB, dir: //proc/x}}}", "filesystems.k.loop.dir"),
])
def test_proc_and_sys_paths_are_refused_at_plan(write_yaml, text, key):
    path = write_yaml(f"name: t\n{text}\n")
    problems = refused(path)
    assert len(problems) == 1 and f"{path}:2:" in problems[0] and f" {key}: " in problems[0], problems
    assert "kernel settings" in problems[0] or "kernel interfaces" in problems[0]
