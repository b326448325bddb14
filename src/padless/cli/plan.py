"""``padless plan``: plan packed rows for a set of lengths and save the flat plan (``.npz``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from padless.cli._shared import add_lengths_arguments, describe_lengths, describe_plan, input_lengths, plan_from_args
from padless.planning.lengths import summarize_lengths


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    add_lengths_arguments(parser)
    parser.description = f"{parser.description}. Lengths: one of --lengths, --data or --dist is required."
    parser.add_argument("--out", metavar="FILE.npz", required=True, help="where to write the plan's arrays")


def run_plan(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.suffix != ".npz" or not out.stem:
        raise ValueError(f"--out must end in .npz, got {out}")
    found = input_lengths(args, default_dist=None)
    plan = plan_from_args(args, found.lengths)
    if out.is_dir():
        raise ValueError(f"--out {out} is a folder; give a file name ending in .npz")
    out.parent.mkdir(parents=True, exist_ok=True)
    plan.save(str(out))
    if args.json:
        data = {"data": found.data} if found.data else {}
        print(
            json.dumps(
                {"source": found.source, **data, "out": str(out), "strategy": args.strategy, **plan.stats.as_dict()},
                indent=2,
            )
        )
    else:
        lines = [*describe_lengths(found, summarize_lengths(found.lengths)), *describe_plan(plan, args)]
        print("\n".join([*lines, f"wrote {out}"]))
    return 0
