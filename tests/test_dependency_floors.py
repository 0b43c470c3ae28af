"""pyproject.toml's version floors admit no release with a known, fixed vulnerability.

Each entry of FIXED is a published advisory against a release range this project's floor could admit,
and the first release that fixes it. A floor below that release lets pip (or a distribution's
packaging) pick a vulnerable version: pyarrow 14.0.0 runs code while reading a hostile Parquet/IPC
file (CVE-2023-47248), and `zcorch report`/`history` read result sets others may have written.
"""
from __future__ import annotations

import os
import sys

import pytest

packaging = pytest.importorskip("packaging")  # pip, build, pytest and matplotlib all depend on it
from packaging.requirements import Requirement  # noqa: E402
from packaging.version import Version  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# package -> (first fixed release, the advisories it fixes)
FIXED = {
    "pyarrow": ("14.0.1", "CVE-2023-47248"),
    "jinja2": ("3.1.6", "CVE-2024-22195, CVE-2024-34064, CVE-2024-56201, CVE-2024-56326, CVE-2025-27516"),
    "paramiko": ("3.4.0", "CVE-2023-48795"),
    "pyyaml": ("5.4", "CVE-2020-14343"),
    "setuptools": ("78.1.1", "CVE-2025-47273, CVE-2024-6345"),
    "pytest": ("9.0.3", "CVE-2025-71176"),
    "tqdm": ("4.66.3", "CVE-2024-34062"),
    "duckdb": ("1.1.0", "CVE-2024-41672"),
}
# Markers under which no fixed release exists: the floor there may lag (none today: requires-python >= 3.11).
NO_FIX_FOR: "dict[str, str]" = {}


def _requirements() -> "list[tuple[str, Requirement]]":
    if sys.version_info < (3, 11):
        pytest.skip("tomllib (Python 3.11+) reads pyproject.toml")
    import tomllib

    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        doc = tomllib.load(f)
    found = [("build-system.requires", Requirement(r)) for r in doc["build-system"]["requires"]]
    found += [("project.dependencies", Requirement(r)) for r in doc["project"]["dependencies"]]
    for extra, reqs in doc["project"].get("optional-dependencies", {}).items():
        found += [(f"optional-dependencies.{extra}", Requirement(r)) for r in reqs]
    return found


def _floor(req: Requirement) -> "Version | None":
    lows = [Version(s.version) for s in req.specifier if s.operator in (">=", "==", "~=", ">")]
    return max(lows) if lows else None


def test_no_floor_admits_a_release_with_a_fixed_vulnerability():
    problems = []
    for where, req in _requirements():
        name = req.name.lower()
        if name not in FIXED:
            continue
        if req.marker is not None and str(req.marker) == NO_FIX_FOR.get(name):
            continue
        fixed, cves = FIXED[name]
        floor = _floor(req)
        if floor is None or floor < Version(fixed):
            problems.append(f"{where}: {req} admits releases before {fixed} ({cves})")
    assert not problems, "\n".join(problems)


def test_every_runtime_dependency_has_a_floor():
    """A bare name would admit every vulnerable release ever published (zcorch[EXTRA], this project's own
    extra named by another extra, is no release of anyone's)."""
    bare = [f"{where}: {req}" for where, req in _requirements() if _floor(req) is None and req.name != "zcorch"]
    assert not bare, bare
