"""Network configurations as a matrix axis: applied to both hosts around their runs, always restored.

`NetworkManager.ensure(name)` applies a `networks:` entry once per group of cells, `teardown_all()` puts the
hosts back on every exit path; on the hosts zcorch.worker.netcfg changes the data link, recording the old
values first. Nothing changes unless allowed (Experiment.network_allowed), only as root, never on a link
carrying the SSH session nor to an MTU that would delete its addresses. Every sweep holds each host's
network lease (take_leases) and restores a killed sweep's leftovers under it.
"""
from __future__ import annotations

import json
import os
import shlex
import socket
import time
import uuid
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

from zcorch.config.hosts import Hosts, net_state_dir
from zcorch.config.networks import CONGESTION_SYSCTL, NetworkConfig
from zcorch.errors import HostError, PreflightError
from zcorch.hosts.local import Host
from zcorch.hosts.parallel import per_host
from zcorch.provision.fs_state import HOST_LEASE_DIR, ControllerLease, Lease, controller_alive
from zcorch.provision.remote_call import remote_command, remote_json, run_remote
from zcorch.provision.watchdog import Watchdog
from zcorch.worker.netcfg import mtu_problem, sysctl_refusal

MODULE = "zcorch.worker.netcfg"
# The network lease (fs_state.Lease): one per network namespace in HOST_LEASE_DIR as root.
LEASE_NAME = "zcorch-net.lease"
Log = Callable[[str], None]
ACTIVE_TOKENS: set = set()   # managers alive in this process (their state is never "stale" to us)


def _noop(_msg: str) -> None:
    pass


def owner_alive(owner: Any) -> bool:
    """True if a state file's owner is a live controller on this machine (not ours to restore)."""
    return controller_alive(owner, owner.get("token") if isinstance(owner, dict) else None, ACTIVE_TOKENS)


class _Target:
    """One host the configuration is applied to: both roles on localhost, else sender and receiver."""

    def __init__(self, roles: List[str], host: Host, python: str, peer: str, state_dir: str):
        self.roles, self.host, self.python, self.peer, self.state_dir = roles, host, python, peer, state_dir
        self.applied = False
        self.facts: Dict[str, Any] = {}
        self.watchdog: Optional[Watchdog] = None   # armed before the first change, confirmed after the restore

    @property
    def name(self) -> str:
        return self.host.name


def _call(t: _Target, action: str, *args: object, what: str) -> Dict[str, Any]:
    res = run_remote(t.host, action, *args, python=t.python, module=MODULE, timeout=60.0)
    doc = remote_json(res)
    if not res.ok or doc is None and action != "state":
        raise HostError(f"{t.name}: {what} failed: {(res.stderr or res.stdout).strip() or f'exit {res.returncode}'}")
    return doc or {}


def restore_state(host: Host, python: str, state_dir: str, log: Log = _noop) -> List[str]:
    """Restore what a state file in `state_dir` on `host` records; what was restored (else HostError)."""
    res = run_remote(host, "restore", state_dir, python=python, module=MODULE)
    doc = remote_json(res)
    if not res.ok or doc is None:
        raise HostError(f"{host.name}: restoring the network state in {state_dir} failed: "
                        f"{(res.stderr or res.stdout).strip()}")
    if doc.get("errors"):
        raise HostError(f"{host.name}: network restore incomplete (state kept in {state_dir}): "
                        f"{'; '.join(doc['errors'])}")
    for line in doc.get("restored", []):
        log(f"[{host.name}] restored {line}")
    return [f"{host.name}: {line}" for line in doc.get("restored", [])]


def _names_link(sysctl: str, dev: str) -> bool:
    """net.ipv4.conf.DEV.*, net.ipv6.neigh.DEV.*...: a sysctl of that one interface."""
    parts = sysctl.split(".")
    return len(parts) > 3 and parts[2] in ("conf", "neigh") and parts[3] == dev


def _carrying_problems(where: str, peer: str, dev: Optional[str], carrying: Dict[str, str],
                       configs: List[NetworkConfig]) -> List[str]:
    """A change of a link that carries the controller's SSH session: refused (if the link stops working, the
    controller cannot reach the host to put it back; the restore would fail with the connection)."""
    out = []
    for c in configs:
        touched = [(dev, f"mtu {c.mtu}")] if c.mtu is not None and dev in carrying else []
        touched += [(link, k) for k in c.all_sysctls() for link in carrying if _names_link(k, link)]
        for link, change in touched:
            role = f"{link}, the data link to {peer}," if link == dev else link
            out.append(f"{where}: network {c.name!r} would change {role} ({change}), which also carries "
                       f"{carrying[link]}: if the link stops working the controller cannot reach the host to "
                       "restore it. Give the host a data_address on another link (or leave that setting out)")
    return out


def _host_dirs(hosts: Dict[str, Host], spec: Hosts) -> List[tuple]:
    """[(host, network state directory as written)]: each host once (localhost: both roles are one)."""
    if hosts["sender"] is hosts["receiver"]:
        return [(hosts["receiver"], net_state_dir(spec.workdir("receiver")))]
    return [(hosts[role], net_state_dir(spec.workdir(role))) for role in ("sender", "receiver")]


def take_leases(hosts: Dict[str, Host], spec: Hosts, token: str, changes: bool, wait: float = 3.0) -> List[Any]:
    """Each host's ControllerLease, then its network lease (exclusive when `changes`, else shared), before
    anything loads the hosts. PreflightError names the holder (after `wait` s)."""
    taken: List[Any] = []
    try:
        for host, state_dir in _host_dirs(hosts, spec):
            taken.append(ControllerLease.take(host, state_dir))
            taken.append(Lease.take(host, state_dir, name=LEASE_NAME, wait=wait, token=token,
                                    shared=not changes, host_wide=HOST_LEASE_DIR,
                                    what="this host's network (a sweep with `networks:` excludes every other "
                                         "sweep on its hosts; sweeps without share them)"))
    except BaseException:
        release_leases(taken)
        raise
    return taken


def release_leases(leases: List[Any], warnings: Optional[List[str]] = None) -> None:
    """Release each lease (newest first); one lost with its connection has ended with it: a warning."""
    for lease in reversed(leases):
        try:
            lease.release()
        except (HostError, OSError) as exc:
            if warnings is not None:
                warnings.append(f"{lease.host.name}: lease {lease.path} not released cleanly (it ends with the "
                                f"connection): {exc}")


def _restore_stale(t: _Target, log: Log) -> List[str]:
    """A killed sweep's network state on t's host put back (warnings); PreflightError if that sweep runs."""
    state = _call(t, "state", t.state_dir, what="reading the network state file")
    if not state:
        return []
    if owner_alive(state.get("owner")):
        raise PreflightError(f"{t.name}: another sweep (pid {state['owner'].get('pid')}) has changed this host's "
                             f"network ({state.get('name')!r}); wait for it to end")
    return [f"restored a previous controller's network leftover on {u}"
            for u in restore_state(t.host, t.python, t.state_dir, log)]


def restore_leftovers(hosts: Dict[str, Host], python: Dict[str, str], spec: Hosts, log: Log = _noop,
                      clean: Sequence[Host] = ()) -> List[str]:
    """Under the leases: a killed sweep's changes on each host put back before this sweep loads them; returns
    warnings, PreflightError when one cannot be. `clean`: hosts whose preflight found no state file."""
    def one(item: tuple) -> List[str]:
        host, state_dir = item
        if any(host is c for c in clean):
            return []
        py = python["receiver"] if host is hosts["receiver"] else python["sender"]
        try:
            return _restore_stale(_Target([], host, py, "", state_dir), log)
        except HostError as exc:
            raise PreflightError(f"{host.name}: a previous sweep's network changes are still applied and could "
                                 f"not be restored, so no run would measure this host as configured: {exc}") from None

    # both hosts at once (each under its own lease; nothing on one waits for the other)
    return [w for found in per_host(_host_dirs(hosts, spec), one) for w in found]


class NetworkManager:
    """Applies `networks:` entries to the data link of both hosts and restores them (module docstring)."""

    def __init__(self, hosts: Dict[str, Host], python: Dict[str, str], configs: Dict[str, NetworkConfig],
                 spec: Hosts, dry_run: bool = False, log: Log = _noop):
        self.configs, self.dry_run, self.log = configs, dry_run, log
        self.token = uuid.uuid4().hex[:16]
        self.owner = {"host": socket.gethostname(), "pid": os.getpid(), "token": self.token,
                      "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        s, r = hosts["sender"], hosts["receiver"]
        # (roles, host, peer); one host in both roles is the receiver
        pairs = [(["sender", "receiver"], r, r)] if s is r else [(["sender"], s, r), (["receiver"], r, s)]
        self.targets = [_Target(roles, host, python[roles[-1]], peer.data_address,
                                net_state_dir(spec.workdir(roles[-1]))) for roles, host, peer in pairs]
        self.current: Optional[str] = None
        self._descriptions: Dict[str, dict] = {}
        self.warnings: List[str] = []

    def _config(self, name: str) -> NetworkConfig:
        try:
            return self.configs[name]
        except KeyError:
            raise HostError(f"network {name!r} is not defined under `networks:`") from None

    # ------------------------------------------------------------ preflight

    def preflight(self, names: Iterable[str]) -> List[str]:
        """Problems that would stop `names` from being applied; a dead controller's leftovers restored first."""
        configs = [self._config(n) for n in dict.fromkeys(names)]
        if not configs or self.dry_run:
            return []
        ACTIVE_TOKENS.add(self.token)
        problems: List[str] = []
        sysctls = sorted({k for c in configs for k in c.all_sysctls()} - {CONGESTION_SYSCTL})
        for t in self.targets:
            try:
                self.warnings += _restore_stale(t, self.log)
                facts = _call(t, "probe", t.peer, *self._keep(t), *sysctls, what="probing the data link")
            except HostError as exc:
                problems.append(str(exc))
                continue
            problems += self._probe_problems(t, facts, configs)
        return problems

    def _keep(self, t: _Target) -> List[str]:
        """--keep=ADDR for a host without SSH (this machine): the routes to the other hosts' SSH peers ride on
        its links too. A host reached over SSH finds its own session (SSH_CONNECTION)."""
        if not t.host.is_local:
            return []
        peers = [getattr(o.host, "peer_address", lambda: None)() for o in self.targets if o is not t]
        return [f"--keep={p}" for p in peers if p]

    def _probe_problems(self, t: _Target, facts: Dict[str, Any], configs: List[NetworkConfig]) -> List[str]:
        where = t.name
        out = []
        if facts.get("euid") != 0:
            out.append(f"{where}: changing the network (networks: {', '.join(c.name for c in configs)}) needs root "
                       f"on this host (it runs as uid {facts.get('euid')}): connect as root")
        if facts.get("error"):
            out.append(f"{where}: cannot find the data link to {t.peer}: {facts['error']}")
            return out
        dev = facts.get("interface")
        lo, hi = facts.get("min_mtu"), facts.get("max_mtu")
        for c in configs:
            if c.mtu is None:
                continue
            if isinstance(hi, int) and hi > 0 and c.mtu > hi or isinstance(lo, int) and c.mtu < lo:  # 0: no limit
                out.append(f"{where}: network {c.name!r}: mtu {c.mtu} is outside what {dev} takes ({lo}..{hi})")
            elif isinstance(dev, str) and mtu_problem(dev, c.mtu, facts.get("addresses") or {}):
                out.append(f"{where}: network {c.name!r}: {mtu_problem(dev, c.mtu, facts.get('addresses') or {})}")
        out += _carrying_problems(where, t.peer, dev, facts.get("carrying") or {}, configs)
        for c in configs:     # the allow-list against the data link this host has (the host judges it again)
            out += [f"{where}: network {c.name!r}: {why}" for k in c.all_sysctls()
                    for why in [sysctl_refusal(k, dev if isinstance(dev, str) else "")] if why]
        out += congestion_problems(where, configs, facts)
        missing = sorted(k for k, v in (facts.get("sysctls") or {}).items() if v is None)
        if missing:
            users = [c.name for c in configs if set(missing) & set(c.all_sysctls())]
            out.append(f"{where}: network {', '.join(map(repr, users))}: no sysctl {', '.join(missing)} on this host "
                       "(in its network namespace: a namespace has only its own net.* sysctls)")
        readonly = sorted(facts.get("sysctls_readonly") or [])
        if readonly and facts.get("euid") == 0:
            out.append(f"{where}: sysctl {', '.join(readonly)} cannot be written on this host (in a network "
                       "namespace the machine-wide ones, such as net.core.rmem_max, are read-only)")
        return out

    # ------------------------------------------------------------ apply / restore

    def _say(self, t: _Target, action: str, *args: object) -> None:
        cmd = remote_command(t.host, action, *args, python=t.python, module=MODULE)
        self.log(f"[{t.name}] {'(dry run) ' if self.dry_run else ''}{cmd.display()}")

    def commands(self, name: str) -> List[str]:
        """What applying `name` does on each host, in words (dry run, meta.json)."""
        c = self._config(name)
        out = []
        for t in self.targets:
            link = f"<data link to {t.peer}>"
            if c.mtu is not None:
                out.append(f"[{t.name}] ip link set dev {link} mtu {c.mtu}")
            for k, v in c.all_sysctls().items():
                out.append(f"[{t.name}] write {shlex.quote(v)} to /proc/sys/{k.replace('.', '/')}")
        return out

    def ensure(self, name: str) -> Dict[str, Any]:
        """Apply `name` on every host (restoring the previous configuration first); the effective values."""
        if self.current == name:
            return self.run_facts()
        if self.current is not None:
            self.restore()
        c = self._config(name)
        ACTIVE_TOKENS.add(self.token)
        spec, owner = json.dumps(c.spec()), json.dumps(self.owner)
        if self.dry_run:
            for line in self.commands(name):
                self.log(f"(dry run) {line}")
        try:
            if not self.dry_run:   # every host restores itself if we are lost from here on
                self._arm_watchdogs()
            for t in self.targets:
                t.applied = True   # before the call: a failure half-way leaves a state file to restore from
                if self.dry_run:   # the recording host shows the command; nothing runs
                    run_remote(t.host, "apply", t.state_dir, t.peer, spec, owner, python=t.python, module=MODULE)
                    t.facts = {"interface": None, "mtu": c.mtu, "congestion": c.congestion,
                               "sysctls": c.all_sysctls()}
                    continue
                self._say(t, "apply", t.state_dir, t.peer, spec, owner)
                doc = _call(t, "apply", t.state_dir, t.peer, spec, owner, what=f"applying network {name!r}")
                t.facts = {k: doc.get(k) for k in ("interface", "kind", "mtu", "congestion", "sysctls")}
        except BaseException as exc:  # also Ctrl-C: never leave a half-applied configuration behind
            self.current = name
            try:
                self.restore()
            except HostError as again:
                if isinstance(exc, HostError):
                    raise HostError(f"{exc} (restoring failed too: {again})") from exc
            raise
        self.current = name
        self._descriptions[name] = {"name": name, **c.requested(), "applied": not self.dry_run,
                                    "hosts": self._facts_by_role()}
        return self.run_facts()

    def _arm_watchdogs(self) -> None:
        """Every host's watchdog, all at once, before the first change anywhere."""
        def arm(t: _Target) -> None:
            if t.watchdog is None:
                t.watchdog = Watchdog.arm(t.host, t.python, "net", t.state_dir, self.owner)

        per_host(self.targets, arm)

    def run_facts(self) -> Dict[str, Any]:
        """The record's "network": {"name", "sender": {interface, kind, mtu, congestion, sysctls}, "receiver"}."""
        return {"name": self.current, **self._facts_by_role()} if self.current is not None else {}

    def _facts_by_role(self) -> Dict[str, dict]:
        return {role: dict(t.facts) for t in self.targets for role in t.roles}

    def restore(self) -> None:
        """The hosts' network as before ensure(); HostError names what could not be restored (state file kept)."""
        errors = []
        for t in reversed(self.targets):
            if not t.applied:
                continue
            if self.dry_run:
                run_remote(t.host, "restore", t.state_dir, python=t.python, module=MODULE)
                t.applied = False
                continue
            self._say(t, "restore", t.state_dir)
            try:
                restore_state(t.host, t.python, t.state_dir, self.log)
                t.applied = False
                t.facts = {}
            except HostError as exc:
                errors.append(str(exc))
        if errors:
            raise HostError("; ".join(errors))
        self.current = None

    def leftovers(self) -> List[str]:
        """What stays changed if the teardown stops now, and how to put it back (a third Ctrl-C)."""
        return [f"{t.name}: network {self.current!r} is still applied (the previous values are recorded in "
                f"{t.state_dir}/zcorch-net-<netns>.json there): the next `zcorch run` on this host restores them "
                "before anything else (for a lab, `zcorch lab down` does too)"
                for t in self.targets if t.applied and not self.dry_run]

    def teardown_all(self) -> None:
        """restore(), for every exit path (idempotent); then each host's watchdog is confirmed (one whose host
        could not be restored stays armed: it restores the host itself once this controller is gone)."""
        try:
            self.restore()
        finally:
            for t in self.targets:
                if not t.applied and t.watchdog is not None:
                    t.watchdog.confirm()
                    t.watchdog = None
            if not any(t.applied for t in self.targets):
                ACTIVE_TOKENS.discard(self.token)

    # ------------------------------------------------------------ description

    def describe(self, name: str) -> dict:
        """What meta.json records for `name`: the settings asked for and, once applied, the effective values."""
        if name in self._descriptions:
            return dict(self._descriptions[name])
        c = self._config(name)
        return {"name": name, **c.requested(), "applied": False, "commands": self.commands(name)}


def congestion_problems(where: str, configs: "Sequence[NetworkConfig]", facts: Dict[str, Any]) -> List[str]:
    """Pure: each configuration's congestion control this host (its probe's `facts`) cannot take."""
    out: List[str] = []
    for c in configs:
        if c.congestion is not None and c.congestion not in (facts.get("congestion_available") or []):
            avail = " ".join(facts.get("congestion_available") or []) or "none listed"
            out.append(f"{where}: network {c.name!r}: congestion control `{c.congestion}` is not available "
                       f"(net.ipv4.tcp_available_congestion_control: {avail}; `modprobe tcp_{c.congestion}` "
                       "loads it if the kernel has it)")
        elif (c.congestion is not None and facts.get("init_netns") is not True
              and c.congestion not in (facts.get("congestion_allowed") or [])):
            # outside the initial namespace the kernel refuses any other (EPERM); a host that cannot tell
            # (/proc/1 hidden) gets the same rule: a refusal now, not at the run
            allowed = " ".join(facts.get("congestion_allowed") or []) or "none"
            where_ns = ("this host's network namespace" if facts.get("init_netns") is False else
                        "this host's network namespace, which it cannot tell from the initial one,")
            out.append(f"{where}: network {c.name!r}: congestion control `{c.congestion}` cannot be chosen in "
                       f"{where_ns}: outside the initial namespace the kernel allows only "
                       f"net.ipv4.tcp_allowed_congestion_control ({allowed}) (add it to that sysctl in the root "
                       "namespace)")
    return out
