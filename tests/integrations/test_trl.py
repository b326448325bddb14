"""padless inside TRL's SFTTrainer (padless.integrations.trl), and padless' rows under TRL's own trainer.

Every run is one optimiser step on the same 8 dialogues (GPT-2 tokenizer, every token trained), fp32:
the padded step under Trainer with the GPT-2 count fix is the reference."""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_transformers import assert_same_step  # noqa: E402

import integrations_support as support  # noqa: E402

pytest.importorskip("trl")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")


@pytest.fixture(autouse=True, scope="module")
def _offline():
    support.offline_hub()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return support.first_step("sft-padded", "sdpa", str(tmp_path_factory.mktemp("padded")))


def test_padded_sft_step_equals_padded_trainer_step(reference, tmp_path):
    trainer = support.first_step("trainer-padded", "sdpa", str(tmp_path))
    # TRL's fused LM head computes the same cross-entropy in chunks: equal to fp32 rounding
    assert_same_step(reference, trainer)


@pytest.mark.parametrize(("kind", "attn"), [("sft-packed", "sdpa"), ("sft-packed", "padless"),
                                            ("sft-padding-free", "padless")])  # fmt: skip
def test_padless_packing_in_sft_trainer_equals_padding(reference, tmp_path, kind, attn):
    rows = support.num_rows(support.examples())
    got = support.first_step(kind, attn, str(tmp_path), rows_per_batch=-(-rows // 2), batch_size=4, grad_accum=2)
    assert got["micro_batches"] == 2
    assert_same_step(got, reference)


def test_trl_alone_counts_gpt2_first_labels(reference, tmp_path):
    """TRL 1.16's own SFTTrainer on GPT-2 (loss_type None): Trainer counts labels[..., 0] too, so the padded
    loss is divided by one token too many per example."""
    import math

    got = support.first_step("trl-padded", "sdpa", str(tmp_path))
    assert got["num_items"] == reference["num_items"] + support.NUM_EXAMPLES
    assert math.isclose(got["loss"] * got["num_items"], reference["loss"] * reference["num_items"], rel_tol=1e-5)
    assert not math.isclose(got["loss"], reference["loss"], rel_tol=1e-3)


def test_padless_rows_train_exactly_under_trls_own_padding_free_path(reference, tmp_path):
    """padless.pack_dataset's rows through trl.SFTTrainer(padding_free=True) on sdpa, where that path is
    isolated (docs/integrations/exactness.md); the model gets the GPT-2 count fix."""
    import trl

    import padless
    from padless.integrations.transformers import count_shifted_labels

    packed = padless.pack_dataset(support.dataset(support.examples()), support.MAX_LENGTH)
    model = count_shifted_labels(support.model("sdpa"))
    args = trl.SFTConfig(
        output_dir=str(tmp_path),
        max_steps=1,
        per_device_train_batch_size=packed.num_rows,
        padding_free=True,
        max_length=None,
        report_to="none",
        use_cpu=True,
        max_grad_norm=0.0,
        save_strategy="no",
        disable_tqdm=True,
        learning_rate=1e-3,
        bf16=False,
    )
    grads = {}

    class Capture(support_callback()):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            grads.update(support.grads(model))

    trainer = trl.SFTTrainer(
        model=model, args=args, train_dataset=packed, processing_class=support.tokenizer(), callbacks=[Capture()]
    )
    result = trainer.train()
    assert_same_step({"loss": result.training_loss, "grads": grads, "num_items": reference["num_items"]}, reference)


def support_callback():
    from transformers import TrainerCallback

    return TrainerCallback


def test_overlong_sequences_are_refused_unless_asked_for(tmp_path):
    import trl

    from padless.integrations.trl import SFTTrainer

    feats = support.examples()
    short = max(len(f["input_ids"]) for f in feats) - 1
    args = trl.SFTConfig(
        output_dir=str(tmp_path),
        packing=True,
        max_length=short,
        report_to="none",
        use_cpu=True,
        max_steps=1,
        bf16=False,
    )
    kwargs = dict(
        model=support.model("sdpa"), train_dataset=support.dataset(feats), processing_class=support.tokenizer()
    )
    with pytest.raises(ValueError) as refused:
        SFTTrainer(args=args, **kwargs)
    # the library's words (max_length, overlong=) said as SFTTrainer takes them
    assert re.search(
        rf"longer than SFTConfig\(max_length={short}\)( \(and \d+ more\))?; "
        r"choose SFTTrainer\(overlong='truncate'\), 'split' or 'drop'$",
        str(refused.value),
    ), refused.value
    trainer = SFTTrainer(args=args, overlong="truncate", **kwargs)
    stats = trainer.batch_sampler.schedule().plan.stats
    assert stats.truncated_sequences >= 1 and stats.truncated_tokens >= 1
    args.truncation_mode = "keep_end"
    with pytest.raises(
        ValueError,
        match=re.escape(
            "SFTTrainer(overlong='truncate') keeps the start of a sequence; "
            "SFTConfig(truncation_mode='keep_end') asks for its end"
        ),
    ):
        SFTTrainer(args=args, overlong="truncate", **kwargs)


@pytest.mark.parametrize(("config", "overlong", "said"), [
    ({"packing_strategy": "bfd_split"}, "drop",
     "SFTConfig(packing_strategy='bfd_split') splits overlong sequences; it cannot be combined with "
     "SFTTrainer(overlong='drop') (use SFTConfig(packing_strategy='bfd') for that)"),
    ({}, "cut", "unknown SFTTrainer(overlong='cut'); choose one of error, truncate, split, drop"),
    ({"packing_strategy": "bfs"}, None, "unknown SFTConfig(packing_strategy='bfs'); choose one of bfd, "),
])  # fmt: skip
def test_errors_name_the_sft_trainer_argument(tmp_path, config, overlong, said):
    import trl

    from padless.integrations.trl import SFTTrainer

    args = trl.SFTConfig(
        output_dir=str(tmp_path),
        packing=True,
        max_length=support.MAX_LENGTH,
        report_to="none",
        use_cpu=True,
        bf16=False,
        **config,
    )
    with pytest.raises(ValueError, match=re.escape(said)):
        SFTTrainer(
            model=support.model("sdpa"),
            args=args,
            train_dataset=support.dataset(support.examples()),
            processing_class=support.tokenizer(),
            overlong=overlong,
        )


def test_an_overlong_eval_sequence_names_the_sft_config_field(tmp_path):
    import trl

    from padless.integrations.trl import SFTTrainer

    args = trl.SFTConfig(
        output_dir=str(tmp_path),
        packing=True,
        max_length=support.MAX_LENGTH,
        report_to="none",
        use_cpu=True,
        bf16=False,
    )
    overlong = [{"input_ids": list(range(1, support.MAX_LENGTH + 40))}]
    with pytest.raises(
        ValueError,
        match=re.escape(f"sequences longer than SFTConfig(max_length={support.MAX_LENGTH}): 1 (the first is row 0"),
    ) as refused:
        SFTTrainer(
            model=support.model("sdpa"),
            args=args,
            train_dataset=support.examples(),
            eval_dataset=overlong,
            processing_class=support.tokenizer(),
        )
    assert "Choose SFTTrainer(overlong='truncate')" in str(refused.value)


def test_evaluation_packs_the_eval_dataset_once(tmp_path):
    import math

    import trl

    from padless.integrations.trl import SFTTrainer

    ds = support.dataset(support.examples())
    args = trl.SFTConfig(
        output_dir=str(tmp_path),
        packing=True,
        max_length=support.MAX_LENGTH,
        report_to="none",
        use_cpu=True,
        per_device_eval_batch_size=2,
        disable_tqdm=True,
        bf16=False,
    )
    trainer = SFTTrainer(
        model=support.model("padless"),
        args=args,
        train_dataset=ds,
        eval_dataset=ds,
        processing_class=support.tokenizer(),
    )
    assert "seq_lengths" in trainer.eval_dataset.column_names
    assert trainer.eval_dataset.num_rows == support.num_rows(support.examples())
    assert math.isfinite(trainer.evaluate()["eval_loss"])


def test_sft_trainer_with_a_lora_peft_config_packs_for_the_wrapped_model(tmp_path):
    """TRL wraps the model in a PeftModel; padless' rule answers from the model inside it, and the
    adapter alone trains on packed rows."""
    import math

    peft = pytest.importorskip("peft")
    import torch
    import trl

    from padless.integrations.trl import SFTTrainer

    ds = support.dataset(support.examples())
    args = trl.SFTConfig(
        output_dir=str(tmp_path),
        packing=True,
        max_length=support.MAX_LENGTH,
        report_to="none",
        use_cpu=True,
        max_steps=1,
        per_device_train_batch_size=2,
        disable_tqdm=True,
        bf16=False,
        save_strategy="no",
    )
    lora = peft.LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=8, fan_in_fan_out=True)
    trainer = SFTTrainer(
        model=support.model("padless"),
        args=args,
        train_dataset=ds,
        peft_config=lora,
        processing_class=support.tokenizer(),
    )
    assert type(trainer.model).__name__.startswith("PeftModel")
    assert trainer.data_collator.attention == "varlen"  # padless attention's inputs, read through the wrapper
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    assert math.isfinite(trainer.train().training_loss)
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert changed and all("lora_" in n for n in changed)


CHAT = [{"role": "user", "content": "What is packing?"}, {"role": "assistant", "content": "Documents in rows."}]
TYPOS = {
    "mesages": ([{"messages": CHAT}, {"mesages": CHAT}],
                "train_dataset: record 2: no 'text', 'messages' or 'input_ids' field (fields: 'mesages'"),
    "contnt": ([{"messages": CHAT}, {"messages": CHAT}, {"messages": [{"role": "user", "contnt": "Hi"}, CHAT[1]]}],
               "train_dataset: record 3: message 0 has no 'content' (fields: 'role', 'contnt'"),
    "txt": ([{"text": "A sentence."}, {"txt": "Another one."}],
            "train_dataset: record 2: no 'text', 'messages' or 'input_ids' field (fields: 'txt'"),
}  # fmt: skip
"""A misspelt field -> the start of padless' error: the trainer argument, the record (from 1), the field and
the fields the record has."""


def as_dataset(rows):
    """``rows`` as a ``datasets.Dataset`` of every field any row has (``None`` where a row has none)."""
    from datasets import Dataset

    names = list(dict.fromkeys(k for r in rows for k in r))
    return Dataset.from_dict({k: [r.get(k) for r in rows] for k in names})


@pytest.fixture(scope="module")
def gpt2():
    return support.model("sdpa")


@pytest.mark.parametrize("packing", [True, False])
@pytest.mark.parametrize("container", ["list", "datasets"])
@pytest.mark.parametrize("typo", list(TYPOS))
def test_a_misspelt_field_is_named_before_trl_reads_the_dataset(tmp_path, gpt2, typo, container, packing):
    """TRL would fail inside datasets.map (``KeyError: 'text'``) or render a message without content."""
    import trl

    from padless.data.records import RecordError
    from padless.integrations.trl import SFTTrainer

    rows, said = TYPOS[typo]
    args = trl.SFTConfig(
        output_dir=str(tmp_path),
        packing=packing,
        max_length=support.MAX_LENGTH,
        report_to="none",
        use_cpu=True,
        bf16=False,
    )
    with pytest.raises(RecordError) as refused:
        SFTTrainer(
            model=gpt2,
            args=args,
            train_dataset=rows if container == "list" else as_dataset(rows),
            processing_class=support.tokenizer(),
        )
    assert str(refused.value).startswith(said), refused.value
    assert f"did you mean '{'messages' if typo == 'mesages' else 'content' if typo == 'contnt' else 'text'}'" in str(
        refused.value
    )


@pytest.mark.parametrize(("rows", "config", "said"), [
    ([{"prompt": "The sky is"}], {}, "train_dataset: record 1: 'prompt' without 'completion' (fields: 'prompt'"),
    ([{"text": "A sentence."}, {"messages": CHAT}], {},
     "train_dataset: record 2: a 'messages' record, and record 1 is a 'text' one; SFTTrainer trains one kind"),
    ([{"text": "A sentence."}], {"dataset_text_field": "body"},
     "train_dataset: record 1: no 'body' field, which SFTConfig(dataset_text_field='body') reads (fields: 'text'"),
    ([{"body": "A sentence."}, {"body": "  "}], {"dataset_text_field": "body"},
     "train_dataset: record 2: 'body' is empty"),
    ([{"messages": [{"role": "usr", "content": "Hi"}]}], {}, "train_dataset: record 1: message 0: unknown role 'usr'"),
])  # fmt: skip
def test_records_trl_cannot_train_as_they_are_are_named(tmp_path, gpt2, rows, config, said):
    import trl

    from padless.data.records import RecordError
    from padless.integrations.trl import SFTTrainer

    args = trl.SFTConfig(
        output_dir=str(tmp_path), max_length=support.MAX_LENGTH, report_to="none", use_cpu=True, bf16=False, **config
    )
    with pytest.raises(RecordError, match=re.escape(said)):
        SFTTrainer(model=gpt2, args=args, train_dataset=rows, processing_class=support.tokenizer())


def test_an_eval_dataset_is_checked_and_named_too(tmp_path, gpt2):
    import trl

    from padless.data.records import RecordError
    from padless.integrations.trl import SFTTrainer

    args = trl.SFTConfig(
        output_dir=str(tmp_path),
        packing=True,
        max_length=support.MAX_LENGTH,
        report_to="none",
        use_cpu=True,
        bf16=False,
    )
    with pytest.raises(RecordError, match=re.escape("eval_dataset['chat']: record 1: no 'text', 'messages' or")):
        SFTTrainer(
            model=gpt2,
            args=args,
            train_dataset=support.examples(),
            processing_class=support.tokenizer(),
            eval_dataset={"chat": as_dataset([{"mesages": CHAT}])},
        )


def test_a_list_of_records_is_taken_as_a_dataset(tmp_path):
    import trl

    from padless.integrations.trl import SFTTrainer

    args = trl.SFTConfig(
        output_dir=str(tmp_path),
        packing=True,
        max_length=support.MAX_LENGTH,
        report_to="none",
        use_cpu=True,
        bf16=False,
    )
    trainer = SFTTrainer(
        model=support.model("sdpa"), args=args, train_dataset=support.examples(), processing_class=support.tokenizer()
    )
    assert trainer.train_dataset.num_rows == support.NUM_EXAMPLES
    assert trainer.batch_sampler.schedule().plan.num_rows == support.num_rows(support.examples())


@pytest.mark.parametrize(("kind", "attn", "line"), [
    ("sft-packed", "sdpa", "layout 4d-mask, exact (padless rule), 160-token rows, {docs:.1f} documents per row "
                           "(planned rows), rows {fill:.1f}% full, isolation guard on step 1"),
    ("sft-packed", "padless", "layout varlen, exact (padless rule), 160-token rows, {docs:.1f} documents per row "
                              "(planned rows), rows {fill:.1f}% full, isolation guard on step 1"),
    ("sft-padding-free", "padless", "layout varlen, exact (padless rule), one row per micro-batch, 8 documents per "
                                    "row (per_device_train_batch_size), isolation guard on step 1"),
    ("sft-padded", "sdpa", "layout padded, exact (padded: nothing packed), TRL's padded batches, 1 document per row"),
])  # fmt: skip
def test_training_starts_with_one_line_saying_what_trains_and_whether_it_is_exact(tmp_path, caplog, kind, attn, line):
    rows = support.num_rows(support.examples())
    docs = support.NUM_EXAMPLES / rows
    fill = 100 * sum(len(f["input_ids"]) for f in support.examples()) / (rows * support.MAX_LENGTH)
    caplog.set_level(logging.INFO, logger="padless.integrations.transformers")
    support.first_step(kind, attn, str(tmp_path), rows_per_batch=2)
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "padless.integrations.transformers"]
    assert said[0] == (
        logging.INFO,
        f"padless: GPT2LMHeadModel, attention {attn}, " + line.format(docs=docs, fill=fill),
    )
    guarded = kind != "sft-padded"  # packed rows: the guard's line follows the first step
    assert len(said) == 1 + guarded and all(level == logging.INFO for level, _ in said)
    assert not guarded or re.fullmatch(support.GUARD_LINE, said[1][1]), said


def test_a_2d_mask_added_to_packed_rows_is_refused(tmp_path):
    """A packed batch that gains an all-ones 2D ``attention_mask`` on its way to the loss is refused."""
    import trl

    from padless.integrations.trl import SFTTrainer

    args = trl.SFTConfig(
        output_dir=str(tmp_path),
        packing=True,
        max_length=support.MAX_LENGTH,
        report_to="none",
        use_cpu=True,
        max_steps=1,
        bf16=False,
    )
    trainer = SFTTrainer(
        model=support.model("sdpa"),
        args=args,
        train_dataset=support.dataset(support.examples()),
        processing_class=support.tokenizer(),
    )
    support.add_2d_masks(trainer)
    with pytest.raises(ValueError, match="attention_mask"):
        trainer.train()
