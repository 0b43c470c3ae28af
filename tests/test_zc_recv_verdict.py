"""Zero-copy receive is never silent: a real localhost sweep of `zerocopy_recv` behind a copying sender
(sendfile: nothing can be mapped) and behind a zero-copy one (msg_zerocopy: whole pages are), and what
the summary, zcorch.load and the report say of each cell. The verdict rules themselves are pure
(zcorch.results.rates.zc_recv_verdict / zc_label, tests/test_hoststat.py)."""
from __future__ import annotations

import re

import pytest

import zcorch
from zcorch.analysis.report import cell_zc_verdicts
from zcorch.sweep.pipeline import run_sweep
from zcorch.worker import native

from fixtures_worker import needs_native

pytestmark = needs_native

EXPERIMENT = """name: zc-recv
params: {{bytes: 8MiB, source: "{source}", recv_mode: zerocopy_recv, sink: /dev/null, timeout: 30s}}
matrix:
  send_mode: [sendfile, msg_zerocopy]
repeats: 2
baselines: false
"""


def test_zerocopy_recv_says_whether_it_mapped(tmp_path):
    unavailable = native.unavailable_modes()
    for side, mode in (("recv", "zerocopy_recv"), ("send", "msg_zerocopy")):
        if mode in unavailable[side]:
            pytest.skip(f"{side} mode {mode} cannot run here: {unavailable[side][mode]}")
    src = tmp_path / "src"
    src.write_bytes(bytes(range(256)) * (8 * 2**20 // 256))
    exp = tmp_path / "zc-recv.yaml"
    # msg_zerocopy reads a file source into memory first; sendfile sends the file's page cache
    exp.write_text(EXPERIMENT.format(source=src))
    result = run_sweep(str(exp), output=str(tmp_path / "out"), command=["test"])
    assert result.exit_status == 0, [r.get("reason") for r in result.records]

    df = zcorch.load(tmp_path / "out")
    by_mode = {m: set(g["zc_verdict"]) for m, g in df.groupby("send_mode")}
    assert by_mode["sendfile"] == {"receive copied"}
    assert (df.loc[df["send_mode"] == "sendfile", "zc_recv_mapped_share"] == 0).all()
    # loopback: the kernel copies a MSG_ZEROCOPY send for local delivery, and the receiver maps most of that
    # copy (all of it, or all but a last partial page: `mapped` or `partly mapped (99%)` per run)
    for verdict in by_mode["msg_zerocopy"]:
        assert verdict.startswith("copied; receive ") and "mapped" in verdict, verdict
    assert (df.loc[df["send_mode"] == "msg_zerocopy", "zc_recv_mapped_share"] > 0.5).all()

    cells = dict(zip(df["cell"], df["send_mode"]))
    verdicts = {cells[c]: v for c, v in cell_zc_verdicts(df).items()}
    assert verdicts["sendfile"] == "receive copied"
    assert verdicts["msg_zerocopy"].startswith("copied; receive ") and "mapped" in verdicts["msg_zerocopy"]
    summary = result.summary()
    lines = {mode: next(line for line in summary.splitlines() if f" {mode} " in line)
             for mode in ("sendfile", "msg_zerocopy")}
    assert "receive copied" in re.split(r"\s{2,}", lines["sendfile"].strip())   # its zero-copy column
    assert "; receive " in lines["msg_zerocopy"]
