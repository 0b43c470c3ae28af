"""`zcorch run FILE`: deploy, baselines, every cell, into a result set (docs/architecture.md).

Exit status: 0 every run of the plan ok, 1 some failed (results still written), 2 a bad experiment file or
option, 75 another `zcorch run` holds the result set's lock (nothing done), 130 on Ctrl-C, SIGTERM or SIGHUP
(finished runs kept; continue with --resume). The teardown after it finishes whatever signals arrive, except
that a third Ctrl-C abandons it, printing what is left and how to restore it. With `--hosts INV:PAIR1,...` or
`INV:all` it is a fleet run (zcorch.cli.fleet). The pipeline is zcorch.sweep.pipeline.run_sweep.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Callable, Dict, List, Optional, TextIO

from zcorch.cli.options import add_hosts_and_set, hosts_from_args
from zcorch.cli.cache_writer import CacheWriter
from zcorch.cli.run_output import Console, JsonLines, check_export, export_after_run, run_line, say_end
from zcorch.hosts.local import Host
from zcorch.hosts.recording import Recorded
from zcorch.provision.scratch import PLACEHOLDER
from zcorch.sweep.interrupts import InterruptGuard
from zcorch.sweep.pipeline import FIRST_MEASURING_STAGE, STAGES, SweepObserver, run_sweep
from zcorch.sweep.runner import SweepOutcome, run_event_fields
from zcorch.cli import add_command


def register(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    p = add_command(subparsers, "run", __doc__)
    p.add_argument("file", nargs="?", help="experiment file (YAML); optional with --resume")
    p.add_argument("-o", "--output", metavar="DIR", help="result directory (default results/<name>-<UTC time>/)")
    p.add_argument("--resume", metavar="DIR", help="continue the result set in DIR (uses its experiment.yaml)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan and every command that would run; change nothing anywhere")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object per event on stdout as it happens (start, stages, each run with its "
                        "metrics, each baseline, warnings, the summary, end) instead of the tables: "
                        "docs/schemas/run-events.schema.json")
    p.add_argument("--accept-new-host-keys", action="store_true",
                   help="trust SSH host keys not yet in known_hosts (otherwise they are refused)")
    p.add_argument("--recalibrate", action="store_true",
                   help="measure each host's copy-cost calibration anew instead of using the one cached on the host "
                        "(it is anyway when the host rebooted, its kernel, CPU or governor changed, or it is older "
                        "than the experiment's calibration_max_age)")
    p.add_argument("--allow-ssh-config-exec", action="store_true",
                   help="let the hosts' ssh config (an inventory's ssh_config, ~/.ssh/config) run its `Match exec` "
                        "commands on this machine, as this user (otherwise such a config is refused)")
    p.add_argument("--export", metavar="DEST",
                   help="at the end, export the result set (a fleet: every pair's) into the Parquet dataset DEST, as "
                        "`zcorch export DIR DEST` does (incremental): a nightly run keeps its dataset current. A "
                        "failed export is a warning, the exit status is the sweep's")
    add_hosts_and_set(p, resume=True)
    # A fleet pair's host and share locks, taken around each run (zcorch.sweep.fleet.LockingObserver).
    p.add_argument("--fleet-lock-dir", help=argparse.SUPPRESS)
    p.add_argument("--fleet-lock", action="append", default=[], help=argparse.SUPPRESS)
    p.set_defaults(func=main)
    return p


class ConsoleObserver(Console, SweepObserver):
    """What `zcorch run` tells the user on stderr (Console): each stage, how long the set-up took, then per run
    its modes, rate and ETA (which starts with the first run: the set-up's minutes do not inflate it)."""

    def __init__(self, stream: Optional[TextIO] = None):
        super().__init__(stream)
        self.already = 0
        self.t0 = time.monotonic()
        self.t_runs: Optional[float] = None
        self.result_dir: Optional[str] = None

    def started(self, total: int, already_ok: int, result_dir: Optional[str]) -> None:
        self.already, self.t0 = already_ok, time.monotonic()
        self.result_dir = result_dir
        self.message(f"{total} runs ({already_ok} already ok) -> {result_dir}")

    def stage(self, name: str, title: str) -> None:
        now = time.monotonic()
        if name == "runs":
            self.t_runs = now
            self._say(logging.INFO, f"set-up took {now - self.t0:.1f} s; the runs")
        elif name != "finish":
            self._say(logging.INFO, f"{title.split(' (')[0]} ...")

    def warning(self, text: str) -> None:
        self._say(logging.WARNING, f"warning: {text}")

    def run_done(self, record: dict, outcome: SweepOutcome, todo: int) -> None:
        done_now = outcome.ok + outcome.failed
        text = run_line(record, whole_reason=self.log.isEnabledFor(logging.DEBUG))
        if self.quiet(text, record["status"] == "ok"):
            return
        if self.tty:   # todo: with repeats until stable it shrinks as cells converge, and the ETA with it
            self.advance("zcorch run", todo, done_now, f"failures {outcome.failed}  {text}")
            return
        since = self.t_runs if self.t_runs is not None else self.t0
        elapsed = time.monotonic() - since
        eta = int(round(elapsed / done_now * (todo - done_now) if done_now else 0.0))
        eta_text = f"{eta // 3600}h{eta % 3600 // 60:02d}m" if eta >= 3600 else f"{eta // 60}m{eta % 60:02d}s"
        self.stream.write(f"[{self.already + done_now}/{self.already + todo}] failures {outcome.failed}  "
                          f"ETA {eta_text}  {text}  [{record['cell']}]\n")
        self.stream.flush()

    def sweep_ended(self) -> None:
        self.close()


class JsonObserver(JsonLines, SweepObserver):
    """`zcorch run --json`: one JSON object a line on stdout as each event happens (schema:
    docs/schemas/run-events.schema.json); messages are `message`/`warning` events, so stdout is only JSON."""

    result_dir: Optional[str] = None

    def started(self, total: int, already_ok: int, result_dir: Optional[str]) -> None:
        from zcorch import __version__

        self.result_dir = result_dir
        self.emit("start", zcorch_version=__version__, runs=total, already_ok=already_ok, result_dir=result_dir)

    def stage(self, name: str, title: str) -> None:
        self.emit("stage", stage=name, title=title)

    def run_done(self, record: dict, outcome: SweepOutcome, todo: int) -> None:
        self.emit("run", **run_event_fields(record), done=outcome.ok + outcome.failed, todo=todo,
                  failed_so_far=outcome.failed)

    def baseline_done(self, record: dict) -> None:
        self.emit("baseline", record=record)

    def warning(self, text: str) -> None:
        self.emit("warning", message=text)


class DryRunObserver(SweepObserver):
    """The dry run's listing on `out`: each stage, then the commands it would run (`host$ argv`)."""

    def __init__(self, out: Optional[TextIO] = None):
        self.out = out if out is not None else sys.stdout  # at run time: the pipe-guarded stream
        self._copies: List[Recorded] = []   # consecutive file copies to one host, shown as one line

    def _line(self, text: str) -> None:
        self._flush_copies()
        self.out.write(text + "\n")

    def _flush_copies(self) -> None:
        if not self._copies:
            return
        first = self._copies[0]
        if len(self._copies) == 1:
            line = first.display()
        else:
            target = os.path.commonpath([c.target for c in self._copies])
            line = Recorded(first.host, first.kind, source=f"{len(self._copies)} files",
                            target=target + "/", mode=first.mode).display()
        self._copies = []
        self.out.write(line + "\n")

    def started(self, total: int, already_ok: int, result_dir: Optional[str]) -> None:
        self._line(f"# dry run: nothing runs, nothing is written; answers are not measured\n"
                   f"# plan: {total} runs ({already_ok} already ok)")

    def stage(self, name: str, title: str) -> None:
        self._line(f"# == {title}")

    def hosts_opened(self, hosts: Dict[str, Host]) -> None:
        if hosts["sender"] is hosts["receiver"] and hosts["sender"].is_local:
            self._line("# hosts: localhost (no SSH; the worker runs from this checkout)")
            return
        for role, host in hosts.items():
            self._line(f"# {role}: ssh {host.spec.ssh} (data address {host.data_address}), not connected")

    def scratch_ready(self, infos: Dict[str, dict], hosts: Dict[str, Host]) -> None:
        for role, info in infos.items():
            if hosts[role].is_local:
                note = f"= {info['path']} (created with mode 0700 if missing)"
            else:
                where = info.get("location", info["path"]).replace(getattr(hosts[role], "home", ""), "~")
                note = f"= {where} there, resolved and created (0700) once connected"
            self._line(f"# {PLACEHOLDER} on the {role} {note}")

    def command(self, entry: Recorded) -> None:
        if entry.kind == "put_file":
            if self._copies and self._copies[-1].host != entry.host:
                self._flush_copies()
            self._copies.append(entry)
            return
        self._line(entry.display())

    def run_started(self, cell: str, repeat: int) -> None:
        self._line(f"# run {cell} repeat {repeat}")

    def message(self, text: str) -> None:
        self._line("\n".join(f"# {line}" for line in text.splitlines()))

    def warning(self, text: str) -> None:
        self._flush_copies()
        print(f"zcorch run: warning: {text}", file=sys.stderr)

    def sweep_ended(self) -> None:
        self._flush_copies()
        self.out.flush()


def main(args: argparse.Namespace) -> int:
    command = ["zcorch", "run", *sys.argv[2:]] if sys.argv[1:2] == ["run"] else list(sys.argv)
    from zcorch.config.inventory import ENV_VAR, is_fleet_spec
    from zcorch.sweep.fleet import is_fleet_dir

    spec = args.hosts if args.hosts is not None or args.resume else os.environ.get(ENV_VAR) or None
    check_export(args.export)
    if is_fleet_spec(spec) or (args.resume and is_fleet_dir(args.resume)):
        from zcorch.cli import fleet   # several pairs at once: each pair is a `zcorch run` of its own

        return fleet.main(args, command, spec)
    if args.json and args.dry_run:
        from zcorch.errors import ConfigError

        raise ConfigError("--json and --dry-run: choose one (the dry run prints commands, not events)")
    observer = DryRunObserver() if args.dry_run else JsonObserver() if args.json else ConsoleObserver()
    # runs.parquet at the end (a fleet's pairs: the fleet writes theirs, once), its imports made meanwhile
    writer = CacheWriter() if not args.dry_run and not args.fleet_lock_dir else None
    if writer is not None:
        _wait_before_measuring(observer, writer.wait_ready)
    # SIGTERM and SIGHUP end a sweep as Ctrl-C does: finished runs kept, result set marked interrupted. Neither stops
    # the teardown that follows, except a third Ctrl-C (zcorch.sweep.interrupts).
    guard = InterruptGuard()
    try:
        try:
            with guard.installed():
                result = _run(args, observer, command)
                guard.ignore_term_after = result.status == "interrupted"
        except Exception:
            # The error follows (a ZcorchError as one line, a bug with its traceback); the runs written are kept.
            done = getattr(observer, "result_dir", None)
            if done:
                print(f"zcorch run: the sweep stopped; finished runs are kept in {done}. After fixing the "
                      f"cause, continue with: zcorch run --resume {done}", file=sys.stderr)
            raise
        if writer is not None and result.status == "complete" and not result.dry_run:
            writer.write(result.result_dir)
    finally:
        if writer is not None:
            writer.close()
    if result.dry_run:
        return 0
    # a fleet's pairs are not given --export: the fleet exports them all, once
    exported = export_after_run(result.result_dir, args.export) if args.export else None
    if args.json:
        from zcorch.sweep.summary import summary_rows

        observer.emit("summary", cells=summary_rows(result.plan_runs, result.records, result.repeat_policy),
                      baselines=len(result.baselines))
        if exported is not None:
            observer.emit("export", **exported)
        observer.emit("end", status=result.status, exit_status=result.exit_status, result_dir=result.result_dir)
        return result.exit_status
    print(result.summary())
    say_end(result.result_dir, exported, result.status == "interrupted")
    return result.exit_status


def _wait_before_measuring(observer: SweepObserver, wait: Callable[[], None]) -> None:
    """Call wait() when the sweep reaches its first stage that may measure (pipeline.FIRST_MEASURING_STAGE)."""
    order = [name for name, _ in STAGES]
    first = order.index(FIRST_MEASURING_STAGE)
    shown = observer.stage

    def stage(name: str, title: str) -> None:
        if name not in order or order.index(name) >= first:
            wait()
        shown(name, title)

    observer.stage = stage  # type: ignore[method-assign]


def _run(args: argparse.Namespace, observer: SweepObserver, command: List[str]):
    if args.fleet_lock_dir:
        from zcorch.sweep.fleet import LockingObserver

        pair_dir = os.path.abspath(args.output or args.resume or ".")   # FLEET/PAIR: named to those who wait
        observer = LockingObserver(observer, args.fleet_lock_dir, args.fleet_lock,
                                   who={"fleet": os.path.dirname(pair_dir), "pair": os.path.basename(pair_dir)})
    return run_sweep(args.file, output=args.output, resume=args.resume,
                     accept_new_host_keys=args.accept_new_host_keys, dry_run=args.dry_run,
                     observer=observer, command=command, hosts=hosts_from_args(args), overrides=args.overrides,
                     allow_ssh_config_exec=args.allow_ssh_config_exec, recalibrate=args.recalibrate)
