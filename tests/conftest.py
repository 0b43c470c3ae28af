"""Shared fixtures. Area-specific fixtures live in tests/fixtures_<area>.py modules."""
import os
import shutil

import pytest

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
