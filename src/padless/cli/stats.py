"""``padless stats``: length summary, plan statistics and what each way of batching would waste.

Lengths come from a file (``--lengths``), a built-in synthetic distribution (``--dist``) or real data
(``--data``: a data file or a built-in corpus, tokenized with ``--tokenizer`` or the tokenizer of
``--model``); the flags and the description shared with ``padless plan`` are in
:mod:`padless.cli._shared`. Sequences over ``--max-length`` follow ``--overlong`` with padless' shared
default (``error``): stats prints what it found, then refuses as packing would.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from padless.cli._shared import (
    add_lengths_arguments,
    describe_lengths,
    describe_plan,
    first_overlong,
    input_lengths,
    int_in,
    overlong_line,
    overlong_refusal,
    plan_from_args,
)
from padless.planning.lengths import compare_batching, overlong_costs, summarize_lengths

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
    add_lengths_arguments(parser, default_dist="lognormal")
    parser.add_argument("--batch-size", type=int_in(1), default=8, help="batch size of the padding baselines")
    parser.add_argument(
        "--pad-to-multiple-of",
        type=int_in(1),
        default=None,
        help="round padded batches up to a multiple (default: no rounding)",
    )
    parser.add_argument(
        "--hist", metavar="PNG", help="also draw a length histogram to this file (.png unless .svg/.pdf; default: none)"
    )
    parser.description = (
        f"{parser.description}. Lengths: --lengths, --data or --dist (default: --dist lognormal). "
        "Sequences over --max-length are counted, with what each --overlong policy would cost; "
        "with --overlong error, the default here as in padless pack and the collators, they stop "
        "the plan as they would stop packing."
    )


def _overlong_lines(costs: dict[str, dict[str, int]], max_length: int, policy: str) -> list[str]:
    over = costs["overlong"]
    return [
        overlong_line(policy, max_length, over["sequences"]),
        f"  {over['tokens']:,} tokens past it; error: stops at the first; truncate: loses "
        f"{costs['truncate']['tokens_lost']:,} tokens; split: {costs['split']['pieces']:,} pieces, loses none; "
        f"drop: loses {costs['drop']['tokens_lost']:,} tokens",
    ]


def run_stats(args: argparse.Namespace) -> int:
    hist = _hist_path(args.hist) if args.hist is not None else None
    found = input_lengths(args)
    lengths = found.lengths
    summary = summarize_lengths(lengths)
    costs = overlong_costs(lengths, args.max_length)
    over = costs["overlong"]["sequences"]
    # as packing would, --overlong error refuses sequences over --max-length: print what is known, then refuse
    plan = None if overlong_refusal(over, args) else plan_from_args(args, lengths)
    batching = (
        None if plan is None else compare_batching(lengths, plan, args.batch_size, args.seed, args.pad_to_multiple_of)
    )
    if hist is not None:
        _histogram(lengths, args.max_length, hist, found.source)
    if args.json:
        doc: dict[str, Any] = {
            "source": found.source, **({"data": found.data} if found.data else {}), "batch_size": args.batch_size,
            "lengths": summary.as_dict(), "overlong": {"policy_used": args.overlong, **costs},
            "plan": None if plan is None else {"strategy": args.strategy, "max_length": args.max_length,
                                               **plan.stats.as_dict()},
            "batching": batching,
        }  # fmt: skip
        if hist is not None:
            doc["histogram"] = str(hist)
        print(json.dumps(doc, indent=2))
    else:
        lines = describe_lengths(found, summary)
        if over:
            lines += _overlong_lines(costs, args.max_length, args.overlong)
        if plan is not None and batching is not None:
            lines += describe_plan(plan, args)
            lines += _batching_lines(batching, args)
        if hist is not None:
            lines.append(f"histogram: {hist}")
        print("\n".join(lines))
    if (refusal := overlong_refusal(over, args, first_overlong(found, args.max_length))) is not None:
        raise refusal
    return 0


def _batching_lines(batching: dict[str, dict[str, Any]], args: argparse.Namespace) -> list[str]:
    packed = batching["packed"]["tokens_computed"]
    lines = [f"batching at batch size {args.batch_size} (padding baselines truncate at {args.max_length}):",
             f"  {'':<30}{'padding':>9}{'tokens computed':>18}{'vs packed':>11}"]  # fmt: skip
    for name, label in (
        ("pad_to_longest", "pad to longest"),
        ("bucketed", "bucketed (length-grouped)"),
        ("packed", f"packed ({args.strategy})"),
    ):
        row = batching[name]
        ratio = f"{row['tokens_computed'] / packed:.2f}x" if packed else "-"
        lines.append(f"  {label:<30}{100 * row['padding_fraction']:>8.2f}%{row['tokens_computed']:>18,}{ratio:>11}")
    return lines
