"""Build the cffi extension `zcorch._native` from the C sources in this directory.

Two ways, one definition: setup.py's `cffi_modules=["native/build.py:ffibuilder"]` (`pip install .`), or
standalone on a bare host with python3, cffi and a C compiler: `python3 native/build.py --out DIR` writes
DIR/zcorch/_native*.so named as pip names it (`--out .` from the repository root: the in-place build).
Deploy uploads native/ (a wheel carries it as zcorch/_native_src/) and runs this script on the host.

Layout: docs/architecture.md. Before compiling, gen_params.py rewrites include/zc_params_gen.h if the
importable parameter table says otherwise, and each entry of FEATURES is test-compiled against the host's
headers (as pynacl's HAS_* flags): -DZC_HAVE_<NAME> for each one found, -DZC_LACKS_<NAME>="why" for each
one missing. A mode whose feature is missing compiles as a stub that is listed and never runs (its
available() gives the reason); a missing feature never fails the build. `--without NAME` builds as if it
were missing (tests).
"""
from __future__ import annotations

import argparse
import glob
import importlib.machinery
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections import namedtuple

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


# name (the C macro suffix, upper-cased), what is missing when the probe fails (with the package that
# brings it), and the probe: a translation unit that must compile (syntax and types only, no linking).
Feature = namedtuple("Feature", ("name", "missing", "probe"))
_URING_BASE = """
#include <linux/io_uring.h>
#include <sys/syscall.h>
int main(void) {
    struct io_uring_params p; struct io_uring_sqe s; struct io_uring_cqe c; struct io_uring_getevents_arg a;
    struct io_uring_probe *pr = 0;
    (void)p; (void)s; (void)c; (void)a; (void)pr;
    return IORING_OP_SEND + IORING_OP_RECV + IORING_OP_ASYNC_CANCEL + IORING_ENTER_EXT_ARG
        + IORING_REGISTER_FILES + IORING_REGISTER_BUFFERS + IORING_REGISTER_PROBE + IORING_REGISTER_ENABLE_RINGS
        + IORING_SETUP_R_DISABLED + IORING_FEAT_EXT_ARG + IOSQE_FIXED_FILE + IOSQE_IO_LINK
        + __NR_io_uring_setup + __NR_io_uring_enter + __NR_io_uring_register;
}
"""
FEATURES = (
    Feature("io_uring", "<linux/io_uring.h> with the io_uring system calls, IORING_OP_SEND/RECV and timed waits "
                        "(Linux 5.11+ kernel headers: Debian package linux-libc-dev)", _URING_BASE),
    Feature("io_uring_send_zc", "IORING_OP_SEND_ZC with IORING_SEND_ZC_REPORT_USAGE in <linux/io_uring.h> (Linux 6.2+ "
                                "kernel headers: Debian package linux-libc-dev)",
            _URING_BASE.replace("return ", "return IORING_OP_SEND_ZC + IORING_SEND_ZC_REPORT_USAGE + "
                                           "(int)IORING_NOTIF_USAGE_ZC_COPIED + IORING_CQE_F_NOTIF + "
                                           "IORING_RECVSEND_FIXED_BUF + ")),
    Feature("io_uring_pbuf_ring", "provided buffer rings and multishot IORING_OP_RECV in <linux/io_uring.h> "
                                  "(Linux 6.0+ kernel headers: Debian package linux-libc-dev)",
            _URING_BASE.replace("int main(void) {", "int main(void) {\n    struct io_uring_buf_reg r; "
                                "struct io_uring_buf_ring *br = 0; (void)r; (void)br;")
                       .replace("return ", "return IORING_REGISTER_PBUF_RING + IORING_UNREGISTER_PBUF_RING + "
                                           "IORING_RECV_MULTISHOT + IORING_CQE_BUFFER_SHIFT + IOSQE_BUFFER_SELECT + ")),
    Feature("tcp_zerocopy_receive", "struct tcp_zerocopy_receive and TCP_ZEROCOPY_RECEIVE in <linux/tcp.h> (Linux "
                                    "4.18+ kernel headers: Debian package linux-libc-dev)", """
#include <sys/socket.h>
#include <linux/tcp.h>
int main(void) {
    struct tcp_zerocopy_receive z = {0};
    z.address = 0; z.length = 0; z.recv_skip_hint = 0;
    return TCP_ZEROCOPY_RECEIVE + TCP_MAXSEG + TCP_INFO + TCPI_OPT_TIMESTAMPS + (int)sizeof(struct tcp_info);
}
"""),
)
FEATURE_NAMES = tuple(f.name for f in FEATURES)


def _compiler() -> "list[str]":
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    argv = shlex.split(cc)
    return argv if argv and shutil.which(argv[0]) else ["cc"]


def probe_features(without: "tuple[str, ...]" = ()) -> "dict[str, str | None]":
    """{feature: None if this host's headers have it, else why not}. Compiles each probe (syntax only)."""
    unknown = sorted(set(without) - set(FEATURE_NAMES))
    if unknown:
        raise SystemExit(f"build.py: unknown feature(s) {', '.join(unknown)} (known: {', '.join(FEATURE_NAMES)})")
    out: "dict[str, str | None]" = {}
    with tempfile.TemporaryDirectory(prefix="zcorch-probe-") as tmp:
        for f in FEATURES:
            if f.name in without:
                out[f.name] = f"this worker was built with --without {f.name}"
                continue
            src = os.path.join(tmp, f.name + ".c")
            with open(src, "w") as fh:
                fh.write(f.probe)
            try:
                p = subprocess.run([*_compiler(), *CFLAGS, "-fsyntax-only", src], capture_output=True, text=True,
                                   timeout=60)
                ok = p.returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                ok = False
            out[f.name] = None if ok else (f"this worker was built without {f.missing}; install or upgrade the "
                                           "package and redeploy")
    for name in ("io_uring_send_zc", "io_uring_pbuf_ring"):  # they extend the base ring
        if out["io_uring"] is not None:
            out[name] = out["io_uring"]
    return out


def feature_macros(found: "dict[str, str | None]") -> "list[str]":
    """-D flags: ZC_HAVE_<NAME> for each feature found, ZC_LACKS_<NAME>="why" for each one missing."""
    flags = []
    for name, why in found.items():
        macro = name.upper()
        if why is None:
            flags.append(f"-DZC_HAVE_{macro}=1")
        else:  # a C string literal (argv, never a shell: quotes and spaces pass as they are)
            text = why.replace("\\", "\\\\").replace('"', '\\"')
            flags.append(f'-DZC_LACKS_{macro}="{text}"')
    return flags


def _without_from_env() -> "tuple[str, ...]":
    return tuple(n for n in os.environ.get("ZCORCH_BUILD_WITHOUT", "").replace(",", " ").split() if n)


def _gen_params():
    """native/gen_params.py, loaded by path (setuptools runs this file without native/ on sys.path)."""
    spec = importlib.util.spec_from_file_location("zcorch_gen_params", os.path.join(HERE, "gen_params.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_ffibuilder(absolute_paths: bool = False, without: "tuple[str, ...]" = ()) -> FFI:
    builder = FFI()
    gen = _gen_params()
    generated = gen.refresh(log=lambda msg: print(msg, file=sys.stderr))
    with open(os.path.join(HERE, "include", "zcorch_api.h")) as fh:
        builder.cdef(fh.read() + gen.cdef_text(generated))
    builder.set_source(
        MODULE,
        '#include "zc_internal.h"\n',
        sources=_sources(absolute_paths),
        include_dirs=[os.path.join(HERE, "include")],
        extra_compile_args=CFLAGS + feature_macros(probe_features(without)),
        extra_link_args=LDFLAGS,
    )
    return builder


def ffibuilder() -> FFI:
    """setup.py's `cffi_modules` entry: the probes run on the building host (ZCORCH_BUILD_WITHOUT="a,b": --without)."""
    return make_ffibuilder(without=_without_from_env())


def _limited_api() -> bool:
    """Whether cffi compiles against the stable ABI, as its setuptools hook decides when pip names it `.abi3.so`."""
    from cffi import recompiler

    return (getattr(recompiler, "USE_LIMITED_API", True) and not hasattr(sys, "gettotalrefcount")
            and not sysconfig.get_config_var("Py_GIL_DISABLED")
            and ".abi3.so" in importlib.machinery.EXTENSION_SUFFIXES)


def build_into(out_dir: str, verbose: bool = False, without: "tuple[str, ...]" = ()) -> str:
    """Compile into out_dir/zcorch/ under pip's name; return its path. Every other `_native*.so` there is removed:
    Python would import a `_native.cpython-3XX-*.so` before pip's `_native.abi3.so`."""
    builder = make_ffibuilder(absolute_paths=True, without=without)
    target_dir = os.path.join(os.path.abspath(out_dir), "zcorch")
    os.makedirs(target_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="zcorch-native-") as tmp:
        built = builder.compile(tmpdir=tmp, verbose=verbose)
        name = "_native.abi3.so" if _limited_api() else os.path.basename(built)
        dest = os.path.join(target_dir, name)
        for old in glob.glob(os.path.join(target_dir, "_native*.so")):
            os.unlink(old)
        shutil.move(built, dest)
        return dest


def main(argv: "list[str] | None" = None) -> int:
    ap = argparse.ArgumentParser(description="Build zcorch._native into DIR/zcorch/.")
    ap.add_argument("--out", required=True, metavar="DIR", help="directory that holds (or will hold) the zcorch package")
    ap.add_argument("--verbose", action="store_true", help="show the compiler command lines")
    ap.add_argument("--without", action="append", default=[], metavar="FEATURE", choices=FEATURE_NAMES,
                    help="build as if the host lacked FEATURE (its modes are listed but unavailable; for tests)")
    args = ap.parse_args(argv)
    print(build_into(args.out, verbose=args.verbose, without=tuple(args.without)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
