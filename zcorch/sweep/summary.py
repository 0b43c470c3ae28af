"""The end-of-run summary of a sweep: one row per cell (varying parameters, medians), then the baselines."""
from __future__ import annotations

import statistics
from typing import Dict, List, Sequence

from zcorch.config.experiment import format_value
from zcorch.results import rates
from zcorch.results.convergence import CellState, cell_states
from zcorch.results.store import latest_runs
from zcorch.sweep.baselines import describe_result
from zcorch.textfmt import text_table


def _host_cpu(m: dict):
    busy = rates.host_busy_us(m)
    return rates.per_gib(busy / 1e6, m["bytes"]) if busy is not None and m.get("bytes") else None


def converged_text(state: CellState) -> str:
    """`yes (±1.2%)`, `no (±3.4%)`, or `no (n<6)` while there is no 95% interval of the median."""
    width = f"±{state.width_pct:.1f}%" if state.width_pct != float("inf") else "n<6"
    return f"{'yes' if state.converged else 'no'} ({width})"


def summary_rows(plan_runs: List[dict], records: List[dict], repeat_policy=None) -> List[dict]:
    """Per cell of the plan, in plan order (the end-of-run table and `zcorch run --json`'s summary event): its
    ok and failed runs, the medians of its ok runs' Gbit/s and CPU s/GiB per side (`proc`: rusage; `host`: the
    machine's busy CPU), their zero-copy verdict and, with a repeat_policy, its `convergence`; None: unmeasured."""
    latest = latest_runs(records)
    states = cell_states(plan_runs, latest, repeat_policy) if repeat_policy is not None else {}
    by_cell: Dict[str, List[dict]] = {}
    for run in plan_runs:
        by_cell.setdefault(run["id"], []).append(run)
    rows = []
    for cell, runs in by_cell.items():
        recs = [latest.get((cell, r["repeat"])) for r in runs]
        ok = [r for r in recs if r and r["status"] == "ok" and (r.get("receiver") or {}).get("wall_ns")]
        gbit = [rates.gbit_s(r["receiver"]["bytes"], r["receiver"]["wall_ns"]) for r in ok]
        proc, host = [], []
        for side in ("sender", "receiver"):
            metrics = [r.get(side) or {} for r in ok]
            proc.append([rates.cpu_s_per_gib(m["utime_us"], m["stime_us"], m["bytes"]) for m in metrics
                         if m.get("bytes")])
            host.append([v for v in map(_host_cpu, metrics) if v is not None])
        completions = [m.get("zc_completions") for r in ok for m in (r["sender"], r["receiver"])
                       if m.get("zc_completions") is not None]
        copied = sum(m.get("zc_copied") or 0 for r in ok for m in (r["sender"], r["receiver"])
                     if m.get("zc_completions") is not None)
        mapped = [r["receiver"]["zc_recv_mapped"] for r in ok if r["receiver"].get("zc_recv_mapped") is not None]
        verdict = rates.zc_label(sum(completions) if completions else None, copied,
                                 sum(mapped) if mapped else None,
                                 sum(r["receiver"].get("zc_recv_copied") or 0 for r in ok))
        rows.append({"cell": cell, "params": runs[0]["params"], "planned": len(runs), "ok": len(ok),
                     "failed": sum(1 for r in recs if r and r["status"] != "ok"),
                     "gbit_s": _med(gbit), "send_cpu_s_per_gib": _med(proc[0]), "recv_cpu_s_per_gib": _med(proc[1]),
                     "send_host_busy_s_per_gib": _med(host[0]), "recv_host_busy_s_per_gib": _med(host[1]),
                     "zero_copy": verdict, "same_host": any(r.get("same_host") for r in ok),
                     "cpu_resolution": rates.cell_cpu_resolution([rates.run_cpu_resolution(r["sender"], r["receiver"])
                                                                  for r in ok]),
                     **({"convergence": states[cell].as_record()} if states else {})})
    return rows


def _med(values: List[float]):
    return statistics.median(values) if values else None


def summary_table(plan_runs: List[dict], records: List[dict], varying: Sequence[str] = ("send_mode", "recv_mode"),
                  baselines: Sequence[dict] = (), linked: Sequence = (), repeat_policy=None) -> str:
    """The end-of-run table: per cell its linked axes' labels, varying parameters and summary_rows' figures
    (with a repeat_policy whether it converged); then a legend and one line per baseline."""
    rows = []
    same_host = False
    states = {}
    for r in summary_rows(plan_runs, records, repeat_policy):
        params = r["params"]
        same_host = same_host or r["same_host"]
        rows.append([r["cell"], *(a.label_of(params) for a in linked), *(format_value(k, params.get(k)) for k in varying),
                     *("-" if r[k] is None else f"{r[k]:.2f}"
                       for k in ("gbit_s", "send_cpu_s_per_gib", "recv_cpu_s_per_gib", "send_host_busy_s_per_gib",
                                 "recv_host_busy_s_per_gib")),
                     f"{r['ok']}/{r['failed']}", r["zero_copy"], r["cpu_resolution"]])
        if repeat_policy is not None:
            st = r["convergence"]
            states[r["cell"]] = CellState(st["n"], st["width_pct"] if st["width_pct"] is not None else float("inf"),
                                          st["converged"])
            rows[-1].append(converged_text(states[r["cell"]]))
    head = ["cell", *(a.key for a in linked), *varying, "Gbit/s", "send proc-CPU", "recv proc-CPU", "send host-CPU", "recv host-CPU",
            "ok/failed", "zero-copy", "host-CPU resolution", *(["converged"] if states else [])]
    lines = text_table(head, rows)
    lines.append("CPU in seconds per GiB moved: proc = the worker process's own CPU (rusage); host = the whole "
                 "machine's busy CPU over the transfer (/proc/stat, softirq and interrupts included); every number "
                 "is the median of the cell's ok runs, with no interval")
    lines.append(f"host-CPU resolution: `too short` = a window under {rates.MIN_TICKS} /proc/stat ticks (the host-CPU "
                 "columns move in steps of a tick per CPU), `busy > capacity` = more busy CPU than CPUs × window, "
                 "beyond the tick error (2 ticks per CPU)")
    if states:
        p = repeat_policy
        lines.append(f"repeats until the 95% interval of the median throughput is within ±{p.target_ci:g}% "
                     f"(min {p.min}, max {p.max}; a 95% interval needs 6 ok runs): converged = yes (±width "
                     f"reached); {sum(not st.converged for st in states.values())} of {len(states)} cells "
                     "did not converge")
    if same_host:
        lines.append("sender and receiver share one kernel: their host-CPU columns are one machine's, count it once")
    for b in baselines:
        lines.append(("control " if b.get("control") else "baseline ") + describe_result(b)
                     + (f" (round {b.get('repeat')})" if b.get("control") else ""))
    return "\n".join(lines)
