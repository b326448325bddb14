"""Chat records with images train through padless' ``SFTTrainer`` with ``packing=True`` and the
model's processor: every record rendered through the processor (images expanded into their placeholder
tokens, assistant-only labels), packed rows carrying each document's images, the vision tower trained.
The equality of packed and padded steps with images: tests/integrations/test_vlm_trainers.py."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl")


def _model(processor):
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    tok = processor.tokenizer
    ids = dict(zip(("start", "end", "image", "video"), tok.convert_tokens_to_ids(
        ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"])))  # fmt: skip
    text = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=1024,
                rope_parameters={"rope_type": "default", "mrope_section": [2, 1, 1], "rope_theta": 10000.0})  # fmt: skip
    vision = dict(depth=1, embed_dim=32, hidden_size=32, num_heads=2, mlp_ratio=2, patch_size=14, spatial_merge_size=2,
                  temporal_patch_size=2, in_chans=3)  # fmt: skip
    config = Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=ids["image"],
                           vision_start_token_id=ids["start"], vision_end_token_id=ids["end"],
                           video_token_id=ids["video"], eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)  # fmt: skip
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return Qwen2VLForConditionalGeneration(config)


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
