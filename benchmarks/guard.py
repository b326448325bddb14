"""What :class:`padless.IsolationGuard` costs a training run, measured side by side in one process.

Times a packed training step (forward, token-normalised loss, backward, AdamW) and one guard check
(with the step's logits, and re-running the batch), interleaved, then prints the per-step overhead
ratio ``(step + check / every) / step`` for a few ``every`` values. Absolute times depend on the
machine; the ratios are the figures::

    .venv/bin/python benchmarks/guard.py                          # gpt2-mini, 2 rows of 512, 8 steps
    .venv/bin/python benchmarks/guard.py --model tiny-llama --rows 4 --max-length 1024 --steps 12
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import numpy as np
import torch

from padless.batching.batch import forward_inputs
from padless.batching.collate import PackingCollator
from padless.isolation.guard import IsolationGuard
from padless.models.factory import build_model
from padless.objectives.loss import causal_lm_loss, step_num_items
from padless.planning.lengths import synthetic_lengths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2-mini")
    ap.add_argument("--backend", default="sdpa")
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--documents", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    model = build_model(args.model, attn_implementation=args.backend, seed=args.seed)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    collate = PackingCollator.for_model(model, max_length=args.max_length)
    rng = np.random.default_rng(args.seed)
    lengths = np.minimum(synthetic_lengths("lognormal", 4000, seed=args.seed), args.max_length)
    vocab = model.config.vocab_size

    def next_batch():
        feats, used = [], 0
        while used < args.rows * args.max_length * 0.95:
            n = int(lengths[rng.integers(lengths.size)])
            feats.append({"input_ids": rng.integers(0, vocab, n).tolist()})
            used += n
        return collate(feats)

    guard = IsolationGuard(every=1, documents=args.documents)
    step_t, given_t, rerun_t, worst = [], [], [], 0.0
    for i in range(args.steps + 1):  # the first round warms up and is not counted
        batch = next_batch()
        t0 = time.perf_counter()
        logits = model(**forward_inputs(batch)).logits
        causal_lm_loss(logits, batch["labels"], step_num_items([batch], all_ranks=False)).backward()
        t1 = time.perf_counter()
        check = guard(model, batch, logits.detach())  # before optimizer.step(): the logits' weights
        t2 = time.perf_counter()
        guard.check(model, batch)  # re-running the batch (what a loop without logits at hand pays)
        t3 = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t4 = time.perf_counter()
        if i:
            step_t.append(t1 - t0 + t4 - t3), given_t.append(t2 - t1), rerun_t.append(t3 - t2)
            worst = max(worst, check.max_logit_diff)
    step, given, rerun = (statistics.median(x) for x in (step_t, given_t, rerun_t))
    print(
        f"{args.model} ({args.backend}), {args.rows} rows x {args.max_length}, {args.documents} documents per "
        f"check, {args.steps} steps; torch {torch.__version__}, {platform.machine()}, "
        f"{torch.get_num_threads()} threads"
    )
    print(
        f"median step {step:.3f} s; one check with the step's logits {given:.3f} s ({given / step:.3f} x step), "
        f"re-running the batch {rerun:.3f} s ({rerun / step:.3f} x step); worst logit diff {worst:.2e}"
    )
    print(f"{'every':>6} {'with logits':>12} {'re-run':>8}   per-step time ratio, guard on / off")
    for every in (1, 10, 100, 1000):
        print(f"{every:>6} {1 + given / step / every:>12.4f} {1 + rerun / step / every:>8.4f}")


if __name__ == "__main__":
    main()
