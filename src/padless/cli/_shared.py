"""Helpers that more than one ``padless`` subcommand uses (one home, so the subcommands cannot drift):
``--help`` text from docstrings (:func:`plain`), bounded integer flags (:func:`int_in`), library
messages in the words of the command line (:func:`as_flags`), the lengths flags and the plan
description of ``padless stats`` and ``padless plan`` (:func:`add_lengths_arguments`,
:func:`input_lengths`, :func:`plan_from_args`, :func:`describe_plan`), and the summary that
``padless bench`` and ``padless report`` print after writing a report (:func:`report_lines`).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

    from padless.bench.results import BenchResults
    from padless.planning.lengths import LengthSummary
    from padless.planning.plan import PackPlan


def plain(text: str | None) -> str | None:
    """``text`` without Sphinx markup, for ``--help``: ``:func:`x``` -> ``x``, double backticks -> none."""
    if text is None:
        return None
    text = re.sub(r":[a-z]+:`~?([^`<]*?)(?:\s*<[^>]*>)?`", r"\1", text)  # :role:`target` / :role:`text <t>`
    return text.replace("``", "")


INT_MAX = 2**31 - 1
"""Largest count a flag takes: token ids, lengths and counts are stored as int32."""


def int_in(low: int, high: int = INT_MAX) -> Callable[[str], int]:
    """An argparse ``type``: an integer in ``[low, high]``, else argparse's one-line usage error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high:,}, got {text}")
        return value

    parse.__name__ = "integer"
    return parse


def as_flags(message: str, names: Iterable[str] | Mapping[str, str]) -> str:
    """A library message in the words of the command line: ``max_length=5`` -> ``--max-length 5``
    (``names``: argument names, or a mapping argument -> flag such as ``{"input": "INPUT"}``)."""
    flags = dict(names) if isinstance(names, Mapping) else {n: f"--{n.replace('_', '-')}" for n in names}
    for name in sorted(flags, key=len, reverse=True):
        message = re.sub(rf"(?<![\w-]){name}=", f"{flags[name]} ", message)
        message = re.sub(rf"(?<![\w-]){name}(?= (must|is|needs|holds)\b)", flags[name], message)
    return message


def input_lengths(args: argparse.Namespace, *, default_dist: str | None = "lognormal") -> tuple[np.ndarray, str]:
    """The lengths the flags of :func:`add_lengths_arguments` ask for, and a short description of
    where they came from. Without ``--lengths``, ``--data`` or ``--dist``: ``default_dist``, or an
    error when that is None."""
    from padless.planning.lengths import DISTRIBUTIONS, load_lengths, synthetic_lengths
    from padless.planning.plan import validate_lengths

    if args.lengths is not None:
        if not args.lengths.strip():
            raise ValueError("--lengths needs a file name, got ''")
        try:
            return load_lengths(args.lengths), f"file {Path(args.lengths).name}"
        except ValueError as exc:
            raise ValueError(f"--lengths: {exc}") from None
    if args.data is not None:
        if not args.data.strip():
            raise ValueError("--data needs a corpus name or a data file, got ''")
        try:
            from padless.data import corpus_lengths
        except ImportError as exc:
            raise ValueError(f"--data needs padless.data.corpus_lengths, which is not available: {exc}") from None
        return validate_lengths(corpus_lengths(args.data)), f"corpus {args.data}"
    dist = args.dist or default_dist
    if dist is None:
        raise ValueError("no lengths given: pass --lengths FILE, --data CORPUS or --dist "
                         f"{'|'.join(DISTRIBUTIONS)} (with --num and --seed)")  # fmt: skip
    return synthetic_lengths(dist, args.num, args.seed), f"{DISTRIBUTIONS[dist][1]}, seed {args.seed}"


def add_lengths_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``padless stats`` and ``padless plan``: where the lengths come from and how to plan them."""
    from padless.planning.lengths import DISTRIBUTIONS
    from padless.planning.plan import OVERLONG_POLICIES, STRATEGIES

    src = parser.add_mutually_exclusive_group()
    src.add_argument("--lengths", metavar="FILE", help="lengths file: .npy, .txt (one per line) or .json list")
    src.add_argument("--dist", choices=list(DISTRIBUTIONS), default=None, help="synthetic distribution")
    src.add_argument("--data", metavar="CORPUS", help="a real corpus or data file, via padless.data.corpus_lengths")
    parser.add_argument("--num", type=int_in(1), default=100_000, help="draws from --dist (default: 100000)")
    parser.add_argument("--seed", type=int_in(0), default=0, help="seed for --dist, bucketing and histogram_best_fit")
    parser.add_argument("--max-length", type=int_in(1), default=2048, help="row capacity in tokens (default: 2048)")
    parser.add_argument("--strategy", choices=STRATEGIES, default="best_fit_decreasing", help="packing strategy")
    parser.add_argument("--overlong", choices=OVERLONG_POLICIES, default="error", help="sequences over --max-length")
    parser.add_argument("--max-per-row", type=int_in(1), default=None, help="cap on documents per row")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON instead of text")


def plan_from_args(args: argparse.Namespace, lengths: np.ndarray) -> PackPlan:
    """The plan the flags of :func:`add_lengths_arguments` ask for."""
    from padless.planning.plan import plan_packs

    return plan_packs(
        lengths, args.max_length, strategy=args.strategy, overlong=args.overlong,
        max_per_row=args.max_per_row, seed=args.seed,
    )  # fmt: skip


def describe_plan(source: str, summary: LengthSummary, plan: PackPlan, args: argparse.Namespace) -> list[str]:
    """Lines describing the lengths and the plan (``padless stats`` and ``padless plan``)."""
    s = plan.stats
    return [
        f"lengths: {source}",
        f"  {summary.count:,} sequences, {summary.total:,} tokens; min {summary.min}, median {summary.median:g}, "
        f"mean {summary.mean:.1f}, p90 {summary.p90:g}, p99 {summary.p99:g}, max {summary.max}",
        f"plan: {args.strategy}, max_length {plan.max_length}, overlong {args.overlong}"
        + (f", max {args.max_per_row} per row" if args.max_per_row else ""),
        f"  {s.num_rows:,} rows (lower bound {s.lower_bound:,}, gap {s.gap_to_lower_bound:,} = {100 * s.relative_gap:.3f}%), "
        f"efficiency {100 * s.efficiency:.3f}%, documents per row {s.mean_per_row:.1f} mean / {s.max_per_row} max",
        f"  truncated {s.truncated_sequences:,} ({s.truncated_tokens:,} tokens), split {s.split_sequences:,}, "
        f"dropped {s.dropped_sequences:,} ({s.dropped_tokens:,} tokens)",
    ]


def report_lines(results: BenchResults, html: Path, extra: Iterable[str] = ()) -> list[str]:
    """What ``padless bench`` and ``padless report`` print after writing a report: the summary table,
    then where things are."""
    from padless.bench.report import format_summary_table

    return [format_summary_table(results), "", f"report:  {html}", *extra]
