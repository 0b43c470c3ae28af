"""`zcorch history ROOT --check` as a nightly gate: 30 nights of a 10-cell experiment (target: ≤ 5 s).

The nights are result sets under ROOT/<night>/<name>, as contrib/nightly/zcorch-nightly lays them out, each a
copy of one real result set (default tests/data/compare.yaml recorded now on localhost, or --source DIR) whose
cells are multiplied to --cells by giving each copy of a cell its own buffer value (new cell ids, the same
real runs) and whose runs are scaled per night by a seeded factor (night-to-night noise of --night-noise %),
as fixtures_analysis.slowed_copy does. No report.html is there: the gate writes none unless --reports.

Measured in child processes, interleaved with the peer `python -c "import pandas"` (what any analysis command
pays before it reads a byte), medians of --repeat runs each:
  cold    the first --check over the new nights (each set's runs.parquet cache written)
  warm    --check again (the caches read)
  peer    python -c "import pandas"

    python benchmarks/bench_gate.py [--nights 30] [--cells 10] [--repeat 5] [--source DIR] [--keep DIR]
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

TARGET_S = 5.0
T0 = dt.datetime(2026, 10, 1, 3, 0, tzinfo=dt.timezone.utc)


def record(directory: Path) -> Path:
    """A real localhost sweep of tests/data/compare.yaml (2 cells x 6 repeats)."""
    out = directory / "compare-check"
    res = subprocess.run([sys.executable, "-m", "zcorch", "-q", "run", str(ROOT / "tests/data/compare.yaml"),
                          "-o", str(out)], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"recording failed: {res.stderr[-2000:]}")
    return out


def widen(records: list, plan: list, cells: int) -> "tuple[list, list]":
    """The set's runs and plan with its cells copied until there are `cells`: copy k of a cell gets buffer +k
    bytes, so a new id (zcorch.plan.cell_id) over the same real runs."""
    from zcorch.plan import cell_id

    ids = list(dict.fromkeys(r["id"] for r in plan))
    out_runs, out_plan = [], []
    for k in range((cells + len(ids) - 1) // len(ids)):
        for cell in ids[:cells - k * len(ids)]:
            for rec in (r for r in records if r["cell"] == cell):
                new = json.loads(json.dumps(rec))
                new["params"]["buffer"] += k
                new["cell"] = cell_id(new["params"])
                out_runs.append(new)
            for p in (p for p in plan if p["id"] == cell):
                new = json.loads(json.dumps(p))
                new["params"]["buffer"] += k
                new["id"] = cell_id(new["params"])
                out_plan.append(new)
    return out_runs, out_plan


def nights(source: Path, root: Path, n: int, cells: int, noise_pct: float, seed: int = 1) -> None:
    records = [json.loads(line) for line in (source / "runs.jsonl").read_text().splitlines() if line.strip()]
    plan = json.loads((source / "plan.json").read_text())
    records, plan = widen(records, plan, cells)
    rng = np.random.default_rng(seed)
    for i in range(n):
        night = T0 + dt.timedelta(days=i)
        dst = root / night.strftime("%Y%m%dT%H%MZ") / source.name
        shutil.copytree(source, dst, ignore=lambda d, names: [x for x in names if x in ("runs.parquet", "report.html",
                                                                                         "plots", "runs.cache")])
        factor = 1 + noise_pct / 100 * rng.standard_normal()
        lines = []
        for rec in records:
            rec = json.loads(json.dumps(rec))
            for side in ("sender", "receiver"):
                if rec.get(side) and rec[side].get("wall_ns"):
                    rec[side]["wall_ns"] = int(rec[side]["wall_ns"] * factor)
            lines.append(json.dumps(rec))
        (dst / "runs.jsonl").write_text("\n".join(lines) + "\n")
        (dst / "plan.json").write_text(json.dumps(plan))
        manifest = json.loads((dst / "manifest.json").read_text())
        manifest.update(created=night.isoformat(), finished=(night + dt.timedelta(minutes=5)).isoformat())
        (dst / "manifest.json").write_text(json.dumps(manifest))


def timed(argv: list) -> "tuple[float, int]":
    t = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True)
    return time.perf_counter() - t, res.returncode


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nights", type=int, default=30)
    ap.add_argument("--cells", type=int, default=10)
    ap.add_argument("--night-noise", type=float, default=2.0, help="night-to-night noise in %% (default 2)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--source", type=Path, help="a result set to copy (default: record tests/data/compare.yaml now)")
    ap.add_argument("--keep", type=Path, help="build the nights in this directory and keep them")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-gate-")) if args.keep is None else args.keep
    try:
        source = args.source or record(work / "source")
        gate = [sys.executable, "-m", "zcorch", "-q", "history", "--check"]
        peer = [sys.executable, "-c", "import pandas"]
        cold, warm, base, codes = [], [], [], set()
        for r in range(args.repeat):
            root = work / f"nightly-{r}"
            shutil.rmtree(root, ignore_errors=True)
            nights(source, root, args.nights, args.cells, args.night_noise, seed=r + 1)
            t, code = timed(gate + [str(root)])
            cold.append(t)
            codes.add(code)
            warm.append(timed(gate + [str(root)])[0])
            base.append(timed(peer)[0])
        peer_s = statistics.median(base)
        print(f"history --check over {args.nights} nights x {args.cells} cells ({args.repeat} runs each, interleaved; "
              f"exit codes seen {sorted(codes)})")
        for name, values in (("cold", cold), ("warm", warm)):
            med = statistics.median(values)
            print(f"  {name:5s} {med:6.2f} s median [{min(values):.2f}-{max(values):.2f}]  "
                  f"{med / TARGET_S:.2f}x the {TARGET_S:g} s target  {med / peer_s:5.1f}x the peer")
        print(f"  peer  {peer_s:6.2f} s median  (python -c 'import pandas')")
        return 0
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
