"""Source files a sweep needs on the sender: lay out the missing ones before the first cell (as fio does).

A missing source file is created once, untimed, at the largest `bytes` of its cells, with the mem pattern.
An existing file is never touched, except a `{scratch}/FILE` an earlier smaller sweep laid out (`grow`).
Laid-out files are kept, and listed in meta.json's "sources_laid_out".
"""
from __future__ import annotations

import json
import shlex
from typing import Callable, Container, Dict, Iterable, List, Sequence, Tuple

from zcorch.hosts.local import Host
from zcorch.config.checks import SCRATCH_PLACEHOLDER
from zcorch.units import format_size

_NOT_FILES = ("/dev/", "/proc/", "/sys/")
# Generous: a slow disk writes >= 20 MB/s; the fixed part covers the worker's start-up over SSH.
_LAYOUT_RATE = 20e6
_LAYOUT_FIXED_S = 60.0


def is_file_source(source: object) -> bool:
    """True for a source that names a regular file the sweep may have to lay out (`{scratch}/FILE` too)."""
    return isinstance(source, str) and (source.startswith("/") and not source.startswith(_NOT_FILES)
                                        or source.startswith(SCRATCH_PLACEHOLDER + "/"))


def needed_sources(params_list: Iterable[dict]) -> Dict[str, int]:
    """{path: largest `bytes` of the cells reading it}, in first-use order. Pure."""
    needs: Dict[str, int] = {}
    for p in params_list:
        src = p.get("source")
        if is_file_source(src) and p.get("bytes"):
            needs[src] = max(needs.get(src, 0), int(p["bytes"]))
    return needs


def lay_out(host: Host, worker: Sequence[str], env: Dict[str, str], needs: Dict[str, int],
            log: Callable[[str], None], grow: Container[str] = ()) -> Tuple[List[dict], Dict[str, str]]:
    """Create each missing file of `needs` on `host` (and grow the short laid-out ones among `grow`: the
    scratch directory's). Returns (what was laid out, {path: why not})."""
    laid: List[dict] = []
    errors: Dict[str, str] = {}
    for path, size in needs.items():
        argv = [*worker, "layout", "--path", path, "--bytes", str(size), *(["--grow"] if path in grow else [])]
        r = host.run(argv, env=env, timeout=_LAYOUT_FIXED_S + size / _LAYOUT_RATE)
        event = _last_event(r.stdout)
        if not r.ok or event.get("event") != "layout":
            why = event.get("message") or (r.stderr or r.stdout).strip()[-500:] or f"exit {r.returncode}"
            if " exists and is " in why:   # a device node, a directory...: the worker says what it is
                errors[path] = f"source {path} on {host.name} is no regular file zcorch may read or lay out: {why}"
            else:
                errors[path] = f"source {path} is missing on {host.name} and could not be laid out: {why}"
            log(f"cannot lay out {path} on {host.name}: {why} ({shlex.join(argv)})")
            continue
        if event.get("created"):
            laid.append({"host": host.name, "path": path, "size": size,
                         **({"grown_from": event["grown_from"]} if "grown_from" in event else {})})
            why = (f"it held {format_size(event['grown_from'])} of it, laid out by an earlier sweep"
                   if "grown_from" in event else "it did not exist")
            log(f"laid out {path} on {host.name}: {format_size(size)} of the mem pattern ({why}; "
                "untimed; kept after the sweep)")
    return laid, errors


def _last_event(stdout: str) -> dict:
    for line in reversed(stdout.strip().splitlines()):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            return event
    return {}
