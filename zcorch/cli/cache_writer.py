"""runs.parquet of a `zcorch run`, written by a helper process that imports pandas and pyarrow meanwhile.

Why: those imports cost more than a short sweep's runs; overlapped with the set-up, the command ends sooner
(docs/performance.md). Awaited before anything is measured; EOF ends it unwritten; if it fails, the command writes.
"""
from __future__ import annotations

import os
import select
import subprocess
import sys
from contextlib import suppress
from typing import Optional

READY = "ready"
_READY_TIMEOUT = 120.0  # its imports on a loaded machine: then the command writes the cache itself
_EXIT_TIMEOUT = 600.0   # a million-run set takes about a minute to parse: generous, never forever


class CacheWriter:
    """The helper process seen from the command (module docstring)."""

    def __init__(self) -> None:
        self.proc: Optional[subprocess.Popen] = None
        self.ready = False
        # Never `python -m` as is: a `zcorch` package planted in the current directory would run as this user
        # (zcorch.hosts.interpreter). The helper imports the package this command runs, through PYTHONPATH.
        import zcorch
        from zcorch.hosts.interpreter import python_argv

        parent = os.path.dirname(os.path.dirname(os.path.abspath(zcorch.__file__)))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (parent, os.environ.get("PYTHONPATH")) if p))
        try:
            self.proc = subprocess.Popen(python_argv(sys.executable, __name__, safe_path=True), stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True, start_new_session=True, env=env)
        except OSError:
            self.proc = None

    def wait_ready(self) -> None:
        """Block until the helper has imported what it needs (or is gone: the command writes the cache)."""
        if self.proc is None or self.ready:
            return
        try:
            waited = select.select([self.proc.stdout], [], [], _READY_TIMEOUT)[0]
            line = self.proc.stdout.readline() if waited else ""
        except (OSError, ValueError):
            line = ""
        self.ready = line.strip() == READY
        if not self.ready:
            self.close()

    def write(self, result_dir: str) -> None:
        """Write runs.parquet of `result_dir` now (in the helper, else here); returns when it is written."""
        self.wait_ready()
        if self.proc is not None:
            try:
                self.proc.stdin.write(result_dir + "\n")
                self.proc.stdin.close()
                # Its stdout ends when it exits: select wakes at once, where Popen.wait(timeout) polls with sleeps.
                select.select([self.proc.stdout], [], [], _EXIT_TIMEOUT)
                if self.proc.wait(_EXIT_TIMEOUT) == 0:
                    self.proc = None
                    return
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
            except KeyboardInterrupt:   # as zcorch.analysis.cache.write_cache takes Ctrl-C: the cache is skipped
                self.ready = False
                self.close()
                print(f"zcorch: warning: {result_dir}/runs.parquet not built (interrupted); the results are "
                      "complete in runs.jsonl, the first zcorch.load will parse it", file=sys.stderr)
                return
            self.ready = False
            self.close()
        from zcorch.cli.run_output import _write_cache_locked

        _write_cache_locked(result_dir)

    def close(self) -> None:
        """End the helper without writing (idempotent): one still importing, or stuck, is killed (it has
        written nothing); one waiting for its directory ends at the EOF."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if not self.ready:
            proc.kill()
        for stream in (proc.stdin, proc.stdout):
            with suppress(OSError):
                stream.close()
        try:
            proc.wait(5.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> int:
    from zcorch.cli.run_output import _write_cache_locked
    import zcorch.analysis.cache  # noqa: F401 - the imports this helper exists to make early

    try:
        print(READY, flush=True)
    except BrokenPipeError:   # the command is done with it (its sweep ended early)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # nothing left to flush at exit
        return 0
    line = sys.stdin.readline().strip()
    if line:
        _write_cache_locked(line)   # renamed into place when it returns
    sys.stderr.flush()
    # The command waits for this exit: skip the interpreter's teardown of pandas and pyarrow.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
