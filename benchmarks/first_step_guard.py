"""What the trainers' default first-step isolation guard costs, measured in one PackedTrainer run.

Trains ``--steps`` optimiser steps of SmolLM2-135M (``padless.build_model("smollm2-135m")``) on packed
rows of ``--max-length`` tokens with the default guard (``guard=True``: the first packed forward,
:mod:`padless.integrations.first_step`), and prints the trainer's own lines: the start line, and the
guard's line after step 1, which gives the guard's time against the step's, measured side by side in
that step (the guard's time over the rest of the step)::

    PYTHONPATH=src .venv/bin/python benchmarks/first_step_guard.py                  # 1 row of 2048, sdpa
    PYTHONPATH=src .venv/bin/python benchmarks/first_step_guard.py --rows 4 --backend padless
    PYTHONPATH=src .venv/bin/python benchmarks/first_step_guard.py --trainer sft     # re-runs its batch
"""

from __future__ import annotations

import argparse
import logging
import tempfile

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--backend", default="sdpa")
    ap.add_argument("--rows", type=int, default=1, help="rows per micro-batch")
    ap.add_argument("--max-length", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--trainer", choices=("packed", "sft"), default="packed", help="PackedTrainer or padless' SFTTrainer"
    )
    args = ap.parse_args()

    from transformers import TrainingArguments

    from padless.attention.backend import register_padless_attention
    from padless.integrations.transformers import PackedTrainer
    from padless.models.factory import build_model

    if args.backend == "padless":
        register_padless_attention()
    model = build_model(args.model, attn_implementation=args.backend)
    rng = np.random.default_rng(args.seed)
    vocab = model.config.vocab_size
    total = 4 * args.rows * args.steps * args.max_length
    docs, used = [], 0
    while used < total:  # documents of 64..1024 tokens, 4x the steps' rows: the plan fills the rows
        n = int(rng.integers(64, min(1024, args.max_length) + 1))
        docs.append({"input_ids": rng.integers(0, vocab, n).tolist()})
        used += n
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("padless").setLevel(logging.INFO)
    with tempfile.TemporaryDirectory() as out:
        if args.trainer == "sft":  # TRL's fused LM head builds no logits: the guard re-runs its batch
            import datasets
            import trl

            from padless.integrations.trl import SFTTrainer

            config = trl.SFTConfig(
                output_dir=out,
                use_cpu=True,
                report_to="none",
                max_steps=args.steps,
                bf16=False,
                per_device_train_batch_size=args.rows,
                save_strategy="no",
                disable_tqdm=True,
                seed=args.seed,
                packing=True,
                max_length=args.max_length,
            )
            data = datasets.Dataset.from_list(docs)
            SFTTrainer(model=model, args=config, train_dataset=data, processing_class=_tokenizer()).train()
            return
        targs = TrainingArguments(
            output_dir=out,
            use_cpu=True,
            report_to="none",
            max_steps=args.steps,
            per_device_train_batch_size=args.rows,
            save_strategy="no",
            disable_tqdm=True,
            seed=args.seed,
        )
        PackedTrainer(model=model, args=targs, train_dataset=docs, max_length=args.max_length).train()


def _tokenizer():
    from padless.models.factory import load_tokenizer_for

    return load_tokenizer_for("smollm2-135m")


if __name__ == "__main__":
    main()
