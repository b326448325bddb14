"""Rank balance benchmark: packed rows and rollout groups dealt by tokens or by cost, planned offline.

No processes and no model: every figure is computed from lengths, with the cost of a document of
``l`` tokens ``a * l + l**2`` and ``a = 12 * hidden_size`` (:mod:`padless.planning.balance`). In a
data-parallel step every rank waits for the slowest, so a step takes the time of its costliest rank:
``max/mean`` rank cost is the step's time over a perfectly balanced one.

Workloads (rows of ``--max-length`` tokens, ``--rows-per-batch`` rows per rank and step):

* ``agentic-rag``: the lengths of padless' agentic-RAG traces (2,000 traces, GPT-2 tokens,
  :mod:`padless.data.agentic`), drawn with replacement (seeded) until the largest world runs
  ``--steps`` steps.
* ``long-tail``: lognormal lengths, median ``--median``, sigma ``--sigma`` (a heavy tail), clipped
  to the row.
* ``groups``: RL rollout groups per step, ``--groups-per-part`` groups for each of ``ranks x
  --micro-batches`` parts, ``--completions`` completions each: prompts drawn from the agentic-RAG
  lengths (clipped to half a row), completions lognormal (median ``--completion-median``, sigma
  ``--completion-sigma``) clipped to the row left after the prompt; prompt shared or not.

For 2, 8 and 64 ranks (``--ranks``) and ``balance`` tokens and cost, it prints per step max/mean
rank cost (mean over the steps, and the worst step), the slowdown (sum over steps of the max over
the sum of the means: the epoch's time lost to waiting) and max/mean rank tokens (what balancing by
cost gives up), over the full steps (every rank with ``--rows-per-batch`` rows), and ``time s``: one
``schedule_epoch`` (planning included), or for groups one step's ``balance_groups``. Then the time
to deal ``--deal-rows`` (1M) rows as ``schedule_epoch`` does, by cost (Karmarkar-Karp on every
step at once, :func:`padless.planning.balance.partition_many`) and by tokens (step by step). ``--out FILE`` writes JSON.
Not a test: it asserts nothing, it reports.

    .venv/bin/python benchmarks/balance.py                   # ~30 s on 2 shared cores
    .venv/bin/python benchmarks/balance.py --hidden-size 768 --max-length 4096 --out balance.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from padless.planning.balance import balance_groups, group_loads, row_costs
from padless.planning.lengths import draw_lengths
from padless.planning.plan import PackPlan
from padless.planning.schedule import EMPTY_ROW, _deal, _deal_by_cost, schedule_epoch

BALANCES = ("tokens", "cost")


def agentic_lengths() -> np.ndarray:
    """Token lengths of the 2,000 agentic-RAG traces (GPT-2 tokenizer; cached after the first run)."""
    from padless.data.load import load_corpus

    return np.asarray(load_corpus("agentic-rag", "gpt2", train_on="assistant").lengths, dtype=np.int64)


def ratios(loads: np.ndarray) -> dict[str, float]:
    """max/mean over the columns of ``loads`` ``[steps, parts]``: mean over steps, worst, and slowdown."""
    per_step = loads.max(1) / loads.mean(1)
    return {
        "mean": float(per_step.mean()),
        "worst": float(per_step.max()),
        "slowdown": float(loads.max(1).sum() / loads.mean(1).sum()),
    }


def schedule_rows(name: str, lengths: np.ndarray, args: argparse.Namespace, a: float) -> list[dict]:
    out = []
    for world in args.ranks:
        for balance in BALANCES:
            start = time.perf_counter()
            sched = schedule_epoch(
                lengths,
                args.max_length,
                world_size=world,
                rows_per_batch=args.rows_per_batch,
                overlong="truncate",
                seed=args.seed,
                balance=balance,
                cost_a=a if balance == "cost" else None,
            )
            seconds = time.perf_counter() - start
            full = [
                i
                for i, step in enumerate(sched.batches)
                if all(len(rr) == args.rows_per_batch and EMPTY_ROW not in rr for rr in step)
            ]
            costs = sched.step_loads(row_costs(sched.plan, a))[full]
            tokens = sched.step_loads(sched.plan.row_lengths)[full]
            out.append(
                {
                    "workload": name,
                    "ranks": world,
                    "balance": balance,
                    "steps": len(full),
                    "rows": sched.plan.num_rows,
                    "cost": ratios(costs),
                    "tokens": ratios(tokens),
                    "schedule_s": seconds,
                }
            )
    return out


def group_rows(prompt_pool: np.ndarray, args: argparse.Namespace, a: float) -> list[dict]:
    out = []
    rng = np.random.default_rng(args.seed)
    for world in args.ranks:
        parts = (world, args.micro_batches)
        num = args.groups_per_part * world * args.micro_batches
        steps = []
        for _ in range(args.group_steps):
            prompts = np.minimum(rng.choice(prompt_pool, num), args.max_length // 2)
            comps = [
                np.minimum(
                    draw_lengths(
                        "lognormal",
                        args.completions,
                        rng,
                        (args.completion_median, args.completion_sigma, args.max_length),
                    ),
                    args.max_length - p,
                )
                for p in prompts.tolist()
            ]
            steps.append((prompts, comps))
        for share in (False, True):
            for balance in BALANCES:
                cost_loads, token_loads, seconds = [], [], 0.0
                for prompts, comps in steps:
                    tokens, costs = group_loads(prompts, comps, share_prompt=share, cost_a=a)
                    start = time.perf_counter()
                    got = balance_groups(
                        prompts,
                        comps,
                        parts,
                        share_prompt=share,
                        balance=balance,
                        cost_a=a if balance == "cost" else None,
                    )
                    seconds += time.perf_counter() - start
                    cost_loads.append(got.loads_of(costs).ravel())
                    token_loads.append(got.loads_of(tokens).ravel())
                out.append(
                    {
                        "workload": f"groups{', shared' if share else ''}",
                        "ranks": world,
                        "balance": balance,
                        "steps": len(steps),
                        "parts": list(parts),
                        "groups": num,
                        "cost": ratios(np.array(cost_loads)),
                        "tokens": ratios(np.array(token_loads)),
                        "schedule_s": seconds / len(steps),
                    }
                )
    return out


def deal_timings(plan: PackPlan, a: float, args: argparse.Namespace) -> list[dict]:
    """Seconds to deal ``--deal-rows`` rows, drawn from ``plan``'s rows, per world size, as ``schedule_epoch``
    deals them (lists of row ids per rank and step included): by cost (:func:`partition_many` on all
    steps at once) and by tokens (step by step)."""
    rng = np.random.default_rng(args.seed)
    out = []
    for world in args.ranks:
        per_step = world * args.rows_per_batch
        pick = rng.choice(plan.num_rows, (args.deal_rows // per_step, per_step))
        costs = row_costs(plan, a)
        ranked = pick.ravel()[np.argsort(-costs[pick.ravel()], kind="stable")]  # steps of consecutive cost
        steps = list(ranked.reshape(pick.shape))
        tokens = plan.row_lengths
        gc.collect()
        gc.disable()  # as timeit does: a collection of the benchmark's own objects is not the deal's cost
        try:
            start = time.perf_counter()
            _deal_by_cost(steps, costs, world)
            by_cost = time.perf_counter() - start
            start = time.perf_counter()
            for rows in pick:
                _deal(rows, tokens, world)
            by_tokens = time.perf_counter() - start
        finally:
            gc.enable()
        out.append({"ranks": world, "rows": int(pick.size), "cost_s": by_cost, "tokens_s": by_tokens})
    return out


def table(rows: list[dict]) -> str:
    head = (
        f"{'workload':<16} {'ranks':>5} {'balance':<7} {'steps':>5}   {'cost max/mean':>13} {'':>6} "
        f"{'slowdown':>8}   {'tokens max/mean':>15} {'':>6}   {'time s':>6}\n"
        f"{'':<16} {'':>5} {'':<7} {'':>5}   {'mean':>13} {'worst':>6} {'':>8}   {'mean':>15} {'worst':>6}"
    )
    lines = [head]
    for r in rows:
        c, t = r["cost"], r["tokens"]
        lines.append(
            f"{r['workload']:<16} {r['ranks']:>5} {r['balance']:<7} {r['steps']:>5}   {c['mean']:>13.4f} "
            f"{c['worst']:>6.3f} {100 * (c['slowdown'] - 1):>7.2f}%   {t['mean']:>15.4f} {t['worst']:>6.3f}"
            f"   {r['schedule_s']:>6.3f}"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=lambda s: [int(x) for x in s.split(",")], default=[2, 8, 64])
    p.add_argument("--max-length", type=int, default=8192, help="tokens per packed row")
    p.add_argument("--rows-per-batch", type=int, default=2, help="rows per rank and step")
    p.add_argument("--hidden-size", type=int, default=2048, help="model width: a = 12 * hidden_size")
    p.add_argument("--steps", type=int, default=40, help="full steps of the largest world (sets the data size)")
    p.add_argument("--median", type=float, default=512, help="long-tail: median length")
    p.add_argument("--sigma", type=float, default=1.5, help="long-tail: lognormal sigma")
    p.add_argument("--micro-batches", type=int, default=2, help="groups: micro-batches per rank")
    p.add_argument("--groups-per-part", type=int, default=4, help="groups: groups per micro-batch on average")
    p.add_argument("--completions", type=int, default=8, help="groups: completions per group")
    p.add_argument("--completion-median", type=float, default=256)
    p.add_argument("--completion-sigma", type=float, default=1.2)
    p.add_argument("--group-steps", type=int, default=20, help="groups: steps drawn")
    p.add_argument("--deal-rows", type=int, default=1_000_000, help="rows dealt in the timing (0: skip)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args()
    a = 12.0 * args.hidden_size
    started = time.perf_counter()
    print(
        f"a = 12 x {args.hidden_size} = {a:g}; rows of {args.max_length} tokens, {args.rows_per_batch} per rank "
        f"and step; {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )

    rng = np.random.default_rng(args.seed)
    agentic = agentic_lengths()
    tokens_needed = args.steps * max(args.ranks) * args.rows_per_batch * args.max_length
    workloads = {
        "agentic-rag": rng.choice(agentic, int(tokens_needed / agentic.mean()) + 1),
        "long-tail": None,
    }
    tail_mean = float(
        np.minimum(
            draw_lengths("lognormal", 100_000, rng, (args.median, args.sigma, args.max_length)), args.max_length
        ).mean()
    )
    workloads["long-tail"] = draw_lengths(
        "lognormal", int(tokens_needed / tail_mean) + 1, rng, (args.median, args.sigma, args.max_length)
    )
    rows: list[dict] = []
    for name, lengths in workloads.items():
        pct = np.percentile(lengths, [50, 90, 99])
        print(
            f"{name}: {lengths.size} sequences, median {pct[0]:.0f}, p90 {pct[1]:.0f}, p99 {pct[2]:.0f}, "
            f"max {lengths.max()}"
        )
        rows += schedule_rows(name, lengths, args, a)
    print(
        f"groups: {args.completions} completions a group, {args.groups_per_part} groups a part on average, "
        f"parts = ranks x {args.micro_batches} micro-batches, {args.group_steps} steps"
    )
    groups = group_rows(agentic, args, a)
    print()
    print(table(rows + groups))
    timings = []
    if args.deal_rows:
        plan = schedule_epoch(workloads["long-tail"], args.max_length, world_size=1, rows_per_batch=1).plan
        timings = deal_timings(plan, a, args)
        print()
        for t in timings:
            print(
                f"deal {t['rows']:,} rows, {t['ranks']} ranks x {args.rows_per_batch} rows a step: by cost "
                f"{t['cost_s']:.3f} s, by tokens {t['tokens_s']:.3f} s"
            )
    print(f"\ntotal {time.perf_counter() - started:.1f} s, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                    "cost_a": a,
                    "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
                    "schedule": rows,
                    "groups": groups,
                    "deal_timings": timings,
                },
                indent=2,
            )
        )
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
