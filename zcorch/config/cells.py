"""The worker's cell rules: which combinations of parameters the worker can run, judged at plan time.

`zcorch.plan.expand` applies `cell_problems()` to every cell (skipped with `skip_invalid: true`, else an
error naming the cell) and `filesystem_problem()` (always an error). The per-mode rules follow the
capabilities each mode declares in its C ops table, read from the committed copy of that table
(zcorch.config.capabilities), so `zcorch plan` works where the worker is not built.
"""
from __future__ import annotations

from typing import Optional

from zcorch.config.capabilities import mode_caps as _mode_caps
from zcorch.config.capabilities import with_capability
from zcorch.config.checks import FILESYSTEM_PLACEHOLDER
from zcorch.params import DEFAULTS, side_value


def cell_problems(p: dict) -> "list[str]":
    """Why the worker cannot run a cell with these parameters (empty if it can).

    The mode-specific checks come from the capabilities each mode declares in the C core (the worker
    refuses the same cells), so they are caught at plan time instead of as failed runs; they are read from
    the committed copy of the table (zcorch.config.capabilities), so planning needs no compiled worker.
    """
    out = []
    send, recv, source, sink = p["send_mode"], p["recv_mode"], p["source"], p["sink"]
    send_caps, recv_caps = _mode_caps("send", send), _mode_caps("recv", recv)
    if "file_sink" in recv_caps and sink == "/dev/null":
        out.append(f"receive mode `{recv}` needs a regular file as sink, not /dev/null")
    if "no_sink" in recv_caps and sink != "/dev/null":
        out.append(f"receive mode `{recv}` keeps no data: its sink must be /dev/null, not `{sink}`")
    if send_caps & {"file_source", "mappable_source"} and source == "mem":
        out.append(f"send mode `{send}` reads from a file; source `mem` is not one (use a path or /dev/zero)")
    if "mappable_source" in send_caps and source == "/dev/zero":
        out.append(f"send mode `{send}` cannot map /dev/zero; use a regular file as source")
    if p["gift"] and "gift" not in send_caps | recv_caps:
        out.append(f"`gift` (SPLICE_F_GIFT) only applies to the {'/'.join(with_capability('gift'))} modes")
    out += _grain_problems(p, send_caps)
    if sink == "/dev/null" and p["fsync"]:
        out.append("`fsync` needs a regular file as sink, not /dev/null")
    if sink == "/dev/null" and p["sink_state"] != "fresh":
        out.append(f"sink_state `{p['sink_state']}` needs a regular file as sink, not /dev/null")
    for side, key in (("send", "send_buffer"), ("recv", "recv_buffer")):  # each side's own buffer (params.side_value)
        buf = side_value(side, p, "buffer")
        if p["subblocks"] > buf:
            what = key if p.get(key) is not None else "buffer"
            out.append(f"subblocks ({p['subblocks']}) > {what} ({buf} bytes): a sub-block would be empty")
            if what == "buffer":
                break  # one message for the shared size
    out += _amount_problems(p)
    if p.get("streams", 1) > 1:
        for side, mode, caps in (("send", send, send_caps), ("receive", recv, recv_caps)):
            if "one_stream" in caps:
                out.append(f"{side} mode `{mode}` handles one stream only; `streams: {p['streams']}` needs another")
    return out


def _grain_problems(p: dict, send_caps: "frozenset[str]") -> "list[str]":
    """`mmap_grain`, `splice_grain` and `refill` against the send mode (the worker refuses the same): they change
    the calls of the modes that declare them, and are never silently ignored."""
    out = []
    send, mem = p["send_mode"], p["source"] == "mem"
    grains = [k for k in ("mmap_grain", "splice_grain") if p.get(k, DEFAULTS[k]) != DEFAULTS[k]]
    if grains and "grain" not in send_caps:
        out.append(f"{' and '.join(f'`{k}: {p[k]}`' for k in grains)}: send mode `{send}` makes no such calls "
                   f"(only {'/'.join(with_capability('grain'))})")
    elif p.get("mmap_grain") == "subblock" and mem and not p["gift"]:
        out.append("`mmap_grain: subblock` maps fresh buffers: source `mem` needs `gift: true` (without it the "
                   "pattern is spliced from memory mapped once)")
    if p.get("refill"):
        if "refill" not in send_caps:
            out.append(f"`refill` fills a buffer of the sender's own: send mode `{send}` has none "
                       f"(only {'/'.join(with_capability('refill'))})")
        elif not mem:
            out.append(f"`refill` rewrites the pattern of source `mem`; a file source (`{p['source']}`) is read "
                       "into the buffer instead")
    return out


def _amount_problems(p: dict) -> "list[str]":
    """`duration` against `bytes` and the source/sink it needs (the worker refuses the same)."""
    if p.get("duration") is None:
        if p.get("bytes") is None:
            return ["neither `bytes` nor `duration` is set: a cell moves a byte count or runs for a time"]
        return []
    out = []
    if p.get("bytes") is not None:
        out.append("`bytes` and `duration` are both set: a cell moves a byte count or runs for a time, not both "
                   "(leave `bytes` unwritten, or null, for the cells with `duration`)")
    if p["source"] not in ("mem", "/dev/zero"):
        out.append(f"`duration` needs source `mem` or /dev/zero: a file (`{p['source']}`) runs out before the time "
                   "is up (use `bytes`)")
    if p["sink_state"] != "fresh":
        out.append(f"sink_state `{p['sink_state']}` prepares `bytes` of the sink: it needs `bytes`, not `duration`")
    if p.get("streams", 1) > 1 and p["sink"] != "/dev/null":
        out.append(f"`duration` with `streams: {p['streams']}` needs sink /dev/null: a stream's slice of a file sink "
                   "is unknown until the time is up")
    return out


def filesystem_problem(p: dict) -> Optional[str]:
    """A cell whose sink lives on `{filesystem}` must name one (a file error, never skipped)."""
    if p["sink"].startswith(FILESYSTEM_PLACEHOLDER) and p["filesystem"] is None:
        return f"sink `{p['sink']}` uses {FILESYSTEM_PLACEHOLDER} but the cell has no `filesystem`"
    return None
