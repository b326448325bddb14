"""Padded and packed batches of the same sequences give the same loss and gradients; so do different
splits of a step into micro-batches, because the loss is normalised by the step's trained tokens."""

import pytest
import torch

from conftest import make_features
from padless.batching.collate import PackingCollator, PaddingCollator
from padless.models.factory import build_model
from padless.objectives.loss import causal_lm_loss, model_loss, step_num_items, trained_tokens

LENGTHS = [5, 1, 17, 9, 3, 12, 2, 8]


def _grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def _step(model, micro_batches):
    """One optimiser step's gradient, accumulated over micro-batches with token normalisation."""
    model.zero_grad(set_to_none=True)
    n = step_num_items(micro_batches)
    total = 0.0
    for batch in micro_batches:
        loss = model_loss(model, batch, n)
        loss.backward()
        total += loss.item()
    return total, _grads(model)


def test_trained_tokens_skips_first_column_and_ignored():
    labels = torch.tensor([[5, 6, -100, 7], [-100, -100, 3, -100]])
    assert trained_tokens(labels).item() == 3


def test_matches_transformers_loss():
    model = build_model("tiny-gpt2")
    batch = PaddingCollator()(make_features([4, 9, 6], with_labels=True))
    hf = model(**batch).loss
    ours = model_loss(model, batch, trained_tokens(batch["labels"]))
    torch.testing.assert_close(ours, hf, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("attention", ["mask4d", "position_ids"])
def test_padded_and_packed_give_same_loss_and_gradients(family, attention):
    model = build_model(f"tiny-{family}").eval()
    feats = make_features(LENGTHS, with_labels=True, seed=3)
    loss_pad, g_pad = _step(model, [PaddingCollator()(feats)])
    loss_pack, g_pack = _step(model, [PackingCollator(model_free=True, max_length=24, attention=attention)(feats)])
    assert abs(loss_pad - loss_pack) <= 1e-5 * abs(loss_pad)
    torch.testing.assert_close(g_pack, g_pad, rtol=1e-5, atol=1e-7)


def test_micro_batches_4x1_equal_2x2():
    model = build_model("tiny-llama").eval()
    feats = make_features([3, 20, 4, 6], with_labels=True, seed=5)  # unequal token counts per half
    collate = PackingCollator(model_free=True, max_length=24)
    _, g_whole = _step(model, [collate(feats)])
    _, g_split = _step(model, [collate(feats[:2]), collate(feats[2:])])
    torch.testing.assert_close(g_split, g_whole, rtol=1e-5, atol=1e-7)
    # per-micro-batch mean (what a naive loop does) weights tokens differently: the check can fail
    model.zero_grad(set_to_none=True)
    for part in (feats[:2], feats[2:]):
        batch = collate(part)
        (model_loss(model, batch, trained_tokens(batch["labels"])) / 2).backward()
    assert not torch.allclose(_grads(model), g_whole, rtol=1e-3)


def test_world_size_scales_for_ddp_averaging():
    logits = torch.randn(1, 4, 7)
    labels = torch.tensor([[1, 2, 3, 4]])
    one = causal_lm_loss(logits, labels, 3)
    two = causal_lm_loss(logits, labels, 6, world_size=2)
    torch.testing.assert_close(one, two)


def test_loss_bad_input():
    with pytest.raises(ValueError, match="do not match"):
        causal_lm_loss(torch.randn(1, 4, 7), torch.zeros(1, 3, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="no trained token"):
        causal_lm_loss(torch.randn(1, 4, 7), torch.full((1, 4), -100), 0)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("packed", [False, True])
def test_trained_logits_only_gives_the_same_loss_and_gradients(family, packed):
    model = build_model(f"tiny-{family}").eval()
    feats = make_features(LENGTHS, with_labels=True, seed=7)  # prompt-like prefixes masked
    batch = (PackingCollator(model_free=True, max_length=24) if packed else PaddingCollator())(feats)
    n = step_num_items([batch])
    grads = []
    for only in (False, True):
        model.zero_grad(set_to_none=True)
        loss = model_loss(model, batch, n, trained_logits_only=only)
        loss.backward()
        grads.append((loss.detach(), _grads(model)))
    torch.testing.assert_close(grads[1][0], grads[0][0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grads[1][1], grads[0][1], rtol=1e-5, atol=1e-7)


def test_trained_logits_only_with_nothing_trained_is_zero():
    model = build_model("tiny-gpt2")
    batch = PaddingCollator()([{"input_ids": [1, 2, 3], "labels": [-100, -100, -100]}])
    loss = model_loss(model, batch, 5, trained_logits_only=True)
    assert loss.item() == 0.0
    loss.backward()  # the graph is intact


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("packed", [False, True])
def test_trained_logits_only_runs_the_head_on_trained_tokens_only(family, packed):
    """Padded or packed, the LM head sees exactly the step's trained tokens: the same head work for
    every strategy (not the union of trained positions across rows)."""
    model = build_model(f"tiny-{family}").eval()
    feats = make_features(LENGTHS, with_labels=True, seed=7)
    batch = (PackingCollator(model_free=True, max_length=24) if packed else PaddingCollator())(feats)
    rows = []
    handle = model.get_output_embeddings().register_forward_hook(lambda m, a, out: rows.append(out.shape[:-1]))
    try:
        model_loss(model, batch, step_num_items([batch]), trained_logits_only=True)
    finally:
        handle.remove()
    assert rows == [torch.Size([trained_tokens(batch["labels"]).item()])]


def test_trained_logits_only_falls_back_to_every_logit_without_an_output_embedding(monkeypatch):
    model = build_model("tiny-llama").eval()
    batch = PaddingCollator()(make_features(LENGTHS, with_labels=True, seed=7))
    n = step_num_items([batch])
    full = model_loss(model, batch, n)
    monkeypatch.setattr(type(model), "get_output_embeddings", lambda self: None)
    torch.testing.assert_close(model_loss(model, batch, n, trained_logits_only=True), full)


def test_trained_logits_only_through_a_wrapper_calls_the_wrapper():
    """DistributedDataParallel syncs gradients only when its own forward runs: the gathered head must
    not bypass it (the wrapper's ``module`` is where the head is found)."""
    model = build_model("tiny-gpt2").eval()

    class Wrapper(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module, self.calls = module, 0

        def forward(self, **kw):
            self.calls += 1
            return self.module(**kw)

    wrapped = Wrapper(model)
    batch = PaddingCollator()(make_features(LENGTHS, with_labels=True, seed=7))
    n = step_num_items([batch])
    torch.testing.assert_close(model_loss(wrapped, batch, n, trained_logits_only=True), model_loss(model, batch, n))
    assert wrapped.calls == 1


def test_loss_keeps_float64_and_lifts_half_precision_to_float32():
    logits = torch.randn(2, 5, 7, dtype=torch.float64)
    labels = torch.randint(0, 7, (2, 5))
    loss = causal_lm_loss(logits, labels, trained_tokens(labels))
    assert loss.dtype == torch.float64
    want = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 7), labels[:, 1:].reshape(-1))
    torch.testing.assert_close(loss, want, rtol=0, atol=1e-14)
    assert causal_lm_loss(logits.bfloat16(), labels, trained_tokens(labels)).dtype == torch.float32


def test_trained_logits_is_public_and_gathers_the_trained_positions():
    from padless.objectives.loss import trained_logits

    model = build_model("tiny-llama").eval()
    ids = torch.randint(0, 512, (2, 6))
    picked = torch.zeros(2, 6, dtype=torch.bool)
    picked[0, 1] = picked[1, 4] = True
    with torch.no_grad():
        full = model(input_ids=ids).logits
        got = trained_logits(model, {"input_ids": ids}, picked)
    torch.testing.assert_close(got, full[picked], rtol=1e-5, atol=1e-5)
