"""sequence_logprobs: per-feature sums (and per-token values) of trained-token log-probs read from
packed rows equal each sequence run alone, on every backend padless packs with."""

import numpy as np
import pytest
import torch

import padless
from conftest import make_features
from padless.attention.backend import register_padless_attention
from padless.batching.batch import PackedBatch, Placements
from padless.batching.collate import PackingCollator, PaddingCollator
from padless.layout import IGNORE_INDEX
from padless.models.factory import build_model
from padless.objectives.logprobs import sequence_logprobs

LENGTHS = [5, 1, 17, 9, 3, 12, 2, 8]


def _alone(model, feature, masked_starts=()):
    """Log-probs of the trained tokens of one sequence run alone (no mask, no padding)."""
    ids = torch.tensor([feature["input_ids"]])
    labels = torch.tensor(feature.get("labels", feature["input_ids"])).clone()
    labels[list(masked_starts)] = IGNORE_INDEX
    with torch.no_grad():
        lp = model(input_ids=ids, use_cache=False).logits[0].float().log_softmax(-1)  # [n, V]
    t = torch.nonzero(labels[1:] != IGNORE_INDEX).squeeze(1) + 1
    return lp[t - 1, labels[t]]


def _model(family, backend):
    if backend == "padless":
        register_padless_attention()
    return build_model(f"tiny-{family}", attn_implementation=backend).eval()


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("backend", ["sdpa", "eager", "padless"])
def test_packed_equals_alone(family, backend):
    model = _model(family, backend)
    feats = make_features(LENGTHS, with_labels=True, seed=11)
    batch = PackingCollator.for_model(model, max_length=24)(feats)
    assert batch.placements is not None and batch["input_ids"].shape[0] > 1  # several rows
    with torch.no_grad():
        sums, tokens = sequence_logprobs(model, batch, per_token=True)
    assert sums.shape == (len(feats),) and sums.dtype == torch.float32
    for i, f in enumerate(feats):
        ref = _alone(model, f)
        torch.testing.assert_close(tokens[i], ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(sums[i], ref.sum(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_padded_batch_equals_alone_and_packed(family):
    model = _model(family, "sdpa")
    feats = make_features(LENGTHS, with_labels=True, seed=12)
    with torch.no_grad():
        padded = sequence_logprobs(model, PaddingCollator(pad_token_id=7)(feats))
        packed = sequence_logprobs(model, PackingCollator.for_model(model, max_length=24)(feats))
    ref = torch.stack([_alone(model, f).sum() for f in feats])
    torch.testing.assert_close(padded, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed, padded, rtol=1e-5, atol=1e-5)


def test_split_features_are_refused():
    """A split feature's later pieces do not see the tokens before them: refused, never a wrong sum;
    the same tokens packed without splitting are accepted."""
    model = _model("llama", "sdpa")
    feats = make_features([30, 7], seed=13)
    with pytest.raises(ValueError, match="feature 0 was split into pieces"):
        sequence_logprobs(model, PackingCollator.for_model(model, max_length=12, overlong="split")(feats))
    sums = sequence_logprobs(model, PackingCollator.for_model(model, max_length=32, overlong="split")(feats))
    torch.testing.assert_close(sums, torch.stack([_alone(model, f).sum() for f in feats]), rtol=1e-5, atol=1e-5)


def test_gradients_flow_and_equal_padded():
    model = _model("gpt2", "sdpa")
    feats = make_features(LENGTHS, with_labels=True, seed=14)
    grads = []
    for collate in (PaddingCollator(), PackingCollator.for_model(model, max_length=24)):
        model.zero_grad(set_to_none=True)
        sequence_logprobs(model, collate(feats)).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-6)


def test_dropped_feature_is_nan_and_empty():
    model = _model("gpt2", "sdpa")
    feats = make_features([5, 40, 6], seed=15)
    batch = PackingCollator.for_model(model, max_length=16, overlong="drop")(feats)
    with torch.no_grad():
        sums, tokens = sequence_logprobs(model, batch, per_token=True)
    assert torch.isnan(sums[1]) and tokens[1].numel() == 0
    assert torch.isfinite(sums[[0, 2]]).all() and [t.numel() for t in tokens] == [4, 0, 5]


def _literal_batch(prev_offset, labels, pairs=False):
    """One row of 6 tokens holding three pieces (features 0, 1, 2) with hand-set logits."""
    placements = Placements(
        feature=np.array([0, 1, 2]),
        start=np.zeros(3, np.int64),
        row=np.zeros(3, np.int64),
        offset=np.array([0, 2, 4]),
        length=np.array([2, 2, 2]),
        num_features=3 + pairs,
        prev_offset=prev_offset,
    )
    batch = PackedBatch(
        {"input_ids": torch.zeros(1, 6, dtype=torch.long), "labels": torch.tensor([labels])}, placements
    )
    if pairs:
        batch.pairs = True
    return batch


def test_prev_offset_picks_the_predicting_position():
    """A shared-prompt layout: features 1 and 2 start after the prompt's last token (offset 1)."""
    logits = torch.randn(1, 6, 5)
    lp = logits[0].log_softmax(-1)
    labels = [-100, 3, 2, 4, 1, 0]  # prompt [0, 2): its second token trained; completions fully trained
    sums, tokens = sequence_logprobs(None, _literal_batch(np.array([-1, 1, 1]), labels), logits=logits, per_token=True)
    torch.testing.assert_close(tokens[0], lp[[0], [3]])
    torch.testing.assert_close(tokens[1], torch.stack([lp[1, 2], lp[2, 4]]))
    torch.testing.assert_close(tokens[2], torch.stack([lp[1, 1], lp[4, 0]]))
    torch.testing.assert_close(sums, torch.stack([t.sum() for t in tokens]))
    with pytest.raises(ValueError, match="nothing predicts it"):
        sequence_logprobs(None, _literal_batch(None, labels), logits=logits)


def test_pairs_reshape_and_nest():
    logits = torch.randn(1, 6, 5)
    batch = _literal_batch(np.array([-1, 1, 1]), [-100, 3, 2, 4, 1, 0], pairs=True)  # feature 3: dropped
    sums, tokens = sequence_logprobs(None, batch, logits=logits, per_token=True)
    assert sums.shape == (2, 2) and torch.isnan(sums[1, 1]) and len(tokens) == 2
    assert [len(p) for p in tokens] == [2, 2] and tokens[1][1].numel() == 0
    flat = sequence_logprobs(None, _literal_batch(np.array([-1, 1, 1]), [-100, 3, 2, 4, 1, 0]), logits=logits)
    torch.testing.assert_close(sums.flatten()[:3], flat)


def test_a_packed_batch_without_placements_is_refused():
    model = _model("gpt2", "sdpa")
    batch = PackingCollator.for_model(model, max_length=24)(make_features([4, 5]))
    with pytest.raises(ValueError, match="has no placements"):
        sequence_logprobs(model, dict(batch))


def test_exported():
    assert padless.sequence_logprobs is sequence_logprobs


@pytest.mark.parametrize("packed", [False, True])
def test_trained_logits_only_gives_the_same_values_and_gradients(packed):
    model = _model("llama", "sdpa")
    feats = make_features(LENGTHS, with_labels=True, seed=16)
    batch = (PackingCollator.for_model(model, max_length=24) if packed else PaddingCollator())(feats)
    out = []
    for only in (False, True):
        model.zero_grad(set_to_none=True)
        sums = sequence_logprobs(model, batch, trained_logits_only=only)
        sums.sum().backward()
        out.append((sums.detach(), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])))
    torch.testing.assert_close(out[1][0], out[0][0], rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(out[1][1], out[0][1], rtol=1e-5, atol=1e-7)


def test_float64_logits_stay_float64():
    """A float64 model (the verifier's oracle) is not rounded through float32: per-token log-probs
    equal the float64 run alone to 1e-12 (a float32 cast would leave ~1e-7)."""
    model = build_model("tiny-llama", dtype=torch.float64).eval()
    feats = make_features(LENGTHS, with_labels=True, seed=12)
    batch = PackingCollator.for_model(model, max_length=24)(feats)
    with torch.no_grad():
        sums, tokens = sequence_logprobs(model, batch, per_token=True)
    assert sums.dtype == torch.float64
    for i, f in enumerate(feats):
        ids = torch.tensor([f["input_ids"]])
        with torch.no_grad():
            lp = model(input_ids=ids, use_cache=False).logits[0].log_softmax(-1)
        labels = torch.tensor(f["labels"])
        t = torch.nonzero(labels[1:] != IGNORE_INDEX).squeeze(1) + 1
        torch.testing.assert_close(tokens[i], lp[t - 1, labels[t]], rtol=0, atol=1e-12)
