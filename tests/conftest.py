"""Shared fixtures. Area-specific fixtures live in tests/fixtures_<area>.py modules, registered here as
plugins so that pytest knows each fixture once (a session fixture imported into several test modules
would be set up once per module); test modules import only their plain helper functions from them."""
import os
import shutil

import pytest

pytest_plugins = ["fixtures_analysis", "fixtures_fs", "fixtures_lab", "fixtures_run", "fixtures_spec",
                  "fixtures_worker"]

IS_ROOT = os.geteuid() == 0


def pytest_collection_modifyitems(config, items):
    skip_root = pytest.mark.skip(reason="needs root (network namespaces, loop devices, mounts)")
    for item in items:
        if not IS_ROOT and ("root" in item.keywords or "lab" in item.keywords):
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
