"""Shared fixtures. Area-specific fixtures live in tests/fixtures_<area>.py modules, registered here as
plugins so that pytest knows each fixture once (a session fixture imported into several test modules
would be set up once per module); test modules import only their plain helper functions from them."""
import functools
import os
import re
import shutil

import pytest

pytest_plugins = ["fixtures_analysis", "fixtures_browser", "fixtures_fs", "fixtures_lab", "fixtures_run",
                  "fixtures_spec", "fixtures_worker"]

IS_ROOT = os.geteuid() == 0

# The tier markers a test gets from the fixtures it uses (directly or through other fixtures), so that a
# new test is classified without anyone remembering a decorator. --quick leaves out every test carrying
# one of QUICK_EXCLUDES.
FIXTURE_MARKERS = {
    "lab": ("lab", "root"),        # network namespaces + sshd
    "other_user": ("root",),       # creates a user
    "browser": ("browser",),       # headless Chromium
}
QUICK_EXCLUDES = ("lab", "root", "browser")
# What a test module calls to measure time or CPU: such a test, and every lab test (one shared lab per
# session, throughput it asserts), is `serial`: under pytest-xdist it runs alone (scripts/test -n N runs the
# serial tests in a second pass, on one process, after the others).
MEASURES = re.compile(r"perf_counter|process_time|getrusage|cpu_times|ru_utime|ru_stime|timeit")


@functools.lru_cache(maxsize=None)
def _module_measures(path: str) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            return MEASURES.search(f.read()) is not None
    except OSError:
        return False


def pytest_addoption(parser):
    parser.addoption("--quick", action="store_true",
                     help="leave out the lab, root and browser tiers (markers derived from fixtures)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture in getattr(item, "fixturenames", ()):
            for name in FIXTURE_MARKERS.get(fixture, ()):
                if item.get_closest_marker(name) is None:
                    item.add_marker(name)
        if item.get_closest_marker("lab") and item.get_closest_marker("root") is None:
            item.add_marker("root")
        if item.get_closest_marker("serial") is None and (
                item.get_closest_marker("lab") or _module_measures(str(item.path))):
            item.add_marker("serial")
        if item.get_closest_marker("serial"):
            item.add_marker(pytest.mark.xdist_group("serial"))
    if config.getoption("quick"):
        kept, left = [], []
        for item in items:
            (left if any(item.get_closest_marker(m) for m in QUICK_EXCLUDES) else kept).append(item)
        if left:
            config.hook.pytest_deselected(items=left)
            items[:] = kept
    skip_root = pytest.mark.skip(reason="needs root (network namespaces, loop devices, mounts)")
    for item in items:
        if not IS_ROOT and item.get_closest_marker("root"):
            item.add_marker(skip_root)


def require_tool(name: str) -> str:
    """Path of an executable the test needs, or a skip that names it and the package to install."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed (scripts/install-system-deps installs it)")
    return path


def can_drop_caches() -> bool:
    """Whether this process can drop the page cache (what makes a dd read-back uncached): root, and a
    writable /proc/sys (a container's root often has it read-only)."""
    return os.geteuid() == 0 and os.access("/proc/sys/vm/drop_caches", os.W_OK)
