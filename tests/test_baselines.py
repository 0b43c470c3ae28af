"""Baseline parsers on captured real iperf3/dd output, and real iperf3/dd runs on localhost."""
import glob
import json
import os
import re
import sys

import pytest

from conftest import can_drop_caches, require_tool
from fixtures_run import TAG_VAR, tagged_pids
from zcorch.config.baselines import DdBaseline, Iperf3Baseline
from zcorch.config.baselines import iperf3 as ik
from zcorch.sweep import baselines as bl
from zcorch.hosts.local import LocalHost

CAPTURED = os.path.join(os.path.dirname(__file__), "data", "captured")


def captured(name):
    with open(os.path.join(CAPTURED, name)) as f:
        return f.read()


@pytest.mark.parametrize("name", ["iperf3_loopback_write.json", "iperf3_loopback_zerocopy.json",
                                  "iperf3_loopback_bytes.json"])
def test_parse_iperf3_json_takes_received_rate_and_both_cpus(name):
    text = captured(name)
    doc = json.loads(text)
    r = bl.parse_iperf3_json(text)
    end = doc["end"]
    assert r["bits_per_second"] == end["sum_received"]["bits_per_second"]
    assert r["sent_bits_per_second"] == end["sum_sent"]["bits_per_second"]
    assert r["retransmits"] == end["sum_sent"]["retransmits"]
    assert r["sender_cpu_percent"] == end["cpu_utilization_percent"]["host_total"]
    assert r["receiver_cpu_percent"] == end["cpu_utilization_percent"]["remote_total"]
    # The rate is what the byte count and the duration say (iperf3's own arithmetic).
    assert r["bits_per_second"] == pytest.approx(r["bytes"] * 8 / r["seconds"], rel=1e-3)


def test_parse_iperf3_zerocopy_capture_is_a_zerocopy_run():
    doc = json.loads(captured("iperf3_loopback_zerocopy.json"))
    assert doc["start"]["test_start"]["blksize"] == bl.parse_iperf3_json(json.dumps(doc))["blksize"] == 65536


@pytest.mark.parametrize("name, message", [
    ("iperf3_error_refused.json", "unable to connect to server: Connection refused"),
    ("iperf3_error_server_killed.json", "Connection reset by peer"),
])
def test_parse_iperf3_error_json_raises_with_iperf3s_message(name, message):
    with pytest.raises(bl.BaselineError, match=re.escape(message)):
        bl.parse_iperf3_json(captured(name))


@pytest.mark.parametrize("name", ["iperf3_error_usage.txt", "iperf3_error_window_usage.txt"])
def test_parse_iperf3_usage_output_is_an_error_not_a_crash(name):
    with pytest.raises(bl.BaselineError, match="no JSON"):
        bl.parse_iperf3_json(captured(name))


DD_CAPTURES = {
    "dd_write_32k.stderr": 32 * 1024 * 2048,
    "dd_read_32k.stderr": 32 * 1024 * 2048,
    "dd_write_1M_fsync.stderr": 3 * 1024 * 1024,
    "dd_write_2GiB.stderr": 2048 * 1024 * 1024,
    "dd_write_1byte.stderr": 1,
}


@pytest.mark.parametrize("name, nbytes", sorted(DD_CAPTURES.items()))
def test_parse_dd_stderr(name, nbytes):
    text = captured(name)
    r = bl.parse_dd_stderr(text)
    assert r["bytes"] == nbytes
    assert r["seconds"] > 0
    secs = re.search(r"copied, ([0-9.]+) s", text).group(1)
    assert r["seconds"] == float(secs)
    assert r["rate"] in text


def test_every_dd_capture_is_covered():
    names = {os.path.basename(p) for p in glob.glob(os.path.join(CAPTURED, "dd_*.stderr"))}
    assert names == set(DD_CAPTURES) | {"dd_error_nodir.stderr"}


def test_parse_dd_error_names_dds_message():
    with pytest.raises(bl.BaselineError, match="No such file or directory"):
        bl.parse_dd_stderr(captured("dd_error_nodir.stderr"))


def test_iperf3_argv_are_lists_with_values_as_separate_items():
    server = ik.server_argv("10.78.0.3", 5201, 30)
    assert server[:3] == ["iperf3", "-s", "-1"] and "--idle-timeout" in server
    client = ik.client_argv("10.78.0.3", 5201, 1 << 20, 65536, True, duration=2.0)
    assert client == ["iperf3", "-c", "10.78.0.3", "-p", "5201", "-J", "-t", "2", "-w", "1048576",
                      "-l", "65536", "-Z"]
    default = ik.client_argv("h", 1, None, None, False, duration=0.2)
    assert "-w" not in default and "-l" not in default and "-Z" not in default and default[-2:] == ["-t", "1"]


def test_commands_take_the_typed_settings_and_the_fixed_port():
    cfg = Iperf3Baseline(duration=3.0, omit=1)
    key = {"window": None, "buffer": 65536, "zerocopy": True}
    server, client = ik.KIND.commands(cfg, key, "10.78.0.3", ik.PORT)
    assert server == ["iperf3", "-s", "-1", "-B", "10.78.0.3", "-p", "5201", "--idle-timeout",
                      str(ik.IDLE_TIMEOUT), "--forceflush"]
    assert client == ["iperf3", "-c", "10.78.0.3", "-p", "5201", "-J", "-t", "3", "-O", "1", "-l", "65536", "-Z"]
    assert bl.dd_key(DdBaseline(bs=32768, count=4), "{scratch}") == \
        {"bs": 32768, "count": 4, "directory": "{scratch}", "filesystem": None, "bs_text": "32KiB"}


def test_iperf3_keys_once_per_distinct_pair_and_both_send_paths():
    params = [{"window": 1 << 20, "buffer": 65536}, {"window": 1 << 20, "buffer": 65536},
              {"window": "auto", "buffer": 65536}, {"window": None, "buffer": 65536}]
    keys = ik.KIND.keys(Iperf3Baseline(), params)
    assert keys == [{"window": 1 << 20, "buffer": 65536, "zerocopy": False},
                    {"window": 1 << 20, "buffer": 65536, "zerocopy": True},
                    {"window": None, "buffer": 65536, "zerocopy": False},
                    {"window": None, "buffer": 65536, "zerocopy": True}]
    assert len(ik.KIND.keys(Iperf3Baseline(per="sweep"), params)) == 2


def _iperf3_servers(tag: str):
    """iperf3 servers started by this test: they inherit its environment, TAG_VAR=tag among it (a parallel
    test's servers, or one orphaned to init, are told apart by it, not by a machine-wide count)."""
    return tagged_pids(tag, lambda argv: argv[0].endswith(b"iperf3") and b"-s" in argv)


@pytest.mark.parametrize("zerocopy", [False, True])
def test_run_iperf3_on_localhost_parses_and_kills_the_server(zerocopy, tag, monkeypatch):
    require_tool("iperf3")
    monkeypatch.setenv(TAG_VAR, tag)
    h = LocalHost()
    cfg = Iperf3Baseline(duration=1)
    rec = bl.run_server_client(ik.KIND, h, h, cfg, {"window": 1 << 20, "buffer": 65536, "zerocopy": zerocopy})
    assert rec["status"] == "ok", rec["reason"]
    assert rec["result"]["bits_per_second"] > 0
    assert rec["result"]["blksize"] == 65536
    assert ("-Z" in rec["argv"]) is zerocopy
    assert _iperf3_servers(tag) == []


def test_a_call_size_iperf3_cannot_send_is_skipped_with_why_not_started_to_fail(tag, monkeypatch):
    # a whole-file sendfile() cell calls with 1 GiB; iperf3 itself refuses -l above 1 MiB (its usage text)
    require_tool("iperf3")
    monkeypatch.setenv(TAG_VAR, tag)
    h = LocalHost()
    rec = bl.run_server_client(ik.KIND, h, h, Iperf3Baseline(duration=1),
                               {"window": None, "buffer": 1 << 30, "zerocopy": False})
    assert rec["status"] == "skipped" and "at most 1MiB" in rec["reason"] and "1GiB" in rec["reason"], rec
    assert "argv" not in rec and _iperf3_servers(tag) == []
    ran = h.run(ik.client_argv("127.0.0.1", 1, None, (1 << 20) + 1, False, duration=1), timeout=20)
    assert "block size too large" in ran.stderr + ran.stdout      # iperf3's own limit, just above 1 MiB


def test_run_iperf3_missing_tool_is_skipped_with_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # a real PATH without iperf3
    h = LocalHost()
    rec = bl.run_server_client(ik.KIND, h, h, Iperf3Baseline(duration=1),
                               {"window": None, "buffer": None, "zerocopy": False})
    assert rec["status"] == "skipped"
    assert "apt-get install iperf3" in rec["reason"]


def test_run_dd_in_a_directory_times_write_and_read_and_cleans_up(tmp_path):
    cfg = DdBaseline(bs=64 * 1024, count=16)
    recs = bl.run_dd(LocalHost(), sys.executable, cfg, str(tmp_path), filesystem=None)
    assert [r["kind"] for r in recs] == ["dd_write", "dd_read"]
    for r in recs:
        assert r["status"] == "ok", r["reason"]
        assert r["result"]["bytes"] == 64 * 1024 * 16
        assert r["result"]["wall_s"] > 0
        assert r["key"]["directory"] == str(tmp_path)
    assert "sync" in recs[0]["result"]["timed"]
    assert recs[1]["result"]["cached"] is not can_drop_caches()
    assert os.listdir(tmp_path) == []


@pytest.mark.root
def test_dd_as_a_study_ran_it_on_a_real_ext4_loop_device(tmp_path):
    # the ext4 page's dd: alone (no sync timed), on a filesystem already written to (a warm-up write first, a
    # record of its own), and beside it the same write with conv=fdatasync: real dd on a real ext4 loop device
    from fixtures_fs import external_loop, mounted
    cfg = DdBaseline(bs=1 << 20, count=8, sync=False, fdatasync=True, warmup=True)
    with external_loop(str(tmp_path), "64MiB", mkfs="ext4") as dev, mounted(dev, str(tmp_path)) as mnt:
        first = bl.run_dd(LocalHost(), sys.executable, cfg, mnt, filesystem="ext4", repeat=0)
        again = bl.run_dd(LocalHost(), sys.executable, cfg, mnt, filesystem="ext4", repeat=1)
        left = os.listdir(mnt)
    assert [r["kind"] for r in first] == ["dd_warmup", "dd_write", "dd_read", "dd_fdatasync"]
    assert [r["kind"] for r in again] == ["dd_write", "dd_read", "dd_fdatasync"]   # one warm-up per directory
    for r in first + again:
        assert r["status"] == "ok", r["reason"]
        assert r["result"]["bytes"] == 8 << 20 and r["result"]["wall_s"] > 0
        assert r["key"] == {"bs": 1 << 20, "count": 8, "directory": mnt, "filesystem": "ext4", "bs_text": "1MiB",
                            "sync": False}
    by_kind = {r["kind"]: r["result"] for r in first}
    assert "; sync" not in by_kind["dd_write"]["timed"] and "no sync timed" in by_kind["dd_write"]["timed"]
    assert "conv=fdatasync" in by_kind["dd_fdatasync"]["timed"] and "; sync" in by_kind["dd_warmup"]["timed"]
    # each write had a file of its own, and none is left behind
    assert len({r["result"]["path"] for r in first if r["kind"] != "dd_read"}) == 3
    assert left == ["lost+found"]


def test_dd_settings_parse_and_count_cells_needs_cells_with_bytes(tmp_path):
    from zcorch.config.baselines import Baselines
    from zcorch.config.experiment import load_experiment
    from zcorch.errors import ConfigError
    b = Baselines.from_mapping({"dd": {"sync": False, "fdatasync": True, "warmup": True}})
    assert (b.dd.sync, b.dd.fdatasync, b.dd.warmup, b.dd.count) == (False, True, True, 64)
    with pytest.raises(ConfigError, match="baselines.dd.fdatasync"):
        Baselines.from_mapping({"dd": {"fdatasync": "maybe"}})
    # `count: cells` follows the cells; cells that run for a time have no bytes to follow
    path = tmp_path / "exp.yaml"
    path.write_text("name: t\nparams: {source: mem, sink: /dev/null}\nmatrix: {bytes: [1MiB, 3MiB]}\n"
                    "baselines: {iperf3: false, dd: {bs: 64KiB, count: cells}}\n")
    assert load_experiment(path).baselines.dd.count == 48
    assert load_experiment(path, ["bytes=640KiB"]).baselines.dd.count == 10
    with pytest.raises(ConfigError) as info:
        load_experiment(path, ["bytes=null", "duration=1s"])
    assert "exp.yaml:4:" in str(info.value) and "baselines.dd: `count: cells`" in str(info.value)
    with pytest.raises(ConfigError, match="more than the limit"):
        load_experiment(path, ["bytes=65GiB"])


def test_run_dd_into_missing_directory_fails_with_dds_message(tmp_path):
    recs = bl.run_dd(LocalHost(), sys.executable, DdBaseline(bs=4096, count=1), str(tmp_path / "nope"))
    assert recs[0]["status"] == "failed" and "No such file or directory" in recs[0]["reason"]
    assert recs[1]["status"] == "skipped"


def test_dd_directory_uses_scratch_for_devices():
    assert bl.dd_directory("/dev/null", "/tmp") == "/tmp"
    assert bl.dd_directory("/mnt/xfs/sink.bin", "/tmp") == "/mnt/xfs"


def test_omit_reaches_iperf3():
    assert "-O" in ik.client_argv("h", 1, None, None, False, duration=2, omit=1)


@pytest.mark.slow
def test_run_iperf3_waits_for_a_port_another_sweep_holds(monkeypatch):
    """Two sweeps started at once on one receiver: the second iperf3 server finds the port taken and starts
    again once it is free. The port is really taken (a listening socket, closed after 2 s); only the choice
    of port is forced (on localhost each test gets its own free port, so no real sweep pair can collide)."""
    import socket
    import threading
    import time

    require_tool("iperf3")
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    monkeypatch.setattr(bl, "free_local_port", lambda address: port)
    threading.Timer(2.0, holder.close).start()
    h = LocalHost()
    t0 = time.monotonic()
    rec = bl.run_server_client(ik.KIND, h, h, Iperf3Baseline(duration=1),
                               {"window": None, "buffer": 65536, "zerocopy": False})
    assert rec["status"] == "ok", rec
    assert time.monotonic() - t0 >= 2.0
    assert str(port) in rec["argv"]
    # a port that stays taken: the baseline fails with iperf3's reason once the wait is over
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    monkeypatch.setattr(bl, "free_local_port", lambda address: blocker.getsockname()[1])
    monkeypatch.setattr(bl, "SERVER_BUSY_WAIT", 0.0)
    try:
        rec = bl.run_server_client(ik.KIND, h, h, Iperf3Baseline(duration=1),
                                   {"window": None, "buffer": 65536, "zerocopy": False})
    finally:
        blocker.close()
    assert rec["status"] == "failed" and "Address already in use" in rec["reason"]


@pytest.mark.root
def test_a_tool_on_path_that_cannot_run_is_said_so_and_the_sweep_goes_on(tmp_path):
    """An `iperf3` that is there but not executable (a private mount namespace binds a non-executable file over
    the real one: nothing outside this test sees it): the baseline is skipped with "found ... cannot be run" and
    the fix, the sweep completes (exit 0), and no traceback; the host's raw calls say 126, never raise."""
    import shutil
    import subprocess

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (a private mount namespace)")
    real = shutil.which("iperf3") or pytest.skip("iperf3 not installed")
    fake = tmp_path / "iperf3"
    fake.write_text("#!/bin/sh\necho fake\n")
    fake.chmod(0o644)
    exp = tmp_path / "tiny.yaml"
    exp.write_text("name: tiny-iperf\nhosts: localhost\nparams: {bytes: 4MiB, source: mem, timeout: 30s}\n"
                   "matrix: {send_mode: [write], recv_mode: [read]}\nrepeats: 1\n"
                   "baselines: {iperf3: {duration: 1s}, dd: false}\n")
    probe = ("from zcorch.hosts.local import LocalHost; h = LocalHost(); r = h.run(['iperf3', '--version']); "
             "print(r.returncode, r.stderr.strip())")
    script = (f"mount --bind {fake} {real} && {sys.executable} -c \"{probe}\" && "
              f"{sys.executable} -m zcorch -q run {exp} -o {tmp_path / 'rs'}")
    res = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stdout + res.stderr
    assert res.stdout.startswith("126 iperf3: found but cannot be run"), res.stdout
    records = [json.loads(line) for line in (tmp_path / "rs" / "baselines.jsonl").read_text().splitlines()]
    assert records and all(r["status"] == "skipped" and "cannot be run (not executable: chmod +x it" in r["reason"]
                           for r in records if r["kind"] == "iperf3"), records
    assert json.loads((tmp_path / "rs" / "manifest.json").read_text())["status"] == "complete"
