from zcorch.cli import run

run()
