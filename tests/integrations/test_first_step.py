"""The first packed step checked on the model (padless.integrations.first_step): every padless trainer
guards its first packed forward by default, guard=False skips it, an IsolationGuard sets its period, and a
model that mixes the documents of a packed row (a forward that drops the document boundaries the
collator sends) is stopped on step 1, before any update, naming the documents."""

from __future__ import annotations

import inspect
import logging
import re
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import integrations_support as support  # noqa: E402

LENGTHS = (19, 8, 11, 5, 7, 13, 6, 9)
BOUNDARIES = ("attention_mask", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k",
              "tree_cu_seqlens", "tree_parents")  # fmt: skip


def features(lengths=LENGTHS):
    return [{"input_ids": [1 + (7 * i + j) % 90 for j in range(n)]} for i, n in enumerate(lengths)]


def args(tmp_path, steps=1, **changes):
    from transformers import TrainingArguments

    options = dict(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to="none",
        max_steps=steps,
        disable_tqdm=True,
        save_strategy="no",
        per_device_train_batch_size=1,
        learning_rate=1e-2,
        seed=0,
    )
    return TrainingArguments(**{**options, **changes})


def leaky(model):
    """``model`` whose forward drops the document boundaries a packed batch carries (a 4D mask, positions,
    varlen or tree kwargs): packed rows then run plain causal, each document seeing the ones before it,
    while a document alone (no mask) or the padded reference (a 2D mask) is unchanged."""
    forward = model.forward

    def mixing(*a, **kwargs):
        mask = kwargs.get("attention_mask")
        for key in BOUNDARIES:
            if key != "attention_mask" or (mask is not None and mask.dim() == 4):
                kwargs.pop(key, None)
        return forward(*a, **kwargs)

    model.forward = mixing
    return model


def packed_trainer(tmp_path, model=None, steps=1, **kwargs):
    from padless.integrations.transformers import PackedTrainer

    model = model if model is not None else support.model("sdpa", "tiny-llama")
    return PackedTrainer(model=model, args=args(tmp_path, steps), train_dataset=features(), max_length=32, **kwargs)


@pytest.mark.parametrize("name", ["PackedTrainer", "SFTTrainer", "GRPOTrainer", "DPOTrainer"])
def test_every_trainer_guards_its_first_packed_step_by_default(name):
    if name != "PackedTrainer":
        pytest.importorskip("trl")
        import padless.integrations.trl as module
    else:
        import padless.integrations.transformers as module
    assert inspect.signature(getattr(module, name).__init__).parameters["guard"].default is True


def test_the_first_step_is_checked_and_its_cost_said(tmp_path, caplog):
    trainer = packed_trainer(tmp_path, steps=2)
    caplog.set_level(logging.INFO, logger="padless.integrations.transformers")
    trainer.train()
    said = [r.getMessage() for r in caplog.records if r.name == "padless.integrations.transformers"]
    assert said[0].endswith(", isolation guard on step 1") and len(said) == 2
    assert re.fullmatch(support.GUARD_LINE, said[1]), said[1]
    ((check, seconds),) = trainer.padless_guard.checks  # step 1 only
    assert check.passed and check.step == 1 and len(check.pieces) == 2 and seconds > 0
    assert trainer.padless_guard.step_seconds > seconds  # the step's time holds the guard's


def test_guard_false_skips_it(tmp_path, caplog, monkeypatch):
    from padless.isolation.guard import IsolationGuard

    calls = []
    monkeypatch.setattr(IsolationGuard, "check", lambda *a, **k: calls.append(a))
    trainer = packed_trainer(tmp_path, model=leaky(support.model("sdpa", "tiny-llama")), guard=False)
    caplog.set_level(logging.INFO, logger="padless.integrations.transformers")
    trainer.train()  # trains on mixed documents: nothing checks them
    said = [r.getMessage() for r in caplog.records if r.name == "padless.integrations.transformers"]
    assert len(said) == 1 and said[0].endswith(", isolation guard off (guard=False)")
    assert not calls and not trainer.padless_guard.checks


def test_an_isolation_guard_sets_the_period(tmp_path):
    from padless import IsolationGuard

    trainer = packed_trainer(tmp_path, steps=5, guard=IsolationGuard(every=2, documents=1))
    assert trainer.start_line().endswith(", isolation guard on step 1 and every 2 packed forwards")
    trainer.train()
    assert [c.step for c, _ in trainer.padless_guard.checks] == [1, 3, 5]
    assert all(c.passed and len(c.pieces) == 1 for c, _ in trainer.padless_guard.checks)
    with pytest.raises(ValueError, match=r"PackedTrainer\(guard=...\) must be True .* got str"):
        packed_trainer(tmp_path, guard="yes")


@pytest.mark.parametrize("attn", ["sdpa", "padless"])
def test_a_model_that_mixes_documents_stops_on_step_1(tmp_path, attn):
    model = leaky(support.model(attn, "tiny-llama"))
    trainer = packed_trainer(tmp_path, model=model, steps=3)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    from padless import IsolationError

    with pytest.raises(IsolationError) as err:
        trainer.train()
    message = str(err.value)
    assert message.startswith("PackedTrainer: the isolation guard stopped training before this step's update: step 1")
    assert re.search(r"packed documents \d+ \(row \d+, column \d+, \d+ tokens\)", message)  # which documents
    assert re.search(r"max \|diff\| \S+, padding's own noise \S+, limit \S+ \(float32\)", message)  # against the noise
    assert "What to do:" in message and "PackedTrainer(guard=False)" in message
    assert re.search(r"document \d+ \(row \d+\), tokens packed vs padded: 0: ", message)  # token by token
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())  # stopped before any update


def test_sft_trainer_guards_packed_rows_and_stops_a_mixing_model(tmp_path):
    trl = pytest.importorskip("trl")
    from test_trl_grpo import tiny_llama, tiny_tokenizer

    from padless import IsolationError
    from padless.integrations.trl import SFTTrainer

    support.offline_hub()
    config = dict(
        output_dir=str(tmp_path),
        packing=True,
        max_length=32,
        per_device_train_batch_size=1,
        max_steps=1,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
    )
    data = support.dataset(features())
    model = lambda: leaky(tiny_llama(len(tiny_tokenizer())))  # noqa: E731
    trainer = SFTTrainer(
        model=model(), args=trl.SFTConfig(**config), train_dataset=data, processing_class=tiny_tokenizer()
    )
    with pytest.raises(IsolationError, match=r"^SFTTrainer: the isolation guard stopped training .* step 1"):
        trainer.train()
    config["output_dir"] = str(tmp_path / "off")
    off = SFTTrainer(
        model=model(), args=trl.SFTConfig(**config), train_dataset=data, processing_class=tiny_tokenizer(), guard=False
    )
    off.train()
    assert not off.padless_guard.checks


def test_grpo_trainer_stops_a_mixing_model_on_step_1(tmp_path):
    pytest.importorskip("trl")
    from test_trl_grpo import dataset, grpo_config, reward, tiny_llama, tiny_tokenizer

    from padless import IsolationError
    from padless.integrations.trl import GRPOTrainer

    support.offline_hub()
    model = leaky(tiny_llama(len(tiny_tokenizer())))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=grpo_config(tmp_path, beta=0.0),
        train_dataset=dataset(),
        processing_class=tiny_tokenizer(),
    )
    with pytest.raises(IsolationError, match=r"^GRPOTrainer: the isolation guard stopped training .* step 1"):
        trainer.train()
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())


@pytest.mark.parametrize("share", [False, True])
def test_dpo_trainer_guards_its_first_step_and_stops_a_mixing_model(tmp_path, share):
    pytest.importorskip("trl")
    from test_trl_dpo import dpo_config, train
    from test_trl_grpo import tiny_llama, tiny_tokenizer

    from padless import IsolationError
    from padless.integrations.trl import DPOTrainer

    reference = lambda: tiny_llama(len(tiny_tokenizer()))  # noqa: E731
    trainer, _ = train(
        DPOTrainer, dpo_config(tmp_path / "exact", max_steps=1), ref_model=reference(), share_prompt=share
    )
    ((check, _),) = trainer.padless_guard.checks
    assert check.passed and check.pieces and check.noise is not None
    if share:  # a completion after its prompt is run alone as prompt + completion
        assert any(n > 1 for *_, n in check.pieces)
    with pytest.raises(IsolationError, match=r"^DPOTrainer: the isolation guard stopped training .* step 1"):
        train(
            DPOTrainer,
            dpo_config(tmp_path / "mixing"),
            model=leaky(reference()),
            ref_model=reference(),
            share_prompt=share,
        )


def test_a_warning_guard_lets_training_go_on_and_says_so(tmp_path, caplog):
    from padless import IsolationGuard
    from padless.isolation.guard import IsolationWarning

    guard = IsolationGuard(every=None, on_failure="warn", budget=0.05)
    trainer = packed_trainer(tmp_path, model=leaky(support.model("sdpa", "tiny-llama")), steps=2, guard=guard)
    caplog.set_level(logging.INFO, logger="padless.integrations.transformers")
    with pytest.warns(IsolationWarning, match="are not isolated"):
        trainer.train()
    said = [r.getMessage() for r in caplog.records if r.name == "padless.integrations.transformers"]
    assert "run alone DIFFER from their packed rows (on_failure='warn')" in said[1], said
