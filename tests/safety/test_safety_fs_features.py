"""mke2fs takes a feature by its number as well as by its name (`-O feature_i3` is journal_dev): numbers meet
the same rule as names, and a number mke2fs has no name for is refused. Checked against the real mke2fs."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from zcorch.config.fs_options import mkfs_option_problems


@pytest.mark.parametrize("opts", [["-O", "feature_i3"], ["-Ofeature_I3"], ["-O", "^metadata_csum,Feature_i3"]])
def test_journal_dev_by_number_is_refused_as_by_name(opts):
    problems = mkfs_option_problems("ext4", opts)
    assert problems and "journal_dev" in problems[0][1] and "external journal" in problems[0][1]


def test_unknown_feature_numbers_are_refused_and_known_ones_meet_their_names_rule():
    assert "no name for" in mkfs_option_problems("ext4", ["-O", "feature_i99"])[0][1]
    assert "no name for" in mkfs_option_problems("ext4", ["-O", "feature_c5000"])[0][1]
    assert mkfs_option_problems("ext4", ["-O", "feature_r10"]) == []   # metadata_csum, as by its name


def test_the_real_mke2fs_reads_feature_i3_as_journal_dev(tmp_path):
    if not (shutil.which("mke2fs") and shutil.which("dumpe2fs")):
        pytest.skip("mke2fs/dumpe2fs not installed (e2fsprogs)")
    image = tmp_path / "img"
    subprocess.run(["mke2fs", "-q", "-F", "-b", "4096", "-O", "feature_i3", str(image), "8M"], check=True,
                   capture_output=True)
    out = subprocess.run(["dumpe2fs", "-h", str(image)], capture_output=True, text=True).stdout
    assert "journal_dev" in out or "Journal block size" in out
