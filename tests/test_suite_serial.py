"""Which tests scripts/test runs alone, in its serial pass (tests/conftest.py derives the `serial` marker): read
from a real collection of four modules whose tests sit on each side of the rules."""
from __future__ import annotations

import pytest

import os
import subprocess
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))
MODULES = ("safety/test_safety_lease.py", "safety/test_safety_watchdog.py", "safety/test_safety_fleet_locks.py",
           "test_study_pairing.py")


@pytest.mark.slow
def test_the_serial_pass_holds_shared_leases_and_machine_state_not_every_root_sweep():
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
                        "--serial-tests=only", *(os.path.join(TESTS, m) for m in MODULES)],
                       capture_output=True, text=True, timeout=300, cwd=os.path.dirname(TESTS))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    serial = sorted(line.split("[")[0] for line in p.stdout.splitlines() if "::" in line)
    assert serial == [
        # a fleet judging whom it waited for on the machine-wide lock (marked)
        "tests/safety/test_safety_fleet_locks.py::"
        "test_two_fleets_at_once_on_the_same_host_never_overlap_and_say_whom_they_wait_for",
        # compares the loop devices and mounts of the machine (not its deadlines: `deadlines`)
        "tests/safety/test_safety_watchdog.py::"
        "test_a_sigkilled_controller_with_a_loop_filesystem_mounted_is_undone_by_the_receiver",
        # a localhost sweep of a shipped study with `filesystems:` (named through a module constant)
        "tests/test_study_pairing.py::test_ext4_study_s_dd_claims_rest_on_repeated_dd_of_each_filesystem",
    ], p.stdout
    # not serial: the lease tests' localhost sweeps change the network of a namespace of their own; the Schutt
    # study's `networks:` goes unused (network=null)
