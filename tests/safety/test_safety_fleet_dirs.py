"""A fleet's pairs are read only beneath the fleet directory: a fleet.json whose pair `dir` is `../x`, an
absolute path or a link out is refused (exit 2, naming it), for `zcorch compare FLEET` and the sweep side."""
from __future__ import annotations

import json

import pytest

from fixtures_analysis import SMALL, copy_result_set, zcorch_cli
from zcorch.errors import ResultsError
from zcorch.sweep.fleet import pair_dirs


def _fleet(tmp_path, outside_as: str):
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    copy_result_set(SMALL, fleet / "a")
    copy_result_set(SMALL, tmp_path / "x")   # someone else's set, beside the fleet
    if outside_as == "link":
        (fleet / "b").symlink_to(tmp_path / "x")
        rel = "b"
    else:
        rel = {"dotdot": "../x", "absolute": str(tmp_path / "x")}[outside_as]
    (fleet / "fleet.json").write_text(json.dumps({
        "format": "zcorch-fleet", "format_version": 1, "name": "f", "status": "complete",
        "pairs": [{"pair": "a", "dir": "a"}, {"pair": "b", "dir": rel}]}))
    return fleet, rel


@pytest.mark.parametrize("outside_as", ["dotdot", "absolute", "link"])
def test_a_pair_dir_outside_the_fleet_is_refused(tmp_path, outside_as):
    fleet, rel = _fleet(tmp_path, outside_as)
    p = zcorch_cli("compare", fleet)   # in this process: the refusal is checked, not the process
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr and rel in p.stderr
    with pytest.raises(ResultsError):
        pair_dirs(str(fleet))
