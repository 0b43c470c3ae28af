"""`zcorch worker`: one side of a transfer, driven by the controller through JSON lines on stdout.

Flags and events: docs/architecture.md, "Worker command line and output". Any failure, a bad flag value too,
prints {"event": "error", "message", "code"} and exits 1. Runs as `python3 -m zcorch.worker ...` on the hosts:
stdlib + zcorch._native (from zcorch only _version, errors, units, params and the worker package).
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import platform
import signal
import stat
import sys
import _thread
from contextlib import suppress
TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: importing typing costs the worker's start-up ~5 ms
    from typing import Any, Optional

from zcorch.worker import calcache, command, hoststat, native
from zcorch._version import __version__
from zcorch.errors import WorkerError
from zcorch.params import format_value, side_params
from zcorch.units import parse_duration, parse_size


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting: the error must be a JSON event."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise _UsageError(f"{self.prog}: {message}")


def _emit(obj: "dict[str, Any]") -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _error_event(code: int, message: str) -> None:
    _emit({"event": "error", "message": message, "code": errno.errorcode.get(code, f"E{code}")})


def parse_address(text: str, flag: str) -> "tuple[str, int]":
    """'127.0.0.1:5000', 'host:0', '[::1]:0' -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise _UsageError(f"{flag} must be ADDR:PORT (IPv6 as [ADDR]:PORT), got {text!r}")
    return host, int(port)


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def _add_params(p: argparse.ArgumentParser, side: str) -> None:
    """The flags of `side`'s parameters, names, help and defaults from the table (zcorch.params)."""
    for prm in side_params(side):
        kw: "dict[str, Any]" = {"dest": prm.dest, "help": prm.help}
        if prm.kind == "bool":
            kw["action"] = "store_true"
        else:
            if prm.kind in ("int", "cpu"):
                kw["type"] = _int
            if prm.registry_choices:  # the modes: the C registry is the truth and names a wrong one
                kw["help"] += " (`zcorch worker info` lists them)"
            elif prm.kind == "choice":
                kw["choices"] = prm.choices
            if prm.worker_absent == "required":
                kw["required"] = True
            elif prm.worker_absent == "default" and prm.default is not None:
                kw["default"] = format_value(prm.key, prm.default)  # as a user writes it; parsed like one
                kw["help"] += f" (default {kw['default']})"
            elif prm.unset == "auto":
                kw["help"] += " (default auto: the kernel's)"
        p.add_argument(prm.flag, **kw)
    p.add_argument("--exit-on-stdin-eof", action="store_true",
                   help="end at once when stdin reaches EOF (the controller that holds it open is gone)")


def _add_max_age(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-age", help="with --cache: measure anew when the cached one is older than this "
                                     f"duration (default {calcache.DEFAULT_MAX_AGE_S / 3600:g}h)")


_NONCE_HELP = ("the run's nonce (32 hex digits, made by the controller for this run alone) every stream hello "
               "carries; the receiver drops a connection whose hello carries another (without it: zeros)")


def build_parser(prog: str = "zcorch worker") -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description="One side of a zcorch transfer (JSON lines on stdout).")
    sub = parser.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    sub.required = True
    rx = sub.add_parser("recv", help="listen, print ready, receive, print the result")
    rx.add_argument("--listen", required=True, help="ADDR:PORT to listen on (port 0 = ephemeral)")
    _add_params(rx, "recv")
    rx.add_argument("--allow-device-sink", action="store_true",
                    help="let --sink name a block or character device other than /dev/null (the experiment "
                         "listed it in `allow_destroy:`); without it such a sink is refused")
    rx.add_argument("--peer", help="the sender's data address: a data connection from any other address is "
                                   "dropped (counted in refused_connections) and the wait goes on")
    rx.add_argument("--nonce", help=_NONCE_HELP)
    tx = sub.add_parser("send", help="connect, send, print the result")
    tx.add_argument("--connect", required=True, help="ADDR:PORT of the receiver")
    _add_params(tx, "send")
    tx.add_argument("--nonce", help=_NONCE_HELP)
    info = sub.add_parser("info", help="print version, compiled modes and kernel release (and, asked, what a sweep "
                                       "reads next: the cached calibration, the host's metadata: one start, not three)")
    info.add_argument("--cache", help="also the calibration `calibrate --cache FILE` would reuse, as "
                                      "\"calibration\" (null when it would measure: this action never does)")
    _add_max_age(info)
    info.add_argument("--metadata", nargs=argparse.REMAINDER, metavar="ADDRESS PATH [SYSCTL...] [--tool PROGRAM...]",
                      help="last: also the host's metadata, as \"metadata\" (zcorch.worker.remote's `metadata` "
                           "action and its arguments)")
    lay = sub.add_parser("layout", help="create a missing source file filled with the mem pattern (untimed)")
    lay.add_argument("--path", required=True, help="absolute path of the file to create")
    lay.add_argument("--bytes", required=True, help="its size")
    lay.add_argument("--grow", action="store_true",
                     help="replace a shorter file that holds the mem pattern (one laid out before) by a longer one")
    cmd = sub.add_parser("command", help="one end of a command baseline: run ARGV with stdin/stdout files, "
                                          "timed (zcorch.worker.command)")
    cmd.add_argument("--stdin", help="file for the command's stdin (default /dev/null)")
    cmd.add_argument("--stdout", help="file for the command's stdout (default /dev/null)")
    cmd.add_argument("--listen-port", type=_int, help="say when a TCP socket of this host listens on this port")
    cmd.add_argument("--sink", help="report this file's size after the exit")
    cmd.add_argument("--remove", action="append", default=[], help="delete this file afterwards (repeatable)")
    cmd.add_argument("--timeout", type=float, default=3600.0, help="kill the command after this many seconds")
    cmd.add_argument("--wait-go", action="store_true", help="print a ready event, start on a line on stdin")
    cmd.add_argument("argv", nargs=argparse.REMAINDER, help="-- then the command")
    cal = sub.add_parser("calibrate", help="copy-cost yardsticks of this host: memcpy, page fault, system call")
    cal.add_argument("--bytes", help="memcpy buffer and page-fault region (default: 64MiB or twice the largest "
                                     "CPU cache, whichever is larger, at most 1GiB)")
    cal.add_argument("--cpu", type=_int, help="CPU to pin the calibration to (default: not pinned)")
    cal.add_argument("--cache", help="keep the calibration in this file on the host and reuse it while the host's "
                                     "boot id, kernel, CPU model and frequency governor stay (zcorch.worker.calcache)")
    _add_max_age(cal)
    cal.add_argument("--refresh", action="store_true", help="with --cache: measure anew whatever is cached")
    sub.add_parser("serve", help="run run after run in forked children, handed over as JSON lines on stdin "
                                 "(zcorch.worker.serve: the controller keeps one per host for a sweep)")
    return parser


def _params(args: argparse.Namespace) -> "dict[str, Any]":
    """zcorch.worker.native keywords from the parsed flags of a send/recv action (the mode is positional)."""
    return {prm.dest: getattr(args, prm.dest) for prm in side_params(args.action) if prm.dest != "mode"}


def _info() -> "dict[str, Any]":
    """capabilities: {side: {mode: [names]}} as the C ops tables declare them; unavailable: {side:
    {mode: why}} for compiled modes this build or kernel cannot run (empty dicts when all can);
    runnable: {side: [modes]} the others; build: {feature: null if built with it, else why not}."""
    caps = {side: {mode: sorted(names) for mode, names in modes.items()}
            for side, modes in native.mode_capabilities().items()}
    modes = native.compiled_modes()
    unavailable = native.unavailable_modes()
    return {"event": "info", "version": __version__, "modes": modes,
            "kernel": platform.release(), "python": platform.python_version(),
            "native": native.native_path(), "capabilities": caps, "unavailable": unavailable,
            "runnable": {side: [m for m in names if m not in unavailable.get(side, {})]
                         for side, names in modes.items()},
            "build": native.build_features()}


def largest_cache_bytes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """Size of cpu0's largest cache (sysfs `index*/size`, e.g. `32768K`), 0 when unknown."""
    best = 0
    with suppress(OSError):
        for name in os.listdir(root):
            with suppress(OSError, ValueError), open(os.path.join(root, name, "size")) as f:
                best = max(best, parse_size(f.read().strip().replace("K", "KiB").replace("M", "MiB")))
    return best


def _calibration_request(args: argparse.Namespace) -> "tuple[int, float]":
    """(bytes, max age in seconds) of calibrate's (or info's) flags."""
    try:   # by default larger than every cache, so the copy streams through memory
        nbytes = (parse_size(args.bytes) if getattr(args, "bytes", None) is not None
                  else min(max(native.CALIBRATE_BYTES, 2 * largest_cache_bytes()), 1 << 30))
    except ValueError as exc:
        raise _UsageError(f"--bytes: {exc}") from None
    if getattr(args, "cpu", None) is not None and args.cpu < 0:
        raise _UsageError(f"--cpu must be >= 0, got {args.cpu}")
    try:
        max_age = parse_duration(args.max_age) if args.max_age is not None else calcache.DEFAULT_MAX_AGE_S
    except ValueError as exc:
        raise _UsageError(f"--max-age: {exc}") from None
    return nbytes, max_age


def _cache_file(args: argparse.Namespace) -> "tuple[str, dict[str, Any]]":
    """(the cache's path on this host, the key a calibration of these flags is cached under)."""
    path = os.path.expanduser(args.cache)   # `~` of this host: the controller passes the workdir as written
    if not os.path.isabs(path):
        raise _UsageError(f"--cache must be an absolute path (or start with ~/), got {args.cache!r}")
    nbytes, _ = _calibration_request(args)
    return path, dict(calcache.host_key(), worker=__version__, bytes=nbytes, cpu=getattr(args, "cpu", None))


def _calibrate(args: argparse.Namespace) -> "dict[str, Any]":
    nbytes, max_age = _calibration_request(args)

    def measure() -> "dict[str, Any]":
        return {**native.calibrate(nbytes, args.cpu), "kernel": platform.release(), "boot_id": hoststat.boot_id()}

    if args.cache is None:
        return {"event": "calibration", **measure()}
    path, key = _cache_file(args)
    return {"event": "calibration", **calcache.cached_calibration(path, measure, key, max_age, args.refresh)}


def _info_with(args: argparse.Namespace) -> "dict[str, Any]":
    """_info(), plus what its flags ask for: the cached calibration `calibrate --cache` would reuse (read
    only; null when it would measure), the host's metadata (zcorch.worker.remote.host_metadata)."""
    out = _info()
    if args.cache is not None:
        path, key = _cache_file(args)
        out["calibration"] = calcache.lookup(path, key, _calibration_request(args)[1])[0]
    if args.metadata is not None:
        from zcorch.worker import remote   # stdlib only; its imports cost the plain `info` nothing

        if len(args.metadata) < 2:
            raise _UsageError("--metadata ADDRESS PATH [SYSCTL...] [--tool PROGRAM...]")
        out["metadata"] = remote.metadata_action(args.metadata)
    return out


def _exit_when_stdin_closes() -> None:
    """Daemon thread: EOF on stdin means the controller died, so end before the run's own --timeout (the
    transfer runs in C with the GIL released, so this thread runs mid-transfer)."""
    def watch() -> None:
        with suppress(OSError):
            while os.read(0, 4096):
                pass
        with suppress(OSError):  # stderr usually went to the dead controller too (EPIPE): best effort
            os.write(2, b"zcorch worker: stdin closed (controller gone): exiting\n")
        # The runner starts each worker as the leader of its own process group: end all of it.
        if os.getpgrp() == os.getpid():
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os._exit(1)

    # The low-level start does not wait for the new thread to be scheduled (Thread.start does: on a busy
    # host, milliseconds of a run's set-up).
    _thread.start_new_thread(watch, ())


def _holds_the_pattern(fd: int, size: int) -> bool:
    """Whether the file open as `fd` has the mem pattern in its first and last pages: one laid out before."""
    page = 4096
    for off in sorted({0, max(size - page, 0)}):
        chunk = os.pread(fd, min(page, size - off), off)
        if chunk != native.mem_pattern(off, len(chunk)):
            return False
    return True


def _ours_to_grow(dfd: int, name: str, size: int) -> "Optional[os.stat_result]":
    """The stat of `name` in directory `dfd` when it is a file this layout may replace by a longer one: judged on
    what was opened (a regular file of this user, on the directory's own filesystem, shorter than `size`,
    holding the mem pattern), never on the name. None otherwise."""
    try:
        pfd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return None
    try:
        seen, where = os.fstat(pfd), os.fstat(dfd)
        if not (stat.S_ISREG(seen.st_mode) and seen.st_uid == os.geteuid() and seen.st_dev == where.st_dev
                and 0 < seen.st_size < size):
            return None
        # read only what was judged: opened again from the same directory and checked to be the same inode
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return None
    finally:
        os.close(pfd)
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (seen.st_dev, seen.st_ino) or not 0 < st.st_size < size:
            return None
        return st if _holds_the_pattern(fd, st.st_size) else None
    finally:
        os.close(fd)


def _existing(path: str, dfd: int, name: str) -> "Optional[os.stat_result]":
    """What `name` in `dfd` is, not following a link (None: nothing); a link or a device is refused."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise WorkerError(errno.ELOOP, f"layout path {path} exists and is a symbolic link: refused (the worker "
                                       "follows no link: name the real path)")
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        kind = "block" if stat.S_ISBLK(st.st_mode) else "character"
        raise WorkerError(errno.EPERM, f"layout path {path} exists and is a {kind} device, not a regular file "
                                       "(no device is allowed here): refused")
    return st


def layout(path: str, size: int, grow: bool = False, walk: bool = False) -> "dict[str, Any]":
    """Create `path` with `size` bytes of the mem pattern (what source `mem` sends at each offset), unless
    something exists there: an existing file is never touched (fio's laying out). grow: a shorter file of this
    user that holds the pattern (laid out before) is replaced by a longer one. Written to a temporary name and
    linked (grow: renamed) into place, so no short file is ever seen under `path`; all beneath one descriptor
    of the directory (native.open_dir), so a directory swapped for a link cannot send the file elsewhere.
    `walk` as in native.open_file (tests)."""
    if not os.path.isabs(path):
        raise _UsageError(f"--path must be absolute, got {path!r}")
    directory, name = os.path.split(path)
    if name in ("", ".", ".."):
        raise WorkerError(errno.EINVAL, f"layout {path}: not a path of a file")
    try:
        dfd = native.open_dir(directory, walk=walk)
    except WorkerError as exc:
        raise WorkerError(exc.code, f"layout {path}: {exc}") from None
    try:
        return _layout_in(dfd, path, name, size, grow)
    finally:
        os.close(dfd)


def _layout_in(dfd: int, path: str, name: str, size: int, grow: bool) -> "dict[str, Any]":
    st = _existing(path, dfd, name)
    grown = _ours_to_grow(dfd, name, size) if st is not None and grow and stat.S_ISREG(st.st_mode) else None
    if st is not None and grown is None:
        return {"event": "layout", "path": path, "created": False, "size": st.st_size,
                "regular": stat.S_ISREG(st.st_mode)}
    period = native.mem_pattern(0, native.mem_pattern_period())
    tmp = f"{name}.zcorch-layout-{os.getpid()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
        try:
            view, off = memoryview(period), 0
            while off < size:
                start = off % len(view)
                off += os.write(fd, view[start:start + min(len(view) - start, size - off)])
            os.fsync(fd)
        finally:
            os.close(fd)
        if grown is not None:
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        else:
            try:
                os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
            except FileExistsError:  # someone else made it meanwhile: theirs stays, ours goes
                return _layout_in(dfd, path, name, size, False)
    except OSError as exc:
        raise WorkerError(exc.errno or errno.EIO, f"layout {path}: {exc.strerror or exc}") from None
    finally:
        with suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
    return {"event": "layout", "path": path, "created": True, "size": size, "regular": True,
            **({"grown_from": grown.st_size} if grown is not None else {})}


def _run(args: argparse.Namespace) -> None:
    # A source, a sink, a command's stdin/stdout and layout's directory are judged on the descriptor they are
    # opened as (native/core/openpath.c), never by a look at the name first.
    if args.action in ("info", "calibrate"):
        _emit(_info_with(args) if args.action == "info" else _calibrate(args))
        return
    if args.action == "serve":
        from zcorch.worker import serve   # the server itself (only this action needs it)

        parser = build_parser()   # once: every run the server forks parses its arguments with it
        serve.serve(lambda argv: main(argv, parser))
        return
    if args.action == "command":
        argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        if not argv:
            raise _UsageError("command: no command after --")
        result = command.run(argv, stdin=args.stdin, stdout=args.stdout, listen_port=args.listen_port,
                             sink=args.sink, remove=args.remove, timeout=args.timeout, wait_go=args.wait_go)
        if result["rc"] != 0:
            sys.exit(1)
        return
    if args.action == "layout":
        try:
            size = parse_size(args.bytes)
        except ValueError as exc:
            raise _UsageError(f"--bytes: {exc}") from None
        _emit(layout(args.path, size, grow=args.grow))
        return
    if args.exit_on_stdin_eof:
        _exit_when_stdin_closes()
    params = _params(args)
    if args.action == "recv":
        host, port = parse_address(args.listen, "--listen")
        with native.Receiver(host, port, args.mode, allow_device_sink=args.allow_device_sink, peer=args.peer,
                             nonce=args.nonce, **params) as rx:
            _emit({"event": "ready", "port": rx.port, "pid": os.getpid()})
            result = rx.run()
    else:
        host, port = parse_address(args.connect, "--connect")
        result = native.send(host, port, args.mode, nonce=args.nonce, **params)
    _emit({"event": "result", **result})


def main(argv: "Optional[list[str]]" = None, parser: "Optional[argparse.ArgumentParser]" = None) -> int:
    """Entry point of `zcorch worker ...` (cli.py fast-paths here) and `python3 -m zcorch.worker`; a served
    run (zcorch.worker.serve) passes the parser its server built once."""
    argv = sys.argv[1:] if argv is None else list(argv)
    # The transfer loops retry on EINTR, so a Python-level SIGINT handler would only run after the
    # deadline: let Ctrl-C kill the worker at once instead.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        args = (parser or build_parser()).parse_args(argv)
        _run(args)
        return 0
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except _UsageError as exc:
        _error_event(errno.EINVAL, str(exc))
    except WorkerError as exc:
        _error_event(exc.code, str(exc))
    except BrokenPipeError:
        pass  # whoever read our stdout is gone; nothing left to report to
    return 1

