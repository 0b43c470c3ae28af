"""Experiment files: `load_experiment(path)` reads one YAML file into a normalised `Experiment`, or raises one
`ConfigError` listing every problem as `file:line:column: key.path: message` (docs/experiment-files.md).
The work lives in the modules below this one; their public names stay importable from here.
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Optional, Sequence

from zcorch.config import overrides as _overrides
from zcorch.config import yamlsrc as ys
from zcorch.config.cells import cell_problems, filesystem_problem
from zcorch.config.effective import effective_document, read_back_differences
from zcorch.config.inventory import InventoryPair
from zcorch.config.param_values import PARAM_PARSERS, parse_param
from zcorch.config.schema import (LABEL_KEY, MAX_REPEATS, MAX_RUNS, ORDERS, RECV_MODES, RESERVED_AXIS_NAMES,
                                  SEND_MODES, SINK_STATES, SIZE_PARAMS, TOP_KEYS, Axis, Experiment, default_label)
from zcorch.config.sections import linked_axes_of, reference_of, views_of
from zcorch.config.validate import Validator
from zcorch.params import DEFAULTS, PARAM_KEYS, format_value

__all__ = ["DEFAULTS", "LABEL_KEY", "MAX_REPEATS", "MAX_RUNS", "ORDERS", "PARAM_KEYS", "PARAM_PARSERS",
           "RECV_MODES", "RESERVED_AXIS_NAMES", "SEND_MODES", "SINK_STATES", "SIZE_PARAMS", "TOP_KEYS", "Axis",
           "Experiment", "cell_problems", "default_label", "filesystem_problem", "format_value", "linked_axes_of",
           "load_experiment", "parse_experiment", "parse_param", "reference_of", "views_of"]

# `{scratch}` not preceded by a quote: YAML reads it as a flow mapping (a syntax error, or a mapping).
_UNQUOTED_PLACEHOLDER_RE = re.compile(r"(^|[\s,\[:])\{(scratch|filesystem)\}")


def load_experiment(path: "str | os.PathLike", overrides: "Sequence[str]" = (),
                    hosts: Optional[InventoryPair] = None, unknown_hosts: bool = False) -> Experiment:
    """Read and validate an experiment file (ConfigError lists every problem), `--set` overrides applied, `hosts`
    replacing the file's; unknown_hosts: a `hosts: inventory` file without them is valid (`zcorch plan`)."""
    path = os.fspath(path)
    text, _ = ys.read_text(path, "the experiment file")
    return parse_experiment(text, path, overrides, hosts, unknown_hosts)


def parse_experiment(text: str, path: str = "<experiment>", overrides: "Sequence[str]" = (),
                     hosts: Optional[InventoryPair] = None, unknown_hosts: bool = False) -> Experiment:
    """Validate experiment-file text (`path` only names it); see load_experiment."""
    ovs = _overrides.parse_overrides(overrides)
    root, raw_problems = ys.parse(text, path)
    # with --hosts, a --set of hosts.* is refused (below) and not applied
    host_sets = [ov for ov in ovs if hosts is not None and ov.key.split(".")[0] == "hosts"]
    ovs = [ov for ov in ovs if ov not in host_sets]
    v = Validator(path, hosts, tuple(ov.text for ov in ovs), unknown_hosts)
    lines = text.splitlines()
    for pos, key, msg in raw_problems:
        line = lines[pos.line - 1] if 0 < pos.line <= len(lines) else ""
        unquoted = _UNQUOTED_PLACEHOLDER_RE.search(line)
        if msg.startswith("YAML syntax error") and unquoted:
            msg += f"; quote a value that starts with a placeholder: \"{{{unquoted.group(2)}}}/FILE\""
        v.problem(pos, key, msg)
    if root is None:
        v.raise_if_any()
    for ov in host_sets:
        v.problem(ov.value.pos, "hosts", f"the hosts come from {hosts.describe()} (--hosts / ZCORCH_HOSTS): "
                                         "change them there, not with --set")
    targets: "list[str]" = []
    if ovs and isinstance(root, ys.YMap):
        root, problems, targets = _overrides.apply(root, ovs, TOP_KEYS, PARAM_KEYS)
        for problem in problems:
            v.problem(*problem)
    exp = v.experiment(root, text)
    v.raise_if_any()
    if ovs or hosts is not None:
        exp = dataclasses.replace(exp, effective=effective_document(root, exp, targets))
        _check_effective(exp)
    return exp


def _check_effective(exp: Experiment) -> None:
    """The effective document must read back to the experiment that runs (--resume and reports read it)."""
    differ = read_back_differences(exp, parse_experiment(exp.effective or "", exp.path,
                                                         unknown_hosts=exp.hosts_unknown))
    if differ:  # a bug, not a user mistake
        raise AssertionError(f"{exp.path}: the effective document reads back differently ({', '.join(differ)})")
