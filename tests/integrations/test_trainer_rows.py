"""The rows a trainer trains (padless.integrations.trainer_rows): the start line says how full the planned
rows are and what the plan truncated, split or dropped, for planned rows and rows packed beforehand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("accelerate")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import integrations_support as support  # noqa: E402


def test_the_start_line_counts_the_documents_of_rows_packed_beforehand(tmp_path):
    from transformers import TrainingArguments

    from padless.integrations.transformers import PackedTrainer

    prepacked = [{"input_ids": list(range(1, 20)), "seq_lengths": [10, 9]},
                 {"input_ids": list(range(1, 12)), "seq_lengths": [4, 4, 3]}]  # fmt: skip
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", max_steps=1)
    trainer = PackedTrainer(model=support.model("sdpa", "tiny-gpt2"), args=args, train_dataset=prepacked, max_length=32)
    assert trainer.start_line().endswith(
        ", 32-token rows, 2.5 documents per row (planned rows), rows 46.9% full, isolation guard on step 1"
    )  # 30 tokens in 2 rows of 32


def test_the_start_line_says_what_the_plan_truncated_split_or_dropped(tmp_path):
    from transformers import TrainingArguments

    from padless.integrations.transformers import PackedTrainer

    for overlong, said in [
        ("truncate", "; 2 of 8 sequences truncated to 12 tokens (8 tokens cut)"),
        ("split", "; 2 of 8 sequences split across rows (each piece trains as a document)"),
        ("drop", "; 2 of 8 sequences dropped (32 tokens)"),
    ]:
        trainer = PackedTrainer(
            model=support.model("sdpa", "tiny-llama"),
            args=TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none"),
            max_length=12,
            train_dataset=[{"input_ids": list(range(1, n + 1))} for n in (19, 8, 11, 5, 7, 13, 6, 9)],
            overlong=overlong,
        )
        line = trainer.start_line()
        assert line.endswith(f", isolation guard on step 1{said}"), line  # said last, after the guard


def test_sft_trainer_says_what_overlong_truncate_cut(tmp_path):
    """SFTTrainer(overlong="truncate") used to cut sequences and say nothing: the start line counts them."""
    trl = pytest.importorskip("trl")
    from test_trl_grpo import tiny_llama, tiny_tokenizer

    from padless.integrations.trl import SFTTrainer

    support.offline_hub()
    config = trl.SFTConfig(
        output_dir=str(tmp_path), packing=True, max_length=8, use_cpu=True, bf16=False, report_to="none"
    )
    data = support.dataset([{"input_ids": list(range(2, 2 + n))} for n in (12, 5, 9, 3)])
    trainer = SFTTrainer(
        model=tiny_llama(len(tiny_tokenizer())),
        args=config,
        train_dataset=data,
        processing_class=tiny_tokenizer(),
        overlong="truncate",
    )
    line = trainer.start_line()
    assert line.endswith(", isolation guard on step 1; 2 of 4 sequences truncated to 8 tokens (5 tokens cut)"), line
