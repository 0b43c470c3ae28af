"""`zcorch lab up|down|status|inventory`: two real SSH hosts on one machine, in network namespaces (root).

The lab is zcorch.lab.netns (layout, up, down, status); this module is its command line. `up` prints the
`hosts:` block of an experiment file, `inventory` the same hosts as an inventory file (one pair named after
the lab) for `zcorch run EXP --hosts FILE`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from zcorch.errors import LabError
from zcorch.lab import netns as lab
from zcorch.cli import add_command


def register(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    p = add_command(subparsers, "lab", __doc__)
    p.add_argument("action", choices=["up", "down", "status", "inventory"])
    p.add_argument("--name", default="default", help="lab name (state in /var/lib/zcorch-lab/NAME)")
    p.add_argument("--index", type=int, default=None,
                   help="0-255: addresses 10.77.N.x / 10.78.N.x (default: the one `up` recorded, else 0)")
    p.add_argument("--keep-keys", action="store_true", help="down: keep keys and known_hosts")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    layout = lab.LabLayout(args.name, lab._index_from_state(args.name, args.index))
    if args.action == "up":
        st = lab.up(layout)
        if args.json:
            print(json.dumps({"status": st, "hosts": layout.hosts_spec()}))
        else:
            print(f"# lab {layout.name!r} is up (index {layout.index}); paste into the experiment file, or "
                  f"`zcorch lab inventory --name {layout.name} > lab.yaml` and `zcorch run FILE --hosts lab.yaml`:")
            print(layout.hosts_yaml(), end="")
        return 0
    if args.action == "inventory":
        if not os.path.exists(layout.info_file):
            raise LabError(f"lab {layout.name!r} is not up (no {layout.info_file}): `zcorch lab up --name "
                           f"{layout.name}` (root) first")
        if args.json:
            print(json.dumps(layout.inventory_spec()))
        else:
            print(f"# zcorch lab {layout.name!r} (index {layout.index}): save as a file, then "
                  f"`zcorch run FILE --hosts THAT_FILE[:{layout.name}]`")
            print(layout.inventory_yaml(), end="")
        return 0
    if args.action == "down":
        removed = lab.down(layout, keep_keys=args.keep_keys)
        if args.json:
            print(json.dumps(removed))
        else:
            for line in removed["filesystems"]:
                print(f"undid a killed sweep's filesystem state on {line}")
            print(f"lab {layout.name!r} down: {len(removed['netns'])} namespaces, {len(removed['links'])} links, "
                  f"{len(removed['processes'])} processes, {len(removed['mounts'])} mounts removed; "
                  f"state {removed['state'] or 'absent'}")
        for err in removed["filesystem_errors"]:
            print(f"zcorch lab down: warning: {err}", file=sys.stderr)
        return 0 if not removed["filesystem_errors"] else 1
    lab._require_root()
    st = lab.status(layout)
    if args.json:
        print(json.dumps(st))
    else:
        print(f"lab {layout.name!r} index {layout.index}: {'up' if st['up'] else 'not up'} "
              f"(state {layout.state_dir}{'' if st['state_exists'] else ' absent'}; links: "
              f"{' '.join(st['links']) or '-'})")
        for h, v in st["hosts"].items():
            print(f"  {h:<9} netns {v['netns']} {'present' if v['netns_exists'] else 'absent'}; "
                  f"mgmt {v['mgmt_address']} data {v['data_address']}; sshd pid {v['sshd_pid'] or '-'}; "
                  f"ssh {'answers' if v['ssh_banner'] else 'unreachable'}; {len(v['pids'])} processes")
    return 0 if st["up"] else 3
