"""The model is read once: one ``for_model`` call derives the attention rules once and walks the module
tree once; the facts are kept until the model changes; the rule's answer is one :class:`Verdict`, and
the collator fit and the batch check compare against it by one comparison."""

from __future__ import annotations

import pytest
import torch

from conftest import make_features
from padless.attention import facts as facts_module
from padless.attention import mixers, verdict
from padless.attention.accept import check_batch
from padless.attention.facts import MixerState, ModelFacts, model_facts
from padless.attention.select import check_exact, decide
from padless.batching.collate import PackingCollator
from padless.batching.rowformat import check_collator

VOCAB, WINDOW, ROW = 64, 8, 32


def _mistral(backend: str = "sdpa"):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=WINDOW,
    )
    return MistralForCausalLM._from_config(config, attn_implementation=backend).eval()


@pytest.fixture
def counted(monkeypatch):
    """Counters of the two expensive reads: the attention rules and the per-module mixer test."""
    calls = {"rules": 0, "kind_of": 0}
    real_rules, real_kind = facts_module.attention_rules, mixers._kind_of

    def rules(*a, **kw):
        calls["rules"] += 1
        return real_rules(*a, **kw)

    def kind_of(module):
        calls["kind_of"] += 1
        return real_kind(module)

    monkeypatch.setattr(facts_module, "attention_rules", rules)
    monkeypatch.setattr(mixers, "_kind_of", kind_of)
    return calls


def test_one_for_model_call_reads_the_rules_once_and_walks_the_modules_once(counted):
    model = _mistral()
    modules = len(list(model.named_modules()))  # 33 for a 2-layer Mistral
    collator = PackingCollator.for_model(model, max_length=ROW)
    assert counted == {"rules": 1, "kind_of": modules}
    assert collator.windows == WINDOW and collator.verdict.model == "MistralForCausalLM (sdpa)"
    # everything after asks the same facts: no second read
    check_collator(model, collator)
    check_batch(model, collator(make_features([20, 3, 13], vocab_size=VOCAB, seed=1)))
    PackingCollator.for_model(model, max_length=ROW // 2)
    assert counted == {"rules": 1, "kind_of": modules}


def test_the_facts_are_read_again_when_the_model_changes(counted):
    model = _mistral()
    first = model_facts(model)
    assert model_facts(model) is first and counted["rules"] == 1
    assert first.rules.windows == {"sliding_attention": WINDOW} and first.mixers is MixerState.NONE_FOUND
    model.config.sliding_window = 4  # a config value changed in place
    assert model_facts(model).rules.windows == {"sliding_attention": 4} and counted["rules"] == 2
    model.config._attn_implementation = "eager"
    assert model_facts(model).backend == "eager" and counted["rules"] == 3
    assert model_facts(model, dtype=torch.bfloat16).dtype == torch.bfloat16  # another run: other facts
    assert model_facts(model, refresh=True) is not model_facts(model, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model_facts(model).dtype == torch.bfloat16  # autocast is the compute dtype
    assert model_facts(model).dtype == torch.float32


def test_a_config_has_facts_without_modules():
    from transformers import MistralConfig

    facts = model_facts(MistralConfig(sliding_window=WINDOW))
    assert isinstance(facts, ModelFacts) and model_facts(facts) is facts
    assert facts.mixers is MixerState.NONE_FOUND and not facts.attention_free and facts.mixer_layers == ()
    assert (str(facts.device), facts.dtype, facts.weights_dtype) == ("cpu", torch.float32, None)


def test_the_verdict_says_what_the_batch_must_carry_or_why_not():
    model = _mistral()
    facts = model_facts(model)
    exact = decide(facts, "sdpa", max_length=ROW)
    assert exact.exact and (exact.inputs, exact.windows, exact.mask_dtype) == ("mask4d", WINDOW, torch.float32)
    assert decide(facts, "sdpa", max_length=WINDOW).windows is None  # no document outgrows the window
    assert check_exact(model, "sdpa", max_length=ROW) == exact
    refused = decide(facts, "flash_attention_2", max_length=ROW)  # the CPU: refused, not raised
    assert not refused.exact and "CUDA" in refused.reason and "use backend 'padless'" in refused.message
    with pytest.raises(ValueError) as raised:
        check_exact(model, "flash_attention_2", max_length=ROW)
    assert str(raised.value) == refused.message
    with pytest.raises(ValueError, match="unknown attention backend 'nope'"):
        decide(facts, "nope")


def test_for_model_refuses_options_that_do_not_fit_the_verdict():
    model = _mistral()
    with pytest.raises(ValueError, match="options given do not fit MistralForCausalLM \\(sdpa\\).*sliding windows 4"):
        PackingCollator.for_model(model, max_length=ROW, windows=4)
    with pytest.raises(ValueError, match="4D mask is torch.bfloat16, the model's weights are torch.float32"):
        PackingCollator.for_model(model, max_length=ROW, mask_dtype=torch.bfloat16)
    fitted = PackingCollator.for_model(model, max_length=ROW)
    assert fitted.verdict is not None and fitted.verdict.windows == WINDOW


def test_collator_fit_and_batch_check_share_one_comparison(monkeypatch):
    model = _mistral()
    seen = []
    real = verdict.mismatch
    monkeypatch.setattr(
        verdict, "mismatch", lambda v, carried, **kw: seen.append((kw["subject"], carried)) or real(v, carried, **kw)
    )
    collator = check_collator(model, PackingCollator(max_length=ROW, attention="position_ids"))
    check_batch(model, collator(make_features([20, 3, 13], vocab_size=VOCAB, seed=1)))
    # check_collator, the fitted check where the batch is built, the batch check: one comparison
    assert seen == [("collator", "position_ids"), ("collator", "position_ids"), ("batch", "position_ids")]
    v = check_exact(model, "sdpa", max_length=ROW)
    assert "does not build its masks" not in (real(v, "varlen", subject="batch") or "")
    assert "only with 'mask4d'" in real(v, "varlen", subject="batch")
    assert "only with 'mask4d'" in real(v, "varlen", subject="collator")
    assert "sliding windows None" in real(v, "mask4d", subject="collator", windows=None, mask_dtype=torch.float32)
    assert (
        real(v, "mask4d", subject="collator", windows={"sliding_attention": WINDOW}, mask_dtype=torch.float32) is None
    )
    assert "use_cache=False" in real(v, "position_ids", subject="batch", use_cache=True)
