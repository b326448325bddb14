"""Vision-language models train on packed rows through the trainers: ``PackedTrainer`` on a dataset of
processor outputs (images in ``datasets`` columns) takes the same first optimiser step as
transformers' ``Trainer`` on padded batches of the same records (fp32); chat records with images
through padless' ``SFTTrainer``: tests/integrations/test_vlm_sft.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from batching.test_vision import QWEN_DOCS, _qwen2_vl, _qwen_doc  # noqa: E402

pytest.importorskip("accelerate")


def _step(trainer_cls, tmp_path, docs, **kwargs):
    from transformers import TrainingArguments

    model = _qwen2_vl()
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=len(docs), max_steps=1, learning_rate=1.0, optim="sgd",
        report_to=[], use_cpu=True, seed=0, data_seed=0, remove_unused_columns=False, logging_steps=1,
        dataloader_num_workers=0, save_strategy="no",
    )  # fmt: skip
    trainer = trainer_cls(model=model, args=args, train_dataset=docs, **kwargs)
    trainer.train()
    return {n: p.detach().clone() for n, p in model.named_parameters()}, trainer


def test_packed_trainer_step_with_images_equals_the_padded_step(tmp_path):
    """Packed rows of image-text documents (2 rows of 32 tokens, images of 3 sizes) from a
    ``datasets.Dataset`` whose pixel values are list columns: the parameters after one SGD step (lr 1: the update is the gradient) equal
    those of Trainer on the padded batch of the same records, vision tower and merger included."""
    from datasets import Dataset
    from transformers import Trainer

    from padless.batching.collate import PaddingCollator
    from padless.integrations.transformers import PackedTrainer

    docs = [_qwen_doc(g, i) for i, g in enumerate(QWEN_DOCS)]
    keys = ("pixel_values", "image_grid_thw", "mm_token_type_ids")  # a text-only record: None in the image columns
    rows = [{**dict.fromkeys(keys), **{k: v.tolist() if torch.is_tensor(v) else v for k, v in d.items()}} for d in docs]
    records = Dataset.from_list(rows)
    padded, _ = _step(Trainer, tmp_path / "padded", records, data_collator=PaddingCollator())
    packed, trainer = _step(PackedTrainer, tmp_path / "packed", records, max_length=32, rows_per_batch=4)
    assert trainer.data_collator.totals["images"] == 4
    assert "images packed with their documents (qwen2_vl)" in trainer.start_line()
    moved = [n for n in padded if not torch.equal(padded[n], _qwen2_vl().state_dict()[n])]
    assert any(n.startswith("model.visual") for n in moved), "the vision tower must train"
    for name, want in padded.items():
        torch.testing.assert_close(packed[name], want, rtol=1e-5, atol=1e-6, msg=name)


def _records():
    from datasets import Dataset

    docs = [_qwen_doc(g, i) for i, g in enumerate(QWEN_DOCS)]
    keys = ("pixel_values", "image_grid_thw", "mm_token_type_ids")
    rows = [{**dict.fromkeys(keys), **{k: v.tolist() if torch.is_tensor(v) else v for k, v in d.items()}} for d in docs]
    return Dataset.from_list(rows)


def test_rows_packed_beforehand_keep_their_images_through_packed_trainer(tmp_path):
    """pack_dataset's rows (images concatenated in document order) train through PackedTrainer with
    their images: the step equals Trainer's padded step on the unpacked records."""
    from transformers import Trainer

    from padless.batching.collate import PaddingCollator
    from padless.integrations.datasets import pack_dataset
    from padless.integrations.transformers import PackedTrainer

    records = _records()
    padded, _ = _step(Trainer, tmp_path / "padded", records, data_collator=PaddingCollator())
    rows = pack_dataset(records, 32)
    assert rows.num_rows < records.num_rows and "pixel_values" in rows.column_names
    packed, trainer = _step(PackedTrainer, tmp_path / "packed", rows, max_length=32, rows_per_batch=rows.num_rows)
    assert trainer.data_collator.totals["images"] == 4, "every image of the packed rows reached the model"
    for name, want in padded.items():
        torch.testing.assert_close(packed[name], want, rtol=1e-5, atol=1e-6, msg=name)


def test_max_image_patches_bounds_every_planned_row(tmp_path):
    """The trainer's plan takes a second limit: no row holds more vision-encoder patches than
    max_image_patches (the documents hold 0, 16, 28 and 8 patches); the step is still the padded one."""
    from transformers import Trainer

    from padless.batching.collate import PaddingCollator
    from padless.integrations.transformers import PackedTrainer, dataset_image_patches

    records = _records()
    patches = dataset_image_patches(records)
    assert patches.tolist() == [0, 16, 28, 8]
    padded, _ = _step(Trainer, tmp_path / "padded", records, data_collator=PaddingCollator())
    packed, trainer = _step(
        PackedTrainer, tmp_path / "packed", records, max_length=64, rows_per_batch=4, max_image_patches=30
    )
    assert "at most 30 image patches per row" in trainer.start_line()
    rows = [row for step in trainer.batch_sampler for row in step if row]
    assert max(sum(int(patches[i]) for i, _, _ in row) for row in rows) <= 30
    unbounded = PackedTrainer(model=_qwen2_vl(), args=trainer.args, train_dataset=records, max_length=64)
    assert max(sum(int(patches[i]) for i, _, _ in row) for step in unbounded.batch_sampler for row in step if row) > 30
    for name, want in padded.items():
        torch.testing.assert_close(packed[name], want, rtol=1e-5, atol=1e-6, msg=name)
    from padless.integrations.datasets import pack_dataset

    with pytest.raises(ValueError, match="rows packed beforehand .* keep theirs"):
        PackedTrainer(model=_qwen2_vl(), args=trainer.args, train_dataset=pack_dataset(records, 64), max_length=64,
                      max_image_patches=30)  # fmt: skip
