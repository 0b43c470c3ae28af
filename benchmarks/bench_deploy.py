"""What does a remote host cost per command, and how fast is an unchanged redeploy? (target: < 1 s)

Against a real two-host lab (network namespaces + sshd; root). Brings a temporary lab up (and down
afterwards) unless --lab NAME names one that is already up. Measured interleaved, --rounds times:

  ssh run      SSHHost.run(["true"])            one channel on the persistent connection
  ssh start    SSHHost.start(["true"]) + wait   the Process path the runner uses for workers
  local run    LocalHost.run(["true"])          the same interface, local subprocess
  subprocess   subprocess.run(["true"])         the peer: a bare local fork+exec
  redeploy     deploy(receiver) with nothing changed (hash lookup only)

Printed as medians with ratios against subprocess.run in the same run. The first (cold) deploy,
which uploads and compiles the worker on the host, is measured once and printed too.

    python benchmarks/bench_deploy.py [--rounds 30] [--lab NAME]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from zcorch.provision import deploy
from zcorch.lab import netns as lab
from zcorch.hosts import ssh  # noqa: E402
from zcorch.errors import LabError  # noqa: E402
from zcorch.hosts.local import LocalHost  # noqa: E402


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _bring_up() -> lab.LabLayout:
    for i in range(40):
        layout = lab.LabLayout(f"bench{os.getpid()}", 20 + (os.getpid() + 7 + i) % 230)
        if lab._index_owner(layout) is not None:
            continue
        try:
            lab.up(layout)
            return layout
        except LabError as exc:
            if "in use" not in str(exc) and "bridge" not in str(exc) and "already exists" not in str(exc):
                raise
    raise SystemExit("no free lab index")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--lab", help="name of a lab that is already up (default: a temporary one)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_deploy needs root (it runs the network-namespace lab)")
    own = args.lab is None
    layout = _bring_up() if own else lab.LabLayout(args.lab, lab._index_from_state(args.lab, None))
    try:
        spec = dataclasses.replace(layout.hosts().spec("receiver"),
                                   workdir=f"~/.cache/zcorch-bench-{uuid.uuid4().hex[:8]}")
        t0 = time.perf_counter()
        host = ssh.connect(spec, "receiver")
        connect_s = time.perf_counter() - t0
        local = LocalHost()
        cold = _timed(lambda: deploy.deploy(host))
        samples = {k: [] for k in ("ssh run", "ssh start", "local run", "subprocess", "redeploy")}
        checks = {"ssh run": lambda: host.run(["true"]).returncode,
                  "ssh start": lambda: host.start(["true"]).wait(30),
                  "local run": lambda: local.run(["true"]).returncode,
                  "subprocess": lambda: subprocess.run(["true"]).returncode,
                  "redeploy": lambda: 0 if deploy.deploy(host).reused else 1}
        for name, fn in checks.items():  # warm-up, and a check that each really works
            if fn() != 0:
                raise SystemExit(f"{name}: failed")
        for _ in range(args.rounds):
            for name, fn in checks.items():
                samples[name].append(_timed(fn))
        host.run(["rm", "-rf", host.expand(spec.workdir)])
        host.close()
    finally:
        if own:
            lab.down(layout)
    peer = statistics.median(samples["subprocess"])
    print(f"lab {layout.name} (index {layout.index}); {args.rounds} interleaved rounds; 2-core shared machine")
    print(f"{'connect (once)':<16}{connect_s * 1000:9.2f} ms")
    print(f"{'cold deploy':<16}{cold * 1000:9.1f} ms   (upload + remote cffi build, once)")
    for name, vals in samples.items():
        med = statistics.median(vals)
        print(f"{name:<16}{med * 1000:9.2f} ms   x{med / peer:6.1f} of subprocess.run(['true'])   "
              f"(min {min(vals) * 1000:.2f}, max {max(vals) * 1000:.2f})")
    redeploy = statistics.median(samples["redeploy"])
    print(f"unchanged redeploy median {redeploy * 1000:.1f} ms: {'under' if redeploy < 1 else 'OVER'} the 1 s target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
