"""Chat records with images train through padless' ``SFTTrainer`` with ``packing=True`` and the
model's processor: every record rendered through the processor (images expanded into their placeholder
tokens, assistant-only labels), packed rows carrying each document's images, the vision tower trained.
The equality of packed and padded steps with images: tests/integrations/test_vlm_trainers.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from integrations_support import offline_qwen2_vl  # noqa: E402


def _model(processor):
    return offline_qwen2_vl(processor)


def test_sft_trainer_packs_chat_records_with_images(tmp_path, caplog):
    from trl import SFTConfig

    from padless.data.images import offline_processor, sample_images
    from padless.integrations.trl import SFTTrainer

    processor = offline_processor()
    pics = sample_images(6, seed=2)
    records = [
        {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"Describe picture {i}."}]},
                      {"role": "assistant", "content": f"Picture {i} shows shapes."}], "images": [pics[i]]}
        for i in range(5)
    ] + [{"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Compare."}]},
                       {"role": "assistant", "content": "They differ."}], "images": [pics[4], pics[5]]}]  # fmt: skip
    model = _model(processor)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = SFTConfig(output_dir=str(tmp_path), packing=True, max_length=128, per_device_train_batch_size=2,
                     max_steps=2, learning_rate=1e-2, use_cpu=True, bf16=False, report_to=[],
                     gradient_checkpointing=False, logging_steps=1, save_strategy="no")  # fmt: skip
    trainer = SFTTrainer(model=model, args=args, train_dataset=records, processing_class=processor)
    assert "images packed with their documents (qwen2_vl)" in trainer.start_line()
    trainer.train()
    assert trainer.data_collator.totals["images"] >= 7
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses and all(torch.isfinite(torch.tensor(losses)))
    moved = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert any(n.startswith("model.visual") for n in moved)


def test_images_without_a_processor_are_named(tmp_path):
    from trl import SFTConfig

    from padless.data.images import offline_processor, sample_images
    from padless.integrations.trl import SFTTrainer

    processor = offline_processor()
    records = [{"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]},
                             {"role": "assistant", "content": "Hello"}], "images": sample_images(1)}]  # fmt: skip
    args = SFTConfig(output_dir=str(tmp_path), packing=True, max_length=64, use_cpu=True, bf16=False, report_to=[])
    with pytest.raises(ValueError, match="pass the model's processor as processing_class"):
        SFTTrainer(model=_model(processor), args=args, train_dataset=records, processing_class=processor.tokenizer)


def test_lora_on_the_language_model_with_images(tmp_path):
    """LoRA on the language model's attention (peft): the rule answers from the model the adapter
    wraps, the packed rows carry the images, only the adapter trains."""
    pytest.importorskip("peft")
    from peft import LoraConfig
    from trl import SFTConfig

    from padless.data.images import offline_processor, sample_images
    from padless.integrations.trl import SFTTrainer

    processor = offline_processor()
    pics = sample_images(4, seed=4)
    records = [
        {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"What is {i}?"}]},
                      {"role": "assistant", "content": f"It is {i}."}], "images": [pics[i]]}
        for i in range(4)
    ]  # fmt: skip
    args = SFTConfig(output_dir=str(tmp_path), packing=True, max_length=96, per_device_train_batch_size=2,
                     max_steps=2, learning_rate=1e-2, use_cpu=True, bf16=False, report_to=[],
                     gradient_checkpointing=False, save_strategy="no")  # fmt: skip
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=r".*language_model.*\.(q_proj|v_proj)", task_type="CAUSAL_LM")
    trainer = SFTTrainer(model=_model(processor), args=args, train_dataset=records, processing_class=processor,
                         peft_config=lora)  # fmt: skip
    assert "images packed with their documents (qwen2_vl)" in trainer.start_line()
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.data_collator.totals["images"] >= 4
    moved = [n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert moved and all("lora_" in n for n in moved)
