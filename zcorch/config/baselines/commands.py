"""`baselines.commands`: the user's own transfer commands (argv lists, never a shell string), timed like the
other baselines (docs/experiment-files.md); each end runs under `zcorch worker command`.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from zcorch.config import checks
from zcorch.config import yamlsrc as ys
from zcorch.config.baselines.dd import DD_MAX_BYTES
from zcorch.config.baselines.kind import COMMANDS, DRY_RUN, BaselineKind, Cost
from zcorch.config.checks import Checker

COMMAND_PLACEHOLDERS = ("address", "port", "source", "sink", "bytes")
COMMAND_STDIN = ("source",)
COMMAND_STDOUT = ("sink",)
MAX_REPEATS = 100
RECORD_KIND = "command"
DEFAULT_BYTES = 1 << 30        # when no cell says how much
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


def command_bytes(cmd: CommandBaseline, params_list: Sequence[Mapping[str, Any]]) -> int:
    """How much one run moves: the command's `bytes`, else the largest of the cells. Pure."""
    return cmd.bytes or max((int(p["bytes"]) for p in params_list if p.get("bytes")), default=DEFAULT_BYTES)


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
    "repeats": lambda n: checks.int_range(n, 1, MAX_REPEATS),
    "timeout": checks.positive_duration,
}
assert set(_COMMAND_PARSERS) == {f.name for f in fields(CommandBaseline)}


def _worker_action(argv: Sequence[str]) -> Optional[str]:
    """ACTION of a worker command line (`... -m zcorch.worker ACTION ...`)."""
    return next((argv[i + 1] for i in range(1, len(argv) - 1) if argv[i - 1] == "-m" and argv[i] == "zcorch.worker"),
                None)


def _dry_exit() -> str:
    return json.dumps({"event": "exit", "rc": 0, "wall_s": None, "stderr": DRY_RUN, "sink_bytes": None,
                       "error": None, "not_measured": True}) + "\n"


class CommandsKind(BaselineKind):
    name = "commands"
    settings = CommandBaseline
    phase = COMMANDS
    record_kinds = {RECORD_KIND: "a command baseline (reference.baselines names it `command:NAME`)"}
    parsers = _COMMAND_PARSERS

    @property
    def off(self) -> Any:
        return ()

    def parse(self, chk: Checker, node: ys.YNode, path: str) -> Tuple[CommandBaseline, ...]:
        if not isinstance(node, ys.YSeq):
            chk.problem(node.pos, path, f"expected a list of commands, got {ys.describe(node)}")
            return ()
        out, seen = [], set()
        for i, item in enumerate(node.items):
            where = f"{path}[{i}]"
            fields = chk.mapping(item, where, tuple(_COMMAND_PARSERS), "command baseline settings")
            values = {key: chk.value(v, f"{where}.{key}", _COMMAND_PARSERS[key]) for key, (_, v) in fields.items()}
            values = {key: value for key, value in values.items() if value is not None}
            if not isinstance(item, ys.YMap):
                continue
            missing = [k for k in ("name", "sender", "receiver") if k not in item.entries]
            if missing:
                chk.problem(item.pos, where, f"missing {', '.join(f'`{k}`' for k in missing)}")
                continue
            if not {"name", "sender", "receiver"} <= set(values):
                continue  # already reported
            if values["name"] in seen:
                chk.problem(item.entries["name"][1].pos, f"{where}.name", f"`{values['name']}` is used twice")
            seen.add(values["name"])
            cmd = CommandBaseline(**values)
            if "{port}" not in " ".join(cmd.receiver) + " ".join(cmd.sender):
                chk.problem(item.pos, where, "neither command names `{port}`: the receiver must listen on the port "
                                             "zcorch picks (it waits for it before starting the sender)")
            out.append(cmd)
        return tuple(out)

    def estimate(self, conf: Sequence[CommandBaseline], params_list: Sequence[Mapping[str, Any]], rate: float,
                 overhead: float) -> Cost:
        runs = sum(c.repeats for c in conf)
        secs = sum(c.repeats * (min(command_bytes(c, params_list) / rate, c.timeout) + overhead) for c in conf)
        return Cost(runs, secs, f"{runs} command runs of bytes at the same rate")

    def dry_run(self, argv: Sequence[str]) -> "Optional[Tuple[int, str, str]]":
        # an end of a command pair (`zcorch worker command ...`): not run, nothing to check
        return (0, _dry_exit(), "") if _worker_action(argv) == "command" else None

    def dry_run_lines(self, argv: Sequence[str]) -> "Optional[List[str]]":
        if _worker_action(argv) != "command":
            return None
        first = {"event": "ready"} if "--wait-go" in argv else {"event": "listening", "port": 0}
        return [json.dumps(dict(first, not_measured=True)) + "\n", _dry_exit()]

    def describe(self, record: Mapping[str, Any]) -> str:
        k = record.get("key") or {}
        what = f"command {k.get('name')} ({k.get('bytes')} bytes, repeat {record.get('repeat', 0)})"
        if record.get("status") != "ok":
            return f"{what}: {record.get('status')}: {record.get('reason')}"
        r = record["result"]
        return f"{what}: {r['bits_per_second'] / 1e9:.2f} Gbit/s = {r['MB_per_s']:.0f} MB/s"


KIND = CommandsKind()
