"""Context-parallel balance benchmark: shard attention work of packed rows split over cp ranks, planned offline.

No processes and no model: every figure is computed from lengths. A row of ``L`` tokens split into
``cp`` equal contiguous shards; a shard's attention work is the sum over its tokens of (position
inside the document + 1) (:mod:`padless.planning.context_balance`). The cp ranks of a row wait for
the slowest, so ``max/mean`` shard work is a step's attention time over a perfectly balanced one.

``before``: the rows of ``plan_packs`` (best fit decreasing) split as they are, in contiguous shards.
Then for each layout (contiguous shards; zigzag, 2 chunks per rank; striped, 8 chunks per rank dealt
in snake order): :func:`padless.planning.context_balance.balance_plan` (documents reordered in each
row, or dealt to rows that mix long and short ones, whichever is better; no padding added, at most
one document cut at each chunk boundary). Rows at least half full are counted (a part-empty last row is padding
whatever the order). Printed per workload, row length and cp: the mean and the worst row's
``max/mean``, the share of rows at or under 1.05, and the rows of the plan.

Workloads: ``agentic-rag`` (padless' agentic-RAG traces, GPT-2 tokens, drawn with replacement) and
``long-tail`` (lognormal trajectory lengths, median ``--median``, sigma ``--sigma``, clipped to the row).

    .venv/bin/python benchmarks/context_parallel_balance.py      # ~2-3 min on 2 shared cores
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from padless.planning.context_balance import LAYOUTS, balance_plan, imbalance, shard_work
from padless.planning.lengths import draw_lengths
from padless.planning.plan import plan_packs


def agentic_lengths() -> np.ndarray:
    """Token lengths of the 2,000 agentic-RAG traces (GPT-2 tokenizer; cached after the first run)."""
    from padless.data.load import load_corpus

    return np.asarray(load_corpus("agentic-rag", "gpt2").lengths, dtype=np.int64)


def row_ratios(plan, cp: int, layout: str = "contiguous") -> np.ndarray:
    full = np.flatnonzero(plan.row_lengths >= 0.5 * plan.max_length)
    return np.asarray([imbalance(shard_work(plan.row(int(r))[2], plan.max_length, cp, layout=layout)) for r in full])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1_000_000, help="tokens drawn per workload and row length")
    parser.add_argument("--median", type=float, default=3000.0)
    parser.add_argument("--sigma", type=float, default=1.2)
    parser.add_argument("--out", default=None, help="write the figures as JSON")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    pool = agentic_lengths()
    results = []
    cells = "".join(f" {name + ' mean/worst':>20} {'<=1.05':>6}" for name in ("before", *LAYOUTS))
    print(f"{'workload':12} {'L':>7} {'cp':>3} {'rows':>5}{cells} {'s':>5}")
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
                figures = {"before": row_ratios(plan, cp)}
                for layout in LAYOUTS:
                    figures[layout] = row_ratios(balance_plan(plan, cp, layout=layout), cp, layout)
                seconds = time.perf_counter() - start
                row = {"workload": name, "row_length": length, "cp": cp, "rows": plan.num_rows, "seconds": seconds}
                line = f"{name:12} {length:>7} {cp:>3} {plan.num_rows:>5}"
                for key, ratios in figures.items():
                    row.update({f"{key}_mean": float(ratios.mean()), f"{key}_worst": float(ratios.max()),
                                f"{key}_within_1_05": float((ratios <= 1.05).mean())})  # fmt: skip
                    line += f" {ratios.mean():>10.3f} / {ratios.max():<7.3f} {(ratios <= 1.05).mean():>6.0%}"
                results.append(row)
                print(f"{line} {seconds:>5.1f}", flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
