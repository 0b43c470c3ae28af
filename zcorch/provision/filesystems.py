"""Receiver filesystems as a matrix axis: provision, record, tear down - safely.

`FilesystemManager` provisions a `filesystems:` entry on its first `ensure(name)`, `release`s it after its
last cell and `teardown_all()`s on exit. A state file written before every step lists what was made, and
only that is ever undone (by the host's own code, zcorch.worker.watchdog.restore_fs). mkfs/mdadm/mount
touch only loops this manager made or devices in `allow_destroy` (fs_probe.device_problems, re-checked
right before). State layout and API: docs/architecture.md, "Filesystems".
"""
from __future__ import annotations

import functools
import json
import posixpath
import secrets
import shlex
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence, Union

from zcorch.config.checks import SCRATCH_PLACEHOLDER
from zcorch.config.filesystems import FilesystemConfig, mountpoint_problem
from zcorch.errors import ConfigError, HostError
from zcorch.provision.fs_probe import (device_problems, findmnt_target, has_tool, is_dir, md_supported, parse_btrfs_df,
                       parse_mdadm_detail, read_text, run_checked, split_options)
from zcorch.provision.fs_state import ACTIVE_TOKENS, Lease, StateFile, lease_held, list_state_files, owner_alive
from zcorch.hosts.local import Host
from zcorch.provision.remote_call import RemoteCommand, host_python, remote_command, remote_json, run_remote
from zcorch.provision.watchdog import MODULE as WATCHDOG_MODULE, Watchdog
from zcorch.units import format_size

Log = Callable[[str], None]
SESSION = "(session)"  # state-file key of the manager's own directories, undone last
# ext4 initialises inode tables and the journal lazily in a kernel thread after mount; that
# background writing would be measured with the first cells. Users' own -E comes later and wins.
EXT_MKFS_DEFAULTS = ["-E", "lazy_itable_init=0,lazy_journal_init=0"]


@dataclass
class Ref:
    """A value known only while provisioning (a loop device name, the md device)."""

    name: str

    def __repr__(self) -> str:
        return f"<{self.name}>"


Arg = Union[str, Ref]


@dataclass
class Step:
    argv: list                       # str or Ref items
    record: Optional[dict] = None    # resource written to the state file before the command runs
    bind: Optional[str] = None       # Ref name bound to the command's stripped stdout
    mkdir: Optional[str] = None      # a directory to create (missing ancestors recorded one by one)
    beneath: Optional[str] = None    # with mkdir: below this directory made by the host's mkdir-beneath (no link)
    check_devices: list = field(default_factory=list)   # devices re-checked right before this step
    remote: Optional[str] = None     # a zcorch.worker.remote action run with the host's python; argv = its args


def _resolve(value, refs: dict):
    if isinstance(value, Ref):
        if value.name not in refs:
            raise KeyError(value.name)
        return refs[value.name]
    if isinstance(value, list):
        return [_resolve(v, refs) for v in value]
    if isinstance(value, dict):
        return {k: _resolve(v, refs) for k, v in value.items()}
    return value


class FilesystemManager:
    """Provisions the receiver's filesystem configurations on demand; see the module docstring."""

    def __init__(self, host: Host, configs: "Mapping[str, FilesystemConfig]", state_dir: str, dry_run: bool = False,
                 log: Optional[Log] = None, scratch: Optional[str] = None):
        self.host = host
        # `{scratch}` on the receiver; by default the state directory's sibling (both under the workdir)
        self._scratch_raw = scratch or posixpath.join(posixpath.dirname(state_dir.rstrip("/")) or "/", "scratch")
        self.dry_run = dry_run
        self.log: Log = log or (lambda _m: None)
        self.configs: "dict[str, FilesystemConfig]" = dict(configs)
        self._state_dir_raw = state_dir
        self.token = time.strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(3)
        self._state: Optional[StateFile] = None
        self._mounted: dict = {}        # name -> mountpoint, in provisioning order
        self._descriptions: dict = {}
        self.lease: Optional[Lease] = None   # the sweep's hold on the receiver (zcorch.sweep.pipeline takes it)
        self._watchdog: Optional[Watchdog] = None   # armed with the state file (zcorch.provision.watchdog)

    def leftovers(self) -> "list[str]":
        """What stays provisioned if the teardown stops now, and how to undo it (a third Ctrl-C)."""
        if self.dry_run or self._state is None:
            return []
        names = ", ".join(n for n in self._state.data["configs"] if n != SESSION) or "(directories only)"
        return [f"{self.host.name}: filesystems {names} may still be provisioned (recorded in "
                f"{self._state.path} there): the next "
                "`zcorch run` with this receiver undoes them first (for a lab, `zcorch lab down` does too)"]

    # ------------------------------------------------------------ paths

    @functools.cached_property
    def state_dir(self) -> str:
        return _expand_home(self.host, self._state_dir_raw)

    @functools.cached_property
    def scratch_dir(self) -> str:
        return _expand_home(self.host, self._scratch_raw)

    def _session_dir(self) -> str:
        return posixpath.join(self.state_dir, f"fs-{self.token}")

    def _config_dir(self, cfg: FilesystemConfig) -> str:
        return posixpath.join(self._session_dir(), cfg.name)

    def _backing_dir(self, cfg: FilesystemConfig) -> str:
        if cfg.loop_dir:
            return posixpath.join(cfg.loop_dir, f"zcorch-{self.token}-{cfg.name}")
        return self._config_dir(cfg)

    def mountpoint(self, name: str) -> str:
        cfg = self._config(name)
        if cfg.existing:
            return cfg.path
        return self._mount_at(cfg)[1]

    def _mount_at(self, cfg: FilesystemConfig) -> "tuple[str, str]":
        """(the directory the mount must lie beneath, the mountpoint): `<state_dir>/fs-<token>/<name>/mnt`, or
        `{scratch}/DIR` of the entry's `mountpoint`, checked again here (zcorch.config.filesystems)."""
        if cfg.mountpoint is None:
            return self._session_dir(), posixpath.join(self._config_dir(cfg), "mnt")
        why = mountpoint_problem(cfg.mountpoint)
        if why:
            raise ConfigError(f"filesystem {cfg.name!r}: mountpoint {why}")
        return self.scratch_dir, posixpath.join(self.scratch_dir, cfg.mountpoint[len(SCRATCH_PLACEHOLDER) + 1:])

    def _config(self, name: str) -> FilesystemConfig:
        if name not in self.configs:
            known = ", ".join(sorted(self.configs)) or "none"
            raise ConfigError(f"filesystem {name!r} is not defined under 'filesystems:' (defined: {known})")
        return self.configs[name]

    # ------------------------------------------------------------ plan

    def _steps(self, cfg: FilesystemConfig) -> "list[Step]":
        steps: list = []
        mnt = self.mountpoint(cfg.name)
        if cfg.loop_count:
            bdir = self._backing_dir(cfg)
            steps.append(Step(["mkdir", "-p", bdir], mkdir=bdir))
            devices: list = []
            for i in range(cfg.loop_count):
                backing = posixpath.join(bdir, f"dev{i}.img")
                steps.append(Step(["truncate", "-s", str(cfg.loop_size), backing],
                                  record={"kind": "backing_file", "path": backing}))
                argv = ["losetup", "--find", "--show"]
                if cfg.loop_direct_io:
                    argv.append("--direct-io=on")
                ref = Ref(f"loop{i}")
                steps.append(Step(argv + [backing], record={"kind": "loop", "backing_file": backing},
                                  bind=ref.name))
                devices.append(ref)
            checked: list = []
        else:
            devices = list(cfg.devices)
            checked = list(cfg.devices)
        target: Arg = devices[0]
        if cfg.uses_md:
            md = Ref("md")
            argv = ["mdadm", "--create", md, "--run", f"--level={cfg.raid}", f"--raid-devices={len(devices)}",
                    "--metadata=1.2"]
            if cfg.raid_chunk:
                argv.append(f"--chunk={cfg.raid_chunk // 1024}K")
            steps.append(Step(argv + devices, record={"kind": "md", "device": md, "members": devices},
                              check_devices=checked))
            checked, target = [], md
        steps.append(Step(self._mkfs_argv(cfg, devices, target), check_devices=checked))
        if cfg.fs == "btrfs":
            # Without udev the kernel may not know a multi-device filesystem's other members.
            steps.append(Step(["btrfs", "device", "scan", *devices],
                              record={"kind": "btrfs_devices", "devices": devices}))
        # Made and mounted by the host's python beneath the run's own directory, link by link (mkdir_beneath,
        # mount_beneath of zcorch.worker.remote): nothing is made or mounted through a link.
        root = self._mount_at(cfg)[0]
        steps.append(Step(["mkdir", "-p", mnt], mkdir=mnt, beneath=root))
        sources = devices if cfg.fs == "btrfs" else [target]
        steps.append(Step([root, mnt, cfg.fs, ",".join(cfg.mount_options), target], remote="mount-beneath",
                          record={"kind": "mount", "mountpoint": mnt, "sources": sources}))
        if cfg.loop_count:
            # Held open by the mount (or md array) now: our loops detach on last close, so they never outlive
            # a killed controller's mounts (which vanish with a lab's mount namespace).
            steps.append(Step(list(devices), remote="loop-autoclear"))
        return steps

    @staticmethod
    def _mkfs_argv(cfg: FilesystemConfig, devices: list, target: Arg) -> list:
        # Forcing is safe here: every device passed the safety check or was created by this run.
        if cfg.fs == "btrfs":
            argv = ["mkfs.btrfs", "-f"]
            if cfg.raid:
                argv += ["-d", cfg.raid, "-m", cfg.raid]
            return argv + list(cfg.mkfs_options) + ["--", *devices]
        # `--`: no option can be read as a device, nor a device as an option.
        if cfg.fs == "xfs":
            return ["mkfs.xfs", "-f", *cfg.mkfs_options, "--", target]
        return [f"mkfs.{cfg.fs}", "-F", "-q", *EXT_MKFS_DEFAULTS, *cfg.mkfs_options, "--", target]

    def plan_commands(self, name: str) -> "list[list[str]]":
        """Every provisioning command for `name`, with <loopN>/<md> where the device is picked at run time."""
        cfg = self._config(name)
        return [] if cfg.existing else self._render(cfg, {})

    def _render(self, cfg: FilesystemConfig, refs: dict) -> "list[list[str]]":
        return [self._command(step, [refs.get(a.name, repr(a)) if isinstance(a, Ref) else a for a in step.argv]).argv
                for step in self._steps(cfg)]

    def _command(self, step: Step, argv: list) -> RemoteCommand:
        """What runs for a step whose Refs are resolved in `argv` (a remote action: the host's python)."""
        return remote_command(self.host, step.remote, *argv) if step.remote else RemoteCommand(list(argv))

    # ------------------------------------------------------------ preflight

    def preflight(self, names: Optional[Sequence[str]] = None) -> "list[str]":
        """Problems that would stop `ensure` for these entries (default: all). Runs only read-only probes."""
        wanted = list(self.configs) if names is None else list(names)
        problems = [f"filesystem {n!r} is not defined under 'filesystems:'" for n in wanted if n not in self.configs]
        cfgs = [self.configs[n] for n in wanted if n in self.configs]
        h = self.host.name
        provisioned = [c for c in cfgs if not c.existing]
        if provisioned:
            uid = self.host.run(["id", "-u"]).stdout.strip()
            if uid != "0":
                problems.append(f"{h}: provisioning filesystems needs root (running as uid {uid or '?'})")
            # The host's python: loop autoclear and the exclusive-open check (zcorch.worker.remote).
            tools = {"mount", "umount", "findmnt", "lsblk", "wipefs", "realpath", "losetup", host_python(self.host)}
            tools |= {f"mkfs.{c.fs}" for c in provisioned} | {"btrfs" for c in provisioned if c.fs == "btrfs"}
            tools |= {"mdadm" for c in provisioned if c.uses_md} | {"truncate" for c in provisioned if c.loop_count}
            missing = sorted(t for t in tools if not has_tool(self.host, t))
            if missing:
                problems.append(f"{h}: missing {', '.join(missing)} (scripts/install-system-deps installs "
                                f"util-linux, e2fsprogs, xfsprogs, btrfs-progs, mdadm)")
            kernel_fs = set((read_text(self.host, "/proc/filesystems") or "").split())
            for fs in sorted({c.fs for c in provisioned}):
                if fs not in kernel_fs and not self.host.run(["modprobe", "-n", "-q", fs]).ok:
                    problems.append(f"{h}: the kernel has no {fs} support (not in /proc/filesystems, no module)")
            md_users = [c.name for c in provisioned if c.uses_md]
            if md_users and not md_supported(self.host):
                problems.append(f"{h}: filesystem(s) {', '.join(md_users)} need md RAID but this kernel has no "
                                f"md driver (/proc/mdstat missing); use btrfs raid profiles or another host")
            if any(c.loop_count for c in provisioned) and not self.host.run(["test", "-e", "/dev/loop-control"]).ok:
                problems.append(f"{h}: no loop device support (/dev/loop-control missing)")
        for c in cfgs:
            where = f"filesystem {c.name!r}"
            if c.existing:
                if not is_dir(self.host, c.path):
                    problems.append(f"{h}: {where}: path {c.path} is not an existing directory")
                continue
            for dev in c.devices:
                problems += device_problems(self.host, dev, dev in c.allow_destroy, f"{h}: {where}")
            if c.loop_count:
                problems += self._space_problems(c)
            try:
                mnt = self.mountpoint(c.name)
            except ConfigError as exc:
                problems.append(f"{h}: {exc}")
                continue
            if c.mountpoint and findmnt_target(self.host, mnt) is not None:
                problems.append(f"{h}: {where}: mountpoint {mnt} is already a mountpoint")
        return problems

    def _space_problems(self, cfg: FilesystemConfig) -> "list[str]":
        # Sparse backing files a sweep fills: running out under a loop device means I/O errors mid-cell.
        need = cfg.loop_count * cfg.loop_size
        d = cfg.loop_dir or self.state_dir
        while d != "/" and not is_dir(self.host, d):
            d = posixpath.dirname(d)
        res = self.host.run(["df", "-B1", "--output=avail", d])
        lines = res.stdout.split()
        if not res.ok or len(lines) < 2 or not lines[-1].isdigit():
            return [f"{self.host.name}: filesystem {cfg.name!r}: cannot read free space of {d}: {res.stderr.strip()}"]
        avail = int(lines[-1])
        if avail < need:
            return [f"{self.host.name}: filesystem {cfg.name!r}: backing files need {format_size(need)} "
                    f"but {d} has {format_size(avail)} free (set loop.dir or smaller loop.size)"]
        return []

    # ------------------------------------------------------------ provisioning

    def _mkdir_p(self, path: str, what: str) -> None:
        argv = ["mkdir", "-p", path]
        self.log(f"[{self.host.name}] {shlex.join(argv)}")
        run_checked(self.host, argv, what)

    def _state_file(self) -> StateFile:
        """The state file, created with the session directory on first use (its own dirs recorded too)."""
        if self._state is None:
            state = StateFile(self.host, self.state_dir, self.token)
            # Before the first change: a controller lost from here on leaves a host that undoes it by itself.
            self._watchdog = Watchdog.arm(self.host, host_python(self.host), "fs", state.path,
                                          {**state.data["owner"], "token": self.token})
            session = self._session_dir()
            # Only the session directory is recorded: the state directory (where state files live) stays.
            if not is_dir(self.host, session):
                state.resources(SESSION).append({"kind": "dir", "path": session})
            self._mkdir_p(session, "creating zcorch's filesystem state directory")
            state.save()
            self._state = state
            ACTIVE_TOKENS.add(self.token)
        return self._state

    def _missing_dirs(self, path: str) -> "list[str]":
        """`path` and its missing ancestors, outermost first."""
        missing: list = []
        while path not in ("/", "") and not is_dir(self.host, path):
            missing.insert(0, path)
            path = posixpath.dirname(path)
        return missing

    def _mkdirs(self, name: str, path: str, beneath: Optional[str] = None) -> None:
        """mkdir -p, recording each directory made (undo removes exactly those); below `beneath` by the host's
        mkdir-beneath (no link followed)."""
        missing = self._missing_dirs(path)
        if not missing:
            return
        state = self._state_file()
        state.resources(name).extend({"kind": "dir", "path": d} for d in missing)
        state.save()
        if beneath is None or not path.startswith(beneath + "/"):
            self._mkdir_p(path, f"filesystem {name!r}")
            return
        if any(d == beneath or beneath.startswith(d + "/") for d in missing):
            self._mkdir_p(beneath, f"filesystem {name!r}")
        cmd = remote_command(self.host, "mkdir-beneath", beneath, path)
        self.log(f"[{self.host.name}] {cmd.display()}")
        run_checked(self.host, cmd.argv, f"filesystem {name!r}", input=cmd.input, env=cmd.env)

    def ensure(self, name: str) -> str:
        """Mountpoint of `name`, provisioned on the first call; later calls check it is still mounted."""
        cfg = self._config(name)
        if cfg.existing:
            if name not in self._descriptions:
                if not is_dir(self.host, cfg.path):
                    raise HostError(f"{self.host.name}: filesystem {name!r}: {cfg.path} is not an existing directory")
                self._descriptions[name] = self._describe_existing(cfg)
            return cfg.path
        if name in self._mounted:
            mnt = self._mounted[name]
            if not self.dry_run and findmnt_target(self.host, mnt) is None:
                raise HostError(f"{self.host.name}: filesystem {name!r} is no longer mounted at {mnt} (unmounted "
                                "outside this sweep?): its runs are refused rather than written below it")
            return mnt
        mnt = self.mountpoint(name)
        if self.dry_run:
            for argv in self.plan_commands(name):
                self.log(f"[{self.host.name}] (dry run) {shlex.join(argv)}")
            self._mounted[name] = mnt
            return mnt
        try:
            refs = self._provision(cfg)
        except BaseException as exc:  # also Ctrl-C: never leave a half-built configuration behind
            undone, errors = self._undo(name)
            if isinstance(exc, HostError):
                extra = f" (cleanup failed too: {'; '.join(errors)})" if errors else ""
                raise HostError(f"{exc}{extra}") from exc
            raise
        self._mounted[name] = mnt
        self._descriptions[name] = self._describe_provisioned(cfg, refs)
        return mnt

    def _provision(self, cfg: FilesystemConfig) -> dict:
        state = self._state_file()
        state.resources(cfg.name)
        refs: dict = {}
        where = f"filesystem {cfg.name!r}"
        for step in self._steps(cfg):
            if step.mkdir:
                self._mkdirs(cfg.name, step.mkdir, step.beneath)
                continue
            problems: list = []
            for dev in step.check_devices:
                problems += device_problems(self.host, dev, dev in cfg.allow_destroy, f"{self.host.name}: {where}")
            if problems:
                raise HostError("\n".join(problems))
            if any(isinstance(a, Ref) and a.name == "md" for a in step.argv):
                refs["md"] = self._free_md_device()
            cmd = self._command(step, _resolve(step.argv, refs))
            if step.record is not None:
                state.add(cfg.name, _resolve(step.record, refs))
            self.log(f"[{self.host.name}] {cmd.display()}")  # names the module a remote step gets on stdin
            res = run_checked(self.host, cmd.argv, where, timeout=600.0, input=cmd.input, env=cmd.env)
            if step.bind:
                refs[step.bind] = res.stdout.strip()
                # Note the name too: not needed for undo (losetup -j finds it) but readable.
                state.resources(cfg.name)[-1]["device"] = refs[step.bind]
                state.save()
        return refs

    def _free_md_device(self) -> str:
        used = set(self.host.run(["ls", "-1", "/sys/block"]).stdout.split())
        for n in range(100, 1000):
            if f"md{n}" not in used and not self.host.run(["test", "-e", f"/dev/md{n}"]).ok:
                return f"/dev/md{n}"
        raise HostError(f"{self.host.name}: no free md device number between md100 and md999")

    # ------------------------------------------------------------ teardown

    def _undo(self, name: str) -> "tuple[list[str], list[str]]":
        """Undo `name`'s resources newest first by the host's watchdog code, this manager's record trusted;
        stops at the first failure (what stays stays recorded)."""
        if self._state is None:
            return [], []
        out = _restore_on_host(self.host, self._state.path, None, self.log, "--trusted", f"--config={name}")
        self._state.data["configs"] = out.get("configs", self._state.data["configs"])
        self._mounted.pop(name, None)
        return out["restored"], out["errors"]

    def release(self, name: str) -> None:
        """Tear down one provisioned configuration (no-op for `path` entries and in dry run)."""
        cfg = self._config(name)
        if cfg.existing or self.dry_run:
            self._mounted.pop(name, None)
            return
        _undone, errors = self._undo(name)
        if errors:
            raise HostError(f"filesystem {name!r}: teardown incomplete (kept in {self._state.path} for "
                            f"cleanup_stale): {'; '.join(errors)}")

    def teardown_all(self) -> None:
        """Undo everything this manager created, newest first. Idempotent. HostError lists what remains."""
        if self._state is None:
            self._mounted.clear()
            return
        errors: list = []
        for name in reversed([n for n in self._state.data["configs"] if n != SESSION]):
            errors += self._undo(name)[1]
        if not errors:
            errors += self._undo(SESSION)[1]
        if errors:
            raise HostError(f"{self.host.name}: filesystem teardown incomplete (kept in {self._state.path} "
                            f"for cleanup_stale): {'; '.join(errors)}")
        self._state.delete()
        self._state = None
        if self._watchdog is not None:   # all undone by us: the watchdog stands down
            self._watchdog.confirm()
            self._watchdog = None
        ACTIVE_TOKENS.discard(self.token)

    @staticmethod
    def cleanup_stale(host: Host, state_dir: str, log: Optional[Log] = None, leased: bool = False,
                      python: Optional[str] = None) -> "list[str]":
        """Undo what dead managers' state files list, by the host's watchdog code (only the user's own files,
        within their runs' directories); returns what was undone. leased: the caller holds the receiver's Lease."""
        log = log or (lambda _m: None)
        state_dir = _expand_home(host, state_dir)
        if not leased and lease_held(host, state_dir):
            log(f"{state_dir}: a sweep holds this receiver's lease: its filesystems are left alone")
            return []
        done: list = []
        problems: list = []
        for path in list_state_files(host, state_dir):
            try:
                data = json.loads(read_text(host, path) or "")
                data["configs"]
            except (ValueError, KeyError, TypeError):
                problems.append(f"{path}: unreadable state file, left in place")
                continue
            if owner_alive(data):
                log(f"{path}: controller pid {data['owner']['pid']} is still running: left alone")
                continue
            out = _restore_on_host(host, path, python, log)
            done += out["restored"]
            problems += out["errors"]
        if problems:
            raise HostError(f"{host.name}: stale filesystem cleanup incomplete: {'; '.join(problems)}"
                            + (f" (undone: {'; '.join(done)})" if done else ""))
        return done

    # ------------------------------------------------------------ description

    def describe(self, name: str) -> dict:
        """What meta.json records for `name`: requested settings plus what the kernel reports once provisioned."""
        cfg = self._config(name)
        if name in self._descriptions:
            return dict(self._descriptions[name])
        if cfg.existing:
            return {"name": name, "kind": "existing", "path": cfg.path}
        return {"name": name, "kind": "provisioned", "provisioned": False, **self._requested(cfg),
                "commands": self.plan_commands(name)}

    def _requested(self, cfg: FilesystemConfig) -> dict:
        d = {"fs": cfg.fs, "raid": cfg.raid, "mkfs_options": list(cfg.mkfs_options),
             "mount_options_requested": list(cfg.mount_options), "mountpoint": self.mountpoint(cfg.name)}
        if cfg.loop_count:
            d["loop"] = {"count": cfg.loop_count, "size_bytes": cfg.loop_size, "direct_io": cfg.loop_direct_io,
                         "dir": self._backing_dir(cfg)}
        else:
            d["allow_destroy"] = list(cfg.allow_destroy)
        if cfg.raid_chunk:
            d["raid_chunk_bytes"] = cfg.raid_chunk
        return d

    def _mount_facts(self, path: str, contains: bool) -> dict:
        entry = findmnt_target(self.host, path, contains=contains) or {}
        opts = split_options(entry.get("options") or "")
        return {"mount_source": entry.get("source"), "mount_target": entry.get("target"),
                "fstype": entry.get("fstype"), "mount_options": opts,
                "size_bytes": _int(entry.get("size")), "avail_bytes": _int(entry.get("avail"))}

    def _describe_existing(self, cfg: FilesystemConfig) -> dict:
        return {"name": cfg.name, "kind": "existing", "path": cfg.path, **self._mount_facts(cfg.path, True)}

    def _describe_provisioned(self, cfg: FilesystemConfig, refs: dict) -> dict:
        mnt = self.mountpoint(cfg.name)
        d = {"name": cfg.name, "kind": "provisioned", "provisioned": True, **self._requested(cfg),
             **self._mount_facts(mnt, False)}
        d["commands"] = self._render(cfg, refs)
        devices = [refs[f"loop{i}"] for i in range(cfg.loop_count)] if cfg.loop_count else list(cfg.devices)
        d["devices"] = [{"path": dev, "size_bytes": self._device_size(dev)} for dev in devices]
        if cfg.loop_count:
            for i, dev in enumerate(d["devices"]):
                dev["backing_file"] = posixpath.join(self._backing_dir(cfg), f"dev{i}.img")
        # Options the kernel dropped or renamed are worth seeing next to the numbers.
        d["mount_options_missing"] = [o for o in cfg.mount_options if o not in d["mount_options"]]
        if cfg.fs == "btrfs":
            res = self.host.run(["btrfs", "filesystem", "df", "-b", mnt])
            d["raid_kernel"] = parse_btrfs_df(res.stdout) if res.ok else {"error": res.stderr.strip()}
        elif cfg.uses_md:
            res = self.host.run(["mdadm", "--detail", refs["md"]])
            d["raid_kernel"] = ({"device": refs["md"], **parse_mdadm_detail(res.stdout)} if res.ok
                                else {"error": res.stderr.strip()})
        else:
            d["raid_kernel"] = None
        return d

    def _device_size(self, dev: str) -> Optional[int]:
        res = self.host.run(["blockdev", "--getsize64", dev])
        return _int(res.stdout.strip()) if res.ok else None


def _int(v) -> Optional[int]:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _restore_on_host(host: Host, path: str, python: Optional[str], log: Log, *flags: str) -> dict:
    """restore_fs (zcorch.worker.watchdog) of state file `path` on `host`: {"restored", "errors"[, "configs"]}."""
    res = run_remote(host, "restore-fs", path, *flags, python=python, module=WATCHDOG_MODULE, timeout=300.0)
    out = remote_json(res)
    if out is None:
        return {"restored": [], "errors": [f"{path}: not undone: {(res.stderr or res.stdout).strip()[-300:]}"]}
    for what in out["restored"]:
        log(f"[{host.name}] {what}")
    return out


def _expand_home(host: Host, path: str) -> str:
    """`~/x` expanded on the host itself (argv is never given to a shell, so ~ would stay literal)."""
    if path == "~" or path.startswith("~/"):
        home = run_checked(host, ["printenv", "HOME"], "reading $HOME").stdout.strip()
        path = home + path[1:]
    if not path.startswith("/"):
        raise ConfigError(f"filesystem state directory must be absolute (or start with ~/), got {path!r}")
    return posixpath.normpath(path)
