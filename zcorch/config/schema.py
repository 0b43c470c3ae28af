"""The validated experiment: `Experiment` and its matrix `Axis` (frozen dataclasses, values normalised: sizes in
bytes, durations in seconds, `auto`/null as None), and the limits of the top level.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from zcorch import metrics
from zcorch.config import yamlsrc as ys
from zcorch.config.baselines import Baselines
from zcorch.config.filesystems import FilesystemConfig
from zcorch.config.hosts import Hosts
from zcorch.config.inventory import InventoryPair
from zcorch.config.networks import NetworkConfig
from zcorch.config.reference import Reference
from zcorch.config.views import View
from zcorch.params import DEFAULTS, SIZE_KEYS, format_value, param
from zcorch.worker import calcache

# The parameter table (zcorch.params) is the truth; these names stay importable (from zcorch.config.experiment too).
SEND_MODES = param("send_mode").choices
RECV_MODES = param("recv_mode").choices
SINK_STATES = param("sink_state").choices
ORDERS = ("sequential", "shuffle", "interleave")

SIZE_PARAMS = SIZE_KEYS

# Beyond these the plan (one dict per cell, one Run per repeat) exhausts memory before anything runs.
MAX_REPEATS = 10000
MAX_RUNS = 1_000_000
REPEAT_POLICY_KEYS = ("min", "max", "target_ci")
TOP_KEYS = ("name", "description", "hosts", "params", "matrix", "exclude", "include", "repeats", "order", "seed",
            "baselines", "filesystems", "skip_invalid", "allow_destroy", "reference", "report", "networks",
            "allow_network_changes", "calibration_max_age", "control")
# `calibration_max_age`: a host's cached copy-cost calibration older than this is measured anew.
DEFAULT_CALIBRATION_MAX_AGE_S = calcache.DEFAULT_MAX_AGE_S
# A linked axis (matrix entry that is not a parameter) names a results column: not one zcorch has already.
RESERVED_AXIS_NAMES = tuple(sorted({"cell", "repeat", "status", "reason", "started", "wall_s", "log", "sweep",
                                    "params", "matrix", "label", "same_host", "zc_verdict", "convergence",
                                    *metrics.BY_NAME}))
LABEL_KEY = "label"   # the key naming a value of a linked axis


@dataclass(frozen=True)
class Axis:
    """One matrix axis, its distinct values in file order (`linked`: mappings {parameter: value}, labelled)."""

    key: str
    values: list
    pos: ys.Pos
    linked: bool = False
    labels: "list[str]" = field(default_factory=list)

    @property
    def params(self) -> "tuple[str, ...]":
        """The parameters the axis sets."""
        return tuple(self.values[0]) if self.linked else (self.key,)

    def assignment(self, j: int) -> dict:
        """{parameter: value} of the axis's j-th value."""
        return dict(self.values[j]) if self.linked else {self.key: self.values[j]}

    def label_of(self, params: dict) -> Optional[str]:
        """A linked axis's label for a cell's parameters (derived if off the axis); None for a plain axis."""
        if not self.linked:
            return None
        mine = {k: params.get(k) for k in self.params}
        # compared as written, so a frame's row (NaN for null, 0.0 for 0 in a column with nulls) finds its label
        shown = {k: format_value(k, v) for k, v in mine.items()}
        for value, label in zip(self.values, self.labels):
            if all(shown[k] == format_value(k, v) for k, v in value.items()):
                return label
        return default_label(mine)


def default_label(assignment: dict) -> str:
    """The label of a linked-axis value written without `label:`: `send_cpu=0 recv_cpu=1` (`none` for null)."""
    return " ".join(f"{k}={format_value(k, v)}" for k, v in assignment.items())


@dataclass(frozen=True)
class RepeatPolicy:
    """`repeats: {min, max, target_ci}`: repeat a cell until its median's 95% interval is within target_ci %."""

    min: int
    max: int
    target_ci: float      # percent of the median (2.0 for `2%`)

    def as_dict(self) -> dict:
        """What plan.json's neighbours (manifest.json "repeats") and `zcorch plan --json` record."""
        return {"min": self.min, "max": self.max, "target_ci": self.target_ci}


@dataclass(frozen=True)
class Experiment:
    """A validated experiment file (zcorch.config.experiment.load_experiment builds it complete)."""

    name: str
    description: str
    path: str
    text: str                          # the raw file text (the run stage stores a byte copy)
    hosts: Hosts                       # localhost, or the sender's and receiver's HostSpec
    params: dict                       # the `params:` section, normalised (only the keys written)
    matrix: "list[Axis]"
    exclude: "list[dict]"              # each: {key: [accepted normalised values]} (a linked axis: [labels])
    include: "list[dict]"              # each: full cell params (defaults <- params <- 1-value axes <- entry)
    baselines: Baselines               # .iperf3 / .dd: their settings, None = off
    filesystems: "dict[str, FilesystemConfig]"   # name -> configuration, in file order
    repeats: int = 1                   # runs planned per cell: N of `repeats: N`, or the policy's max
    repeat_policy: Optional[RepeatPolicy] = None   # `repeats: {min, max, target_ci}`; None: every run planned runs
    order: str = "sequential"
    seed: int = 0
    skip_invalid: bool = False
    locations: "dict[str, ys.Pos]" = field(default_factory=dict)  # "include[0]", "exclude[1]", "matrix" ...
    allow_destroy: "tuple[str, ...]" = ()   # devices the user lets a `sink` overwrite (besides /dev/null)
    hosts_required: bool = False            # the file says `hosts: inventory` (hosts come from --hosts)
    inventory: Optional[InventoryPair] = None   # the pair given with --hosts / ZCORCH_HOSTS (then `hosts` is its)
    overrides: "tuple[str, ...]" = ()       # the --set KEY=VALUE applied, as given, in order
    effective: Optional[str] = None         # with --hosts or --set: the document as run (YAML text); else None
    reference: Optional[Reference] = None   # the published study this experiment reproduces (config.reference)
    views: "tuple[View, ...]" = ()          # `report: {views: [...]}`: the report's declared views (config.views)
    networks: "dict[str, NetworkConfig]" = field(default_factory=dict)  # `networks:` name -> configuration
    allow_network_changes: bool = False     # the top-level opt-in: `networks:` may change both hosts (localhost too)
    calibration_max_age: float = DEFAULT_CALIBRATION_MAX_AGE_S   # seconds a host's cached calibration is used
    # `control:` {parameter or linked axis: value} naming a cell, or a network baseline kind (`control: iperf3`)
    control: "Optional[dict | str]" = None

    def network_allowed(self, role: str) -> bool:
        """Whether a `networks:` entry may change `role`'s host: the top-level or the host's own opt-in."""
        return self.allow_network_changes or (not self.hosts.localhost
                                              and bool(self.hosts.spec(role).allow_network_changes))

    @property
    def hosts_unknown(self) -> bool:
        """`hosts: inventory` and no pair named yet (only `zcorch plan` accepts that): `hosts` is a stand-in."""
        return self.hosts_required and self.inventory is None

    def effective_text(self) -> str:
        """The experiment as it runs: `text` itself, or with --hosts/--set the effective document."""
        return self.text if self.effective is None else self.effective

    def base_params(self) -> dict:
        """Defaults overridden by the `params:` section: what every matrix cell starts from."""
        return base_params(self.params)

    def include_base(self) -> dict:
        """What an include entry starts from: base_params() plus every matrix axis that has one value."""
        return include_base(self.params, self.matrix)

    def linked_axes(self) -> "list[Axis]":
        """The linked axes of the matrix, in file order."""
        return [a for a in self.matrix if a.linked]

    def where(self, key: str) -> str:
        """`file:line:column` of a section or entry, for messages."""
        pos = self.locations.get(key)
        return ys.where(self.path, pos) if pos else self.path


def base_params(params: dict) -> dict:
    """Defaults overridden by a `params:` section: what every matrix cell starts from."""
    return {**DEFAULTS, **params}


def writes_bytes(params: dict, matrix: "Sequence[Axis]") -> bool:
    """Whether `bytes` is written in the `params:` section or by a matrix axis (not only its default)."""
    return "bytes" in params or any("bytes" in a.params for a in matrix)


def amount_of(cell: dict, bytes_written: bool) -> dict:
    """`cell` with the default `bytes` dropped for its `duration` unless the file wrote `bytes`."""
    if cell.get("duration") is not None and cell.get("bytes") is not None and not bytes_written:
        cell = dict(cell)
        cell["bytes"] = None
    return cell


def include_base(params: dict, matrix: "Sequence[Axis]") -> dict:
    """What an include entry starts from: base_params(params) plus every matrix axis that has one value."""
    base = base_params(params)
    for axis in matrix:
        if len(axis.values) == 1:
            base.update(axis.assignment(0))
    return base


def largest_bytes(params: dict, matrix: "Sequence[Axis]", include: "Sequence[dict]") -> Optional[int]:
    """The largest `bytes` a cell is written with (None: all run for a duration): dd's `count: cells`."""
    amounts = [c.get("bytes") for c in include]
    if matrix or not include:
        base, written = include_base(params, matrix), writes_bytes(params, matrix)
        values = [a.assignment(j)["bytes"] for a in matrix if "bytes" in a.params for j in range(len(a.values))]
        amounts += [amount_of({**base, "bytes": v}, written)["bytes"] for v in (values or [base["bytes"]])]
    found = [int(b) for b in amounts if b is not None]
    return max(found) if found else None
