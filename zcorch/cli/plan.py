"""`zcorch plan FILE [--json]`: validate an experiment file and show what `zcorch run` would do.

`--hosts` and `--set` change the experiment as they do for `zcorch run`. Without --json: the cells (the varying
parameters as columns), the fixed parameters, counts, dropped cells, warnings and an estimated duration. With
--json: the runs `[{"id", "repeat", "params"}, ...]` in execution order (warnings to stderr); with adaptive
`repeats:` the runs a converged cell may skip have `"optional": true`.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import asdict
from typing import Optional

from zcorch.cli.options import add_hosts_and_set, hosts_from_args
from zcorch.errors import ConfigError
from zcorch.plan import (DEFAULT_OVERHEAD, DEFAULT_RATE, MIN_RUNS_95, Plan, Timings, control_record, hms,
                         describe_cell, estimate, load_plan, runs_json)
from zcorch.params import PARAM_KEYS, format_value
from zcorch.textfmt import text_table
from zcorch.units import format_size, parse_duration, parse_size
from zcorch.cli import add_command


_LISTED = 3  # dropped cells listed per reason without --all


def register(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    p = add_command(subparsers, "plan", __doc__)
    p.add_argument("file", metavar="FILE", help="experiment file (YAML), e.g. experiments/quickstart.yaml")
    p.add_argument("--json", action="store_true", help="print the runs as JSON (execution order)")
    p.add_argument("--all", action="store_true", help="list every dropped cell (default: a few per reason)")
    p.add_argument("--rate", default=format_size(DEFAULT_RATE),
                   help="assumed transfer rate per second for the estimate (a size, default %(default)s)")
    p.add_argument("--overhead", default=f"{DEFAULT_OVERHEAD:g}s",
                   help="assumed overhead per run and per baseline test (a duration, default %(default)s)")
    p.add_argument("--timings", metavar="DIR",
                   help="estimate from what an earlier result set took (its rate, time between runs, "
                        "filesystems and networks set up, start and end) instead of --rate/--overhead")
    add_hosts_and_set(p)
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    try:
        rate = parse_size(args.rate)
        overhead = parse_duration(args.overhead)
    except ValueError as exc:
        raise ConfigError(f"--rate/--overhead: {exc}") from None
    if rate <= 0:
        raise ConfigError("--rate must be > 0")
    from zcorch.config.inventory import is_fleet_spec

    timings = None
    if args.timings:
        from zcorch.results.timings import learn

        timings = learn(args.timings)
    if args.hosts is not None and is_fleet_spec(args.hosts):
        return _fleet(args, rate, overhead, timings)
    plan = load_plan(args.file, args.overrides, hosts_from_args(args), unknown_hosts=True)
    if args.json:
        for w in plan.warnings:
            print(f"warning: {w}", file=sys.stderr)
        print(json.dumps(runs_json(plan), separators=(",", ":")))
        return 0
    sys.stdout.write(render(plan, rate, overhead, args.all, timings))
    return 0


def _fleet(args: argparse.Namespace, rate: float, overhead: float, timings: "Optional[Timings]" = None) -> int:
    """`zcorch plan FILE --hosts INV:PAIR1,PAIR2|INV:all`: each pair's plan and the fleet's estimate."""
    from zcorch.sweep.fleet import plan_fleet   # the fleet's exclusion rules: only when a fleet is planned

    fleet = plan_fleet(args.file, args.hosts, args.overrides)
    if args.json:
        for pair, plan in fleet.pairs:
            for w in plan.warnings:
                print(f"warning: pair {pair.pair}: {w}", file=sys.stderr)
        print(json.dumps({pair.pair: runs_json(plan) for pair, plan in fleet.pairs}, separators=(",", ":")))
        return 0
    seconds = {}
    for pair, plan in fleet.pairs:
        sys.stdout.write(f"== pair {pair.pair}\n" + render(plan, rate, overhead, args.all, timings) + "\n")
        seconds[pair.pair] = estimate(plan, rate, overhead, timings).total_s
    total, group = fleet.estimate_s(seconds)
    turns = [g for g in fleet.groups if len(g) > 1]
    print(f"fleet of {len(fleet.pairs)} pair(s): " + (
        "; ".join(f"{', '.join(g)} share a host or a share and take turns run by run" for g in turns)
        if turns else "no two share a host or a share: all run at once"))
    print(f"fleet estimated duration {hms(total)}: the pairs that take turns add up, the rest run at the same "
          f"time ({', '.join(group)} set{'s' if len(group) == 1 else ''} it); each pair's estimate above")
    return 0


def render(plan: Plan, rate: float = DEFAULT_RATE, overhead: float = DEFAULT_OVERHEAD, show_all: bool = False,
           timings: "Optional[Timings]" = None) -> str:
    """The human-readable plan (what `zcorch plan FILE` prints)."""
    exp = plan.experiment
    lines = [f"{exp.name} ({exp.path})"]
    if exp.description:
        lines.extend("  " + line for line in exp.description.strip().splitlines())
    if exp.hosts_unknown:
        lines.append("hosts: unknown until run: `hosts: inventory` (zcorch run FILE --hosts INVENTORY[:PAIR]); "
                     "cells a host cannot run are found by the run's preflight")
    else:
        lines.append(f"hosts: {exp.hosts.describe()}" + (f" ({exp.inventory.describe()})" if exp.inventory else ""))
    lines.extend(f"--set {text}" for text in exp.overrides)
    lines.append("")

    varying = plan.varying or ["send_mode", "recv_mode"]
    linked = plan.linked  # linked axes: their label first, then the parameters they set
    header = ["#", "id", *(a.key for a in linked), *varying, "from"]
    rows = [[str(i + 1), c.id, *(a.label_of(c.params) for a in linked), *(format_value(k, c.params[k]) for k in varying),
             c.origin] for i, c in enumerate(plan.cells)]
    lines.extend(text_table(header, rows))
    fixed = [k for k in PARAM_KEYS if k not in varying]
    if plan.cells:
        first = plan.cells[0].params
        lines += ["", "same in every cell: " + ", ".join(f"{k}={format_value(k, first[k])}" for k in fixed)]

    n_cells, n_runs = len(plan.cells), len(plan.runs)
    order = exp.order + (f" (seed {exp.seed})" if exp.order == "shuffle" else "")
    policy = exp.repeat_policy
    if policy is None:
        lines.append(f"{n_cells} cell{'s' if n_cells != 1 else ''} x {exp.repeats} repeat"
                     f"{'s' if exp.repeats != 1 else ''} = {n_runs} runs, order {order}")
    else:
        fewest = plan.fewest_repeats()
        counts = (f"{fewest}..{policy.max} repeats = {n_cells * fewest}..{n_runs} runs" if fewest < policy.max
                  else f"{policy.max} repeats = {n_runs} runs")
        lines.append(f"{n_cells} cell{'s' if n_cells != 1 else ''} x {counts}, order {order}")
        lines.append(f"repeats until stable: each cell until the 95% interval of its median throughput is within "
                     f"±{policy.target_ci:g}% of the median, at least {policy.min} and at most {policy.max} times"
                     + (f" (a 95% interval needs {MIN_RUNS_95} ok runs: no cell stops before {fewest})"
                        if policy.min < MIN_RUNS_95 <= policy.max else "")
                     + "; cells that reach max unconverged are marked converged: false")
    if plan.control is not None:
        c = plan.control
        lines.append(f"control: [{c.id}] {describe_cell(exp, c.params, c.origin)}: every run is also divided by the "
                     "control's run of the same repeat (gbit_s_vs_control, ...)")
    elif isinstance(exp.control, str):
        lines.append(f"control: {control_record(plan)['label']}, once in every round before its runs: every run's "
                     f"gbit_s is also divided by that round's {exp.control} rate (gbit_s_vs_control)")
    lines.append("baselines: " + "; ".join(
        f"{kind} " + (", ".join(f"{k}={_baseline_value(k, v)}" for k, v in asdict(conf).items()) if conf else "off")
        for kind, conf in exp.baselines.kinds()))
    for cmd in exp.baselines.commands:  # argv as written: the placeholders are filled on the hosts
        lines.append(f"baseline command {cmd.name} (x{cmd.repeats}): receiver `{shlex.join(cmd.receiver)}`"
                     f"{' > {sink}' if cmd.stdout == 'sink' else ''}; sender `{shlex.join(cmd.sender)}`"
                     f"{' < {source}' if cmd.stdin == 'source' else ''}")
    if exp.reference is not None:
        src = exp.reference.source
        cite = ", ".join(x for x in (src.author, f"\"{src.title}\"", src.date) if x)
        lines.append(f"reference: {cite}: {len(exp.reference.figures)} published figures, "
                     f"{len(exp.reference.claims)} claims (the report checks them)")
    if plan.dropped:
        by_reason: "dict[str, list]" = {}
        for d in plan.dropped:
            by_reason.setdefault(d.reason, []).append(d)
        lines.append(f"dropped {len(plan.dropped)} cell{'s' if len(plan.dropped) != 1 else ''}:")
        for reason, dropped in by_reason.items():
            lines.append(f"  {reason}: {len(dropped)}")
            shown = dropped if show_all else dropped[:_LISTED]
            lines.extend(f"    [{d.id}] {describe_cell(exp, d.params, d.origin)}" for d in shown)
            if len(shown) < len(dropped):
                lines.append(f"    ... and {len(dropped) - len(shown)} more (--all lists every one)")
    for w in plan.warnings:
        lines.append(f"warning: {w}")
    lines.append(estimate(plan, rate, overhead, timings).explain())
    return "\n".join(lines) + "\n"


def _baseline_value(key: str, value) -> str:
    if key == "bs":
        return format_size(value)
    if key == "duration":
        return f"{value:g}s"
    return str(value)

