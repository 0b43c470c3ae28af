"""The shipped two-host experiment on the lab through `zcorch lab inventory` and `--hosts`, shrunk with `--set`,
started twice back to back, and --resume on the hosts the result set recorded."""
import json
import os

import pytest
import yaml

from fixtures_run import REPO, zcorch
from zcorch.config.hosts import Hosts
from zcorch.config.inventory import select
from zcorch.results.store import read_jsonl

pytestmark = [pytest.mark.lab, pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(900)]

SCHUTT = os.path.join(REPO, "experiments", "schutt-2006.yaml")
# Two cells of 64 MiB, one repeat, short baselines: the file itself is not edited.
SHRINK = ["--set", "bytes=64MiB", "--set", "repeats=1", "--set", "matrix.send_mode=[write, splice]",
          "--set", "matrix.recv_mode=[read]", "--set", "include=[]", "--set", "baselines.iperf3.duration=1s",
          "--set", "baselines.iperf3.omit=0", "--set", "baselines.dd.count=256"]


def test_schutt_on_the_lab_inventory_twice_back_to_back(lab, tmp_path, tag):  # noqa: F811
    r = zcorch(tag, "lab", "inventory", "--name", lab.name)
    assert r.returncode == 0, r.stderr
    inv = tmp_path / "lab.yaml"
    inv.write_text(r.stdout)
    assert yaml.safe_load(r.stdout) == {"pairs": {lab.name: lab.hosts_spec}}
    chosen = select(str(inv))
    assert chosen.pair == lab.name and chosen.hosts == lab.hosts

    # back to back, default result directories (results/<name>-<UTC time>/ under the working directory)
    first = zcorch(tag, "run", SCHUTT, "--hosts", inv, *SHRINK, cwd=tmp_path, timeout=400)
    assert first.returncode == 0, first.stdout + first.stderr
    second = zcorch(tag, "run", SCHUTT, "--hosts", f"{inv}:{lab.name}", *SHRINK, cwd=tmp_path, timeout=400)
    assert second.returncode == 0, second.stdout + second.stderr
    dirs = sorted(tmp_path.glob("results/schutt-2006-*"))
    assert len(dirs) == 2
    for out in dirs:
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["status"] == "complete"
        assert manifest["inventory"] == chosen.record() and manifest["overrides"] == SHRINK[1::2]
        runs = read_jsonl(str(out / "runs.jsonl"))
        assert sorted(x["params"]["send_mode"] for x in runs) == ["splice", "write"]
        assert all(x["status"] == "ok" and x["receiver"]["bytes"] == 64 << 20 for x in runs), runs
        baselines = read_jsonl(str(out / "baselines.jsonl"))
        assert sorted(b["kind"] for b in baselines) == ["dd_read", "dd_write", "iperf3", "iperf3"]
        assert all(b["status"] == "ok" for b in baselines), baselines
        assert Hosts.from_mapping(yaml.safe_load((out / "experiment.yaml").read_text())["hosts"]) == lab.hosts
        meta = json.loads((out / "meta.json").read_text())
        assert meta["hosts"]["receiver"]["scratch"] == "/root/.cache/zcorch/scratch"
    # the second sweep found the first's source file and used it as it is
    assert "sources_laid_out" not in json.loads((dirs[1] / "meta.json").read_text())
    assert lab.zcorch_procs("sender") == [] and lab.zcorch_procs("receiver") == []

    # --resume uses the recorded hosts: the environment's inventory is not read
    (dirs[0] / "runs.jsonl").write_text((dirs[0] / "runs.jsonl").read_text().splitlines()[0] + "\n")
    r = zcorch(tag, "run", "--resume", dirs[0], env={"ZCORCH_HOSTS": str(tmp_path / "missing.yaml")},
               cwd=tmp_path, timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = read_jsonl(str(dirs[0] / "runs.jsonl"))
    assert len(runs) == 2 and all(x["status"] == "ok" for x in runs)
