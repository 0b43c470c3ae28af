"""What a baseline kind declares (one module per kind in this package, listed in `registry.py`): pure data and
functions for its schema, estimate, dry run, preflight tools and output parser, importable by every stage.
A tool measuring the path with a server and a client (iperf3, qperf) is a `ServerClientKind`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from zcorch.config import checks
from zcorch.config import yamlsrc as ys
from zcorch.config.checks import Checker
from zcorch.errors import ZcorchError
from zcorch.params import side_value
from zcorch.units import format_size

# The phases of the sweep a kind runs in (zcorch.sweep.pipeline iterates the registry per phase).
NETWORK = "network"        # before the sources are laid out: the path alone (iperf3, qperf)
COMMANDS = "commands"      # after the sources are laid out: the user's own transfer commands
DIRECTORY = "directory"    # before the first run into each sink directory (dd)

PER_CHOICES = ("pair", "sweep")  # `per: sweep` = once; `pair` = once per distinct cell (window, buffer)
MAX_TOOL_SECONDS = 86400.0       # iperf3 refuses a longer test (`test duration too long`): so do we
DRY_RUN = "dry run: not measured"


class BaselineError(ZcorchError):
    """A baseline tool ran but its output says it failed (message from the tool)."""


@dataclass(frozen=True)
class Tool:
    """A program a kind runs on a host (the preflight looks for it there)."""

    program: str                      # argv[0]
    package: str                      # the Debian package holding it
    roles: Tuple[str, ...] = ("sender", "receiver")
    version_argv: Tuple[str, ...] = ("--version",)   # how a host is asked whether it can run it

    def install_hint(self) -> str:
        return f"apt-get install {self.package}"


@dataclass(frozen=True)
class Cost:
    """A kind's share of `zcorch plan`'s estimate."""

    tests: int                        # how many tests/passes it runs
    seconds: float
    what: str                         # e.g. "4 iperf3 tests of duration+omit+overhead"


class BaselineKind:
    """The declarations every kind makes; a kind module defines a subclass and one instance, KIND."""

    name: str = ""                    # the key under `baselines:`
    settings: Any = None              # frozen dataclass of the kind's settings
    default_on: bool = False          # on when `baselines:` is not written (iperf3 and dd, as the seeds)
    phase: str = NETWORK
    record_kinds: Mapping[str, str] = {}   # the `kind` of its baselines.jsonl records -> what it measures
    # reference.baselines: a record kind's words, the keys matched against a cell's (strict: never another's)
    words: Mapping[str, str] = {}
    match_keys: Tuple[str, ...] = ()
    strict_keys: Tuple[str, ...] = ()
    match_fixed: Mapping[str, Any] = {}
    parsers: Mapping[str, Callable[[ys.YNode], Any]] = {}   # setting -> value parser (file:line on error)
    jobs: Tuple[str, ...] = ()        # zcorch.worker.remote host jobs it runs (dd's `dd`)
    # What the analysis asks of a kind, so that it names no tool: the record kinds a throughput is a share of,
    # those shown per receiving filesystem, a published figure's default reference, its tool's version label.
    share_records: Tuple[str, ...] = ()
    filesystem_ceilings: Tuple[str, ...] = ()   # record kinds measured per receiving filesystem (match key)
    figure_reference: str = ""
    version_label: str = ""

    def rate(self, result: Mapping[str, Any]) -> Optional[float]:
        """Bits per second a record's result reports (what `control: <kind>` divides by); None without one."""
        value = result.get("bits_per_second") if isinstance(result, Mapping) else None
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    @property
    def off(self) -> Any:
        """The value of a kind that does not run (None; a list kind: ())."""
        return None

    def default(self) -> Any:
        return self.settings() if self.default_on else self.off

    def parse(self, chk: Checker, node: ys.YNode, path: str) -> Any:
        """`baselines.<kind>:` (`true`, `false`: self.off, or a mapping of self.parsers' keys) -> settings."""
        if isinstance(node, ys.YScalar) and node.tag == ys.BOOL and node.plain:
            return self.settings() if chk.value(node, path, ys.as_bool, True) else self.off
        values, nodes = {}, {}
        for key, (_, v) in chk.mapping(node, path, tuple(self.parsers), f"{self.name} settings").items():
            val = chk.value(v, f"{path}.{key}", self.parsers[key], None)
            if val is not None:
                values[key], nodes[key] = val, v
        conf = replace(self.settings(), **values)
        self.check(chk, conf, nodes, node, path)
        return conf

    def check(self, chk: Checker, conf: Any, nodes: Dict[str, ys.YNode], node: ys.YNode, path: str) -> None:
        """Rules across settings (e.g. dd's bs × count); problems to `chk` at the setting's node."""

    def bind_cells(self, conf: Any, largest_bytes: Optional[int]) -> Any:
        """The settings made concrete for the cells' largest `bytes` (dd's `count: cells`)."""
        return conf

    def as_dict(self, conf: Any) -> "Dict[str, Any]":
        """The settings as `zcorch plan` shows them."""
        return {f.name: getattr(conf, f.name) for f in fields(conf)}

    def tools(self, conf: Any) -> Sequence[Tool]:
        """The programs it runs with settings `conf` (also asked with self.default(), which may be off)."""
        return ()

    def ports(self, conf: Any) -> Sequence[int]:
        """Fixed ports it listens on on a remote receiver (the preflight checks they are free)."""
        return ()

    def estimate(self, conf: Any, params_list: Sequence[Mapping[str, Any]], rate: float, overhead: float) -> Cost:
        return Cost(0, 0.0, f"{self.name}: not estimated")

    def dry_run(self, argv: Sequence[str]) -> "Optional[Tuple[int, str, str]]":
        """(exit status, stdout, stderr) a dry run answers for one of its commands (None: not one of them)."""
        for tool in self.tools(self.default()):
            if list(argv) == [tool.program, *tool.version_argv]:
                return 0, f"{tool.program} ({DRY_RUN})\n", ""
        return None

    def dry_run_lines(self, argv: Sequence[str]) -> "Optional[List[str]]":
        """What one of its commands prints when started in a dry run (None: not one of its commands)."""
        return None

    def dry_run_job(self, job: str, args: Sequence[str]) -> "Optional[Tuple[str, str]]":
        """(stdout, note) in a dry run of its zcorch.worker.remote host job `job` (None: not its job)."""
        return None

    def describe(self, record: Mapping[str, Any]) -> str:
        """One line for a baseline record of this kind (the end-of-run summary)."""
        what = str(record.get("kind") or self.name).replace("_", " ")
        key = record.get("key") or {}
        where = " ".join(f"{k}={v}" for k, v in key.items())
        return _describe(what, where, record)


def _describe(what: str, where: str, record: Mapping[str, Any]) -> str:
    if record.get("status") != "ok":
        return f"{what} ({where}): {record.get('status')}: {record.get('reason')}"
    result = record.get("result") or {}
    figure = (f"{result['bits_per_second'] / 1e9:.2f} Gbit/s" if "bits_per_second" in result
              else f"{result.get('MB_per_s', float('nan')):.0f} MB/s")
    return f"{what} ({where}): {figure}{' (cached)' if result.get('cached') else ''}"


class ServerClientKind(BaselineKind):
    """A tool measuring the path alone: a server on the receiver, a client on the sender (parsed)."""

    phase = NETWORK
    port: int = 0                     # on a remote receiver
    ready_marker: Optional[str] = None   # a line of the server's saying it listens (None: the client waits)
    busy_marker: Optional[str] = None    # a server message meaning the port is taken (retried a while)

    def ports(self, conf: Any) -> Sequence[int]:
        return (self.port,)

    def keys(self, conf: Any, params_list: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
        """The tests to run: one record key each."""
        raise NotImplementedError

    def commands(self, conf: Any, key: Mapping[str, Any], address: str, port: int) -> Tuple[List[str], List[str]]:
        """(server argv, client argv) of one test."""
        raise NotImplementedError

    def refusal(self, conf: Any, key: Mapping[str, Any]) -> Optional[str]:
        """Why the tool cannot run the test of `key` (recorded as skipped, not started to fail), or None."""
        return None

    def test_seconds(self, conf: Any) -> float:
        """How long one test transfers (the client's timeout is this plus a margin)."""
        raise NotImplementedError

    def parse_output(self, text: str) -> Dict[str, Any]:
        """The client's stdout -> the record's result; BaselineError with the tool's words on failure."""
        raise NotImplementedError

    def control_key(self, conf: Any) -> Dict[str, Any]:
        """The one test `control: <kind>` runs in every round: its key of `per: sweep` (the tool's own sizes)."""
        return self.keys(replace(conf, per="sweep"), ())[0]

    def estimate(self, conf: Any, params_list: Sequence[Mapping[str, Any]], rate: float, overhead: float) -> Cost:
        n = len(self.keys(conf, params_list))
        return Cost(n, n * (self.test_seconds(conf) + overhead), f"{n} {self.name} tests of their duration+overhead")

    def dry_run(self, argv: Sequence[str]) -> "Optional[Tuple[int, str, str]]":
        known = super().dry_run(argv)
        if known is None and argv and argv[0] == self.tools(self.settings())[0].program:
            # the client: it ran, measured nothing (its output parses as no result: the record is `failed`)
            return 0, f"{DRY_RUN}\n", ""
        return known

    def dry_run_lines(self, argv: Sequence[str]) -> "Optional[List[str]]":
        # the server's start: it "listens" at once
        ours = argv and argv[0] == self.tools(self.settings())[0].program
        return [f"{self.ready_marker or 'listening'} ({DRY_RUN})"] if ours else None


# -- helpers the kinds share -------------------------------------------------------------------

def tool_duration(node: ys.YNode) -> float:
    """A test duration: > 0 and at most a day (iperf3's own limit; qperf's too here)."""
    secs = checks.positive_duration(node)
    if secs > MAX_TOOL_SECONDS:
        raise ys.ValueProblem(f"`{node.text}` is too long for a baseline test (at most 1 day = "
                              f"{MAX_TOOL_SECONDS:.0f}s)")
    return secs


def per_choice(node: ys.YNode) -> str:
    """`per: pair | sweep` of a kind measuring the path (PER_CHOICES)."""
    return checks.choice(node, PER_CHOICES, "baseline frequency")


def sizes_where(key: Mapping[str, Any]) -> str:
    """`buffer=128KiB window=auto`: the cell sizes a network test's record key holds."""
    return " ".join(f"{k}={format_size(key[k]) if key.get(k) else 'auto'}" for k in ("buffer", "window"))


def whole_seconds(duration: float) -> int:
    """Tools take whole seconds and read 0 as "forever": round up, at least 1."""
    return max(1, math.ceil(duration))


def cell_pairs(per: str, params_list: Sequence[Mapping[str, Any]]) -> "List[Tuple[Optional[int], Optional[int]]]":
    """(window, sender buffer) per distinct cell (`per: pair`), or [(None, None)] (`per: sweep`)."""
    if per == "sweep":
        return [(None, None)]
    pairs: "List[Tuple[Optional[int], Optional[int]]]" = []
    for p in params_list:
        w = p.get("window")
        w = None if w in (None, "auto") else int(w)
        pair = (w, side_value("send", p, "buffer"))  # the sender's call size
        if pair not in pairs:
            pairs.append(pair)
    return pairs
