"""Deploy the worker to a host and check the host has what a sweep needs (preflight).

Remote hosts: uploaded into `<workdir>/.tmp-worker-<hash>-<rand>/`, built there with the host's own python,
then renamed to `<workdir>/worker-<hash>/`; a marked build that passes the ownership checks is reused.
LocalHost runs the controller's own package. Details: docs/architecture.md, "SSH, deploy, preflight, lab".
"""
from __future__ import annotations

import glob
import hashlib
import importlib.util
import json
import os
import posixpath
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

from zcorch._version import __version__
from zcorch.config import capabilities
from zcorch.config.baselines.kind import Tool
from zcorch.config.hosts import DEFAULT_PYTHON, DEFAULT_WORKDIR, net_state_dir
from zcorch.errors import DeployError, PreflightError
from zcorch.hosts.interpreter import python_argv
from zcorch.hosts.local import Host
from zcorch.hosts.parallel import per_host
from zcorch.provision.remote_call import PACKAGE_PARENT, host_python, local_safe_path, remote_json, run_remote
from zcorch.worker import netcfg

MARKER = ".zcorch-deployed"
BUILD_TIMEOUT = 300.0
KEEP_BUILDS = 3          # older worker-<hash> directories beyond this many are pruned
MIN_PYTHON = (3, 11)  # the range pyproject.toml states and CI tests, on hosts as on the controller
NATIVE_PACKAGE_DATA = "_native_src"   # zcorch/_native_src/ of a wheel = the checkout's native/ (setup.py)

# Deployed modules, as laid out on the host (docs/architecture.md "What ships to the hosts"): zcorch/worker/
# whole; of the core, only what the worker imports.
_DEPLOYED_MODULES = ["zcorch/__init__.py", "zcorch/_version.py", "zcorch/errors.py", "zcorch/units.py",
                     "zcorch/params.py", "zcorch/worker/__init__.py", "zcorch/worker/__main__.py", "native/build.py",
                     "native/gen_params.py"]
_DEPLOYED_GLOBS = ["zcorch/worker/*.py", "native/include/*.h", "native/core/*.c", "native/modes/*.c"]


def native_sources_dir() -> str:
    """What becomes native/ on a host: zcorch/_native_src/ of an install, else the checkout's native/."""
    package = _package_dir()
    data = os.path.join(package, NATIVE_PACKAGE_DATA)
    if os.path.isfile(os.path.join(data, "build.py")):
        return data
    return os.path.join(os.path.dirname(package), "native")


def _package_dir() -> str:
    import importlib.resources

    root = importlib.resources.files("zcorch")
    if not isinstance(root, os.PathLike):   # e.g. a zip archive: files are uploaded from the filesystem
        raise DeployError(f"the zcorch package is not a directory ({root!r}): install it from a wheel or sdist")
    return os.fspath(root)


def worker_sources(source_root: Optional[str] = None) -> Dict[str, str]:
    """{path on the host -> local file} of this installation, or of `source_root` laid out as on the host."""
    if source_root is None:
        roots = {"zcorch": _package_dir(), "native": native_sources_dir()}
    else:
        root = os.path.abspath(source_root)
        roots = {"zcorch": os.path.join(root, "zcorch"), "native": os.path.join(root, "native")}

    def local(rel: str) -> str:
        top, _, rest = rel.partition("/")
        return os.path.join(roots[top], *rest.split("/"))

    files = {rel: local(rel) for rel in _DEPLOYED_MODULES}
    missing = [rel for rel, path in files.items() if not os.path.isfile(path)]
    for pattern in _DEPLOYED_GLOBS:
        top, _, rest = pattern.partition("/")
        for path in glob.glob(local(pattern)):
            files[f"{top}/" + os.path.relpath(path, roots[top]).replace(os.sep, "/")] = path
    if missing:
        where = source_root or f"{roots['zcorch']} and {roots['native']}"
        raise DeployError(f"worker sources missing under {where}: {', '.join(missing)} — "
                          f"reinstall zcorch (a wheel or sdist carries them as zcorch/{NATIVE_PACKAGE_DATA}/)")
    return dict(sorted(files.items()))


def content_hash(sources: Mapping[str, str]) -> str:
    """16 hex digits of SHA-256 over every deployed file's path (as on the host) and bytes."""
    h = hashlib.sha256()
    for rel in sorted(sources):
        data = Path(sources[rel]).read_bytes()
        h.update(rel.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return h.hexdigest()[:16]


@dataclass
class WorkerHandle:
    """How to start the deployed worker on one host: `worker_argv` with `env`, or `command(args)`."""

    host: Host
    python: str
    directory: str                 # the package root on the host (PYTHONPATH)
    hash: str
    reused: bool = False           # True when an existing build was taken as is
    info: Optional[dict] = None    # what `worker info` printed there (prepare's check); None before it
    # False: the preflight found no network state file on the host (restore_leftovers skips it); None: unknown.
    net_state: Optional[bool] = None
    env: Dict[str, str] = field(default_factory=dict)
    # ["-S"] when _cffi_backend's directory is on PYTHONPATH: skipping `site` speeds the worker's start-up.
    python_flags: List[str] = field(default_factory=list)
    safe_path: bool = False        # the interpreter is 3.11+: -P, else the -c bootstrap

    @property
    def worker_argv(self) -> List[str]:
        return python_argv(self.python, "zcorch.worker", self.python_flags, self.safe_path)

    def command(self, args: Sequence[str]) -> List[str]:
        """Full argv: `env PYTHONPATH=DIR python -m zcorch.worker ARGS...`."""
        return ["env", *[f"{k}={v}" for k, v in self.env.items()], *self.worker_argv, *[str(a) for a in args]]


def _where(host: Host) -> str:
    return getattr(host, "where", None) or host.name


def host_workdir(host: Host) -> str:
    """The host spec's `workdir` (DEFAULT_WORKDIR without a spec), as written: `~` not expanded."""
    return host.spec.workdir if host.spec else DEFAULT_WORKDIR


def build_directory(host: Host, digest: str, workdir: Optional[str] = None) -> "tuple[str, str]":
    """(the workdir, the build directory `<workdir>/worker-<digest>`) of a remote host, `~` expanded."""
    base = host.expand(workdir or host_workdir(host))
    return base, posixpath.join(base, f"worker-{digest}")


def deploy(host: Host, source_root: Optional[str] = None, workdir: Optional[str] = None,
           python: Optional[str] = None, build_timeout: float = BUILD_TIMEOUT,
           safe_path: bool = False, probed: Optional[dict] = None) -> WorkerHandle:
    """Make the worker runnable on `host`; returns the handle that starts it (DeployError naming the host).
    workdir / python default to the host spec's; safe_path: its python takes -P; probed: the preflight's
    "build" answer (zcorch.worker.remote.build_state), which saves finding it here."""
    python = python or host_python(host)
    if host.is_local:
        if source_root is not None and os.path.abspath(source_root) != PACKAGE_PARENT:
            raise DeployError("localhost runs the controller's own package; source_root is for remote hosts")
        handle = WorkerHandle(host, python, PACKAGE_PARENT, "local", reused=True, env={"PYTHONPATH": PACKAGE_PARENT},
                              safe_path=local_safe_path(python))
        cffi = importlib.util.find_spec("_cffi_backend") if python == sys.executable else None
        if cffi and cffi.origin:
            handle.env["PYTHONPATH"] = f"{PACKAGE_PARENT}:{os.path.dirname(os.path.abspath(cffi.origin))}"
            handle.python_flags = ["-S"]
        return handle
    sources = worker_sources(source_root)
    files = list(sources)
    digest = content_hash(sources)
    written = workdir or host_workdir(host)
    if isinstance(probed, dict) and probed.get("workdir") == written and isinstance(probed.get("path"), str) \
            and posixpath.isabs(probed["path"]) and posixpath.basename(probed["path"]) == f"worker-{digest}":
        # the probe expanded the workdir on the host: no `~` to look up here (SSHHost.expand asks over sftp)
        final = probed["path"]
        base = posixpath.dirname(final)
    else:
        base, final = build_directory(host, digest, workdir)
        probed = _build_state(host, base, final, python)
    handle = WorkerHandle(host, python, final, digest, env={"PYTHONPATH": final}, safe_path=safe_path)
    if probed.get("refused"):
        # The build goes onto PYTHONPATH: one another user can change is not ours to run.
        raise DeployError(f"{_where(host)}: refusing to use the worker build in {final}: {probed['refused']}")
    if probed.get("marker") is not None:
        handle.reused = True
        _use_cffi_dir(handle, probed["marker"])
        return handle
    tmp = posixpath.join(base, f".tmp-worker-{digest}-{uuid.uuid4().hex[:8]}")
    try:
        for rel, path in sources.items():
            host.put_file(path, posixpath.join(tmp, rel))
        build = host.run([python, posixpath.join(tmp, "native", "build.py"), "--out", tmp], timeout=build_timeout)
        if not build.ok:
            output = (build.stdout + build.stderr).strip()
            raise DeployError(f"{_where(host)}: building the worker failed (exit {build.returncode}, "
                              f"{python} native/build.py in {tmp}):\n{output[-6000:]}")
        found = run_remote(host, "cffi-dir", python=python)
        cffi_dir = found.stdout.strip() if found.ok else None
        marker = json.dumps({"hash": digest, "version": __version__, "files": files, "python": python,
                             "cffi_backend_dir": cffi_dir})
        # Checks the build, marks it complete, renames it into place and prunes old builds.
        fin = run_remote(host, "finalize", tmp, final, MARKER, marker, KEEP_BUILDS, python=python)
        if not fin.ok:
            raise DeployError(f"{_where(host)}: installing the built worker into {final} failed: "
                              f"{(fin.stderr or fin.stdout).strip()}")
    except BaseException:
        host.run(["rm", "-rf", "--", tmp], timeout=60)
        raise
    _use_cffi_dir(handle, marker)
    return handle


def _build_state(host: Host, base: str, final: str, python: str) -> dict:
    """The preflight's build_state, found here: the marker, counted only once `private-build` checked it."""
    existing = host.run(["cat", "--", posixpath.join(final, MARKER)], timeout=30)
    if not existing.ok:
        return {"marker": None, "refused": None}
    trust = run_remote(host, "private-build", base, final, python=python)
    if not trust.ok:
        return {"marker": None, "refused": (trust.stderr or trust.stdout).strip()}
    return {"marker": existing.stdout, "refused": None}


def _use_cffi_dir(handle: WorkerHandle, marker_text: str) -> None:
    """Start the worker with -S when the build recorded where _cffi_backend lives (older builds did not)."""
    try:
        cffi_dir = json.loads(marker_text).get("cffi_backend_dir")
    except (ValueError, AttributeError):
        return
    if cffi_dir and posixpath.isabs(cffi_dir):
        handle.env["PYTHONPATH"] = f"{handle.directory}:{cffi_dir}"
        handle.python_flags = ["-S"]


# -- preflight: one round trip per host ------------------------------------------------------
def probe_host(host: Host, ports: Sequence[int] = (), python: Optional[str] = None,
               programs: Sequence[str] = (), build: Optional[Sequence[str]] = None,
               net_state: Optional[str] = None) -> dict:
    """Facts about a host (zcorch.worker.remote.preflight_facts; "build" given build = (workdir, `worker-<hash>`),
    "net_state" given its directory), or {"error": ...} when its python cannot run."""
    python = python or host_python(host)
    r = run_remote(host, "preflight", host.data_address, *[int(p) for p in ports],
                   *[a for p in programs for a in ("--tool", p)],
                   *(["--net-state", net_state, netcfg.STATE_PREFIX] if net_state else []),
                   *(["--build", *build, MARKER] if build else []), python=python)
    if not r.ok:
        return {"error": (r.stderr or r.stdout).strip(), "returncode": r.returncode, "python_cmd": python}
    facts = remote_json(r)
    if facts is None:
        return {"error": f"unexpected probe output {r.stdout[-300:]!r}", "returncode": r.returncode,
                "python_cmd": python}
    return facts


def takes_safe_path(facts: Optional[dict]) -> bool:
    """Whether the python a probe ran (its facts) is 3.11+, i.e. takes -P."""
    version = (facts or {}).get("python")
    return isinstance(version, list) and tuple(version[:2]) >= (3, 11)


def host_problems(host: Host, facts: dict, tools: Sequence[Tool] = ()) -> List[str]:
    """Pure: each missing piece of one host as "<host>: <what> — <fix>"; `tools`: the programs it must have."""
    where = _where(host)
    problems = []
    if "error" in facts:
        cmd = facts.get("python_cmd", DEFAULT_PYTHON)
        if facts.get("returncode") == 127:
            problems.append(f"{where}: {cmd} not found — apt-get install python3 (or set hosts.{host.name}.python "
                            f"to the interpreter's path)")
        else:
            problems.append(f"{where}: {cmd} failed to run the preflight probe: {facts['error'][-500:]}")
        return problems
    if tuple(facts["python"]) < MIN_PYTHON:
        problems.append(f"{where}: {facts['executable']} is Python {'.'.join(map(str, facts['python']))}, "
                        f"the worker needs {'.'.join(map(str, MIN_PYTHON))}+ — set hosts.{host.name}.python")
    if not host.is_local:  # localhost runs the controller's own, already built, package
        for key, what in (("cffi", f"python module cffi not found for {facts['executable']} — apt-get install "
                                   "python3-cffi (or pip install cffi)"),
                          ("python_h", "Python headers (Python.h) not found — apt-get install python3-dev"),
                          ("cc", "no C compiler (cc) found — apt-get install gcc")):
            if not facts[key]:
                problems.append(f"{where}: {what}")
    for tool in tools:
        if not (facts.get("tools") or {}).get(tool.program):
            unrunnable = (facts.get("tools_unrunnable") or {}).get(tool.program)
            if unrunnable:
                problems.append(f"{where}: {tool.program} found at {unrunnable} but not executable — chmod +x it, "
                                f"or {tool.install_hint()}")
            else:
                problems.append(f"{where}: {tool.program} not found — {tool.install_hint()}")
    if facts["address_error"]:
        problems.append(f"{where}: data_address {host.data_address} is not an address of this host "
                        f"({facts['address_error']}) — fix hosts.{host.name}.data_address")
    for port, err in facts["busy_ports"]:
        problems.append(f"{where}: port {port} on {host.data_address} is in use ({err}) — stop what listens "
                        f"there or choose another port")
    return problems


_SIDE_WORDS = {"send": "send", "recv": "receive"}


def mode_problems(where: str, info: dict, needed: Mapping[str, "Sequence[str]"]) -> List[str]:
    """Pure: each mode of `needed` ({"send": [modes], "recv": [modes]}) the host's `worker info` cannot run, does
    not list, or declares with capabilities other than zcorch.config.capabilities (no mode list: no check)."""
    problems = []
    listed, unavailable = info.get("modes") or {}, info.get("unavailable") or {}
    declared = info.get("capabilities") or {}
    for side in ("send", "recv"):
        for mode in sorted(set(needed.get(side, ()))):
            why = (unavailable.get(side) or {}).get(mode)
            theirs = (declared.get(side) or {}).get(mode)
            if why:
                problems.append(f"{where}: {_SIDE_WORDS[side]} mode `{mode}` cannot run there: {why}")
            elif listed.get(side) and mode not in listed[side]:
                problems.append(f"{where}: the worker there has no {_SIDE_WORDS[side]} mode `{mode}` (it has "
                                f"{', '.join(listed[side])}) — redeploy (delete the worker-* directory)")
            elif theirs is not None and set(theirs) != capabilities.mode_caps(side, mode):
                ours = sorted(capabilities.mode_caps(side, mode))
                problems.append(f"{where}: the worker there declares {_SIDE_WORDS[side]} mode `{mode}` with "
                                f"capabilities [{', '.join(sorted(theirs))}], the plan's cell rules used "
                                f"[{', '.join(ours)}] — redeploy (delete the worker-* directory), or after changing "
                                f"the C modes: {capabilities.REGENERATE}")
    return problems


def worker_version_problems(handle: WorkerHandle,
                            modes: Optional[Mapping[str, "Sequence[str]"]] = None,
                            info_args: Sequence[str] = ()) -> List[str]:
    """`worker info` on the host (more flags: info_args; its answer to handle.info): version and mode problems."""
    where = _where(handle.host)
    r = handle.host.run(handle.worker_argv + ["info", *info_args], env=handle.env, timeout=60)
    fix = ("reinstall zcorch (in a checkout: scripts/bootstrap)" if handle.host.is_local
           else "redeploy (delete the worker-* directory)")
    if not r.ok:
        return [f"{where}: `{' '.join(handle.worker_argv)} info` failed (exit {r.returncode}): "
                f"{(r.stderr or r.stdout).strip()[-800:]} — {fix}"]
    try:
        info = json.loads(r.stdout.strip().splitlines()[-1])
        version = info["version"]
    except (ValueError, IndexError, KeyError, TypeError):
        return [f"{where}: `worker info` printed no version: {r.stdout[-300:]!r} — {fix}"]
    if version != __version__:
        return [f"{where}: worker version {version} != controller version {__version__} — {fix}"]
    handle.info = info
    return mode_problems(where, info, modes or {})


def preflight(hosts: Mapping[str, Host], tools: Optional[Mapping[str, Sequence[Tool]]] = None,
              ports: Sequence[int] = (), handles: Optional[Mapping[str, WorkerHandle]] = None,
              digest: Optional[str] = None) -> Dict[str, dict]:
    """Check every host once (and given handles, each worker's version); returns the probe facts (with the
    build of worker `digest`). tools: {role: baseline tools}. One PreflightError lists every problem."""
    facts: Dict[str, dict] = {}
    problems: List[str] = []
    first_role = _first_roles(hosts)
    roles = list(first_role.values())

    def probe(role: str) -> "tuple[dict, List[str]]":
        host = hosts[role]
        mine = list({t.program: t for r, h in hosts.items() if h is host for t in (tools or {}).get(r, ())}.values())
        build = (host_workdir(host), f"worker-{digest}") if digest and not host.is_local else None
        found = probe_host(host, ports, programs=[t.program for t in mine], build=build,
                           net_state=net_state_dir(host_workdir(host)))
        return found, host_problems(host, found, mine)

    for role, (found, trouble) in zip(roles, per_host(roles, probe)):   # every host at once
        facts[role] = found
        problems += trouble
    for role, host in hosts.items():
        facts[role] = facts[first_role[id(host)]]
    for role, handle in (handles or {}).items():
        if not any(p.startswith(_where(handle.host) + ":") for p in problems):
            problems += worker_version_problems(handle)
    if problems:
        raise PreflightError("preflight failed:\n  " + "\n  ".join(dict.fromkeys(problems)))
    return facts


def _first_roles(hosts: Mapping[str, Host]) -> Dict[int, str]:
    """{id(host): its first role}: one Host in two roles (localhost) is handled once."""
    first: Dict[int, str] = {}
    for role, host in hosts.items():
        first.setdefault(id(host), role)
    return first


def prepare(hosts: Mapping[str, Host], tools: Optional[Mapping[str, Sequence[Tool]]] = None,
            ports: Sequence[int] = (),
            source_root: Optional[str] = None,
            modes: Optional[Mapping[str, Mapping[str, "Sequence[str]"]]] = None,
            info_args: Optional[Mapping[str, Sequence[str]]] = None) -> Dict[str, WorkerHandle]:
    """Preflight the hosts, deploy the worker to each, then check its version and the modes ({role: {side:
    [modes]}}) the cells give it. info_args: {role: more `worker info` flags}. PreflightError names all."""
    digest = content_hash(worker_sources(source_root)) if any(not h.is_local for h in hosts.values()) else None
    facts = preflight(hosts, tools=tools, ports=ports, digest=digest)
    needed: Dict[int, Dict[str, List[str]]] = {}
    for role, host in hosts.items():
        mine = needed.setdefault(id(host), {"send": [], "recv": []})
        for side, names in ((modes or {}).get(role) or {}).items():
            mine[side] += list(names)
    first_role = _first_roles(hosts)

    def install(role: str) -> "tuple[WorkerHandle, List[str]]":
        host = hosts[role]
        found = facts.get(role) or {}
        handle = deploy(host, source_root=source_root, safe_path=takes_safe_path(found), probed=found.get("build"))
        handle.net_state = found.get("net_state")
        return handle, worker_version_problems(handle, needed[id(host)], (info_args or {}).get(role, ()))

    roles = list(first_role.values())
    done = dict(zip(roles, per_host(roles, install)))   # every host at once (a DeployError names its host)
    handles = {role: done[first_role[id(host)]][0] for role, host in hosts.items()}
    problems = [p for role in roles for p in done[role][1]]
    if problems:
        raise PreflightError("preflight failed:\n  " + "\n  ".join(problems))
    return handles
