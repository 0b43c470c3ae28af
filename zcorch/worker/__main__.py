"""`python -m zcorch.worker ...`: the worker on a host (stdlib + zcorch._native only)."""
import sys

from zcorch.worker.cli import main

sys.exit(main())
