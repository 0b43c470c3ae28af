"""The `baselines:` section: what the run stage (zcorch.sweep.baselines) measures before the cells.

    baselines:                      # not written: both kinds with their defaults (as the seeds did)
      iperf3: {duration: 2s, per: pair, omit: 0}     # `per: sweep` = once; `pair` = per (window, buffer)
      dd: {bs: 1MiB, count: 64, scratch: "{scratch}"}  # count may be size-like (512k blocks)
    baselines: false                # neither; `iperf3: false` / `dd: false` turn one off
    baselines:
      commands:                     # the user's own transfer commands, timed like the others
        - name: nc
          receiver: [nc, -l, "{port}"]                 # argv lists: never a shell string
          sender: [nc, -N, "{address}", "{port}"]
          stdin: source             # the sender's stdin is the source file; stdout: sink = the receiver's
          stdout: sink              #   stdout goes into the sink file
          bytes: 1GiB               # default: the largest `bytes` of the cells
          repeats: 3                # default 1
          timeout: 5m               # default 10m

`Baselines.iperf3` / `.dd` are None when that kind is off; `.commands` is a tuple of CommandBaseline.
Placeholders in a command's argv: {address} (the receiver's data address), {port} (a free port on the
receiver), {source} (a file on the sender the sweep lays out with `bytes` of the mem pattern, in the
scratch directory), {sink} (a file on the receiver's scratch directory, removed after each run), {bytes}.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from typing import Any, Mapping, Optional, Tuple

from zcorch.config import checks
from zcorch.params import INT_MAX
from zcorch.config import yamlsrc as ys
from zcorch.config.checks import SCRATCH_PLACEHOLDER, Checker

PER_CHOICES = ("pair", "sweep")
DD_MAX_BYTES = 64 * 1024 ** 3  # bs × count: the file dd writes (the host's free space is checked too)


@dataclass(frozen=True)
class Iperf3Baseline:
    """iperf3 between the hosts' data addresses (plain and -Z) before the cells."""

    duration: float = 2.0    # seconds (iperf3 -t, rounded up to whole seconds)
    per: str = "pair"        # "pair": once per distinct (window, buffer) of the cells; "sweep": once
    omit: int = 0            # iperf3 -O: seconds of slow start left out


@dataclass(frozen=True)
class DdBaseline:
    """dd write + read on the receiver, in each directory a sink lives in."""

    bs: int = 1024 ** 2
    count: int = 64
    # Where dd writes when the sink is a device (/dev/null): the per-user scratch directory by default (a
    # predictable name in a shared /tmp is anyone's to pre-create); may be {scratch}[/DIR] or a directory.
    scratch: str = SCRATCH_PLACEHOLDER


COMMAND_PLACEHOLDERS = ("address", "port", "source", "sink", "bytes")
COMMAND_STDIN = ("source",)
COMMAND_STDOUT = ("sink",)
_PLACEHOLDER_RE = re.compile(r"\{([^{}]*)\}")
_COMMAND_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,39}$")


@dataclass(frozen=True)
class CommandBaseline:
    """A user's transfer command pair (sender, receiver argv with placeholders), timed like iperf3/dd."""

    name: str
    sender: Tuple[str, ...]
    receiver: Tuple[str, ...]
    stdin: Optional[str] = None       # "source": the sender's stdin is the laid-out source file
    stdout: Optional[str] = None      # "sink": the receiver's stdout goes into the sink file
    bytes: Optional[int] = None       # None: the largest `bytes` of the cells
    repeats: int = 1
    timeout: float = 600.0

    def uses(self, placeholder: str) -> bool:
        """Whether an argv item names `{placeholder}`, or stdin/stdout wires it."""
        wired = {"source": self.stdin == "source", "sink": self.stdout == "sink"}.get(placeholder, False)
        return wired or any("{" + placeholder + "}" in a for a in self.sender + self.receiver)


@dataclass(frozen=True)
class Baselines:
    iperf3: Optional[Iperf3Baseline] = Iperf3Baseline()
    dd: Optional[DdBaseline] = DdBaseline()
    commands: Tuple[CommandBaseline, ...] = ()

    def kinds(self) -> "list[tuple[str, Any]]":
        """[("iperf3", Iperf3Baseline | None), ("dd", DdBaseline | None)], in file order."""
        return [("iperf3", self.iperf3), ("dd", self.dd)]

    @classmethod
    def from_mapping(cls, data: "Mapping | bool | None", path: str = "<baselines>") -> "Baselines":
        """Validate plain data (as the section would be written) through the file's parser."""
        return checks.parse_data("baselines", data, parse_baselines, path)


BASELINES_OFF = Baselines(iperf3=None, dd=None)
_KINDS = {"iperf3": Iperf3Baseline, "dd": DdBaseline}
_SECTION_KEYS = (*_KINDS, "commands")


def _argv(node: ys.YNode) -> Tuple[str, ...]:
    """A command as an argv list of strings (numbers are taken as written); placeholders checked."""
    if not isinstance(node, ys.YSeq) or not node.items:
        raise ys.ValueProblem(f"expected a non-empty list of arguments (argv, never a shell string), "
                              f"got {ys.describe(node)}")
    out = []
    for item in node.items:
        if not isinstance(item, ys.YScalar) or item.is_null:
            raise ys.ValueProblem(f"every argument must be a string, got {ys.describe(item)}")
        checks.check_no_control(item.text, "argument")
        for name in _PLACEHOLDER_RE.findall(item.text):
            if name not in COMMAND_PLACEHOLDERS:
                raise ys.ValueProblem(f"unknown placeholder `{{{name}}}` in `{item.text}`{checks.suggest(name, COMMAND_PLACEHOLDERS)} "
                                      f"(expected {', '.join('{' + p + '}' for p in COMMAND_PLACEHOLDERS)})")
        if _PLACEHOLDER_RE.sub("", item.text).count("{") or _PLACEHOLDER_RE.sub("", item.text).count("}"):
            raise ys.ValueProblem(f"unbalanced brace in `{item.text}`")
        out.append(item.text)
    return tuple(out)


def _command_name(node: ys.YNode) -> str:
    text = ys.as_str(node, "a name")
    if not _COMMAND_NAME_RE.match(text):
        raise ys.ValueProblem(f"`{text}` is not a valid command baseline name (a letter, then up to 39 "
                              "letters, digits, `_`, `.` or `-`)")
    return text


_COMMAND_PARSERS = {
    "name": _command_name,
    "sender": _argv,
    "receiver": _argv,
    "stdin": lambda n: checks.choice(n, COMMAND_STDIN, "stdin (the sender's)"),
    "stdout": lambda n: checks.choice(n, COMMAND_STDOUT, "stdout (the receiver's)"),
    "bytes": lambda n: checks.positive_size(n, DD_MAX_BYTES),
    "repeats": lambda n: checks.int_range(n, 1, 100),
    "timeout": checks.positive_duration,
}
assert set(_COMMAND_PARSERS) == {f.name for f in fields(CommandBaseline)}


def _parse_commands(chk: Checker, node: ys.YNode) -> Tuple[CommandBaseline, ...]:
    if not isinstance(node, ys.YSeq):
        chk.problem(node.pos, "baselines.commands", f"expected a list of commands, got {ys.describe(node)}")
        return ()
    out, seen = [], set()
    for i, item in enumerate(node.items):
        path = f"baselines.commands[{i}]"
        values = {}
        for key, (_, v) in chk.mapping(item, path, tuple(_COMMAND_PARSERS), "command baseline settings").items():
            val = chk.value(v, f"{path}.{key}", _COMMAND_PARSERS[key], None)
            if val is not None:
                values[key] = val
        if not isinstance(item, ys.YMap):
            continue
        missing = [k for k in ("name", "sender", "receiver") if k not in item.entries]
        if missing:
            chk.problem(item.pos, path, f"missing {', '.join(f'`{k}`' for k in missing)}")
            continue
        if not {"name", "sender", "receiver"} <= set(values):
            continue  # already reported
        if values["name"] in seen:
            chk.problem(item.entries["name"][1].pos, f"{path}.name", f"`{values['name']}` is used twice")
        seen.add(values["name"])
        cmd = CommandBaseline(**values)
        if "{port}" not in " ".join(cmd.receiver) + " ".join(cmd.sender):
            chk.problem(item.pos, path, "neither command names `{port}`: the receiver must listen on the port "
                                        "zcorch picks (it waits for it before starting the sender)")
        out.append(cmd)
    return tuple(out)


def _dd_count(node: ys.YNode) -> int:
    # dd reads `count=512k` as 512*1024 blocks, and the seeds wrote it so: accept a size-like count.
    n = ys.as_size(node, "a block count (e.g. 16384 or 512k)")
    if n < 1:
        raise ys.ValueProblem(f"expected a count ≥ 1, got `{node.text}`")
    return n


def _dd_scratch(node: ys.YNode) -> str:
    checks.unquoted_placeholder(node)
    text = ys.as_str(node, "a directory")
    if checks.dev_path(text):  # dd writes its file there: never among devices
        raise ys.ValueProblem(f"`{text}` is under /dev: the dd scratch directory must be a real directory "
                              f"(e.g. {SCRATCH_PLACEHOLDER})")
    return checks.placeholder_path(text, "dd scratch directory", (SCRATCH_PLACEHOLDER,), directory=True)


_PARSERS = {
    "iperf3": {
        "duration": checks.positive_duration,
        "per": lambda n: checks.choice(n, PER_CHOICES, "baseline frequency"),
        "omit": lambda n: checks.int_range(n, 0),
    },
    "dd": {
        "bs": lambda n: checks.positive_size(n, INT_MAX),
        "count": _dd_count,
        "scratch": _dd_scratch,
    },
}
assert all({f.name for f in fields(_KINDS[k])} == set(p) for k, p in _PARSERS.items())


def parse_baselines(chk: Checker, node: "ys.YNode | None") -> Baselines:
    """The `baselines:` node (None: not written); problems go to `chk`."""
    if checks.is_null(node):
        return Baselines()
    assert node is not None
    if checks.is_off(node):
        return BASELINES_OFF
    out: "dict[str, Any]" = {kind: cls() for kind, cls in _KINDS.items()}
    for kind, (_, child) in chk.mapping(node, "baselines", _SECTION_KEYS, "baseline kinds").items():
        path = f"baselines.{kind}"
        if checks.is_null(child):
            continue
        if kind == "commands":
            out[kind] = _parse_commands(chk, child)
            continue
        if isinstance(child, ys.YScalar) and child.tag == ys.BOOL and child.plain:
            if not chk.value(child, path, ys.as_bool, True):
                out[kind] = None
            continue
        values, nodes = {}, {}
        for key, (_, v) in chk.mapping(child, path, tuple(_PARSERS[kind]), f"{kind} settings").items():
            val = chk.value(v, f"{path}.{key}", _PARSERS[kind][key], None)
            if val is not None:
                values[key], nodes[key] = val, v
        out[kind] = replace(out[kind], **values)
        dd = out[kind]
        if isinstance(dd, DdBaseline) and dd.bs * dd.count > DD_MAX_BYTES:
            at = "count" if "count" in nodes else "bs" if "bs" in nodes else None
            chk.problem(nodes[at].pos if at else child.pos, f"{path}.{at}" if at else path,
                        f"bs × count = {dd.bs * dd.count} bytes, more than the limit of {DD_MAX_BYTES} "
                        f"(64GiB) for dd's file")
    return Baselines(**out)
