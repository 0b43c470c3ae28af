"""`zcorch report DIR`: a self-contained HTML report of one result set (DIR/report.html).

`--format markdown` / `json` print the Findings (and the Reproduction section) to stdout instead
(docs/schemas/report.schema.json), writing no file. The work: zcorch.analysis.report and .summary.
"""
from __future__ import annotations

import argparse
from zcorch.cli import add_command


def register(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    p = add_command(subparsers, "report", __doc__)
    p.add_argument("dir", help="result set directory (written by zcorch run)")
    p.add_argument("-o", "--output", help="report file (default DIR/report.html)")
    p.add_argument("--no-plot-files", action="store_true", help="do not write DIR/plots/*.png|svg")
    p.add_argument("--format", choices=("html", "markdown", "json"), default="html",
                   help="markdown: print the Findings (and the Reproduction section when the experiment has a "
                        "`reference:`) to stdout; json: the same as one JSON document "
                        "(docs/schemas/report.schema.json); html (default): write the report file")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    if args.format in ("markdown", "json"):
        from zcorch.analysis import summary

        if args.format == "markdown":
            print(summary.report_markdown(args.dir), end="\n")
        else:
            import json

            print(json.dumps(summary.report_document(args.dir), indent=2, ensure_ascii=False, allow_nan=False))
        return 0
    from zcorch.analysis.report import write_report  # pandas, matplotlib: only when the command runs

    out = write_report(args.dir, args.output, () if args.no_plot_files else ("png", "svg"))
    print(out)
    return 0
