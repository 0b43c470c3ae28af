"""The worker's cell rules: which combinations of parameters the worker can run, judged at plan time from the
committed copy of the modes' capabilities (zcorch.config.capabilities) and worded as the worker words them.
"""
from __future__ import annotations

from typing import Optional

from zcorch.config.capabilities import mode_caps as _mode_caps
from zcorch.config.capabilities import with_capability
from zcorch.config.checks import FILESYSTEM_PLACEHOLDER
from zcorch.params import DEFAULTS, rule_text, side_value


def cell_problems(p: dict) -> "list[str]":
    """Why the worker cannot run a cell with these parameters (empty if it can), judged on the cell's names."""
    out = []
    send, recv, source, sink = p["send_mode"], p["recv_mode"], p["source"], p["sink"]
    send_caps, recv_caps = _mode_caps("send", send), _mode_caps("recv", recv)
    if "file_sink" in recv_caps and sink == "/dev/null":
        out.append(rule_text("file_sink", mode=recv, sink=sink))
    if "no_sink" in recv_caps and sink != "/dev/null":
        out.append(rule_text("no_sink", mode=recv, sink=sink))
    if send_caps & {"file_source", "mappable_source"} and source == "mem":
        out.append(rule_text("file_source", mode=send))
    if "mappable_source" in send_caps and source == "/dev/zero":
        out.append(rule_text("mappable_source", mode=send, source=source))
    if p["gift"] and "gift" not in send_caps | recv_caps:  # the planner's own: no worker sees both modes
        out.append(f"`gift` (SPLICE_F_GIFT) only applies to the {_only('gift')} modes")
    out += _grain_problems(p, send_caps)
    if sink == "/dev/null" and p["fsync"]:
        out.append(rule_text("fsync_sink", sink=sink))
    if sink == "/dev/null" and p["sink_state"] != "fresh":
        out.append(rule_text("sink_state_sink", sink_state=p["sink_state"], sink=sink))
    for side, key in (("send", "send_buffer"), ("recv", "recv_buffer")):  # each side's own buffer (params.side_value)
        buf = side_value(side, p, "buffer")
        if p["subblocks"] > buf:
            what = key if p.get(key) is not None else "buffer"
            out.append(rule_text("subblocks", subblocks=p["subblocks"], buffer_key=what, buffer=buf))
            if what == "buffer":
                break  # one message for the shared size
    out += _amount_problems(p)
    if p.get("streams", 1) > 1:
        for side, mode, caps in (("send", send, send_caps), ("receive", recv, recv_caps)):
            if "one_stream" in caps:
                out.append(rule_text("one_stream", side=side, mode=mode, streams=p["streams"]))
    return out


def _only(flag: str) -> str:
    """The modes declaring `flag`, as the worker lists them (native zc_modes_with): "a/b"."""
    return "/".join(with_capability(flag))


def _grain_problems(p: dict, send_caps: "frozenset[str]") -> "list[str]":
    """`mmap_grain`, `splice_grain`, `refill` and `fill` against the send mode (never silently ignored)."""
    out = []
    send, mem = p["send_mode"], p["source"] == "mem"
    grains = [k for k in ("mmap_grain", "splice_grain") if p.get(k, DEFAULTS[k]) != DEFAULTS[k]]
    if grains and "grain" not in send_caps:
        out.append(rule_text("grain", grains=" and ".join(f"`{k}`" for k in grains), mode=send, only=_only("grain")))
    elif p.get("mmap_grain") == "subblock" and mem and not p["gift"]:
        out.append(rule_text("grain_needs_gift"))
    if p.get("refill"):
        if "refill" not in send_caps:
            out.append(rule_text("refill", mode=send, only=_only("refill")))
        elif not mem:
            out.append(rule_text("refill_needs_mem", source=p["source"]))
    elif p.get("fill", DEFAULTS["fill"]) != DEFAULTS["fill"]:
        out.append(rule_text("fill_needs_refill", fill=p["fill"]))
    return out


def _amount_problems(p: dict) -> "list[str]":
    """`duration` against `bytes` and the source/sink it needs."""
    if p.get("duration") is None:
        if p.get("bytes") is None:  # the planner's own: the worker is always given one
            return ["neither `bytes` nor `duration` is set: a cell moves a byte count or runs for a time"]
        return []
    out = []
    if p.get("bytes") is not None:
        out.append(rule_text("bytes_and_duration"))
    if p["source"] not in ("mem", "/dev/zero"):
        out.append(rule_text("duration_source", source=p["source"]))
    if p["sink_state"] != "fresh":
        out.append(rule_text("sink_state_bytes", sink_state=p["sink_state"]))
    if p.get("streams", 1) > 1 and p["sink"] != "/dev/null":
        out.append(rule_text("duration_streams", streams=p["streams"]))
    return out


def filesystem_problem(p: dict) -> Optional[str]:
    """A cell whose sink lives on `{filesystem}` must name one (a file error, never skipped)."""
    missing = p["sink"].startswith(FILESYSTEM_PLACEHOLDER) and p["filesystem"] is None
    return f"sink `{p['sink']}` uses {FILESYSTEM_PLACEHOLDER} but the cell has no `filesystem`" if missing else None
