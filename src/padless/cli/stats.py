"""``padless stats``: length summary, plan statistics and what each way of batching would waste.

Lengths come from a file (``--lengths``), a built-in synthetic distribution (``--dist``) or a real
corpus (``--data``). The flags shared with ``padless plan`` (:mod:`padless.cli.plan`) live here.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from padless.cli import int_in
from padless.planning.lengths import (
    DISTRIBUTIONS, LengthSummary, compare_batching, load_lengths, overlong_costs, summarize_lengths,
    synthetic_lengths,
)  # fmt: skip
from padless.planning.plan import OVERLONG_POLICIES, STRATEGIES, PackPlan, plan_packs, validate_lengths


def _input_lengths(args: argparse.Namespace, *, default_dist: str | None = "lognormal") -> tuple[np.ndarray, str]:
    """The lengths the flags ask for, and a short description of where they came from. Without
    ``--lengths``, ``--data`` or ``--dist``: ``default_dist``, or an error when that is None."""
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


def _add_common(parser: argparse.ArgumentParser) -> None:
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


def _plan(args: argparse.Namespace, lengths: np.ndarray) -> PackPlan:
    return plan_packs(
        lengths, args.max_length, strategy=args.strategy, overlong=args.overlong,
        max_per_row=args.max_per_row, seed=args.seed,
    )  # fmt: skip


def _describe(source: str, summary: LengthSummary, plan: PackPlan, args: argparse.Namespace) -> list[str]:
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


HIST_FORMATS = (".png", ".svg", ".pdf")


def _hist_path(name: str) -> Path:
    """Where ``--hist NAME`` writes: ``NAME`` with a known image suffix, else ``NAME.png``."""
    if not name.strip():
        raise ValueError("--hist needs a file name, got ''")
    path = Path(name)
    if path.suffix.lower() not in HIST_FORMATS:
        path = path.with_name(path.name + ".png")
    if path.is_dir():
        raise ValueError(f"--hist {name}: {path} is a folder")
    return path


def _histogram(lengths: np.ndarray, max_length: int, path: Path, title: str) -> None:
    from padless._optional import require

    Figure = require("matplotlib.figure", "a lengths histogram").Figure  # no pyplot: renders with Agg, no global state

    fig = Figure(figsize=(7, 3.5))
    ax = fig.add_subplot()
    lo, hi = int(lengths.min()), int(lengths.max())
    width = -(-(hi - lo + 1) // 100)  # whole tokens per bin, so no bin holds more integers than another
    ax.hist(lengths, bins=np.arange(lo, hi + width + 1, width) - 0.5, color="#4c72b0")
    ax.axvline(max_length, color="#c44e52", linestyle="--", label=f"max_length {max_length}")
    ax.axvline(float(np.median(lengths)), color="#55a868", label=f"median {np.median(lengths):g}")
    ax.set(xlabel="tokens per sequence", ylabel="sequences")
    ax.set_title(f"{lengths.size:,} sequences: {title}", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def add_stats_arguments(parser: argparse.ArgumentParser) -> None:
    _add_common(parser)
    parser.set_defaults(overlong=None)
    parser.add_argument("--batch-size", type=int_in(1), default=8, help="batch size of the padding baselines (default: 8)")
    parser.add_argument("--pad-to-multiple-of", type=int_in(1), default=None, help="round padded batches up to a multiple")
    parser.add_argument("--hist", metavar="PNG", help="also draw a length histogram to this file (.png unless .svg/.pdf)")
    parser.description = (f"{parser.description}. Lengths: --lengths, --data or --dist (default: --dist lognormal). "
                          "Sequences over --max-length are counted, with what each --overlong policy would cost; "
                          "without --overlong the plan truncates them, as the padding baselines do.")  # fmt: skip


def _overlong_lines(costs: dict[str, dict[str, int]], max_length: int, chosen: str) -> list[str]:
    over = costs["overlong"]
    return [
        f"overlong: {over['sequences']:,} sequences over --max-length {max_length} ({over['tokens']:,} tokens past it); "
        f"the plan below uses --overlong {chosen}",
        f"  error: packing stops at the first; truncate: loses {costs['truncate']['tokens_lost']:,} tokens; "
        f"split: {costs['split']['pieces']:,} pieces, loses none; drop: loses {costs['drop']['tokens_lost']:,} tokens",
    ]


def run_stats(args: argparse.Namespace) -> int:
    hist = _hist_path(args.hist) if args.hist is not None else None
    lengths, source = _input_lengths(args)
    summary = summarize_lengths(lengths)
    costs = overlong_costs(lengths, args.max_length)
    overlong = args.overlong or ("truncate" if costs["overlong"]["sequences"] else "error")
    plan = plan_packs(lengths, args.max_length, strategy=args.strategy, overlong=overlong,
                      max_per_row=args.max_per_row, seed=args.seed)  # fmt: skip
    args.overlong = overlong  # _describe reports the policy used
    batching = compare_batching(lengths, plan, args.batch_size, args.seed, args.pad_to_multiple_of)
    if hist is not None:
        _histogram(lengths, args.max_length, hist, source)
    if args.json:
        doc: dict[str, Any] = {
            "source": source, "batch_size": args.batch_size, "lengths": summary.as_dict(),
            "overlong": {"policy_used": overlong, **costs},
            "plan": {"strategy": args.strategy, "max_length": args.max_length, **plan.stats.as_dict()},
            "batching": batching,
        }  # fmt: skip
        if hist is not None:
            doc["histogram"] = str(hist)
        print(json.dumps(doc, indent=2))
        return 0
    lines = _describe(source, summary, plan, args)
    if costs["overlong"]["sequences"]:
        lines[2:2] = _overlong_lines(costs, args.max_length, overlong)
    packed = batching["packed"]["tokens_computed"]
    lines.append(f"batching at batch size {args.batch_size} (padding baselines truncate at {args.max_length}):")
    lines.append(f"  {'':<30}{'padding':>9}{'tokens computed':>18}{'vs packed':>11}")
    for name, label in (("pad_to_longest", "pad to longest"), ("bucketed", "bucketed (length-grouped)"),
                        ("packed", f"packed ({args.strategy})")):  # fmt: skip
        row = batching[name]
        ratio = f"{row['tokens_computed'] / packed:.2f}x" if packed else "-"
        lines.append(f"  {label:<30}{100 * row['padding_fraction']:>8.2f}%{row['tokens_computed']:>18,}{ratio:>11}")
    if hist is not None:
        lines.append(f"histogram: {hist}")
    print("\n".join(lines))
    return 0
