"""FSDP2 on packed rows, on whatever the machine has: the check and a short timed run, under torchrun.

1. Exactness (fp32): the model sharded with :func:`padless.models.fsdp.shard_model`, one optimiser step of
   :class:`padless.DistributedPackedBatchSampler`'s rows (``--accum`` micro-batches per rank, gradients
   kept local until the last) with the token-normalised loss; its gathered gradients against one
   unsharded replica on rank 0 over every rank's rows in one batch. Prints the largest difference over
   the largest gradient; exits 1 above ``--tolerance``.
2. Training (``--dtype``; bfloat16 on a GPU: FSDP2 mixed precision, bf16 compute and fp32 reduction
   over fp32 shards): ``--steps`` optimiser steps, the median step time and real tokens/s over all ranks.

    torchrun --nproc-per-node 2 benchmarks/fsdp.py --device cpu             # gloo, 2 CPU processes
    torchrun --nproc-per-node "$(nvidia-smi -L | wc -l)" benchmarks/fsdp.py  # NCCL, one GPU per rank

With one process the check is FSDP2 over a mesh of one (NCCL and the sharded code path still run).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

import padless
from padless.batching.batch import batch_to
from padless.devices import is_half_precision, resolve_dtype
from padless.models.fsdp import full_tensors, init_distributed, shard_model, sync_gradients
from padless.objectives.loss import trained_tokens
from padless.planning.lengths import synthetic_lengths
from padless.planning.schedule import schedule_epoch


def features(n: int, vocab: int, max_length: int, seed: int) -> list[dict[str, list[int]]]:
    """``n`` random documents of lognormal lengths (at most ``max_length``), first quarter untrained."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(synthetic_lengths("lognormal", n, seed=seed), 2, max_length)
    out = []
    for length in lengths.tolist():
        ids = rng.integers(0, vocab, length).tolist()
        out.append({"input_ids": ids, "labels": [-100] * (length // 4) + ids[length // 4 :]})
    return out


def check(args: argparse.Namespace, device: torch.device, feats: list[dict[str, list[int]]]) -> float:
    """Largest |sharded - one process| gradient difference over the largest gradient (fp32)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    lengths = [len(f["input_ids"]) for f in feats]
    model = padless.build_model(args.model, attn_implementation=args.attn, seed=0).to(device)
    reference = copy.deepcopy(model) if rank == 0 else None
    collator = padless.PackingCollator.for_model(model, max_length=args.max_length)
    shard_model(model)
    sampler = padless.DistributedPackedBatchSampler(lengths, args.max_length, args.rows, seed=0)
    micro = [
        batch_to(b, device)
        for b, _ in zip(
            DataLoader(padless.PackedRowView(feats), batch_sampler=sampler, collate_fn=collator), range(args.accum)
        )
    ]
    num_items = padless.step_num_items(micro)
    for i, batch in enumerate(micro):
        with sync_gradients(model, i == len(micro) - 1):
            padless.model_loss(model, batch, num_items, world_size=world).backward()
    grads = full_tensors(model, grads=True)
    gap = torch.zeros((), dtype=torch.float64)
    if rank == 0:
        sched = schedule_epoch(lengths, args.max_length, world_size=world, rows_per_batch=args.rows, seed=0)
        view = padless.PackedRowView(feats)
        rows = [view[key] for r in range(world) for step in sched.rank_batches(r)[: args.accum] for key in step]
        batch = batch_to(collator(rows), device)
        total = trained_tokens(batch["labels"])
        assert int(total) == int(num_items), (int(total), int(num_items))
        padless.model_loss(reference, batch, total).backward()
        want = full_tensors(reference, grads=True)
        scale = max(g.abs().max().item() for g in want.values())
        gap.fill_(max((grads[n] - g).abs().max().item() for n, g in want.items()) / scale)
    dist.broadcast(gap, 0)
    return gap.item()


def train(args: argparse.Namespace, device: torch.device, feats: list[dict[str, list[int]]]) -> tuple[float, float]:
    """(median step seconds, real tokens/s over all ranks) of ``--steps`` steps after one warm-up."""
    world = dist.get_world_size()
    lengths = [len(f["input_ids"]) for f in feats]
    dtype = resolve_dtype(args.dtype, device)
    model = padless.build_model(args.model, attn_implementation=args.attn, seed=0).to(device)
    collator = padless.PackingCollator.for_model(model, max_length=args.max_length)
    half = is_half_precision(dtype)
    shard_model(model, param_dtype=dtype if half else None, reduce_dtype=torch.float32 if half else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sampler = padless.DistributedPackedBatchSampler(lengths, args.max_length, args.rows, seed=1)
    batches = iter(DataLoader(padless.PackedRowView(feats), batch_sampler=sampler, collate_fn=collator))
    times, tokens = [], []
    for step in range(args.steps + 1):
        micro = [batch_to(next(batches), device) for _ in range(args.accum)]
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        sync()
        start = time.perf_counter()
        num_items = padless.step_num_items(micro)
        for i, batch in enumerate(micro):
            with sync_gradients(model, i == len(micro) - 1):
                padless.model_loss(model, batch, num_items, world_size=world).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        if step:  # the first step allocates and warms the kernels
            times.append(time.perf_counter() - start)
            tokens.append(sum(int(b.placements.length.sum()) for b in micro))  # the documents' tokens, no padding
    real = torch.tensor(sum(tokens), dtype=torch.float64)
    dist.all_reduce(real)
    seconds = torch.tensor(sum(times), dtype=torch.float64)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    return statistics.median(times), real.item() / seconds.item()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2-2layer")
    ap.add_argument("--attn", default="padless", help="padless | sdpa | eager | flash_attention_2")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto", help="training dtype (auto: bfloat16 on a GPU, float32 on a CPU)")
    ap.add_argument("--max-length", type=int, default=1024)
    ap.add_argument("--rows", type=int, default=2, help="packed rows per micro-batch and rank")
    ap.add_argument("--accum", type=int, default=2, help="micro-batches per optimiser step")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--documents", type=int, default=2000)
    ap.add_argument("--tolerance", type=float, default=1e-4, help="of the largest gradient")
    args = ap.parse_args()

    device = init_distributed(args.device)
    if not dist.is_initialized():
        raise SystemExit("run under torchrun: torchrun --nproc-per-node N benchmarks/fsdp.py")
    torch.manual_seed(0)
    padless.register_padless_attention()
    feats = features(args.documents, padless.build_model(args.model, seed=0).config.vocab_size, args.max_length, 0)
    gap = check(args, device, feats)
    step_s, tok_s = train(args, device, feats)
    if dist.get_rank() == 0:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        print(f"fsdp: {dist.get_world_size()} rank(s) on {name} ({dist.get_backend()}), {args.model}, {args.attn}")
        print(
            f"fsdp exactness (fp32): max |grad - one process| / max |grad| = {gap:.2e} (tolerance {args.tolerance:g})"
        )
        print(f"fsdp training ({args.dtype}): median step {step_s:.3f} s, {tok_s:,.0f} real tokens/s over all ranks")
    dist.destroy_process_group()
    return 0 if gap <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
