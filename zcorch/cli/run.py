"""`zcorch run FILE`: deploy, baselines, every cell, into a result set (docs/architecture.md).

Exit status: 0 when every run of the plan is ok, 1 when some failed (results still written),
130 on Ctrl-C (finished runs kept, result set marked interrupted; continue with --resume).

--resume DIR re-reads DIR/experiment.yaml (the byte copy), skips every (cell, repeat) whose
newest record is ok and runs each other one once; older records stay in runs.jsonl and the
newest record per (cell, repeat) wins.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import shlex
import signal
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, TextIO

from zcorch.sweep import baselines as bl
from zcorch.results import rates
from zcorch.provision import scratch
from zcorch.provision import sources
from zcorch._version import __version__
from zcorch.errors import ConfigError, HostError, ResultsError, ZcorchError
from zcorch.hosts.local import Host, LocalHost
from zcorch.results.store import ResultSet, latest_runs
from zcorch.sweep.runner import Runner, SweepOutcome, recv_argv, run_fields, send_argv

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("run", help="run an experiment (baselines + every cell) into a result set",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("file", nargs="?", help="experiment file (YAML); optional with --resume")
    p.add_argument("-o", "--output", metavar="DIR", help="result directory (default results/<name>-<UTC time>/)")
    p.add_argument("--resume", metavar="DIR", help="continue the result set in DIR (uses its experiment.yaml)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan and every command that would run; change nothing anywhere")
    p.add_argument("--accept-new-host-keys", action="store_true",
                   help="trust SSH host keys not yet in known_hosts (otherwise they are refused)")
    p.set_defaults(func=main)
    return p


# ---------------------------------------------------------------------------------------------
# Accessors that tolerate the spec object being a dataclass or a mapping.

def _get(obj: Any, key: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(key, default)
    return getattr(obj, key, default)


def _load(path: str):
    from zcorch import plan as planmod
    from zcorch.config import experiment as spec

    exp = spec.load_experiment(path)
    return exp, planmod.expand(exp)


def _plan_json(plan) -> List[dict]:
    out = []
    for run in plan.runs:
        cell, repeat, params = run_fields(run)
        out.append({"id": cell, "repeat": repeat, "params": params})
    return out


def _is_localhost(hosts_spec: Any) -> bool:
    return hosts_spec in (None, "localhost") or _get(hosts_spec, "kind") == "localhost" or \
        _get(hosts_spec, "localhost", False) is True


# ---------------------------------------------------------------------------------------------
# Hosts and the worker command on them

class Sweep:
    """Hosts, worker commands and interpreters for one `zcorch run` (closed by close())."""

    def __init__(self, hosts: Dict[str, Host], worker: Dict[str, List[str]], env: Dict[str, Dict[str, str]],
                 python: Dict[str, str]):
        self.hosts, self.worker, self.env, self.python = hosts, worker, env, python

    def close(self) -> None:
        for h in {id(h): h for h in self.hosts.values()}.values():
            h.close()


def local_worker_command() -> tuple:
    """Worker on this machine: this interpreter with the checkout on PYTHONPATH (as deploy gives it)."""
    return [sys.executable, "-m", "zcorch.worker"], {"PYTHONPATH": REPO_ROOT}


def open_sweep(exp: Any, accept_new_host_keys: bool, cfg: bl.BaselineConfig) -> Sweep:
    """Connect (persistent SSH per host, or LocalHost), preflight, deploy and version-check the worker."""
    from zcorch.provision import deploy
    from zcorch.lab import netns as lab

    hosts = lab.open_hosts(_get(exp, "hosts"), accept_new_host_keys)
    try:
        remote = not hosts["receiver"].is_local
        ports = [cfg.iperf3.port] if cfg.iperf3.enabled and remote else []
        # Remote hosts must have iperf3 when the file asks for it; on localhost a missing iperf3
        # only makes the baseline `skipped` (with the fix in the reason).
        handles = deploy.prepare(hosts, need_iperf3=cfg.iperf3.enabled and remote, ports=ports)
    except BaseException:
        for h in {id(h): h for h in hosts.values()}.values():
            h.close()
        raise
    return Sweep(hosts, {r: list(h.worker_argv) for r, h in handles.items()},
                 {r: dict(h.env) for r, h in handles.items()}, {r: h.python for r, h in handles.items()})


# ---------------------------------------------------------------------------------------------
# Progress and summary

class Progress:
    """runs done/total, failures, ETA on stderr: one updating line on a tty, one line per run otherwise."""

    def __init__(self, total: int, already: int, stream: TextIO = sys.stderr):
        self.total, self.already, self.stream = total, already, stream
        self.tty = stream.isatty()
        self.t0 = time.monotonic()

    def __call__(self, record: dict, outcome: SweepOutcome, todo: int) -> None:
        done_now = outcome.ok + outcome.failed
        elapsed = time.monotonic() - self.t0
        eta = elapsed / done_now * (todo - done_now) if done_now else 0.0
        text = (f"[{self.already + done_now}/{self.total}] failures {outcome.failed}  ETA {_fmt_secs(eta)}  "
                f"{record['cell']} r{record['repeat']}: {record['status']}")
        if record["status"] != "ok" and record.get("reason"):
            text += f" ({record['reason'][:160]})"
        if self.tty:
            self.stream.write("\r\x1b[K" + text[:max(20, _term_width() - 1)])
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def end(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _term_width() -> int:
    try:
        return os.get_terminal_size(2).columns
    except OSError:
        return 100


def _fmt_secs(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _median(values: List[float]) -> str:
    return f"{statistics.median(values):.2f}" if values else "-"


def summary_table(plan_runs: List[dict], records: List[dict], varying: Sequence[str] = ("send_mode", "recv_mode"),
                  baselines: Sequence[dict] = ()) -> str:
    """The end-of-run table: per cell its varying parameters, median throughput (as the receiver saw
    it), median CPU seconds per GiB on each side, ok/failed; then one line per baseline."""
    from zcorch.cli.plan import text_table
    from zcorch.config.experiment import format_value

    latest = latest_runs(records)
    by_cell: Dict[str, List[dict]] = {}
    for run in plan_runs:
        by_cell.setdefault(run["id"], []).append(run)
    rows = []
    for cell, runs in by_cell.items():
        recs = [latest.get((cell, r["repeat"])) for r in runs]
        ok = [r for r in recs if r and r["status"] == "ok" and (r.get("receiver") or {}).get("wall_ns")]
        gbit = [rates.gbit_s(r["receiver"]["bytes"], r["receiver"]["wall_ns"]) for r in ok]
        cpu = {side: [rates.cpu_s_per_gib(m["utime_us"], m["stime_us"], m["bytes"])
                      for m in (r.get(side) or {} for r in ok) if m.get("bytes")]
               for side in ("sender", "receiver")}
        failed = sum(1 for r in recs if r and r["status"] != "ok")
        params = runs[0]["params"]
        rows.append([cell, *(format_value(k, params.get(k)) for k in varying), _median(gbit),
                     _median(cpu["sender"]), _median(cpu["receiver"]), f"{len(ok)}/{failed}"])
    head = ["cell", *varying, "Gbit/s", "send CPU-s/GiB", "recv CPU-s/GiB", "ok/failed"]
    lines = text_table(head, rows)
    for b in baselines:
        lines.append("baseline " + bl.describe_result(b))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Baselines and metadata

def _iperf3_for_sweep(rs: ResultSet, sweep: Sweep, cfg: bl.BaselineConfig, plan_runs: List[dict]) -> None:
    if not cfg.iperf3.enabled:
        return
    done = {_key(b) for b in rs.baselines() if b.get("kind") == "iperf3" and b.get("status") == "ok"}
    for key in bl.iperf3_keys(cfg.iperf3, [r["params"] for r in plan_runs]):
        if _key({"kind": "iperf3", "key": key}) in done:
            continue
        rs.append_baseline(bl.run_iperf3(sweep.hosts["sender"], sweep.hosts["receiver"], cfg.iperf3, key))


def _key(b: dict) -> str:
    import json
    return json.dumps([b.get("kind"), b.get("key")], sort_keys=True)


def _dd_hook(rs: ResultSet, sweep: Sweep, cfg: bl.BaselineConfig, scratch_dirs: Dict[str, str]):
    done = {_key(b) for b in rs.baselines() if b.get("status") == "ok"}

    def before_directory(filesystem: Optional[str], sink: str) -> None:
        if not cfg.dd.enabled:
            return
        # As written (`{scratch}` stays in the key, so keys match across users); dd runs in the resolved one.
        written = bl.dd_directory(sink, cfg.dd.scratch)
        key = _key({"kind": "dd_write", "key": bl.dd_key(cfg.dd, written, filesystem)})
        if key in done:
            return
        done.add(key)  # a file sink in the scratch directory and /dev/null's scratch: one dd, not two
        directory = scratch.substitute(written, scratch_dirs.get("receiver"))
        for rec in bl.run_dd(sweep.hosts["receiver"], sweep.python["receiver"], cfg.dd, directory, filesystem,
                             written_directory=written):
            rs.append_baseline(rec)

    return before_directory


def prepare_scratch(sweep: Sweep, plan_runs: List[dict], cfg: bl.BaselineConfig) -> Dict[str, str]:
    """Resolve `{scratch}` on the hosts whose paths use it (creating it, 0700): {role: directory}."""
    needed = scratch.needs((r["params"] for r in plan_runs), cfg.dd.scratch if cfg.dd.enabled else None)
    infos = scratch.prepare_all(sweep.hosts, sweep.python, needed, log=_say)
    return {role: info["path"] for role, info in infos.items()}


def collect_meta(sweep: Sweep, plan_runs: List[dict], scratch_dirs: Optional[Dict[str, str]] = None) -> dict:
    """meta.json: controller and hosts; `hosts.<role>.scratch` = the `{scratch}` directory there, if used."""
    from zcorch.sweep import metadata

    scratch_dirs = scratch_dirs or {}
    sink = next((r["params"].get("sink") for r in plan_runs if r["params"].get("sink")), "")
    sink = scratch.substitute(sink, scratch_dirs.get("receiver"))
    meta: Dict[str, Any] = {"controller": metadata.controller_meta(), "hosts": {}, "filesystems": {}}
    for role in ("sender", "receiver"):
        path = sink if role == "receiver" and "{" not in (sink or "") else ""
        try:
            meta["hosts"][role] = metadata.collect_host(sweep.hosts[role], sweep.python[role], None, path)
        except HostError as exc:
            meta["hosts"][role] = {"error": str(exc)}
        if role in scratch_dirs:
            meta["hosts"][role]["scratch"] = scratch_dirs[role]
    return meta


# ---------------------------------------------------------------------------------------------
# Dry run

class _DryRunHost(Host):
    """Stands for a remote receiver in --dry-run: it answers $HOME with a marker and runs nothing."""

    HOME = "/__remote_home__"
    is_local = False

    def __init__(self, name: str):
        self.name, self.data_address = name, ""

    def run(self, argv, timeout=60.0, env=None, input=None):
        from zcorch.hosts.local import CommandResult

        if list(argv) == ["printenv", "HOME"]:
            return CommandResult(list(argv), 0, self.HOME + "\n", "")
        raise HostError(f"dry run: refusing to run {shlex.join(argv)} on {self.name}")

def dry_run(exp: Any, plan_runs: List[dict], cfg: bl.BaselineConfig, out: TextIO = sys.stdout) -> None:
    """The plan and every command `zcorch run` would run. Opens no connection at all."""
    hosts_spec = _get(exp, "hosts")
    local = _is_localhost(hosts_spec)
    if local:
        worker, _ = local_worker_command()
        workers = {"sender": worker, "receiver": worker}
        addr = {"sender": "127.0.0.1", "receiver": "127.0.0.1"}
        out.write("# hosts: localhost (no SSH, no deploy)\n")
    else:
        workers, addr = {}, {}
        for role in ("sender", "receiver"):
            spec_ = _get(hosts_spec, role)
            out.write(f"# {role}: ssh {_get(spec_, 'ssh')} (data address {_get(spec_, 'data_address')}): "
                      f"deploy the worker into {_get(spec_, 'workdir', '~/.cache/zcorch')} and build it\n")
            workers[role] = [_get(spec_, "python", None) or "python3", "-m", "zcorch.worker"]
            addr[role] = _get(spec_, "data_address")
    out.write(f"# plan: {len(plan_runs)} runs, {len({r['id'] for r in plan_runs})} cells\n")
    # {scratch} is shown resolved where that needs no connection (localhost), as written otherwise.
    needed = scratch.needs((r["params"] for r in plan_runs), cfg.dd.scratch if cfg.dd.enabled else None)
    scratch_dirs: Dict[str, str] = {}
    for role in needed:
        if local:
            scratch_dirs[role] = scratch.local_directory()
            note = f"= {scratch_dirs[role]} (created with mode 0700 if missing)"
        else:
            workdir = _get(_get(hosts_spec, role), "workdir", None) or "~/.cache/zcorch"
            note = f"= {workdir.rstrip('/')}/scratch there, resolved and created (0700) once connected"
        out.write(f"# {scratch.PLACEHOLDER} on the {role} {note}\n")
    plan_runs = [dict(r, params=scratch.resolve_params(r["params"], scratch_dirs)) for r in plan_runs]
    dd_scratch = scratch.substitute(cfg.dd.scratch, scratch_dirs.get("receiver"))
    if cfg.iperf3.enabled:
        for key in bl.iperf3_keys(cfg.iperf3, [r["params"] for r in plan_runs]):
            server, client = bl.iperf3_commands(cfg.iperf3, addr["receiver"], key, cfg.iperf3.port)
            out.write(f"receiver$ {shlex.join(server)}\nsender$ {shlex.join(client)}\n")
    dirs = []
    for r in plan_runs:
        d = (r["params"].get("filesystem"), bl.dd_directory(r["params"].get("sink") or "/dev/null", dd_scratch))
        if cfg.dd.enabled and d not in dirs:
            dirs.append(d)
            fs_note = f"  # on filesystem {d[0]} (after provisioning)" if d[0] else ""
            out.write(f"receiver$ {shlex.join(bl.dd_write_argv(d[1] + '/.zcorch-dd-PID', cfg.dd.bs, cfg.dd.count))}"
                      f"; sync; drop caches if root; "
                      f"{shlex.join(bl.dd_read_argv(d[1] + '/.zcorch-dd-PID', cfg.dd.bs, cfg.dd.count))}{fs_note}\n")
    configs = _get(exp, "filesystems") or {}
    if configs:
        from zcorch.provision.filesystems import FilesystemManager

        host = LocalHost() if local else _DryRunHost("receiver")
        fsman = FilesystemManager(host, configs, _fs_state_dir(exp), dry_run=True)
        for name in configs:
            out.write(f"# filesystem {name}: provisioned on the receiver before its first run, removed after its last\n")
            for argv in fsman.plan_commands(name):
                out.write(f"receiver$ {shlex.join(argv).replace(_DryRunHost.HOME, '~')}\n")
    for path, size in sources.needed_sources(r["params"] for r in plan_runs).items():
        out.write(f"sender$ {shlex.join(sources.layout_argv(workers['sender'], path, size))}"
                  f"  # lays out {path} ({bl.format_size(size)}, mem pattern) only if it does not exist\n")
    for r in plan_runs:
        out.write(f"# run {r['id']} repeat {r['repeat']}\n")
        out.write(f"receiver$ {shlex.join(recv_argv(workers['receiver'], addr['receiver'], r['params']))}\n")
        out.write(f"sender$ {shlex.join(send_argv(workers['sender'], addr['receiver'], 0, r['params']))}"
                  "  # port 0 = the port the receiver reports\n")
    out.flush()


# ---------------------------------------------------------------------------------------------

def _default_output(name: str) -> str:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return os.path.join("results", f"{name}-{stamp}")


def _say(message: str) -> None:
    print(f"zcorch run: {message}", file=sys.stderr)


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt


def main(args: argparse.Namespace) -> int:
    from zcorch.sweep.metadata import git_revision

    command = ["zcorch", "run", *sys.argv[2:]] if sys.argv[1:2] == ["run"] else list(sys.argv)
    if args.resume:
        rs_dir = args.resume
        rs_probe = os.path.join(rs_dir, "experiment.yaml")
        if not os.path.exists(os.path.join(rs_dir, "manifest.json")):
            raise ResultsError(f"--resume {rs_dir}: not a zcorch result set (no manifest.json)")
        exp_path = rs_probe
    else:
        if not args.file:
            raise ConfigError("zcorch run: give an experiment FILE (or --resume DIR)")
        exp_path = args.file
    try:
        with open(exp_path, "rb") as f:
            exp_bytes = f.read()
    except OSError as exc:
        raise ConfigError(f"{exp_path}: cannot read the experiment file ({exc.strerror})") from None
    exp, plan = _load(exp_path)
    plan_runs = _plan_json(plan)
    cfg = bl.baseline_config(_get(exp, "baselines"))
    name = _get(exp, "name") or os.path.splitext(os.path.basename(exp_path))[0]

    if args.dry_run:
        dry_run(exp, plan_runs, cfg)
        return 0

    if args.resume:
        rs = ResultSet.open_for_resume(args.resume, command)
        stored = rs.plan_runs()
        if [(r["id"], r["repeat"]) for r in stored] != [(r["id"], r["repeat"]) for r in plan_runs]:
            raise ResultsError(f"{args.resume}: its experiment.yaml now expands to other cells than its plan.json "
                               "(planned by another zcorch version?); start a new result set instead")
    else:
        out_dir = args.output or _default_output(name)
        rs = ResultSet.create(out_dir, name=name, experiment_bytes=exp_bytes, plan_runs=plan_runs, command=command,
                              accept_new_host_keys=args.accept_new_host_keys, zcorch_version=__version__,
                              git_revision=git_revision())
    skip = rs.ok_keys()
    print(f"zcorch run: {len(plan_runs)} runs ({len(skip)} already ok) -> {rs.dir}", file=sys.stderr)

    old_term = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    sweep = None
    fsman = None
    warnings: List[str] = []
    progress = Progress(len(plan_runs), len(skip))
    try:
        sweep = open_sweep(exp, args.accept_new_host_keys, cfg)
        # Before anything uses a path: meta's sink probe, source layout, the dd baseline, the runs.
        scratch_dirs = prepare_scratch(sweep, plan_runs, cfg)
        meta = collect_meta(sweep, plan_runs, scratch_dirs)
        rs.write_meta(meta)
        fsman = _filesystem_manager(exp, sweep, warnings, _filesystems_used(plan_runs))
        _iperf3_for_sweep(rs, sweep, cfg, plan_runs)
        todo = [scratch.resolve_params(r["params"], scratch_dirs) for r in plan_runs
                if (r["id"], r["repeat"]) not in skip]
        laid, source_errors = sources.lay_out(sweep.hosts["sender"], sweep.worker["sender"], sweep.env["sender"],
                                              sources.needed_sources(todo), _say)
        if laid:
            meta["sources_laid_out"] = laid
            rs.write_meta(meta, keep_previous=False)
        runner = Runner(sweep.hosts["sender"], sweep.hosts["receiver"], sweep.worker["sender"],
                        sweep.worker["receiver"], rs, worker_env=sweep.env, fsman=fsman, progress=progress,
                        before_directory=_dd_hook(rs, sweep, cfg, scratch_dirs), source_errors=source_errors,
                        scratch=scratch_dirs)
        outcome = runner.run_sweep(plan_runs, skip)
        warnings += runner.warnings
    except KeyboardInterrupt:
        outcome = SweepOutcome(status="interrupted")
    except ZcorchError:
        rs.finish("interrupted")
        raise
    finally:
        # Also after Ctrl-C or an error: the configurations provisioned so far are described in meta.json,
        # so the report can still show them next to the runs that were kept.
        if fsman is not None:
            _record_filesystems(rs, meta, fsman, _get(exp, "filesystems"), warnings)
        progress.end()
        signal.signal(signal.SIGTERM, old_term)
        if sweep is not None:
            sweep.close()
    rs.finish(outcome.status)
    if outcome.status == "complete":  # the first zcorch.load then reads runs.parquet, not every JSON line
        from zcorch.analysis.cache import write_cache  # pandas + pyarrow: imported only when a sweep ends
        write_cache(rs.dir)
    for w in warnings:
        print(f"zcorch run: warning: {w}", file=sys.stderr)
    print(summary_table(plan_runs, rs.runs(), plan.varying or ("send_mode", "recv_mode"), rs.baselines()))
    print(f"results: {rs.dir}")
    if outcome.status == "interrupted":
        print(f"zcorch run: interrupted; finished runs are kept. Continue with: zcorch run --resume {rs.dir}",
              file=sys.stderr)
        return 130
    latest = latest_runs(rs.runs())
    all_ok = all(latest.get((r["id"], r["repeat"]), {}).get("status") == "ok" for r in plan_runs)
    return 0 if all_ok else 1


def _record_filesystems(rs: ResultSet, meta: Dict[str, Any], fsman: Any, names: Any, warnings: List[str]) -> None:
    try:
        meta["filesystems"] = {name: fsman.describe(name) for name in names}
        rs.write_meta(meta, keep_previous=False)
    except ZcorchError as exc:
        warnings.append(f"could not record the filesystem descriptions in meta.json: {exc}")


def _fs_state_dir(exp: Any) -> str:
    hosts_spec = _get(exp, "hosts")
    workdir = _get(_get(hosts_spec, "receiver"), "workdir", None) if isinstance(hosts_spec, dict) else None
    return (workdir or "~/.cache/zcorch").rstrip("/") + "/fs"


def _filesystems_used(plan_runs: List[dict]) -> List[str]:
    """Names of the `filesystems:` entries some run of the plan uses, in first-use order."""
    return list(dict.fromkeys(r["params"]["filesystem"] for r in plan_runs if r["params"].get("filesystem")))


def _filesystem_manager(exp: Any, sweep: Sweep, warnings: List[str], used: List[str]):
    """zcorch.provision.filesystems' manager for the receiver when the experiment declares filesystems.

    Only the entries the plan uses are preflighted: an unused md entry must not fail the run.
    """
    configs = _get(exp, "filesystems")
    if not configs:
        return None
    from zcorch.errors import PreflightError
    from zcorch.provision.filesystems import FilesystemManager

    receiver = sweep.hosts["receiver"]
    state_dir = _fs_state_dir(exp)
    for undone in FilesystemManager.cleanup_stale(receiver, state_dir):
        warnings.append(f"undid a previous controller's leftover: {undone}")
    fsman = FilesystemManager(receiver, configs, state_dir,
                              log=lambda m: print(f"zcorch run: {m}", file=sys.stderr))
    problems = fsman.preflight(names=used)
    if problems:
        raise PreflightError("filesystem preflight failed:\n  " + "\n  ".join(problems))
    return fsman
