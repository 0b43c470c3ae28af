"""Build the cffi extension `zcorch._native` from the C sources in this directory.

Two ways, one definition:
  * setuptools: setup.py declares `cffi_modules=["native/build.py:ffibuilder"]`, so
    `pip install .` / `pip install -e .` compile it into the zcorch package;
  * standalone, on a bare remote host with only python3, cffi and a C compiler:
    `python3 native/build.py --out DIR` writes DIR/zcorch/_native*.so (build files go to a
    temporary directory), named as pip names it (`_native.abi3.so` on CPython). `--out .` from the
    repository root is the in-place development build.

A wheel or sdist install carries this file and the sources below as package data (zcorch/_native_src/,
copied by setup.py's build_py); deploy uploads them to a remote host as native/ and runs this script there.

Layout: include/ (zcorch_api.h, the declarations-only header fed verbatim to ffi.cdef, and
zc_internal.h), core/ (the transfer core, errors, helpers, the mode registry) and modes/ (one file per
send or receive mode). Out-of-line API mode: cffi compiles the real C and checks the declarations in
zcorch_api.h against it.
"""
from __future__ import annotations

import argparse
import glob
import importlib.machinery
import os
import shutil
import sys
import sysconfig
import tempfile

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE = "zcorch._native"
CFLAGS = ["-O2", "-D_GNU_SOURCE", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-pthread"]
LDFLAGS = ["-pthread"]  # the sampler thread (core/hoststat.c); glibc before 2.34 has pthread in a library of its own


def _sources(absolute: bool) -> "list[str]":
    files = sorted(glob.glob(os.path.join(HERE, "core", "*.c")) + glob.glob(os.path.join(HERE, "modes", "*.c")))
    if absolute:
        return files
    # setuptools wants paths relative to setup.py's directory (the cwd of the build)
    rel = [os.path.relpath(f) for f in files]
    return files if any(r.startswith("..") for r in rel) else rel


def make_ffibuilder(absolute_paths: bool = False) -> FFI:
    builder = FFI()
    with open(os.path.join(HERE, "include", "zcorch_api.h")) as fh:
        builder.cdef(fh.read())
    builder.set_source(
        MODULE,
        '#include "zc_internal.h"\n',
        sources=_sources(absolute_paths),
        include_dirs=[os.path.join(HERE, "include")],
        extra_compile_args=CFLAGS,
        extra_link_args=LDFLAGS,
    )
    return builder


ffibuilder = make_ffibuilder()


def _limited_api() -> bool:
    """Whether cffi compiles the module against the stable ABI (it defines Py_LIMITED_API itself unless
    the interpreter is a debug or free-threaded build): the rule cffi's setuptools hook applies when
    `pip install` names the module `_native.abi3.so`."""
    from cffi import recompiler

    return (getattr(recompiler, "USE_LIMITED_API", True) and not hasattr(sys, "gettotalrefcount")
            and not sysconfig.get_config_var("Py_GIL_DISABLED")
            and ".abi3.so" in importlib.machinery.EXTENSION_SUFFIXES)


def build_into(out_dir: str, verbose: bool = False) -> str:
    """Compile into out_dir/zcorch/ and return the path of the built shared object.

    The file gets the name `pip install` gives it (`_native.abi3.so` on CPython), and every other
    `_native*.so` there is removed: a `_native.cpython-3XX-*.so` next to pip's `_native.abi3.so` would
    be the one Python imports (it tries the version-specific suffix first)."""
    builder = make_ffibuilder(absolute_paths=True)
    target_dir = os.path.join(os.path.abspath(out_dir), "zcorch")
    os.makedirs(target_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="zcorch-native-")
    try:
        built = builder.compile(tmpdir=tmp, verbose=verbose)
        name = "_native.abi3.so" if _limited_api() else os.path.basename(built)
        dest = os.path.join(target_dir, name)
        for old in glob.glob(os.path.join(target_dir, "_native*.so")):
            os.unlink(old)
        shutil.move(built, dest)
        return dest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: "list[str] | None" = None) -> int:
    ap = argparse.ArgumentParser(description="Build zcorch._native into DIR/zcorch/.")
    ap.add_argument("--out", required=True, metavar="DIR", help="directory that holds (or will hold) the zcorch package")
    ap.add_argument("--verbose", action="store_true", help="show the compiler command lines")
    args = ap.parse_args(argv)
    print(build_into(args.out, verbose=args.verbose))
    return 0


if __name__ == "__main__":
    sys.exit(main())
