"""``padless stats``: length summary, plan statistics and what each way of batching would waste.

Lengths come from a file (``--lengths``), a built-in synthetic distribution (``--dist``) or real data
(``--data``: a data file or a built-in corpus, tokenized with ``--tokenizer`` or the tokenizer of
``--model``); the flags and the description shared with ``padless plan`` are in
:mod:`padless.cli._shared`. stats reports rather than stops: without ``--overlong`` a sequence over
``--max-length`` is split into pieces (:data:`STATS_OVERLONG`, every token kept) and the report says
so and what ``padless pack`` would do instead; ``--overlong error`` refuses as packing would. The
comparison of batching ways is :func:`padless.planning.lengths.compare_batching`: one overlong policy
and one definition of padding for all of them, the one ``padless bench`` uses.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    plural,
)
from padless.planning.lengths import compare_batching, overlong_costs, summarize_lengths

if TYPE_CHECKING:
    from padless.planning.plan import PackPlan

HIST_FORMATS = (".png", ".svg", ".pdf")
STATS_OVERLONG = "split"
"""stats' overlong policy without ``--overlong``: a report keeps every token rather than stopping at the
first long sequence (padless pack, the collators and the trainers default to ``error``)."""


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
        "--processor",
        default=None,
        metavar="NAME",
        help="render --data chats with images through this processor of an image-text model (a hub name or "
        "folder; 'offline': the Qwen2-VL processor padless builds from offline parts), as padless pack "
        "--processor does (default: none; chats go through --tokenizer, text parts only)",
    )
    parser.add_argument(
        "--hist", metavar="PNG", help="also draw a length histogram to this file (.png unless .svg/.pdf; default: none)"
    )
    from padless.planning.checks import OVERLONG_DEFAULT

    overlong = next(a for a in parser._actions if a.dest == "overlong")
    overlong.default = None
    overlong.help = (
        f"what a sequence over --max-length does (default: {STATS_OVERLONG}, so the report keeps every token; "
        f"padless pack and the collators default to {OVERLONG_DEFAULT})"
    )
    parser.description = (
        f"{parser.description}. Lengths: --lengths, --data or --dist (default: --dist lognormal). "
        "Sequences over --max-length are counted, with what each --overlong policy would cost; without "
        f"--overlong they are split ({STATS_OVERLONG}: every token kept) and the report says so; "
        "--overlong error stops the plan as it would stop packing."
    )


_DEFAULT_WHY = {
    STATS_OVERLONG: ", so the report keeps every token",
    "drop": " with --processor: a document with images is placed whole, never cut",
}


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
    chosen = args.overlong is not None
    if args.processor is not None and args.data is None:
        raise ValueError("--processor applies to --data (chats with images to render), not to --lengths or --dist")
    # a document with images is placed whole (packing refuses to cut one): with --processor, drop is the report's
    args.overlong = args.overlong or (STATS_OVERLONG if args.processor is None else "drop")
    if args.processor is not None:
        from padless.cli._processor import processor_lengths

        found = processor_lengths(args)
    else:
        found = input_lengths(args)
    lengths = found.lengths
    summary = summarize_lengths(lengths)
    costs = overlong_costs(lengths, args.max_length)
    over = costs["overlong"]["sequences"]
    # as packing would, --overlong error refuses sequences over --max-length: print what is known, then refuse
    plan = None if overlong_refusal(over, args) else plan_from_args(args, lengths)
    batching = None
    if plan is not None:
        batching = compare_batching(
            lengths, plan, args.batch_size, args.seed, args.pad_to_multiple_of, overlong=args.overlong
        )
    if hist is not None:
        _histogram(lengths, args.max_length, hist, found.source)
    if args.json:
        doc: dict[str, Any] = {
            "source": found.source, **({"data": found.data} if found.data else {}), "batch_size": args.batch_size,
            "lengths": summary.as_dict(), "overlong": {"policy_used": args.overlong, "policy_given": chosen, **costs},
            "plan": None if plan is None else {"strategy": args.strategy, "max_length": args.max_length,
                                               **plan.stats.as_dict()},
            "batching": batching, "smaller_than_one_row": None if plan is None else plan.num_rows <= 1,
        }  # fmt: skip
        if hist is not None:
            doc["histogram"] = str(hist)
        print(json.dumps(doc, indent=2))
    else:
        lines = describe_lengths(found, summary)
        if over:
            lines += _overlong_lines(costs, args.max_length, args.overlong)
            if not chosen:
                lines.append(
                    f"  ({args.overlong} is stats' default{_DEFAULT_WHY[args.overlong]}; padless pack, the collators "
                    "and the trainers stop at them unless told --overlong / overlong= split, truncate or drop)"
                )
        if plan is not None and batching is not None:
            lines += describe_plan(plan, args)
            lines += batching_lines(batching, plan, args, over)
        if hist is not None:
            lines.append(f"histogram: {hist}")
        print("\n".join(lines))
    # only under --overlong error, given here (stats reports rather than stops by default)
    if (refusal := overlong_refusal(over, args, first_overlong(found, args.max_length))) is not None:
        raise ValueError(str(refusal).replace(" (the default)", ""))
    return 0


def batching_lines(
    batching: dict[str, dict[str, Any]], plan: PackPlan, args: argparse.Namespace, over: int
) -> list[str]:
    """The comparison table: each way of batching the same placed tokens (``over`` sequences over the
    limit, each way under ``--overlong``), its padding (the share of computed tokens that are not the
    data's, as ``padless bench`` counts it) and its tokens computed against packing's; no ratio where
    every token fits in one row (nothing is packed side by side)."""
    real = plan.stats.real_tokens
    policy = f", overlong {args.overlong} for every way" if over else ""
    lines = [
        f"batching at batch size {args.batch_size}: the same {plural(real, 'token')}{policy}; padding = share of "
        "computed tokens that are not data (as padless bench counts it)",
        f"  {'':<34}{'padding':>9}{'tokens computed':>18}{'vs packed':>11}",
    ]
    one_row = plan.num_rows <= 1
    packed = batching["packed"]["tokens_computed"]
    for name, label in (
        ("pad_to_longest", "pad to longest (shuffled)"),
        ("bucketed", "bucketed (length-grouped)"),
        ("packed", f"packed ({args.strategy})"),
    ):
        row = batching[name]
        ratio = "-" if one_row or not packed else f"{row['tokens_computed'] / packed:.2f}x"
        lines.append(f"  {label:<34}{100 * row['padding_fraction']:>8.2f}%{row['tokens_computed']:>18,}{ratio:>11}")
    if one_row:
        lines.append(
            f"  all {plural(real, 'token')} fit in one row of --max-length {plan.max_length}: smaller than one row, "
            "so there is no ratio to packing (it would only feed them as one padding-free row)"
        )
    return lines
