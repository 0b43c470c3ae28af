"""How fast does `zcorch.load` read a 1 000 000-run result set? (target: under 2 s)

The big result set is built from the real runs of a small result set (default
tests/data/quickstart-small, written by a real `zcorch run`): its records are repeated with new
cell ids (10 000 cells x 100 repeats) and their timings scaled by a seeded random factor, through
the real result-set writer layout (manifest.json + runs.jsonl), so every line has the shape and
size of a real record.

Measured, interleaved, several times:
  warm  zcorch.load(DIR)              runs.jsonl unchanged since the last load: columnar cache
  cold  zcorch.load(DIR, cache=False) the JSON-lines parser alone (what a first load costs)
and printed as medians with the ratio cold/warm.

    python benchmarks/bench_load.py [--runs 1000000] [--repeat 5] [--cold-repeat 1] [--keep]
                                    [--source DIR] [--dir WORKDIR]

--keep keeps the generated set (and its cache) under --dir for the next invocation.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import zcorch  # noqa: E402
from zcorch import results  # noqa: E402

REPEATS_PER_CELL = 100


def build(source: Path, target: Path, n_runs: int) -> None:
    templates = [r for r in results.read_jsonl(str(source / results.RUNS))]
    if not templates:
        sys.exit(f"{source}: no runs to build from")
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for name in (results.MANIFEST, results.EXPERIMENT, results.PLAN, results.META, results.BASELINES):
        if (source / name).exists():
            shutil.copy(source / name, target / name)
    rng = random.Random(0)
    with open(target / results.RUNS, "w") as f:
        for i in range(n_runs):
            rec = dict(templates[i % len(templates)])
            cell_index, repeat = divmod(i, REPEATS_PER_CELL)
            rec["cell"] = f"{rec['cell'][:8]}{cell_index:08x}"
            rec["repeat"] = repeat
            rec["log"] = f"logs/{rec['cell']}-r{repeat}.log"
            factor = 0.9 + 0.2 * rng.random()
            for side in ("sender", "receiver"):
                if isinstance(rec.get(side), dict):
                    m = dict(rec[side])
                    for k in ("wall_ns", "utime_us", "stime_us"):
                        if isinstance(m.get(k), int):
                            m[k] = int(m[k] * factor)
                    rec[side] = m
            f.write(json.dumps(rec, sort_keys=True) + "\n")


def timed(fn) -> float:
    t0 = time.perf_counter()
    frame = fn()
    dt = time.perf_counter() - t0
    assert len(frame) > 0
    return dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5, help="warm loads, interleaved (default 5)")
    ap.add_argument("--cold-repeat", type=int, default=1, help="cold loads, interleaved (default 1)")
    ap.add_argument("--source", type=Path, default=ROOT / "tests" / "data" / "quickstart-small")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/zcorch-bench-load"))
    ap.add_argument("--keep", action="store_true", help="keep the generated result set")
    args = ap.parse_args()

    target = args.dir / f"runs-{args.runs}"
    marker = target / "bench.json"
    want = {"runs": args.runs, "source_size": (args.source / results.RUNS).stat().st_size}
    if marker.exists() and json.loads(marker.read_text()) == want:
        print(f"reusing {target} (built earlier from the same source)")
    else:
        t0 = time.perf_counter()
        build(args.source, target, args.runs)
        marker.write_text(json.dumps(want))
        print(f"built {args.runs} runs from {args.source} in {time.perf_counter() - t0:.1f} s")
    size = (target / results.RUNS).stat().st_size
    print(f"runs.jsonl: {size / 1e6:.0f} MB")

    t0 = time.perf_counter()
    frame = zcorch.load(target)  # parses and writes the cache unless a valid one is there
    first = time.perf_counter() - t0
    cache_mb = (target / "runs.cache").stat().st_size / 1e6
    print(f"first load of this process (includes imports; parses + writes the cache if needed, "
          f"cache {cache_mb:.0f} MB): {first:.2f} s, {len(frame)} rows x {frame.shape[1]} columns")
    del frame

    # Interleaved: a warm load each round, a cold one in the first --cold-repeat rounds (a cold
    # load of a million runs takes minutes).
    warm, cold = [], []
    for i in range(args.repeat):
        warm.append(timed(lambda: zcorch.load(target)))
        line = f"  round {i + 1}: warm {warm[-1]:.2f} s"
        if i < args.cold_repeat:
            cold.append(timed(lambda: zcorch.load(target, cache=False)))
            line += f", cold {cold[-1]:.2f} s"
        print(line, flush=True)
    mw = statistics.median(warm)
    text = f"median of {len(warm)} warm loads (cache): {mw:.2f} s"
    if cold:
        mc = statistics.median(cold)
        text += f"; median of {len(cold)} cold loads (JSON parse): {mc:.2f} s; cold/warm = {mc / mw:.0f}x"
    print(text + f"; target warm < 2 s: {'met' if mw < 2 else 'NOT met'}")
    if not args.keep:
        shutil.rmtree(target)
    return 0 if mw < 2 else 1


if __name__ == "__main__":
    sys.exit(main())
