"""The host CPU view across the two-host lab (real SSH, two network namespaces of one kernel): the
calibration runs on each host over SSH, both workers see one /proc/stat (same_host), the data link is
veth, and the report says what that means for the zero-copy verdict."""
import json

import pytest
import yaml

import zcorch
from fixtures_run import zcorch as run_zcorch
from zcorch.analysis.report import write_report
from zcorch.results.store import read_jsonl

pytestmark = [pytest.mark.lab, pytest.mark.root, pytest.mark.timeout(300)]


def test_host_view_calibration_and_verdicts_across_the_lab(lab, tmp_path):  # noqa: F811
    exp = {"name": "labcpu", "hosts": lab.hosts_spec,
           "params": {"bytes": "64MiB", "timeout": "30s", "sample_interval": "5ms"},
           "matrix": {"send_mode": ["write", "msg_zerocopy"], "recv_mode": ["read", "discard"]},
           "baselines": {"iperf3": False, "dd": False}}
    path = tmp_path / "labcpu.yaml"
    path.write_text(yaml.safe_dump(exp))
    out = tmp_path / "out"
    r = run_zcorch("lab", "run", path, "-o", out, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "send host-CPU" in r.stdout and "share one kernel" in r.stdout
    meta = json.loads((out / "meta.json").read_text())
    for role in ("sender", "receiver"):
        host = meta["hosts"][role]
        assert host["calibration"]["memcpy_s_per_gib"] > 0, host["calibration"]   # ran over SSH on that host
        assert host["interface"]["kind"] == "veth"
    assert meta["same_host"] is True    # two namespaces, one kernel: one /proc/stat
    runs = read_jsonl(str(out / "runs.jsonl"))
    assert [x["status"] for x in runs] == ["ok"] * 4 and all(x["same_host"] is True for x in runs)
    df = zcorch.load(out)
    assert set(df.loc[df["send_mode"] == "msg_zerocopy", "zc_verdict"]) == {"copied"}   # veth copies
    assert (df["send_host_busy_s_per_gib"] > 0).all() and df["send_cpu_copies"].notna().all()
    text = write_report(out).read_text()
    assert "veth) on the sender" in text and "ran on one machine" in text
