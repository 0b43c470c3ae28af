"""How fast do zcorch's commands start? (budget, docs/performance.md: `zcorch --help` and `zcorch plan` <= 0.3 s)

Each command is a new Python process, timed wall-clock from spawn to exit (and its CPU time, which a
busy machine inflates less), interleaved with its peers
so that machine noise hits all of them alike; printed are the medians and each command's ratio to the
peer `python -c "import yaml"` (the interpreter's start-up plus the one library every command needs).

  pass       python -c pass                              the interpreter alone
  yaml       python -c "import yaml"                     the peer
  help       python -m zcorch --help
  plan       python -m zcorch plan experiments/quickstart.yaml
  plan-json  python -m zcorch plan --json experiments/quickstart.yaml
  info       python -m zcorch worker info                what a remote host's first contact costs
  compare-h  python -m zcorch compare --help             a command whose work needs pandas, help only

    python benchmarks/bench_cli.py [--repeat 15]

The machine is shared: trust medians, read ratios.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICKSTART = os.path.join(ROOT, "experiments", "quickstart.yaml")
PY = sys.executable
COMMANDS = {
    "pass": [PY, "-c", "pass"],
    "yaml": [PY, "-c", "import yaml"],
    "help": [PY, "-m", "zcorch", "--help"],
    "plan": [PY, "-m", "zcorch", "plan", QUICKSTART],
    "plan-json": [PY, "-m", "zcorch", "plan", "--json", QUICKSTART],
    "info": [PY, "-m", "zcorch", "worker", "info"],
    "compare-h": [PY, "-m", "zcorch", "compare", "--help"],
}
PEER = "yaml"
TARGET_S = 0.3


def timed(argv: "list[str]") -> "tuple[float, float]":
    """(wall seconds, CPU seconds user+system) of one run of argv in a new process."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # As a user's shell runs it: with the byte-code cache (an installed wheel has it compiled; a checkout
    # writes it on the first, untimed, round). Without it every start re-compiles ~100 modules.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    elapsed = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.decode()[-500:]}")
    return elapsed, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    for argv in COMMANDS.values():  # warm the page cache and .pyc files; not timed
        timed(argv)
    times: "dict[str, list[tuple[float, float]]]" = {name: [] for name in COMMANDS}
    for _ in range(args.repeat):
        for name, argv in COMMANDS.items():
            times[name].append(timed(argv))
    peer = statistics.median(wall for wall, _cpu in times[PEER])
    print(f"{'command':<10} {'wall s':>7} {'min s':>7} {'cpu s':>7} {'x ' + PEER:>8}  target (wall median)")
    for name, values in times.items():
        med = statistics.median(wall for wall, _cpu in values)
        cpu = statistics.median(c for _wall, c in values)
        target = f"<= {TARGET_S} s: {'met' if med <= TARGET_S else 'MISSED'}" if name in ("help", "plan") else ""
        print(f"{name:<10} {med:7.3f} {min(w for w, _c in values):7.3f} {cpu:7.3f} {med / peer:8.2f}  {target}")
    print(f"{args.repeat} interleaved rounds, medians; python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
