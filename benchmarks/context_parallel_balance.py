"""Context-parallel balance benchmark: shard attention work of packed rows split over cp ranks, planned offline.

No processes and no model: every figure is computed from lengths. A row of ``L`` tokens split into
``cp`` equal contiguous shards; a shard's attention work is the sum over its tokens of (position
inside the document + 1) (:mod:`padless.planning.context_balance`). The cp ranks of a row wait for
the slowest, so ``max/mean`` shard work is a step's attention time over a perfectly balanced one.

``before``: the rows of ``plan_packs`` (best fit decreasing) split as they are. ``after``:
:func:`padless.planning.context_balance.balance_plan` (documents reordered in each row, or dealt to
rows that mix long and short ones, whichever is better; no padding added, at most one document cut at
each shard boundary). Rows at least half full are counted (a part-empty last row is padding
whatever the order). Printed per workload, row length and cp: the mean and the worst row's
``max/mean``, the share of rows at or under 1.05, and the rows of the plan.

Workloads: ``agentic-rag`` (padless' agentic-RAG traces, GPT-2 tokens, drawn with replacement) and
``long-tail`` (lognormal trajectory lengths, median ``--median``, sigma ``--sigma``, clipped to the row).

    .venv/bin/python benchmarks/context_parallel_balance.py      # ~2 min on 2 shared cores
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from padless.planning.context_balance import balance_plan, imbalance, shard_work
from padless.planning.lengths import draw_lengths
from padless.planning.plan import plan_packs


def agentic_lengths() -> np.ndarray:
    """Token lengths of the 2,000 agentic-RAG traces (GPT-2 tokenizer; cached after the first run)."""
    from padless.data.load import load_corpus

    return np.asarray(load_corpus("agentic-rag", "gpt2").lengths, dtype=np.int64)


def row_ratios(plan, cp: int) -> np.ndarray:
    full = np.flatnonzero(plan.row_lengths >= 0.5 * plan.max_length)
    return np.asarray([imbalance(shard_work(plan.row(int(r))[2], plan.max_length, cp)) for r in full])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2_000_000, help="tokens drawn per workload and row length")
    parser.add_argument("--median", type=float, default=3000.0)
    parser.add_argument("--sigma", type=float, default=1.2)
    parser.add_argument("--out", default=None, help="write the figures as JSON")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    pool = agentic_lengths()
    results = []
    header = f"{'workload':12} {'L':>7} {'cp':>3} {'rows':>5}  {'before mean/worst':>18} {'<=1.05':>7}  {'after mean/worst':>17} {'<=1.05':>7} {'s':>5}"
    print(header)
    for length in (32_768, 131_072):
        for name in ("agentic-rag", "long-tail"):
            if name == "agentic-rag":
                lengths = rng.choice(pool, size=args.tokens // int(pool.mean()))
            else:
                lengths = draw_lengths(
                    "lognormal", args.tokens // int(args.median * 1.5), rng, (args.median, args.sigma, length)
                )
            plan = plan_packs(lengths, length)
            for cp in (2, 4, 8):
                start = time.perf_counter()
                balanced = balance_plan(plan, cp)
                seconds = time.perf_counter() - start
                before, after = row_ratios(plan, cp), row_ratios(balanced, cp)
                row = {
                    "workload": name, "row_length": length, "cp": cp, "rows": plan.num_rows,
                    "rows_after": balanced.num_rows, "before_mean": float(before.mean()), "before_worst": float(before.max()),
                    "before_within_1_05": float((before <= 1.05).mean()), "after_mean": float(after.mean()),
                    "after_worst": float(after.max()), "after_within_1_05": float((after <= 1.05).mean()), "seconds": seconds,
                }  # fmt: skip
                results.append(row)
                print(
                    f"{name:12} {length:>7} {cp:>3} {plan.num_rows:>5}  {row['before_mean']:>8.3f} / {row['before_worst']:<7.3f}"
                    f" {row['before_within_1_05']:>7.0%}  {row['after_mean']:>8.3f} / {row['after_worst']:<6.3f}"
                    f" {row['after_within_1_05']:>7.0%} {seconds:>5.1f}"
                )
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
