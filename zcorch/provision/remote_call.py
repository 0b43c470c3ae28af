"""How the controller runs actions of the host-side modules (MODULES) with a host's own python: remote hosts
get the module's text on stdin (nothing deployed, nothing left behind), localhost runs the controller's
package. Arguments are argv items: nothing reaches a shell.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import zcorch
from zcorch.config.hosts import DEFAULT_PYTHON
from zcorch.hosts.interpreter import python_argv
from zcorch.hosts.local import CommandResult, Host
from zcorch.worker import netcfg, remote, watchdog

# Localhost imports the module from the package this controller runs (what PYTHONPATH must name).
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(zcorch.__file__)))
MODULE = "zcorch.worker.remote"
# The host-side modules (stdlib-only, one file each).
MODULES = {MODULE: remote, "zcorch.worker.netcfg": netcfg, "zcorch.worker.watchdog": watchdog}

_sources: Dict[str, str] = {}


def host_python(host: Host) -> str:
    """The interpreter that runs our code on `host`: the spec's `python` (default python3); locally this one."""
    if host.is_local:
        return sys.executable
    return host.spec.python if host.spec else DEFAULT_PYTHON


def local_safe_path(python: str) -> bool:
    """Whether `python` (on this machine) takes -P: it is this interpreter and that is 3.11+."""
    return python == sys.executable and sys.version_info >= (3, 11)


def module_source(module: str = MODULE) -> str:
    """The text of a module of MODULES, as a host's interpreter is fed it (read once)."""
    if module not in _sources:
        _sources[module] = Path(MODULES[module].__file__).read_text(encoding="utf-8")
    return _sources[module]


@dataclass(frozen=True)
class RemoteCommand:
    """One action as a command for Host.run: argv, extra environment, text for stdin."""

    argv: List[str]
    env: Optional[Dict[str, str]] = None
    input: Optional[str] = None
    module: str = MODULE

    def display(self) -> str:
        """The command for logs and --dry-run (the module fed on stdin is named, not copied)."""
        return shlex.join(self.argv) + (f" < {self.module.replace('.', '/')}.py" if self.input is not None else "")


def remote_command(host: Host, action: str, *args: object, python: Optional[str] = None,
                   module: str = MODULE) -> RemoteCommand:
    """The command that runs `MODULE ACTION ARGS...` (a module of MODULES, default zcorch.worker.remote) on
    `host` with `python` (default: the host's)."""
    python = python or host_python(host)
    tail = [action, *[str(a) for a in args]]
    if host.is_local:
        return RemoteCommand([*python_argv(python, module, safe_path=local_safe_path(python)), *tail],
                             env={"PYTHONPATH": PACKAGE_PARENT}, module=module)
    # The host's python version is not known before the preflight (which runs this way): the bootstrap.
    return RemoteCommand([*python_argv(python, None), *tail], input=module_source(module), module=module)


def run_remote(host: Host, action: str, *args: object, timeout: float = 60.0,
               python: Optional[str] = None, module: str = MODULE) -> CommandResult:
    """Run one action on `host` to completion. Exit 127 means the interpreter was not found there."""
    cmd = remote_command(host, action, *args, python=python, module=module)
    return host.run(cmd.argv, timeout=timeout, env=cmd.env, input=cmd.input)


def remote_json(result: CommandResult) -> Optional[dict]:
    """The JSON object an action printed (its last stdout line), None if there is none."""
    try:
        doc = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    return doc if isinstance(doc, dict) else None
