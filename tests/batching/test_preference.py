"""Preference pairs and rollout groups: the tree mask and padless tree attention against the dense
reference; both layouts on sdpa, eager and padless against every completion run alone (GPT-2 with
learned positions, Llama with RoPE); refusals and bad input; dpo_loss against TRL's DPOTrainer."""

from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import padless
from padless.attention.backend import register_padless_attention
from padless.attention.masks import block_causal_mask
from padless.attention.tree import (
    additive_tree_mask,
    plan_tree,
    reference_tree_attention,
    shared_prompt_refusal,
    tree_attention,
    tree_causal_mask,
    tree_positions,
)
from padless.batching.batch import batch_to
from padless.batching.preference import (
    PairedBatch,
    PreferenceCollator,
    RolloutCollator,
    share_prompt,
)
from padless.batching.rowformat import FeatureSpec
from padless.layout import IGNORE_INDEX, cu_seqlens_from_lengths, position_ids_from_lengths
from padless.models.factory import build_model
from padless.objectives.dpo import dpo_loss

VOCAB = 512
BACKENDS = ("sdpa", "eager", "padless")


def _pairs(n, seed=0, prompt=(1, 9), completion=(1, 7)):
    rng = np.random.default_rng(seed)
    draw = lambda lo_hi: rng.integers(0, VOCAB, int(rng.integers(*lo_hi))).tolist()  # noqa: E731
    return [
        {"prompt_ids": draw(prompt), "chosen_ids": draw(completion), "rejected_ids": draw(completion)} for _ in range(n)
    ]


def _alone(model, prompt, completion):
    """Per-token log-probs of ``completion`` after ``prompt``, the sequence run by itself (the oracle)."""
    ids = torch.tensor([list(prompt) + list(completion)])
    logp = model(input_ids=ids, use_cache=False).logits[0].float().log_softmax(-1)  # [P + C, V]
    p = len(prompt)
    return logp[p - 1 : p - 1 + len(completion)].gather(1, torch.tensor(completion)[:, None])[:, 0]


def _packed(model, batch):
    """Per-token log-probs of every feature of a packed batch, read through its placements (a private
    stand-in for padless.sequence_logprobs): the first token from ``prev_offset``, the rest shifted."""
    logp = model(**{k: v for k, v in batch.items() if k != "labels"}).logits.float().log_softmax(-1)
    pl = batch.placements
    out = [None] * pl.num_features
    for f, r, o, n, prev in zip(pl.feature, pl.row, pl.offset, pl.length, pl.prev_offset):
        src = torch.tensor([prev, *range(o, o + n - 1)])
        assert (batch["labels"][r, o : o + n] != IGNORE_INDEX).all()
        out[int(f)] = logp[r, src].gather(1, batch["labels"][r, o : o + n][:, None])[:, 0]
    return out


def _model(family, backend, seed=0):
    if backend == "padless":
        register_padless_attention()
    return build_model(f"tiny-{family}", attn_implementation=backend, seed=seed).eval()


# --------------------------------------------------------------------------------- tree layouts


def test_tree_mask_and_positions_literal():
    # prompt of 3, completions of 2 and 1 (the module docstring's diagram)
    want = np.array(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [1, 1, 1, 1, 0, 0],
            [1, 1, 1, 1, 1, 0],
            [1, 1, 1, 0, 0, 1],
        ],
        dtype=bool,
    )
    np.testing.assert_array_equal(tree_causal_mask([3, 2, 1], [-1, 0, 0]), want)
    np.testing.assert_array_equal(tree_positions([3, 2, 1], [-1, 0, 0]), [0, 1, 2, 3, 4, 3])
    # all parents -1: the plain block-causal mask
    np.testing.assert_array_equal(tree_causal_mask([2, 3], [-1, -1]), block_causal_mask([2, 3]))
    mask = additive_tree_mask([([3, 2, 1], [-1, 0, 0])], dtype=torch.float64)
    assert mask.shape == (1, 1, 6, 6) and mask.dtype == torch.float64
    np.testing.assert_array_equal((mask[0, 0] == 0).numpy(), want)


def test_share_prompt_literal():
    g = share_prompt([7, 8, 9], [[1, 2], [3]])
    assert g.input_ids.tolist() == [7, 8, 9, 1, 2, 3]
    assert g.position_ids.tolist() == [0, 1, 2, 3, 4, 3]
    assert g.labels.tolist() == [-100, -100, -100, 1, 2, 3]
    assert g.completion_offsets.tolist() == [3, 5] and g.prev_offsets.tolist() == [2, 2]
    with pytest.raises(ValueError, match="completion_ids\\[1\\] is an empty sequence"):
        share_prompt([7], [[1], []])


def test_bad_trees_are_refused():
    with pytest.raises(ValueError, match="parent must be -1 or an earlier segment"):
        tree_causal_mask([2, 2], [1, -1])
    with pytest.raises(ValueError, match="segment 1 is empty"):
        tree_positions([2, 0], [-1, 0])


@st.composite
def _trees(draw):
    n = draw(st.integers(1, 7))
    lengths = [draw(st.integers(1, 9)) for _ in range(n)]
    parents = [draw(st.integers(-1, s - 1)) for s in range(n)]  # any earlier segment: depth > 1 too
    return lengths, parents


def _tree_qkv(lengths, hq, hk, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = sum(lengths)
    return [torch.randn(t, h, 8, generator=g).requires_grad_() for h in (hq, hk, hk)]


@settings(max_examples=40, deadline=None)
@given(_trees(), st.sampled_from([(4, 4), (4, 2), (2, 1)]), st.sampled_from([None, 1, 3]))
def test_tree_attention_matches_the_dense_reference(tree, heads, window):
    lengths, parents = tree
    q, k, v = _tree_qkv(lengths, *heads)
    cu = torch.from_numpy(cu_seqlens_from_lengths(lengths)).to(torch.int32)
    par = torch.tensor(parents)
    out = tree_attention(q, k, v, cu, par, sliding_window=window)
    ref = reference_tree_attention(q, k, v, cu, par, sliding_window=window)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)
    grad = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1))
    for a, b in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(ref, (q, k, v), grad)):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5)


def test_tree_plan_places_every_token_once():
    cu = cu_seqlens_from_lengths([5, 3, 1, 4, 2])
    plan = plan_tree(cu, np.array([-1, 0, 0, -1, 3]), "cpu")
    slots = plan.scatter.numpy()
    assert len(set(slots.tolist())) == slots.size == 15
    np.testing.assert_array_equal(plan.q_gather.numpy()[slots], np.arange(15))  # each slot reads its own token
    np.testing.assert_array_equal(plan.first_position, [0, 5, 5, 0, 4])


# ------------------------------------------------------------------------ collators vs alone


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shared", [True, False])
def test_pairs_equal_each_sequence_alone(family, backend, shared):
    model = _model(family, backend)
    feats = _pairs(7)
    collator = PreferenceCollator.for_model(model, max_length=28, share_prompt=shared)
    batch = collator(feats)
    assert isinstance(batch, PairedBatch) and batch.pairs
    expected_keys = {"input_ids", "labels", "position_ids", "use_cache"}
    expected_keys |= (
        {"attention_mask"}
        if backend != "padless"
        else (
            {"tree_cu_seqlens", "tree_parents"}
            if shared
            else {"cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"}
        )
    )
    assert set(batch) == expected_keys
    assert batch["input_ids"].shape[1] <= 28 and batch.placements.num_features == 14
    with torch.no_grad():
        got = _packed(model, batch)
        for i, f in enumerate(feats):
            for j, key in enumerate(("chosen_ids", "rejected_ids")):
                torch.testing.assert_close(got[2 * i + j], _alone(model, f["prompt_ids"], f[key]), atol=1e-5, rtol=1e-5)


def test_shared_prompt_saves_the_repeated_prompts():
    feats = _pairs(6)
    shared = PreferenceCollator(share_prompt=True)(feats)
    independent = PreferenceCollator(share_prompt=False)(feats)
    prompts = sum(len(f["prompt_ids"]) for f in feats)
    assert independent["input_ids"].numel() - shared["input_ids"].numel() == prompts


def test_the_tree_is_needed():
    """The negative control: a shared-prompt row with only its position_ids (no tree mask) lets the
    second completion lose its prompt; the comparison above would catch it."""
    model = _model("llama", "sdpa")
    feats = _pairs(3, prompt=(4, 6))
    batch = PreferenceCollator.for_model(model, share_prompt=True)(feats)
    del batch["attention_mask"]
    with torch.no_grad():
        got = _packed(model, batch)
        worst = max(
            (got[2 * i + 1] - _alone(model, f["prompt_ids"], f["rejected_ids"])).abs().max().item()
            for i, f in enumerate(feats)
        )
    assert worst > 1e-2


@pytest.mark.parametrize("backend", BACKENDS)
def test_rollout_groups_per_token_equal_each_alone(backend):
    model = _model("llama", backend)
    rng = np.random.default_rng(3)
    groups = [
        {
            "prompt_ids": rng.integers(0, VOCAB, int(rng.integers(2, 10))).tolist(),
            "completion_ids": [rng.integers(0, VOCAB, int(rng.integers(1, 8))).tolist() for _ in range(k)],
        }
        for k in (4, 1, 3, 4)
    ]
    batch = RolloutCollator.for_model(model, max_length=40)(groups)
    assert not batch.pairs and batch.placements.num_features == 12
    with torch.no_grad():
        got = _packed(model, batch)
        flat = [(g["prompt_ids"], c) for g in groups for c in g["completion_ids"]]
        for i, (prompt, comp) in enumerate(flat):
            torch.testing.assert_close(got[i], _alone(model, prompt, comp), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["sdpa", "padless"])
def test_shared_prompt_rollouts_read_by_sequence_logprobs_equal_each_alone(backend):
    """The public read-back on a shared-prompt tree (sdpa carries it as a 4D mask, padless as tree
    offsets): the batch check lets the tree through, and every completion's per-token log-probs are
    its own run's. The sdpa case was once refused by the block check that judges document masks."""
    model = _model("llama", backend)
    rng = np.random.default_rng(5)
    groups = [
        {
            "prompt_ids": rng.integers(0, VOCAB, int(rng.integers(2, 9))).tolist(),
            "completion_ids": [rng.integers(0, VOCAB, int(rng.integers(1, 7))).tolist() for _ in range(k)],
        }
        for k in (3, 2)
    ]
    batch = RolloutCollator.for_model(model, max_length=40, share_prompt=True)(groups)
    with torch.no_grad():
        _, tokens = padless.sequence_logprobs(model, batch, per_token=True)
        flat = [(g["prompt_ids"], c) for g in groups for c in g["completion_ids"]]
        assert len(tokens) == len(flat)
        for got, (prompt, comp) in zip(tokens, flat):
            torch.testing.assert_close(got, _alone(model, prompt, comp), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["sdpa", "padless"])
def test_dpo_gradients_packed_equal_unpacked(backend):
    """The DPO loss from a shared-prompt packed batch has the gradients of the same loss computed on
    every sequence alone (the tree kernel's backward inside the model, for padless)."""
    model = _model("llama", backend)
    feats = _pairs(5)
    ref = torch.randn(5, 2, generator=torch.Generator().manual_seed(0))
    batch = PreferenceCollator.for_model(model, max_length=32)(feats)
    policy = torch.stack([t.sum() for t in _packed(model, batch)]).view(-1, 2)
    grads = torch.autograd.grad(dpo_loss(policy, ref), list(model.parameters()))
    alone = torch.stack(
        [_alone(model, f["prompt_ids"], f[k]).sum() for f in feats for k in ("chosen_ids", "rejected_ids")]
    )
    want = torch.autograd.grad(dpo_loss(alone.view(-1, 2), ref), list(model.parameters()))
    for a, b in zip(grads, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_batch_to_keeps_the_pair_batch():
    batch = PreferenceCollator()(_pairs(2))
    moved = batch_to(batch, "cpu")
    assert isinstance(moved, PairedBatch) and moved.pairs and moved.placements is batch.placements


def test_placements_cover_every_completion_once():
    feats = _pairs(9, seed=4)
    for shared in (True, False):
        batch = PreferenceCollator(max_length=28, share_prompt=shared)(feats)
        pl = batch.placements
        assert sorted(pl.feature.tolist()) == list(range(18))
        for f, r, o, n in zip(pl.feature, pl.row, pl.offset, pl.length):
            key = "chosen_ids" if f % 2 == 0 else "rejected_ids"
            assert batch["input_ids"][r, o : o + n].tolist() == feats[f // 2][key]
        # the planner never splits a pair: both completions of a pair sit in one row
        assert (pl.row[np.argsort(pl.feature)][0::2] == pl.row[np.argsort(pl.feature)][1::2]).all()


def test_separator_is_appended_to_every_completion_and_trained():
    batch = PreferenceCollator(features=FeatureSpec(separator_id=5))(
        [{"prompt_ids": [1], "chosen_ids": [2], "rejected_ids": [3, 5]}]
    )
    assert batch["input_ids"][0].tolist() == [1, 2, 5, 3, 5]
    assert batch["labels"][0].tolist() == [-100, 2, 5, 3, 5]


# --------------------------------------------------------------------------- overlong, refusals


def test_overlong_policies_are_counted():
    feats = [{"prompt_ids": list(range(10)), "chosen_ids": [1] * 6, "rejected_ids": [2] * 3},
             {"prompt_ids": [3, 4], "chosen_ids": [5], "rejected_ids": [6]}]  # fmt: skip
    with pytest.raises(ValueError, match="group 0 needs 19 tokens .* choose overlong"):
        PreferenceCollator(max_length=12)(feats)
    drop = PreferenceCollator(max_length=12, overlong="drop")
    batch = drop(feats)
    assert batch.kept.tolist() == [1] and batch.placements.num_features == 2
    assert drop.totals["dropped_groups"] == 1 and drop.totals["dropped_tokens"] == 19
    for shared in (True, False):
        trunc = PreferenceCollator(max_length=12, overlong="truncate", share_prompt=shared)
        batch = trunc(feats)
        assert batch["input_ids"].shape[1] <= 12 and trunc.totals["truncated_groups"] == 1
        assert trunc.totals["truncated_tokens"] == 19 - (
            batch.placements.length[:2].sum() + (12 - batch.placements.length[:2].sum()) // (1 if shared else 2)
        )  # noqa: E501


def test_truncated_pairs_stay_exact():
    model = _model("llama", "padless")
    feats = _pairs(4, prompt=(10, 14), completion=(6, 9))
    batch = PreferenceCollator.for_model(model, max_length=16, overlong="truncate")(feats)
    pl = batch.placements
    with torch.no_grad():
        got = _packed(model, batch)
        for f in range(pl.num_features):
            ((_, r, o, n),) = pl.of_feature(f)
            prev = int(pl.prev_offset[pl.feature == f][0])
            prompt_start = int(np.flatnonzero(batch["position_ids"][r, : prev + 1].numpy() == 0)[-1])
            prompt = batch["input_ids"][r, prompt_start : prev + 1].tolist()
            torch.testing.assert_close(
                got[f], _alone(model, prompt, batch["input_ids"][r, o : o + n].tolist()), atol=1e-5, rtol=1e-5
            )  # noqa: E501


@pytest.mark.parametrize("backend", ["flash_attention_2", "flex_attention", "something_else"])
def test_shared_prompt_is_refused_where_it_cannot_be_expressed(backend):
    assert shared_prompt_refusal(backend) is not None
    model = SimpleNamespace(config=SimpleNamespace(_attn_implementation=backend, vocab_size=VOCAB), dtype=torch.float32)
    with pytest.raises(
        ValueError, match=f"attention backend '{backend}' cannot guarantee|unknown attention backend '{backend}'"
    ):
        PreferenceCollator.for_model(model)
    if backend in BACKENDS:  # the one rule refuses the tree even where plain packing would be exact
        from padless.attention.select import _reason, _target

        assert _reason(_target(None, "cpu", torch.float32, None, "shared_prompt"), backend) is not None
    assert all(shared_prompt_refusal(b) is None for b in BACKENDS)


def test_padless_attention_refuses_a_tree_that_disagrees_with_the_positions():
    model = _model("llama", "padless")
    batch = PreferenceCollator.for_model(model)(_pairs(2))
    batch["position_ids"] = position_ids_from_lengths([batch["input_ids"].shape[1]])[None]
    batch["position_ids"] = torch.from_numpy(batch["position_ids"])
    with pytest.raises(ValueError, match="position_ids disagree with the shared-prefix tree"):
        model(**{k: v for k, v in batch.items() if k != "labels"})


@pytest.mark.parametrize(
    "features, kwargs, message",
    [
        ([{"prompt_ids": [1], "chosen_ids": [2]}], {}, "feature 0 has no 'rejected_ids'"),
        ([[1, 2, 3]], {}, "feature 0 is a list, expected a mapping"),
        ([{"prompt_ids": [1], "chosen_ids": [], "rejected_ids": [3]}], {}, "feature 0 chosen_ids is an empty sequence"),
        ([{"prompt_ids": [], "chosen_ids": [2], "rejected_ids": [3]}], {}, "feature 0 prompt_ids is an empty sequence"),
        ([{"prompt_ids": [1], "chosen_ids": [2], "rejected_ids": [VOCAB]}], {"features": FeatureSpec(vocab_size=VOCAB)},
         "rejected_ids: token id 512 is outside the vocabulary"),
        ([], {}, "the batch is empty"),
        (None, {"overlong": "split"}, "never splits across rows"),
        (None, {"strategy": "wrapped"}, "a group never splits"),
        (None, {"attention": "position_ids"}, "position_ids alone cannot say"),
        (None, {"max_length": 0}, "max_length must be an integer >= 1"),
        ([{"prompt_ids": [1, 2], "chosen_ids": [2, 3], "rejected_ids": [3]}], {"max_length": 2, "overlong": "truncate"},
         "cannot hold one prompt token and one token of each of 2 completions"),
    ],
)  # fmt: skip
def test_bad_input(features, kwargs, message):
    with pytest.raises(ValueError, match=message):
        PreferenceCollator(**kwargs)(features)


def test_bad_rollout_input():
    with pytest.raises(ValueError, match="completion_ids must be a non-empty list"):
        RolloutCollator()([{"prompt_ids": [1], "completion_ids": []}])
    with pytest.raises(ValueError, match="feature 0 has no 'completion_ids'"):
        RolloutCollator()([{"prompt_ids": [1]}])


# ---------------------------------------------------------------------------------------- DPO


def test_dpo_loss_literal_and_conventions():
    pc, pr, rc, rr = (torch.tensor(x) for x in ([-3.0, -1.0], [-4.0, -1.5], [-3.5, -1.2], [-3.5, -1.2]))
    margin = (pc - rc) - (pr - rr)
    want = -torch.nn.functional.logsigmoid(0.5 * margin)
    torch.testing.assert_close(dpo_loss(pc, pr, rc, rr, beta=0.5, reduction="none"), want)
    torch.testing.assert_close(dpo_loss(torch.stack([pc, pr], 1), torch.stack([rc, rr], 1), beta=0.5), want.mean())
    torch.testing.assert_close(dpo_loss(pc, pr, rc, rr, beta=0.5, reduction="sum"), want.sum())
    with pytest.raises(ValueError, match="must be \\[num_pairs, 2\\]"):
        dpo_loss(pc, pr)
    with pytest.raises(ValueError, match="give ref_chosen and ref_rejected together"):
        dpo_loss(pc, pr, rc)
    with pytest.raises(ValueError, match="beta must be > 0"):
        dpo_loss(pc, pr, rc, rr, beta=0.0)


class _TRLModel:
    """What TRL's DPOTrainer reads from its patched model output (``log_probs`` of the labels, shifted),
    computed from a plain transformers model on TRL's own padded batch."""

    def __init__(self, model):
        self.model = model

    def __call__(self, input_ids, attention_mask, labels, **kwargs):
        logp = (
            self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
            .logits.float()
            .log_softmax(-1)
        )
        target = labels[:, 1:]
        per_token = logp[:, :-1].gather(2, target.clamp(min=0)[..., None])[..., 0] * (target != IGNORE_INDEX)
        zeros = torch.zeros_like(per_token)
        return SimpleNamespace(log_probs=per_token, entropy=zeros, mean_logits=zeros, is_top1=zeros.bool())


class _TrainingStandIn(torch.nn.Module):
    """The policy as DPOTrainer._compute_loss inspects it (its forward is the ``model`` argument)."""

    is_gradient_checkpointing = False


@pytest.mark.parametrize("shared", [True, False])
def test_dpo_loss_equals_trl(shared):
    pytest.importorskip("trl")
    from trl.trainer.dpo_trainer import DataCollatorForPreference, DPOTrainer

    policy, reference = _model("llama", "sdpa", seed=0), _model("llama", "sdpa", seed=1)
    feats = _pairs(6, seed=2)
    trainer = SimpleNamespace(
        # a real Module: with peft installed, TRL asks accelerate whether it is a PeftModel (reads _modules)
        model=_TrainingStandIn(),
        ref_model=_TRLModel(reference),
        accelerator=SimpleNamespace(device=torch.device("cpu"), gather_for_metrics=lambda x: x, gather=lambda x: x),
        aux_loss_enabled=False,
        precompute_ref_logps=False,
        ld_alpha=None,
        f_divergence_type="reverse_kl",
        loss_types=["sigmoid"],
        loss_weights=[1.0],
        beta=0.1,
        use_weighting=False,
        _metrics=defaultdict(lambda: defaultdict(list)),
        _total_train_tokens=0,
        _tp_size=1,
        args=SimpleNamespace(gradient_checkpointing_kwargs=None),
    )
    with torch.no_grad():
        want = DPOTrainer._compute_loss(
            trainer, _TRLModel(policy), DataCollatorForPreference(pad_token_id=0)(feats), False
        )
        batch = PreferenceCollator.for_model(policy, max_length=28, share_prompt=shared)(feats)
        got = dpo_loss(*(torch.stack([t.sum() for t in _packed(m, batch)]).view(-1, 2) for m in (policy, reference)))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


# ------------------------------------------------------------------------------------- verify


def test_verify_checks_the_shared_prompt_layout():
    report = padless.verify_isolation(build_model("tiny-llama"), backends=["sdpa", "padless", "flash_attention_2"])
    by_name = {r.backend: r for r in report.results}
    assert report.passed
    for backend in ("sdpa+shared_prompt", "padless+shared_prompt"):
        assert by_name[backend].status == "pass" and by_name[backend].max_logit_diff < 1e-5, by_name[backend]
    assert by_name["flash_attention_2+shared_prompt"].status == "refused"


def test_verify_fails_a_shared_prompt_layout_without_the_tree(monkeypatch):
    """Completions that cannot see their prompt (a plain block-causal mask) must fail the check."""
    import padless.attention.tree as tree

    monkeypatch.setattr(tree, "tree_causal_mask", lambda lengths, parents: block_causal_mask(lengths))
    report = padless.verify_isolation(build_model("tiny-llama"), backends=["sdpa"])
    by_name = {r.backend: r for r in report.results}
    assert by_name["sdpa"].status == "pass" and by_name["sdpa+shared_prompt"].status == "fail"
    assert not report.passed


def test_a_batch_built_for_another_backend_is_refused():
    from padless.batching.preference import check_batch_for_model

    sdpa, padless_model = _model("llama", "sdpa"), _model("llama", "padless")
    for_padless = PreferenceCollator.for_model(padless_model)(_pairs(2))
    for_sdpa = PreferenceCollator.for_model(sdpa)(_pairs(2))
    check_batch_for_model(padless_model, for_padless)
    check_batch_for_model(sdpa, for_sdpa)
    with pytest.raises(ValueError, match="which attn_implementation='sdpa' ignores"):
        check_batch_for_model(sdpa, for_padless)
    with pytest.raises(ValueError, match="carries a 4D mask for sdpa/eager, but the model uses 'padless'"):
        check_batch_for_model(padless_model, for_sdpa)
    del for_sdpa["attention_mask"]
    with pytest.raises(ValueError, match="neither a tree mask nor tree kwargs"):
        check_batch_for_model(sdpa, for_sdpa)
    independent = PreferenceCollator(share_prompt=False, attention="position_ids")(_pairs(2))
    check_batch_for_model(sdpa, independent)  # plain packing: transformers reads documents from position_ids


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 40), st.lists(st.integers(1, 30), min_size=1, max_size=5), st.integers(1, 80), st.booleans())
def test_truncation_fills_the_row_with_the_longest_common_cap(prompt, completions, max_length, shared):
    from padless.batching.groups import _fit

    sizes = np.array(completions)
    copies = 1 if shared else sizes.size
    if max_length - sizes.size < copies:  # not even one prompt token and one token per completion
        with pytest.raises(ValueError, match="cannot hold one prompt token"):
            _fit(prompt, sizes, max_length, copies)
        return
    p, cap = _fit(prompt, sizes, max_length, copies)
    used = lambda c: copies * p + int(np.minimum(sizes, c).sum())  # noqa: E731
    assert 1 <= p <= prompt and cap >= 1 and used(cap) <= max_length
    assert cap == sizes.max() or used(cap + 1) > max_length  # no longer cap would fit


@pytest.mark.parametrize("backend", ["sdpa", "padless"])
def test_padded_rows_stay_exact(backend):
    model = _model("gpt2", backend)
    feats = _pairs(3)
    batch = PreferenceCollator.for_model(model, max_length=48, pad_to_max_length=True, pad_to_multiple_of=64)(feats)
    assert batch["input_ids"].shape[1] == 64 and (batch["input_ids"][:, -1] == 0).all()
    with torch.no_grad():
        got = _packed(model, batch)
        for i, f in enumerate(feats):
            torch.testing.assert_close(
                got[2 * i + 1], _alone(model, f["prompt_ids"], f["rejected_ids"]), atol=1e-5, rtol=1e-5
            )


def test_sequence_logprobs_reads_pairs_and_refuses_a_tree_on_the_wrong_backend():
    """The merged sequence_logprobs on PreferenceCollator batches: [num_pairs, 2], equal to the
    private reference, and a padless-tree batch run on sdpa is refused instead of read wrongly."""
    model = _model("llama", "padless")
    batch = PreferenceCollator.for_model(model, share_prompt=True)(_pairs(3))
    with torch.no_grad():
        got = padless.sequence_logprobs(model, batch)
        ref = torch.stack([t.sum() for t in _packed(model, batch)])
    assert got.shape == (3, 2)
    torch.testing.assert_close(got.flatten(), ref, atol=1e-5, rtol=1e-5)
    model.set_attn_implementation("sdpa")
    with pytest.raises(ValueError, match="tree_cu_seqlens"):
        padless.sequence_logprobs(model, batch)
