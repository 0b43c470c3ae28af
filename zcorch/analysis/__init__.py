"""Analysis of result sets: tidy frames, statistics, plots, the HTML report, compare, history.

The public entry points are zcorch's (`zcorch.load`, `zcorch.summarize`, ...). The package imports nothing:
`zcorch.analysis.gate` (the exit-code text of `compare`'s and `history`'s parsers) must not pull pandas and
scipy into `zcorch --help`.
"""
