"""The end-of-run summary of a sweep: one row per cell (varying parameters, medians), then the baselines."""
from __future__ import annotations

import statistics
from typing import Dict, List, Sequence

from zcorch.config.experiment import format_value
from zcorch.results import rates
from zcorch.results.store import latest_runs
from zcorch.sweep.baselines import describe_result
from zcorch.textfmt import text_table


def _median(values: List[float]) -> str:
    return f"{statistics.median(values):.2f}" if values else "-"


def summary_table(plan_runs: List[dict], records: List[dict], varying: Sequence[str] = ("send_mode", "recv_mode"),
                  baselines: Sequence[dict] = ()) -> str:
    """The end-of-run table: per cell its varying parameters, median throughput (as the receiver saw
    it), median CPU seconds per GiB on each side, ok/failed; then one line per baseline."""
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
        lines.append("baseline " + describe_result(b))
    return "\n".join(lines)
