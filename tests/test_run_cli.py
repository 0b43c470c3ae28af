"""`zcorch run` as a user runs it: a subprocess on localhost with the real worker."""
import json
import os
import signal
import time

import pytest

from fixtures_run import REPO, stall_a_run, start_zcorch, tagged_worker_pids, wait_no_workers, wait_records, zcorch
from zcorch.worker.native import mem_pattern
from zcorch.results.store import latest_runs, read_jsonl

EXP = """name: {name}
params:
  bytes: {bytes}
  source: /dev/zero
  timeout: {timeout}
matrix:
  send_mode: [write, sendfile]
  buffer: [64KiB, 128KiB]
repeats: {repeats}
"""


# A test that checks no baseline says `baselines: false` in `extra`: the default baselines (iperf3 plain and -Z, dd)
# cost seconds of set-up a sweep; test_run_localhost_matrix_end_to_end checks what they record.
def write_exp(tmp_path, name="t", bytes="1MiB", timeout="10s", repeats=1, extra=""):
    path = tmp_path / f"{name}.yaml"
    path.write_text(EXP.format(name=name, bytes=bytes, timeout=timeout, repeats=repeats) + extra)
    return path


@pytest.mark.slow
def test_run_localhost_matrix_end_to_end(tmp_path, tag):
    exp = write_exp(tmp_path, extra="baselines:\n  iperf3: {duration: 1s}\n  dd: {bs: 64KiB, count: 8}\n")
    out = tmp_path / "rs"
    r = zcorch(tag, "run", exp, "-o", out)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(out)) == [".lock", "baselines.jsonl", "experiment.yaml", "logs", "manifest.json", "meta.json",
                                       "plan.json", "runs.jsonl", "runs.parquet"]
    assert (out / "experiment.yaml").read_bytes() == exp.read_bytes()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["name"] == "t" and manifest["finished"]
    runs = read_jsonl(str(out / "runs.jsonl"))
    plan = json.loads((out / "plan.json").read_text())
    assert [(r["cell"], r["repeat"]) for r in runs] == [(p["id"], p["repeat"]) for p in plan]
    assert all(r["status"] == "ok" for r in runs) and len(runs) == 4
    assert all((out / r["log"]).exists() for r in runs)
    kinds = [b["kind"] for b in read_jsonl(str(out / "baselines.jsonl"))]
    # Two distinct (window, buffer) pairs, each with plain and -Z iperf3; dd once for /dev/null's scratch.
    assert kinds.count("iperf3") == 4 and kinds.count("dd_write") == 1 and kinds.count("dd_read") == 1
    meta = json.loads((out / "meta.json").read_text())
    assert meta["hosts"]["receiver"]["interface"]["name"] == "lo"
    assert meta["controller"]["zcorch_version"]
    # Summary: one row per cell with its varying parameters, then the baselines; progress: one line per
    # run on a non-tty stderr.
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines() if line.strip()}
    assert rows["cell"][:3] == ["cell", "send_mode", "buffer"]
    assert {p["id"] for p in plan} <= set(rows)
    assert sorted(rows[p["id"]][1] for p in plan) == ["sendfile", "sendfile", "write", "write"]
    assert r.stdout.count("baseline iperf3") == 4 and f"results: {out}" in r.stdout
    assert r.stderr.count("[") >= 4 and "[4/4] failures 0" in r.stderr
    assert wait_no_workers(tag) == []


@pytest.mark.slow
def test_failed_run_gives_exit_1_and_keeps_results(tmp_path, tag):
    exp = tmp_path / "bad.yaml"
    exp.write_text(f"name: bad\nparams:\n  bytes: 1MiB\n  sink: {tmp_path}/no-such-dir/sink.bin\n"
                   "matrix:\n  buffer: [64KiB]\nbaselines: false\n")
    r = zcorch(tag, "run", exp, "-o", tmp_path / "rs")
    assert r.returncode == 1, r.stderr
    (rec,) = read_jsonl(str(tmp_path / "rs" / "runs.jsonl"))
    assert rec["status"] == "failed" and "cannot open sink" in rec["reason"]
    assert "failures 1" in r.stderr


def test_dry_run_prints_commands_and_touches_nothing(tmp_path, tag):
    exp = write_exp(tmp_path, extra="baselines:\n  iperf3: {duration: 1s}\n")
    r = zcorch(tag, "run", exp, "--dry-run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("zcorch.worker recv --listen 127.0.0.1:0") == 4
    assert r.stdout.count("zcorch.worker send --connect") == 4
    assert "iperf3 -c 127.0.0.1" in r.stdout and " -Z" in r.stdout
    assert not (tmp_path / "results").exists()


def test_dry_run_of_a_remote_experiment_opens_no_connection(tmp_path, tag):
    # Port 1 on loopback: nothing listens; a connection attempt would fail the command.
    exp = write_exp(tmp_path, extra="hosts:\n  sender: {ssh: 'root@127.0.0.1:1', data_address: 127.0.0.1}\n"
                                    "  receiver: {ssh: 'root@127.0.0.1:1', data_address: 127.0.0.1}\n")
    r = zcorch(tag, "run", exp, "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "ssh root@127.0.0.1:1" in r.stdout
    # the worker on the host: never from the current directory (-P, or the bootstrap that drops it)
    workers = [line for line in r.stdout.splitlines() if "zcorch.worker" in line and " recv --listen" in line]
    assert workers and all((" -P -m zcorch.worker recv" in w or 'run_module("zcorch.worker"' in w)
                           for w in workers), workers


def test_dry_run_shows_scratch_resolved_on_localhost_and_as_written_for_remote_hosts(tmp_path, tag):
    body = ('params: {bytes: 1MiB, send_mode: mmap, source: "{scratch}/src.dat", recv_mode: mmap, '
            'sink: "{scratch}/recv.dat"}\nbaselines: {iperf3: false, dd: {scratch: "{scratch}"}}\n')
    local = tmp_path / "local.yaml"
    local.write_text("name: local\n" + body)
    home = tmp_path / "home"
    r = zcorch(tag, "run", local, "--dry-run", env={"HOME": str(home)})
    assert r.returncode == 0, r.stderr
    where = f"{home}/.cache/zcorch/scratch"
    assert f"# {{scratch}} on the sender = {where} (created with mode 0700 if missing)" in r.stdout
    assert f"--source {where}/src.dat" in r.stdout and f"--sink {where}/recv.dat" in r.stdout
    assert f"layout --path {where}/src.dat" in r.stdout and f"of={where}/.zcorch-dd-PID" in r.stdout
    assert "{scratch}/" not in r.stdout.replace("# {scratch} on the", "")
    assert not (home / ".cache" / "zcorch").exists()  # a dry run creates nothing
    remote = tmp_path / "remote.yaml"
    remote.write_text("name: remote\nhosts:\n  sender: {ssh: 'root@127.0.0.1:1', data_address: 127.0.0.1}\n"
                      "  receiver: {ssh: 'root@127.0.0.1:1', data_address: 127.0.0.1, workdir: /srv/zc}\n" + body)
    r = zcorch(tag, "run", remote, "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "# {scratch} on the sender = ~/.cache/zcorch/scratch there, resolved and created (0700) once " \
           "connected" in r.stdout
    assert "# {scratch} on the receiver = /srv/zc/scratch there" in r.stdout
    assert "--source '{scratch}/src.dat'" in r.stdout and "--sink '{scratch}/recv.dat'" in r.stdout
    assert "layout --path '{scratch}/src.dat'" in r.stdout


def test_unreachable_host_is_a_clear_error(tmp_path, tag):
    exp = write_exp(tmp_path, extra="hosts:\n  sender: {ssh: 'root@127.0.0.1:1', data_address: 127.0.0.1}\n"
                                    "  receiver: {ssh: 'root@127.0.0.1:1', data_address: 127.0.0.1}\n")
    r = zcorch(tag, "run", exp, "-o", tmp_path / "rs")
    assert r.returncode == 1
    assert "Traceback" not in r.stderr and "127.0.0.1" in r.stderr
    assert json.loads((tmp_path / "rs" / "manifest.json").read_text())["status"] == "interrupted"


@pytest.mark.slow
def test_sigint_mid_sweep_keeps_finished_runs_and_leaves_no_worker(tmp_path, tag):
    exp = write_exp(tmp_path, bytes="2GiB", timeout="60s", repeats=3, extra="baselines: false\n")
    out = tmp_path / "rs"
    p = start_zcorch(tag, "run", exp, "-o", out)
    wait_records(out / "runs.jsonl", 1)
    time.sleep(0.3)  # into the next run
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    runs = read_jsonl(str(out / "runs.jsonl"))
    assert runs[0]["status"] == "ok" and len(runs) < 12
    assert "--resume" in err
    assert wait_no_workers(tag, 2.0) == []


@pytest.mark.slow
def test_resume_after_sigkill_loses_and_duplicates_nothing(tmp_path, tag):
    exp = write_exp(tmp_path, bytes="512MiB", timeout="60s", repeats=3, extra="baselines: false\n")
    out = tmp_path / "rs"
    p = start_zcorch(tag, "run", exp, "-o", out)
    wait_records(out / "runs.jsonl", 2)
    rx, tx = stall_a_run(lambda: tagged_worker_pids(tag))
    p.kill()
    p.wait()
    # A controller killed by SIGKILL cannot clean up; its worker server sees EOF on the stdin it held and
    # ends at once with every run it serves, long before their own --timeout (60 s): the blocked sender,
    # and the stopped receiver too (the server SIGKILLs their process groups).
    assert wait_no_workers(tag, 3.0) == []
    before = read_jsonl(str(out / "runs.jsonl"))
    assert 2 <= len(before) < 12
    r = zcorch(tag, "run", "--resume", out)
    assert r.returncode == 0, r.stderr
    runs = read_jsonl(str(out / "runs.jsonl"))
    plan = json.loads((out / "plan.json").read_text())
    ok = [(x["cell"], x["repeat"]) for x in runs if x["status"] == "ok"]
    assert sorted(ok) == sorted((p_["id"], p_["repeat"]) for p_ in plan)  # each exactly once
    assert runs[:len(before)] == before  # nothing rewritten
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and len(manifest["resumed"]) == 1


@pytest.mark.slow
def test_resume_reruns_failed_runs_and_newest_record_wins(tmp_path, tag):
    exp = write_exp(tmp_path, extra="baselines: false\n")
    out = tmp_path / "rs"
    assert zcorch(tag, "run", exp, "-o", out).returncode == 0
    runs = read_jsonl(str(out / "runs.jsonl"))
    # What a run that failed earlier leaves: its record appended after the ok one.
    failed = dict(runs[1], status="failed", reason="peer reset", sender=None, receiver=None)
    with open(out / "runs.jsonl", "a") as f:
        f.write(json.dumps(failed) + "\n")
    r = zcorch(tag, "run", "--resume", out)
    assert r.returncode == 0, r.stderr
    after = read_jsonl(str(out / "runs.jsonl"))
    assert len(after) == len(runs) + 2
    assert (after[-1]["cell"], after[-1]["repeat"]) == (runs[1]["cell"], runs[1]["repeat"])
    assert latest_runs(after)[(runs[1]["cell"], runs[1]["repeat"])]["status"] == "ok"


def test_resume_of_something_else_is_refused(tmp_path, tag):
    r = zcorch(tag, "run", "--resume", tmp_path)
    assert r.returncode == 2 and "not a zcorch result set" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow   # the shipped file as it is: 30 runs of its 1 s duration
def test_quickstart_runs_end_to_end(tmp_path, tag):
    # The shipped file as it is; HOME points into tmp_path, so its {scratch} (dd's directory) resolves to
    # tmp_path/home/.cache/zcorch/scratch. Every run lasts its `duration` (long enough for the host
    # CPU view), and the summary labels no interval.
    exp = os.path.join(REPO, "experiments", "quickstart.yaml")
    assert "/tmp" not in open(exp).read()
    home = tmp_path / "home"
    home.mkdir()
    scratch = home / ".cache" / "zcorch" / "scratch"
    r = zcorch(tag, "run", exp, "-o", tmp_path / "qs", timeout=600, env={"HOME": str(home)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert (scratch.stat().st_mode & 0o777) == 0o700
    assert f"created the {{scratch}} directory {scratch} on localhost (mode 0700)" in r.stderr
    runs = read_jsonl(str(tmp_path / "qs" / "runs.jsonl"))
    assert all(x["status"] == "ok" for x in runs) and len(runs) == 3 * 10  # 5 send x 2 receive modes
    duration = {x["params"]["duration"] for x in runs}.pop()
    assert duration >= 1.0
    for x in runs:  # the sender stops at the first chunk after the time; the receiver reads until EOF
        assert x["sender"]["wall_ns"] >= duration * 1e9 and x["receiver"]["wall_ns"] >= 0.95 * duration * 1e9
        assert "bytes" not in x["params"] or x["params"]["bytes"] is None
    assert "host-CPU resolution" in r.stdout and "95%" not in r.stdout and "with no interval" in r.stdout
    dd = [b for b in read_jsonl(str(tmp_path / "qs" / "baselines.jsonl")) if b["kind"].startswith("dd_")]
    assert [b["status"] for b in dd] == ["ok", "ok"]
    assert {b["key"]["directory"] for b in dd} == {"{scratch}"} and {b["directory"] for b in dd} == {str(scratch)}
    assert dd[0]["result"]["path"].startswith(str(scratch) + "/.zcorch-dd-")


# The quick start as it was when the {scratch} bug was found: every send mode, file sources and sinks in
# {scratch}, here with 4 MiB per run and one repeat (the shipped quick start keeps no file).
SCRATCH_QUICKSTART = """\
name: quickstart-small
hosts: localhost
params: {bytes: 4MiB, buffer: 128KiB, timeout: 30s}
matrix:
  send_mode: [write, mmap, sendfile, splice, vmsplice, msg_zerocopy]
  recv_mode: [read, mmap, vmsplice, splice]
  source: [mem, /dev/zero, "{scratch}/quickstart-source.dat"]
  sink: [/dev/null, "{scratch}/quickstart-sink.dat"]
exclude:
  - {send_mode: [write, vmsplice, msg_zerocopy], source: [/dev/zero, "{scratch}/quickstart-source.dat"]}
  - {send_mode: [sendfile, splice], source: [mem, "{scratch}/quickstart-source.dat"]}
  - {send_mode: mmap, source: [mem, /dev/zero]}
  - {recv_mode: [read, splice], sink: "{scratch}/quickstart-sink.dat"}
  - {recv_mode: [mmap, vmsplice], sink: /dev/null}
repeats: 1
baselines:
  iperf3: false
  dd: {bs: 1MiB, count: 64, scratch: "{scratch}"}
"""


def small_quickstart(directory):
    """SCRATCH_QUICKSTART in `directory` (every mode pair, file source and sinks in {scratch}, dd in {scratch})."""
    path = os.path.join(directory, "quickstart-small.yaml")
    with open(path, "w") as f:
        f.write(SCRATCH_QUICKSTART)
    os.chmod(path, 0o644)
    return path


def _stat_tree(directory):
    return {name: (st.st_ino, st.st_mtime_ns, st.st_uid)
            for name in os.listdir(directory) for st in [os.stat(os.path.join(directory, name))]}


@pytest.mark.timeout(180)
def test_quickstart_as_another_user_after_root_ran_it(tmp_path, tag, other_user):  # noqa: F811
    # The bug: root's quick-start left /tmp/zcorch-quickstart-sink.dat behind (root's, 0644), and a
    # non-root user's quick-start then failed every cell writing it (EACCES). With {scratch} each
    # user's files live in their own ~/.cache/zcorch/scratch: both sweeps succeed, neither touches
    # the other's files, and both result sets have the same cell ids.
    exp = small_quickstart(other_user.base)
    root_home = tmp_path / "root-home"
    root_home.mkdir()
    first = zcorch(tag, "run", exp, "-o", tmp_path / "root-rs", env={"HOME": str(root_home)})
    assert first.returncode == 0, first.stdout + first.stderr
    root_scratch = root_home / ".cache" / "zcorch" / "scratch"
    before = _stat_tree(root_scratch)
    assert set(before) == {"quickstart-source.dat", "quickstart-sink.dat"}
    assert {uid for _, _, uid in before.values()} == {0}

    user_rs = os.path.join(other_user.home, "rs")
    second = other_user.zcorch(tag, "run", exp, "-o", user_rs)
    assert second.returncode == 0, second.stdout + second.stderr
    runs = read_jsonl(os.path.join(user_rs, "runs.jsonl"))
    assert len(runs) == 24 and [x["status"] for x in runs] == ["ok"] * 24
    assert all(b["status"] == "ok" for b in read_jsonl(os.path.join(user_rs, "baselines.jsonl"))
               if b["kind"].startswith("dd_"))
    user_scratch = os.path.join(other_user.home, ".cache", "zcorch", "scratch")
    meta = json.loads(open(os.path.join(user_rs, "meta.json")).read())
    assert meta["hosts"]["sender"]["scratch"] == meta["hosts"]["receiver"]["scratch"] == user_scratch
    st = os.stat(user_scratch)
    assert st.st_uid == other_user.uid and st.st_mode & 0o777 == 0o700
    # Really written by the other user (not by root on its behalf):
    assert {uid for _, _, uid in _stat_tree(user_scratch).values()} == {other_user.uid}
    assert {x["receiver"]["params"]["sink"] for x in runs if x["params"]["recv_mode"] == "mmap"} == \
        {os.path.join(user_scratch, "quickstart-sink.dat")}
    assert _stat_tree(root_scratch) == before  # root's files untouched
    root_plan = json.loads((tmp_path / "root-rs" / "plan.json").read_text())
    user_plan = json.loads(open(os.path.join(user_rs, "plan.json")).read())
    assert [p["id"] for p in user_plan] == [p["id"] for p in root_plan]
    assert wait_no_workers(tag, 2.0) == []


@pytest.mark.slow
def test_source_layout_never_touches_existing_files(tmp_path, tag):
    short, new = tmp_path / "short.dat", tmp_path / "new.dat"
    short.write_bytes(b"mine" * 1000)
    exp = tmp_path / "src.yaml"
    exp.write_text(f"name: src\nparams: {{bytes: 1MiB, send_mode: sendfile, timeout: 10s}}\nbaselines: false\n"
                   f"matrix:\n  source: [{short}, {tmp_path}/no-such-dir/x.dat, {new}]\n")
    dry = zcorch(tag, "run", exp, "--dry-run")
    assert dry.returncode == 0 and dry.stdout.count(" layout --path ") == 3 and not new.exists()
    r = zcorch(tag, "run", exp, "-o", tmp_path / "rs")
    assert r.returncode == 1, r.stdout + r.stderr
    by_source = {x["params"]["source"]: x for x in read_jsonl(str(tmp_path / "rs" / "runs.jsonl"))}
    assert by_source[str(new)]["status"] == "ok" and new.stat().st_size == 1 << 20
    # A file shorter than a cell needs stays that cell's error; the user's bytes are untouched.
    assert "shorter than --bytes" in by_source[str(short)]["reason"]
    assert short.read_bytes() == b"mine" * 1000
    nodir = by_source[f"{tmp_path}/no-such-dir/x.dat"]
    assert nodir["status"] == "failed" and "could not be laid out" in nodir["reason"]
    assert "no-such-dir does not exist" in nodir["reason"] and nodir["log"] is None
    meta = json.loads((tmp_path / "rs" / "meta.json").read_text())
    assert [x["path"] for x in meta["sources_laid_out"]] == [str(new)]


@pytest.mark.slow
def test_a_scratch_source_laid_out_by_a_smaller_sweep_grows(tmp_path, tag):
    # The bug: `--set bytes=64MiB` laid out {scratch}/src.dat at 64 MiB, and the full sweep then failed
    # every cell ("shorter than --bytes"). A short scratch file holding the mem pattern is zcorch's own
    # and is laid out anew; a file of other bytes in the scratch directory is still never touched.
    home = tmp_path / "home"
    home.mkdir()
    exp = tmp_path / "grow.yaml"
    exp.write_text("name: grow\nparams: {bytes: 1MiB, send_mode: sendfile, timeout: 10s}\nbaselines: false\n"
                   "matrix:\n  source: ['{scratch}/src.dat', '{scratch}/theirs.dat']\n")
    env = {"HOME": str(home)}
    first = zcorch(tag, "run", exp, "-o", tmp_path / "small", "--set", "bytes=64KiB", env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    scratch_dir = home / ".cache" / "zcorch" / "scratch"
    src, theirs = scratch_dir / "src.dat", scratch_dir / "theirs.dat"
    assert src.stat().st_size == theirs.stat().st_size == 64 << 10
    theirs.write_bytes(b"not the pattern" * 4000)
    second = zcorch(tag, "run", exp, "-o", tmp_path / "full", env=env)
    assert second.returncode == 1, second.stdout + second.stderr
    by_source = {x["params"]["source"]: x for x in read_jsonl(str(tmp_path / "full" / "runs.jsonl"))}
    assert by_source["{scratch}/src.dat"]["status"] == "ok" and src.stat().st_size == 1 << 20
    from zcorch.worker.native import mem_pattern
    assert src.read_bytes() == mem_pattern(0, 1 << 20)
    assert "shorter than --bytes" in by_source["{scratch}/theirs.dat"]["reason"]
    assert theirs.read_bytes() == b"not the pattern" * 4000
    meta = json.loads((tmp_path / "full" / "meta.json").read_text())
    assert meta["sources_laid_out"] == [{"host": "localhost", "path": str(src), "size": 1 << 20,
                                         "grown_from": 64 << 10}]
    assert "laid out by an earlier sweep" in second.stderr + second.stdout


def test_filesystem_preflight_covers_only_the_entries_the_plan_uses(tmp_path, tag):
    # This machine has no md driver (/proc/mdstat): preflighting the md entry would fail the run.
    assert not os.path.exists("/proc/mdstat"), "the test needs a host without md support"
    here = tmp_path / "here"
    here.mkdir()
    md = "md-unused: {fs: ext4, raid: raid0, loop: {count: 2, size: 32MiB}}\n"
    exp = tmp_path / "fs.yaml"
    exp.write_text(f"name: fs\nparams: {{bytes: 1MiB, sink: '{{filesystem}}/recv.dat', filesystem: here}}\n"
                   f"filesystems:\n  here: {{path: {here}}}\n  {md}baselines: false\n")
    r = zcorch(tag, "run", exp, "-o", tmp_path / "rs")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (here / "recv.dat").stat().st_size == 1 << 20
    # The same entry used by a cell is preflighted, and refused with the reason.
    exp.write_text(exp.read_text().replace("filesystem: here", "filesystem: md-unused"))
    r = zcorch(tag, "run", exp, "-o", tmp_path / "rs2")
    assert r.returncode == 1 and "md driver" in r.stderr and "Traceback" not in r.stderr


def test_summary_table_of_a_real_result_set_shows_varying_params_cpu_cost_and_baselines():
    from zcorch.results import rates
    from zcorch.sweep.summary import summary_table

    d = os.path.join(REPO, "tests", "data", "filesystems-small")
    runs = read_jsonl(os.path.join(d, "runs.jsonl"))
    with open(os.path.join(d, "plan.json")) as f:
        plan = json.load(f)
    text = summary_table(plan, runs, ("recv_mode", "filesystem"), read_jsonl(os.path.join(d, "baselines.jsonl")))
    lines = text.splitlines()
    assert lines[0].split() == ["cell", "recv_mode", "filesystem", "Gbit/s", "send", "proc-CPU", "recv", "proc-CPU",
                                "send", "host-CPU", "recv", "host-CPU", "ok/failed", "zero-copy", "host-CPU", "resolution"]
    assert lines[len({r["id"] for r in plan}) + 1].startswith("CPU in seconds per GiB moved: proc = the worker process")
    # One row per cell with the medians of its ok runs, recomputed here from the records.
    cell = plan[0]["id"]
    ok = [r for r in runs if r["cell"] == cell and r["status"] == "ok"]
    gbit = sorted(rates.gbit_s(r["receiver"]["bytes"], r["receiver"]["wall_ns"]) for r in ok)[len(ok) // 2]
    recv_cpu = sorted(rates.cpu_s_per_gib(r["receiver"]["utime_us"], r["receiver"]["stime_us"],
                                          r["receiver"]["bytes"]) for r in ok)[len(ok) // 2]
    row = next(line.split() for line in lines if line.split()[0] == cell)
    assert row[1:3] == [plan[0]["params"]["recv_mode"], plan[0]["params"]["filesystem"]]
    # recorded before the host view existed: no host CPU ("-", resolution n/a); write -> read: no zero-copy reports
    assert row[3] == f"{gbit:.2f}" and row[5] == f"{recv_cpu:.2f}" and \
        row[6:] == ["-", "-", f"{len(ok)}/0", "n/a", "n/a"]
    dd = [line for line in lines if line.startswith("baseline dd write")]
    assert len(dd) == 4 and all(" on " in line and line.endswith("MB/s") for line in dd)


@pytest.mark.slow
@pytest.mark.parametrize("sig, name", [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "SIGINT (Ctrl-C)")])
def test_the_run_in_progress_records_the_signal_that_interrupted_it(tmp_path, tag, sig, name):
    """SIGTERM must not be recorded as "interrupted by the user (SIGINT)"."""
    exp = write_exp(tmp_path, bytes="512MiB", timeout="60s", repeats=3, extra="baselines: false\n")
    out = tmp_path / "rs"
    p = start_zcorch(tag, "run", exp, "-o", out)
    try:
        wait_records(out / "runs.jsonl", 1)
        rx, _ = stall_a_run(lambda: tagged_worker_pids(tag))   # a run in progress that cannot end by itself
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
        assert p.returncode == 130, err
    finally:
        if p.poll() is None:
            p.kill()
        try:
            os.kill(rx, signal.SIGCONT)
        except (ProcessLookupError, UnboundLocalError):
            pass
    [stopped] = [r for r in read_jsonl(str(out / "runs.jsonl")) if r["status"] == "interrupted"]
    assert stopped["reason"] == f"interrupted by {name} during the run"
    assert wait_no_workers(tag, 5.0) == []
