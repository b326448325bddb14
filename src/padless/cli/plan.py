"""``padless plan``: plan packed rows for a set of lengths and save the flat plan (``.npz``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from padless.cli.stats import _add_common, _describe, _input_lengths, _plan
from padless.planning.lengths import summarize_lengths


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    _add_common(parser)
    parser.add_argument("--out", metavar="FILE.npz", required=True, help="where to write the plan's arrays")


def run_plan(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.suffix != ".npz":
        raise ValueError(f"--out must end in .npz, got {out}")
    lengths, source = _input_lengths(args)
    plan = _plan(args, lengths)
    out.parent.mkdir(parents=True, exist_ok=True)
    plan.save(str(out))
    if args.json:
        print(json.dumps({"source": source, "out": str(out), "strategy": args.strategy, **plan.stats.as_dict()}, indent=2))
    else:
        print("\n".join([*_describe(source, summarize_lengths(lengths), plan, args), f"wrote {out}"]))
    return 0
