"""Vision cost per row with and without ``max_cost``, on a synthetic vision-language corpus.

20,000 documents (``--num``): 40% text-only, the rest with 1-3 images whose patch counts follow a long
tail (lognormal, 64..16,384 patches); text lengths lognormal (median 150). Each image also takes
``patches // 4`` placeholder tokens in the sequence (a 2x2 patch merge), so ``length`` = text + image
tokens and ``cost`` = patches. Rows of ``--max-length`` (2048) tokens, best fit decreasing, planned
without a cost limit and with ``--max-cost``. Prints max / mean cost per row and per micro-batch of
``--rows-per-batch`` rows, rows, fill (tokens / capacity) and planning time; ``--out`` writes JSON.
Not a test: it asserts nothing, it reports.

    .venv/bin/python benchmarks/vision_cost.py --out /tmp/vision_cost.json
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from padless.planning.costs import micro_batch_costs, row_costs
from padless.planning.plan import plan_packs


def corpus(num: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(lengths, costs)``, int64 ``[num]`` each."""
    rng = np.random.default_rng(seed)
    text = np.clip(rng.lognormal(np.log(150), 1.0, num), 1, 1500).astype(np.int64)
    images = np.where(rng.random(num) < 0.4, 0, rng.integers(1, 4, num))
    patches = np.clip(rng.lognormal(np.log(576), 0.9, (num, 3)), 64, 16384).astype(np.int64)
    patches[np.arange(3)[None, :] >= images[:, None]] = 0
    costs = patches.sum(1)
    return text + (patches // 4).sum(1), costs


def measure(lengths, costs, max_length, max_cost, rows_per_batch) -> dict:
    t0 = time.perf_counter()
    plan = plan_packs(lengths, max_length, costs=costs, max_cost=max_cost, overlong="drop")
    seconds = time.perf_counter() - t0
    per_row = row_costs(plan, costs)
    per_batch = micro_batch_costs(plan, costs, rows_per_batch)
    return dict(
        max_cost=max_cost,
        rows=plan.num_rows,
        fill=plan.stats.efficiency,
        dropped=plan.stats.dropped_sequences,
        row_cost_max=int(per_row.max()),
        row_cost_mean=float(per_row.mean()),
        batch_cost_max=int(per_batch.max()),
        batch_cost_mean=float(per_batch.mean()),
        cost_lower_bound_rows=int(
            -(-int(costs[np.isin(np.arange(costs.size), plan.dropped, invert=True)].sum()) // max_cost)
        )
        if max_cost
        else None,
        token_lower_bound_rows=plan.stats.lower_bound,
        seconds=seconds,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num", type=int, default=20_000)
    ap.add_argument("--max-length", type=int, default=2048)
    ap.add_argument("--max-cost", type=int, default=5000, help="patches per row")
    ap.add_argument("--rows-per-batch", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write the results here as JSON")
    args = ap.parse_args()
    lengths, costs = corpus(args.num, args.seed)
    print(
        f"{args.num} documents, {int((costs == 0).sum())} text-only; {int(lengths.sum())} tokens, "
        f"{int(costs.sum())} patches; max cost of one document {int(costs.max())}"
    )
    results = [measure(lengths, costs, args.max_length, m, args.rows_per_batch) for m in (None, args.max_cost)]
    head = f"{'max_cost':>9} {'rows':>6} {'fill':>7} {'drop':>5} {'row max':>8} {'row mean':>9} "
    head += f"{'mb max':>7} {'mb mean':>8} {'tok LB':>7} {'cost LB':>8} {'time s':>7}"
    print(f"rows of {args.max_length} tokens, micro-batches (mb) of {args.rows_per_batch} rows")
    print(head)
    for r in results:
        print(
            f"{str(r['max_cost']):>9} {r['rows']:>6} {r['fill']:>7.4f} {r['dropped']:>5} {r['row_cost_max']:>8} "
            f"{r['row_cost_mean']:>9.1f} {r['batch_cost_max']:>7} {r['batch_cost_mean']:>8.1f} "
            f"{r['token_lower_bound_rows']:>7} {str(r['cost_lower_bound_rows']):>8} {r['seconds']:>7.3f}"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(args=vars(args), results=results), f, indent=2)


if __name__ == "__main__":
    main()
