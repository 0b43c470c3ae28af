"""The runner with the real worker on localhost: matrix, worker errors, killed/stalled peers, Ctrl-C."""
import os
import re
import shutil
import signal
import threading
import time

import pytest

from fixtures_run import base_params, local_runner, new_resultset, wait_no_workers
from zcorch.sweep.runner import recv_argv, send_argv, worker_flags


def runs_of(params_list):
    return [{"id": f"c{i}", "repeat": 0, "params": p} for i, p in enumerate(params_list)]


def test_small_matrix_on_localhost(tmp_path, tag):
    sink_dir = tmp_path / "sinks"
    sink_dir.mkdir()
    cells = [base_params(send_mode="write", recv_mode="read"),
             base_params(send_mode="sendfile", source="/dev/zero", recv_mode="splice", sink=str(sink_dir / "s.bin")),
             base_params(send_mode="vmsplice", recv_mode="read", window=256 * 1024)]
    rs = new_resultset(tmp_path / "rs", runs_of(cells))
    outcome = local_runner(rs, tag).run_sweep(runs_of(cells))
    assert outcome.status == "complete" and outcome.ok == 3 and outcome.failed == 0
    recs = rs.runs()
    assert [r["status"] for r in recs] == ["ok"] * 3
    for rec, params in zip(recs, cells):
        assert rec["sender"]["bytes"] == rec["receiver"]["bytes"] == params["bytes"]
        assert rec["receiver"]["mode"] == params["recv_mode"] and rec["sender"]["mode"] == params["send_mode"]
        assert 0 < rec["overhead_s"] < rec["wall_s"]
        log = (tmp_path / "rs" / rec["log"]).read_text()
        assert "zcorch.worker recv --listen 127.0.0.1:0" in log and "zcorch.worker send --connect" in log
    assert os.path.getsize(sink_dir / "s.bin") == cells[1]["bytes"]
    assert recs[2]["receiver"]["params"]["window"] == 256 * 1024


def test_worker_error_is_recorded_with_its_message_and_the_sweep_goes_on(tmp_path, tag):
    cells = [base_params(sink=str(tmp_path / "missing-dir" / "sink.bin")), base_params()]
    rs = new_resultset(tmp_path / "rs", runs_of(cells))
    outcome = local_runner(rs, tag).run_sweep(runs_of(cells))
    bad, good = rs.runs()
    assert bad["status"] == "failed"
    assert "receiver on localhost" in bad["reason"] and "cannot open sink" in bad["reason"]
    assert "ENOENT" in bad["reason"]
    assert good["status"] == "ok" and outcome.failed == 1 and outcome.ok == 1


def _kill_later(get_pid, sig, delay):
    def go():
        time.sleep(delay)
        os.kill(get_pid(), sig)
    threading.Thread(target=go, daemon=True).start()


@pytest.mark.parametrize("victim", ["sender", "receiver"])
def test_killed_peer_fails_the_run_and_leaves_no_worker(tmp_path, tag, victim):
    big = base_params(bytes=1 << 40, timeout=30.0)  # would take minutes: the kill ends it
    cells = [big, base_params()]
    rs = new_resultset(tmp_path / "rs", runs_of(cells))
    killed = []

    def on_event(name, **info):
        if name == f"{victim}_started" and not killed:
            killed.append(info["proc"])   # the run's own process (a child of the host's worker server)
            _kill_later(lambda: killed[0].pid, signal.SIGKILL, 0.5)

    t0 = time.monotonic()
    local_runner(rs, tag, on_event=on_event).run_sweep(runs_of(cells))
    first, second = rs.runs()
    assert first["status"] == "failed", first
    assert time.monotonic() - t0 < 20
    if victim == "sender":
        assert "sender on localhost was killed by SIGKILL" in first["reason"]
    else:
        assert "receiver on localhost" in first["reason"] or "sender on localhost" in first["reason"]
    assert second["status"] == "ok"
    assert wait_no_workers(tag, 2.0) == []


@pytest.mark.slow
def test_stalled_receiver_is_a_timeout_and_the_sweep_goes_on(tmp_path, tag):
    stall = base_params(bytes=1 << 40, timeout=2.0)
    cells = [stall, base_params()]
    rs = new_resultset(tmp_path / "rs", runs_of(cells))
    stopped = []

    def on_event(name, **info):
        if name == "receiver_ready" and not stopped:
            stopped.append(info["pid"])
            _kill_later(lambda: stopped[0], signal.SIGSTOP, 0.3)

    runner = local_runner(rs, tag, on_event=on_event, margin=3.0)
    runner.run_sweep(runs_of(cells))
    first, second = rs.runs()
    assert first["status"] == "timeout", first
    assert first["reason"]
    assert first["wall_s"] < 2.0 + 3.0 + 2.0, first
    assert second["status"] == "ok"
    assert wait_no_workers(tag, 2.0) == []


def test_ctrl_c_mid_run_records_interrupted_keeps_finished_and_kills_workers(tmp_path, tag):
    cells = [base_params(), base_params(bytes=1 << 40, timeout=60.0), base_params()]
    rs = new_resultset(tmp_path / "rs", runs_of(cells))

    def on_event(name, **info):
        if name == "sender_started" and len(rs.runs()) == 1:
            _kill_later(os.getpid, signal.SIGINT, 0.5)  # a real SIGINT to this process

    outcome = local_runner(rs, tag, on_event=on_event).run_sweep(runs_of(cells))
    assert outcome.status == "interrupted"
    assert [r["status"] for r in rs.runs()] == ["ok", "interrupted"]
    assert wait_no_workers(tag, 2.0) == []


def test_skip_runs_only_missing_ones(tmp_path, tag):
    cells = [base_params(), base_params(buffer=32 * 1024)]
    rs = new_resultset(tmp_path / "rs", runs_of(cells))
    outcome = local_runner(rs, tag).run_sweep(runs_of(cells), skip={("c0", 0)})
    assert outcome.skipped == 1 and [r["cell"] for r in rs.runs()] == ["c1"]


def test_filesystem_hook_substitutes_mountpoint_and_runs_dd_per_filesystem(tmp_path, tag):
    from zcorch.config.filesystems import filesystems_from_mapping
    from zcorch.hosts.local import LocalHost
    from zcorch.provision.filesystems import FilesystemManager

    a, b = tmp_path / "fsa", tmp_path / "fsb"
    a.mkdir(), b.mkdir()
    configs = filesystems_from_mapping({"a": {"path": str(a)}, "b": {"path": str(b)}})
    fsman = FilesystemManager(LocalHost(), configs, str(tmp_path / "state"))
    calls = []  # the real manager, observed (its `path` entries need no root)
    orig_ensure, orig_release = fsman.ensure, fsman.release
    fsman.ensure = lambda n: calls.append(("ensure", n)) or orig_ensure(n)
    fsman.release = lambda n: calls.append(("release", n)) or orig_release(n)
    cells = [base_params(filesystem="a", sink="{filesystem}/x.bin"), base_params(filesystem="a", sink="{filesystem}/y.bin"),
             base_params(filesystem="b", sink="{filesystem}/x.bin")]
    dd_dirs = []
    rs = new_resultset(tmp_path / "rs", runs_of(cells))
    local_runner(rs, tag, fsman=fsman, before_directory=lambda fs, sink: dd_dirs.append((fs, sink))).run_sweep(
        runs_of(cells))
    assert [r["status"] for r in rs.runs()] == ["ok"] * 3
    assert [r["params"]["sink"] for r in rs.runs()] == [f"{a}/x.bin", f"{a}/y.bin", f"{b}/x.bin"]
    # ensure() before every run (it provisions once, then re-checks the mount), released right after
    # the configuration's last run.
    assert calls == [("ensure", "a"), ("ensure", "a"), ("release", "a"), ("ensure", "b"), ("release", "b")]
    assert dd_dirs == [("a", f"{a}/x.bin"), ("b", f"{b}/x.bin")]
    assert (a / "x.bin").stat().st_size == cells[0]["bytes"]


def test_unprovisionable_filesystem_fails_its_runs_only(tmp_path, tag):
    from zcorch.config.filesystems import filesystems_from_mapping
    from zcorch.hosts.local import LocalHost
    from zcorch.provision.filesystems import FilesystemManager

    configs = filesystems_from_mapping({"gone": {"path": str(tmp_path / "nope")}})
    fsman = FilesystemManager(LocalHost(), configs, str(tmp_path / "state"))
    cells = [base_params(filesystem="gone", sink="{filesystem}/x.bin"), base_params()]
    rs = new_resultset(tmp_path / "rs", runs_of(cells))
    local_runner(rs, tag, fsman=fsman).run_sweep(runs_of(cells))
    bad, good = rs.runs()
    assert bad["status"] == "failed" and "gone" in bad["reason"] and "not an existing directory" in bad["reason"]
    assert good["status"] == "ok"


def test_worker_argv_quotes_nothing_and_maps_every_flag():
    p = base_params(send_mode="vmsplice", recv_mode="splice", window=1 << 20, pipe_size=1 << 20, gift=True,
                    fsync=True, send_cpu=0, recv_cpu=1, sink="/mnt/a dir/$(rm -rf)", sink_state="overwrite")
    r = recv_argv(["w"], "10.78.0.3", p)
    assert r[:4] == ["w", "recv", "--listen", "10.78.0.3:0"]
    assert r[r.index("--sink") + 1] == "/mnt/a dir/$(rm -rf)"
    for flag, value in (("--mode", "splice"), ("--window", str(1 << 20)), ("--pipe-size", str(1 << 20)),
                        ("--cpu", "1"), ("--sink-state", "overwrite")):
        assert r[r.index(flag) + 1] == value
    assert "--gift" in r and "--fsync" in r
    s = send_argv(["w"], "fd00::3", 5000, p)
    assert s[:4] == ["w", "send", "--connect", "[fd00::3]:5000"]
    assert s[s.index("--cpu") + 1] == "0" and "--fsync" not in s
    assert "--window" not in worker_flags("send", base_params(window=None))


def test_streams_and_the_modern_modes_through_the_runner(tmp_path, tag):
    # The worker's per-stream results travel in the run record (sender/receiver "streams": one dict per
    # stream) with the totals in the usual metrics, and load as one row per run.
    from zcorch.analysis.load import load
    from zcorch.worker import native

    unavailable = native.unavailable_modes()
    cells = [base_params(send_mode="write", recv_mode="read", streams=3, threads=2, bytes=3 * 2**20 + 7),
             base_params(send_mode="msg_zerocopy", recv_mode="read", streams=2, send_cpus="0", bytes=2**20)]
    for send_mode, recv_mode in (("io_uring_zc", "zerocopy_recv"), ("io_uring", "io_uring")):
        if send_mode not in unavailable["send"] and recv_mode not in unavailable["recv"]:
            cells.append(base_params(send_mode=send_mode, recv_mode=recv_mode, streams=2, bytes=2**20 + 3))
    rs = new_resultset(tmp_path / "rs", runs_of(cells))
    outcome = local_runner(rs, tag).run_sweep(runs_of(cells))
    assert outcome.ok == len(cells), [r["reason"] for r in rs.runs()]
    for rec, params in zip(rs.runs(), cells):
        for side in ("sender", "receiver"):
            streams = rec[side]["streams"]
            assert len(streams) == params["streams"] and sum(s["bytes"] for s in streams) == params["bytes"]
            assert rec[side]["bytes"] == params["bytes"] and rec[side]["params"]["streams"] == params["streams"]
        assert "--streams" in (tmp_path / "rs" / rec["log"]).read_text()
    # the threads each side ran its streams on, as the worker resolved them: given (2), one per CPU of
    # send_cpus (1), auto unpinned (per stream, at most the CPUs)
    records = rs.runs()
    assert [records[0][side]["params"]["threads"] for side in ("sender", "receiver")] == [2, 2]
    assert records[1]["sender"]["params"]["threads"] == 1
    assert records[1]["receiver"]["params"]["threads"] == min(2, len(os.sched_getaffinity(0)))
    frame = load(str(tmp_path / "rs"))
    assert list(frame["streams"]) == [c["streams"] for c in cells]
    assert frame["send_bytes"].tolist() == [c["bytes"] for c in cells]
    assert '"stream": 1' in frame["send_streams"].iloc[0]  # per-stream values: JSON text in one column


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace (the system calls are the observable)")
def test_each_worker_makes_calls_of_its_own_side_buffer(tmp_path, tag):
    """send_buffer / recv_buffer reach the real workers: the kernel sees the sender write() 8 KiB and the
    receiver read() 64 KiB from the TCP socket (strace of the workers, as the runner starts them)."""
    from fixtures_run import REPO, TAG_VAR, WORKER
    from zcorch.hosts.local import LocalHost
    from zcorch.sweep.runner import Runner

    cell = base_params(send_mode="write", recv_mode="read", bytes=1 << 20, buffer=32 * 1024,
                       send_buffer=8 * 1024, recv_buffer=64 * 1024)
    rs = new_resultset(tmp_path / "rs", runs_of([cell]))
    traced = {}
    for role in ("sender", "receiver"):
        traced[role] = tmp_path / f"{role}.strace"
        traced[role + "_argv"] = ["strace", "-f", "-qq", "-yy", "-e", "trace=read,sendto", "-o",
                                  str(traced[role]), *WORKER]
    host = LocalHost()
    env = {"PYTHONPATH": REPO, TAG_VAR: tag}
    outcome = Runner(host, host, traced["sender_argv"], traced["receiver_argv"], rs,
                     worker_env={"sender": env, "receiver": env}).run_sweep(runs_of([cell]))
    assert outcome.ok == 1, rs.runs()
    rec = rs.runs()[0]
    assert rec["sender"]["params"]["buffer"] == 8192 and rec["receiver"]["params"]["buffer"] == 65536

    def socket_calls(role, call):
        """(asked, done) of each `call` on the TCP socket (read(fd, buf, N), sendto(fd, buf, N, flags, ...))."""
        out = []
        for line in traced[role].read_text().splitlines():
            m = re.search(rf"\b{call}\(\d+<TCP:\[[^\]]*\]>, \".*\"(?:\.\.\.)?, (\d+)[,)].* = (\d+)$", line)
            if m:
                out.append((int(m.group(1)), int(m.group(2))))
        return out

    sends, reads = socket_calls("sender", "sendto"), socket_calls("receiver", "read")
    hello, sends = sends[0], sends[1:]
    assert hello == (48, 48)   # the stream hello with the run's nonce comes first (native/core/net.c)
    assert sends and max(a for a, _ in sends) == 8192 and sum(d for _, d in sends) == 1 << 20
    assert len(sends) >= (1 << 20) // 8192  # a send() never asks more than the sender's buffer
    data_reads = [(a, d) for a, d in reads if d > 0]
    assert reads and max(a for a, _ in reads) == 65536 and sum(d for _, d in data_reads) == 1 << 20
    left = 1 << 20
    for asked, done in data_reads:  # every read() asks one receiver buffer (64 KiB, not 8 or 32), or what is left
        assert asked == min(65536, left)
        left -= done
