"""The baseline kinds, in the order they appear under `baselines:` and run within their phase.
Adding a tool: its module in this package (a BaselineKind subclass and KIND) and one line here."""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from zcorch.config.baselines import commands, dd, iperf3, qperf
from zcorch.config.baselines.kind import BaselineKind

KINDS: Tuple[BaselineKind, ...] = (iperf3.KIND, dd.KIND, commands.KIND, qperf.KIND)
BY_NAME: Dict[str, BaselineKind] = {k.name: k for k in KINDS}
# the `kind` of a baselines.jsonl record -> the baseline kind that writes it
BY_RECORD: Dict[str, BaselineKind] = {rk: k for k in KINDS for rk in k.record_kinds}
# the record kinds a transfer's throughput is shown as a share of, in the report's column order
SHARE_RECORDS: Tuple[str, ...] = tuple(rk for k in KINDS for rk in k.share_records)
# the record kinds shown beside each receiving filesystem; the first is the ceiling its runs are a ratio of
FILESYSTEM_CEILINGS: Tuple[str, ...] = tuple(rk for k in KINDS for rk in k.filesystem_ceilings)
# the record kind a published throughput figure is normalised to when it names no `baseline:` (None: none)
FIGURE_REFERENCE = next((k.figure_reference for k in KINDS if k.figure_reference), None)
# the host comparison's rows of tool versions (each label is the program meta.json versions.<label> names)
VERSION_LABELS: Tuple[str, ...] = tuple(k.version_label for k in KINDS if k.version_label)


def rate_of(record_kind: str, result: Any) -> "Optional[float]":
    """Bits per second of a baselines.jsonl record's result (its kind's `rate`); None for an unknown kind."""
    kind = BY_RECORD.get(record_kind)
    return kind.rate(result) if kind is not None and isinstance(result, dict) else None
