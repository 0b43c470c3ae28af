"""Command baselines (`baselines.commands`): the section's validation, the pure argv filling, and real
sweeps running real nc/socat pairs over loopback and across the two lab hosts, failures included
(a program missing, a non-zero exit: recorded failed with the reason, the sweep goes on), and the
report's baselines table and Reproduction section with a study's figure for a command."""
from __future__ import annotations

import json

import pytest

from conftest import require_tool
from fixtures_analysis import zcorch_cli
from fixtures_run import zcorch
from zcorch.config.baselines import Baselines, CommandBaseline
from zcorch.errors import ConfigError
from zcorch.results.store import read_jsonl
from zcorch.sweep import commands

NC = {"name": "nc", "receiver": ["nc", "-l", "{address}", "{port}"], "sender": ["nc", "-N", "{address}", "{port}"],
      "stdin": "source", "stdout": "sink"}
SOCAT = {"name": "socat", "receiver": ["socat", "-u", "TCP-LISTEN:{port},bind={address},reuseaddr",
                                       "OPEN:{sink},creat,trunc"],
         "sender": ["socat", "-u", "OPEN:{source}", "TCP:{address}:{port}"]}


def _problems(data) -> str:
    with pytest.raises(ConfigError) as exc:
        Baselines.from_mapping(data, "exp.yaml")
    return str(exc.value)


def test_the_section_parses_and_says_what_is_wrong_where():
    b = Baselines.from_mapping({"commands": [dict(NC, repeats=3), SOCAT]})
    nc, socat = b.commands
    assert nc == CommandBaseline("nc", ("nc", "-N", "{address}", "{port}"), ("nc", "-l", "{address}", "{port}"),
                                 "source", "sink", None, 3, 600.0)
    assert socat.uses("sink") and socat.uses("source") and not nc.uses("bytes")
    assert b.iperf3 is not None and b.dd is not None   # the other kinds keep their defaults
    text = _problems({"commands": [dict(NC, receiver=["nc", "-l", "{prot}"])]})
    assert "exp.yaml:" in text and "baselines.commands[0].receiver: unknown placeholder `{prot}`" in text
    assert "did you mean `port`" in text
    assert "never a shell string" in _problems({"commands": [dict(NC, sender="nc -N host 1 < file")]})
    assert "missing `name`" in _problems({"commands": [{"sender": ["true"], "receiver": ["nc", "{port}"]}]})
    assert "`nc` is used twice" in _problems({"commands": [NC, NC]})
    assert "names `{port}`" in _problems({"commands": [dict(NC, receiver=["cat"], sender=["cat"])]})
    assert "baselines.commands[0].stdout" in _problems({"commands": [dict(NC, stdout="/etc/passwd")]})
    assert "unbalanced brace" in _problems({"commands": [dict(NC, sender=["nc", "{address", "{port}"])]})


def test_fill_keeps_one_argument_one_argument():
    values = {"address": "10.0.0.2", "port": "5301", "source": "/s p/a b", "sink": "/k", "bytes": "12"}
    argv = ["sh", "-c", "x; rm -rf /", "TCP:{address}:{port}", "{source}", "--bytes={bytes}"]
    assert commands.fill(argv, values) == ["sh", "-c", "x; rm -rf /", "TCP:10.0.0.2:5301", "/s p/a b", "--bytes=12"]


def _experiment(tmp_path, cmds, reference: str = "") -> str:
    exp = tmp_path / "cmd.yaml"
    exp.write_text("name: cmd\nparams: {bytes: 8MiB, source: mem, timeout: 30s}\nrepeats: 1\n"
                   "baselines:\n  iperf3: false\n  dd: false\n  commands: " + json.dumps(cmds) + "\n" + reference)
    return str(exp)


REFERENCE = """reference:
  source: {title: T}
  baselines:
    "command:nc": {value: 502.77 MB/s, command: "lftp get"}
"""


@pytest.mark.slow
def test_a_localhost_sweep_times_real_commands_and_records_failures(tmp_path, tag):
    require_tool("nc")
    require_tool("socat")
    home = tmp_path / "home"
    home.mkdir()
    cmds = [dict(NC, repeats=2), SOCAT,
            {"name": "missing", "receiver": ["no-such-program-zc", "{port}"], "sender": ["true"]},
            {"name": "fails", "receiver": ["nc", "-l", "{address}", "{port}"], "sender": ["sh", "-c", "exit 3"]},
            dict(NC, name="short", sender=["sh", "-c", "head -c 1000 | nc -N \"$0\" \"$1\"", "{address}", "{port}"])]
    exp = _experiment(tmp_path, cmds, REFERENCE)
    r = zcorch(tag, "run", exp, "-o", tmp_path / "rs", env={"HOME": str(home)})
    assert r.returncode == 0, r.stdout + r.stderr   # failed baselines do not fail the sweep
    recs = [b for b in read_jsonl(str(tmp_path / "rs" / "baselines.jsonl")) if b["kind"] == "command"]
    by = {(b["key"]["name"], b["repeat"]): b for b in recs}
    assert sorted(by) == [("fails", 0), ("missing", 0), ("nc", 0), ("nc", 1), ("short", 0), ("socat", 0)]
    for name in ("nc", "socat"):
        ok = by[(name, 0)]
        assert ok["status"] == "ok", ok
        assert ok["result"]["bytes"] == 8 << 20 and ok["result"]["sink_checked"] is True
        assert ok["result"]["bits_per_second"] == pytest.approx(8 * (8 << 20) / ok["result"]["wall_s"])
    assert by[("nc", 0)]["argv"]["sender"][-2:] == ["127.0.0.1", by[("nc", 0)]["argv"]["receiver"][-1]]
    assert "no-such-program-zc: not found" in by[("missing", 0)]["reason"]
    assert by[("fails", 0)]["status"] == "failed" and "sender on localhost: exit 3" in by[("fails", 0)]["reason"]
    assert "holds 1000 bytes, not the 8388608 sent" in by[("short", 0)]["reason"]
    # the source was laid out in the user's scratch directory; every sink is gone again
    scratch_dir = home / ".cache" / "zcorch" / "scratch"
    assert sorted(p.name for p in scratch_dir.iterdir()) == ["cmd-nc.src", "cmd-short.src", "cmd-socat.src"]
    assert "baseline command nc (8388608 bytes, repeat 1): " in r.stdout + r.stderr

    # the report: the baselines table lists them; the Reproduction section sets the study's FTP row next to nc
    md = zcorch_cli("report", tmp_path / "rs", "--format", "markdown")
    assert md.returncode == 0, md.stderr
    [row] = [line for line in md.stdout.splitlines() if line.startswith("| nc (command) |")]
    assert "502.77 MB/s" in row and "lftp get" in row and "median of 2" in row
    html = zcorch_cli("report", tmp_path / "rs")
    assert html.returncode == 0, html.stderr
    assert "no-such-program-zc: not found" in (tmp_path / "rs" / "report.html").read_text()

    # --resume runs only what is not ok yet (the failed ones again), keeping the ok records
    r = zcorch(tag, "run", "--resume", tmp_path / "rs", env={"HOME": str(home)})
    assert r.returncode == 0, r.stdout + r.stderr
    again = [b for b in read_jsonl(str(tmp_path / "rs" / "baselines.jsonl")) if b["kind"] == "command"]
    assert len(again) == len(recs) + 3 and again[:len(recs)] == recs


def test_a_reference_baseline_must_name_a_command(tmp_path, tag):
    exp = _experiment(tmp_path, [dict(NC, name="ncat")], REFERENCE)
    r = zcorch_cli("plan", exp)
    assert r.returncode == 2
    assert "reference.baselines.command:nc: no command baseline `nc` in baselines.commands" in r.stderr


@pytest.mark.lab
@pytest.mark.root
@pytest.mark.timeout(300)
def test_a_command_baseline_across_the_lab_hosts(lab, tmp_path, tag):  # noqa: F811
    require_tool("nc")
    exp = tmp_path / "cmd.yaml"
    exp.write_text("name: cmd-lab\nhosts: " + json.dumps(lab.hosts_spec) + "\n"
                   "params: {bytes: 16MiB, source: mem, timeout: 30s}\nrepeats: 1\n"
                   "baselines:\n  iperf3: false\n  dd: false\n  commands: " + json.dumps([NC]) + "\n")
    r = zcorch(tag, "run", exp, "-o", tmp_path / "rs", timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    [rec] = [b for b in read_jsonl(str(tmp_path / "rs" / "baselines.jsonl")) if b["kind"] == "command"]
    assert rec["status"] == "ok", rec
    assert rec["host"] == "sender" and rec["argv"]["receiver"][2] == lab.hosts_spec["receiver"]["data_address"]
    assert rec["argv"]["receiver"][3] == str(commands.COMMAND_PORT)
    assert rec["result"]["bytes"] == 16 << 20 and rec["result"]["sink_checked"]
    assert lab.zcorch_procs("sender") == [] and lab.zcorch_procs("receiver") == []


def test_a_dry_run_shows_both_ends_and_claims_no_outcome(tmp_path, tag):
    r = zcorch(tag, "run", _experiment(tmp_path, [NC]), "--dry-run")
    assert r.returncode == 0, r.stdout + r.stderr
    ends = [line for line in r.stdout.splitlines() if " command --timeout " in line]
    assert len(ends) == 2
    assert ends[0].endswith(" -- nc -l 127.0.0.1 " + ends[0].rsplit(" ", 1)[1]) and "--stdout " in ends[0]
    assert "--wait-go --stdin " in ends[1] and ends[1].split(" -- ")[1].startswith("nc -N 127.0.0.1 ")
    assert "command nc (" not in r.stdout + r.stderr   # no result line: nothing ran


# -- the worker's end of a command: nothing the command starts outlives it ------------------------------

def _ours(token: str) -> "list[int]":
    """Live processes whose command line holds `token` (the unique sleep durations of one test)."""
    import os

    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if token.encode() not in f.read():
                    continue
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
        except OSError:
            continue
        pids.append(int(pid))
    return pids


def _sleeping(token: str) -> bool:
    """Whether the command's `sleep` itself runs (not only the worker, whose argv names it too)."""
    for pid in _ours(token):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().startswith(b"sleep\0"):
                    return True
        except OSError:
            continue
    return False


def _kill_ours(token: str) -> None:
    import os
    import signal

    for pid in _ours(token):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _token() -> str:
    import random

    return f"{random.randint(100000, 999999)}"


def test_a_timed_out_command_is_killed_with_its_whole_tree(tmp_path):
    """`sh -c "sleep & setsid sleep"`: the background sleep stays in the group, the setsid one leaves it
    (and its session); both hold the stderr pipe. The timeout must kill all three and report it."""
    from fixtures_worker import parse_events, worker_argv, worker_env
    import subprocess

    t = _token()
    script = f"sleep 400.{t} & setsid sleep 401.{t} & sleep 402.{t}"
    try:
        p = subprocess.run(worker_argv("command", "--timeout", "1", "--", "sh", "-c", script), env=worker_env(),
                           capture_output=True, text=True, timeout=30)
        [exit_event] = [e for e in parse_events(p.stdout) if e["event"] == "exit"]
        assert exit_event["rc"] == -9 and "timeout of 1 s" in exit_event["error"], exit_event
        assert exit_event["killed"] >= 3 and "process" in exit_event["error"]
        assert 1.0 <= exit_event["wall_s"] < 10
        assert _ours(t) == []
    finally:
        _kill_ours(t)


def test_what_a_command_leaves_running_is_killed_when_it_exits(tmp_path):
    from fixtures_worker import parse_events, worker_argv, worker_env
    import subprocess

    t = _token()
    try:
        p = subprocess.run(worker_argv("command", "--timeout", "20", "--", "sh", "-c", f"setsid sleep 403.{t} & exit 0"),
                           env=worker_env(), capture_output=True, text=True, timeout=30)
        [exit_event] = [e for e in parse_events(p.stdout) if e["event"] == "exit"]
        assert exit_event["rc"] == 0 and exit_event["error"] is None, exit_event
        assert exit_event["leftover"] == 1 and exit_event["wall_s"] < 10
        assert _ours(t) == []
    finally:
        _kill_ours(t)


def test_sigterm_from_the_controller_kills_the_commands_tree(tmp_path):
    from fixtures_worker import parse_events, worker_argv, worker_env
    import signal
    import subprocess
    import time

    t = _token()
    p = subprocess.Popen(worker_argv("command", "--timeout", "60", "--", "sh", "-c", f"setsid sleep 404.{t}; :"),
                         env=worker_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not _sleeping(t) and time.monotonic() < deadline:   # the worker's own argv holds the token too
            time.sleep(0.05)
        assert _sleeping(t)
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=20)
        [exit_event] = [e for e in parse_events(out) if e["event"] == "exit"]
        assert "stopped by SIGTERM" in exit_event["error"] and exit_event["killed"] >= 2, exit_event
        assert _ours(t) == []
    finally:
        if p.poll() is None:
            p.kill()
        _kill_ours(t)
