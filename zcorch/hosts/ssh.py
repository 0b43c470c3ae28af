"""SSH hosts: the Host interface over one persistent paramiko connection per host.

The ssh config is data, not code: `Match exec` is refused unless allowed, ProxyCommand, LocalCommand and
KnownHostsCommand never run; unknown host keys are refused unless accepted, changed ones always. The login
shell only sees a constant wrapper (argv travels on stdin); every remote operation has a deadline.
Details: docs/architecture.md, "Host interface" and "SSH, deploy, preflight, lab".
"""
from __future__ import annotations

import base64
import contextlib
import getpass
import hashlib
import os
import posixpath
import re
import shlex
import signal
import socket
import sys
import threading
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Mapping, Optional, Sequence


def _import_paramiko_without_invoke():
    """paramiko.config imports invoke (slow) only for `Match exec`, refused unless allowed: hide it here,
    _allow_match_exec gives it back."""
    hidden = "invoke" not in sys.modules
    if hidden:
        sys.modules["invoke"] = None   # `import invoke` raises ImportError: paramiko keeps the error for later
    try:
        import paramiko
    finally:
        if hidden and sys.modules.get("invoke", 0) is None:
            del sys.modules["invoke"]
    return paramiko


paramiko = _import_paramiko_without_invoke()

from zcorch.config.hosts import Hosts, HostSpec
from zcorch.errors import ConfigError, HostError, ZcorchError
from zcorch.hosts import critical
from zcorch.hosts.local import CommandResult, Host, Process, _LineReader, _waiting_for, expand_home

DEFAULT_CONNECT_TIMEOUT = 10.0
# First stdout line of every wrapped command (the group from /proc: the login shell may fork, not exec).
_PID_TAG = "zcorch-pid"
# A shell function gets its own "$@", so the fields of /proc/$$/stat after "(comm) " land in $1..$n
# without clobbering the command's arguments ($3 is the process group).
_WRAPPER = ('f() { echo "%s $$ $3"; }; read -r s < /proc/$$/stat; f ${s##*) }; exec "$@"' % _PID_TAG)
# Rebuilds "$@" from stdin (_encode_argv): line 1 is "ESC N" (ESC sent, not written here: fish mangles a
# backslash in single quotes); a short read exits 125, never runs a shorter command.
_READ_ARGV = ('read -r e n || exit 125; i=0; while [ "$i" -lt "$n" ]; do read -r a || exit 125; '
              'case $a in *"$e"*) a=$(printf "%bx" "$a"); a=${a%x};; esac; set -- "$@" "$a"; i=$((i+1)); done')
_ARGV_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./=:,+@%-")
DEFAULT_OP_TIMEOUT = 30.0
# A dead link: unacknowledged data (the keepalives) aborts the TCP connection after this long.
_TCP_USER_TIMEOUT_MS = 60_000
_KEEPALIVE_S = 15


def _login_shell_command(script: str) -> str:
    """The constant string the login shell parses: portable across sh, fish and csh."""
    assert not set(script) & set("'\\!\n"), script
    return f"exec /bin/sh -c '{script}'"


_RUN_WRAPPED = _login_shell_command(_READ_ARGV + "; " + _WRAPPER)
_RUN_PLAIN = _login_shell_command(_READ_ARGV + '; exec "$@"')


def _encode_argv(argv: Sequence[str]) -> bytes:
    """argv for _READ_ARGV: bytes outside a safe set as printf %b octal escapes, one line per argument."""
    lines = ["\\ %d" % len(argv)]
    for arg in argv:
        raw = arg.encode("utf-8", "surrogateescape")
        if b"\0" in raw:
            raise HostError(f"argument {arg!r} contains a NUL byte, which no command line can carry")
        lines.append("".join(chr(c) if c in _ARGV_SAFE else "\\0%03o" % c for c in raw))
    return ("\n".join(lines) + "\n").encode("ascii")


@dataclass
class Target:
    """Where and how to connect, after the ssh config and the host spec were applied."""

    alias: str                    # what the user wrote (for messages)
    hostname: str
    port: int = 22
    user: Optional[str] = None
    identity_files: List[str] = field(default_factory=list)
    identities_only: bool = False
    known_hosts: List[str] = field(default_factory=list)   # files consulted, in order
    jumps: List["Target"] = field(default_factory=list)     # ProxyJump chain, first hop first

    @property
    def known_hosts_key(self) -> str:
        """The name under which known_hosts stores this host (OpenSSH's [host]:port form)."""
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"

    def describe(self) -> str:
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port != 22 else ""
        return f"{user}{self.hostname}{port}"


def parse_destination(dest: str) -> "tuple[Optional[str], str, Optional[int]]":
    """`[user@]host[:port]` (or `[v6addr]:port`) -> (user, host, port). Pure."""
    if not isinstance(dest, str) or not dest.strip():
        raise HostError(f"ssh destination must be a non-empty string like root@10.0.0.2, got {dest!r}")
    dest = dest.strip()
    if dest.startswith("ssh://"):
        dest = dest[len("ssh://"):]
    user = None
    if "@" in dest:
        user, dest = dest.rsplit("@", 1)
    port = None
    if dest.startswith("["):
        host, _, rest = dest[1:].partition("]")
        if rest.startswith(":"):
            port = rest[1:]
    elif dest.count(":") == 1:
        host, port = dest.split(":")
    else:
        host = dest
    if port is not None:
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise HostError(f"ssh destination {dest!r}: port must be 1-65535")
        port = int(port)
    if not host:
        raise HostError(f"ssh destination {dest!r} has no host")
    return user or None, host, port


def match_exec_lines(text: str) -> "list[int]":
    """Line numbers of `Match ... exec CMD` (also `!exec`, `Match=...`, any case): reading such a config
    runs CMD through a shell on this machine (paramiko, as ssh does), before any connection."""
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        m = re.match(r"\s*match(?:\s*=\s*|\s+)(.*)$", line, re.IGNORECASE)
        if not m:
            continue
        try:
            words = shlex.split(m.group(1), comments=True)
        except ValueError:
            words = m.group(1).split()
        if any(w.lower().lstrip("!").split("=", 1)[0] == "exec" for w in words):
            found.append(n)
    return found


def _allow_match_exec() -> None:
    """Give paramiko.config the invoke that _import_paramiko_without_invoke hid (what runs `Match exec`)."""
    import paramiko.config

    if getattr(paramiko.config, "invoke", ...) is None:
        import invoke

        paramiko.config.invoke = invoke


def _load_config(path: Optional[str], allow_exec: bool = False) -> paramiko.SSHConfig:
    if path is None and not os.path.exists(os.path.expanduser("~/.ssh/config")):
        return paramiko.SSHConfig()
    path = os.path.expanduser("~/.ssh/config" if path is None else path)
    try:
        if not allow_exec:
            lines = match_exec_lines(Path(path).read_text(encoding="utf-8", errors="replace"))
            if lines:
                raise ConfigError(f"{path}:{lines[0]}: `Match ... exec` would run a shell command on this machine "
                                  f"(as {getpass.getuser()}) while zcorch reads the ssh config: it is run only with "
                                  "--allow-ssh-config-exec (the dry run never runs it); or remove the `exec` "
                                  "criterion" + (f" (also on line(s) {', '.join(map(str, lines[1:]))})"
                                                 if len(lines) > 1 else ""))
        if allow_exec:
            _allow_match_exec()
        return paramiko.SSHConfig.from_path(path)
    except OSError as exc:
        raise HostError(f"cannot read ssh config {path}: {exc}") from None
    except ConfigError:
        raise
    except Exception as exc:  # paramiko raises ConfigParseError and friends
        raise HostError(f"bad ssh config {path}: {exc}") from None


def resolve_target(spec: HostSpec, _config: Optional[paramiko.SSHConfig] = None,
                   _dest: Optional[str] = None, _depth: int = 0, allow_exec: bool = False) -> Target:
    """Apply the ssh config and the spec's keys to `spec.ssh` (no network); `Match exec` needs `allow_exec`."""
    config = _config if _config is not None else _load_config(spec.ssh_config, allow_exec)
    dest = _dest if _dest is not None else spec.ssh
    user, host, port = parse_destination(dest)
    opts = config.lookup(host)
    hostname = opts.get("hostname", host)
    port = port or int(opts.get("port", 22))
    user = user or opts.get("user")
    idents = [os.path.expanduser(p) for p in opts.get("identityfile", [])]
    known = [os.path.expanduser(p) for p in opts.get("userknownhostsfile", "").split()]
    if _depth == 0:
        if spec.identity_file:
            idents.insert(0, os.path.expanduser(spec.identity_file))
        if spec.known_hosts:
            known.insert(0, os.path.expanduser(spec.known_hosts))
    default_known = os.path.expanduser("~/.ssh/known_hosts")
    if default_known not in known:
        known.append(default_known)
    target = Target(alias=dest, hostname=hostname, port=port, user=user, identity_files=idents,
                    identities_only=opts.get("identitiesonly", "no").lower() == "yes",
                    known_hosts=known)
    jump = opts.get("proxyjump")
    if jump and jump.lower() != "none":
        if _depth > 5:
            raise HostError(f"ProxyJump chain for {dest!r} is longer than 5 hops (a loop?)")
        for hop in jump.split(","):
            hop_target = resolve_target(spec, config, hop.strip(), _depth + 1)
            # The spec's identity/known_hosts apply to every hop of the chain too.
            hop_target.identity_files += [p for p in target.identity_files if p not in hop_target.identity_files]
            hop_target.known_hosts = list(dict.fromkeys(target.known_hosts + hop_target.known_hosts))
            target.jumps.extend(hop_target.jumps + [hop_target])
            hop_target.jumps = []
    return target


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style SHA256 fingerprint (what `ssh-keygen -lf` prints)."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class _HostKeyCheck(paramiko.MissingHostKeyPolicy):
    """Refuse unknown keys with a message that says how to fix it, or record them when allowed."""

    def __init__(self, name: str, target: Target, accept_new: bool, save_to: str):
        self.name, self.target, self.accept_new, self.save_to = name, target, accept_new, save_to

    def missing_host_key(self, client, hostname, key):
        fp = fingerprint(key)
        if not self.accept_new:
            raise HostError(
                f"{self.name} ({self.target.describe()}): unknown host key {key.get_name()} {fp} — "
                f"add it to {self.save_to} (e.g. ssh-keyscan -p {self.target.port} {self.target.hostname} "
                f">> {self.save_to}, after checking the fingerprint) or pass --accept-new-host-keys")
        os.makedirs(os.path.dirname(self.save_to) or ".", exist_ok=True)
        with open(self.save_to, "a") as f:
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


def _known_host_keys(files: Sequence[str]) -> paramiko.HostKeys:
    keys = paramiko.HostKeys()
    for path in files:
        if os.path.exists(path):
            try:
                keys.load(path)
            except (OSError, UnicodeDecodeError) as exc:
                raise HostError(f"cannot read known_hosts file {path}: {exc}") from None
    return keys


def _open_client(name: str, target: Target, accept_new: bool, timeout: float,
                 sock=None) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    # All known_hosts files as "system" keys (never rewritten); new keys go to the first one.
    for host, entries in _known_host_keys(target.known_hosts).items():
        for keytype, key in entries.items():
            client.get_host_keys().add(host, keytype, key)
    save_to = target.known_hosts[0]
    client.set_missing_host_key_policy(_HostKeyCheck(name, target, accept_new, save_to))
    where = f"{name} ({target.describe()})"
    own_sock = None
    try:   # whatever fails, the client and the socket it opened are closed
        try:
            if sock is None:
                sock = own_sock = socket.create_connection((target.hostname, target.port), timeout=timeout)
                # Small request/response packets: without NODELAY each command waits out a delayed ACK (~40 ms).
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client.connect(
                target.hostname, port=target.port, username=target.user or getpass.getuser(),
                key_filename=[p for p in target.identity_files if os.path.exists(p)] or None,
                look_for_keys=not target.identities_only, allow_agent=not target.identities_only,
                timeout=timeout, banner_timeout=timeout, auth_timeout=timeout, channel_timeout=timeout,
                sock=sock)
        except paramiko.BadHostKeyException as exc:
            raise HostError(
                f"{where}: HOST KEY CHANGED — got {exc.key.get_name()} {fingerprint(exc.key)}, known_hosts has "
                f"{fingerprint(exc.expected_key)}. Refusing to connect (also with --accept-new-host-keys). If the "
                f"host was really reinstalled, remove the old entry: ssh-keygen -R '{target.known_hosts_key}' "
                f"-f {' -f '.join(target.known_hosts[:1])}") from None
        except paramiko.AuthenticationException as exc:
            raise HostError(f"{where}: authentication failed ({exc}); tried keys "
                            f"{target.identity_files or 'from ~/.ssh'} and the ssh agent") from None
        except (socket.timeout, TimeoutError) as exc:
            raise HostError(f"{where}: no answer within {timeout:.0f}s (connect timeout): "
                            f"{exc or 'timed out'}") from None
        except (OSError, paramiko.SSHException, EOFError) as exc:
            raise HostError(f"{where}: cannot connect: {exc or type(exc).__name__}") from None
    except BaseException:
        client.close()
        if own_sock is not None:
            own_sock.close()
        raise
    return client


def connect(spec: HostSpec, name: str, accept_new_host_keys: bool = False,
            connect_timeout: float = DEFAULT_CONNECT_TIMEOUT, allow_config_exec: bool = False) -> "SSHHost":
    """The persistent connection to one host of `hosts:`; HostError (naming `name`) within about
    `connect_timeout` s per hop."""
    target = resolve_target(spec, allow_exec=allow_config_exec)
    clients = []
    sock = None
    try:
        for hop in target.jumps + [target]:
            if clients:  # tunnel to this hop through the previous one (ProxyJump)
                try:
                    sock = clients[-1].get_transport().open_channel(
                        "direct-tcpip", (hop.hostname, hop.port), ("127.0.0.1", 0), timeout=connect_timeout)
                except (paramiko.SSHException, OSError) as exc:
                    raise HostError(f"{name}: ProxyJump {clients[-1]._zcorch_desc} cannot reach "
                                    f"{hop.describe()}: {exc}") from None
            hop_name = name if hop is target else f"{name} via jump host {hop.alias}"
            client = _open_client(hop_name, hop, accept_new_host_keys, connect_timeout, sock)
            client._zcorch_desc = hop.describe()
            clients.append(client)
    except BaseException:
        for c in reversed(clients):
            c.close()
        raise
    return SSHHost(name, target, clients, spec)


def _text_readline(f):
    """Text readline over a paramiko channel file (which gives bytes)."""
    return lambda: f.readline().decode("utf-8", "replace")


class SSHProcess(Process):
    """A command started over SSH; `pgid` is its remote process group."""

    def __init__(self, host: "SSHHost", channel: paramiko.Channel, startup_timeout: float = 30.0):
        self.host = host
        self.channel = channel
        self._killed_with: Optional[int] = None
        self._out = _LineReader(_text_readline(channel.makefile("rb")))
        self._drain_stderr(_text_readline(channel.makefile_stderr("rb")))
        try:
            first = self._out.readline(startup_timeout)
        except TimeoutError:
            channel.close()
            self.pid = self.pgid = None
            raise HostError(f"{host.where}: command did not start within {startup_timeout:g}s "
                            "(link stalled or host overloaded?)") from None
        if first is None or not first.startswith(_PID_TAG + " "):
            self.pid = self.pgid = None
            raise HostError(f"{host.name}: command did not start (got {first!r}; stderr: "
                            f"{self.stderr_text(wait=2.0).strip()!r})")
        _, pid, pgid = first.split()
        self.pid, self.pgid = int(pid), int(pgid)

    def readline(self, timeout: float) -> Optional[str]:
        return self._out.readline(timeout)

    def wait(self, timeout: float) -> int:
        # status_event is set by exit-status and by channel close.
        if not self.channel.status_event.wait(timeout):
            raise TimeoutError(f"still running after {timeout:.1f}s")
        status = self.channel.exit_status
        if status == -1:
            # paramiko ignores the "exit-signal" request: a command killed by a signal only closes its
            # channel. Report the signal we sent, else SIGKILL's number as "killed, cause unknown".
            return -(self._killed_with or signal.SIGKILL)
        return status

    def send_line(self, text: str) -> None:
        try:
            with critical.section(f"writing to a command's stdin on {self.host.name}"):
                self.channel.sendall((text + "\n").encode())
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise HostError(f"{self.host.name}: cannot write to the command's stdin: {exc}") from None

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        if self.pgid is None:
            return
        self._killed_with = int(sig)
        # A fresh channel: the command's own channel only carries its stdio.
        argv = ["kill", f"-{int(sig)}", "--", f"-{self.pgid}"]
        with critical.section(_waiting_for(self.host.name, argv)):
            self.host._exec_plain(argv, timeout=15.0)

    def close(self) -> None:
        with critical.section(f"closing a command's channel on {self.host.name}"):
            self.channel.close()


class SSHHost(Host):
    """One remote machine over a persistent paramiko Transport (a channel per command)."""

    is_local = False

    def __init__(self, name: str, target: Target, clients: list, spec: HostSpec):
        self.name = name
        self.target = target
        self.spec = spec
        self.data_address = spec.data_address
        self._clients = clients           # jump hosts first; the last one is this host
        self._client = clients[-1]
        self.op_timeout = DEFAULT_OP_TIMEOUT   # deadline of every remote operation (see the module doc)
        # Keepalives with TCP_USER_TIMEOUT: a dead link breaks the connection instead of TCP retrying for minutes.
        for client in clients:
            transport = client.get_transport()
            transport.set_keepalive(_KEEPALIVE_S)
            if isinstance(transport.sock, socket.socket) and hasattr(socket, "TCP_USER_TIMEOUT"):
                try:
                    transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, _TCP_USER_TIMEOUT_MS)
                except OSError:
                    pass  # not Linux: the per-operation deadlines still hold
        self._sftp: Optional[paramiko.SFTPClient] = None
        self._home: Optional[str] = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SSHHost({self.name!r}, {self.target.describe()!r})"

    def peer_address(self) -> Optional[str]:
        """The address our TCP connection goes to (the first jump host's): its route carries the session."""
        sock = getattr(self._clients[0].get_transport(), "sock", None)
        try:
            return str(sock.getpeername()[0]) if isinstance(sock, socket.socket) else None
        except OSError:
            return None

    @property
    def where(self) -> str:
        return f"{self.name} ({self.target.describe()})"

    def _channel(self, what: str = "") -> paramiko.Channel:
        during = f" ({what})" if what else ""
        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            raise HostError(f"{self.where}: connection lost{during}")
        try:
            return transport.open_session(timeout=self.op_timeout)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise HostError(f"{self.where}: cannot open a channel{during} within {self.op_timeout:g}s: "
                            f"{exc}") from None

    def _request(self, chan: paramiko.Channel, kind: str, value: str, what: str) -> None:
        """Channel.exec_command / invoke_subsystem with a deadline (paramiko's wait forever)."""
        m = paramiko.Message()
        m.add_byte(paramiko.common.cMSG_CHANNEL_REQUEST)
        m.add_int(chan.remote_chanid)
        m.add_string(kind)
        m.add_boolean(True)
        m.add_string(value)
        try:
            chan._event_pending()
            chan.transport._send_user_message(m)
            if not chan.event.wait(self.op_timeout):
                chan.close()
                raise HostError(f"{self.where}: {what}: no answer within {self.op_timeout:g}s "
                                "(link stalled or sshd frozen?)")
            if not chan.event_ready:
                raise chan.transport.get_exception() or paramiko.SSHException("channel closed")
        except (paramiko.SSHException, OSError, EOFError) as exc:
            chan.close()
            raise HostError(f"{self.where}: {what} failed: {exc or type(exc).__name__}") from None

    def _exec(self, argv: Sequence[str], env: Optional[Mapping[str, str]], wrap: bool) -> paramiko.Channel:
        """A channel running argv: the login shell only ever sees a constant (see the module doc)."""
        argv = [str(a) for a in argv]
        if env:
            argv = ["env", *[f"{k}={v}" for k, v in env.items()], *argv]
        what = f"starting {shlex.join(argv)[:200]}"
        header = _encode_argv(argv)
        chan = self._channel(what)
        self._request(chan, "exec", _RUN_WRAPPED if wrap else _RUN_PLAIN, what)
        try:
            chan.sendall(header)  # a few hundred bytes: well inside the channel's first window
        except (OSError, EOFError, paramiko.SSHException) as exc:
            chan.close()
            raise HostError(f"{self.where}: {what}: cannot send its arguments: {exc}") from None
        return chan

    def _exec_plain(self, argv: Sequence[str], timeout: float) -> CommandResult:
        chan = self._exec(argv, None, wrap=False)
        chan.shutdown_write()
        out, err = _collect(chan, timeout)
        status = chan.exit_status if chan.status_event.is_set() else -1
        chan.close()
        return CommandResult([str(a) for a in argv], status, out, err)

    def _run(self, argv: List[str], timeout: float, env: Optional[Mapping[str, str]],
             input: Optional[str]) -> CommandResult:
        chan = self._exec(argv, env, wrap=True)
        if input is not None:
            chan.settimeout(max(timeout, self.op_timeout))  # a stalled reader must not block us forever
            try:
                chan.sendall(input.encode())
            except (OSError, EOFError, paramiko.SSHException) as exc:
                chan.close()
                raise HostError(f"{self.where}: cannot send input to {shlex.join(argv)[:200]}: "
                                f"{exc or type(exc).__name__}") from None
        chan.shutdown_write()
        out, err = _collect(chan, timeout)
        tag, _, out = out.partition("\n")
        finished = chan.status_event.is_set() and (chan.exit_status_ready() or chan.closed)
        if not finished:
            parts = tag.split()
            if len(parts) == 3 and parts[0] == _PID_TAG:
                self._exec_plain(["kill", "-KILL", "--", f"-{int(parts[2])}"], timeout=15.0)
            chan.close()
            return CommandResult(argv, -signal.SIGKILL, out, err + f"\n(timed out after {timeout:.1f}s)")
        status = chan.exit_status
        chan.close()
        if not tag.startswith(_PID_TAG):  # the wrapper itself failed (no sh?): keep everything
            out = tag + ("\n" + out if out else "")
        return CommandResult(argv, status if status != -1 else -signal.SIGKILL, out, err)

    def start(self, argv, env=None) -> SSHProcess:
        """Start argv; the Process reads stdout lines and can signal the whole remote process group."""
        with critical.section(_waiting_for(self.name, argv, "starting ")):   # started with its pid known
            chan = self._exec(argv, env, wrap=True)
            # stdin stays open: sshd closes it when this controller dies (--exit-on-stdin-eof obeys it).
            return SSHProcess(self, chan)

    # -- files -------------------------------------------------------------------------------
    @property
    def home(self) -> str:
        """The remote user's home directory (remote commands start there)."""
        if self._home is None:
            with self._sftp_call("finding the home directory") as sftp:
                self._home = sftp.normalize(".")
        return self._home

    def expand(self, path: str) -> str:
        """Remote `~` and relative paths -> absolute (commands are quoted, so no shell expands them)."""
        return expand_home(self.home, path)

    def sftp(self) -> paramiko.SFTPClient:
        """The host's SFTP session; every call on it raises socket.timeout after op_timeout s."""
        with self._lock:
            if self._sftp is None:
                chan = self._channel("starting sftp")
                self._request(chan, "subsystem", "sftp", "starting sftp")
                chan.settimeout(self.op_timeout)  # every later SFTP request has this deadline too
                try:
                    self._sftp = paramiko.SFTPClient(chan)
                except (paramiko.SSHException, OSError, EOFError) as exc:
                    chan.close()
                    stalled = " (no answer: link stalled?)" if isinstance(exc, socket.timeout) else ""
                    raise HostError(f"{self.where}: cannot start sftp{stalled}: {exc}") from None
            return self._sftp

    @contextlib.contextmanager
    def _sftp_call(self, what: str):
        """Yields the SFTP session; a timed-out call drops it (replies out of step) and raises HostError."""
        with critical.section(f"{what} on {self.name}"):
            try:
                sftp = self.sftp()
            except HostError as exc:
                raise HostError(f"{exc} (while {what})") from None
            try:
                yield sftp
            except socket.timeout:
                with self._lock:
                    if self._sftp is sftp:
                        self._sftp = None
                sftp.close()
                raise HostError(f"{self.where}: {what}: no answer within {self.op_timeout:g}s "
                                "(link stalled or sshd frozen?)") from None

    def makedirs(self, remote_dir: str) -> None:
        remote_dir = self.expand(remote_dir)
        parts = [p for p in remote_dir.split("/") if p]
        path = ""
        with self._sftp_call(f"creating {remote_dir}") as sftp:
            for part in parts:
                path += "/" + part
                try:
                    sftp.stat(path)
                except FileNotFoundError:
                    try:
                        sftp.mkdir(path)
                    except socket.timeout:
                        raise
                    except OSError:
                        sftp.stat(path)  # created concurrently is fine; anything else raises
                except socket.timeout:
                    raise
                except OSError as exc:
                    raise HostError(f"{self.where}: cannot create {remote_dir}: {exc}") from None

    def put_bytes(self, data: bytes, remote_path: str, mode: int = 0o644) -> None:
        """Write atomically: a temp file next to the target, then rename over it."""
        remote_path = self.expand(remote_path)
        self.makedirs(posixpath.dirname(remote_path))
        tmp = f"{remote_path}.tmp{os.getpid()}.{time.monotonic_ns()}"
        with self._sftp_call(f"writing {remote_path}") as sftp:
            try:
                with sftp.open(tmp, "wb") as f:
                    f.set_pipelined(True)
                    f.write(data)
                sftp.chmod(tmp, mode)
                sftp.posix_rename(tmp, remote_path)
            except socket.timeout:
                raise  # _sftp_call: the session is gone, no clean-up over it
            except (OSError, paramiko.SSHException) as exc:
                with contextlib.suppress(OSError):
                    sftp.remove(tmp)
                raise HostError(f"{self.where}: cannot write {remote_path}: {exc}") from None

    def close(self) -> None:
        if self._sftp is not None:
            self._sftp.close()
            self._sftp = None
        for client in reversed(self._clients):
            client.close()


def _collect(chan: paramiko.Channel, timeout: float) -> "tuple[str, str]":
    """Read a channel's stdout and stderr together (neither window stalls the command) until it ends or
    `timeout` passes, sleeping (no poll) until data, EOF, the exit status or the close arrives."""
    out, err = [], []
    deadline = time.monotonic() + timeout
    wake = threading.Event()
    # Both buffers set the one event on data or close; their clear() (one buffer emptied) is ignored, as
    # the other may still hold data: the loop clears it itself before draining both.
    waker = types.SimpleNamespace(set=wake.set, clear=lambda: None)
    chan.in_buffer.set_event(waker)
    chan.in_stderr_buffer.set_event(waker)
    while True:
        wake.clear()   # before draining: whatever arrives after the drain sets it again
        # judged before the last drain: after the EOF or the close no more data comes, so none is left behind
        finished = chan.closed or (chan.exit_status_ready() and chan.eof_received)
        got = True
        while got:
            got = False
            if chan.recv_ready():
                out.append(chan.recv(65536))
                got = True
            if chan.recv_stderr_ready():
                err.append(chan.recv_stderr(65536))
                got = True
        if finished:
            break
        left = deadline - time.monotonic()
        if left <= 0:
            break
        if chan.eof_received:   # both streams ended: the exit status (or the close) is what is left to come
            chan.status_event.wait(left)
        else:
            wake.wait(left)
    return b"".join(out).decode("utf-8", "replace"), b"".join(err).decode("utf-8", "replace")


def open_hosts(section: Hosts, accept_new_host_keys: bool = False,
               connect_timeout: float = DEFAULT_CONNECT_TIMEOUT, allow_config_exec: bool = False) -> "dict[str, Host]":
    """{"sender": Host, "receiver": Host} of a `hosts:` section: one LocalHost for both roles, or an SSHHost
    per role, connected now (both hosts' problems reported together)."""
    from zcorch.hosts.local import LocalHost

    if section.localhost:
        local = LocalHost("localhost", "127.0.0.1")
        return {"sender": local, "receiver": local}
    from zcorch.hosts.parallel import per_host

    def one(role: str) -> "SSHHost | ZcorchError":
        try:
            return connect(section.spec(role), role, accept_new_host_keys, connect_timeout,
                           allow_config_exec=allow_config_exec)
        except ZcorchError as exc:   # HostError, or ConfigError (the ssh config's `Match exec`)
            return exc

    roles = ("sender", "receiver")
    found = dict(zip(roles, per_host(roles, one)))   # both connections at once
    errors = [v for v in found.values() if isinstance(v, ZcorchError)]
    if errors:
        for h in found.values():
            if not isinstance(h, ZcorchError):
                h.close()
        if any(not isinstance(e, HostError) for e in errors):
            raise next(e for e in errors if not isinstance(e, HostError))
        raise HostError("\n".join(map(str, errors)))
    return found
