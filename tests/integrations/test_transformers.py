"""``PackedTrainer`` (padless.integrations.transformers): the first optimiser step of packed rows equals
the padded step under Trainer (fp32), from a list, a ``datasets.Dataset`` or rows packed beforehand; what
cannot be trained exactly is refused. tests/integrations/test_trainer_example.py covers the example script built on it;
tests/integrations/test_ddp.py the two-process run."""

from __future__ import annotations

import math
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
    got = support.first_step("trainer-packed", "padless", str(tmp_path), rows_per_batch=-(-rows // 2),
                             grad_accum=2, features=ds)  # fmt: skip
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
    with pytest.raises(ValueError, match="flex_attention.*no backward on CPU.*use backend 'padless'"):
        PackedTrainer(model=windowed, args=args, train_dataset=feats, max_length=32)
    model = support.model("sdpa", "tiny-gpt2")
    with pytest.raises(ValueError, match="sequence 0 has length 19, longer than max_length 16"):
        PackedTrainer(model=model, args=args, train_dataset=feats, max_length=16)
    with pytest.raises(ValueError, match="must be a padless PackingCollator"):
        PackedTrainer(model=model, args=args, train_dataset=feats, max_length=32, data_collator=lambda f: f)
    prepacked = [{"input_ids": list(range(1, 20)), "seq_lengths": [10, 9]}]
    with pytest.raises(ValueError, match="packed row 0 holds 19 tokens, more than max_length=16"):
        PackedTrainer(model=model, args=args, train_dataset=prepacked, max_length=16)
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
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_eval_batch_size=2,
                             disable_tqdm=True)  # fmt: skip
    trainer = PackedTrainer(model=support.model("padless"), args=args, train_dataset=feats, eval_dataset=evaluation,
                            max_length=support.MAX_LENGTH)  # fmt: skip
    seen, collate = [], trainer.data_collator

    def record(features):
        seen.extend("seq_lengths" in f for f in features)
        return collate(features)

    trainer.data_collator = record
    assert math.isfinite(trainer.evaluate()["eval_loss"])
    assert len(seen) == packed.num_rows and all(seen)
