"""Install anywhere: the sdist and the wheel carry everything deploy uploads (native/ as the package data
zcorch/_native_src/, copied by setup.py's build_py), and a wheel installed into a fresh venv outside the
checkout runs a localhost sweep and a two-host lab sweep from an empty directory.

Everything is built from a copy of this checkout's source files (nothing is written into the checkout),
offline: `python -m build --no-isolation` with this interpreter's setuptools and build (the test extras).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import uuid
import zipfile
from pathlib import Path

import pytest
import yaml

from zcorch.provision import deploy
from zcorch.results.store import read_jsonl

CHECKOUT = Path(deploy.PACKAGE_PARENT)
_ARTEFACTS = shutil.ignore_patterns(".git", ".venv", "build", "dist", "results", "*.egg-info", "__pycache__",
                                    "*.so", "*.o", "_build", ".pytest_cache")


def require_build_tools() -> None:
    from importlib import metadata

    try:
        setuptools = metadata.version("setuptools")
        metadata.version("build")
    except metadata.PackageNotFoundError as exc:
        pytest.skip(f"{exc.name} not installed for {sys.executable} (scripts/bootstrap test installs the test extras)")
    if tuple(int(x) for x in setuptools.split(".")[:3] if x.isdigit()) < (78, 1, 1):
        pytest.skip(f"setuptools {setuptools} < 78.1.1 (pyproject.toml's build requirement; "
                    f"scripts/bootstrap test installs the test extras)")


def clean_env(**extra: str) -> dict:
    """The environment without anything that would put this checkout on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(extra)
    return env


def source_copy(dest: Path) -> Path:
    """This checkout's source files (tracked and new, not ignored ones) in `dest`: what a clone has."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=CHECKOUT,
                            capture_output=True, timeout=60)
    if listed.returncode != 0:   # not a git checkout (an unpacked archive): everything but build artefacts
        shutil.copytree(CHECKOUT, dest, ignore=_ARTEFACTS)
        return dest
    for rel in filter(None, listed.stdout.decode().split("\0")):
        src = CHECKOUT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def python_build(src: Path, out: Path, *flags: str) -> list:
    p = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), *flags, str(src)],
                       capture_output=True, text=True, timeout=600, env=clean_env())
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return sorted(out.iterdir())


def deploy_view(python: str, cwd: Path, env: dict) -> dict:
    """What zcorch.provision.deploy of the installation that `python` imports would upload."""
    code = ("import json, zcorch; from zcorch.provision import deploy; s = deploy.worker_sources(); "
            "print(json.dumps({'package': zcorch.__file__, 'native': deploy.native_sources_dir(), 'sources': s, "
            "'hash': deploy.content_hash(s), 'parent': deploy.PACKAGE_PARENT}))")
    p = subprocess.run([python, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


# -- fast: what the sdist and the built package hold ---------------------------------------------------

@pytest.mark.slow
def test_sdist_carries_native_and_no_build_artefacts(tmp_path):
    require_build_tools()
    src = source_copy(tmp_path / "src")
    (src / "zcorch" / "_native.cpython-311-x86_64-linux-gnu.so").write_bytes(b"a stale in-place build")
    (src / "native" / "_build").mkdir()
    (src / "native" / "_build" / "core.o").write_bytes(b"debris")
    [sdist] = python_build(src, tmp_path / "dist", "--sdist")
    assert sdist.name.endswith(".tar.gz")
    with tarfile.open(sdist) as tar:
        top = tar.getnames()[0].split("/")[0]
        names = {n[len(top) + 1:] for n in tar.getnames() if n.startswith(top + "/")}
    native = {rel for rel in deploy.worker_sources() if rel.startswith("native/")}
    assert native and native <= names, native - names
    assert {"setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "zcorch/worker/cli.py",
            "zcorch/analysis/templates/report.html.j2"} <= names
    assert nightly_recipe() and {f"contrib/nightly/{n}" for n in nightly_recipe()} <= names
    assert not [n for n in names if n.endswith((".so", ".o", ".pyc")) or "/_build" in n or n.startswith("tests/")]


def built_package(tmp_path: Path) -> "tuple[Path, Path]":
    """(a source copy, the package setup.py's build_py made of it: no compiler involved)."""
    require_build_tools()
    src = source_copy(tmp_path / "src")
    lib = tmp_path / "lib"
    p = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(lib)], cwd=src,
                       capture_output=True, text=True, timeout=300, env=clean_env())
    assert p.returncode == 0, p.stderr[-3000:]
    return src, lib


def test_the_built_package_uploads_what_the_checkout_uploads(tmp_path):
    """setup.py's build_py (no compiler involved): the same relative paths and the same content hash, the
    C side taken from the built package's own zcorch/_native_src/."""
    _, lib = built_package(tmp_path)
    built = deploy_view(sys.executable, tmp_path, clean_env(PYTHONPATH=str(lib)))
    assert built["package"] == str(lib / "zcorch" / "__init__.py")
    assert built["native"] == str(lib / "zcorch" / deploy.NATIVE_PACKAGE_DATA)
    checkout = deploy.worker_sources()
    assert list(built["sources"]) == list(checkout)
    assert all(path.startswith(str(lib) + os.sep) for path in built["sources"].values())
    assert built["hash"] == deploy.content_hash(checkout)


def nightly_recipe() -> dict:
    """contrib/nightly's files, name -> bytes: the recipe `zcorch examples copy nightly` writes out."""
    folder = CHECKOUT / "contrib" / "nightly"
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def assert_nightly_copied(zcorch: list, cwd: Path, env: dict) -> None:
    """`zcorch examples copy nightly` writes the recipe as a directory, its script executable; the script runs;
    a second copy overwrites nothing (exit 2)."""
    listed = subprocess.run([*zcorch, "examples"], cwd=cwd, capture_output=True, text=True, timeout=120, env=env)
    assert any(ln.split()[:2] == ["nightly", "recipe"] for ln in listed.stdout.splitlines()), listed.stdout
    copied = subprocess.run([*zcorch, "examples", "copy", "nightly"], cwd=cwd, capture_output=True, text=True,
                            timeout=120, env=env)
    assert copied.returncode == 0, copied.stderr
    assert copied.stdout.strip() == "./nightly"
    out = cwd / "nightly"
    assert {p.name: p.read_bytes() for p in out.iterdir()} == nightly_recipe()
    script = out / "zcorch-nightly"
    assert os.access(script, os.X_OK) and not os.access(out / "zcorch-nightly.timer", os.X_OK)
    helped = subprocess.run([str(script), "--help"], cwd=cwd, capture_output=True, text=True, timeout=60, env=env)
    assert helped.returncode == 0 and "--root" in helped.stdout, helped.stderr
    (out / "zcorch-nightly.cron").write_text("mine")
    again = subprocess.run([*zcorch, "examples", "copy", "nightly"], cwd=cwd, capture_output=True, text=True,
                           timeout=120, env=env)
    assert again.returncode == 2 and "not overwritten" in again.stderr
    assert (out / "zcorch-nightly.cron").read_text() == "mine"


@pytest.mark.slow
def test_the_built_package_carries_the_nightly_recipe(tmp_path):
    """contrib/nightly is package data (zcorch/_examples/nightly/): `zcorch examples copy nightly` of the built
    package, not of the checkout, writes it out."""
    src, lib = built_package(tmp_path)
    data = lib / "zcorch" / "_examples" / "nightly"
    assert {f.name: f.read_bytes() for f in data.iterdir()} == nightly_recipe()
    shutil.rmtree(src)   # nothing but the built package to read from
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_nightly_copied([sys.executable, "-m", "zcorch"], empty, clean_env(PYTHONPATH=str(lib)))


# -- the wheel, installed outside the checkout, in the two-host lab -------------------------------------

@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """(sdist, wheel) of this checkout; the wheel is built from the sdist, as pip builds an sdist."""
    require_build_tools()
    tmp = tmp_path_factory.mktemp("dist")
    files = python_build(source_copy(tmp / "src"), tmp / "out")
    [sdist] = [f for f in files if f.name.endswith(".tar.gz")]
    [wheel] = [f for f in files if f.name.endswith(".whl")]
    return sdist, wheel


def fresh_venv(path: Path, wheel: Path) -> Path:
    """A venv with the wheel installed (no pip of its own, nothing of this checkout). Its third-party
    dependencies are this interpreter's (a .pth naming its site-packages, read after the venv's own, so
    zcorch itself comes from the wheel): installing them anew would need the network and minutes."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    python = path / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, env=clean_env()).stdout.strip()
    deps = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    Path(site, "zcorch-test-deps.pth").write_text("".join(d + "\n" for d in deps))
    p = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                        "-q", str(wheel)], capture_output=True, text=True, timeout=300, env=clean_env())
    assert p.returncode == 0, p.stdout + p.stderr
    return python


@pytest.mark.slow
def test_wheel_contents_match_the_sdist_and_an_in_place_build(dist):
    sdist, wheel = dist
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
    native = {rel for rel in deploy.worker_sources() if rel.startswith("native/")}
    assert {f"zcorch/{deploy.NATIVE_PACKAGE_DATA}/{rel[len('native/'):]}" for rel in native} <= names
    assert not [n for n in names if n.startswith("native/")]        # no top-level package named native
    assert {f"zcorch/_examples/nightly/{n}" for n in nightly_recipe()} <= names
    modules = [n for n in names if n.startswith("zcorch/_native") and n.endswith(".so")]
    # one compiled module, named as native/build.py names an in-place or remote build
    assert len(modules) == 1
    here = [os.path.basename(p) for p in Path(CHECKOUT, "zcorch").glob("_native*.so")]
    if here:
        assert here == [os.path.basename(modules[0])]


@pytest.fixture(scope="module")
def wheel_venv(dist, tmp_path_factory):
    venv = tmp_path_factory.mktemp("wheel-venv") / "venv"
    return venv, fresh_venv(venv, dist[1])


@pytest.mark.slow
def test_a_wheel_install_runs_a_localhost_sweep(wheel_venv, tmp_path):
    """localhost: the worker is the installed package itself (PYTHONPATH = its site-packages, run with -S)."""
    venv, python = wheel_venv
    experiment = tmp_path / "local.yaml"
    experiment.write_text(yaml.safe_dump({"name": "local", "params": {"bytes": "1MiB", "timeout": "30s"},
                                          "matrix": {"send_mode": ["write"], "recv_mode": ["read"]},
                                          "repeats": 1, "baselines": False}))
    p = subprocess.run([str(venv / "bin" / "zcorch"), "run", str(experiment), "-o", str(tmp_path / "rs")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300, env=clean_env())
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    [run] = read_jsonl(str(tmp_path / "rs" / "runs.jsonl"))
    assert run["status"] == "ok" and run["receiver"]["bytes"] == 1 << 20
    # -S: no site-packages but what PYTHONPATH names, so the worker ran from the installed package
    # (-P: nothing from the current directory; the venv's python is this interpreter's version)
    if sys.version_info >= (3, 11):
        assert f"{python} -S -P -m zcorch.worker recv" in (tmp_path / "rs" / run["log"]).read_text()
    code = ("import json; from zcorch.hosts.local import LocalHost; from zcorch.provision import deploy; "
            "h = deploy.deploy(LocalHost()); r = h.host.run(h.command(['info'])); "
            "print(json.dumps([h.env, deploy.PACKAGE_PARENT, r.stdout.splitlines()[-1]]))")
    q = subprocess.run([str(python), "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                       env=clean_env())
    assert q.returncode == 0, q.stderr
    env, site, info = json.loads(q.stdout)
    assert Path(site).is_relative_to(venv) and env["PYTHONPATH"].split(":")[0] == site
    assert json.loads(info)["native"].startswith(os.path.join(site, "zcorch", "_native"))


@pytest.mark.slow
def test_a_wheel_install_copies_the_nightly_recipe(wheel_venv, tmp_path):
    venv, _python = wheel_venv
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_nightly_copied([str(venv / "bin" / "zcorch")], empty, clean_env())


@pytest.mark.slow
def test_a_wheel_install_run_from_inside_a_source_checkout_uses_the_installed_package(wheel_venv, tmp_path):
    """`zcorch run` of a wheel install, started in a checkout (whose zcorch/ has no built
    _native), ran the checkout's package as the localhost worker ("the native module zcorch._native is not
    built ... <checkout>/zcorch/__init__.py"). Every job and the worker must import the installed one."""
    venv, python = wheel_venv
    checkout = source_copy(tmp_path / "checkout")
    assert not list((checkout / "zcorch").glob("_native*.so"))
    experiment = tmp_path / "local.yaml"
    experiment.write_text(yaml.safe_dump({"name": "local", "params": {"bytes": "1MiB", "timeout": "30s"},
                                          "matrix": {"send_mode": ["write"], "recv_mode": ["read"]},
                                          "repeats": 1, "baselines": {"iperf3": False,
                                                                      "dd": {"bs": "64KiB", "count": 4}}}))
    p = subprocess.run([str(venv / "bin" / "zcorch"), "run", str(experiment), "-o", str(tmp_path / "rs")],
                       cwd=checkout, capture_output=True, text=True, timeout=300, env=clean_env())
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    [run] = read_jsonl(str(tmp_path / "rs" / "runs.jsonl"))
    assert run["status"] == "ok" and run["receiver"]["bytes"] == 1 << 20
    assert str(checkout) not in (tmp_path / "rs" / run["log"]).read_text()
    meta = json.loads((tmp_path / "rs" / "meta.json").read_text())
    assert str(checkout) not in json.dumps(meta.get("hosts", {}))
    # `python -m zcorch` there too: the current directory's tree comes first on sys.path, the installed one is meant
    q = subprocess.run([python, "-m", "zcorch", "worker", "info"], cwd=checkout, capture_output=True, text=True,
                       timeout=120, env=clean_env())
    assert q.returncode == 0, q.stderr[-3000:]
    assert str(checkout) not in json.loads(q.stdout)["native"], q.stdout


@pytest.mark.slow
@pytest.mark.lab
def test_a_wheel_installed_outside_the_checkout_runs_a_two_host_sweep(lab, wheel_venv, tmp_path):
    venv, python = wheel_venv
    run_dir = tmp_path / "empty"
    run_dir.mkdir()
    env = clean_env()
    installed = deploy_view(str(python), run_dir, env)
    site = Path(installed["parent"])
    assert installed["package"] == str(site / "zcorch" / "__init__.py")
    assert site.is_relative_to(venv) and not site.is_relative_to(CHECKOUT)
    assert installed["native"] == str(site / "zcorch" / deploy.NATIVE_PACKAGE_DATA)
    assert all(Path(p).is_relative_to(site / "zcorch") for p in installed["sources"].values())
    assert list(installed["sources"]) == list(deploy.worker_sources()) and installed["hash"] == deploy.content_hash(
        deploy.worker_sources())

    workdir = f"~/.cache/zcorch-wheel-{uuid.uuid4().hex[:8]}"   # a fresh upload and build, not a reused one
    hosts = {role: dict(spec, workdir=workdir) for role, spec in lab.hosts_spec.items()}
    experiment = tmp_path / "exp" / "wheel.yaml"
    experiment.parent.mkdir()
    experiment.write_text(yaml.safe_dump({
        "name": "wheel", "hosts": hosts, "params": {"bytes": "1MiB", "timeout": "30s", "recv_mode": "read"},
        "matrix": {"send_mode": ["write", "vmsplice"]}, "repeats": 1, "baselines": False}))
    try:
        p = subprocess.run([str(venv / "bin" / "zcorch"), "run", str(experiment)], cwd=run_dir, capture_output=True,
                           text=True, timeout=600, env=env)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        [result] = list((run_dir / "results").iterdir())
        assert sorted(os.listdir(run_dir)) == ["results"]
        runs = read_jsonl(str(result / "runs.jsonl"))
        assert sorted(r["params"]["send_mode"] for r in runs) == ["vmsplice", "write"]
        assert all(r["status"] == "ok" and r["receiver"]["bytes"] == 1 << 20 for r in runs), runs
        assert json.loads((result / "manifest.json").read_text())["status"] == "complete"
        controller = json.loads((result / "meta.json").read_text())["controller"]
        assert controller["python_executable"] == str(python)
        assert controller["git_revision"] is None           # no checkout behind a wheel install
        # Both hosts got the wheel's files: the build directory is keyed by their hash, and lists them.
        for host in (lab.sender, lab.receiver):
            build = Path(host.home, workdir[2:], f"worker-{installed['hash']}")
            marker = json.loads((build / deploy.MARKER).read_text())
            assert marker["files"] == list(installed["sources"])
            for rel, local in installed["sources"].items():
                assert (build / rel).read_bytes() == Path(local).read_bytes(), rel
            assert list(build.glob("zcorch/_native*.so"))
    finally:
        for host in (lab.sender, lab.receiver):
            shutil.rmtree(Path(host.home, workdir[2:]), ignore_errors=True)
    assert lab.zcorch_procs("sender") == [] and lab.zcorch_procs("receiver") == []


def lowest_supported_python() -> "tuple[int, int]":
    """The lowest Python version pyproject.toml's requires-python admits (">=3.11" -> (3, 11))."""
    import re

    text = (CHECKOUT / "pyproject.toml").read_text()
    major, minor = re.search(r'requires-python\s*=\s*">=\s*(\d+)\.(\d+)"', text).groups()
    return int(major), int(minor)


@pytest.mark.slow
def test_a_wheel_on_the_lowest_supported_python_copies_the_quick_start_and_runs_it(wheel_venv, tmp_path):
    """As a new user: a fresh venv of the lowest Python the package supports (the interpreter running the
    suite must be that one, since the venv borrows its installed dependencies; CI runs the suite with it),
    `zcorch examples copy quickstart` into an empty directory, then that sweep."""
    lowest = lowest_supported_python()
    if sys.version_info[:2] != lowest:
        pytest.skip(f"the suite runs on Python {sys.version_info[0]}.{sys.version_info[1]}, not the lowest "
                    f"supported {lowest[0]}.{lowest[1]}: run it with that interpreter to check the floor")
    venv, python = wheel_venv
    out = subprocess.run([str(python), "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                         text=True, timeout=60, env=clean_env())
    assert out.stdout.strip() == str(lowest)
    empty = tmp_path / "empty"
    empty.mkdir()
    zcorch = str(venv / "bin" / "zcorch")
    copied = subprocess.run([zcorch, "examples", "copy", "quickstart"], cwd=empty, capture_output=True, text=True,
                            timeout=120, env=clean_env())
    assert copied.returncode == 0, copied.stderr
    assert (empty / "quickstart.yaml").read_text() == (CHECKOUT / "experiments" / "quickstart.yaml").read_text()
    listed = subprocess.run([zcorch, "examples"], cwd=empty, capture_output=True, text=True, timeout=120,
                            env=clean_env())
    assert "analysis" in listed.stdout and "schutt-2006" in listed.stdout   # the notebook and studies ship too
    run = subprocess.run([zcorch, "run", "quickstart.yaml", "--set", "duration=0.5s", "--set", "repeats=1",
                          "--set", "baselines=false"], cwd=empty, capture_output=True, text=True, timeout=900,
                         env=clean_env())
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    [rs] = list((empty / "results").iterdir())
    runs = read_jsonl(str(rs / "runs.jsonl"))
    assert runs and all(r["status"] == "ok" for r in runs)
