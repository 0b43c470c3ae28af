"""`zcorch history` ends with os._exit (zcorch.cli.run: the interpreter's teardown of a year of objects is
skipped): what it printed still reaches a pipe in full, and its exit status is the command's. Real processes."""
import json

import pytest

from fixtures_analysis import copy_result_set, small_set, zcorch_process  # noqa: F401 - fixture


@pytest.mark.slow
def test_a_quick_exit_keeps_the_output_and_the_exit_status(small_set, tmp_path):  # noqa: F811
    root = tmp_path / "nightly"
    copy_result_set(small_set, root / "n1" / "quickstart-small")
    res = zcorch_process("history", root, "--check", "--format", "json")
    doc = json.loads(res.stdout)   # complete: buffered output is flushed before os._exit
    assert res.returncode == doc["exit_code"] == 3, res.stderr   # its one night has failed runs: incomplete
    missing = zcorch_process("history", tmp_path / "none", "--check")
    assert missing.returncode == 2 and "zcorch history: error:" in missing.stderr, missing.stderr
