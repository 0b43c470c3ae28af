"""Everything that ships to the hosts: the worker command line, the native binding, the remote helpers.

Stdlib-only (plus the built `zcorch._native`); imports nothing from zcorch but errors and units.
"""
