"""zcorch.worker.remote (the jobs run on hosts) and provision.remote_call (how they are run, with which python).

Each function is called directly on real files, sockets and loop devices; the command line is run as the
hosts run it: `python -m zcorch.worker.remote` (localhost), the file's text on stdin (remote hosts) and as
a plain file with `python -S`.
"""
from __future__ import annotations

import json
import dataclasses
import os
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid

import pytest

from conftest import can_drop_caches
from fixtures_fs import external_loop
from zcorch.config.baselines import DdBaseline
from zcorch.config.hosts import HostSpec
from zcorch.hosts.interpreter import python_argv
from zcorch.hosts.local import LocalHost
from zcorch.provision import deploy, remote_call, scratch
from zcorch.provision.fs_probe import device_problems
from zcorch.sweep import baselines as bl
from zcorch.sweep import metadata
from zcorch.worker import remote

MODULE_FILE = remote.__file__


def _cli(*args: str, input: str | None = None, argv0: list | None = None) -> subprocess.CompletedProcess:
    """`python -m zcorch.worker.remote ARGS` with the checkout importable, as LocalHost runs it."""
    return subprocess.run([*(argv0 or [sys.executable, "-m", "zcorch.worker.remote"]), *args], input=input,
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=remote_call.PACKAGE_PARENT))


def _listening_socket(address: str = "127.0.0.1") -> socket.socket:
    s = socket.socket()
    s.bind((address, 0))
    s.listen()
    return s


# -- preflight -----------------------------------------------------------------------------------
def test_preflight_facts_see_a_real_listener_and_a_foreign_address():
    busy = _listening_socket()
    busy_port = busy.getsockname()[1]
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    free_port = free.getsockname()[1]
    free.close()
    try:
        facts = remote.preflight_facts("127.0.0.1", [busy_port, free_port])
    finally:
        busy.close()
    assert facts["python"] == list(sys.version_info[:3]) and facts["executable"] == sys.executable
    import cffi

    assert facts["cffi"] == cffi.__version__ and facts["address_error"] is None
    assert [p for p, _ in facts["busy_ports"]] == [busy_port]
    assert "Address already in use" in facts["busy_ports"][0][1]
    # TEST-NET-1 is nobody's address: nothing can bind it, and ports are then not tried.
    facts = remote.preflight_facts("192.0.2.77", [free_port])
    assert facts["address_error"] and facts["busy_ports"] == []


def test_preflight_port_in_time_wait_is_free_but_a_listener_is_busy():
    """Back-to-back sweeps: the previous iperf3 server's closed connection sits in TIME_WAIT for a
    minute; it must not read as a listener (a real one still must)."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as iperf3's server does
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = server.accept()
    assert remote.preflight_facts("127.0.0.1", [port])["busy_ports"][0][0] == port   # listening: busy
    server.close()
    conn.close()                 # the server side closes first: its end goes to TIME_WAIT
    client.recv(1)               # reads the FIN, so the close below completes the handshake
    client.close()
    time.sleep(0.2)
    states = subprocess.run(["ss", "-Htan", "state", "time-wait", f"sport = :{port}"],
                            capture_output=True, text=True).stdout
    assert f":{port} " in states, "no real TIME_WAIT on the port: the test proves nothing"
    assert remote.preflight_facts("127.0.0.1", [port])["busy_ports"] == []


def test_cffi_backend_dir_is_where_python_finds_it():
    import _cffi_backend

    assert remote.cffi_backend_dir() == os.path.dirname(os.path.abspath(_cffi_backend.__file__))


# -- finalize (deploy) ----------------------------------------------------------------------------
def _build(parent, name: str, with_so: bool = True, age: float = 0.0, marker: str | None = None) -> str:
    d = parent / name
    (d / "zcorch").mkdir(parents=True)
    if with_so:
        (d / "zcorch" / "_native.abi3.so").write_bytes(b"\x7fELF")
    if marker:
        (d / marker).write_text("{}")
    if age:
        t = time.time() - age
        os.utime(d, (t, t))
    return str(d)


def _hex(i: int, n: int = 16) -> str:
    return f"{i:0{n}x}"


def test_finalize_marks_renames_and_prunes_old_builds(tmp_path):
    M = ".zcorch-deployed"
    olds = [_build(tmp_path, f"worker-{_hex(i)}", age=100 * (i + 1), marker=M) for i in range(3)]   # [0] newest
    stale_tmp = _build(tmp_path, f".tmp-worker-{_hex(7)}-{_hex(1, 8)}", age=7200)
    fresh_tmp = _build(tmp_path, f".tmp-worker-{_hex(8)}-{_hex(2, 8)}")                # another deploy's
    tmp = _build(tmp_path, f".tmp-worker-{_hex(9)}-{_hex(3, 8)}")
    final = str(tmp_path / f"worker-{_hex(9)}")
    remote.finalize_build(tmp, final, M, '{"hash": "abc"}', keep=2)
    with open(os.path.join(final, M)) as f:
        assert f.read() == '{"hash": "abc"}'
    assert not os.path.exists(tmp) and os.path.isfile(os.path.join(final, "zcorch", "_native.abi3.so"))
    assert os.path.isdir(olds[0]) and not os.path.exists(olds[1]) and not os.path.exists(olds[2])  # keep=2
    assert not os.path.exists(stale_tmp) and os.path.isdir(fresh_tmp)


def test_finalize_prunes_only_its_own_marked_builds(tmp_path):
    """workdir "~": a user's worker-* and .tmp-worker-* directories beside the builds are not ours."""
    M = ".zcorch-deployed"
    photos = tmp_path / "worker-photos"
    photos.mkdir()
    (photos / "img.jpg").write_bytes(b"jpeg")
    os.utime(photos, (1, 1))                                             # older than every build
    unmarked = _build(tmp_path, f"worker-{_hex(0xabc)}", age=5000)      # our name, no marker
    upper = _build(tmp_path, "worker-0000000000000ABC", age=5000, marker=M)   # marked, not our hex pattern
    notes = _build(tmp_path, ".tmp-worker-notes", age=99999)
    olds = [_build(tmp_path, f"worker-{_hex(i)}", age=1000 * (i + 1), marker=M) for i in range(3)]
    tmp = _build(tmp_path, f".tmp-worker-{_hex(9)}-{_hex(3, 8)}")
    remote.finalize_build(tmp, str(tmp_path / f"worker-{_hex(9)}"), M, "{}", keep=1)
    assert (photos / "img.jpg").read_bytes() == b"jpeg"
    assert os.path.isdir(unmarked) and os.path.isdir(upper) and os.path.isdir(notes)
    assert not any(os.path.exists(o) for o in olds)                     # ours, marked, beyond keep=1


def test_finalize_refuses_a_workdir_or_build_another_user_can_change(tmp_path):
    M = ".zcorch-deployed"
    wd = tmp_path / "shared"
    wd.mkdir()
    wd.chmod(0o777)                                                     # chmod o+w: anyone could swap the build
    mine = _build(wd, f"worker-{_hex(1)}", age=5000, marker=M)
    tmp = _build(wd, f".tmp-worker-{_hex(9)}-{_hex(3, 8)}")
    with pytest.raises(remote.ActionError, match=f"{wd} is writable by group or others .* chmod go-w {wd}"):
        remote.finalize_build(tmp, str(wd / f"worker-{_hex(9)}"), M, "{}", keep=1)
    assert os.path.isdir(mine)                                          # nothing pruned in an untrusted place
    wd.chmod(0o755)
    remote.check_private_dirs([str(wd), mine])
    if os.geteuid() == 0:
        os.chown(mine, 65534, 65534)
        r = _cli("private-dirs", str(wd), mine)
        assert r.returncode == 1 and f"{mine} is owned by uid 65534, not by uid 0 who runs zcorch" in r.stderr


def test_preflight_reads_the_build_marker_only_after_the_build_passed_the_checks(tmp_path):
    """`preflight --build WORKDIR NAME MARKER`: the deploy's `~` expansion, marker read and private-build
    check in the preflight's round trip. No marker: a build is due; a marker in a build another user can
    change is not read, and the refusal is private-build's own message; a clean one is read."""
    M = ".zcorch-deployed"
    wd = tmp_path / "wd"
    wd.mkdir(mode=0o755)
    build = wd / f"worker-{_hex(5)}"

    def state():
        r = _cli("preflight", "127.0.0.1", "--tool", "sh", "--build", str(wd), build.name, M)
        assert r.returncode == 0, r.stderr
        facts = json.loads(r.stdout)
        assert facts["tools"]["sh"] and facts["address_error"] is None   # the rest of the probe as before
        return facts["build"]

    assert state() == {"workdir": str(wd), "path": str(build), "marker": None, "refused": None}
    _build(wd, build.name)
    (build / M).write_text('{"hash": "h"}')
    for d in (build, build / "zcorch"):
        d.chmod(0o755)
    (build / "zcorch" / "_native.abi3.so").chmod(0o644)
    (build / M).chmod(0o644)
    assert state() == {"workdir": str(wd), "path": str(build), "marker": '{"hash": "h"}', "refused": None}
    (build / "zcorch" / "_native.abi3.so").chmod(0o666)
    got = state()
    alone = _cli("private-build", str(wd), str(build))
    assert alone.returncode == 1 and got["marker"] is None
    assert got["refused"] == alone.stderr.strip() and "_native.abi3.so is writable by group or others" in got["refused"]
    (build / "zcorch" / "_native.abi3.so").chmod(0o644)
    (build / "zcorch" / "planted.py").symlink_to(tmp_path / "elsewhere.py")
    assert "planted.py is a symlink" in state()["refused"]
    r = _cli("preflight", "127.0.0.1", "--build", str(wd), build.name)
    assert r.returncode == 2 and "--build WORKDIR NAME MARKER must be the last arguments" in r.stderr
    # a tool may be named like the flag: --build is the fourth argument from the end, whatever came before
    r = _cli("preflight", "127.0.0.1", "--tool", "--build", "--build", str(wd), build.name, M)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["build"]["path"] == str(build) and "--build" in json.loads(r.stdout)["tools"]
    r = _cli("preflight", "127.0.0.1", "--build", str(wd), "../etc", M)          # only a build's own name
    assert r.returncode == 1 and "is not the name of a worker build" in r.stderr
    home = tmp_path / "home"
    (home / "wd").mkdir(parents=True)
    r = subprocess.run([sys.executable, "-m", "zcorch.worker.remote", "preflight", "127.0.0.1", "--build", "~/wd",
                        build.name, M], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=remote_call.PACKAGE_PARENT, HOME=str(home)))
    assert json.loads(r.stdout)["build"]["path"] == str(home / "wd" / build.name)   # `~` of the host


def test_finalize_replaces_an_incomplete_directory_and_loses_a_race_gracefully(tmp_path):
    final = _build(tmp_path, "worker-h")            # same name, no marker: not trusted
    (tmp_path / "worker-h" / "junk").write_text("x")
    remote.finalize_build(_build(tmp_path, ".tmp-worker-h-1"), final, "M", "one", keep=3)
    assert not os.path.exists(os.path.join(final, "junk")) and open(os.path.join(final, "M")).read() == "one"
    # A concurrent deploy of the same hash finished first: ours is dropped, theirs stays.
    loser = _build(tmp_path, ".tmp-worker-h-2")
    remote.finalize_build(loser, final, "M", "two", keep=3)
    assert not os.path.exists(loser) and open(os.path.join(final, "M")).read() == "one"


def test_finalize_refuses_a_build_without_the_native_module(tmp_path):
    tmp = _build(tmp_path, ".tmp-worker-x-1", with_so=False)
    with pytest.raises(remote.ActionError, match="produced no zcorch/_native"):
        remote.finalize_build(tmp, str(tmp_path / "worker-x"), "M", "t", keep=3)
    assert not os.path.exists(tmp_path / "worker-x")
    r = _cli("finalize", tmp, str(tmp_path / "worker-x"), "M", "t", "3")
    assert r.returncode == 1 and "finalize: the build printed no error but produced no zcorch/_native" in r.stderr


# -- metadata ---------------------------------------------------------------------------------------
def test_host_metadata_records_why_a_value_is_null(tmp_path):
    meta = remote.host_metadata("127.0.0.1", str(tmp_path / "a" / "b"), ["net.core.rmem_max", "no.such.sysctl"])
    with open("/proc/sys/net/core/rmem_max") as f:
        assert meta["sysctls"]["net.core.rmem_max"] == f.read().strip()
    assert meta["sysctls"]["no.such.sysctl"] is None
    assert "/proc/sys/no/such/sysctl" in meta["why_null"]["sysctls.no.such.sysctl"]
    assert meta["sink_path"] == str(tmp_path / "a" / "b") and meta["sink_mount"]["target"]
    assert meta["interface"]["name"] == "lo" and meta["euid"] == os.geteuid()
    assert meta["python"]["executable"] == sys.executable
    assert remote.host_metadata("127.0.0.1", "", [])["sink_mount"] is None   # no sink path: nothing probed


# -- scratch --------------------------------------------------------------------------------------
def test_prepare_scratch_is_0700_whatever_the_umask(tmp_path):
    old = os.umask(0o000)
    try:
        info = remote.prepare_scratch(str(tmp_path / "wd"), ["a/b"])
    finally:
        os.umask(old)
    path = tmp_path / "wd" / "scratch"
    assert info == {"path": str(path), "created": True, "mode": "0700"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o700 and (path / "a" / "b").is_dir()
    assert remote.prepare_scratch(str(tmp_path / "wd"))["created"] is False


def test_prepare_scratch_reports_what_is_in_the_way(tmp_path):
    (tmp_path / "file").write_text("x")
    info = remote.prepare_scratch(str(tmp_path / "file" / "wd"))       # under a file
    assert info["error"].startswith("cannot be created:") and "Not a directory" in info["error"]
    (tmp_path / "wd").mkdir()
    (tmp_path / "wd" / "scratch").write_text("x")
    assert remote.prepare_scratch(str(tmp_path / "wd"))["error"] == "exists and is not a directory"


def test_prepare_scratch_expands_home_on_the_host(tmp_path):
    r = subprocess.run([sys.executable, "-m", "zcorch.worker.remote", "scratch", "~/wd"], capture_output=True,
                       text=True, env=dict(os.environ, HOME=str(tmp_path), PYTHONPATH=remote_call.PACKAGE_PARENT))
    assert r.returncode == 0 and json.loads(r.stdout)["path"] == str(tmp_path / "wd" / "scratch")


# -- dd -----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_dd_baseline_times_write_and_read_and_removes_its_file(tmp_path):
    out = remote.dd_baseline(str(tmp_path), "4096", "8")
    assert out["path"].startswith(str(tmp_path)) and os.listdir(tmp_path) == []
    assert out["write"]["returncode"] == 0 and "32768 bytes" in out["write"]["stderr"]
    assert out["write"]["wall_s"] > 0 and out["write"]["argv"][0] == "dd"
    assert out["read"]["returncode"] == 0 and "32768 bytes" in out["read"]["stderr"]
    assert out["read"]["cached"] is not can_drop_caches()
    parsed = bl.parse_dd_wrapper(json.dumps(out))   # the controller's parser reads it as is
    assert parsed["dd_write"]["bytes"] == parsed["dd_read"]["bytes"] == 32768


def test_dd_baseline_into_a_missing_directory_reports_dd_and_skips_the_read(tmp_path):
    out = remote.dd_baseline(str(tmp_path / "nope"), "4096", "1")
    assert out["write"]["returncode"] != 0 and "No such file or directory" in out["write"]["stderr"]
    assert "read" not in out


def test_dd_baseline_names_its_file_at_random_and_never_takes_an_existing_one(tmp_path):
    a, b = remote.dd_baseline(str(tmp_path), "4096", "1"), remote.dd_baseline(str(tmp_path), "4096", "1")
    assert a["path"] != b["path"] and os.listdir(tmp_path) == []
    assert "conv=notrunc" in a["write"]["argv"]
    assert remote.dd_write_argv("/x/f", 4096, 1)[-1] == "conv=notrunc"  # the dry run shows the same command


@pytest.mark.root
def test_dd_baseline_refuses_what_does_not_fit_the_free_space(tmp_path):
    """A real 1MiB tmpfs: 4MiB is not written at all (before: dd filled it, ENOSPC)."""
    d = tmp_path / "small"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "zcorch-test", str(d)], check=True)
    try:
        out = remote.dd_baseline(str(d), str(1 << 20), "4")
        assert out["write"]["returncode"] == 1 and "do not fit" in out["write"]["stderr"], out
        assert "read" not in out and os.listdir(d) == []
        parsed = bl.parse_dd_wrapper(json.dumps(out))["dd_write"]  # the controller's record says why
        assert isinstance(parsed, bl.BaselineError) and "do not fit" in str(parsed)
    finally:
        subprocess.run(["umount", str(d)], check=True)


def test_a_signal_while_dd_is_being_started_kills_that_dd(tmp_path, monkeypatch):
    """The race a loaded host gives now and then, made certain: the job's SIGTERM arrives while Popen is
    still starting dd (a wrapper around the real Popen sends it from inside; no real part times a signal
    there on demand). The job ends with 143 and its dd with it, the file removed."""
    started = []

    class SignalledWhileStarting(subprocess.Popen):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            started.append(self.pid)
            os.kill(os.getpid(), signal.SIGTERM)   # handled before __init__ returns

    monkeypatch.setattr(remote.subprocess, "Popen", SignalledWhileStarting)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    with pytest.raises(SystemExit) as ei:
        remote.dd_baseline(str(tmp_path), "1", "50000000", sync=False)
    assert ei.value.code == 128 + signal.SIGTERM and len(started) == 1
    with pytest.raises(ChildProcessError):   # reaped: killed, not left writing
        os.waitpid(started[0], os.WNOHANG)
    assert os.listdir(tmp_path) == []
    assert {s: signal.getsignal(s) for s in handlers} == handlers


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_dd_job_removes_its_file_when_terminated(tmp_path, sig):
    """The controller's timeout ends the job with a signal: dd dies and the file goes with it."""
    p = subprocess.Popen([sys.executable, "-m", "zcorch.worker.remote", "dd", str(tmp_path), "1", "50000000"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                         env=dict(os.environ, PYTHONPATH=remote_call.PACKAGE_PARENT))
    try:
        deadline = time.monotonic() + 20
        while not any(os.path.getsize(tmp_path / f) for f in os.listdir(tmp_path)):  # dd is writing
            assert time.monotonic() < deadline and p.poll() is None
            time.sleep(0.05)
        p.send_signal(sig)
        assert p.wait(timeout=10) != 0
        assert os.listdir(tmp_path) == []
        # dd did not outlive the job: its process group empties (up to 30 s: a killed dd on a loaded machine
        # may take seconds to leave a write); what is left is named
        deadline = time.monotonic() + 30
        with pytest.raises(ProcessLookupError):
            while time.monotonic() < deadline:
                os.killpg(p.pid, 0)
                time.sleep(0.1)
            print(subprocess.run(["ps", "-o", "pid,stat,wchan:20,args", "-g", str(p.pid)], capture_output=True,
                                 text=True).stdout)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


# -- loop devices -----------------------------------------------------------------------------------
def test_loop_functions_fail_with_oserror_on_what_is_not_a_loop_device(tmp_path):
    f = tmp_path / "plain"
    f.write_bytes(b"x")
    with pytest.raises(OSError):           # LOOP_GET_STATUS64 on a regular file: ENOTTY
        remote.set_loop_autoclear([str(f)])
    with pytest.raises(FileNotFoundError):
        remote.open_exclusive(str(tmp_path / "missing"))
    r = _cli("loop-autoclear", str(f))
    assert r.returncode == 1 and r.stderr.startswith("loop-autoclear: [Errno 25]")


@pytest.mark.root
def test_open_exclusive_sees_an_exclusive_holder(tmp_path):
    with external_loop(str(tmp_path)) as dev:
        remote.open_exclusive(dev)                                 # nobody holds it
        holder = os.open(dev, os.O_RDONLY | os.O_EXCL)             # as a mount or md member would
        try:
            with pytest.raises(OSError) as info:
                remote.open_exclusive(dev)
            assert info.value.strerror == "Device or resource busy"
            assert _cli("open-excl", dev).returncode == 1
        finally:
            os.close(holder)
        assert _cli("open-excl", dev).returncode == 0


@pytest.mark.root
def test_loop_autoclear_makes_the_loop_detach_on_last_close(tmp_path):
    with external_loop(str(tmp_path)) as dev:
        backing = subprocess.run(["losetup", "--noheadings", "--output", "BACK-FILE", dev], capture_output=True,
                                 text=True, check=True).stdout.strip()
        sysfs = f"/sys/block/{os.path.basename(dev)}/loop/autoclear"
        keep = os.open(dev, os.O_RDONLY)                          # the mount's role: holds it open
        try:
            remote.set_loop_autoclear([dev])
            with open(sysfs) as f:
                assert f.read().strip() == "1"
        finally:
            os.close(keep)
        deadline = time.monotonic() + 5
        while subprocess.run(["losetup", "--associated", backing, "--noheadings"], capture_output=True,
                             text=True).stdout.strip() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert subprocess.run(["losetup", "--associated", backing, "--noheadings"], capture_output=True,
                              text=True).stdout.strip() == ""


# -- command line ---------------------------------------------------------------------------------------
def test_main_usage_errors_exit_2():
    assert remote.main([]) == 2
    assert remote.main(["no-such-action"]) == 2
    assert remote.main(["dd", "/tmp"]) == 2
    assert remote.main(["finalize", "a", "b", "c", "d", "three"]) == 2
    r = _cli("preflight", "127.0.0.1", "http")
    assert r.returncode == 2 and r.stderr == "preflight: PORT must be an integer, got 'http'\n"
    r = _cli()
    assert r.returncode == 2 and "scratch WORKDIR [SUBDIR...]" in r.stderr


def test_the_three_ways_it_runs_print_the_same_json(tmp_path):
    """-m (localhost), the file's text on stdin (remote hosts), a plain file with -S: one module."""
    with open(MODULE_FILE) as f:
        source = f.read()
    wd = str(tmp_path / "wd")
    bare = dict(PATH=os.environ["PATH"])      # no PYTHONPATH: it must need nothing from zcorch
    runs = [subprocess.run([sys.executable, "-m", "zcorch.worker.remote", "scratch", wd], capture_output=True,
                           text=True, env=dict(bare, PYTHONPATH=remote_call.PACKAGE_PARENT)),
            subprocess.run([sys.executable, "-", "scratch", wd], input=source, capture_output=True, text=True,
                           env=bare, cwd=str(tmp_path)),
            subprocess.run([sys.executable, "-S", MODULE_FILE, "scratch", wd], capture_output=True, text=True,
                           env=bare, cwd=str(tmp_path))]
    docs = [json.loads(r.stdout) for r in runs]
    assert [r.returncode for r in runs] == [0, 0, 0] and [r.stderr for r in runs] == ["", "", ""]
    assert [d["created"] for d in docs] == [True, False, False]
    assert all(d["path"] == os.path.join(wd, "scratch") for d in docs)


def test_module_imports_neither_zcorch_nor_typing_at_run_time(tmp_path):
    # A real job under -X importtime (every import it makes, on stderr), started with -S as the worker is.
    r = subprocess.run([sys.executable, "-S", "-X", "importtime", MODULE_FILE, "scratch", str(tmp_path)],
                       capture_output=True, text=True, env=dict(PATH=os.environ["PATH"]), cwd=str(tmp_path))
    assert r.returncode == 0 and json.loads(r.stdout)["created"], r.stderr
    imported = [line.rsplit("|", 1)[1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")]
    assert "json" in imported and "subprocess" in imported       # the check sees the imports
    assert [m for m in imported if m == "typing" or m.split(".")[0] == "zcorch"] == []


# -- remote_call: which interpreter, which form -----------------------------------------------------------
def _as_remote(python: str) -> LocalHost:
    """This machine standing for a remote host (is_local False: the stdin form, the spec's python)."""
    host = LocalHost("receiver", "127.0.0.1")
    host.is_local = False
    host.spec = HostSpec(ssh="127.0.0.1", data_address="127.0.0.1", python=python)
    return host


def test_localhost_runs_the_controllers_package_with_this_interpreter():
    host = LocalHost()
    assert remote_call.host_python(host) == sys.executable
    cmd = remote_call.remote_command(host, "open-excl", "/dev/x")
    assert cmd.argv == [*python_argv(sys.executable, "zcorch.worker.remote", safe_path=sys.version_info >= (3, 11)),
                        "open-excl", "/dev/x"]
    assert cmd.env == {"PYTHONPATH": remote_call.PACKAGE_PARENT} and cmd.input is None
    assert os.path.isfile(os.path.join(cmd.env["PYTHONPATH"], "zcorch", "worker", "remote.py"))


def test_remote_host_gets_the_module_on_stdin_and_its_configured_python(tmp_path):
    # The host's `python:` under another name (a symlink): it must be what runs, not python3.
    py = tmp_path / "bin" / "zc-host-python"
    py.parent.mkdir()
    py.symlink_to(sys.executable)
    host = _as_remote(str(py))
    assert remote_call.host_python(host) == str(py)
    cmd = remote_call.remote_command(host, "preflight", "127.0.0.1", 5201)
    assert cmd.argv == [*python_argv(str(py), None), "preflight", "127.0.0.1", "5201"] and cmd.env is None
    with open(MODULE_FILE) as f:
        assert cmd.input == f.read()
    assert cmd.display().endswith(" < zcorch/worker/remote.py")
    facts = remote_call.remote_json(remote_call.run_remote(host, "preflight", "127.0.0.1"))
    assert facts["executable"] == str(py)
    # The callers take the host's python from the same place.
    assert deploy.probe_host(host)["executable"] == str(py)
    assert metadata.collect_host(host, remote_call.host_python(host), path=str(tmp_path))["python"]["executable"] \
        == str(py)
    host.spec = dataclasses.replace(host.spec, workdir=str(tmp_path / "wd"))
    assert scratch.prepare(host, remote_call.host_python(host))["path"] == str(tmp_path / "wd" / "scratch")


def test_missing_interpreter_is_exit_127_and_named_by_the_callers(tmp_path):
    host = _as_remote(str(tmp_path / "no-python"))
    assert remote_call.run_remote(host, "preflight", "127.0.0.1").returncode == 127
    facts = deploy.probe_host(host)
    assert facts["returncode"] == 127 and facts["python_cmd"] == str(tmp_path / "no-python")
    assert deploy.host_problems(host, facts)[0].startswith(f"receiver: {tmp_path / 'no-python'} not found")


def test_remote_json_takes_the_last_line_object_only():
    from zcorch.hosts.local import CommandResult

    assert remote_call.remote_json(CommandResult([], 0, 'noise\n{"a": 1}\n', "")) == {"a": 1}
    assert remote_call.remote_json(CommandResult([], 0, "[1]\n", "")) is None
    assert remote_call.remote_json(CommandResult([], 0, "", "")) is None


# -- lab: the host's own python over SSH, for every job -----------------------------------------------------
@pytest.mark.lab
@pytest.mark.root
@pytest.mark.timeout(300)
def test_every_remote_job_runs_with_the_hosts_configured_python(lab):
    """`python:` is a wrapper (another name, logs its arguments, execs /usr/bin/python3): each job shows up."""
    tag = uuid.uuid4().hex[:8]
    wrapper, log = f"zc-python-{tag}", f"zc-python-{tag}.log"
    with open(os.path.join(lab.receiver.home, wrapper), "w") as f:
        f.write(f'#!/bin/sh\nprintf "%s\\n" "$*" >> /root/{log}\nexec /usr/bin/python3 "$@"\n')
    os.chmod(os.path.join(lab.receiver.home, wrapper), 0o755)
    spec = HostSpec.from_mapping({**lab.hosts_spec["receiver"], "python": f"/root/{wrapper}",
                                  "workdir": f"~/.cache/zcorch-py-{tag}"}, "receiver")
    from zcorch.hosts.ssh import connect

    host = connect(spec, "receiver")
    try:
        python = remote_call.host_python(host)
        assert python == f"/root/{wrapper}"
        facts = deploy.preflight({"receiver": host})["receiver"]
        assert facts["executable"] == "/usr/bin/python3"           # what the wrapper exec'd
        handle = deploy.deploy(host)                               # build, cffi-dir, finalize
        assert handle.python == python and not handle.reused and handle.python_flags == ["-S"]
        assert deploy.worker_version_problems(handle) == []
        meta = metadata.collect_host(host, python, path="/root")
        assert meta["interface"]["name"] and meta["sink_mount"]["target"] == "/root"
        info = scratch.prepare(host, python, ["dd"])
        assert info["path"] == f"/root/.cache/zcorch-py-{tag}/scratch" and info["mode"] == "0700"
        recs = bl.run_dd(host, python, DdBaseline(bs=4096, count=4), info["path"] + "/dd")
        assert [r["status"] for r in recs] == ["ok", "ok"], recs
        backing = f"/root/zc-loop-{tag}.img"
        assert host.run(["truncate", "-s", "16M", backing]).ok
        dev = host.run(["losetup", "--find", "--show", backing]).stdout.strip()
        try:
            assert device_problems(host, dev, True, "receiver") == []   # open-excl, with the host's python
            assert remote_call.run_remote(host, "loop-autoclear", dev).ok
            # nobody holds it: autoclear detached it when the job closed it
            assert host.run(["losetup", "--associated", backing, "--noheadings"]).stdout.strip() == ""
        finally:
            host.run(["losetup", "-d", dev])
            host.run(["rm", "-f", backing])
        with open(os.path.join(lab.receiver.home, log)) as f:
            calls = f.read().splitlines()
        boot = " ".join(python_argv(python, None)[1:]) + " "        # the program on stdin, cwd dropped first
        jobs = [c[len(boot):].split()[0] for c in calls if c.startswith(boot)]
        assert jobs == ["preflight", "cffi-dir", "finalize", "metadata", "scratch", "dd", "open-excl",
                        "loop-autoclear"], calls
        assert any("native/build.py --out" in c for c in calls)            # the build too
        # nothing ran in a form that imports from the current directory (the home directory here)
        assert not [c for c in calls if c.startswith(("- ", "-m ", "-S -m "))], calls
    finally:
        host.run(["rm", "-rf", f"/root/.cache/zcorch-py-{tag}", f"/root/{wrapper}", f"/root/{log}"])
        host.close()
    assert lab.zcorch_procs("receiver") == []


def test_dd_baseline_removes_the_files_of_sigkilled_dd_jobs(tmp_path):
    """SIGKILL runs no handler: the next dd job removes a dead job's file, never a live job's or another file."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f".zcorch-dd-{dead.pid}-{'0' * 16}"
    live = tmp_path / f".zcorch-dd-{os.getpid()}-{'1' * 16}"
    other = tmp_path / ".zcorch-dd-notes"
    for f in (stale, live, other):
        f.write_bytes(b"x")
    out = remote.dd_baseline(str(tmp_path), "4096", "2")
    assert out["stale_removed"] == [str(stale)] and not stale.exists()
    assert live.exists() and other.exists() and out["write"]["returncode"] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name])   # its own file is gone too


def test_preflight_says_whether_a_network_state_file_is_there_to_restore(tmp_path):
    """`preflight --net-state DIR PREFIX` (before --build): False only when DIR has no PREFIX entry at all (the
    controller then skips reading and restoring it); a link counts as one (read and refused as always), and
    a DIR that cannot be listed is None (read as always)."""
    d = tmp_path / "net"

    def present(*more):
        r = _cli("preflight", "127.0.0.1", "--tool", "--net-state", "--net-state", str(d), "zcorch-net-", *more)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["net_state"]

    assert present() is False                       # no directory yet
    d.mkdir()
    (d / "zcorch-net.lease").write_text("")         # the lease, not a state file
    assert present() is False
    (d / "zcorch-net-4026531840.json").symlink_to(tmp_path / "elsewhere")
    assert present() is True
    facts = json.loads(_cli("preflight", "127.0.0.1", "--net-state", str(d), "zcorch-net-", "--build", str(tmp_path),
                            "worker-" + "0" * 16, ".zcorch-deployed").stdout)
    assert facts["net_state"] is True and facts["build"]["marker"] is None
    (tmp_path / "file").write_text("")
    d = tmp_path / "file"
    assert present() is None
    r = _cli("preflight", "127.0.0.1", "--net-state", str(d))
    assert r.returncode == 2 and "--net-state DIR PREFIX must come last" in r.stderr
