# The cffi extension is declared here because setuptools' pyproject tables cannot
# name cffi_modules; everything else lives in pyproject.toml.
from setuptools import setup

setup(cffi_modules=["native/build.py:ffibuilder"])
