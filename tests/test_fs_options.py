"""`mkfs_options` / `mount_options` read as mkfs and mount read them.

Every spelling of a device reference (path, LABEL=, UUID=, value attached or in the next item, bundled
letters, long options) and every kernel-panic error policy is refused at `zcorch plan` with exit 2 and
file:line; the options zcorch accepts are checked against the real mkfs tools on loop devices."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from fixtures_fs import external_loop
from fixtures_spec import at, problems_of
from test_guards import plan_cli, refused
from zcorch.config.fs_options import mkfs_option_problems


@pytest.mark.parametrize("fs,options,index", [
    # device= behind an attached value, LABEL= / UUID= spellings, bundled letters, two items
    ("ext4", ["-Jdevice=LABEL=x"], 0),
    ("ext4", ["-Jdevice=UUID=0b9a4c1e-0000-4000-8000-000000000000"], 0),
    ("ext4", ["-J", "device=LABEL=x"], 1),
    ("ext4", ["-qJdevice=x"], 0),
    ("ext4", ["-qJ", "size=4,device=x"], 1),
    ("ext4", ["-J", "location=1m,device=PARTUUID=1"], 1),
    ("ext4", ["--device=x"], 0),
    ("ext4", ["-Ojournal_dev"], 0),
    ("ext4", ["-O", "^metadata_csum,journal_dev"], 1),
    ("ext4", ["-dsrc"], 0),                  # populate from a directory
    ("ext4", ["-l", "badblocks"], 1),        # reads a file
    ("ext4", ["-z", "undo"], 1),             # writes a file
    ("ext4", ["-E", "android_sparse"], 1),   # writes an image file, not the device
    ("ext4", ["-E", "stride=4,bogus=1"], 1),
    ("ext4", ["sdb"], 0),                    # a positional argument is a device to mke2fs
    ("ext4", ["-b", "4096", "loop7"], 2),
    ("ext4", ["--"], 0),
    ("ext4", ["-n"], 0),                     # dry run: the old filesystem would be mounted
    ("ext4", ["-e", "panic"], 1),            # an error policy that panics the kernel
    ("ext4", ["-epanic"], 0),
    ("ext4", ["-L", "LABEL=x"], 1),
    ("xfs", ["-lsize=10m,logdev=x"], 0),
    ("xfs", ["-l", "name=x"], 1),
    ("xfs", ["-d", "name=x"], 1),
    ("xfs", ["-rrtdev=UUID=1"], 0),
    ("xfs", ["-p", "proto"], 1),
    ("xfs", ["-c", "options=cfg"], 1),
    ("xfs", ["-N"], 0),
    ("btrfs", ["--rootdir", "src"], 1),
    ("btrfs", ["--rootdir=src"], 0),
    ("btrfs", ["-r", "src"], 1),
    ("btrfs", ["--device=x"], 0),
    ("btrfs", ["sdc"], 0),
    ("btrfs", ["-L", "x", "UUID=1"], 2),
])
def test_mkfs_options_naming_a_device_or_file_are_refused(write_yaml, fs, options, index):
    items = ", ".join(f'"{o}"' for o in options)
    path = write_yaml(f"name: t\nfilesystems:\n  one: {{fs: {fs}, loop: {{size: 1GiB}}, mkfs_options: [{items}]}}\n")
    problems = problems_of(path)
    assert len(problems) == 1 and at(problems[0], path, 3), problems
    assert f"filesystems.one.mkfs_options[{index}]: " in problems[0], problems


@pytest.mark.parametrize("options,index", [(["-Jdevice=LABEL=x"], 0), (["-J", "device=UUID=1"], 1),
                                           (["-qJ", "size=4,device=x"], 1)])
def test_zcorch_plan_refuses_them_with_exit_2_and_file_line(write_yaml, options, index):
    items = ", ".join(f'"{o}"' for o in options)
    path = write_yaml(f"name: t\nfilesystems:\n  one: {{fs: ext4, loop: {{size: 1GiB}}, mkfs_options: [{items}]}}\n")
    problems = refused(path)
    assert len(problems) == 1 and at(problems[0], path, 3), problems
    assert f"filesystems.one.mkfs_options[{index}]: " in problems[0] and "may not name a device" in problems[0]


@pytest.mark.parametrize("option", [
    "errors=panic", "ERRORS=panic", "fatal_errors=panic", "device=LABEL=x", "journal_path=x", "helper=x",
    "bind", "remount", "usrjquota=x",
])
def test_mount_options_that_panic_or_name_a_device_are_refused(write_yaml, option):
    path = write_yaml(f'name: t\nfilesystems:\n  one: {{fs: ext4, loop: {{size: 1GiB}}, mount_options: [noatime, "{option}"]}}\n')
    problems = refused(path) if option == "errors=panic" else problems_of(path)
    assert len(problems) == 1 and at(problems[0], path, 3) and "filesystems.one.mount_options[1]: " in problems[0]


def test_the_options_of_the_docs_and_seeds_still_plan(write_yaml):
    path = write_yaml("""
        name: t
        filesystems:
          e: {fs: ext4, loop: {size: 1GiB}, mkfs_options: ["-b", "4096", "-E", "stride=16,stripe_width=64",
              "-J", "size=64", "-O", "^has_journal", "-qF", "-e", "remount-ro", "-L", "data"],
              mount_options: [noatime, nodelalloc, "errors=remount-ro", "commit=30"]}
          x: {fs: xfs, loop: {size: 1GiB}, mkfs_options: ["-d", "su=64k,sw=4", "-lsize=64m", "-m", "crc=1", "-K"]}
          b: {fs: btrfs, loop: {size: 1GiB}, mkfs_options: ["--nodesize=16384", "-O", "no-holes", "--csum", "xxhash"],
              mount_options: ["compress=zstd:1", "fatal_errors=bug"]}
    """)
    r = plan_cli(path)
    assert r.returncode == 0, r.stderr


# What the parser accepts must be what the real tools accept, read the same way (a letter zcorch thinks
# takes no value but mkfs thinks does would swallow the next item: the device check would be off by one).
ACCEPTED_BY_REAL_MKFS = [
    ("ext4", ["-qJsize=4", "-E", "lazy_itable_init=1,stride=4", "-b4096", "-O^metadata_csum", "-L", "lab", "-m1"]),
    ("ext2", ["-FqI256", "-N", "512"]),
    ("xfs", ["-Kq", "-dsu=64k,sw=2", "-l", "size=64m,lazy-count=1", "-i", "size=512", "-L", "lab"]),
    ("btrfs", ["-q", "--nodesize=16384", "-L", "lab", "--csum", "crc32c", "-m", "single"]),
]


@pytest.mark.root
@pytest.mark.parametrize("fs,options", ACCEPTED_BY_REAL_MKFS)
def test_accepted_options_are_read_by_the_real_mkfs_as_zcorch_reads_them(tmp_path, fs, options):
    tool = f"mkfs.{fs}"
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} not installed")
    assert mkfs_option_problems(fs, options) == []
    force = ["-f"] if fs in ("xfs", "btrfs") else ["-F"]
    with external_loop(str(tmp_path), "600MiB") as dev:
        r = subprocess.run([tool, *force, *options, "--", dev], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (r.stdout, r.stderr)
        label = subprocess.run(["blkid", "-p", "-s", "TYPE", "-o", "value", dev], capture_output=True, text=True)
        assert label.stdout.strip() == fs


@pytest.mark.root
def test_a_journal_named_by_label_is_what_mke2fs_would_attach(tmp_path):
    """Why `-Jdevice=LABEL=x` matters: mke2fs finds the journal device by its label and attaches it."""
    if shutil.which("mkfs.ext4") is None:
        pytest.skip("mkfs.ext4 not installed")
    label = f"zcj{tmp_path.name[-8:]}"
    with external_loop(str(tmp_path), "8MiB") as journal, external_loop(str(tmp_path), "64MiB") as target:
        subprocess.run(["mke2fs", "-q", "-F", "-b", "4096", "-O", "journal_dev", "-L", label, journal], check=True,
                       capture_output=True)
        options = [f"-Jdevice=LABEL={label}"]
        assert mkfs_option_problems("ext4", options) != []
        r = subprocess.run(["mkfs.ext4", "-F", "-q", "-b", "4096", *options, "--", target], capture_output=True,
                           text=True, timeout=60)
        if r.returncode != 0:
            pytest.skip(f"mke2fs could not resolve the label here (no blkid cache): {r.stderr.strip()}")
        dump = subprocess.run(["dumpe2fs", "-h", target], capture_output=True, text=True).stdout
        assert "Journal device" in dump  # the external device was attached: the reason for the refusal
