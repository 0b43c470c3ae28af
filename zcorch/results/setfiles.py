"""Files inside a result set, read and written as root may safely do (a set can come from anyone).

Reading: component by component below the set's directory with O_NOFOLLOW, regular files only, bounded in
size, lines and records (what was skipped said: `SkippedWarning`). Writing: an exclusive temporary renamed
over the final name. The directory the user names is taken as given. Stdlib only.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import stat
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Tuple, Union

from zcorch.errors import ResultsError

PathLike = Union[str, "os.PathLike[str]"]

# Limits (far above what a sweep writes; see docs/architecture.md, result sets).
MAX_JSON_BYTES = 64 * 1024 ** 2           # manifest.json, meta.json, plan.json
MAX_PLAN_BYTES = 1024 ** 3               # plan.json: about 500 bytes a run, at most 1M runs
MAX_TEXT_BYTES = 16 * 1024 ** 2           # experiment.yaml and its source copy
MAX_LINE_BYTES = 4 * 1024 ** 2            # one record of runs.jsonl, baselines.jsonl, samples/*.jsonl
MAX_RECORDS = 10_000_000                  # records of one JSON-lines file (1M runs, resumed many times)
MAX_SAMPLE_RECORDS = 2_000_000            # lines of one samples file
MAX_CACHE_BYTES = 64 * 1024 ** 3          # runs.parquet
# runs.jsonl holds at most planned runs x RETRY_FACTOR + RETRY_SLACK records (no plan.json: MAX_RECORDS_UNPLANNED).
RETRY_FACTOR = 4
RETRY_SLACK = 64
MAX_RECORDS_UNPLANNED = 100_000
PLAN_NAME = "plan.json"
_CHUNK = 1024 ** 2


class SkippedWarning(UserWarning):
    """Part of a result-set file was skipped by a bound (the message says what and why)."""


def _skipped(message: str) -> None:
    warnings.warn(message, SkippedWarning, stacklevel=3)


def _parts(rel: str, root: PathLike) -> "list[str]":
    parts = str(rel).split("/")
    if str(rel).startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ResultsError(f"{root}: `{rel}` is not a plain path inside the result set (no `..`, no absolute "
                           "path): not read")
    return parts


def _walk(root: PathLike, parts: "list[str]", create: bool) -> int:
    """A directory fd of root/parts..., each component opened without following a link."""
    dfd = os.open(os.fspath(root), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(parts):
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=dfd)
            try:
                nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    where = os.path.join(os.fspath(root), *parts[:i + 1])
                    raise ResultsError(f"{where}: not a directory (a symbolic link or a file): not followed, "
                                       "nothing read or written through it") from None
                raise
            os.close(dfd)
            dfd = nfd
        return dfd
    except BaseException:
        os.close(dfd)
        raise


def open_inside(root: PathLike, rel: str) -> int:
    """A read-only fd of the regular file root/rel (ResultsError for a link, a non-regular file or a path
    leaving root; FileNotFoundError when missing)."""
    parts = _parts(rel, root)
    dfd = _walk(root, parts[:-1], create=False)
    try:
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ResultsError(f"{os.path.join(os.fspath(root), rel)}: a symbolic link: not followed (a result "
                               "set's files are read only as regular files inside it)") from None
        raise
    finally:
        os.close(dfd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ResultsError(f"{os.path.join(os.fspath(root), rel)}: not a regular file: not read")
    return fd


def dir_beneath(root: PathLike, rel: object) -> str:
    """root/rel for a directory named by a file (a fleet.json pair's `dir`): a plain relative path (no `..`, no
    absolute path) that, links resolved, stays beneath root; ResultsError otherwise."""
    if not isinstance(rel, str) or not rel:
        raise ResultsError(f"{root}: `{rel}` is not a directory name: not read")
    parts = _parts(rel.rstrip("/"), root)
    path = os.path.join(os.fspath(root), *parts)
    base = os.path.realpath(os.fspath(root))
    if os.path.commonpath([base, os.path.realpath(path)]) != base:
        raise ResultsError(f"{path}: leads outside {root} (a link): not read")
    return path


def fd_path(fd: int) -> str:
    """A path that opens exactly the file of `fd` again (for readers that take only a path, e.g. Arrow)."""
    return f"/proc/self/fd/{fd}"


def read_bytes(root: PathLike, rel: str, limit: int) -> bytes:
    """The whole regular file root/rel, refused (ResultsError) when larger than `limit` bytes."""
    fd = open_inside(root, rel)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(limit + 1)
    if size > limit or len(data) > limit:
        raise ResultsError(f"{os.path.join(os.fspath(root), rel)}: {max(size, len(data))} bytes, more than the "
                           f"{limit} this kind of file may have: not read")
    return data


def read_text(root: PathLike, rel: str, limit: int = MAX_TEXT_BYTES) -> str:
    return read_bytes(root, rel, limit).decode("utf-8", errors="replace")


def read_json(root: PathLike, rel: str, limit: int = MAX_JSON_BYTES) -> Any:
    """JSON of root/rel (ValueError if it is not JSON, as json.loads)."""
    return json.loads(read_bytes(root, rel, limit))


def planned_runs(root: PathLike) -> Optional[int]:
    """How many runs the set's plan.json lists (None when it has none; ResultsError when it is not a list)."""
    try:
        plan = read_json(root, PLAN_NAME, MAX_PLAN_BYTES)
    except FileNotFoundError:
        return None
    except ValueError:
        raise ResultsError(f"{os.path.join(os.fspath(root), PLAN_NAME)}: not JSON: not read") from None
    if not isinstance(plan, list):
        raise ResultsError(f"{os.path.join(os.fspath(root), PLAN_NAME)}: not a list of runs: not read")
    return len(plan)


def plan_stamp(root: PathLike) -> Optional[dict]:
    """{"size", "runs"} of the set's plan.json (None without one): what run_record_limit may be told instead of
    parsing it again (a plan of a million runs takes about a second)."""
    n = planned_runs(root)
    return None if n is None else {"size": _plan_size(root), "runs": n}


def _plan_size(root: PathLike) -> int:
    fd = open_inside(root, PLAN_NAME)
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def _stamped_runs(root: PathLike, stamp: Any) -> Optional[int]:
    """The planned runs `stamp` (plan_stamp's, from a cache) gives, if plan.json still has its size and the count
    fits that size (an entry takes 3 bytes at least): trusting it then allows no more than a plan.json of
    those bytes could; else None."""
    if not isinstance(stamp, dict) or type(stamp.get("runs")) is not int or type(stamp.get("size")) is not int:
        return None
    try:
        size = _plan_size(root)
    except (OSError, ResultsError):
        return None
    return stamp["runs"] if size == stamp["size"] and 0 <= stamp["runs"] <= size // 3 else None


def run_record_limit(root: PathLike, stamp: Any = None) -> Tuple[int, str]:
    """(the most records runs.jsonl of set `root` may hold, why): what its plan can hold, planned runs x
    RETRY_FACTOR + RETRY_SLACK (at most MAX_RECORDS); MAX_RECORDS_UNPLANNED without a plan.json. stamp: a
    plan_stamp taken earlier, used when it still fits plan.json (_stamped_runs)."""
    n = _stamped_runs(root, stamp)
    if n is None:
        n = planned_runs(root)
    if n is None:
        return MAX_RECORDS_UNPLANNED, f"the set has no {PLAN_NAME}"
    limit = min(MAX_RECORDS, n * RETRY_FACTOR + RETRY_SLACK)
    return limit, f"its {PLAN_NAME} lists {n} runs (at most {RETRY_FACTOR} records a run, +{RETRY_SLACK})"


def iter_lines(root: PathLike, rel: str, max_line: int = MAX_LINE_BYTES, max_records: int = MAX_RECORDS,
               skipped: Callable[[str], None] = _skipped, offset: int = 0,
               refuse_beyond: Optional[str] = None) -> Iterator[Tuple[int, bytes, bool]]:
    """(line number, line, terminated) of a JSON-lines file from byte `offset`, streamed; lines beyond the
    bounds skipped and said through `skipped` (too many records: ResultsError given refuse_beyond, the why)."""
    try:
        fd = open_inside(root, rel)
    except FileNotFoundError:
        return
    where = os.path.join(os.fspath(root), rel)
    long_lines: "list[int]" = []
    count = 0
    with os.fdopen(fd, "rb") as f:
        f.seek(offset)
        lineno = 0
        while True:
            line = f.readline(max_line + 1)
            if not line:
                break
            lineno += 1
            if len(line) > max_line and not line.endswith(b"\n"):
                long_lines.append(lineno)
                while True:  # the rest of the line, a chunk at a time
                    chunk = f.readline(_CHUNK)
                    if not chunk or chunk.endswith(b"\n"):
                        break
                continue
            if not line.strip():
                continue
            count += 1
            if count > max_records:
                if refuse_beyond is not None:
                    raise ResultsError(f"{where}: more than {max_records} records, more than {refuse_beyond} "
                                       "can hold: not read")
                skipped(f"{where}: more than {max_records} records: those from line {lineno} on were skipped")
                break
            yield lineno, line, line.endswith(b"\n")
    if long_lines:
        first = ", ".join(str(n) for n in long_lines[:5]) + (" ..." if len(long_lines) > 5 else "")
        skipped(f"{where}: {len(long_lines)} line(s) longer than {max_line} bytes skipped (line {first})")


def write_inside(directory: PathLike, rel: str, data: Union[bytes, Callable[[Any], None]], mode: int = 0o644,
                 fsync: bool = False) -> Path:
    """Replace directory/rel with `data` (bytes, or a function writing into a file) through an exclusive
    temporary, fsynced before the rename if `fsync`; no link below `directory` is followed."""
    staged = stage_inside(directory, rel, data, mode, fsync)
    try:
        return staged.publish()
    except BaseException:
        staged.discard()
        raise


class Staged:
    """A file written under a hidden temporary name (`.NAME.RANDOM.tmp`) beside directory/rel: publish()
    renames it into place, discard() removes it (zcorch.analysis.export publishes several together)."""

    def __init__(self, directory: PathLike, parts: "list[str]", tmp: str):
        self.directory, self.parts, self.tmp = directory, parts, tmp

    def _dir(self) -> int:
        return _walk(self.directory, self.parts[:-1], create=False)   # walked again: no fd held per staged file

    def publish(self) -> Path:
        dfd = self._dir()
        try:
            os.replace(self.tmp, self.parts[-1], src_dir_fd=dfd, dst_dir_fd=dfd)
        finally:
            os.close(dfd)
        return Path(self.directory, *self.parts)

    def discard(self) -> None:
        try:
            dfd = self._dir()
        except (OSError, ResultsError):
            return
        try:
            os.unlink(self.tmp, dir_fd=dfd)
        except OSError:
            pass
        finally:
            os.close(dfd)


def stage_inside(directory: PathLike, rel: str, data: Union[bytes, Callable[[Any], None]], mode: int = 0o644,
                 fsync: bool = False) -> Staged:
    """directory/rel's next content written into an exclusive temporary beside it (write_inside's rules), to be
    published (renamed into place) or discarded; a temporary left by a killed writer keeps the `.tmp` suffix."""
    parts = _parts(rel, directory)
    dfd = _walk(directory, parts[:-1], create=True)
    try:
        tmp = f".{parts[-1]}.{secrets.token_hex(8)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as f:
                if callable(data):
                    data(f)
                else:
                    f.write(data)
                f.flush()
                os.fchmod(f.fileno(), mode)
                if fsync:
                    os.fsync(f.fileno())
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
    finally:
        os.close(dfd)
    return Staged(directory, parts, tmp)


def is_regular_inside(root: PathLike, rel: str) -> bool:
    """Whether root/rel is a regular file reached without links (what open_inside would open)."""
    try:
        os.close(open_inside(root, rel))
        return True
    except (OSError, ResultsError):
        return False

