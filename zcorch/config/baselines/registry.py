"""The baseline kinds, in the order they appear under `baselines:` and run within their phase.

Adding a tool: its module in this package (a BaselineKind subclass and KIND) and one line here.
"""
from __future__ import annotations

from typing import Dict, Tuple

from zcorch.config.baselines import commands, dd, iperf3, qperf
from zcorch.config.baselines.kind import BaselineKind

KINDS: Tuple[BaselineKind, ...] = (
    iperf3.KIND,
    dd.KIND,
    commands.KIND,
    qperf.KIND,
)
BY_NAME: Dict[str, BaselineKind] = {k.name: k for k in KINDS}
# the `kind` of a baselines.jsonl record -> the baseline kind that writes it
BY_RECORD: Dict[str, BaselineKind] = {rk: k for k in KINDS for rk in k.record_kinds}
