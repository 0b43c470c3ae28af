"""`zcorch report DIR`: a self-contained HTML report of one result set (DIR/report.html).

`--format markdown` prints the report's Reproduction section alone (the study's published figures next to
this run's, and the verdict per claim) to stdout, and writes nothing.

The report is zcorch.analysis.report.write_report; this module is its command line.
"""
from __future__ import annotations

import argparse


def register(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    p = subparsers.add_parser("report", help="write DIR/report.html (tables, plots, failed runs)",
                              description=__doc__.splitlines()[0])
    p.add_argument("dir", help="result set directory (written by zcorch run)")
    p.add_argument("-o", "--output", help="report file (default DIR/report.html)")
    p.add_argument("--no-plot-files", action="store_true", help="do not write DIR/plots/*.png|svg")
    p.add_argument("--format", choices=("html", "markdown"), default="html",
                   help="markdown: print the Reproduction section (published vs measured, verdicts) to stdout "
                        "instead of writing the HTML report")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    if args.format == "markdown":
        from zcorch.analysis.report import reproduction_markdown

        print(reproduction_markdown(args.dir), end="")
        return 0
    from zcorch.analysis.report import write_report  # pandas, matplotlib: only when the command runs

    out = write_report(args.dir, args.output, () if args.no_plot_files else ("png", "svg"))
    print(out)
    return 0
