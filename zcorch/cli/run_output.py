"""What `zcorch run` prints about runs, for one sweep (zcorch.cli.run) and a fleet (zcorch.cli.fleet): a run in
words, JSON events, runs.parquet written at the end, and `--export DEST` (checked first, done last)."""
from __future__ import annotations

import logging
import math
import os
import sys
from typing import Optional, TextIO

from zcorch.cli.console import log
from zcorch.errors import ResultsError
from zcorch.results.store import lock_result_set


class Console:
    """What a sweep or a fleet tells the user on stderr, through the `zcorch.run` logger (-q: less, -v: more)."""

    def __init__(self, stream: Optional[TextIO] = None):
        self.stream = stream if stream is not None else sys.stderr
        self.log = log("run")
        self.tty = self.stream.isatty()
        self.bar = None

    def _say(self, level: int, text: str) -> None:
        """Log one `zcorch run:` line without tearing the progress bar drawn on the same terminal."""
        if self.bar is not None:
            self.bar.clear()
        self.log.log(level, f"zcorch run: {text}")
        if self.bar is not None:
            self.bar.refresh()

    def message(self, text: str) -> None:
        self._say(logging.INFO, text)

    def quiet(self, text: str, ok: bool) -> bool:
        """Whether -q leaves a run's line out (a failed run's is still a warning)."""
        if self.log.isEnabledFor(logging.INFO):
            return False
        if not ok:
            self.log.warning(f"zcorch run: {text}")
        return True

    def advance(self, desc: str, total: int, done: int, postfix: str) -> None:
        """The terminal's tqdm bar (made at the first run) at `done` of `total` runs."""
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=total, file=self.stream, unit="run", dynamic_ncols=True, leave=True, desc=desc)
        self.bar.total = total
        self.bar.set_postfix_str(postfix[:120], refresh=False)
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def run_line(record: dict, whole_reason: bool = False) -> str:
    """`write→read r0: ok 9.41 Gbit/s` of a run, with a failed run's reason (whole_reason: not cut at 160)."""
    p, recv = record.get("params") or {}, record.get("receiver") or {}
    text = f"{p.get('send_mode', '?')}→{p.get('recv_mode', '?')}"
    if (p.get("streams") or 1) > 1:
        text += f" ×{p['streams']}"
    text += f" r{record.get('repeat')}: {record.get('status')}"
    if record.get("status") == "ok" and recv.get("wall_ns"):
        text += f" {recv['bytes'] * 8 / recv['wall_ns']:.2f} Gbit/s"
    elif record.get("status") != "ok" and record.get("reason"):
        reason = str(record["reason"])
        text += f" ({reason if whole_reason else reason[:160]})"
    return text


def _clean(obj):
    """JSON has no NaN or infinity: they become null (an event must never fail the sweep it reports)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


class JsonLines:
    """`--json`: one JSON object a line on `out` (stdout), written and flushed as each event happens."""

    def __init__(self, out: Optional[TextIO] = None):
        self.out = out if out is not None else sys.stdout

    def write(self, doc: dict) -> None:
        import json

        self.out.write(json.dumps(doc, default=str, allow_nan=False) + "\n")
        self.out.flush()

    def emit(self, event: str, **fields) -> None:
        import datetime

        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")
        self.write(_clean({"event": event, "time": now, **fields}))

    def message(self, text: str) -> None:
        self.emit("message", message=text)


def say_end(directory: str, exported: Optional[dict], interrupted: bool) -> None:
    """The last lines of a run without --json: where the results are, the export, how to continue."""
    print(f"results: {directory}")
    if exported is not None:
        report_export(exported, directory)
    if interrupted:
        print(f"zcorch run: interrupted; finished runs are kept. Continue with: zcorch run --resume "
              f"{directory}", file=sys.stderr)


def _write_cache_locked(directory: str) -> None:
    """runs.parquet, so the first zcorch.load reads it rather than every JSON line (best effort: a warning),
    under the result set's lock again: a `--resume` started since the sweep released it is appending."""
    from zcorch.analysis.cache import write_cache  # pandas + pyarrow: imported only when a sweep ends

    try:
        lock = lock_result_set(directory)
    except ResultsError as exc:
        print(f"zcorch run: warning: runs.parquet not written: {exc}", file=sys.stderr)
        return
    try:
        write_cache(directory)
    finally:
        os.close(lock)


def check_export(dest: Optional[str]) -> None:
    """`--export DEST`, checked before the sweep starts: a DEST the export would refuse is a bad option (exit 2)."""
    from zcorch.analysis.export_dest import dest_problem
    from zcorch.errors import ConfigError

    problem = dest_problem(dest) if dest else None
    if problem:
        raise ConfigError(f"--export: {problem}")


def export_after_run(root: str, dest: str) -> dict:
    """`--export DEST` at the end of a run: every result set under `root` exported into DEST as `zcorch export
    ROOT DEST` does. Best effort: an error is returned, not raised. Returns {"dest", "exported", "unchanged",
    "skipped", "error"}."""
    from zcorch.analysis.export import export_results   # pandas, pyarrow: only when exporting
    from zcorch.errors import ZcorchError

    def say(message: str) -> None:   # waiting for another controller's export of the same dataset
        print(f"zcorch run: export: {message}", file=sys.stderr, flush=True)

    try:
        res = export_results(root, dest, say)
    except (ZcorchError, OSError) as exc:
        return {"dest": dest, "exported": 0, "unchanged": 0, "skipped": [], "error": str(exc)}
    return {"dest": str(res.dest), "exported": len(res.exported), "unchanged": res.unchanged,
            "skipped": list(res.skipped), "error": None}


def report_export(outcome: dict, root: str) -> None:
    """What `zcorch run` without --json says of its export: one line on stdout, and on stderr a warning for each
    set skipped and for a failed export."""
    for why in outcome["skipped"]:
        print(f"zcorch run: warning: export: skipped {why}", file=sys.stderr)
    if outcome["error"]:
        print(f"zcorch run: warning: the export to {outcome['dest']} failed: {outcome['error']}; the results are "
              f"complete in {root} (`zcorch export {root} {outcome['dest']}` exports them)", file=sys.stderr)
        return
    print(f"export: {outcome['exported']} result set(s) exported, {outcome['unchanged']} unchanged, "
          f"{len(outcome['skipped'])} skipped -> {outcome['dest']}")
