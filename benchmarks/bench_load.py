"""How fast does `zcorch.load` read a 1 000 000-run result set? (budget, docs/performance.md: the first load
after the sweep finished costs at most 1.3x `pandas.read_parquet` of its runs.parquet, each plus the imports
both need, i.e. zcorch's own imports count against it)

The big result set is built from the real runs of a small result set (default
tests/data/quickstart-small, written by a real `zcorch run`): its records are repeated with new
cell ids (10 000 cells x 100 repeats) and their timings scaled by a seeded random factor, in the
result-set layout (manifest.json + runs.jsonl, one json.dumps(sort_keys=True) line per run as
ResultSet.append_run writes it), so every line has the shape and size of a real record.

Measured, interleaved, several times:
  cold    zcorch.load(DIR, cache=False)      the JSON-lines parser alone (no cache at all)
  finish  ResultSet.finish("complete") and   what `zcorch run` adds at the end of a sweep:
          cache.write_cache(DIR)             parse runs.jsonl + write runs.parquet
  after   first zcorch.load(DIR) of a new    what a user's first load costs right after the run
          Python process, after finish()     (the process's imports, pyarrow's too, are timed apart)
  cached  zcorch.load(DIR) again, in-process
  pandas  pandas.read_parquet(DIR/runs.parquet) in a new Python process without zcorch (imports apart)
cold and finish take minutes for a million runs, so they run in the first --cold-repeat rounds (0: none,
when --keep kept a built set); after, cached and pandas run in every round, interleaved. Printed: medians,
the ratio cold/after, and first/pandas = (after + zcorch's imports beyond pandas') / pandas.

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
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import zcorch  # noqa: E402
from zcorch.analysis.cache import write_cache  # noqa: E402
from zcorch.results import store as results  # noqa: E402

REPEATS_PER_CELL = 100
BUDGET = 1.3   # first load / pandas.read_parquet


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
    # the plan of those runs: a runs.jsonl beyond what its plan can hold is refused (setfiles.run_record_limit)
    with open(target / results.PLAN, "w") as f:
        f.write("[" + ",".join(json.dumps({"id": f"{templates[i % len(templates)]['cell'][:8]}"
                                                 f"{i // REPEATS_PER_CELL:08x}", "repeat": i % REPEATS_PER_CELL})
                                for i in range(n_runs)) + "]")


def timed(fn) -> float:
    t0 = time.perf_counter()
    frame = fn()
    dt = time.perf_counter() - t0
    assert len(frame) > 0
    return dt


FIRST_LOAD = """
import sys, time
t0 = time.perf_counter()
import zcorch, zcorch.analysis.load
t1 = time.perf_counter()
frame = zcorch.load(sys.argv[1])
t2 = time.perf_counter()
assert len(frame) > 0
print(t1 - t0, t2 - t1)
"""


PANDAS_READ = """
import sys, time
t0 = time.perf_counter()
import pandas, pyarrow.parquet
t1 = time.perf_counter()
frame = pandas.read_parquet(sys.argv[1])
t2 = time.perf_counter()
assert len(frame) > 0 and not any(m.startswith("zcorch") for m in sys.modules)
print(t1 - t0, t2 - t1)
"""


def in_new_process(script: str, arg: Path) -> "tuple[float, float]":
    """(import seconds, load seconds) that `script` prints when run by a fresh interpreter."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as a user's shell runs it: with the byte-code cache
    out = subprocess.run([sys.executable, "-c", script, str(arg)], env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    return float(out[0]), float(out[1])


def finish_as_zcorch_run_does(target: Path) -> float:
    """Time ResultSet.finish("complete") + write_cache on `target` after removing any cache (rebuilt
    from scratch), as `zcorch run` does after a completed sweep."""
    (target / results.RUNS_CACHE).unlink(missing_ok=True)
    rs = results.ResultSet(str(target), results.load_manifest(str(target)))
    warnings = []
    t0 = time.perf_counter()
    rs.finish("complete")
    write_cache(target, warn=warnings.append)
    dt = time.perf_counter() - t0
    if warnings or not (target / results.RUNS_CACHE).exists():
        sys.exit(f"finish() did not build the cache: {warnings}")
    return dt


def median_text(name: str, values: list) -> str:
    return f"{name} {statistics.median(values):.2f} s (median of {len(values)})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5, help="rounds of after/cached loads (default 5)")
    ap.add_argument("--cold-repeat", type=int, default=1, help="rounds that also time cold and finish (default 1)")
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
    print(f"runs.jsonl: {size / 1e6:.0f} MB", flush=True)
    # The 2 GB just generated is still being written back: loads timed meanwhile read beside that writeback
    # (a sweep writes its runs.jsonl over hours, so a user's first load never does). Flushed first, and again
    # after each finish() below.
    os.sync()

    cold, finish, after, imports, cached, plain, plain_imports = [], [], [], [], [], [], []
    for i in range(args.repeat):
        line = f"  round {i + 1}:"
        if i < args.cold_repeat or not (target / results.RUNS_CACHE).exists():
            cold.append(timed(lambda: zcorch.load(target, cache=False)))
            finish.append(finish_as_zcorch_run_does(target))
            os.sync()
            line += f" cold {cold[-1]:.2f} s, finish {finish[-1]:.2f} s,"
        imp, load = in_new_process(FIRST_LOAD, target)
        imports.append(imp)
        after.append(load)
        cached.append(timed(lambda: zcorch.load(target)))
        imp_p, read_p = in_new_process(PANDAS_READ, target / results.RUNS_CACHE)
        plain.append(read_p)
        plain_imports.append(imp_p)
        print(f"{line} after {after[-1]:.2f} s (+ imports {imp:.2f} s), cached {cached[-1]:.2f} s, "
              f"pandas {plain[-1]:.2f} s", flush=True)
    cache_mb = (target / results.RUNS_CACHE).stat().st_size / 1e6
    ma, mp = statistics.median(after), statistics.median(plain)
    extra_imports = statistics.median(imports) - statistics.median(plain_imports)
    ratio = (ma + max(extra_imports, 0.0)) / mp
    print(f"{len(after)} rounds, {args.runs} runs, {results.RUNS_CACHE} {cache_mb:.0f} MB")
    if cold:
        print(median_text("cold parse", cold) + "; "
              + median_text("finish() + write_cache() (parse + write cache)", finish)
              + f"; cold/after = {statistics.median(cold) / ma:.0f}x")
    print(median_text("first load after finish() (new process)", after) + "; "
          + median_text("its imports", imports) + "; " + median_text("cached load", cached))
    print(median_text(f"pandas.read_parquet({results.RUNS_CACHE}) without zcorch (new process)", plain) + "; "
          + median_text("its imports", plain_imports))
    print(f"first/pandas = (first load + zcorch's extra imports {extra_imports:.2f} s) / pandas = {ratio:.2f}x; "
          f"budget <= {BUDGET}x: {'met' if ratio <= BUDGET else 'NOT met'}")
    if not args.keep:
        shutil.rmtree(target)
    return 0 if ratio <= BUDGET else 1


if __name__ == "__main__":
    sys.exit(main())
