"""Host metadata stored with every result set (meta.json): what shaped the numbers.

One command per host, `zcorch.worker.remote metadata DATA_ADDRESS PATH SYSCTL...`; a warm sweep folds it, and
the cached calibration, into the deploy's `worker info` (metadata_args, cache_args).
"""
from __future__ import annotations

import os
import platform
import posixpath
import socket
import subprocess
import sys
from typing import Any, Dict, List, Optional, Sequence

from zcorch._version import __version__
from zcorch.errors import HostError
from zcorch.config.baselines.registry import KINDS
from zcorch.hosts.local import Host
from zcorch.provision.remote_call import remote_json, run_remote
from zcorch.sweep import json_object

SYSCTLS = [
    "net.core.rmem_max", "net.core.wmem_max", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
    "net.ipv4.tcp_congestion_control", "fs.pipe-max-size", "net.core.optmem_max",
]


def metadata_args(host: Host, data_address: Optional[str] = None, path: str = "") -> List[str]:
    """The arguments of the `metadata` action (and of `worker info --metadata`) for `host`: its data address,
    the sink `path`, SYSCTLS and every registered baseline kind's tools (whose versions are recorded)."""
    programs = dict.fromkeys(t.program for k in KINDS for t in k.tools(k.default()))
    return [data_address or host.data_address, path, *SYSCTLS, *[a for p in programs for a in ("--tool", p)]]


def cache_args(host: Host, max_age: float) -> List[str]:
    """`--cache <workdir>/calibration.json --max-age D` of `worker calibrate` and `worker info` on `host`."""
    from zcorch.provision.deploy import host_workdir
    from zcorch.worker.calcache import FILENAME

    return ["--cache", posixpath.join(host_workdir(host), FILENAME), "--max-age", f"{max_age:g}s"]


def collect_host(host: Host, python: str, data_address: Optional[str] = None, path: str = "") -> Dict[str, Any]:
    """Metadata of one host (one command). Raises HostError naming the host if the probe fails."""
    res = run_remote(host, "metadata", *metadata_args(host, data_address, path), python=python)
    if not res.ok:
        raise HostError(f"{host.name}: metadata probe failed (exit {res.returncode}): {res.stderr.strip()[-300:]}")
    meta = remote_json(res)
    if meta is None:
        raise HostError(f"{host.name}: metadata probe printed no JSON: {res.stdout[:200]!r}")
    return meta


def calibrate_host(host: Host, worker: List[str], env: Optional[Dict[str, str]] = None,
                   args: Sequence[str] = ()) -> Dict[str, Any]:
    """The copy-cost yardsticks of one host: the deployed worker's `calibrate ARGS` event minus "event";
    {"error": why} when it failed (the sweep goes on without the yardstick)."""
    try:
        res = host.run([*worker, "calibrate", *args], timeout=120.0, env=env)
    except HostError as exc:
        return {"error": f"{host.name}: calibration failed: {exc}"}
    events = [e for e in map(json_object, res.stdout.splitlines()) if e is not None]
    for event in events:
        if event.get("event") == "calibration":
            return {k: v for k, v in event.items() if k != "event"}
    said = next((e.get("message") for e in events if e.get("event") == "error"), None)
    return {"error": f"{host.name}: calibration failed (exit {res.returncode}): "
                     f"{said or res.stderr.strip()[-300:] or 'no output'}"}


def same_host(meta: Dict[str, Any]) -> Optional[bool]:
    """Whether meta.json's sender and receiver share one kernel (equal boot ids); None when one is unknown."""
    hosts = meta.get("hosts") or {}
    ids = [(hosts.get(role) or {}).get("boot_id") for role in ("sender", "receiver")]
    return ids[0] == ids[1] if all(isinstance(i, str) and i for i in ids) else None


# directory -> its revision, computed once for the processes a fleet forks (remember_controller)
_remembered_revisions: Dict[str, Optional[str]] = {}


def git_revision(directory: Optional[str] = None) -> Optional[str]:
    """Revision of the controller checkout (with '-dirty' if modified), or None when `directory` (default: the
    zcorch package's parent) is not the top of a git work tree (a wheel in a venv inside another repository)."""
    directory = directory or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if directory in _remembered_revisions:
        return _remembered_revisions[directory]
    try:
        rev = subprocess.run(["git", "-C", directory, "rev-parse", "--show-toplevel", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        lines = rev.stdout.split("\n")
        if rev.returncode != 0 or len(lines) < 2 or not os.path.samefile(lines[0], directory):
            return None
        dirty = subprocess.run(["git", "-C", directory, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
        return lines[1].strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


def remember_controller() -> None:
    """Find what controller_meta() says of this machine and checkout now, once, for this process and those it
    forks next (a fleet's pairs); platform keeps its own answers, the revision is kept here."""
    directory = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    _remembered_revisions[directory] = git_revision(directory)
    platform.platform()


def controller_meta() -> Dict[str, Any]:
    return {"hostname": socket.gethostname(), "zcorch_version": __version__, "git_revision": git_revision(),
            "python": platform.python_version(), "python_executable": sys.executable,
            "platform": platform.platform()}
