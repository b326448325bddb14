"""Fine-tune a causal LM under ``transformers.Trainer`` with padless packing (offline, CPU, a few steps).

    python examples/trainer.py                          # packed rows, padless attention
    python examples/trainer.py --mode padded            # the same examples padded, for comparison
    torchrun --nproc-per-node 2 examples/trainer.py     # data-parallel: each rank trains its planned rows

The packing is library code: :class:`padless.integrations.transformers.PackedTrainer` replaces
``Trainer`` (planned rows, the collator for the model's attention backend, re-planning every epoch,
the GPT-2 ``loss_type`` fix); docs/integrations/trainer.md explains each piece. This file only loads
data, builds a tiny model and compares packed with padded training.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Any

from transformers import Trainer, TrainingArguments

from padless.attention.backend import register_padless_attention
from padless.batching.collate import FeatureSpec, PaddingCollator
from padless.batching.samplers import world_info
from padless.integrations.transformers import PackedTrainer, count_shifted_labels
from padless.models.factory import build_model


def load_examples(
    corpus: str, limit: int, seed: int, *, max_length: int, train_on: str = "assistant"
) -> list[dict[str, list[int]]]:
    """Up to ``limit`` examples of a built-in corpus, tokenized with the GPT-2 tokenizer (offline);
    examples longer than ``max_length`` are dropped (and counted in the corpus report)."""
    from padless.data.load import load_corpus

    corpus_ = load_corpus(
        corpus, "gpt2", train_on=train_on, limit=limit, seed=seed, max_length=max_length, overlong="drop"
    )
    if world_info()[0] == 0:
        print(f"{corpus}: {corpus_.report}")
    return corpus_.features()


def make_trainer(
    model: Any,
    examples: Sequence[dict[str, Any]],
    *,
    mode: str = "packed",
    output_dir: str,
    max_length: int = 256,
    rows_per_batch: int = 2,
    batch_size: int = 8,
    grad_accum: int = 1,
    steps: int = 5,
    learning_rate: float = 1e-3,
    seed: int = 0,
    pad_token_id: int = 50256,
    callbacks: list[Any] | None = None,
) -> Trainer:
    """A Trainer over ``examples``: ``packed`` rows of ``max_length`` tokens, ``rows_per_batch`` per
    micro-batch, or ``padded`` micro-batches of ``batch_size`` examples. fp32, CPU, no checkpoints;
    ``pad_token_id`` defaults to GPT-2's ``<|endoftext|>`` (padding is never attended to or trained)."""
    args = TrainingArguments(
        output_dir=output_dir,
        max_steps=steps,
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=grad_accum,
        learning_rate=learning_rate,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        dataloader_pin_memory=False,
        disable_tqdm=True,
        seed=seed,
        ddp_find_unused_parameters=False,  # every parameter is used; skips DDP's extra graph traversal
    )
    count_shifted_labels(model)
    if mode == "padded":
        collator = PaddingCollator(pad_token_id=pad_token_id, features=FeatureSpec(vocab_size=model.config.vocab_size))
        return Trainer(
            model=model, args=args, train_dataset=list(examples), data_collator=collator, callbacks=callbacks
        )
    if mode != "packed":
        raise ValueError(f"unknown mode {mode!r}; choose packed or padded")
    return PackedTrainer(
        model=model,
        args=args,
        train_dataset=list(examples),
        max_length=max_length,
        rows_per_batch=rows_per_batch,
        pad_token_id=pad_token_id,
        callbacks=callbacks,
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["packed", "padded"], default="packed")
    p.add_argument("--model", default="gpt2-2layer", help="a padless model name (GPT-2 vocabulary)")
    p.add_argument("--attn", default="padless", help="attention backend: padless | sdpa | eager")
    p.add_argument("--corpus", default="dialogues", help="built-in corpus (tweets, dialogues, toolcalls, agentic-rag)")
    p.add_argument("--train-on", default="assistant", help="all | assistant | completion (chat corpora)")
    p.add_argument("--limit", type=int, default=256, help="examples to load")
    p.add_argument("--max-length", type=int, default=256, help="tokens per packed row")
    p.add_argument("--rows-per-batch", type=int, default=2, help="packed rows per micro-batch")
    p.add_argument("--batch-size", type=int, default=8, help="examples per padded micro-batch")
    p.add_argument("--grad-accum", type=int, default=2)
    p.add_argument("--steps", type=int, default=5, help="optimiser steps")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-dir", default="runs/trainer-example")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.attn == "padless":
        register_padless_attention()
    examples = load_examples(args.corpus, args.limit, args.seed, max_length=args.max_length, train_on=args.train_on)
    model = build_model(args.model, attn_implementation=args.attn, seed=args.seed)
    trainer = make_trainer(
        model,
        examples,
        mode=args.mode,
        output_dir=args.output_dir,
        max_length=args.max_length,
        rows_per_batch=args.rows_per_batch,
        batch_size=args.batch_size,
        grad_accum=args.grad_accum,
        steps=args.steps,
        learning_rate=args.lr,
        seed=args.seed,
    )
    result = trainer.train()
    if trainer.is_world_process_zero():
        for log in trainer.state.log_history:
            if "loss" in log:
                print(f"step {log['step']:>3}  loss {log['loss']:.4f}")
        print(f"{args.mode}: {result.global_step} optimiser steps, mean training loss {result.training_loss:.4f}")
    return 0 if math.isfinite(result.training_loss) else 1


if __name__ == "__main__":
    raise SystemExit(main())
