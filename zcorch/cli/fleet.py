"""`zcorch run EXP --hosts INV:PAIR1,PAIR2...|INV:all` and `zcorch run --resume FLEET`: the command line of a
fleet run (zcorch.sweep.fleet), handed over by `zcorch run`: one progress display for every pair, `--json`
events that carry the pair, and the pairs compared at the end (zcorch.analysis.pairs). Exit status: 0 every
pair complete with every run ok, 1 some pair not, 2 a bad file or option, 75 the fleet is busy, 130 interrupted.
"""
from __future__ import annotations

import argparse
import logging
import os
import queue
import signal
import sys
import threading
from contextlib import suppress
from typing import Any, Dict, List, Optional, Set, TextIO

from zcorch.cli.run_output import Console, JsonLines, _clean, export_after_run, run_line, say_end
from zcorch.sweep.fleet import LOCALHOST, FleetObserver, PairState, prepare_fleet

PAIRS_REPORT = "pairs.md"   # the fleet's pairs compared, written into the fleet directory at the end


class ConsoleFleetObserver(Console, FleetObserver):
    """One progress display for all pairs: a tqdm bar on a terminal, else one line per run naming its pair."""

    def __init__(self, stream: Optional[TextIO] = None):
        super().__init__(stream)
        self.todo: Dict[str, int] = {}
        self.done: Dict[str, int] = {}
        self.failed: Dict[str, int] = {}

    def fleet_started(self, directory: str, pairs: List[PairState], resumed: bool) -> None:
        left = [p.pair for p in pairs if not p.done]
        self._say(logging.INFO, f"fleet of {len(pairs)} pair(s){' resumed' if resumed else ''}: "
                                f"{', '.join(left) or 'nothing left to run'} -> {directory}")

    def event(self, pair: str, doc: dict) -> None:
        kind = doc.get("event")
        if kind == "start":
            self.todo[pair] = int(doc.get("runs") or 0) - int(doc.get("already_ok") or 0)
            self.done.setdefault(pair, 0)
            self.failed.setdefault(pair, 0)
            if self.bar is not None:
                self.bar.total = sum(self.todo.values())
        elif kind == "warning":
            self._say(logging.WARNING, f"[{pair}] warning: {doc.get('message')}")
        elif kind == "stage" and self.log.isEnabledFor(logging.DEBUG):
            self._say(logging.DEBUG, f"[{pair}] {str(doc.get('title', '')).split(' (')[0]}")
        elif kind == "run":
            ok = doc.get("status") == "ok"
            self.done[pair] = self.done.get(pair, 0) + 1
            self.failed[pair] = self.failed.get(pair, 0) + (not ok)
            text = f"[{pair}] {run_line(doc)}"
            if self.quiet(text, ok):
                return
            counts = "  ".join(f"{p} {self.done.get(p, 0)}/{n}" for p, n in self.todo.items())
            if self.tty:
                self.advance("zcorch run (fleet)", sum(self.todo.values()), sum(self.done.values()),
                             f"{counts}  failures {sum(self.failed.values())}")
            else:
                self.stream.write(f"[{sum(self.done.values())}/{sum(self.todo.values())}] {text}  ({counts})\n")
                self.stream.flush()

    def pair_ended(self, state: PairState, stderr_tail: List[str]) -> None:
        if state.status == "complete" and not state.reason:
            self._say(logging.INFO, f"[{state.pair}] complete: {state.runs['ok']} of {state.runs['planned']} "
                                    f"runs ok")
            return
        self._say(logging.WARNING, f"[{state.pair}] {state.status}: {state.reason}")
        if self.log.isEnabledFor(logging.DEBUG):
            for line in stderr_tail:
                self._say(logging.DEBUG, f"[{state.pair}] {line}")


class JsonFleetObserver(JsonLines, FleetObserver):
    """`--json`: every pair's events as `zcorch run --json` prints them, each with `pair`, and `fleet_start`,
    `pair_end`, `fleet_end` events (docs/schemas/run-events.schema.json)."""

    def fleet_started(self, directory: str, pairs: List[PairState], resumed: bool) -> None:
        from zcorch import __version__

        self.emit("fleet_start", zcorch_version=__version__, fleet_dir=directory, resumed=resumed,
                  pairs=[{"pair": p.pair, "result_dir": p.dir, "status": p.status, "hosts": p.hosts,
                          "shares": p.shares} for p in pairs])

    def event(self, pair: str, doc: dict) -> None:
        # _clean: a NaN in a run the fleet read back from a killed pair's records (never printed)
        self.write(_clean({**doc, "pair": pair}))

    def pair_ended(self, state: PairState, stderr_tail: List[str]) -> None:
        self.emit("pair_end", pair=state.pair, status=state.status, exit_status=state.exit_status,
                  reason=state.reason, runs=state.runs, result_dir=state.dir)


def main(args: argparse.Namespace, command: List[str], spec: Optional[str]) -> int:
    """`spec`: the --hosts value (or ZCORCH_HOSTS) naming the pairs; None with --resume FLEET."""
    from zcorch.errors import ConfigError

    if args.dry_run:
        raise ConfigError("--dry-run shows one pair: give --hosts INVENTORY:PAIR (a fleet runs each pair's own "
                          "sweep, whose dry run is the same)")
    observer = JsonFleetObserver() if args.json else ConsoleFleetObserver()
    from zcorch.cli import main as zcorch_main   # what each pair's (forked) process runs

    end_work = EndWork()
    fleet = prepare_fleet(args.file, spec, pair_main=zcorch_main, output=args.output, resume=args.resume,
                          overrides=args.overrides, accept_new_host_keys=args.accept_new_host_keys,
                          allow_ssh_config_exec=args.allow_ssh_config_exec, observer=FanOut(observer, end_work),
                          command=command, recalibrate=args.recalibrate)
    # The first SIGINT/SIGTERM/SIGHUP stops every pair as one sweep is stopped (SIGTERM); the fleet waits for them.
    old = {s: signal.signal(s, lambda signum, frame: fleet.stop())
           for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        result = fleet.run()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        fleet.close()
        if isinstance(observer, ConsoleFleetObserver):
            observer.close()
    loaded = end_work.finish(result.pairs)
    report = _pairs_report(result.directory, args.json, loaded)
    exported = export_after_run(result.directory, args.export) if args.export else None
    if args.json:
        if exported is not None:
            observer.emit("export", **exported)
        observer.emit("fleet_end", status=result.status, exit_status=result.exit_status,
                      fleet_dir=result.directory, failed_pairs=[p.pair for p in result.failed],
                      pairs_compared={k: v for k, v in report.items() if k != "text"} if report else None)
        return result.exit_status
    print(_pairs_table(result.pairs))
    if report is not None:
        print(report["text"], end="")
    say_end(result.directory, exported, result.status == "interrupted")
    return result.exit_status


def _pairs_table(pairs: List[PairState]) -> str:
    rows = [["pair", "status", "runs ok", "result set", "reason"]]
    for p in pairs:
        rows.append([p.pair, p.status, f"{p.runs['ok']}/{p.runs['planned']}", p.dir, p.reason or ""])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


class FanOut(FleetObserver):
    """Several fleet observers as one (the display and the end work): each hook calls theirs in turn."""

    def __init__(self, *observers: FleetObserver):
        self.observers = observers


def _fan_out(hook: str):
    def call(self: FanOut, *args: Any) -> None:
        for o in self.observers:
            getattr(o, hook)(*args)
    return call


for _hook in [name for name in vars(FleetObserver) if not name.startswith("_")]:
    setattr(FanOut, _hook, _fan_out(_hook))


class EndWork(FleetObserver):
    """The fleet's end work: each complete pair's runs.parquet and its runs loaded for the comparison, on a
    thread while the pairs run (the fleet ends sooner: docs/performance.md), unless a pair measures this machine."""

    def __init__(self) -> None:
        self.directory: Optional[str] = None
        self.compare = False
        self.todo: "queue.Queue[Optional[PairState]]" = queue.Queue()
        self.done: Set[str] = set()           # pairs whose cache is written (or was not to be)
        self.loaded: Dict[str, Any] = {}      # pair -> zcorch.load of its result set
        self.thread: Optional[threading.Thread] = None
        self.background = False
        self.pairs = 0
        self.scipy_wanted = False             # scipy.stats imported (or tried) for the comparison

    def fleet_started(self, directory: str, pairs: List[PairState], resumed: bool) -> None:
        self.directory = directory
        self.compare = len(pairs) > 1   # one pair: nothing to compare, scipy is not imported
        self.pairs = len(pairs)
        self.background = not any(_this_machine(h) for p in pairs if not p.done for h in p.hosts)

    def pairs_running(self) -> None:
        if self.background:
            self.thread = threading.Thread(target=self._work, name="fleet-end-work", daemon=True)
            self.thread.start()

    def pair_ended(self, state: PairState, stderr_tail: List[str]) -> None:
        if self.thread is not None:
            self.todo.put(state)

    def _work(self) -> None:
        with suppress(Exception):   # a broken install: the main thread meets it again at the end, and reports it
            import zcorch.analysis.cache  # noqa: F401  (pandas, pyarrow)

            if self.compare:
                import zcorch.analysis.pairs  # noqa: F401
        for state in iter(self.todo.get, None):   # None: the fleet ended
            self._one(state)

    def _one(self, state: PairState) -> None:
        directory = os.path.join(self.directory, state.dir)
        _write_cache_if_complete(directory)
        self.done.add(state.pair)
        if self.compare and os.path.isfile(os.path.join(directory, "manifest.json")):
            from zcorch.analysis.load import load
            from zcorch.errors import ZcorchError

            try:
                self.loaded[state.pair] = load(directory)
            except (ZcorchError, OSError, ValueError):
                return   # the comparison loads it again, and says what is wrong
            self._prefetch_scipy(self.loaded[state.pair])

    def _prefetch_scipy(self, runs: Any) -> None:
        """Import scipy.stats (a second of CPU) while the other pairs run, when the comparison may test a cell of
        this pair: one with enough ok runs to reach p < alpha against the other pairs pooled."""
        if self.scipy_wanted:
            return
        from zcorch.analysis.gate import DEFAULT_ALPHA
        from zcorch.analysis.stats import can_be_significant

        ok = runs.loc[runs["status"] == "ok", "cell"].value_counts()
        others = max(self.pairs - 1, 1)   # the same experiment on each: as many runs a cell on each other pair
        if any(can_be_significant(int(n), int(n) * others, DEFAULT_ALPHA) for n in ok):
            self.scipy_wanted = True
            with suppress(Exception):   # a broken install: the comparison meets it again, and reports it
                import scipy.stats  # noqa: F401

    def finish(self, pairs: List[PairState]) -> Dict[str, Any]:
        """Once every complete pair's runs.parquet is written (write_cache keeps a valid one): pair -> its loaded
        runs, for zcorch.analysis.pairs.compare_fleet."""
        if self.thread is not None:
            self.todo.put(None)
            self.thread.join()
            self.thread = None
        for state in pairs:   # (fleet_started gave the directory: prepare_fleet calls it before run)
            if state.pair not in self.done:
                _write_cache_if_complete(os.path.join(self.directory, state.dir))
        return self.loaded


def _this_machine(identity: str) -> bool:
    """Whether a host identity (host_identity) is the controller's machine: localhost, or a loopback address."""
    import ipaddress

    if identity == LOCALHOST:
        return True
    host = identity.rsplit(":", 1)[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _write_cache_if_complete(directory: str) -> None:
    """The pair's runs.parquet, when its result set is complete (as `zcorch run` decides)."""
    from zcorch.cli.run_output import _write_cache_locked
    from zcorch.errors import ZcorchError
    from zcorch.results.store import load_manifest

    try:
        complete = load_manifest(directory).get("status") == "complete"
    except ZcorchError:
        return   # a pair whose sweep never made its set
    if complete:
        _write_cache_locked(directory)


def _pairs_report(directory: str, quiet: bool, loaded: Optional[Dict[str, Any]] = None) -> Optional[dict]:
    """The pairs compared (zcorch.analysis.pairs), written to FLEET/pairs.md; None with fewer than two. Best effort."""
    from zcorch.errors import ZcorchError

    try:
        from zcorch.sweep.fleet import pair_dirs

        with_sets = [d for d in pair_dirs(directory).values() if os.path.isfile(os.path.join(d, "manifest.json"))]
        if len(with_sets) < 2:   # nothing to compare: pandas and scipy are not even imported
            return None
        from zcorch.analysis import pairs as pairsmod

        comparison = pairsmod.compare_fleet(directory, loaded=loaded, test_all=False)   # as pairs.md shows it
        if comparison is None:
            return None
        from zcorch.results.store import write_text_atomic

        write_text_atomic(os.path.join(directory, PAIRS_REPORT), pairsmod.render(comparison, "markdown"))
        return {"text": pairsmod.render(comparison, "text"), "file": PAIRS_REPORT, "reason": comparison.gate.reason,
                "exit_code": comparison.gate.code, "different": comparison.different_pairs()}
    except (ZcorchError, OSError, ValueError) as exc:
        if not quiet:
            print(f"zcorch run: warning: the pairs were not compared: {exc}", file=sys.stderr)
        return None
