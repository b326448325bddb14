"""PEFT adapters: every path that takes a model accepts a PEFT-wrapped one and answers from the model it
wraps (:func:`padless.attention.adapters.base_model_of`).

On tiny Llama and GPT-2 (fp32, sdpa and padless) with LoRA, DoRA, IA3 and a merged LoRA: packed logits
equal each sequence alone; the token-normalised loss and the adapter's gradients equal padded training;
``sequence_logprobs`` with the adapter on and off equal each sequence alone. Every adapter is
initialised away from identity (``init_lora_weights=False``), so a test that ignored it would fail the
"adapter changes the logits" check. Prompt learning (virtual tokens per row) is refused.
"""

from __future__ import annotations

import pytest
import torch

from conftest import alone_logits, make_features, max_diff_to_alone
from padless.attention.adapters import adapter_refusal, base_model_of, is_adapter
from padless.attention.backend import register_padless_attention
from padless.attention.select import check_exact
from padless.batching.collate import PackingCollator, PaddingCollator
from padless.models.factory import build_model
from padless.objectives.logprobs import sequence_logprobs
from padless.objectives.loss import model_loss, step_num_items

peft = pytest.importorskip("peft")

# peft 0.21 reads the deprecated `is_gradient_checkpointing` of the pinned transformers when it wraps a model
pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")

LENGTHS = (5, 1, 17, 9, 3, 12, 2, 8)
ROW = 24
ATOL = 1e-5
ADAPTERS = ("lora", "dora", "ia3", "lora-merged")


def _wrap(model, adapter):
    conv1d = model.config.model_type == "gpt2"  # GPT-2's Conv1D stores weights transposed
    if adapter == "ia3":
        config = peft.IA3Config(task_type="CAUSAL_LM", init_ia3_weights=False, fan_in_fan_out=conv1d)
    else:
        config = peft.LoraConfig(
            task_type="CAUSAL_LM",
            r=4,
            lora_alpha=8,
            init_lora_weights=False,
            use_dora=adapter == "dora",
            fan_in_fan_out=conv1d,
        )
    wrapped = peft.get_peft_model(model, config)
    if adapter == "lora-merged":
        wrapped.merge_adapter()  # weights merged, the wrapper kept (merge_and_unload returns the plain model)
    return wrapped.eval()


def _adapted(family, backend, adapter):
    if backend == "padless":
        register_padless_attention()
    return _wrap(build_model(f"tiny-{family}", attn_implementation=backend, seed=0), adapter)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("backend", ["sdpa", "padless"])
@pytest.mark.parametrize("adapter", ADAPTERS)
def test_packed_logits_equal_each_sequence_alone(family, backend, adapter):
    model = _adapted(family, backend, adapter)
    feats = make_features(LENGTHS, seed=1)
    batch = PackingCollator.for_model(model, max_length=ROW)(feats)  # the rule sees through the adapter
    assert batch["input_ids"].shape[0] > 1
    assert max_diff_to_alone(model, feats, batch) < ATOL
    # the adapter is live: the same sequence differs with it off (a test that dropped it would fail)
    ids = feats[2]["input_ids"]
    if adapter == "lora-merged":
        model.unmerge_adapter()
    with model.disable_adapter():
        off = alone_logits(model, ids)
    assert (off - alone_logits(model, ids)).abs().max().item() > 1e-3


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("backend", ["sdpa", "padless"])
def test_loss_and_adapter_gradients_equal_padded_training(family, backend):
    model = _adapted(family, backend, "lora")
    feats = make_features(LENGTHS, seed=2, with_labels=True)
    losses, grads = [], []
    for batch in (PaddingCollator()(feats), PackingCollator.for_model(model, max_length=ROW)(feats)):
        model.zero_grad(set_to_none=True)
        loss = model_loss(model, batch, step_num_items([batch], all_ranks=False))
        loss.backward()
        losses.append(loss.detach())
        named = [(n, p.grad) for n, p in model.named_parameters() if p.requires_grad]
        assert named and all("lora_" in n for n, _ in named)  # only the adapter trains
        grads.append(torch.cat([g.flatten() for _, g in named]))
    torch.testing.assert_close(losses[1], losses[0], rtol=ATOL, atol=ATOL)
    assert grads[0].abs().max() > 0
    torch.testing.assert_close(grads[1], grads[0], rtol=ATOL, atol=1e-6)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("backend", ["sdpa", "padless"])
def test_sequence_logprobs_with_the_adapter_on_and_off(family, backend):
    """DPO's reference model is the same PEFT model with its adapter disabled."""
    model = _adapted(family, backend, "lora")
    feats = make_features(LENGTHS, seed=3, with_labels=True)
    batch = PackingCollator.for_model(model, max_length=ROW)(feats)

    def alone_sums():
        out = []
        for f in feats:
            lp = alone_logits(model, f["input_ids"]).float().log_softmax(-1)
            labels = torch.tensor(f["labels"])
            t = torch.nonzero(labels[1:] != -100).squeeze(1) + 1
            out.append(lp[t - 1, labels[t]].sum())
        return torch.stack(out)

    with torch.no_grad():
        on = sequence_logprobs(model, batch)
        ref_on = alone_sums()
        with model.disable_adapter():
            off = sequence_logprobs(model, batch)
            ref_off = alone_sums()
    torch.testing.assert_close(on, ref_on, rtol=ATOL, atol=ATOL)
    torch.testing.assert_close(off, ref_off, rtol=ATOL, atol=ATOL)
    assert (on - off).abs().max() > 1e-3


def test_verify_isolation_passes_on_a_lora_model():
    import padless

    model = _adapted("llama", "sdpa", "lora")
    report = padless.verify_isolation(model, backends=("sdpa", "eager", "padless"))
    assert report.passed, report.as_dict()
    assert {r.backend for r in report.results if r.status == "pass"} >= {"sdpa", "padless"}
    assert model.config._attn_implementation == "sdpa"  # switched back


@pytest.mark.parametrize("kind", ["prompt_tuning", "prefix_tuning", "p_tuning"])
def test_prompt_learning_is_refused_with_the_reason(kind):
    make = {
        "prompt_tuning": lambda: peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4),
        "prefix_tuning": lambda: peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4),
        "p_tuning": lambda: peft.PromptEncoderConfig(
            task_type="CAUSAL_LM", num_virtual_tokens=4, encoder_hidden_size=16
        ),
    }[kind]
    model = peft.get_peft_model(build_model("tiny-llama", seed=0), make())
    assert "virtual tokens in front of each row" in adapter_refusal(model)
    for backend in ("sdpa", "eager", "padless"):
        with pytest.raises(ValueError, match="prompt learning .*no attention backend can"):
            check_exact(model, backend, device="cpu", dtype=torch.float32)
    with pytest.raises(ValueError, match="prompt learning"):
        PackingCollator.for_model(model, max_length=ROW)


def test_base_model_of_unwraps_once_and_leaves_plain_models_alone():
    base = build_model("tiny-gpt2", seed=0)
    assert base_model_of(base) is base and not is_adapter(base) and adapter_refusal(base) is None
    wrapped = _wrap(base, "lora")
    assert is_adapter(wrapped) and base_model_of(wrapped) is base and adapter_refusal(wrapped) is None
    assert base_model_of(base.config) is base.config
    # the rule reads the wrapped model: before, PeftModelForCausalLM.forward "took no position_ids"
    check_exact(wrapped, "sdpa", device="cpu", dtype=torch.float32, max_length=ROW)


def test_the_guard_checks_a_lora_model():
    import padless

    model = _adapted("llama", "sdpa", "lora")
    batch = PackingCollator.for_model(model, max_length=ROW)(make_features(LENGTHS, seed=6))
    check = padless.IsolationGuard(every=1, documents=3).check(model, batch)
    assert len(check.pieces) == 3 and check.max_logit_diff < check.tolerance


def test_packed_trainer_trains_a_lora_model_with_its_own_exact_collator(tmp_path):
    pytest.importorskip("accelerate")
    from transformers import TrainingArguments

    from padless.integrations.transformers import PackedTrainer

    model = _adapted("gpt2", "sdpa", "lora").train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to="none",
        max_steps=2,
        per_device_train_batch_size=2,
        learning_rate=1e-2,
    )
    trainer = PackedTrainer(model=model, args=args, train_dataset=make_features(LENGTHS, seed=7), max_length=ROW)
    assert trainer.data_collator.attention == "mask4d"  # the rule answered from the wrapped GPT-2
    trainer.train()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert changed and all("lora_" in n for n in changed)  # the adapter trained, the base stayed frozen
