"""The baseline registry, proven by qperf: its parser on captured real output, its schema caps (and every
kind's), the dry-run hosts refusing what no kind declares, and qperf run for real on localhost (a whole
`zcorch run` into the report and zcorch.load_baselines) and across the two-host lab."""
import json
import os
from pathlib import Path

import pytest
import yaml

from conftest import require_tool
from fixtures_run import zcorch
from fixtures_spec import at, only_problem
from zcorch.config.baselines import Baselines, QperfBaseline
from zcorch.config.baselines.kind import BaselineError
from zcorch.config.baselines.qperf import KIND, parse_qperf
from zcorch.config.baselines.registry import KINDS
from zcorch.hosts.local import LocalHost
from zcorch.plan import load_plan
from zcorch.hosts.recording import RecordingHost, UndeclaredCommand
from zcorch.results.store import read_jsonl
from zcorch.sweep import baselines as bl

CAPTURED = Path(__file__).parent / "data" / "captured"


def captured(name):
    return (CAPTURED / name).read_text()


def test_parser_reads_the_exact_units_the_client_asks_for():
    r = parse_qperf(captured("qperf_tcp_bw_loopback.txt"))   # qperf ... -e 6 -uu -vv -m 65536 tcp_bw
    assert r["bytes_per_second"] == 878116864 and r["bits_per_second"] == 878116864 * 8
    assert r["msg_size_bytes"] == 65536 and r["seconds"] == 1.0
    assert r["send_cpus_used_percent"] == 199.01 and r["recv_cpus_used_percent"] == 200
    assert r["send_cpus_kernel_percent"] == 47.5248 and r["recv_cpus_user_percent"] == 136
    assert r["send_cost_s_per_gb"] == pytest.approx(2.277938642)
    assert r["send_bytes"] == 882376704 and r["recv_msgs"] == 13399


def test_parser_reads_qperfs_default_units_and_its_local_remote_split():
    r = parse_qperf(captured("qperf_tcp_bw_default_units.txt"))   # `841 MB/sec`, `64 KiB (65,536)`
    assert r["bytes_per_second"] == 841e6 and r["msg_size_bytes"] == 65536 and r["send_msgs"] == 12895
    assert r["send_bytes"] == 845_000_000 and r["recv_cost_s_per_gb"] == 2.38
    with pytest.raises(BaselineError, match="measured no data"):   # -m 0: loc_/rem_ figures, bw 0
        parse_qperf(captured("qperf_tcp_bw_zero_size.txt"))


def test_parser_reports_qperfs_own_words():
    with pytest.raises(BaselineError, match="127.0.0.1: failed to connect"):
        parse_qperf(captured("qperf_error_connect.txt"))
    with pytest.raises(BaselineError, match="-zz: bad option"):   # qperf says it on stdout too
        parse_qperf(captured("qperf_error_option.txt"))
    with pytest.raises(BaselineError, match=r"\(nothing\)"):
        parse_qperf("")
    with pytest.raises(BaselineError, match="unit `furlongs`"):
        parse_qperf("tcp_bw:\n    bw  =  3 furlongs\n")


def test_keys_and_argv_follow_the_cells():
    params = [{"buffer": 65536, "window": "auto"}, {"buffer": 65536, "window": "auto"},
              {"buffer": 131072, "window": 1 << 20}]
    assert KIND.keys(QperfBaseline(), params) == [{"window": None, "buffer": 65536},
                                                  {"window": 1 << 20, "buffer": 131072}]
    assert KIND.keys(QperfBaseline(per="sweep", msg_size=4096), params) == [{"window": None, "buffer": 4096}]
    server, client = KIND.commands(QperfBaseline(duration=1.5), {"window": 1 << 20, "buffer": 131072},
                                   "10.78.0.3", 19765)
    assert server == ["qperf", "-lp", "19765"]
    assert client == ["qperf", "10.78.0.3", "-lp", "19765", "-t", "2", "-ws", "10", "-e", "6", "-uu", "-vv",
                      "-m", "131072", "-sb", "1048576", "tcp_bw"]


def test_qperf_is_off_unless_written_and_parsed_like_the_others():
    assert Baselines().qperf is None
    b = Baselines.from_mapping({"qperf": {"duration": "3s", "msg_size": "64KiB"}})
    assert b.qperf == QperfBaseline(duration=3.0, msg_size=65536) and b.iperf3 is not None
    assert Baselines.from_mapping({"qperf": True}).qperf == QperfBaseline()


# Every duration and count of every kind is capped (`omit: 999999999999999999999` must not
# crash the controller with OverflowError): (kind, key, a value just inside, just outside, words of the error)
CAPS = [
    ("iperf3", "omit", 60, 61, "between 0 and 60"),
    ("iperf3", "omit", 60, 999999999999999999999, "between 0 and 60"),
    ("iperf3", "duration", "24h", "86401s", "at most 1 day"),
    ("qperf", "duration", "86400s", "48h", "at most 1 day"),
    ("qperf", "msg_size", "1GiB", "2GiB", "1073741824"),
    ("dd", "count", 16, 999999999999999999999, "too many blocks"),
    ("dd", "bs", "1MiB", "4GiB", "2147483647"),
]


@pytest.mark.parametrize("kind,key,inside,outside,words", CAPS)
def test_every_duration_and_count_is_capped_at_file_line(write_yaml, kind, key, inside, outside, words):
    ok = write_yaml(f"name: t\nbaselines:\n  {kind}:\n    {key}: {inside}\n", "ok.yaml")
    load_plan(ok)   # just inside: accepted
    path = write_yaml(f"name: t\nbaselines:\n  {kind}:\n    {key}: {outside}\n")
    p = only_problem(path)
    assert at(p, path, 4) and f"baselines.{kind}.{key}" in p and words in p, p
    r = zcorch("caps", "plan", path)
    assert r.returncode == 2 and "Traceback" not in r.stderr and words in r.stderr, r.stderr


@pytest.mark.parametrize("key,outside,words", [("repeats", 101, "between 1 and 100"),
                                               ("timeout", "200h", "at most 7 days"),
                                               ("bytes", "65GiB", "68719476736")])
def test_command_baseline_caps(write_yaml, key, outside, words):
    path = write_yaml("name: t\nbaselines:\n  commands:\n    - name: nc\n      receiver: [nc, -l, '{port}']\n"
                      f"      sender: [nc, '{{address}}', '{{port}}']\n      {key}: {outside}\n")
    p = only_problem(path)
    assert at(p, path, 7) and words in p, p


def test_every_kind_declares_what_the_generic_code_needs():
    for kind in KINDS:
        assert kind.name and kind.record_kinds and kind.phase
        conf = kind.default() or kind.settings() if not isinstance(kind.off, tuple) else ()
        assert all(t.package for t in kind.tools(conf))
        assert kind.estimate(conf, [{"buffer": 65536, "window": "auto", "filesystem": None}], 1e9, 0.5).seconds >= 0


def test_the_dry_run_host_answers_declared_commands_and_refuses_the_rest():
    h = RecordingHost("localhost", "127.0.0.1")
    assert h.run(["qperf", "--version"]).ok                      # the qperf kind's tool probe
    assert h.start(["qperf", "-lp", "5"]).readline(1) is not None  # its server "listens"
    assert h.run(["test", "-d", "/x"]).ok                        # a pipeline stage's (filesystems)
    with pytest.raises(UndeclaredCommand, match="no pipeline stage or baseline kind declares `netperf -H x`"):
        h.run(["netperf", "-H", "x"])
    with pytest.raises(UndeclaredCommand):
        h.start(["socat", "-", "TCP:x:1"])


def _qperf_servers():
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"qperf") and b"tcp_bw" not in argv:
            found.append(pid)
    return found


def test_run_qperf_on_localhost_parses_and_kills_the_server():
    require_tool("qperf")
    h = LocalHost()
    before = len(_qperf_servers())
    rec = bl.run_server_client(KIND, h, h, QperfBaseline(duration=1), {"window": None, "buffer": 65536})
    assert rec["kind"] == "qperf" and rec["status"] == "ok", rec["reason"]
    assert rec["result"]["bits_per_second"] > 0 and rec["result"]["msg_size_bytes"] == 65536
    assert rec["result"]["send_cpus_used_percent"] > 0 and rec["result"]["recv_cpus_used_percent"] > 0
    assert len(_qperf_servers()) <= before
    assert "qperf tcp_bw (buffer=64KiB window=auto)" in bl.describe_result(rec)


def test_run_qperf_missing_tool_is_skipped_with_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # a real PATH without qperf
    h = LocalHost()
    rec = bl.run_server_client(KIND, h, h, QperfBaseline(duration=1), {"window": None, "buffer": None})
    assert rec["status"] == "skipped" and "apt-get install qperf" in rec["reason"]


QPERF_EXP = {"name": "qp", "params": {"bytes": "1MiB", "source": "/dev/zero", "timeout": "10s"},
             "matrix": {"buffer": ["64KiB"]},
             "baselines": {"iperf3": False, "dd": False, "qperf": {"duration": "1s"}}}


@pytest.mark.slow
def test_qperf_in_a_localhost_run_the_report_and_load_baselines(tmp_path):
    require_tool("qperf")
    from zcorch import load_baselines

    path = tmp_path / "qp.yaml"
    path.write_text(yaml.safe_dump(QPERF_EXP))
    dry = zcorch("qp", "run", "--dry-run", path)
    assert dry.returncode == 0 and "qperf 127.0.0.1 -lp" in dry.stdout, dry.stdout + dry.stderr
    out = tmp_path / "rs"
    r = zcorch("qp", "run", path, "-o", out, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (rec,) = read_jsonl(str(out / "baselines.jsonl"))
    assert rec["kind"] == "qperf" and rec["status"] == "ok" and rec["key"] == {"window": None, "buffer": 65536}
    frame = load_baselines(out)
    assert list(frame["kind"]) == ["qperf"] and frame["gbit_s"].iloc[0] > 0
    assert frame["result_send_cpus_used_percent"].iloc[0] > 0
    rep = zcorch("qp", "report", out, "-o", tmp_path / "report.html")
    assert rep.returncode == 0, rep.stderr
    html = (tmp_path / "report.html").read_text()
    section = html[html.index('<h2 id="baselines">Baselines</h2>'):]
    assert "qperf" in section[:section.index("</table>")]


@pytest.mark.lab
@pytest.mark.root
def test_qperf_across_the_lab(lab, tmp_path):  # noqa: F811
    require_tool("qperf")
    exp = dict(QPERF_EXP, name="qplab", hosts=lab.hosts_spec)
    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump(exp))
    r = zcorch("qplab", "run", path, "-o", tmp_path / "rs", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (rec,) = read_jsonl(str(tmp_path / "rs" / "baselines.jsonl"))
    assert rec["kind"] == "qperf" and rec["status"] == "ok", rec
    assert rec["argv"][1] == lab.receiver.data and rec["host"] == "sender"
    assert rec["result"]["bits_per_second"] > 0 and rec["result"]["recv_cpus_used_percent"] > 0
    assert not [p for p in lab.zcorch_procs("receiver") if "qperf" in json.dumps(p)]
