# The cffi extension is declared here because setuptools' pyproject tables cannot name cffi_modules;
# everything else lives in pyproject.toml.
#
# build_py also copies the worker's C sources, headers and build script (native/) into the built package
# as zcorch/_native_src/: a wheel (or an install from the sdist, which carries native/ by MANIFEST.in) then
# holds everything `zcorch run` uploads to a remote host, found by zcorch.provision.deploy through
# importlib.resources. An editable install copies nothing: deploy reads the checkout's native/ itself.
import os

from setuptools import setup
from setuptools.command.build_py import build_py

NATIVE = "native"
NATIVE_PARTS = ["build.py", "gen_params.py", "include", "core", "modes"]   # what a host needs to build the worker
PACKAGE_DATA_DIR = os.path.join("zcorch", "_native_src")
# The shipped experiment files and the analysis notebook, for `zcorch examples` in a wheel install; and the
# recipes, each a directory of contrib/ (contrib/nightly), copied whole (`zcorch examples copy nightly`).
EXAMPLES = {"experiments": ".yaml", "notebooks": ".ipynb"}
RECIPES = "contrib"
EXAMPLES_DIR = os.path.join("zcorch", "_examples")
_SKIP_DIRS = {"__pycache__", "_build"}
_SKIP_SUFFIXES = (".so", ".o", ".pyc", ".pyo", "~")


def native_files():
    """Paths under native/ (relative, sorted) that the package carries."""
    out = []
    for part in NATIVE_PARTS:
        path = os.path.join(NATIVE, part)
        if os.path.isfile(path):
            out.append(part)
            continue
        for parent, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
            out += [os.path.relpath(os.path.join(parent, f), NATIVE) for f in files if not f.endswith(_SKIP_SUFFIXES)]
    return sorted(out)


class build_py_with_native_sources(build_py):
    """build_py, plus native/ copied into the built package as zcorch/_native_src/ and the experiments,
    notebook and recipes as zcorch/_examples/ (package data)."""

    def _native_outputs(self):
        out = {os.path.join(self.build_lib, PACKAGE_DATA_DIR, rel): os.path.join(NATIVE, rel) for rel in native_files()}
        for folder, suffix in EXAMPLES.items():
            for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
                if name.endswith(suffix):
                    out[os.path.join(self.build_lib, EXAMPLES_DIR, name)] = os.path.join(folder, name)
        for recipe in sorted(os.listdir(RECIPES)) if os.path.isdir(RECIPES) else ():
            folder = os.path.join(RECIPES, recipe)
            for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
                if os.path.isfile(os.path.join(folder, name)) and not name.endswith(_SKIP_SUFFIXES):
                    out[os.path.join(self.build_lib, EXAMPLES_DIR, recipe, name)] = os.path.join(folder, name)
        return out

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for dest, src in self._native_outputs().items():
            self.mkpath(os.path.dirname(dest))
            self.copy_file(src, dest, preserve_mode=False)

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        if getattr(self, "editable_mode", False):   # setuptools answers from get_output_mapping()
            return outputs
        return outputs + list(self._native_outputs())

    def get_output_mapping(self):
        """Editable installs: a "strict" one links these into its tree; the default one ignores them."""
        return {**super().get_output_mapping(), **self._native_outputs()}


setup(cffi_modules=["native/build.py:ffibuilder"], cmdclass={"build_py": build_py_with_native_sources})
