"""The copy-cost calibration cached on the host it describes (`zcorch worker calibrate --cache FILE`).

A calibration takes seconds and describes the machine, not the sweep: it is kept on the host and reused while
its key holds (host_key, the worker version, what was measured), it is younger than `max_age` and no `refresh`
is asked. The file is trusted only as `read()` finds it: reached without a link, this user's alone, small,
exactly what `write()` makes (an O_EXCL temporary file, fsynced, renamed over the name). Stdlib only.
"""
from __future__ import annotations

import errno
import glob
import json
import os
import stat
import time
from contextlib import suppress

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Optional, Tuple

FORMAT = "zcorch-calibration"
VERSION = 1
FILENAME = "calibration.json"
MAX_BYTES = 64 * 1024           # a valid cache is about 1 KiB; anything far larger is not ours
DEFAULT_MAX_AGE_S = 7 * 86400.0  # a week: the experiment's `calibration_max_age` default (zcorch.config.schema)
# The files the key is read from; tests point them at files of their own (no real way to change a boot id).
KEY_FILES = {"boot_id": "/proc/sys/kernel/random/boot_id", "kernel": "/proc/sys/kernel/osrelease",
             "cpuinfo": "/proc/cpuinfo",
             "governors": "/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor"}
# The calibration's figures a cached document must carry (native.calibrate's derived values).
REQUIRED_FIGURES = ("memcpy_s_per_gib", "memcpy_gib_s", "fault_ns_per_page", "syscall_ns_per_call")


class Untrusted(Exception):
    """The cache file exists but cannot be used as it is (the message says why)."""


def _read_text(path: str) -> "Optional[str]":
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def host_key(files: "Optional[Dict[str, str]]" = None) -> "Dict[str, Any]":
    """What a cached calibration is valid for on this host (module docstring); unreadable parts are null."""
    files = dict(KEY_FILES, **(files or {}))
    model = next((line.split(":", 1)[1].strip() for line in (_read_text(files["cpuinfo"]) or "").splitlines()
                  if line.split(":")[0].strip() in ("model name", "Model", "cpu model")), None)
    governors = sorted({g for g in (_read_text(p) for p in glob.glob(files["governors"])) if g})
    return {"boot_id": _read_text(files["boot_id"]) or None, "kernel": _read_text(files["kernel"]) or None,
            "cpu_model": model, "governor": ",".join(governors) or None}


def _open_dir(directory: str) -> int:
    """The cache's directory (created 0700 when missing), opened without following a link; refused
    unless it is ours and writable by neither group nor others (someone else could swap the file)."""
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise Untrusted(f"{directory}: {exc.strerror or exc}") from None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        raise Untrusted(f"{directory} is not this user's private directory (uid {st.st_uid}, mode "
                        f"{stat.S_IMODE(st.st_mode):04o})")
    return fd


def read(path: str) -> "Optional[Dict[str, Any]]":
    """The cached document at `path`, None when there is none; Untrusted when it cannot be used."""
    dfd = _open_dir(os.path.dirname(path) or ".")
    try:
        try:
            fd = os.open(os.path.basename(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                         dir_fd=dfd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            why = "a symlink" if exc.errno == errno.ELOOP else exc.strerror or str(exc)
            raise Untrusted(f"{path}: {why}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise Untrusted(f"{path}: not a regular file")
            if st.st_uid != os.geteuid() or st.st_mode & 0o022:
                raise Untrusted(f"{path}: not this user's own file (uid {st.st_uid}, mode "
                                f"{stat.S_IMODE(st.st_mode):04o})")
            if st.st_size > MAX_BYTES:
                raise Untrusted(f"{path}: {st.st_size} bytes, larger than a calibration ({MAX_BYTES} at most)")
            data = os.read(fd, MAX_BYTES + 1)
        finally:
            os.close(fd)
    finally:
        os.close(dfd)
    return validate(data, path)


def validate(data: bytes, path: str = "cache") -> "Dict[str, Any]":
    """The document `write()` makes, checked field by field; Untrusted naming the first problem."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise Untrusted(f"{path}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise Untrusted(f"{path}: not a {FORMAT} document of version {VERSION}")
    measured = doc.get("measured_at")
    if not isinstance(measured, (int, float)) or isinstance(measured, bool) or measured <= 0:
        raise Untrusted(f"{path}: measured_at is not a time")
    if not isinstance(doc.get("key"), dict) or not isinstance(doc.get("calibration"), dict):
        raise Untrusted(f"{path}: key or calibration missing")
    cal = doc["calibration"]
    for name in REQUIRED_FIGURES:
        value = cal.get(name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
            raise Untrusted(f"{path}: calibration.{name} is not a positive number ({value!r})")
    return doc


def write(path: str, doc: "Dict[str, Any]") -> None:
    """Put `doc` at `path`: never through a link, never half written (module docstring)."""
    dfd = _open_dir(os.path.dirname(path) or ".")
    tmp = f".{os.path.basename(path)}.tmp-{os.getpid()}-{time.monotonic_ns()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            data = (json.dumps(doc, sort_keys=True) + "\n").encode()
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, os.path.basename(path), src_dir_fd=dfd, dst_dir_fd=dfd)
        tmp = ""
    finally:
        if tmp:
            with suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
        os.close(dfd)


def lookup(path: str, key: "Dict[str, Any]", max_age_s: float = DEFAULT_MAX_AGE_S,
           now: "Optional[float]" = None) -> "Tuple[Optional[Dict[str, Any]], str, Optional[str]]":
    """Read only (`zcorch worker info --cache`): (what cached_calibration returns for a hit, "hit", None) while
    the cache at `path` holds for `key`, else (None, status, why) as a measurement would record them."""
    now = time.time() if now is None else now
    try:
        doc = read(path)
    except Untrusted as exc:
        return None, "untrusted", str(exc)
    if doc is None:
        return None, "missing", None
    changed = sorted(k for k in set(key) | set(doc["key"]) if key.get(k) != doc["key"].get(k))
    age = now - doc["measured_at"]
    if changed:
        return None, "key changed", ", ".join(f"{k}: {doc['key'].get(k)!r} -> {key.get(k)!r}" for k in changed)
    if not -60.0 <= age <= max_age_s:   # a clock set back by more than a minute: measured "later"
        return None, "expired", f"measured {age:.0f}s ago, max age {max_age_s:g}s"
    return (dict(doc["calibration"], cached=True, measured_at=doc["measured_at"], age_s=round(max(age, 0.0), 3),
                 cache={"path": path, "status": "hit", "why": None}), "hit", None)


def cached_calibration(path: str, measure: "Callable[[], Dict[str, Any]]", key: "Dict[str, Any]",
                       max_age_s: float = DEFAULT_MAX_AGE_S, refresh: bool = False,
                       now: "Optional[float]" = None) -> "Dict[str, Any]":
    """The calibration for `key`: the cached one when it still holds, else `measure()` (written back). Its
    figures plus "cached", "measured_at" (Unix time), "age_s" and "cache": {"path", "status": hit | missing |
    refresh | key changed | expired | untrusted | not written, "why": the detail or null}."""
    status, why = "refresh", None
    if not refresh:
        hit, status, why = lookup(path, key, max_age_s, now)
        if hit is not None:
            return hit
    figures = measure()
    measured_at = time.time()
    try:
        write(path, {"format": FORMAT, "version": VERSION, "key": key, "measured_at": measured_at,
                     "calibration": figures})
    except (OSError, Untrusted) as exc:   # the measurement still counts; the next sweep measures again
        why = f"{why}; " if why else ""
        status, why = "not written", f"{why}{getattr(exc, 'strerror', None) or exc}"
    return dict(figures, cached=False, measured_at=measured_at, age_s=0.0,
                cache={"path": path, "status": status, "why": why})
