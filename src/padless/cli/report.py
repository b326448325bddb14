"""``padless report``: redraw the plots and report.html from a results.json alone."""

from __future__ import annotations

import argparse
from pathlib import Path

from padless.bench.report import write_report
from padless.bench.results import load_results
from padless.cli._shared import report_lines


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``padless report``."""
    parser.add_argument("results", type=Path, metavar="RESULTS.json", help="a results.json of padless bench")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="where to write the plots and report.html (default: the folder of RESULTS.json)",
    )


def run_report(args: argparse.Namespace) -> int:
    """``padless report``: redraw the plots and report.html from the json alone, print the table."""
    results = load_results(args.results)  # ValueError (missing, not json, invalid) -> exit 2
    paths = write_report(results, args.out if args.out is not None else args.results.parent)
    plots = ", ".join(str(p) for n, p in paths.items() if n != "html")
    print("\n".join(report_lines(results, paths["html"], [f"plots:   {plots}"])))
    return 0
