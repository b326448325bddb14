"""Shared by tests/integrations/test_*.py: the tiny model and data, one optimiser step under Trainer /
SFTTrainer / an accelerate loop with its loss and gradients (the torchrun worker that runs those steps
on every rank is tests/integrations/test_fsdp.py's ``main``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

TINY_MODEL = "gpt2-2layer"
"""The one model name these tests use: GPT-2's real vocabulary (so tokenizer ids and pad id fit) at a
tiny size. A GPT-2 also exercises Trainer's loss_type counting quirk."""

GUARD_LINE = (
    r"padless: isolation guard, step 1: \d+ documents? \(\d+ tokens\) run alone match their packed rows \(max "
    r"\|diff\| \S+, padding's noise \S+, limit \S+, float32\); the guard took [\d.]+ m?s, [\d.]+% of the step "
    r"\([\d.]+ m?s without it\)"
)
"""The line every padless trainer logs after its first step (padless.integrations.first_step), as a regex."""

CORPUS, NUM_EXAMPLES, MAX_LENGTH = "dialogues", 8, 160


def offline_hub() -> None:
    """No telemetry or hub calls from TRL / transformers (TRL's trainers send a telemetry ping)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    import huggingface_hub.constants as hub

    hub.HF_HUB_DISABLE_TELEMETRY = True


def examples(limit: int = NUM_EXAMPLES) -> list[dict[str, list[int]]]:
    """``limit`` dialogues tokenized with GPT-2's tokenizer, every token trained (so each first label
    is a target, where Trainer's count for GPT-2 goes wrong without the loss_type fix)."""
    from padless import load_corpus

    return load_corpus(
        CORPUS, "gpt2", train_on="all", limit=limit, seed=0, max_length=MAX_LENGTH, overlong="drop"
    ).features()


def dataset(features: list[dict[str, Any]]) -> Any:
    from datasets import Dataset

    return Dataset.from_dict({k: [f[k] for f in features] for k in features[0]})


def tokenizer() -> Any:
    from padless import load_tokenizer

    return load_tokenizer("gpt2")


def model(attn: str = "sdpa", name: str = TINY_MODEL) -> Any:
    from padless import build_model, register_padless_attention

    if attn == "padless":
        register_padless_attention()
    return build_model(name, attn_implementation=attn, seed=0)


def num_rows(features: list[dict[str, Any]], max_length: int = MAX_LENGTH) -> int:
    """Packed rows of the (epoch 0, seed 0) plan of ``features``."""
    from padless.planning.schedule import schedule_epoch

    lengths = [len(f["input_ids"]) for f in features]
    return schedule_epoch(lengths, max_length, world_size=1, rows_per_batch=1).plan.num_rows


def add_2d_masks(trainer: Any) -> None:
    """Give each of ``trainer``'s own training batches an all-ones 2D ``attention_mask`` on its way to the
    step (what many pipelines add), by wrapping its train loader."""
    loader = trainer.get_train_dataloader

    class WithMask:
        def __iter__(self):
            for batch in loader():
                yield {**batch, "attention_mask": batch["input_ids"].new_ones(batch["input_ids"].shape)}

    trainer.get_train_dataloader = WithMask


def grads(model: Any) -> dict[str, Any]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def first_step(
    kind: str,
    attn: str,
    out_dir: str,
    *,
    rows_per_batch: int = 1,
    batch_size: int = NUM_EXAMPLES,
    grad_accum: int = 1,
    features: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Loss (summed over this rank's micro-batches), gradients and ``num_items_in_batch`` of the first
    optimiser step. ``kind``: ``trainer-padded``, ``trainer-packed``, ``trainer-fsdp`` (PackedTrainer on a
    model sharded by :func:`padless.models.fsdp.shard_model`), ``trainer-fsdp-plugin`` (sharded by accelerate's FSDP2
    plugin, :func:`force_accelerate_fsdp2`: last in a process), ``sft-padded``, ``sft-packed``,
    ``sft-padding-free`` or ``trl-padded`` (TRL's own SFTTrainer, no fix)."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from padless.batching.collate import FeatureSpec, PaddingCollator
    from padless.integrations.transformers import PackedTrainer, count_shifted_labels

    class Capture(TrainerCallback):
        grads, sharded = None, None

        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            if self.grads is None:
                from padless.models.fsdp import full_tensors, is_sharded

                self.grads = full_tensors(model, grads=True)  # gathered from the shards under FSDP
                self.sharded = is_sharded(model)

    features = features if features is not None else examples()
    net, capture = model(attn), Capture()
    common = dict(
        output_dir=out_dir,
        max_steps=1,
        per_device_train_batch_size=batch_size,
        learning_rate=1e-3,
        gradient_accumulation_steps=grad_accum,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        dataloader_pin_memory=False,
        disable_tqdm=True,
        seed=0,
        max_grad_norm=0.0,
        logging_steps=1,
        ddp_find_unused_parameters=False,
    )
    if kind.startswith("trainer"):
        args = TrainingArguments(**common)
        if kind == "trainer-padded":
            count_shifted_labels(net)
            collator = PaddingCollator(pad_token_id=50256, features=FeatureSpec(vocab_size=net.config.vocab_size))
            trainer = Trainer(model=net, args=args, train_dataset=features, data_collator=collator, callbacks=[capture])
        else:
            common["per_device_train_batch_size"] = rows_per_batch
            if kind == "trainer-fsdp":  # sharded by padless before Trainer gets it
                from padless.models.fsdp import shard_model

                shard_model(net)
            elif kind == "trainer-fsdp-plugin":  # sharded by accelerate's FSDP2 plugin in prepare
                common.update(fsdp=True, fsdp_config={"version": 2, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP"})
            args = TrainingArguments(**common)
            trainer = PackedTrainer(
                model=net, args=args, train_dataset=features, max_length=MAX_LENGTH, callbacks=[capture]
            )
            if kind == "trainer-fsdp-plugin":
                from accelerate.utils import FullyShardedDataParallelPlugin

                force_accelerate_fsdp2(trainer.accelerator, FullyShardedDataParallelPlugin(**args.fsdp_plugin_args))
                trainer.is_fsdp_enabled = True
    else:
        offline_hub()
        import trl
        from trl import SFTConfig

        from padless.integrations.trl import SFTTrainer

        packing, padding_free = kind == "sft-packed", kind == "sft-padding-free"
        if packing:
            common["per_device_train_batch_size"] = rows_per_batch
        # bf16=False: SFTConfig turns bf16 autocast on by default (on a CPU too); these are fp32 comparisons
        args = SFTConfig(
            **common,
            packing=packing,
            padding_free=padding_free,
            bf16=False,
            max_length=None if padding_free else MAX_LENGTH,
        )
        cls = trl.SFTTrainer if kind == "trl-padded" else SFTTrainer
        trainer = cls(
            model=net, args=args, train_dataset=dataset(features), processing_class=tokenizer(), callbacks=[capture]
        )
    losses, counts = [], []
    training_step = trainer.training_step

    def record(model, inputs, num_items_in_batch=None):
        counts.append(int(num_items_in_batch))
        loss = training_step(model, inputs, num_items_in_batch)
        losses.append(loss.item())
        return loss

    trainer.training_step = record
    trainer.train()
    return {
        "loss": sum(losses),
        "grads": capture.grads,
        "num_items": counts[0],
        "micro_batches": len(losses),
        "rank": trainer.args.process_index,
        "world": trainer.args.world_size,
        "sharded": capture.sharded,
    }


def _load_example(name: str) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"padless_example_{name}", ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def force_accelerate_fsdp2(accelerator: Any, plugin: Any) -> Any:
    """Switch ``accelerator`` to FSDP with ``plugin`` (FSDP2) on a CPU and return it. accelerate applies
    its FSDP plugin on GPUs only: on a CPU its state stays ``MULTI_CPU`` and ``prepare`` wraps the model
    in DDP. Switched, accelerate's own FSDP2 preparation runs over gloo, as it would over NCCL. The
    state is shared by every ``Accelerator`` of the process: do this last in a process."""
    from accelerate.utils import DistributedType

    accelerator.state.distributed_type, accelerator.state.fsdp_plugin = DistributedType.FSDP, plugin
    assert accelerator.is_fsdp2
    return accelerator


def accelerate_first_step(
    attn: str, *, rows_per_batch: int, grad_accum: int, fsdp: bool = False, plugin: bool = False
) -> dict[str, Any]:
    """The first step of examples/accelerate_loop.py's ``train``: its loss and (whole) gradients on this
    rank; ``fsdp``: the model sharded with FSDP2 by padless; ``plugin``: by accelerate's FSDP2 plugin
    (:func:`force_accelerate_fsdp2`: call it last in a process)."""
    from accelerate import Accelerator, FullyShardedDataParallelPlugin

    from padless.models.fsdp import full_tensors, is_sharded

    loop = _load_example("accelerate_loop")
    if plugin:
        fsdp_plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap")
        accelerator = force_accelerate_fsdp2(Accelerator(cpu=True, fsdp_plugin=fsdp_plugin), fsdp_plugin)
    else:
        accelerator = Accelerator(cpu=True)
    net, seen = model(attn), {}

    def before_step(step, wrapped, num_items):
        if step == 0:  # full_tensors gathers the shards (every rank calls it)
            seen.update(grads=full_tensors(wrapped, grads=True), num_items=int(num_items), sharded=is_sharded(wrapped))

    losses = loop.train(
        net,
        examples(),
        accelerator=accelerator,
        max_length=MAX_LENGTH,
        rows_per_batch=rows_per_batch,
        grad_accum=grad_accum,
        steps=1,
        pad_token_id=50256,
        fsdp=fsdp,
        before_step=before_step,
    )
    return {"loss": losses[0], **seen, "rank": accelerator.process_index, "world": accelerator.num_processes}


def padded_accelerate_step(*, world_size: int = 2, micro_batches: int = 2) -> dict[str, Any]:
    """What :func:`accelerate_first_step` (1 row per micro-batch) must equal: one process padding
    exactly the examples of the step's rows (``micro_batches`` x ``world_size``) into one batch."""
    from padless.batching.collate import PaddingCollator
    from padless.objectives.loss import model_loss, trained_tokens
    from padless.planning.schedule import schedule_epoch

    feats = examples()
    sched = schedule_epoch([len(f["input_ids"]) for f in feats], MAX_LENGTH, world_size=world_size, rows_per_batch=1)
    rows = [row for step in sched.batches[:micro_batches] for rank_rows in step for row in rank_rows if row >= 0]
    chosen = sorted(i for row in rows for i in sched.plan.row(row)[0].tolist())
    net = model("sdpa")
    batch = PaddingCollator(pad_token_id=50256)([feats[i] for i in chosen])
    total = trained_tokens(batch["labels"])
    loss = model_loss(net, batch, total)
    loss.backward()
    return {
        "loss": loss.item(),
        "grads": grads(net),
        "num_items": int(total),
        "examples": len(chosen),
        "all_rows": len(rows) == sched.plan.num_rows,
        "of": len(feats),
    }


def offline_qwen2_vl(processor: Any, *, bos: bool = False) -> Any:
    """A tiny random Qwen2-VL whose vocabulary and vision tokens are those of ``processor`` (the offline
    one: :func:`padless.data.images.offline_processor`), sdpa, seeded. ``bos``: the text config names the
    tokenizer's BOS/EOS too (no warning of out-of-vocabulary Qwen ids)."""
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    tok = processor.tokenizer
    ids = dict(zip(("start", "end", "image", "video"), tok.convert_tokens_to_ids(
        ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"])))  # fmt: skip
    text = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=1024,
                rope_parameters={"rope_type": "default", "mrope_section": [2, 1, 1], "rope_theta": 10000.0})  # fmt: skip
    if bos:
        text.update(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    vision = dict(depth=1, embed_dim=32, hidden_size=32, num_heads=2, mlp_ratio=2, patch_size=14, spatial_merge_size=2,
                  temporal_patch_size=2, in_chans=3)  # fmt: skip
    config = Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=ids["image"],
                           vision_start_token_id=ids["start"], vision_end_token_id=ids["end"],
                           video_token_id=ids["video"], eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)  # fmt: skip
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return Qwen2VLForConditionalGeneration(config)
