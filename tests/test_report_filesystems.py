"""The Filesystems section on a real result set with a filesystem axis
(tests/data/filesystems-small: ext4 delalloc/nodelalloc, xfs, btrfs RAID-0 on loop devices, a dd
baseline on each), every figure checked against the raw records parsed independently of zcorch."""
import html
import json
import re
import statistics

import numpy as np
import pandas as pd
import pytest

import zcorch
from zcorch.analysis import filesystems as fsa
from zcorch.analysis.stats import varying_params

from fixtures_analysis import raw_baselines, raw_runs, zcorch_cli

NAMES = ["btrfs-raid0", "ext4-delalloc", "ext4-nodelalloc", "xfs"]


def raw_meta(path) -> dict:
    return json.loads((path / "meta.json").read_text())


def expected(path) -> dict:
    """Per filesystem, from the raw files: dd write/read MB/s, the MB/s of every ok run on it."""
    out = {n: {"runs": [], "failed": 0, "by_recv": {}} for n in NAMES}
    for b in raw_baselines(path):
        if b["kind"] in ("dd_write", "dd_read") and b["status"] == "ok":
            out[b["key"]["filesystem"]][b["kind"]] = b["result"]["bytes"] / b["result"]["wall_s"] / 1e6
    for r in raw_runs(path):
        e = out[r["params"]["filesystem"]]
        if r["status"] != "ok":
            e["failed"] += 1
            continue
        mb_s = r["receiver"]["bytes"] / r["receiver"]["wall_ns"] * 1e3
        e["runs"].append(mb_s)
        e["by_recv"].setdefault(r["params"]["recv_mode"], []).append(mb_s)
    return out


def test_load_exposes_the_filesystem_column_and_load_meta_the_descriptions(fs_set):
    df = zcorch.load(fs_set)
    assert sorted(df["filesystem"].unique()) == NAMES
    assert (df.groupby("filesystem").size() == 6).all()
    # every run wrote into a file on its own filesystem's mountpoint
    meta = raw_meta(fs_set)
    for _, r in df.iterrows():
        assert r["sink"] == meta["filesystems"][r["filesystem"]]["mountpoint"] + "/recv.dat"
    m = zcorch.load_meta(fs_set).set_index("role")
    assert {f"filesystem:{n}" for n in NAMES} <= set(m.index)
    assert m.loc["filesystem:xfs", "fstype"] == "xfs"
    assert "nodelalloc" in json.loads(m.loc["filesystem:ext4-nodelalloc", "mount_options"])
    assert "nodelalloc" not in json.loads(m.loc["filesystem:ext4-delalloc", "mount_options"])
    assert m.loc["filesystem:btrfs-raid0", "raid_kernel.data"] == "raid0"
    b = zcorch.load_baselines(fs_set)
    assert sorted(b.loc[b["kind"] == "dd_write", "key_filesystem"]) == NAMES


def test_summary_matches_the_raw_records(fs_set):
    exp = expected(fs_set)
    summary, cells = fsa.filesystems_of(fs_set)
    assert list(summary["filesystem"]) == NAMES
    for _, s in summary.iterrows():
        e = exp[s["filesystem"]]
        assert s["dd_write_mb_s"] == pytest.approx(e["dd_write"], rel=1e-9)
        assert s["dd_read_mb_s"] == pytest.approx(e["dd_read"], rel=1e-9)
        assert (s["n_ok"], s["n_failed"]) == (len(e["runs"]), e["failed"]) == (6, 0)
        assert s["mb_s_median"] == pytest.approx(statistics.median(e["runs"]), rel=1e-9)
        assert s["ratio_to_dd_write"] == pytest.approx(statistics.median(e["runs"]) / e["dd_write"], rel=1e-9)
    assert sorted(zip(cells["filesystem"], cells["label"])) == sorted(
        (n, f"recv_mode={m}") for n in NAMES for m in ("read", "splice"))
    for _, c in cells.iterrows():
        e = exp[c["filesystem"]]
        runs = e["by_recv"][c["label"].split("=")[1]]
        assert c["n"] == 3 and c["mb_s_median"] == pytest.approx(statistics.median(runs), rel=1e-9)
        assert c["ratio_to_dd_write"] == pytest.approx(statistics.median(runs) / e["dd_write"], rel=1e-9)


def test_descriptions_say_what_the_kernel_reported(fs_set):
    summary, _ = fsa.filesystems_of(fs_set)
    s = summary.set_index("filesystem")
    meta = raw_meta(fs_set)["filesystems"]
    assert list(s["type"]) == ["btrfs", "ext4", "ext4", "xfs"]
    assert s.loc["xfs", "mkfs options"] == "-K" and s.loc["ext4-delalloc", "mkfs options"] == "(defaults)"
    assert s.loc["xfs", "mkfs command"].startswith("mkfs.xfs -f -K /dev/loop")
    for n in NAMES:
        assert s.loc[n, "mount options (kernel)"] == ",".join(meta[n]["mount_options"])
        assert s.loc[n, "size"]  # from findmnt
    assert "nodelalloc" in s.loc["ext4-nodelalloc", "mount options (kernel)"].split(",")
    assert s.loc["ext4-nodelalloc", "mount options requested"] == "noatime,nodelalloc"
    assert s.loc["btrfs-raid0", "RAID (kernel)"] == "btrfs data raid0, metadata raid0, system raid0"
    assert s.loc["ext4-delalloc", "RAID (kernel)"] == "none (single device)"
    devs = [d["path"] for d in meta["btrfs-raid0"]["devices"]]
    assert s.loc["btrfs-raid0", "devices"] == f"{devs[0]} (256 MiB, loop), {devs[1]} (256 MiB, loop)"
    assert s.loc["btrfs-raid0", "size"] == "512 MiB"


@pytest.mark.slow
def test_report_shows_the_configurations_side_by_side_with_their_dd_ceiling(fs_set):
    res = zcorch_cli("report", fs_set)
    assert res.returncode == 0, res.stderr
    text = (fs_set / "report.html").read_text()
    section = text[text.index('<h2 id="filesystems">Filesystems</h2>'):text.index('<h2 id="cells">')]
    head = re.search(r"<thead><tr>(.*?)</tr></thead>", section).group(1)
    assert re.findall(r"<th>(.*?)</th>", head) == ["configuration"] + NAMES
    rows = {}
    for tr in re.findall(r"<tr>(.*?)</tr>", section[section.index("<tbody>"):], re.S):
        cells = [html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", tr, re.S)]
        rows[cells[0]] = cells[1:]
    exp = expected(fs_set)
    assert rows["dd write, MB/s (ceiling)"] == [f"{exp[n]['dd_write']:.0f}" for n in NAMES]
    assert rows["dd read, MB/s"] == [f"{exp[n]['dd_read']:.0f}" for n in NAMES]
    for i, n in enumerate(NAMES):
        med = statistics.median(exp[n]["runs"])
        assert rows["median MB/s of its runs"][i] == f"{med:.0f} ({med / exp[n]['dd_write']:.2f}× dd write)"
        read = statistics.median(exp[n]["by_recv"]["read"])
        assert rows["median MB/s, recv_mode=read"][i].startswith(f"{read:.0f} ({read / exp[n]['dd_write']:.2f}×")
    assert rows["RAID (kernel)"][0] == "btrfs data raid0, metadata raid0, system raid0"
    assert "nodelalloc" in rows["mount options (kernel)"][2] and "nodelalloc" not in rows["mount options (kernel)"][1]
    assert rows["runs writing onto it"] == ["6 ok, 0 failed"] * 4
    # the filesystems are not repeated as host columns, and the sink (which follows the filesystem)
    # does not split the result tables a second time
    hosts = text[text.index('<h2 id="hosts">Hosts</h2>'):text.index('<h2 id="experiment">')]
    assert "filesystem:" not in hosts
    # one results table: the filesystems as rows, the receive modes as columns (not one table per filesystem)
    results = text[text.index('<h2 id="results">Results</h2>'):text.index(">Where the CPU goes</h2>")]
    assert re.findall(r"<h3>(.*?)</h3>", results) == []
    assert "<th>filesystem \\ recv_mode</th>" in results
    assert re.findall(r"<tr><td>([^<]*)</td>", results) == NAMES


@pytest.mark.slow
def test_a_result_set_without_filesystems_has_no_such_section(small_set):
    assert zcorch_cli("report", small_set).returncode == 0
    text = (small_set / "report.html").read_text()
    assert ">Baselines</h2>" in text and ">Filesystems</h2>" not in text
    df = zcorch.load(small_set)
    assert fsa.filesystem_summary(df, zcorch.load_baselines(small_set), {}).empty


@pytest.mark.slow
def test_an_interrupted_sweep_without_descriptions_still_gets_its_columns(fs_set):
    # `zcorch run` writes meta.json "filesystems" after the sweep: a sweep killed before has none
    meta = raw_meta(fs_set)
    meta["filesystems"] = {}
    (fs_set / "meta.json").write_text(json.dumps(meta))
    summary, cells = fsa.filesystems_of(fs_set)
    assert list(summary["filesystem"]) == NAMES and (summary["type"] == fsa.NOT_DESCRIBED).all()
    assert (summary["n_ok"] == 6).all() and summary["ratio_to_dd_write"].notna().all()
    assert zcorch_cli("report", fs_set).returncode == 0
    assert fsa.NOT_DESCRIBED in (fs_set / "report.html").read_text()


def test_runs_not_writing_onto_the_filesystem_and_failed_dd_are_shown_as_such(fs_set):
    df = zcorch.load(fs_set)
    baselines = zcorch.load_baselines(fs_set)
    descriptions = raw_meta(fs_set)["filesystems"]
    # a cell on the filesystem axis whose sink is /dev/null did not land data on the filesystem
    elsewhere = df[df["filesystem"] == "xfs"].copy()
    elsewhere["sink"] = "/dev/null"
    df2 = pd.concat([df[df["filesystem"] != "xfs"], elsewhere], ignore_index=True)
    # the dd write on ext4-delalloc failed: edited records, a full filesystem is not produced on demand here
    failed = baselines.copy()
    sel = (failed["kind"] == "dd_write") & (failed["key_filesystem"] == "ext4-delalloc")
    failed.loc[sel, ["status", "reason", "mb_s"]] = ["failed", "dd: No space left on device", np.nan]
    s = fsa.filesystem_summary(df2, failed, descriptions).set_index("filesystem")
    assert s.loc["xfs", "n_ok"] == 0 and np.isnan(s.loc["xfs", "mb_s_median"])
    assert s.loc["ext4-delalloc", "dd_write_text"] == "failed: dd: No space left on device"
    assert np.isnan(s.loc["ext4-delalloc", "ratio_to_dd_write"]) and s.loc["ext4-delalloc", "n_ok"] == 6
    table = fsa.side_by_side(fsa.filesystem_summary(df2, failed, descriptions),
                             fsa.filesystem_cells(df2, failed, descriptions))
    assert table.loc["median MB/s of its runs", "xfs"] == "–"
    med = statistics.median(expected(fs_set)["ext4-delalloc"]["runs"])
    assert table.loc["median MB/s of its runs", "ext4-delalloc"] == f"{med:.0f}"  # no ceiling, no ratio


def test_raid_text_of_md_and_btrfs_reports():
    md = {"device": "/dev/md127", "raid_level": "raid5", "raid_devices": 3, "chunk_size": "512K",
          "state": "clean", "members": ["/dev/loop0", "/dev/loop1", "/dev/loop2"]}
    assert fsa.raid_text(md) == "/dev/md127: raid5, 3 devices, chunk 512K, state clean"
    assert fsa.raid_text({"data": "raid1", "metadata": "raid1"}) == "btrfs data raid1, metadata raid1"
    assert fsa.raid_text({"error": "mdadm: cannot open /dev/md0"}) == "unknown (mdadm: cannot open /dev/md0)"
    assert fsa.raid_text(None) == "none (single device)"


def test_existing_directory_configuration():
    desc = {"name": "array", "kind": "existing", "path": "/srv/array", "fstype": "ext4",
            "mount_source": "/dev/sdb1", "mount_options": ["rw", "relatime"], "size_bytes": 2 * 1024 ** 4}
    c = fsa.configuration(desc)
    assert c["type"] == "ext4 (existing directory /srv/array)" and c["mount options (kernel)"] == "rw,relatime"
    assert c["devices"] == "/dev/sdb1" and c["size"] == "2 TiB" and c["mountpoint"] == "/srv/array"


def test_sink_that_follows_the_filesystem_is_not_a_varying_parameter(fs_set):
    df = zcorch.load(fs_set)
    assert varying_params(df) == ["recv_mode", "filesystem"]
    # a sink that differs within one filesystem does tell cells apart
    df2 = df.copy()
    df2.loc[df2.index[0], "sink"] = "/dev/null"
    assert "sink" in varying_params(df2)
