"""`zcorch run` as a library: `run_sweep()` runs the stages of `STAGES` in order and never prints (it tells a
`SweepObserver`). A dry run is the same pipeline on RecordingHosts (zcorch.hosts.recording): nothing runs or
is written. --resume DIR reruns DIR/experiment.yaml, skipping each (cell, repeat) whose newest record is ok.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from zcorch._version import __version__
from zcorch.config.baselines import Baselines
from zcorch.config.baselines.kind import NETWORK
from zcorch.config.schema import DEFAULT_CALIBRATION_MAX_AGE_S
from zcorch.config.inventory import InventoryPair
from zcorch.errors import ConfigError, HostError, PreflightError, ResultsError, ResultsWriteError, ZcorchError
from zcorch.hosts.local import Host
from zcorch.hosts.parallel import per_host
from zcorch.hosts.recording import Recorded, recording_hosts
from zcorch.provision import scratch, sources
from zcorch.results.convergence import incomplete_cells
from zcorch.results.store import BASELINES, PLAN, RUNS, ResultSet, latest_runs, load_manifest, read_jsonl
from zcorch.sweep import baselines as bl
from zcorch.sweep import commands as cmds
from zcorch.sweep import interrupts
from zcorch.sweep.adaptive import Convergence
from zcorch.sweep.runner import Runner, SweepOutcome, run_fields
from zcorch.sweep.workerpool import WorkerPool
from zcorch.sweep.summary import summary_table

# (name, title) of each stage, in the order run_sweep enters them: what SweepObserver.stage() gets.
STAGES: Tuple[Tuple[str, str], ...] = (
    ("hosts", "open the hosts and take their leases (one sweep at a time per host: its network lease, and the "
              "receiver's filesystem lease when the experiment has filesystems), before anything loads them"),
    ("deploy", "restore a killed sweep's network changes (with or without `networks:`), preflight the hosts, "
               "deploy the worker, check its version and that each host can run its cells' modes"),
    ("scratch", "resolve {scratch} (create the directory, mode 0700)"),
    ("metadata", "host metadata for meta.json"),
    ("calibrate", "copy-cost calibration per host (memcpy, page fault, system call) for meta.json: the one "
                  "cached on the host while it holds (boot id, kernel, CPU model, governor, calibration_max_age)"),
    ("filesystems", "filesystem preflight (and a killed sweep's leftovers undone)"),
    ("network", "network preflight: opt-in, root, the data link and sysctls on both hosts (a killed sweep's "
                "changes restored)"),
    ("baselines", "network baselines (the kinds of zcorch.config.baselines that measure the path alone: "
                  "iperf3, qperf)"),
    ("sources", "lay out missing source files (only files that do not exist)"),
    ("commands", "command baselines (baselines.commands: the user's own transfer commands, timed)"),
    ("runs", "the runs (dd baseline before the first run in each sink directory; filesystems provisioned "
             "before their first run, removed after their last; each network applied before its group of "
             "runs, restored after)"),
    ("finish", "finish the result set"),
)
_TITLES = dict(STAGES)
# The stages before this one measure nothing: what else the controller does meanwhile cannot skew a result.
FIRST_MEASURING_STAGE = "calibrate"


class SweepObserver:
    """What run_sweep reports while it works. Every method does nothing here: override what you show."""

    def started(self, total: int, already_ok: int, result_dir: Optional[str]) -> None:
        """The plan has `total` runs, `already_ok` of them done (resume); result_dir is None in a dry run."""

    def stage(self, name: str, title: str) -> None:
        """A stage of STAGES begins."""

    def hosts_opened(self, hosts: Dict[str, Host]) -> None:
        """{"sender", "receiver"} (one object for both on localhost)."""

    def scratch_ready(self, infos: Dict[str, dict], hosts: Dict[str, Host]) -> None:
        """{role: {"path", "created", "mode"}} for the roles whose paths use `{scratch}`."""

    def command(self, entry: Recorded) -> None:
        """Dry run only: one command (or file copy) the sweep would run on a host."""

    def run_started(self, cell: str, repeat: int) -> None:
        """A run begins (not called for runs recorded failed without running)."""

    def run_done(self, record: dict, outcome: SweepOutcome, todo: int) -> None:
        """A run's record was written: outcome counts the runs so far, todo is the sweep's total as now expected."""

    def baseline_done(self, record: dict) -> None:
        """A baseline's record (iperf3, dd, a command...) was written."""

    def sweep_ended(self) -> None:
        """The runs are over (finished, failed or interrupted)."""

    def message(self, text: str) -> None:
        """Something the user should know (a directory created, a file laid out...)."""

    def warning(self, text: str) -> None:
        """A problem that lost no result (teardown incomplete...)."""


@dataclass
class SweepResult:
    """What run_sweep did. exit_status: 0 every planned run ok, 1 some failed, 130 interrupted."""

    status: str                      # complete | interrupted (as the manifest records it)
    exit_status: int
    dry_run: bool
    result_dir: Optional[str]        # None in a dry run
    plan_runs: List[dict]            # plan.json: [{"id", "repeat", "params"}]
    varying: Tuple[str, ...]         # the parameters that differ between cells
    records: List[dict]              # every run record of the result set (older ones too after --resume)
    baselines: List[dict]
    warnings: List[str] = field(default_factory=list)
    recorded: List[Recorded] = field(default_factory=list)   # dry run: every command, in order
    linked: Tuple = ()               # the linked axes whose label varies (zcorch.config.experiment.Axis)
    repeat_policy: Any = None        # `repeats: {min, max, target_ci}` (zcorch.config.schema.RepeatPolicy) or None

    def summary(self) -> str:
        """The end-of-run table (zcorch.sweep.summary.summary_table)."""
        return summary_table(self.plan_runs, self.records, self.varying, self.baselines, self.linked,
                             self.repeat_policy)


# -- Result sets --------------------------------------------------------------------------------

class DryRunResults:
    """The result set of a dry run: records kept in memory (seeded from DIR on --resume); nothing is written."""

    dir = ""

    def __init__(self, runs: Sequence[dict] = (), baselines: Sequence[dict] = ()):
        self._runs, self._baselines = list(runs), list(baselines)
        self.meta: dict = {}
        self.status = "running"

    def close(self) -> None:
        """Nothing to release: a dry run takes no lock."""

    def log_relpath(self, cell: str, repeat: int) -> str:
        return os.devnull   # the Runner appends each run's log to dir/<this>

    def append_run(self, record: dict) -> None:
        self._runs.append(record)

    def append_baseline(self, record: dict) -> None:
        self._baselines.append(record)

    def write_samples(self, cell: str, repeat: int, samples: dict) -> str:
        return os.devnull   # nothing is written in a dry run

    def runs(self) -> List[dict]:
        return list(self._runs)

    def baselines(self) -> List[dict]:
        return list(self._baselines)

    def ok_keys(self) -> set:
        return {k for k, rec in latest_runs(self._runs).items() if rec.get("status") == "ok"}

    def write_meta(self, meta: dict, keep_previous: bool = True) -> None:
        self.meta = dict(meta)

    def record_convergence(self, states: dict) -> None:
        self.meta["convergence"] = dict(states)

    def finish(self, status: str, error: Optional[BaseException] = None) -> None:
        self.status = status


def experiment_source(experiment_path: Optional[str], resume: Optional[str]) -> Tuple[str, bytes]:
    if resume:
        if not os.path.exists(os.path.join(resume, "manifest.json")):
            raise ResultsError(f"--resume {resume}: not a zcorch result set (no manifest.json)")
        path = os.path.join(resume, "experiment.yaml")
    elif not experiment_path:
        raise ConfigError("zcorch run: give an experiment FILE (or --resume DIR)")
    else:
        path = experiment_path
    try:
        with open(path, "rb") as f:
            return path, f.read()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the experiment file ({exc.strerror})") from None


def _check_resumed_plan(resume: str, stored: List[dict], plan_runs: List[dict]) -> None:
    if [(r["id"], r["repeat"]) for r in stored] != [(r["id"], r["repeat"]) for r in plan_runs]:
        raise ResultsError(f"{resume}: its experiment.yaml now expands to other cells than its plan.json "
                           "(planned by another zcorch version?); start a new result set instead")


def default_output(name: str) -> str:
    """results/<name>-<UTC time>/ (ResultSet.create appends -2, -3 ... when that exists)."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return os.path.join("results", f"{name}-{stamp}")


def _open_results(exp: Any, exp_path: str, exp_bytes: bytes, plan_runs: List[dict], output: Optional[str],
                  resume: Optional[str], command: List[str], accept_new_host_keys: bool, dry_run: bool,
                  control: Optional[dict] = None):
    name = exp.name or os.path.splitext(os.path.basename(exp_path))[0]
    inventory = exp.inventory.record() if exp.inventory is not None else None
    if dry_run:
        if not resume:
            return DryRunResults()
        with open(os.path.join(resume, PLAN), encoding="utf-8") as f:
            _check_resumed_plan(resume, json.load(f), plan_runs)
        return DryRunResults(read_jsonl(os.path.join(resume, RUNS)), read_jsonl(os.path.join(resume, BASELINES)))
    if resume:
        rs = ResultSet.open_for_resume(resume, command, inventory=inventory)
        _check_resumed_plan(resume, rs.plan_runs(), plan_runs)
        return rs
    from zcorch.sweep.metadata import git_revision

    # With --hosts or --set, experiment.yaml is the document as run (what --resume and reports read) and
    # the file as written is kept next to it; otherwise experiment.yaml is the file's byte copy.
    effective = exp.effective.encode("utf-8") if exp.effective is not None else None
    source = {"path": os.path.abspath(exp_path), "sha256": hashlib.sha256(exp_bytes).hexdigest()}
    policy = exp.repeat_policy.as_dict() if exp.repeat_policy is not None else None
    return ResultSet.create(output or default_output(name), name=name, repeat_policy=policy, control=control,
                            experiment_bytes=exp_bytes if effective is None else effective,
                            source_bytes=None if effective is None else exp_bytes, source=source,
                            inventory=inventory, overrides=exp.overrides, unique=output is None,
                            plan_runs=plan_runs, command=command, accept_new_host_keys=accept_new_host_keys,
                            zcorch_version=__version__, git_revision=git_revision())


# -- Hosts and the worker command on them -------------------------------------------------------

class Sweep:
    """Hosts, worker commands and interpreters for one sweep. info: {role: what its deploy's `worker info`
    answered to prefetch_args: "metadata" (and its "metadata_path"), "calibration" (None: to be measured)}."""

    def __init__(self, hosts: Dict[str, Host], worker: Dict[str, List[str]], env: Dict[str, Dict[str, str]],
                 python: Dict[str, str], info: Optional[Dict[str, dict]] = None, net_clean: Sequence[Host] = ()):
        self.hosts, self.worker, self.env, self.python = hosts, worker, env, python
        self.info = info or {}
        self.net_clean = list(net_clean)   # hosts whose preflight found no network state file (nothing to restore)


def _close_hosts(hosts: Dict[str, Host]) -> None:
    for h in {id(h): h for h in hosts.values()}.values():   # one host in both roles is closed once
        h.close()


def cell_modes(params_list: Sequence[Dict[str, Any]]) -> Dict[str, Dict[str, List[str]]]:
    """{"sender": {"send": [send modes]}, "receiver": {"recv": [receive modes]}} of the given cells' params."""
    params_list = list(params_list)
    return {"sender": {"send": sorted({p["send_mode"] for p in params_list})},
            "receiver": {"recv": sorted({p["recv_mode"] for p in params_list})}}


def _metadata_path(role: str, plan_runs: List[dict], scratch_dirs: Optional[Dict[str, str]]) -> Optional[str]:
    """The path whose filesystem meta.json records for `role` (the receiver's sink, "" for the sender);
    None when it lies in `{scratch}` and scratch_dirs is None (not resolved yet)."""
    if role != "receiver":
        return ""
    sink = next((r["params"].get("sink") for r in plan_runs if r["params"].get("sink")), "")
    if scratch_dirs is None and scratch.uses(sink):
        return None
    sink = scratch.substitute(sink, (scratch_dirs or {}).get("receiver"))
    return sink if "{" not in (sink or "") else ""


def prefetch_args(hosts: Dict[str, Host], plan_runs: List[dict], max_age: float,
                  refresh: bool) -> Dict[str, List[str]]:
    """{role: flags of the deploy's `worker info`} that fold later stages into it: the cached calibration
    (`--cache`, not with `refresh`) and the metadata (`--metadata`, when its path is known before `{scratch}`)."""
    from zcorch.sweep import metadata

    out: Dict[str, List[str]] = {}
    for role, host in hosts.items():
        path = _metadata_path(role, plan_runs, None)
        out[role] = ([] if refresh else metadata.cache_args(host, max_age)) + \
            ([] if path is None else ["--metadata", *metadata.metadata_args(host, None, path)])
    return out


def open_sweep(hosts: Dict[str, Host], cfg: Baselines,
               modes: Optional[Dict[str, Dict[str, List[str]]]] = None,
               info_args: Optional[Dict[str, List[str]]] = None) -> Sweep:
    """Preflight the hosts, deploy and version-check the worker, and check each host can run the modes its
    cells need (cell_modes()); info_args (prefetch_args()): what else `worker info` answers (Sweep.info)."""
    from zcorch.provision import deploy

    remote = not hosts["receiver"].is_local
    # Remote hosts must have the baseline kinds' tools and free ports; on localhost a missing tool only makes
    # the baseline `skipped` (with the fix in the reason).
    ports = [p for kind, conf in cfg.enabled() for p in kind.ports(conf)] if remote else []
    tools = {role: [t for kind, conf in cfg.enabled() for t in kind.tools(conf) if role in t.roles]
             for role in hosts} if remote else {}
    handles = deploy.prepare(hosts, tools=tools, ports=ports, modes=modes, info_args=info_args)
    info: Dict[str, dict] = {}
    for role, handle in handles.items():
        asked = (info_args or {}).get(next(r for r in hosts if hosts[r] is hosts[role]), [])
        answer = dict(handle.info or {})
        if "--metadata" in asked and isinstance(answer.get("metadata"), dict):
            answer["metadata_path"] = asked[asked.index("--metadata") + 2]
        else:
            answer.pop("metadata", None)
        info[role] = answer
    return Sweep(hosts, {r: list(h.worker_argv) for r, h in handles.items()},
                 {r: dict(h.env) for r, h in handles.items()}, {r: h.python for r, h in handles.items()}, info,
                 net_clean=[h.host for h in handles.values() if h.net_state is False])


def _open_hosts(exp: Any, accept_new_host_keys: bool, dry_run: bool, observer: SweepObserver,
                recorded: List[Recorded], allow_ssh_config_exec: bool = False) -> Dict[str, Host]:
    if dry_run:
        def record(entry: Recorded) -> None:
            recorded.append(entry)
            observer.command(entry)

        return recording_hosts(exp.hosts, on_record=record)
    from zcorch.hosts.ssh import open_hosts  # paramiko: imported only when a real sweep opens its hosts

    return open_hosts(exp.hosts, accept_new_host_keys, allow_config_exec=allow_ssh_config_exec)


# -- Scratch, metadata, baselines ---------------------------------------------------------------

def prepare_scratch(sweep: Sweep, plan_runs: List[dict], cfg: Baselines,
                    observer: SweepObserver) -> Dict[str, str]:
    """Resolve `{scratch}` on the hosts whose paths use it (creating it, 0700): {role: directory}."""
    needed = scratch.needs((r["params"] for r in plan_runs), cfg.dd.scratch if cfg.dd is not None else None)
    for cmd in cfg.commands:  # a command's {source} / {sink} live in the scratch directories too
        for placeholder, role in (("source", "sender"), ("sink", "receiver")):
            if cmd.uses(placeholder):
                needed.setdefault(role, [])
    needed = {role: needed[role] for role in ("sender", "receiver") if role in needed}
    infos = scratch.prepare_all(sweep.hosts, sweep.python, needed, log=observer.message)
    observer.scratch_ready(infos, sweep.hosts)
    return {role: info["path"] for role, info in infos.items()}


def collect_meta(sweep: Sweep, plan_runs: List[dict], scratch_dirs: Optional[Dict[str, str]] = None) -> dict:
    """meta.json: controller and hosts; `hosts.<role>.scratch` = the `{scratch}` directory there, if used."""
    from zcorch.sweep import metadata

    scratch_dirs = scratch_dirs or {}
    meta: Dict[str, Any] = {"controller": metadata.controller_meta(), "hosts": {}, "filesystems": {}}

    def one(role: str) -> Dict[str, Any]:
        path = _metadata_path(role, plan_runs, scratch_dirs) or ""
        asked = sweep.info.get(role) or {}
        if asked.get("metadata_path") == path:   # collected with the deploy's `worker info`
            return dict(asked["metadata"])
        try:
            return metadata.collect_host(sweep.hosts[role], sweep.python[role], None, path)
        except HostError as exc:
            return {"error": str(exc)}

    roles = ("sender", "receiver")
    for role, found in zip(roles, per_host(roles, one)):   # both hosts at once (also both roles of localhost:
        meta["hosts"][role] = found                         # the receiver's probe looks at its sink too)
        if role in scratch_dirs:
            meta["hosts"][role]["scratch"] = scratch_dirs[role]
    meta["same_host"] = metadata.same_host(meta)
    return meta


def calibrate(sweep: Sweep, meta: Dict[str, Any], warnings: List[str],
              max_age: float = DEFAULT_CALIBRATION_MAX_AGE_S, refresh: bool = False) -> None:
    """meta.json hosts.<role>.calibration: the copy-cost yardsticks once per host (localhost: one for both roles),
    cached on the host (zcorch.worker.calcache) unless stale, older than `max_age` s or `refresh`. Both hosts at
    once, unless they share a kernel (equal boot ids): two measurements on one machine would disturb each other."""
    from zcorch.sweep import metadata

    def one(role: str) -> Dict[str, Any]:
        host = sweep.hosts[role]
        cached = (sweep.info.get(role) or {}).get("calibration")
        if cached and not refresh:   # what the deploy's `worker info --cache` found still valid
            return dict(cached)
        args = [*metadata.cache_args(host, max_age), *(["--refresh"] if refresh else [])]
        return metadata.calibrate_host(host, sweep.worker[role], sweep.env.get(role), args)

    two = sweep.hosts["receiver"] is not sweep.hosts["sender"]
    roles = ["sender", "receiver"] if two else ["sender"]
    done = dict(zip(roles, per_host(roles, one, parallel=meta.get("same_host") is not True)))
    warnings += [done[role]["error"] for role in roles if "error" in done[role]]
    for role in ("sender", "receiver"):
        meta["hosts"].setdefault(role, {})["calibration"] = done[role if two else "sender"]


def _key(b: dict) -> str:
    return json.dumps([b.get("kind"), b.get("key")], sort_keys=True)


def _network_baselines(rs: Any, sweep: Sweep, cfg: Baselines, plan_runs: List[dict]) -> None:
    """Each test of each network kind (iperf3, qperf...) not yet ok in the result set (the control's aside)."""
    done = {_key(b) for b in rs.baselines() if b.get("status") == "ok" and not b.get("control")}
    for kind, conf in cfg.enabled():
        if kind.phase != NETWORK:
            continue
        record_kind = next(iter(kind.record_kinds))
        for key in kind.keys(conf, [r["params"] for r in plan_runs]):
            if _key({"kind": record_kind, "key": key}) in done:
                continue
            rs.append_baseline(bl.run_server_client(kind, sweep.hosts["sender"], sweep.hosts["receiver"], conf, key))


def _control_hook(rs: Any, sweep: Sweep, exp: Any, observer: SweepObserver):
    """`control: <kind>`: the runner's before_round, recording the kind's test once per round (with "repeat" and
    "control": true) unless the result set holds an ok one of that round; None for a control cell or none."""
    if not isinstance(exp.control, str):
        return None
    from zcorch.config.baselines.registry import BY_NAME
    from zcorch.plan import control_baseline_key

    kind, key = BY_NAME[exp.control], control_baseline_key(exp)
    conf = exp.baselines.get(kind.name)
    done = {b.get("repeat") for b in rs.baselines() if b.get("control") and b.get("status") == "ok"
            and b.get("kind") in kind.record_kinds}

    def before_round(repeat: int) -> None:
        if repeat in done:
            return
        rec = bl.run_server_client(kind, sweep.hosts["sender"], sweep.hosts["receiver"], conf, key)
        rec.update(repeat=repeat, control=True)
        rs.append_baseline(rec)
        if rec.get("status") == "ok":
            done.add(repeat)
        else:   # the round's runs go on; their ratios are NaN (zcorch.analysis.frames.add_control_ratios)
            observer.message(f"control {kind.describe(rec)} (round {repeat}): this round's runs get no "
                             "gbit_s_vs_control")

    return before_round


def _commands_for_sweep(rs: Any, sweep: Sweep, cfg: Baselines, plan_runs: List[dict],
                        scratch_dirs: Dict[str, str], observer: SweepObserver, dry_run: bool = False) -> None:
    """Each command baseline's runs not yet ok in the result set (resume), after laying out its source.
    dry_run: the commands are shown (recording hosts), no outcome is claimed."""
    if not cfg.commands:
        return
    sender, receiver = sweep.hosts["sender"], sweep.hosts["receiver"]
    params = [r["params"] for r in plan_runs]
    done = {(b["key"].get("name"), b["key"].get("bytes"), b.get("repeat")) for b in rs.baselines()
            if b.get("kind") == cmds.KIND and b.get("status") == "ok"}
    for i, cmd in enumerate(cfg.commands):
        nbytes = cmds.command_bytes(cmd, params)
        todo = [rep for rep in range(cmd.repeats) if (cmd.name, nbytes, rep) not in done]
        if not todo:
            continue
        paths = {"source": scratch.substitute(cmds.source_path(cmd), scratch_dirs.get("sender")),
                 "sink": scratch.substitute(cmds.sink_path(cmd), scratch_dirs.get("receiver"))}
        errors: Dict[str, str] = {}
        if cmd.uses("source"):  # ours, in the scratch directory: laid out anew when too short
            _, errors = sources.lay_out(sender, sweep.worker["sender"], sweep.env["sender"],
                                        {paths["source"]: nbytes}, observer.message, grow={paths["source"]})
        for rep in todo:
            if errors:
                rec = cmds.failed(cmd, nbytes, rep, sender, errors[paths["source"]])
            else:
                port = (bl.free_local_port(receiver.data_address) if receiver.is_local
                        else cmds.COMMAND_PORT + i)
                rec = cmds.run_command(sender, receiver, sweep.worker, sweep.env, cmd, nbytes, paths, port, rep)
            if not dry_run:
                rs.append_baseline(rec)
                observer.message(cmds.describe(rec))


def _dd_hook(rs: Any, sweep: Sweep, cfg: Baselines, scratch_dirs: Dict[str, str]):
    # ok dd_write records per key: the repeats a resumed sweep has (a record of before `repeats`: repeat 0)
    done = Counter(_key(b) for b in rs.baselines() if b.get("status") == "ok")
    seen: set = set()

    def before_directory(filesystem: Optional[str], sink: str) -> None:
        if cfg.dd is None:
            return
        # As written (`{scratch}` stays in the key, so keys match across users); dd runs in the resolved one.
        written = bl.dd_directory(sink, cfg.dd.scratch)
        key = _key({"kind": "dd_write", "key": bl.dd_key(cfg.dd, written, filesystem)})
        if key in seen:
            return
        seen.add(key)  # a file sink in the scratch directory and /dev/null's scratch: one dd, not two
        directory = scratch.substitute(written, scratch_dirs.get("receiver"))
        for repeat in range(done[key], cfg.dd.repeats):
            for rec in bl.run_dd(sweep.hosts["receiver"], sweep.python["receiver"], cfg.dd, directory, filesystem,
                                 written_directory=written, repeat=repeat):
                rs.append_baseline(rec)

    return before_directory


# -- Filesystems --------------------------------------------------------------------------------

def _used(plan_runs: List[dict], param: str) -> List[str]:
    """The `filesystems:` or `networks:` entries (param: filesystem, network) the plan uses, in first-use order."""
    return list(dict.fromkeys(r["params"][param] for r in plan_runs if r["params"].get(param)))


def _filesystem_manager(exp: Any, sweep: Sweep, warnings: List[str], used: List[str], dry_run: bool,
                        observer: SweepObserver, lease: Any = None):
    """zcorch.provision.filesystems' manager for the receiver when the experiment declares filesystems; only the
    entries the plan uses are preflighted (an unused md entry must not fail the run)."""
    if not exp.filesystems:
        return None
    from zcorch.provision.filesystems import FilesystemManager

    receiver, state_dir = sweep.hosts["receiver"], exp.hosts.fs_state_dir
    fsman = FilesystemManager(receiver, exp.filesystems, state_dir, dry_run=dry_run, log=observer.message)
    fsman.lease = lease   # taken with the hosts (_take_leases), released by run_sweep on every exit path
    warnings += [f"undid a previous controller's leftover: {undone}"
                 for undone in FilesystemManager.cleanup_stale(receiver, state_dir, leased=not dry_run)]
    problems = fsman.preflight(names=used)
    if problems:
        raise PreflightError("filesystem preflight failed:\n  " + "\n  ".join(problems))
    return fsman


def _record(rs: Any, meta: Dict[str, Any], section: str, manager: Any, names: Any, warnings: List[str]) -> None:
    """meta.json's `section` ("filesystems", "networks"): the manager's description of each of `names`."""
    try:
        meta[section] = {name: manager.describe(name) for name in names}
        rs.write_meta(meta, keep_previous=False)
    except ZcorchError as exc:
        warnings.append(f"could not record the {section} descriptions in meta.json: {exc}")


# -- Leases: before anything loads the hosts ----------------------------------------------------

def _take_leases(exp: Any, hosts: Dict[str, Host], dry_run: bool, changes: bool) -> Tuple[List[Any], Any]:
    """(network leases of both hosts, the receiver's filesystem lease or None): a sweep another one holds is
    refused before it deploys or calibrates there. Those taken are released when a later one is refused."""
    if dry_run:
        return [], None
    from zcorch.provision import network
    from zcorch.provision.filesystems import FilesystemManager
    from zcorch.provision.fs_state import Lease

    leases: List[Any] = []
    try:
        leases = network.take_leases(hosts, exp.hosts, token=os.urandom(8).hex(), changes=changes)
        fs_lease = None
        if exp.filesystems:
            receiver = hosts["receiver"]
            state_dir = FilesystemManager(receiver, {}, exp.hosts.fs_state_dir).state_dir
            fs_lease = Lease.take(receiver, state_dir)
        return leases, fs_lease
    except BaseException:
        network.release_leases(leases)
        raise


def _restore_network_leftovers(exp: Any, sweep: Sweep, warnings: List[str], dry_run: bool,
                               observer: SweepObserver) -> None:
    """Every sweep, with `networks:` or not: a killed sweep's network changes are put back (warnings say
    so) before anything is measured, or the sweep is refused (PreflightError)."""
    if dry_run:
        return
    from zcorch.provision.network import restore_leftovers
    from zcorch.provision.watchdog import sweep_reports

    # What a lost controller's watchdogs put back since (they may have left nothing for restore_leftovers)
    warnings += sweep_reports(sweep.hosts, sweep.python, exp.hosts)
    warnings += restore_leftovers(sweep.hosts, sweep.python, exp.hosts, observer.message, clean=sweep.net_clean)


# -- Networks -----------------------------------------------------------------------------------

def _network_manager(exp: Any, sweep: Sweep, warnings: List[str], used: List[str], dry_run: bool,
                     observer: SweepObserver):
    """zcorch.provision.network's manager for both hosts when some cell has a `network` (else None)."""
    if not used:
        return None
    from zcorch.provision.network import NetworkManager

    for role in ("sender", "receiver"):   # load time checked it already; never change a host without it
        if not exp.network_allowed(role):
            raise PreflightError(f"{sweep.hosts[role].name}: the hosts did not allow network changes "
                                 "(allow_network_changes)")
    netman = NetworkManager(sweep.hosts, sweep.python, exp.networks, exp.hosts, dry_run=dry_run,
                            log=observer.message)
    problems = netman.preflight(used)
    warnings += netman.warnings
    if problems:
        raise PreflightError("network preflight failed:\n  " + "\n  ".join(problems))
    return netman


def _undo_networks(rs: Any, meta: Dict[str, Any], netman: Any, names: List[str], warnings: List[str]) -> None:
    """The networks restored (as the runner does, for an exit before the runs) and described in meta.json."""
    try:
        netman.teardown_all()
    except ZcorchError as exc:
        warnings.append(f"network not restored: {exc}")
    _record(rs, meta, "networks", netman, names, warnings)


def _finish_after_error(rs: Any, status: str, exc: BaseException) -> None:
    """rs.finish(status, exc) while `exc` propagates: a manifest that cannot be written (disk full, the
    cause of `exc` itself?) must not replace the error that ended the sweep, only be noted on it."""
    try:
        rs.finish(status, exc)
    except Exception as failed:
        exc.add_note(f"zcorch: the result set's manifest still says 'running': it could not be marked "
                     f"{status} ({type(failed).__name__}: {failed}); `zcorch run --resume` continues it")


def run_sweep(experiment_path: Optional[str] = None, *, output: Optional[str] = None,
              resume: Optional[str] = None, accept_new_host_keys: bool = False, dry_run: bool = False,
              observer: Optional[SweepObserver] = None, command: Optional[List[str]] = None,
              hosts: Optional[InventoryPair] = None, overrides: Sequence[str] = (),
              allow_ssh_config_exec: bool = False, recalibrate: bool = False) -> SweepResult:
    """Run the experiment at `experiment_path` (or continue the result set `resume`) into a result set.

    hosts: an inventory pair instead of the file's (or the recorded) hosts; overrides: `--set KEY=VALUE` (not with
    resume). Ctrl-C ends the sweep `interrupted`; an exception marks it interrupted (ZcorchError) or failed (a bug)
    and propagates."""
    observer = observer or SweepObserver()
    if resume and overrides:
        raise ConfigError(f"--set cannot change the result set being resumed ({resume}): its experiment.yaml "
                          "is what it runs (start a new result set to run something else)")
    exp_path, exp_bytes = experiment_source(experiment_path, resume)
    # A resumed set reduced with --set runs its effective experiment.yaml: reference cells it lacks are warnings.
    reduced = bool(resume and load_manifest(resume).get("overrides"))
    from zcorch.config.experiment import load_experiment
    from zcorch.plan import control_record, expand

    exp = load_experiment(exp_path, overrides, hosts)
    plan = expand(exp, reduced)
    plan_runs = [dict(zip(("id", "repeat", "params"), run_fields(run))) for run in plan.runs]
    cfg = exp.baselines
    rs = _open_results(exp, exp_path, exp_bytes, plan_runs, output, resume, command or ["zcorch", "run"],
                       accept_new_host_keys, dry_run, control=control_record(plan))
    if not dry_run:   # what a third Ctrl-C during the teardown would leave (zcorch.sweep.interrupts)
        interrupts.left_behind("results", lambda: [f"{rs.dir}: the manifest still says 'running': `zcorch run "
                                                   f"--resume {rs.dir}` continues it"])
    skip = rs.ok_keys()
    rs.baseline_written = observer.baseline_done  # every baseline record, as it is written (run --json)
    observer.started(len(plan_runs), len(skip), None if dry_run else rs.dir)
    # Repeat until stable: cells that converged before (--resume) get no more runs (zcorch.sweep.adaptive).
    convergence = None
    if exp.repeat_policy is not None:
        convergence = Convergence(exp.repeat_policy, plan_runs, rs.runs() if resume else ())
        converged = {cell for cell, st in convergence.states().items() if st.converged}
        skip = skip | {(r["id"], r["repeat"]) for r in plan_runs if r["id"] in converged}
    if exp.inventory is not None:
        observer.message(f"hosts: {exp.hosts.describe()} ({exp.inventory.describe()})")
    for text in exp.overrides:
        observer.message(f"--set {text}")

    meta: Dict[str, Any] = {}
    warnings: List[str] = []
    recorded: List[Recorded] = []
    # Each part registers its own undo as it is set up: the teardown is the set-up in reverse, also after an error.
    with ExitStack() as undo:
        # the result set's lock, when an error ends the sweep: another `zcorch run --resume` may continue it
        undo.push(lambda exc_type, _exc, _tb: rs.close() if exc_type is not None else None)
        undo.callback(observer.sweep_ended)
        try:
            observer.stage("hosts", _TITLES["hosts"])
            hosts = _open_hosts(exp, accept_new_host_keys, dry_run, observer, recorded, allow_ssh_config_exec)
            undo.callback(_close_hosts, hosts)
            leases, fs_lease = _take_leases(exp, hosts, dry_run, bool(_used(plan_runs, "network")))
            if leases or fs_lease is not None:
                from zcorch.provision.network import release_leases

                undo.callback(release_leases, leases + ([fs_lease] if fs_lease is not None else []), warnings)
            observer.hosts_opened(hosts)
            observer.stage("deploy", _TITLES["deploy"])
            # the modes of the runs still to do: one a host cannot run stops the sweep here, naming why
            sweep = open_sweep(hosts, cfg, cell_modes(r["params"] for r in plan_runs
                                                      if (r["id"], r["repeat"]) not in skip),
                               prefetch_args(hosts, plan_runs, exp.calibration_max_age, recalibrate))
            _restore_network_leftovers(exp, sweep, warnings, dry_run, observer)
            pool = None
            if not dry_run and any((r["id"], r["repeat"]) not in skip for r in plan_runs):
                # The worker servers start on both hosts while the set-up goes on (not in a dry run: its commands
                # are listed in order, the runner starting them at its first run).
                pool = WorkerPool()
                starting = pool.start_servers_meanwhile(
                    [(sweep.hosts[role], sweep.worker[role], sweep.env[role]) for role in ("receiver", "sender")])
                undo.callback(pool.close)   # the runner stops them; this covers an early exit
                undo.callback(starting.join)
            # Before anything uses a path: meta's sink probe, source layout, the dd baseline, the runs.
            observer.stage("scratch", _TITLES["scratch"])
            scratch_dirs = prepare_scratch(sweep, plan_runs, cfg, observer)
            observer.stage("metadata", _TITLES["metadata"])
            meta = collect_meta(sweep, plan_runs, scratch_dirs)
            rs.write_meta(meta)
            if pool is not None:
                starting.join()   # started (or left to the first run to fail on) before anything is measured
            observer.stage("calibrate", _TITLES["calibrate"])
            calibrate(sweep, meta, warnings, exp.calibration_max_age, recalibrate)
            rs.write_meta(meta, keep_previous=False)
            observer.stage("filesystems", _TITLES["filesystems"])
            fsman = _filesystem_manager(exp, sweep, warnings, _used(plan_runs, "filesystem"), dry_run, observer,
                                        fs_lease)
            if fsman is not None:
                undo.callback(_record, rs, meta, "filesystems", fsman, exp.filesystems, warnings)
            interrupts.left_behind("filesystems", fsman.leftovers if fsman is not None else None)
            observer.stage("network", _TITLES["network"])
            netman = _network_manager(exp, sweep, warnings, _used(plan_runs, "network"), dry_run, observer)
            if netman is not None:
                undo.callback(_undo_networks, rs, meta, netman, _used(plan_runs, "network"), warnings)
            interrupts.left_behind("network", netman.leftovers if netman is not None else None)
            observer.stage("baselines", _TITLES["baselines"])
            _network_baselines(rs, sweep, cfg, plan_runs)
            observer.stage("sources", _TITLES["sources"])
            todo = [scratch.resolve_params(r["params"], scratch_dirs) for r in plan_runs
                    if (r["id"], r["repeat"]) not in skip]
            mine = scratch_dirs.get("sender")  # zcorch's own directory: its short laid-out files may grow
            grow = {r["params"]["source"] for r in plan_runs if scratch.uses(r["params"].get("source"))}
            laid, source_errors = sources.lay_out(sweep.hosts["sender"], sweep.worker["sender"],
                                                  sweep.env["sender"], sources.needed_sources(todo),
                                                  observer.message,
                                                  grow={scratch.substitute(g, mine) for g in grow} if mine else ())
            if laid:
                meta["sources_laid_out"] = laid
                rs.write_meta(meta, keep_previous=False)
            observer.stage("commands", _TITLES["commands"])
            _commands_for_sweep(rs, sweep, cfg, plan_runs, scratch_dirs, observer, dry_run)
            observer.stage("runs", _TITLES["runs"])
            runner = Runner(sweep.hosts["sender"], sweep.hosts["receiver"], sweep.worker["sender"],
                            sweep.worker["receiver"], rs, worker_env=sweep.env, fsman=fsman,
                            progress=observer.run_done, run_started=observer.run_started,
                            before_directory=_dd_hook(rs, sweep, cfg, scratch_dirs),
                            source_errors=source_errors, scratch=scratch_dirs, allow_device_sinks=exp.allow_destroy,
                            netman=netman, convergence=convergence, pool=pool,
                            before_round=_control_hook(rs, sweep, exp, observer))
            outcome = runner.run_sweep(plan_runs, skip)
            warnings += runner.warnings
        except KeyboardInterrupt:
            outcome = SweepOutcome(status="interrupted")
        except BaseException as exc:
            # Whatever ends the sweep early (a ZcorchError: interrupted; a bug: failed), the manifest gets a final
            # status and the reason, and the exception propagates; --resume continues the runs written.
            _finish_after_error(rs, "interrupted" if isinstance(exc, ZcorchError) else "failed", exc)
            raise
        finally:
            interrupts.begin_teardown()   # from here on no signal stops the teardown (zcorch.sweep.interrupts)
    observer.stage("finish", _TITLES["finish"])
    if convergence is not None:  # each cell's end state, converged or not (and the width it reached)
        rs.record_convergence({cell: st.as_record() for cell, st in convergence.states().items()})
    try:
        rs.finish(outcome.status)
        interrupts.left_behind("results", None)
    except OSError as exc:  # e.g. the disk filled up: a user-fixable problem, every run is already recorded
        rs.close()
        raise ResultsWriteError(f"{rs.dir}: cannot mark the result set {outcome.status} ({exc.strerror or exc}); "
                           f"every run is recorded in {RUNS}. After fixing the cause, `zcorch run --resume "
                           f"{rs.dir}` finishes it") from None
    for w in warnings:
        observer.warning(w)
    records = rs.runs()
    rs.close()
    if outcome.status == "interrupted":
        exit_status = 130
    else:
        # every planned run ok, or (repeats: {target_ci: ...}) its cell converged before it was needed
        exit_status = 1 if incomplete_cells(plan_runs, latest_runs(records), exp.repeat_policy) else 0
    return SweepResult(status=outcome.status, exit_status=exit_status, dry_run=dry_run,
                       result_dir=None if dry_run else rs.dir, plan_runs=plan_runs,
                       varying=tuple(plan.varying or ("send_mode", "recv_mode")), records=records,
                       baselines=rs.baselines(), warnings=warnings, recorded=recorded, linked=tuple(plan.linked),
                       repeat_policy=exp.repeat_policy)
