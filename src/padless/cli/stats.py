"""``padless stats``: length summary, plan statistics and what each way of batching would waste.

Lengths come from a file (``--lengths``), a built-in synthetic distribution (``--dist``) or a real
corpus (``--data``); the flags and the description shared with ``padless plan`` are in
:mod:`padless.cli._shared`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from padless.cli._shared import add_lengths_arguments, describe_plan, input_lengths, int_in
from padless.planning.lengths import compare_batching, overlong_costs, summarize_lengths
from padless.planning.plan import plan_packs


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
    add_lengths_arguments(parser)
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
    lengths, source = input_lengths(args)
    summary = summarize_lengths(lengths)
    costs = overlong_costs(lengths, args.max_length)
    overlong = args.overlong or ("truncate" if costs["overlong"]["sequences"] else "error")
    plan = plan_packs(lengths, args.max_length, strategy=args.strategy, overlong=overlong,
                      max_per_row=args.max_per_row, seed=args.seed)  # fmt: skip
    args.overlong = overlong  # describe_plan reports the policy used
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
    lines = describe_plan(source, summary, plan, args)
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
