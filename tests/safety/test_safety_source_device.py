"""A source that exists as a device node is not reported missing: the worker's real `layout` job refuses it
saying what it is (a character device, no device allowed there), and the sweep's message keeps that."""
from __future__ import annotations

import os
import subprocess
import sys

from zcorch.hosts.local import LocalHost
from zcorch.provision.sources import lay_out


def test_an_existing_device_source_is_named_for_what_it_is():
    assert os.path.exists("/dev/null")
    errors = lay_out(LocalHost(), [sys.executable, "-m", "zcorch.worker"], dict(os.environ), {"/dev/null": 4096},
                     lambda _: None)[1]
    why = errors["/dev/null"]
    assert "is missing" not in why and "not one of :" not in why and "not one of" not in why
    assert "/dev/null exists and is a character device" in why and "no device is allowed" in why


def test_the_worker_says_what_the_path_is():
    p = subprocess.run([sys.executable, "-m", "zcorch.worker", "layout", "--path", "/dev/null", "--bytes", "4096"],
                       capture_output=True, text=True)
    assert p.returncode != 0 and "exists and is a character device" in p.stdout
