"""The receiving filesystems of a result set side by side: per configuration (meta.json "filesystems") what the
kernel reports of it, the baselines measured on it and the runs that wrote onto it, each throughput also as a
ratio to the filesystem's plain-write ceiling (CEILING). `filesystems_of(path)` reads a result set."""
from __future__ import annotations

import shlex
from typing import Optional

import numpy as np
import pandas as pd

from zcorch.analysis.frames import OK, PathLike, load_baselines, read_meta
from zcorch.analysis.load import load
from zcorch.analysis.stats import format_spread, summarize, varying_params
from zcorch.config.baselines.registry import BY_RECORD, FILESYSTEM_CEILINGS

CEILING = FILESYSTEM_CEILINGS[0]   # the record kind a filesystem's runs are given as a ratio of
RATIO = f"ratio_to_{CEILING}"

NOT_DESCRIBED = "not recorded in meta.json"


def _human_bytes(n) -> str:
    if n is None or (isinstance(n, float) and np.isnan(n)):
        return ""
    n = float(n)
    for unit, factor in (("TiB", 1024 ** 4), ("GiB", 1024 ** 3), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if n >= factor:
            return f"{n / factor:.1f} {unit}".replace(".0 ", " ")
    return f"{int(n)} B"


def _join(values, sep: str = " ") -> str:
    return sep.join(str(v) for v in values) if isinstance(values, (list, tuple)) else str(values or "")


def raid_text(raid_kernel) -> str:
    """RAID level as the kernel reported it: md's `mdadm --detail` fields or btrfs' profiles."""
    if raid_kernel is None:
        return "none (single device)"
    if not isinstance(raid_kernel, dict):
        return str(raid_kernel)
    if "error" in raid_kernel:
        return f"unknown ({raid_kernel['error']})"
    if "raid_level" in raid_kernel:  # md
        parts = [str(raid_kernel.get("raid_level"))]
        if raid_kernel.get("raid_devices") is not None:
            parts.append(f"{raid_kernel['raid_devices']} devices")
        if raid_kernel.get("chunk_size"):
            parts.append(f"chunk {raid_kernel['chunk_size']}")
        if raid_kernel.get("state"):
            parts.append(f"state {raid_kernel['state']}")
        dev = raid_kernel.get("device")
        return (f"{dev}: " if dev else "md: ") + ", ".join(parts)
    # btrfs: one profile per block-group type
    return "btrfs " + ", ".join(f"{k} {v}" for k, v in raid_kernel.items())


def _mkfs_command(desc: dict) -> str:
    for argv in desc.get("commands") or []:
        if argv and str(argv[0]).startswith("mkfs"):
            return shlex.join(str(a) for a in argv)
    return ""


def configuration(desc: dict) -> dict:
    """One filesystem description (meta.json) as the report's text fields."""
    if desc.get("kind") == "existing":
        return {"type": f"{desc.get('fstype') or '?'} (existing directory {desc.get('path')})",
                "mkfs options": "– (not created by zcorch)", "mkfs command": "",
                "mount options (kernel)": _join(desc.get("mount_options") or [], ","),
                "mount options requested": "–", "RAID (kernel)": "not probed (existing directory)",
                "devices": desc.get("mount_source") or "", "size": _human_bytes(desc.get("size_bytes")),
                "mountpoint": desc.get("path") or ""}
    fs_type = desc.get("fstype") or desc.get("fs") or "?"
    if desc.get("fs") and desc.get("fstype") and desc["fs"] != desc["fstype"]:
        fs_type += f" (requested {desc['fs']})"
    if not desc.get("provisioned", True):
        fs_type += " (never provisioned: no run used it)"
    requested = _join(desc.get("mount_options_requested") or [], ",") or "(defaults)"
    missing = desc.get("mount_options_missing") or []
    if missing:
        requested += f" — not in effect: {_join(missing, ',')}"
    raid = raid_text(desc.get("raid_kernel")) if desc.get("provisioned", True) else ""
    if desc.get("raid") and desc.get("raid") not in raid:
        raid = f"{raid} (requested {desc['raid']})"
    devices = []
    for dev in desc.get("devices") or []:
        if isinstance(dev, dict):
            text = str(dev.get("path"))
            if dev.get("size_bytes"):
                text += f" ({_human_bytes(dev['size_bytes'])}{', loop' if dev.get('backing_file') else ''})"
            devices.append(text)
        else:
            devices.append(str(dev))
    return {"type": fs_type, "mkfs options": _join(desc.get("mkfs_options") or []) or "(defaults)",
            "mkfs command": _mkfs_command(desc),
            "mount options (kernel)": _join(desc.get("mount_options") or [], ","),
            "mount options requested": requested, "RAID (kernel)": raid, "devices": ", ".join(devices),
            "size": _human_bytes(desc.get("size_bytes")), "mountpoint": desc.get("mountpoint") or ""}


def _mountpoint(desc: Optional[dict]) -> Optional[str]:
    if not desc:
        return None
    return desc.get("path" if desc.get("kind") == "existing" else "mountpoint")


def runs_onto(df: pd.DataFrame, name: str, desc: Optional[dict]) -> pd.DataFrame:
    """The runs of `df` whose sink is on filesystem `name` (not a sink elsewhere, e.g. /dev/null)."""
    if "filesystem" not in df:
        return df.iloc[0:0]
    on = df[df["filesystem"] == name]
    mnt = _mountpoint(desc)
    if mnt and "sink" in on:
        prefix = mnt.rstrip("/") + "/"
        sinks = on["sink"].astype(str)
        on = on[sinks.str.startswith(prefix) | sinks.str.contains("{filesystem}", regex=False)]
    return on


def _words(kind: str) -> str:
    return BY_RECORD[kind].words.get(kind, kind)


def _ceiling(baselines: pd.DataFrame, kind: str, name: str) -> dict:
    """The newest ok baseline of record kind `kind` on `name` ({mb_s}), else the newest one's status and reason."""
    missing = {"mb_s": np.nan, "text": f"no {BY_RECORD[kind].name} baseline"}
    if baselines.empty or "key_filesystem" not in baselines:
        return missing
    rows = baselines[(baselines["kind"] == kind) & (baselines["key_filesystem"] == name)]
    if rows.empty:
        return missing
    ok = rows[rows["status"] == OK]
    if not ok.empty:
        mb_s = float(ok["mb_s"].iloc[-1])
        return {"mb_s": mb_s, "text": f"{mb_s:.0f}"}
    last = rows.iloc[-1]
    return {"mb_s": np.nan, "text": f"{last['status']}: {last['reason']}"}


def _ratio(mb_s: float, ceiling: float) -> float:
    return mb_s / ceiling if np.isfinite(mb_s) and np.isfinite(ceiling) and ceiling > 0 else np.nan


def filesystem_names(df: pd.DataFrame, baselines: pd.DataFrame, descriptions: dict) -> list:
    """Every configuration the result set mentions (described, or only named by runs or baselines), sorted."""
    names = set(descriptions)
    for frame, col in ((df, "filesystem"), (baselines, "key_filesystem")):
        if col in frame:
            names.update(str(v) for v in frame[col].dropna().unique())
    return sorted(names)


def cell_keys(df: pd.DataFrame) -> list:
    """Parameters that tell apart the cells on one filesystem: what varies but the filesystem and the sink."""
    return [c for c in varying_params(df) if c not in ("filesystem", "sink")]


def filesystem_summary(df: pd.DataFrame, baselines: pd.DataFrame, descriptions: dict) -> pd.DataFrame:
    """One row per configuration: its description fields, `<kind>_mb_s` and `<kind>_text` of each ceiling kind,
    n_ok, n_failed, mb_s_median of the runs that wrote onto it and RATIO."""
    rows = []
    for name in filesystem_names(df, baselines, descriptions):
        desc = descriptions.get(name)
        row = {"filesystem": name, **(configuration(desc) if desc else {"type": NOT_DESCRIBED})}
        for kind in FILESYSTEM_CEILINGS:
            found = _ceiling(baselines, kind, name)
            row.update({f"{kind}_mb_s": found["mb_s"], f"{kind}_text": found["text"]})
        on = runs_onto(df, name, desc)
        ok = on[on["status"] == OK] if len(on) else on
        row["n_ok"], row["n_failed"] = len(ok), len(on) - len(ok)
        row["mb_s_median"] = float(np.median(ok["mb_s"].astype(float))) if len(ok) else np.nan
        row[RATIO] = _ratio(row["mb_s_median"], row[f"{CEILING}_mb_s"])
        rows.append(row)
    return pd.DataFrame(rows)


def filesystem_cells(df: pd.DataFrame, baselines: pd.DataFrame, descriptions: dict) -> pd.DataFrame:
    """One row per (filesystem, cell) that wrote onto it: label, the summarize() columns of mb_s and RATIO."""
    keys = cell_keys(df)
    out = []
    for name in filesystem_names(df, baselines, descriptions):
        on = runs_onto(df, name, descriptions.get(name))
        if on.empty:
            continue
        ceiling = _ceiling(baselines, CEILING, name)["mb_s"]
        s = summarize(on, by=keys or ["filesystem"], metrics=["mb_s"])
        for _, r in s.iterrows():
            label = ", ".join(f"{k}={r[k]}" for k in keys) if keys else "all runs"
            out.append({"filesystem": name, "label": label, **{c: r[c] for c in s.columns if c not in keys},
                        RATIO: _ratio(r["mb_s_median"], ceiling)})
    return pd.DataFrame(out)


def filesystems_of(path: PathLike) -> "tuple[pd.DataFrame, pd.DataFrame]":
    """(filesystem_summary, filesystem_cells) of one result set."""
    df, baselines = load(path), load_baselines(path)
    descriptions = read_meta(path).get("filesystems") or {}
    return filesystem_summary(df, baselines, descriptions), filesystem_cells(df, baselines, descriptions)


DESCRIPTION_ROWS = ["type", "mkfs options", "mkfs command", "mount options (kernel)", "mount options requested",
                    "RAID (kernel)", "devices", "size", "mountpoint"]


def _rate_text(mb_s: float, ratio: float) -> str:
    if not np.isfinite(mb_s):
        return "–"
    return f"{mb_s:.0f}" + (f" ({ratio:.2f}× {_words(CEILING)})" if np.isfinite(ratio) else "")


def side_by_side(summary: pd.DataFrame, cells: pd.DataFrame) -> pd.DataFrame:
    """The report's table: one column per configuration, one row per fact (text)."""
    ceilings = {kind: f"{_words(kind)}, MB/s" + (" (ceiling)" if kind == CEILING else "") for kind in FILESYSTEM_CEILINGS}
    table, order = {}, list(DESCRIPTION_ROWS) + list(ceilings.values()) + ["runs writing onto it",
                                                                           "median MB/s of its runs"]
    for _, fs in summary.iterrows():
        col = {key: "" if v is None or (isinstance(v, float) and np.isnan(v)) else v
               for key, v in ((key, fs.get(key)) for key in DESCRIPTION_ROWS)}
        col.update({row: fs[f"{kind}_text"] for kind, row in ceilings.items()})
        col["runs writing onto it"] = f"{fs['n_ok']} ok, {fs['n_failed']} failed"
        col["median MB/s of its runs"] = _rate_text(fs["mb_s_median"], fs[RATIO])
        table[fs["filesystem"]] = col
    if not cells.empty:
        for _, c in cells.iterrows():
            row = f"median MB/s, {c['label']}"
            if row not in order:
                order.append(row)
            table[c["filesystem"]][row] = (_rate_text(c["mb_s_median"], c[RATIO]) + "\n"
                                          + format_spread(c))
    return pd.DataFrame({name: [col.get(r, "") for r in order] for name, col in table.items()}, index=order)
