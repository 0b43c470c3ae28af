"""`baselines.dd`: dd write + read on the receiver, in each directory a sink lives in (docs/experiment-files.md),
run as the host job `zcorch.worker.remote dd DIR BS COUNT [--no-sync] [--fdatasync] [--warmup]`.
"""
from __future__ import annotations

import json
import posixpath
import re
import shlex
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from zcorch.config import checks
from zcorch.config import yamlsrc as ys
from zcorch.config.baselines.kind import DIRECTORY, BaselineError, BaselineKind, Cost, Tool, _describe
from zcorch.config.checks import SCRATCH_PLACEHOLDER, Checker
from zcorch.params import INT_MAX
from zcorch.units import format_size
from zcorch.worker.remote import dd_read_argv, dd_write_argv

DD_MAX_REPEATS = 100
DD_MAX_BYTES = 64 * 1024 ** 3  # bs × count: the file dd writes (the host's free space is checked too)
JOB = "dd"                     # the zcorch.worker.remote job
CELLS = "cells"                # `count: cells`
# the wrapper's JSON part -> the record kind it makes, in the order the job runs them
SIDES = (("warmup", "dd_warmup"), ("write", "dd_write"), ("read", "dd_read"), ("fdatasync", "dd_fdatasync"))


@dataclass(frozen=True)
class DdBaseline:
    """dd write + read on the receiver, in each directory a sink lives in."""

    bs: int = 1024 ** 2
    count: Optional[int] = 64   # None until validation binds `count: cells` (zcorch.config.validate)
    # Where dd writes for a device sink: per-user scratch (a predictable name in /tmp is anyone's to pre-create)
    scratch: str = SCRATCH_PLACEHOLDER
    repeats: int = 1          # dd write + read pairs per directory (records carry `repeat`)
    cells: bool = False       # `count: cells`: count follows the cells' largest `bytes` (bind_cells)
    sync: bool = True         # `dd; sync` timed (the seeds' `time { dd; sync; }`); false: dd alone
    fdatasync: bool = False   # also a write with conv=fdatasync: records `dd_fdatasync`
    warmup: bool = False      # one write before the first timed one per directory: records `dd_warmup`


def _dd_count(node: ys.YNode) -> "int | str":
    # dd reads `count=512k` as 512*1024 blocks, and the seeds wrote it so: accept a size-like count.
    if isinstance(node, ys.YScalar) and node.text == CELLS:
        return CELLS
    n = ys.as_size(node, "a block count (e.g. 16384 or 512k)")
    if n < 1:
        raise ys.ValueProblem(f"expected a count ≥ 1, got `{node.text}`")
    if n > DD_MAX_BYTES:  # one-byte blocks at most: more could never fit the file's limit
        raise ys.ValueProblem(f"`{node.text}` is too many blocks (at most {DD_MAX_BYTES}, the 64GiB file limit)")
    return n


def _dd_scratch(node: ys.YNode) -> str:
    checks.unquoted_placeholder(node)
    text = ys.as_str(node, "a directory")
    if checks.dev_path(text):  # dd writes its file there: never among devices
        raise ys.ValueProblem(f"`{text}` is under /dev: the dd scratch directory must be a real directory "
                              f"(e.g. {SCRATCH_PLACEHOLDER})")
    return checks.placeholder_path(text, "dd scratch directory", (SCRATCH_PLACEHOLDER,), directory=True)


_DD_RE = re.compile(r"^(\d+) bytes?(?: \([^)]*\))? copied, ([0-9.eE+-]+) s, ([0-9.,]+ ?[kMGTP]?B/s)\s*$",
                    re.MULTILINE)


def parse_dd_stderr(text: str) -> Dict[str, Any]:
    """{"bytes", "seconds", "rate"} from dd's summary line; BaselineError with dd's message without one."""
    matches = _DD_RE.findall(text)
    if not matches:
        msg = " ".join(ln.strip() for ln in text.splitlines() if ln.strip())
        raise BaselineError(f"dd printed no transfer summary: {msg[:300] or '(nothing)'}")
    nbytes, seconds, rate = matches[-1]
    return {"bytes": int(nbytes), "seconds": float(seconds), "rate": rate}


def parse_dd_wrapper(text: str) -> Dict[str, Any]:
    """{record kind: result or BaselineError} from the JSON line of `zcorch.worker.remote dd`."""
    try:
        doc = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise BaselineError(f"dd wrapper printed no JSON: {text[:200]!r}") from None
    out: Dict[str, Any] = {}
    for side, kind in SIDES:
        part = doc.get(side)
        if part is None:
            continue
        try:
            parsed = parse_dd_stderr(part["stderr"])
        except BaselineError as exc:
            out[kind] = exc
            continue
        result = {"bytes": parsed["bytes"], "dd_seconds": parsed["seconds"], "dd_rate": parsed["rate"],
                  "wall_s": part["wall_s"], "timed": part["timed"], "path": part.get("path", doc.get("path")),
                  "MB_per_s": parsed["bytes"] / part["wall_s"] / 1e6 if part["wall_s"] > 0 else None}
        if side == "read":
            result.update(cached=part["cached"], cache_note=part["cache_note"])
        out[kind] = result
    return out


def dd_directory(sink: str, scratch: str) -> str:
    """Where dd writes: the sink's directory (`{scratch}/x.dat` -> `{scratch}`), or scratch for a device."""
    return scratch if sink.startswith("/dev/") else sink.rsplit("/", 1)[0] or "/"


def dd_key(cfg: DdBaseline, directory: str, filesystem: Optional[str] = None) -> dict:
    """The `key` of a dd record: what it was run with; `sync: false` only when set (older sets' keys stay)."""
    key = {"bs": cfg.bs, "count": cfg.count, "directory": directory, "filesystem": filesystem,
           "bs_text": format_size(cfg.bs)}
    if not cfg.sync:
        key["sync"] = False
    return key


class DdKind(BaselineKind):
    name = "dd"
    settings = DdBaseline
    default_on = True
    phase = DIRECTORY
    record_kinds = {"dd_write": "dd write (the sink's disk)", "dd_read": "dd read",
                    "dd_fdatasync": "dd write with conv=fdatasync (its flush inside dd's timing)",
                    "dd_warmup": "dd write before the timed ones in a directory (left out of every figure)"}
    share_records = ("dd_write", "dd_read")
    filesystem_ceilings = ("dd_write", "dd_read")
    version_label = "dd"
    words = {"dd_write": "dd write", "dd_read": "dd read", "dd_fdatasync": "dd write conv=fdatasync"}
    match_keys = ("filesystem",)
    strict_keys = ("filesystem",)
    parsers = {
        "bs": lambda n: checks.positive_size(n, INT_MAX),
        "count": _dd_count,   # or `cells`
        "scratch": _dd_scratch,
        "repeats": lambda n: checks.int_range(n, 1, DD_MAX_REPEATS),
        "sync": ys.as_bool,
        "fdatasync": ys.as_bool,
        "warmup": ys.as_bool,
    }
    job = JOB
    jobs = (JOB,)

    def rate(self, result: Mapping[str, Any]) -> Optional[float]:
        """dd's bytes over the wall time of its timed wrapper (write + sync), as MB_per_s holds it."""
        value = result.get("MB_per_s") if isinstance(result, Mapping) else None
        return float(value) * 8e6 if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def parse(self, chk: Checker, node: ys.YNode, path: str) -> Any:
        conf = super().parse(chk, node, path)
        if conf is not None and conf.count == CELLS:
            return replace(conf, count=None, cells=True)   # bound by bind_cells once the cells are known
        return conf

    def bind_cells(self, conf: Optional[DdBaseline], largest_bytes: Optional[int]) -> Optional[DdBaseline]:
        """`count: cells` made a count of bs blocks covering `largest_bytes`; ys.ValueProblem when it cannot."""
        if conf is None or not conf.cells:
            return conf
        if largest_bytes is None:
            raise ys.ValueProblem("`count: cells` follows the cells' `bytes`, but no cell moves a byte count "
                                  "(they run for a `duration`): write a number of blocks")
        count = -(-largest_bytes // conf.bs)
        if conf.bs * count > DD_MAX_BYTES:
            raise ys.ValueProblem(f"`count: cells` makes {count} blocks of {format_size(conf.bs)} "
                                  f"({conf.bs * count} bytes), more than the limit of {DD_MAX_BYTES} (64GiB) "
                                  "for dd's file")
        return replace(conf, count=count)

    def check(self, chk: Checker, conf: DdBaseline, nodes: Dict[str, ys.YNode], node: ys.YNode, path: str) -> None:
        if conf.count == CELLS:   # checked when bound (bind_cells)
            return
        if conf.bs * conf.count > DD_MAX_BYTES:
            at = "count" if "count" in nodes else "bs" if "bs" in nodes else None
            chk.problem(nodes[at].pos if at else node.pos, f"{path}.{at}" if at else path,
                        f"bs × count = {conf.bs * conf.count} bytes, more than the limit of {DD_MAX_BYTES} "
                        f"(64GiB) for dd's file")

    def tools(self, conf: Any) -> Sequence[Tool]:
        return (Tool("dd", "coreutils", roles=("receiver",)),)

    def estimate(self, conf: DdBaseline, params_list: Sequence[Mapping[str, Any]], rate: float, overhead: float) -> Cost:
        filesystems = {p.get("filesystem") for p in params_list}
        # per filesystem: a write, a read (and an fdatasync write) per repeat, and a warm-up write once
        passes = len(filesystems) * ((2 + conf.fdatasync) * conf.repeats + conf.warmup)
        return Cost(passes, passes * (conf.bs * conf.count / rate + overhead), f"{passes} dd passes at the same rate")

    def job_args(self, conf: DdBaseline, directory: str, first: bool = True) -> List[Any]:
        """The arguments of `zcorch.worker.remote dd` for one directory (`first`: a warm-up write goes before)."""
        if conf.count is None:
            raise ValueError("dd `count: cells` was not bound to the cells (zcorch.config.validate binds it)")
        opts = (["--no-sync"] if not conf.sync else []) + (["--fdatasync"] if conf.fdatasync else []) \
            + (["--warmup"] if conf.warmup and first else [])
        return [directory, conf.bs, conf.count, *opts]

    def records_of(self, conf: DdBaseline, first: bool = True) -> Tuple[str, ...]:
        """The record kinds one job writes with these settings, in the order it runs them."""
        made = {"dd_write", "dd_read"} | ({"dd_fdatasync"} if conf.fdatasync else set()) \
            | ({"dd_warmup"} if conf.warmup and first else set())
        return tuple(kind for _, kind in SIDES if kind in made)

    def dry_run_job(self, job: str, args: Sequence[str]) -> "Optional[Tuple[str, str]]":
        if job != JOB:
            return None
        path = posixpath.join(args[0], ".zcorch-dd-PID-RANDOM")
        opts = args[3:]
        write = shlex.join(dd_write_argv(path, args[1], args[2]))
        note = (("warm-up: " + write + "; sync; rm; " if "--warmup" in opts else "")
                + f"{write}{'' if '--no-sync' in opts else '; sync'}; drop caches if root; "
                f"{shlex.join(dd_read_argv(path, args[1], args[2]))}"
                + ("; " + shlex.join(dd_write_argv(path, args[1], args[2], fdatasync=True))
                   if "--fdatasync" in opts else ""))
        return json.dumps({"not_measured": True}) + "\n", note

    def describe(self, record: Mapping[str, Any]) -> str:
        key = record.get("key") or {}
        where = f"bs={key.get('bs_text') or key.get('bs')} count={key.get('count')}"
        if key.get("sync") is False:
            where += " no sync"
        if key.get("filesystem"):
            where += f" on {key['filesystem']}"
        if record.get("repeat"):
            where += f" (repeat {record['repeat']})"
        return _describe((record.get("kind") or "?").replace("_", " "), where, record)


KIND = DdKind()
