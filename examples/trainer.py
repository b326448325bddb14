"""Fine-tune a causal LM under ``transformers.Trainer`` with padless packing (offline, CPU, a few steps).

    python examples/trainer.py                          # packed rows, padless attention
    python examples/trainer.py --mode padded            # the same examples padded, for comparison
    torchrun --nproc-per-node 2 examples/trainer.py     # data-parallel: each rank trains its planned rows

Three things connect padless to Trainer (transformers 5.24, read from its sources):

1. Rows. Trainer builds its DataLoader from a *sampler* and ``per_device_train_batch_size``; the only
   batch sampler it accepts is its own ``BatchRebalanceSampler``. :class:`PackedTrainer` therefore
   overrides ``get_train_dataloader`` (the hook Trainer documents for custom loading) and returns
   ``DataLoader(PackedRowView(train_dataset), batch_sampler=DistributedPackedBatchSampler(...),
   collate_fn=PackingCollator.for_model(model))``. The loader is not passed through accelerate's
   ``prepare``, which would deal the already rank-aware batches out across processes a second time,
   and it bypasses Trainer's column removal, which would strip ``seq_lengths`` (not a ``forward()``
   argument) and let the collator re-plan the rows. Trainer calls ``set_epoch`` on the loader each
   epoch; the loader passes it to the sampler, which re-plans.
2. Attention. ``register_padless_attention()`` then ``attn_implementation="padless"``;
   ``PackingCollator.for_model`` sends what the backend needs (``cu_seq_lens_q/k`` for padless, a 4D
   block-causal mask for sdpa/eager).
3. Loss. Trainer sums the trained tokens over the micro-batches of an optimiser step
   (``num_items_in_batch``), gathers the sum over ranks (``average_tokens_across_devices``, on by
   default) and multiplies each rank's loss by the world size: padless' ``step_num_items`` and
   ``causal_lm_loss(world_size=W)``. It counts the shifted labels ``labels[..., 1:]`` only when the
   model's ``loss_type`` maps to ``ForCausalLMLoss``; ``GPT2LMHeadModel`` has ``loss_type=None``, so
   Trainer also counts ``labels[..., 0]``: one token too many per padded sequence whose first token is
   trained, while packed rows already mask each document's first label, and the two losses differ.
   :func:`count_shifted_labels` sets ``loss_type="ForCausalLM"``, the loss GPT-2 falls back to anyway.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Any

from torch.utils.data import DataLoader
from transformers import Trainer, TrainingArguments

from padless.attention.backend import register_padless_attention
from padless.batching.collate import FeatureSpec, PackingCollator, PaddingCollator
from padless.batching.samplers import DistributedPackedBatchSampler, world_info
from padless.batching.rows import PackedRowView
from padless.models import build_model


class EpochDataLoader(DataLoader):
    """A DataLoader that passes ``set_epoch`` (called by Trainer every epoch) to its batch sampler."""

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)


class PackedTrainer(Trainer):
    """``Trainer`` whose training batches are the packed rows of ``batch_sampler`` on this rank."""

    def __init__(self, *args: Any, batch_sampler: DistributedPackedBatchSampler, pad_token_id: int = 0,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batch_sampler = batch_sampler
        self.pad_token_id = pad_token_id

    def get_train_dataloader(self) -> DataLoader:
        return EpochDataLoader(
            PackedRowView(self.train_dataset, pad_token_id=self.pad_token_id),
            batch_sampler=self.batch_sampler,
            collate_fn=self.data_collator,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
        )


def count_shifted_labels(model: Any) -> Any:
    """Make Trainer count ``labels[..., 1:] != -100`` for a decoder-only causal LM whose class name
    transformers does not map to a loss (e.g. ``GPT2LMHeadModel``); the model's loss is unchanged."""
    from transformers.loss.loss_utils import LOSS_MAPPING, ForCausalLMLoss

    before = getattr(model, "loss_type", None)
    if before not in LOSS_MAPPING and not model.config.is_encoder_decoder:
        model.loss_type = "ForCausalLM"
        if model.loss_function is not ForCausalLMLoss:  # a custom loss function was set on the model
            model.loss_type = before
            raise ValueError(f"{type(model).__name__} does not use ForCausalLMLoss; set its loss_type yourself")
    return model


def load_examples(
    corpus: str, limit: int, seed: int, *, max_length: int, train_on: str = "assistant"
) -> list[dict[str, list[int]]]:
    """Up to ``limit`` examples of a built-in corpus, tokenized with the GPT-2 tokenizer (offline);
    examples longer than ``max_length`` are dropped (and counted in the corpus report)."""
    from padless.data.load import load_corpus

    corpus_ = load_corpus(corpus, "gpt2", train_on=train_on, limit=limit, seed=seed, max_length=max_length,
                          overlong="drop")
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
        output_dir=output_dir, max_steps=steps, per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=grad_accum, learning_rate=learning_rate, logging_steps=1, report_to="none",
        save_strategy="no", use_cpu=True, dataloader_pin_memory=False, disable_tqdm=True, seed=seed,
        ddp_find_unused_parameters=False,  # every parameter is used; skips DDP's extra graph traversal
    )  # fmt: skip
    count_shifted_labels(model)
    if mode == "padded":
        collator = PaddingCollator(pad_token_id=pad_token_id, features=FeatureSpec(vocab_size=model.config.vocab_size))
        return Trainer(model=model, args=args, train_dataset=list(examples), data_collator=collator,
                       callbacks=callbacks)
    if mode != "packed":
        raise ValueError(f"unknown mode {mode!r}; choose packed or padded")
    lengths = [len(e["input_ids"]) for e in examples]
    sampler = DistributedPackedBatchSampler(lengths, max_length, rows_per_batch, seed=seed)
    collator = PackingCollator.for_model(model, max_length=max_length, pad_token_id=pad_token_id)
    return PackedTrainer(model=model, args=args, train_dataset=list(examples), data_collator=collator,
                         batch_sampler=sampler, pad_token_id=pad_token_id, callbacks=callbacks)


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
        model, examples, mode=args.mode, output_dir=args.output_dir, max_length=args.max_length,
        rows_per_batch=args.rows_per_batch, batch_size=args.batch_size, grad_accum=args.grad_accum,
        steps=args.steps, learning_rate=args.lr, seed=args.seed,
    )  # fmt: skip
    result = trainer.train()
    if trainer.is_world_process_zero():
        for log in trainer.state.log_history:
            if "loss" in log:
                print(f"step {log['step']:>3}  loss {log['loss']:.4f}")
        print(f"{args.mode}: {result.global_step} optimiser steps, mean training loss {result.training_loss:.4f}")
    return 0 if math.isfinite(result.training_loss) else 1


if __name__ == "__main__":
    raise SystemExit(main())
