# Single source of the version: the controller and every deployed worker must agree on it
# (preflight compares them), so it lives in a stdlib-only module that is deployed too.
__version__ = "0.1.0"
