"""The effective document: an experiment as a sweep runs it, after `--set` and `--hosts`, stored as the result
set's `experiment.yaml` (read back by `--resume` and the reports, so it must read back the same).
"""
from __future__ import annotations

import json
import os
import re
from typing import Any

import yaml

from zcorch.config import yamlsrc as ys
from zcorch.config.schema import Experiment


class _Dumper(yaml.SafeDumper):
    """safe_dump without anchors (a value the file wrote once through an alias is written out each time)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def effective_document(root: ys.YNode, exp: Experiment, targets: "list[str]") -> str:
    """The document as it runs (--set values, the inventory's hosts) under a header naming each."""
    data = ys.to_data(root)
    source = os.path.abspath(exp.path) if not exp.path.startswith("<") else exp.path
    head = ["# zcorch run: the experiment as this sweep runs it, not the file as written:",
            f"#   file:  {_one_line(source)}"]
    if exp.inventory is not None:
        inv = exp.inventory
        head.append(f"#   hosts: pair `{inv.pair}` of the inventory {_one_line(inv.path)} "
                    f"(sha256 {inv.sha256[:16]}...)")
        hosts = exp.hosts.to_data()
        if "hosts" in data:
            data["hosts"] = hosts
        else:  # after name/description, where a file writes it
            items = list(data.items())
            at = sum(1 for k, _ in items[:2] if k in ("name", "description"))
            data = dict(items[:at] + [("hosts", hosts)] + items[at:])
    for text, target in zip(exp.overrides, targets):
        head.append(f"#   --set {_one_line(text)}" + (f"   ({target})" if target != text.partition("=")[0] else ""))
    body = yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, default_flow_style=None,
                     width=110)
    return "\n".join(head) + "\n" + body


def _one_line(text: str) -> str:
    """`text` for a comment line: control characters (a newline in a --set value or a file name) escaped."""
    return re.sub(r"[\x00-\x1f\x7f]", lambda m: json.dumps(m.group(0))[1:-1], text)


# The fields the effective document must give back unchanged (the matrix is compared by its axes' values).
READ_BACK_FIELDS = ("name", "description", "hosts", "params", "exclude", "include", "baselines", "filesystems",
                    "repeats", "order", "seed", "skip_invalid", "allow_destroy", "reference", "views", "networks",
                    "allow_network_changes")


def read_back_differences(exp: Experiment, again: Experiment) -> "list[str]":
    """The fields where `again` (the effective document of `exp`, read back) differs from `exp`."""
    differ = [f for f in READ_BACK_FIELDS if getattr(again, f) != getattr(exp, f)]
    if [(a.key, a.values, a.labels) for a in again.matrix] != [(a.key, a.values, a.labels) for a in exp.matrix]:
        differ.append("matrix")
    return differ
