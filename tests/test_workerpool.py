"""One worker server per host for a sweep (zcorch.worker.serve, zcorch.sweep.workerpool), real on localhost:
it serves run after run, each run its own process; a run killed with SIGKILL, or the server itself killed,
fails that run only, and the next run gets a (new) server. A run leads its own process group and ends with
its server."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

from fixtures_run import REPO, TAG_VAR, base_params, local_runner, new_resultset, wait_no_workers


def runs_of(params_list):
    return [{"id": f"c{i}", "repeat": 0, "params": p} for i, p in enumerate(params_list)]


def test_one_server_serves_many_runs_each_in_its_own_process(tmp_path, tag):
    cells = [base_params(bytes=(i + 1) << 16) for i in range(6)]
    rs = new_resultset(tmp_path / "rs", runs_of(cells))
    servers, run_pids = set(), []

    def on_event(name, **info):
        if name == "receiver_ready":
            servers.add(info["proc"].server.pid)
            run_pids.append(info["pid"])

    runner = local_runner(rs, tag, on_event=on_event)
    outcome = runner.run_sweep(runs_of(cells))
    assert outcome.ok == 6, [r["reason"] for r in rs.runs()]
    assert len(servers) == 1 and len(set(run_pids)) == 6 and not servers & set(run_pids)
    assert [r["receiver"]["bytes"] for r in rs.runs()] == [c["bytes"] for c in cells]
    assert wait_no_workers(tag, 5.0) == []   # run_sweep stopped its server


def test_worker_server_off_runs_each_transfer_as_its_own_worker_process(tmp_path, tag, monkeypatch):
    """ZCORCH_WORKER_SERVER=off: the plain path the server's benchmark row is measured against; no server
    starts, each side of each run is a `WORKER recv|send` process; a value neither on nor off is refused."""
    monkeypatch.setenv("ZCORCH_WORKER_SERVER", "off")
    cells = [base_params(bytes=(i + 1) << 16) for i in range(3)]
    rs = new_resultset(tmp_path / "rs", runs_of(cells))
    procs = []

    def on_event(name, **info):
        if name in ("receiver_started", "sender_started"):
            procs.append(info["proc"])

    runner = local_runner(rs, tag, on_event=on_event)
    outcome = runner.run_sweep(runs_of(cells))
    assert outcome.ok == 3, [r["reason"] for r in rs.runs()]
    assert runner.pool.servers() == [] and len(procs) == 6
    assert not any(hasattr(p, "server") for p in procs)
    assert len({p.pgid for p in procs}) == 6   # each its own process (and group)
    assert wait_no_workers(tag, 5.0) == []
    monkeypatch.setenv("ZCORCH_WORKER_SERVER", "no")
    from zcorch.errors import ConfigError
    from zcorch.sweep.workerpool import WorkerPool
    try:
        WorkerPool()
    except ConfigError as exc:
        assert "ZCORCH_WORKER_SERVER" in str(exc)
    else:
        raise AssertionError("ZCORCH_WORKER_SERVER=no was accepted")


def _kill_when_moving(get_pid, delay=0.4):
    def go():
        time.sleep(delay)
        os.kill(get_pid(), signal.SIGKILL)
    threading.Thread(target=go, daemon=True).start()


def test_a_run_killed_by_sigkill_is_that_runs_failure_and_the_server_goes_on(tmp_path, tag):
    cells = [base_params(bytes=1 << 40, timeout=30.0), base_params()]
    rs = new_resultset(tmp_path / "rs", runs_of(cells))
    servers = []

    def on_event(name, **info):
        if name == "sender_started":
            servers.append(info["proc"].server.pid)
            if len(servers) == 1:
                _kill_when_moving(lambda: info["proc"].pid)   # the sender's own process: a crash

    local_runner(rs, tag, on_event=on_event).run_sweep(runs_of(cells))
    crashed, fine = rs.runs()
    assert crashed["status"] == "failed" and "sender on localhost was killed by SIGKILL" in crashed["reason"]
    assert fine["status"] == "ok" and servers[0] == servers[1]   # the same server served the next run
    assert wait_no_workers(tag, 5.0) == []


def test_a_killed_server_fails_its_run_and_the_next_run_gets_a_new_one(tmp_path, tag):
    cells = [base_params(bytes=1 << 40, timeout=30.0), base_params(), base_params()]
    rs = new_resultset(tmp_path / "rs", runs_of(cells))
    servers = []

    def on_event(name, **info):
        if name == "sender_started":
            servers.append(info["proc"].server.pid)
            if len(servers) == 1:
                _kill_when_moving(lambda: servers[0])   # the worker server itself, mid-run

    runner = local_runner(rs, tag, on_event=on_event)
    t0 = time.monotonic()
    runner.run_sweep(runs_of(cells))
    lost, fine, fine2 = rs.runs()
    assert time.monotonic() - t0 < 25
    assert lost["status"] == "failed" and "the worker server" in lost["reason"], lost
    assert "killed by SIGKILL" in lost["reason"]
    assert fine["status"] == fine2["status"] == "ok"
    assert servers[1] != servers[0] and servers[1] == servers[2]   # restarted once, then kept
    assert any("restarted" in w for w in runner.warnings), runner.warnings
    assert wait_no_workers(tag, 5.0) == []


def test_serve_protocol_refuses_what_is_not_a_transfer_and_ends_with_stdin():
    env = dict(os.environ, PYTHONPATH=REPO)
    p = subprocess.Popen([sys.executable, "-m", "zcorch.worker", "serve"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=env)
    try:
        hello = json.loads(p.stdout.readline())
        assert hello["event"] == "serving" and hello["pid"] == p.pid
        p.stdin.write(json.dumps({"op": "run", "id": 1, "argv": ["calibrate"]}) + "\n")
        p.stdin.write(json.dumps({"op": "run", "id": 2, "argv": ["recv", "--listen", "127.0.0.1:0", "--mode",
                                                                 "no-such-mode"]}) + "\n")
        p.stdin.flush()
        frames = [json.loads(p.stdout.readline()) for _ in range(2)]
        assert frames[0]["event"] == "error" and "recv, send" in frames[0]["message"]
        assert frames[1] == {"id": 1, "exit": 2}
        rest = []
        while not rest or "exit" not in rest[-1]:
            rest.append(json.loads(p.stdout.readline()))
        assert rest[0]["id"] == 2 and "started" in rest[0]
        errors = [json.loads(f["out"]) for f in rest if "out" in f]
        assert errors and errors[0]["event"] == "error" and rest[-1] == {"id": 2, "exit": 1}
        p.stdin.close()
        assert p.wait(10) == 0
    finally:
        p.kill()
        p.wait()


def test_a_run_leads_its_own_group_and_ends_with_a_killed_server(tag):
    env = dict(os.environ, PYTHONPATH=REPO, **{TAG_VAR: tag})
    p = subprocess.Popen([sys.executable, "-m", "zcorch.worker", "serve"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert json.loads(p.stdout.readline())["event"] == "serving"
        p.stdin.write(json.dumps({"op": "run", "id": 1, "argv": ["recv", "--listen", "127.0.0.1:0", "--mode", "read",
                                                                 "--timeout", "60", "--exit-on-stdin-eof"]}) + "\n")
        p.stdin.flush()
        started = json.loads(p.stdout.readline())["started"]
        frame = {}
        while "out" not in frame:
            frame = json.loads(p.stdout.readline())
        assert json.loads(frame["out"])["event"] == "ready"
        assert os.getpgid(started) == started and started != p.pid
        os.kill(p.pid, signal.SIGKILL)   # no stop_all: the run sees its stdin (the server's pipe) close
        p.wait(10)
        assert wait_no_workers(tag, 10.0) == []   # long before its 60 s timeout
    finally:
        p.kill()
        p.wait()


def test_an_ok_runs_workers_are_gone_when_its_record_is_done_and_before_the_next_run(tmp_path, tag):
    # The record of an ok run is appended while its workers exit; the wait for them still ends first.
    cells = [base_params(bytes=1 << 20) for _ in range(3)]
    rs = new_resultset(tmp_path / "rs", runs_of(cells))
    procs, alive = [], []   # each run's receiver and sender (ServedRun: its pid comes with the `started` frame)

    def running(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    def on_event(name, **info):
        if name in ("receiver_started", "run_done"):   # the runs before this one (their pids are known)
            alive.extend(p.pid for p in procs if running(p.pid))
        if name in ("receiver_started", "sender_started"):
            procs.append(info["proc"])

    outcome = local_runner(rs, tag, on_event=on_event).run_sweep(runs_of(cells))
    assert outcome.ok == 3 and len({p.pid for p in procs}) == 6
    assert alive == []
    assert [r["status"] for r in rs.runs()] == ["ok"] * 3 and all(r["log"] for r in rs.runs())
