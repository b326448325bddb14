"""padless packing in your own accelerate training loop: DDP or FSDP2, gradient accumulation, exact loss.

    python examples/accelerate_loop.py --cpu                           # one process
    torchrun --nproc-per-node 2 examples/accelerate_loop.py --cpu      # two ranks (gloo on CPU)
    torchrun --nproc-per-node 2 examples/accelerate_loop.py --fsdp     # FSDP2: parameters sharded over ranks
    accelerate launch examples/accelerate_loop.py                       # whatever `accelerate config` says

Four pieces, each a few lines of :func:`train`:

1. Rows: a :class:`padless.DistributedPackedBatchSampler` plans the same rows on every rank from
   (lengths, seed, epoch) and yields this rank's share; :class:`padless.PackedRowView` turns its keys
   into packed rows. The loader is *not* given to ``accelerator.prepare``: its batches are already
   per rank, and accelerate would deal them out a second time.
2. Attention: :meth:`padless.PackingCollator.for_model` sends what the model's backend needs
   (``cu_seq_lens_q/k`` for ``padless``, a 4D block-causal mask for ``sdpa``/``eager``).
3. Loss: :func:`padless.step_num_items` counts the trained tokens of the whole optimiser step (all
   micro-batches, all-reduced over ranks) *before* the forwards; :func:`padless.model_loss` divides each
   micro-batch's summed cross-entropy by it and multiplies by the world size (DDP averages gradients).
4. Accumulation: gradients stay local on every micro-batch but the last (:func:`padless.models.fsdp.sync_gradients`:
   DDP's ``no_sync``, FSDP2's ``set_requires_gradient_sync``), so they are reduced once per step. The
   ``Accelerator`` keeps ``gradient_accumulation_steps=1``: its ``backward`` divides the loss by that
   number, which would turn the token-normalised loss back into a mean of micro-batch means.

Sharding: with ``--fsdp`` (``train(..., fsdp=True)``) :func:`padless.models.fsdp.shard_model` applies FSDP2's
``fully_shard`` to each decoder layer and the root, and the model is not handed to
``accelerator.prepare`` (which would wrap it in DDP); the loss and the loop stay as they are, since
FSDP2 averages gradients over the ranks as DDP does. Under ``accelerate launch`` with an FSDP2 config
(``fsdp_version: 2``), accelerate shards the model in ``prepare`` instead: its FSDP plugin applies on
GPUs only; on a CPU accelerate ignores it and runs DDP, so use ``--fsdp`` there.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

from padless import (
    DistributedPackedBatchSampler,
    PackedRowView,
    PackingCollator,
    build_model,
    load_corpus,
    model_loss,
    register_padless_attention,
    step_num_items,
)
from padless.batching.batch import batch_to
from padless.models.fsdp import shard_model, sync_gradients


def train(
    model: Any,
    features: Sequence[dict[str, Any]],
    *,
    accelerator: Accelerator,
    max_length: int,
    rows_per_batch: int,
    grad_accum: int,
    steps: int,
    lr: float = 1e-3,
    seed: int = 0,
    pad_token_id: int = 0,
    fsdp: bool = False,
    before_step: Callable[[int, Any, torch.Tensor], None] | None = None,
) -> list[float]:
    """Train ``steps`` optimiser steps of ``grad_accum`` micro-batches of ``rows_per_batch`` packed rows
    per rank; returns each step's loss (per trained token, over all ranks). ``fsdp``: shard the model
    with FSDP2 (:func:`padless.models.fsdp.shard_model`) instead of DDP. ``before_step(step, model, num_items)``
    runs after the gradients of a step are complete, before the optimiser uses them."""
    lengths = [len(f["input_ids"]) for f in features]
    sampler = DistributedPackedBatchSampler(
        lengths,
        max_length,
        rows_per_batch,
        seed=seed,
        num_replicas=accelerator.num_processes,
        rank=accelerator.process_index,
    )
    collator = PackingCollator.for_model(model, max_length=max_length, pad_token_id=pad_token_id)
    loader = DataLoader(PackedRowView(features, pad_token_id=pad_token_id), batch_sampler=sampler, collate_fn=collator)
    if fsdp and not accelerator.is_fsdp2:  # padless shards; accelerate's FSDP2 plugin would in prepare
        model = shard_model(model.to(accelerator.device))
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        model, optimizer = accelerator.prepare(model, optimizer)
    model.train()
    epoch, batches, losses = 0, iter(loader), []
    for step in range(steps):
        micro_batches: list[dict[str, Any]] = []
        while len(micro_batches) < grad_accum:  # the next grad_accum micro-batches, across epochs
            try:
                micro_batches.append(batch_to(next(batches), accelerator.device))
            except StopIteration:
                epoch += 1
                sampler.set_epoch(epoch)  # a new plan: sequences meet other partners
                batches = iter(loader)
        num_items = step_num_items(micro_batches)  # trained tokens of the step, all ranks
        step_loss = torch.zeros((), device=accelerator.device)
        for i, batch in enumerate(micro_batches):
            last = i == len(micro_batches) - 1
            with sync_gradients(model, last):  # DDP's no_sync / FSDP2's set_requires_gradient_sync
                loss = model_loss(model, batch, num_items, world_size=accelerator.num_processes)
                accelerator.backward(loss)
            step_loss += loss.detach()
        if before_step is not None:
            before_step(step, model, num_items)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append((accelerator.reduce(step_loss, "sum") / accelerator.num_processes).item())
    return losses


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gpt2-2layer", help="a padless model name (GPT-2 vocabulary)")
    p.add_argument("--attn", default="padless", help="attention backend: padless | sdpa | eager")
    p.add_argument("--corpus", default="dialogues", help="built-in corpus (tweets, dialogues, toolcalls, agentic-rag)")
    p.add_argument("--limit", type=int, default=64, help="examples to load")
    p.add_argument("--max-length", type=int, default=256, help="tokens per packed row")
    p.add_argument("--rows-per-batch", type=int, default=2, help="packed rows per micro-batch and rank")
    p.add_argument("--grad-accum", type=int, default=2, help="micro-batches per optimiser step")
    p.add_argument("--steps", type=int, default=3, help="optimiser steps")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpu", action="store_true", help="train on the CPU even if a GPU is present")
    p.add_argument("--fsdp", action="store_true", help="shard parameters, gradients and optimiser state with FSDP2")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    accelerator = Accelerator(cpu=args.cpu)
    if args.attn == "padless":
        register_padless_attention()
    corpus = load_corpus(
        args.corpus,
        "gpt2",
        train_on="assistant",
        limit=args.limit,
        seed=args.seed,
        max_length=args.max_length,
        overlong="drop",
    )
    model = build_model(args.model, attn_implementation=args.attn, seed=args.seed)
    losses = train(
        model,
        corpus.features(),
        accelerator=accelerator,
        max_length=args.max_length,
        rows_per_batch=args.rows_per_batch,
        grad_accum=args.grad_accum,
        steps=args.steps,
        lr=args.lr,
        seed=args.seed,
        pad_token_id=50256,
        fsdp=args.fsdp,
    )
    if accelerator.is_main_process:
        for step, loss in enumerate(losses, 1):
            print(f"step {step:>3}  loss {loss:.4f}")
        sharding = " (FSDP2)" if args.fsdp or accelerator.is_fsdp2 else ""
        print(f"accelerate: {len(losses)} optimiser steps on {accelerator.num_processes} process(es){sharding}")
    accelerator.end_training()
    return 0 if all(math.isfinite(x) for x in losses) else 1


if __name__ == "__main__":
    raise SystemExit(main())
