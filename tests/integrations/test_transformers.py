"""``PackedTrainer`` (padless.integrations.transformers): the first optimiser step of packed rows equals
the padded step under Trainer (fp32), from a list, a ``datasets.Dataset`` or rows packed beforehand; what
cannot be trained exactly is refused. tests/integrations/test_trainer_example.py covers the example script built on it;
tests/integrations/test_ddp.py the two-process run."""

from __future__ import annotations

import logging
import math
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import integrations_support as support  # noqa: E402

pytest.importorskip("accelerate")


def assert_same_step(got, want):
    import torch

    assert got["num_items"] == want["num_items"]
    assert math.isclose(got["loss"], want["loss"], rel_tol=1e-6), (got["loss"], want["loss"])
    scale = max(g.abs().max().item() for g in want["grads"].values())
    assert set(got["grads"]) == set(want["grads"])
    for name, g in want["grads"].items():
        torch.testing.assert_close(got["grads"][name], g, rtol=1e-5, atol=1e-6 * scale, msg=name)


@pytest.fixture(scope="module")
def padded(tmp_path_factory):
    return support.first_step("trainer-padded", "sdpa", str(tmp_path_factory.mktemp("padded")))


@pytest.mark.parametrize("source", ["datasets", "prepacked"])
def test_packed_trainer_step_equals_padded_step(padded, tmp_path, source):
    import padless

    feats = support.examples()
    ds = support.dataset(feats)
    if source == "prepacked":  # rows packed beforehand keep their documents
        ds = padless.pack_dataset(ds, support.MAX_LENGTH)
    rows = support.num_rows(feats)
    got = support.first_step(
        "trainer-packed", "padless", str(tmp_path), rows_per_batch=-(-rows // 2), grad_accum=2, features=ds
    )
    assert got["micro_batches"] == 2
    assert_same_step(got, padded)


def test_refuses_what_it_cannot_train_exactly(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, TrainingArguments

    from padless.integrations.transformers import PackedTrainer
    from padless.models.factory import tiny_config

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", max_steps=1)
    feats = [{"input_ids": list(range(1, 20))}, {"input_ids": list(range(1, 9))}]
    config = tiny_config("mistral")
    config.sliding_window = 4
    torch.manual_seed(0)
    windowed = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    windowed.config._attn_implementation = "flex_attention"  # what the collator reads; no kernel is loaded
    with pytest.raises(
        ValueError,
        match="flex_attention.*no backward on CPU.*use backend 'padless' "
        r"\(attn_implementation='padless' when loading the model\)",
    ):
        PackedTrainer(model=windowed, args=args, train_dataset=feats, max_length=32)
    model = support.model("sdpa", "tiny-gpt2")
    # the library's words (max_length, overlong=) said as PackedTrainer takes them
    with pytest.raises(
        ValueError,
        match=re.escape(
            "sequence 1 has length 19, longer than PackedTrainer(max_length=16)"
            "; choose PackedTrainer(overlong='truncate'), 'split' or 'drop'"
        ),
    ):
        PackedTrainer(model=model, args=args, train_dataset=feats, max_length=16)
    not_padless = "PackedTrainer(data_collator=...) must be a padless PackingCollator (or None), got function"
    with pytest.raises(ValueError, match=re.escape(not_padless)):
        PackedTrainer(model=model, args=args, train_dataset=feats, max_length=32, data_collator=lambda f: f)
    prepacked = [{"input_ids": list(range(1, 20)), "seq_lengths": [10, 9]}]
    too_long = "packed row 0 holds 19 tokens, more than PackedTrainer(max_length=16)"
    with pytest.raises(ValueError, match=re.escape(too_long)):
        PackedTrainer(model=model, args=args, train_dataset=prepacked, max_length=16)
    for options, said in [
        ({"max_length": 0}, "PackedTrainer(max_length=...) must be an integer >= 1, got 0"),
        ({"remainder": "pad"}, "unknown PackedTrainer(remainder='pad'); choose one of empty, "),
        ({"strategy": "bfs"}, "unknown PackedTrainer(strategy='bfs'); choose one of "),
        ({"overlong": "cut"}, "unknown PackedTrainer(overlong='cut'); choose one of "),
    ]:
        with pytest.raises(ValueError, match=re.escape(said)):
            PackedTrainer(model=model, args=args, train_dataset=feats, **{"max_length": 32, **options})
    trainer = PackedTrainer(model=model, args=args, train_dataset=feats, max_length=32, overlong="truncate")
    assert trainer.batch_sampler.schedule().plan.stats.real_tokens == 27


@pytest.mark.parametrize("as_dataset", [False, True])
def test_evaluation_keeps_the_documents_of_rows_packed_beforehand(tmp_path, as_dataset):
    """Trainer's column removal would strip ``seq_lengths`` from evaluation rows (it is no forward()
    argument); the collator would then see each packed row as one document."""
    import math

    from transformers import TrainingArguments

    import padless
    from padless.integrations.transformers import PackedTrainer

    feats = support.examples()
    packed = padless.pack_dataset(support.dataset(feats), support.MAX_LENGTH)
    evaluation = packed if as_dataset else packed.to_list()
    args = TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_eval_batch_size=2, disable_tqdm=True
    )
    trainer = PackedTrainer(
        model=support.model("padless"),
        args=args,
        train_dataset=feats,
        eval_dataset=evaluation,
        max_length=support.MAX_LENGTH,
    )
    seen, collate = [], trainer.data_collator

    def record(features):
        seen.extend("seq_lengths" in f for f in features)
        return collate(features)

    trainer.data_collator = record
    assert math.isfinite(trainer.evaluate()["eval_loss"])
    assert len(seen) == packed.num_rows and all(seen)


TYPOS = {
    "txt": ([{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9]}, {"txt": "A sentence.", "id": 3}],
            "train_dataset: record 3: no 'text', 'messages' or 'input_ids' field (fields: 'txt', 'id'; did you mean "
            "'text'?)"),
    "input_id": ([{"input_id": [5, 6, 7]}],
                 "train_dataset: record 1: no 'text', 'messages' or 'input_ids' field (fields: 'input_id'; did you "
                 "mean 'input_ids'?)"),
    "text": ([{"input_ids": [5, 6, 7]}, {"text": "Not tokenized."}],
             "train_dataset: record 2: a 'text' record without 'input_ids': PackedTrainer trains token ids; "
             "tokenize it first"),
    "mesages": ([{"mesages": [{"role": "user", "content": "Hi"}]}],
                "train_dataset: record 1: no 'text', 'messages' or 'input_ids' field (fields: 'mesages'; did you mean "
                "'messages'?)"),
}  # fmt: skip
"""A record PackedTrainer cannot train -> padless' error (the trainer argument, the record from 1, the fields it
has), where it would otherwise fail on a raw KeyError while measuring lengths."""


@pytest.mark.parametrize("container", ["list", "datasets"])
@pytest.mark.parametrize("typo", list(TYPOS))
def test_a_record_without_token_ids_is_named(tmp_path, typo, container):
    from datasets import Dataset
    from transformers import TrainingArguments

    from padless.data.records import RecordError
    from padless.integrations.transformers import PackedTrainer

    rows, said = TYPOS[typo]
    if container == "datasets":
        names = list(dict.fromkeys(k for r in rows for k in r))
        rows = Dataset.from_dict({k: [r.get(k) for r in rows] for k in names})
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", max_steps=1)
    with pytest.raises(RecordError) as refused:
        PackedTrainer(model=support.model("sdpa", "tiny-gpt2"), args=args, train_dataset=rows, max_length=32)
    assert str(refused.value).startswith(said), refused.value
    evaluation = [{"input_ids": [5, 6]}, {"txt": "b"}]
    with pytest.raises(RecordError, match=re.escape("eval_dataset: record 2: no 'text', 'messages' or 'input_ids'")):
        PackedTrainer(
            model=support.model("sdpa", "tiny-gpt2"),
            args=args,
            train_dataset=[{"input_ids": [5, 6]}],
            eval_dataset=evaluation,
            max_length=32,
        )


@pytest.mark.parametrize(("attn", "name", "layout"), [
    ("sdpa", "tiny-gpt2", "4d-mask"),
    ("padless", "tiny-gpt2", "varlen"),
    ("sdpa", "mistral-window", "4d-mask with sliding window 4"),  # the window travels in the mask
])  # fmt: skip
def test_training_starts_with_one_line_saying_what_trains_and_whether_it_is_exact(tmp_path, caplog, attn, name, layout):
    import torch
    from transformers import AutoModelForCausalLM, TrainingArguments

    from padless.integrations.transformers import PackedTrainer
    from padless.models.factory import tiny_config

    if name == "mistral-window":
        config = tiny_config("mistral")
        config.sliding_window = 4
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attn)
    else:
        model = support.model(attn, name)
    feats = [{"input_ids": list(range(1, n + 1))} for n in (19, 8, 11, 5, 7)]
    args = TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to="none",
        max_steps=1,
        disable_tqdm=True,
        save_strategy="no",
        per_device_train_batch_size=1,
    )
    trainer = PackedTrainer(model=model, args=args, train_dataset=feats, max_length=32)
    plan = trainer.batch_sampler.schedule().plan
    caplog.set_level(logging.INFO, logger="padless.integrations.transformers")
    trainer.train()
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "padless.integrations.transformers"]
    fill = sum(len(f["input_ids"]) for f in feats) / (32 * plan.num_rows)
    line = (
        f"padless: {type(model).__name__}, attention {attn}, layout {layout}, exact (padless rule), 32-token rows, "
        f"{5 / plan.num_rows:.1f} documents per row (planned rows), rows {100 * fill:.1f}% full, isolation guard on "
        "step 1"
    )
    assert said[0] == (logging.INFO, line) and len(said) == 2  # the start line, then the guard's after step 1
    assert said[1][0] == logging.INFO and re.fullmatch(support.GUARD_LINE, said[1][1]), said[1]


def test_a_collator_that_adds_a_2d_mask_to_packed_rows_is_refused(tmp_path):
    """Many pipelines add an all-ones 2D ``attention_mask``; on packed rows transformers then skips its
    packed-row detection and documents see each other. The trainer refuses the batch, naming the key."""
    from transformers import TrainingArguments

    from padless.integrations.transformers import PackedTrainer

    feats = [{"input_ids": list(range(1, n + 1))} for n in (9, 8, 11, 5, 7)]
    args = TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to="none",
        max_steps=1,
        disable_tqdm=True,
        save_strategy="no",
        per_device_train_batch_size=1,
    )
    trainer = PackedTrainer(model=support.model("sdpa", "tiny-llama"), args=args, train_dataset=feats, max_length=32)
    support.add_2d_masks(trainer)
    with pytest.raises(ValueError, match="attention_mask"):
        trainer.train()
