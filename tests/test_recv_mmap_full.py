"""`mmap` receive into a sink whose filesystem fills up: the page fault that finds no
block makes read() into the mapping fail with EFAULT, which was reported as is ("Bad address"). It is
reported as ENOSPC, naming the sink and the offset. A real 1 MiB tmpfs (size=) fills up; a 4 MiB transfer."""
from __future__ import annotations


import pytest

from fixtures_fs import small_tmpfs
from fixtures_worker import run_worker, start_receiver


@pytest.fixture
def one_mib_tmpfs(tmp_path):
    with small_tmpfs(tmp_path / "small", "1m", "zcorch-test-mmap", lazy_umount=True) as d:
        yield d


@pytest.mark.root
def test_an_mmap_receive_into_a_full_filesystem_says_enospc(one_mib_tmpfs):
    sink = one_mib_tmpfs / "recv.dat"
    rx, port = start_receiver("--listen", "127.0.0.1:0", "--mode", "mmap", "--sink", str(sink), "--timeout", "20s")
    try:
        run_worker("send", "--connect", f"127.0.0.1:{port}", "--mode", "write", "--bytes", "4MiB",
                   "--timeout", "20s")
        assert rx.wait(20) == 1
        error = rx.event(1)
    finally:
        rx.close()
    assert error["event"] == "error" and error["code"] == "ENOSPC", error
    assert f"the filesystem of sink {sink} is full" in error["message"]
    assert "EFAULT" in error["message"]          # what read() said, kept as the detail
