"""How long arming the network watchdogs of a sweep's two hosts takes: one after the other (as before) against
both at once (zcorch.provision.network.NetworkManager._arm_watchdogs, through zcorch.hosts.parallel.per_host),
with one host's arming alone as the peer measured in the same run. Interleaved, `--rounds` times each; every
armed watchdog is confirmed (it exits touching nothing) before the next round. Needs root: the two-host lab is
brought up for the benchmark (tests/fixtures_lab.start_lab) and torn down after.

    python benchmarks/bench_watchdog_arm.py [--rounds N]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from zcorch.hosts.parallel import per_host  # noqa: E402
from zcorch.provision.remote_call import host_python  # noqa: E402
from zcorch.provision.watchdog import Watchdog  # noqa: E402

OWNER = {"host": "bench", "pid": os.getpid(), "token": "bench"}


def arm(items, parallel: bool) -> float:
    t0 = time.monotonic()
    dogs = per_host(items, lambda it: Watchdog.arm(it[0], it[1], "net", it[2], OWNER), parallel=parallel)
    took = time.monotonic() - t0
    for dog in dogs:
        dog.confirm()
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_watchdog_arm: needs root (the two-host lab)")
        return 2
    sys.path.insert(0, os.path.join(REPO, "tests"))
    from fixtures_lab import start_lab
    from zcorch.config.hosts import net_state_dir
    from zcorch.lab import netns as lab

    layout = start_lab(f"barm{os.getpid()}")
    hosts = []
    try:
        from zcorch.hosts import ssh

        spec = layout.hosts()
        hosts = [ssh.connect(spec.spec(role), role) for role in ("sender", "receiver")]
        items = [(h, host_python(h), net_state_dir(spec.workdir(role))) for h, role in zip(hosts, ("sender", "receiver"))]
        arm(items, True)   # untimed: the connections' first channels, the hosts' page cache
        one, serial, both = [], [], []
        for _ in range(args.rounds):
            one.append(arm(items[:1], False))
            serial.append(arm(items, False))
            both.append(arm(items, True))
    finally:
        for h in hosts:
            h.close()
        lab.down(layout)
    m1, ms, mb = (statistics.median(v) for v in (one, serial, both))
    print(f"peer: one host's watchdog armed alone, median {m1 * 1000:.0f} ms ({', '.join(f'{x * 1000:.0f}' for x in one)})")
    print(f"one after the other (before): median {ms * 1000:.0f} ms ({', '.join(f'{x * 1000:.0f}' for x in serial)}); "
          f"{ms / m1:.2f}x the peer")
    print(f"both at once (now): median {mb * 1000:.0f} ms ({', '.join(f'{x * 1000:.0f}' for x in both)}); "
          f"{mb / m1:.2f}x the peer; now/before {mb / ms:.2f}")
    pairs = sorted(s / b for s, b in zip(serial, both))
    print(f"before/now, median of the rounds' own ratios: {statistics.median(pairs):.2f} "
          f"(rounds {pairs[0]:.2f}-{pairs[-1]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
