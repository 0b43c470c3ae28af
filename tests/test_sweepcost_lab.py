"""What a sweep costs across the two-host lab (real SSH): one worker server per host serving every run, a
killed server failing only its run, and the copy-cost calibration cached on each host between sweeps."""
import json
import os
import signal
import threading

import pytest
import yaml

from fixtures_run import base_params, new_resultset

pytestmark = [pytest.mark.lab, pytest.mark.root]


def runs_of(params_list):
    return [{"id": f"c{i}", "repeat": 0, "params": p} for i, p in enumerate(params_list)]


def test_one_server_per_host_serves_the_runs_and_a_killed_one_is_replaced(lab, tmp_path):  # noqa: F811
    from zcorch.hosts import ssh
    from zcorch.provision import deploy
    from zcorch.sweep.runner import Runner

    hosts = ssh.open_hosts(lab.hosts)
    try:
        handles = deploy.prepare(hosts)
        cells = [base_params(), base_params(), base_params(bytes=1 << 40, timeout=30.0), base_params(), base_params()]
        rs = new_resultset(tmp_path / "rs", runs_of(cells))
        servers = {"sender": [], "receiver": []}

        def on_event(name, **info):
            if name in ("receiver_ready", "sender_started"):
                role = "receiver" if name == "receiver_ready" else "sender"
                servers[role].append(info["proc"].server.pid)
                if role == "sender" and len(servers["sender"]) == 3:   # the third run: its receiver's server dies
                    pid = servers["receiver"][-1]
                    threading.Timer(0.5, lambda: os.kill(pid, signal.SIGKILL)).start()   # one pid namespace

        runner = Runner(hosts["sender"], hosts["receiver"], handles["sender"].worker_argv,
                        handles["receiver"].worker_argv, rs, worker_env={r: handles[r].env for r in handles},
                        on_event=on_event, margin=3.0)
        runner.run_sweep(runs_of(cells))
    finally:
        for h in hosts.values():
            h.close()
    records = rs.runs()
    assert [r["status"] for r in records] == ["ok", "ok", "failed", "ok", "ok"], [r["reason"] for r in records]
    assert "the worker server" in records[2]["reason"] and "receiver" in records[2]["reason"]
    assert len(set(servers["sender"])) == 1                       # one sender server for the whole sweep
    assert len(set(servers["receiver"][:3])) == 1 and servers["receiver"][3] not in servers["receiver"][:3]
    assert servers["receiver"][3] == servers["receiver"][4]       # replaced once, then kept
    assert all(r["receiver"]["bytes"] == r["params"]["bytes"] for r in records if r["status"] == "ok")
    assert lab.zcorch_procs("sender") == [] and lab.zcorch_procs("receiver") == []


def test_the_second_lab_sweep_reuses_both_hosts_calibration(lab, tmp_path):  # noqa: F811
    from zcorch.sweep.pipeline import run_sweep

    # a workdir of this test's own on each host: the cache starts empty whatever ran before
    spec = lab.hosts_spec
    for role in ("sender", "receiver"):
        spec[role]["workdir"] = f"/root/.cache/zcorch-t{os.getpid()}-{tmp_path.name}"
    exp = tmp_path / "lab.yaml"
    exp.write_text(yaml.safe_dump({"name": "labcal", "hosts": spec, "params": {"bytes": "1MiB"},
                                   "baselines": {"iperf3": False, "dd": False}}))

    def calibrations(n, **kw):
        result = run_sweep(str(exp), output=str(tmp_path / f"rs{n}"), **kw)
        assert result.exit_status == 0, [r["reason"] for r in result.records]
        meta = json.loads((tmp_path / f"rs{n}" / "meta.json").read_text())
        for role in ("sender", "receiver"):   # the metadata came with the deploy's `worker info`: each host's own
            assert meta["hosts"][role]["interface"]["address"] == spec[role]["data_address"], meta["hosts"][role]
            assert meta["hosts"][role]["boot_id"] and "error" not in meta["hosts"][role]
        return {role: meta["hosts"][role]["calibration"] for role in ("sender", "receiver")}

    try:
        first = calibrations(1)
        assert all(c["cached"] is False and c["cache"]["status"] == "missing" for c in first.values()), first
        # each host keeps its own, in its own (private) home
        assert first["sender"]["cache"]["path"].startswith(spec["sender"]["workdir"])
        second = calibrations(2)
        assert all(c["cached"] is True and c["age_s"] >= 0 for c in second.values()), second
        assert {r: c["memcpy_ns"] for r, c in second.items()} == {r: c["memcpy_ns"] for r, c in first.items()}
        third = calibrations(3, recalibrate=True)
        assert all(c["cached"] is False and c["cache"]["status"] == "refresh" for c in third.values()), third
    finally:
        for role in ("sender", "receiver"):
            lab.run_in(role, ["rm", "-rf", "--", spec[role]["workdir"]])
    assert lab.zcorch_procs("sender") == [] and lab.zcorch_procs("receiver") == []
