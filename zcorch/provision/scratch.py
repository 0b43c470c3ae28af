"""`{scratch}`: a per-user scratch directory (`<workdir>/scratch`, 0700) on the host that uses a path, so no
two users share a file and no fixed /tmp name can be taken first (docs/experiment-files.md). Plans and
records keep the placeholder; only what reaches a host gets the resolved path.
"""
from __future__ import annotations

import posixpath
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

from zcorch.provision.deploy import host_workdir
from zcorch.provision.remote_call import remote_json, run_remote
from zcorch.errors import PreflightError
from zcorch.hosts.local import Host
from zcorch.config.checks import SCRATCH_PLACEHOLDER

PLACEHOLDER = SCRATCH_PLACEHOLDER
# Which host a parameter's path lives on.
ROLE_OF = {"source": "sender", "sink": "receiver"}


def uses(value: object) -> bool:
    """True for a path written with the placeholder (`{scratch}` or `{scratch}/...`)."""
    return isinstance(value, str) and (value == PLACEHOLDER or value.startswith(PLACEHOLDER + "/"))


def substitute(value: str, directory: Optional[str]) -> str:
    """`value` with a leading `{scratch}` replaced by `directory` (unchanged without one or without it)."""
    if directory is None or not uses(value):
        return value
    return directory.rstrip("/") + value[len(PLACEHOLDER):]


def resolve_params(params: Dict, dirs: Mapping[str, str]) -> Dict:
    """Params as the workers get them: `{scratch}` in source/sink -> that role's directory in `dirs` (a role
    not in it keeps it). `params` itself when nothing changes (shared by the repeats: never mutated)."""
    out = params
    for key, role in ROLE_OF.items():
        value = params.get(key)
        if uses(value) and role in dirs:
            if out is params:
                out = dict(params)
            out[key] = substitute(value, dirs[role])
    return out


def _relative_dir(path: str, is_directory: bool) -> str:
    """The directory under scratch that `path` needs ('' for scratch itself)."""
    rel = path[len(PLACEHOLDER):].lstrip("/")
    return rel if is_directory else posixpath.dirname(rel)


def needs(params_list: Iterable[Dict], dd_scratch: Optional[str] = None) -> Dict[str, List[str]]:
    """{role: [subdirectories under scratch to create]} for the roles whose paths use `{scratch}`. Pure.
    dd_scratch: the dd baseline's `scratch` when it runs (a directory on the receiver)."""
    out: Dict[str, List[str]] = {}
    for p in params_list:
        for key, role in ROLE_OF.items():
            if uses(p.get(key)):
                _add(out, role, _relative_dir(p[key], is_directory=False))
    if uses(dd_scratch):
        _add(out, "receiver", _relative_dir(dd_scratch, is_directory=True))
    return {role: out[role] for role in ("sender", "receiver") if role in out}


def _add(out: Dict[str, List[str]], role: str, rel: Optional[str]) -> None:
    subdirs = out.setdefault(role, [])
    if rel and rel not in subdirs:
        subdirs.append(rel)


def workdir_of(host: Host) -> str:
    """The host's workdir (spec `workdir` or ~/.cache/zcorch); SSH hosts expand `~` themselves (sftp)."""
    workdir = host_workdir(host)
    expand = getattr(host, "expand", None)
    return expand(workdir) if callable(expand) else workdir


def prepare(host: Host, python: str, subdirs: Sequence[str] = ()) -> Dict:
    """Create `<workdir>/scratch` (0700) and its `subdirs` on `host`: {"path", "created", "mode"}.
    PreflightError naming the host when it cannot be used."""
    workdir = workdir_of(host)
    # zcorch.worker.remote.prepare_scratch expands `~` there (also inside a lab host's mount namespace).
    res = run_remote(host, "scratch", workdir, *subdirs, python=python)
    info = remote_json(res)
    if not res.ok or info is None:
        raise PreflightError(f"{host.name}: cannot prepare the {PLACEHOLDER} directory under {workdir} "
                             f"(exit {res.returncode}): {(res.stderr or res.stdout).strip()[-300:]}")
    if info.get("error"):
        raise PreflightError(f"{host.name}: the {PLACEHOLDER} directory {info['path']} {info['error']} (set the "
                             "host's `workdir` to another directory, or fix it)")
    return info


def prepare_all(hosts: Mapping[str, Host], python: Mapping[str, str], needed: Mapping[str, Sequence[str]],
                log=None) -> Dict[str, Dict]:
    """prepare() once per distinct host for the roles in `needed` ({role: subdirs}): {role: info}."""
    done: Dict[int, Dict] = {}
    subdirs_of: Dict[int, List[str]] = {}
    for role, subdirs in needed.items():
        mine = subdirs_of.setdefault(id(hosts[role]), [])
        mine += [s for s in subdirs if s not in mine]
    out: Dict[str, Dict] = {}
    for role in needed:
        host = hosts[role]
        if id(host) not in done:
            done[id(host)] = prepare(host, python[role], subdirs_of[id(host)])
            if log is not None and done[id(host)].get("created"):
                log(f"created the {PLACEHOLDER} directory {done[id(host)]['path']} on {host.name} (mode 0700)")
        out[role] = done[id(host)]
    return out
