"""native/build.py as deploy runs it on a bare host: `python3 native/build.py --out DIR` must leave
an importable DIR/zcorch/_native*.so (built from a copy of native/, as a deploy uploads it)."""
from __future__ import annotations

import glob
import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

from fixtures_worker import REPO
from zcorch.params import param


@pytest.mark.slow
def test_standalone_build_into_a_directory(tmp_path):
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler (scripts/install-system-deps installs build-essential)")
    shutil.copytree(os.path.join(REPO, "native"), tmp_path / "native",
                    ignore=shutil.ignore_patterns("_build", "__pycache__"))
    out = tmp_path / "out"
    # What an earlier build left: a module under another suffix would shadow (or be shadowed by) the new one.
    (out / "zcorch").mkdir(parents=True)
    stale = [out / "zcorch" / f"_native{suffix}" for suffix in importlib.machinery.EXTENSION_SUFFIXES]
    for path in stale:
        path.write_bytes(b"stale")
    p = subprocess.run([sys.executable, "native/build.py", "--out", str(out)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    built = glob.glob(str(out / "zcorch" / "_native*.so"))
    assert len(built) == 1 and p.stdout.strip() == built[0]
    assert os.listdir(out / "zcorch") == [os.path.basename(built[0])]  # no build debris, no stale module
    # The name pip gives it (cffi compiles against the stable ABI on a CPython that is no debug build), so
    # an in-place build and `pip install -e .` never leave two modules of which Python imports the older.
    if ".abi3.so" in importlib.machinery.EXTENSION_SUFFIXES and not hasattr(sys, "gettotalrefcount"):
        assert os.path.basename(built[0]) == "_native.abi3.so"
    # importable on its own (no repo on the path): the module the worker loads remotely
    check = ("import zcorch._native as n; "
             "print(n.lib.zc_mode_count(0), n.lib.zc_mode_count(1), n.__file__, "
             "n.lib.zc_mode_caps(0, b'mmap') == n.lib.ZC_CAP_FILE_SOURCE | n.lib.ZC_CAP_MAPPABLE_SOURCE)")
    q = subprocess.run([sys.executable, "-c", check], cwd=out, env={"PATH": os.environ["PATH"], "PYTHONPATH": str(out)},
                       capture_output=True, text=True, timeout=30)
    assert q.returncode == 0, q.stderr
    modes = [str(len(param(key).choices)) for key in ("send_mode", "recv_mode")]  # the table lists the registry's
    assert q.stdout.split()[:2] == modes and q.stdout.split()[2] == built[0]
    assert q.stdout.split()[3] == "True"  # the capability API is part of every build


@pytest.mark.slow
def test_a_build_without_a_feature_lists_its_modes_as_unavailable_and_refuses_them(tmp_path):
    # What a host whose kernel headers lack io_uring (or TCP_ZEROCOPY_RECEIVE) gets: the build does not
    # fail, the modes stay listed, `worker info` says which package is missing, and a cell using one is
    # refused with that reason. Simulated with native/build.py --without (the build's HAS flags), the
    # one way short of uninstalling linux-libc-dev.
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler (scripts/install-system-deps installs build-essential)")
    pkg = tmp_path / "pkg"
    shutil.copytree(os.path.join(REPO, "zcorch"), pkg / "zcorch", ignore=shutil.ignore_patterns("_native*", "__pycache__"))
    shutil.copytree(os.path.join(REPO, "native"), tmp_path / "native", ignore=shutil.ignore_patterns("__pycache__"))
    p = subprocess.run([sys.executable, "native/build.py", "--out", str(pkg), "--without", "io_uring",
                        "--without", "tcp_zerocopy_receive"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(pkg)}

    def worker(*args):
        r = subprocess.run([sys.executable, "-m", "zcorch.worker", *args], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=60)
        return r.returncode, [json.loads(line) for line in r.stdout.splitlines() if line.strip()]

    rc, events = worker("info")
    assert rc == 0
    info = events[0]
    assert info["native"].startswith(str(pkg))
    assert "io_uring_zc" in info["modes"]["send"] and "zerocopy_recv" in info["modes"]["recv"]  # still listed
    assert info["build"]["io_uring"] == info["build"]["io_uring_send_zc"] == info["build"]["io_uring_pbuf_ring"] \
        == "this worker was built with --without io_uring"
    assert info["build"]["tcp_zerocopy_receive"] == "this worker was built with --without tcp_zerocopy_receive"
    assert info["unavailable"]["send"] == {"io_uring": info["build"]["io_uring"],
                                           "io_uring_zc": info["build"]["io_uring"]}
    assert info["unavailable"]["recv"] == {"io_uring": info["build"]["io_uring"],
                                           "zerocopy_recv": info["build"]["tcp_zerocopy_receive"]}
    assert info["runnable"] == {"send": ["write", "mmap", "sendfile", "splice", "vmsplice", "msg_zerocopy"],
                                "recv": ["read", "mmap", "vmsplice", "splice", "discard"]}
    rc, events = worker("recv", "--listen", "127.0.0.1:0", "--mode", "zerocopy_recv", "--timeout", "5")
    assert rc == 1 and events[-1]["event"] == "error" and events[-1]["code"] in ("EOPNOTSUPP", "ENOTSUP")
    assert events[-1]["message"] == ("recv zerocopy_recv: cannot run on this kernel: this worker was built with "
                                     "--without tcp_zerocopy_receive")
    # a probe that fails on the host's headers names the package
    spec = importlib.util.spec_from_file_location("zcorch_native_build", tmp_path / "native" / "build.py")
    native_build = importlib.util.module_from_spec(spec)  # a script, not a package module
    spec.loader.exec_module(native_build)
    assert all("linux-libc-dev" in f.missing for f in native_build.FEATURES)
    missing = native_build.probe_features(())
    assert set(missing) == set(native_build.FEATURE_NAMES)


def test_feature_probes_name_the_package_when_the_headers_lack_a_feature(tmp_path, monkeypatch):
    # Headers without io_uring and tcp_zerocopy_receive: empty <linux/io_uring.h> and <linux/tcp.h> found
    # first (-I), compiled by the real compiler, as on a host with headers older than the features.
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (scripts/install-system-deps installs build-essential)")
    (tmp_path / "linux").mkdir()
    (tmp_path / "linux" / "io_uring.h").write_text("/* a kernel header from before io_uring */\n")
    (tmp_path / "linux" / "tcp.h").write_text("/* before TCP_ZEROCOPY_RECEIVE */\n")
    spec = importlib.util.spec_from_file_location("zcorch_native_build", os.path.join(REPO, "native", "build.py"))
    native_build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(native_build)
    assert set(native_build.probe_features()) == set(native_build.FEATURE_NAMES)
    monkeypatch.setenv("CC", f"cc -I{tmp_path}")
    found = native_build.probe_features()
    for name, why in found.items():
        assert why and why.startswith("this worker was built without ") and "linux-libc-dev" in why, name
    assert found["io_uring_send_zc"] == found["io_uring"]  # the extensions follow their base
    flags = native_build.feature_macros(found)
    assert not any(f.startswith("-DZC_HAVE_") for f in flags)
    assert f'-DZC_LACKS_TCP_ZEROCOPY_RECEIVE="{found["tcp_zerocopy_receive"]}"' in flags


def _gen_params():
    spec = importlib.util.spec_from_file_location("gen_params_under_test", os.path.join(REPO, "native", "gen_params.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_generated_header_is_what_the_tables_generate():
    # a host or a wheel build without the zcorch package compiles the committed header as it is
    from zcorch import params as table

    gen = _gen_params()
    with open(gen.HEADER) as f:
        assert f.read() == gen.generate(table), "stale include/zc_params_gen.h: run python3 native/gen_params.py"
    assert {m.combine for m in table.METRICS} <= set(table.COMBINES)
    assert all((m.ctype is None) == (m.combine == "once") for m in table.METRICS)


def test_the_c_struct_and_its_defaults_are_the_tables():
    from fixtures_worker import HAVE_NATIVE
    from zcorch import params as table

    if not HAVE_NATIVE:
        pytest.skip("zcorch._native not built: python3 native/build.py --out .")
    from zcorch.worker import native

    fields = {name for name, _ in native.ffi.typeof("zc_params").fields}
    assert {p.dest for p in table.c_params()} <= fields
    assert {name for name, _ in native.ffi.typeof("zc_metrics").fields} == \
        {m.name for m in table.METRICS if m.ctype is not None}
    s = native.ffi.new("zc_params *")
    native.lib.zc_params_init(s)
    for p in table.c_params():
        if p.ctype != "const char *":  # the strings start NULL: the mode is required, NULL source/sink = default
            want = table.c_value(p, p.default if p.worker_absent == "default" else None)
            assert getattr(s, p.dest) == want, p.key
    assert s.uring_depth == table.DEFAULTS["uring_depth"]
