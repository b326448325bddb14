"""rollout_token_logprobs: TRL's ``(B, T)`` per-token log-probs (and entropies) of rollout completions,
read from packed rows, equal TRL 1.16's own padded computation (left-padded prompts, its fused LM head
dividing the logits by the temperature) and every completion run alone, in both layouts, on sdpa and
padless attention; fp32. The batch check runs inside: a batch built for another backend is refused."""

import numpy as np
import pytest
import torch

from padless.attention.backend import register_padless_attention
from padless.batching.preference import PreferenceCollator, RolloutCollator
from padless.models.factory import build_model
from padless.objectives.rollouts import TOKEN_STATS, completion_token_stats, rollout_token_logprobs

VOCAB = 512  # tiny-llama's vocabulary
TEMPERATURE = 0.7
GROUPS = [  # prompt length, completion lengths: groups of 3, 1 and 2 rollouts
    (5, [3, 7, 1]), (2, [4]), (9, [6, 2]),
]  # fmt: skip


def _groups(seed=0):
    rng = np.random.default_rng(seed)
    draw = lambda n: rng.integers(1, VOCAB, n).tolist()  # noqa: E731
    return [{"prompt_ids": draw(p), "completion_ids": [draw(c) for c in cs]} for p, cs in GROUPS]


def _model(backend):
    if backend == "padless":
        register_padless_attention()
    return build_model("tiny-llama", attn_implementation=backend).eval()


def _rollouts(groups):
    """The rollouts one by one, as TRL holds them: (prompt, completion) per row, prompts repeated."""
    return [(g["prompt_ids"], c) for g in groups for c in g["completion_ids"]]


def _trl_padded(model, groups, temperature, pad=-8):
    """TRL 1.16's padded pass (GRPOTrainer._get_per_token_logps_and_entropies): left-padded prompts,
    right-padded completions, the fused LM head TRL adds (logits / temperature), the last T positions.
    An odd pad id (-8 mod the vocabulary), so a pad that leaked into the computation would show."""
    import copy

    from trl.trainer.utils import add_fused_lm_head

    rows = _rollouts(groups)
    p, t = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
    ids = torch.full((len(rows), p + t), pad % VOCAB)
    mask = torch.zeros_like(ids)
    for b, (prompt, comp) in enumerate(rows):
        ids[b, p - len(prompt) : p] = torch.tensor(prompt)
        ids[b, p : p + len(comp)] = torch.tensor(comp)
        mask[b, p - len(prompt) : p + len(comp)] = 1
    fused = copy.deepcopy(model)
    add_fused_lm_head(fused, temperature=temperature, outputs=("log_probs", "entropy"))
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-t] = -100
    out = fused(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    return out.log_probs[:, -t:], out.entropy[:, -t:], mask[:, -t:].bool()


def _alone(model, prompt, completion, temperature):
    """Per-token log-probs and entropies of ``completion`` after ``prompt``, run by itself."""
    logits = model(input_ids=torch.tensor([prompt + completion]), use_cache=False).logits[0].float()
    z = logits[len(prompt) - 1 : len(prompt) - 1 + len(completion)] / temperature
    logp = z.log_softmax(-1)
    return logp.gather(1, torch.tensor(completion)[:, None])[:, 0], -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("backend", ["sdpa", "padless"])
@pytest.mark.parametrize("share", [False, True])
def test_equal_to_trls_padded_computation(backend, share):
    pytest.importorskip("trl")
    model, groups = _model(backend), _groups()
    batch = RolloutCollator.for_model(model, share_prompt=share)(groups)
    if share:  # the layout really shares: later completions are predicted from their prompt's last token
        pl = batch.placements
        assert (pl.prev_offset != pl.offset - 1).any()
    with torch.no_grad():
        logps, mask, ent = rollout_token_logprobs(model, batch, temperature=TEMPERATURE, entropies=True)
        # TRL's padded rows need sdpa (padless attention refuses left padding): the same weights (seed 0)
        want_logps, want_ent, want_mask = _trl_padded(_model("sdpa"), groups, TEMPERATURE)
    assert logps.shape == mask.shape == ent.shape == want_logps.shape == (6, 7)
    assert torch.equal(mask, want_mask)
    torch.testing.assert_close(logps, want_logps, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, want_ent, atol=1e-5, rtol=1e-5)
    assert (logps[~mask] == 0).all() and (ent[~mask] == 0).all()  # zeros where masked, as TRL's


@pytest.mark.parametrize("share", [False, True])
def test_equal_to_each_completion_alone_with_a_width(share):
    """Without TRL: every row against its completion run alone; ``width`` pads the columns."""
    model, groups = _model("sdpa"), _groups(seed=1)
    batch = RolloutCollator.for_model(model, share_prompt=share, max_length=26)(groups)
    assert batch["input_ids"].shape[0] > 1  # several packed rows
    with torch.no_grad():
        logps, mask, ent = rollout_token_logprobs(model, batch, width=10, temperature=TEMPERATURE, entropies=True)
        for b, (prompt, comp) in enumerate(_rollouts(groups)):
            lp, e = _alone(model, prompt, comp, TEMPERATURE)
            assert mask[b].tolist() == [True] * len(comp) + [False] * (10 - len(comp))
            torch.testing.assert_close(logps[b, : len(comp)], lp, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(ent[b, : len(comp)], e, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"width=5 is shorter than the longest completion of the batch \(7 tokens\)"):
        rollout_token_logprobs(model, batch, width=5)


def test_the_temperature_divides_the_logits():
    """The negative control: at temperature 1 the log-probs differ, so the comparison above sees it."""
    model, groups = _model("sdpa"), _groups()
    batch = RolloutCollator.for_model(model)(groups)
    with torch.no_grad():
        hot, mask = rollout_token_logprobs(model, batch, temperature=TEMPERATURE)
        plain, _ = rollout_token_logprobs(model, batch)
    assert (hot - plain)[mask].abs().max() > 1e-2


def test_gradients_flow_to_the_model():
    model, groups = _model("sdpa"), _groups()
    logps, mask, ent = rollout_token_logprobs(model, RolloutCollator.for_model(model)(groups), entropies=True)
    (logps.sum() + ent.sum()).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.named_parameters() if "layers.0." in n)


def test_every_trl_field_for_preference_pairs():
    """All of TRL's per-token fields on a pair batch: feature 2i chosen, 2i + 1 rejected."""
    model = _model("sdpa")
    rng = np.random.default_rng(2)
    pairs = [
        {
            "prompt_ids": rng.integers(1, VOCAB, p).tolist(),
            "chosen_ids": rng.integers(1, VOCAB, c).tolist(),
            "rejected_ids": rng.integers(1, VOCAB, r).tolist(),
        }
        for p, c, r in [(3, 4, 2), (6, 1, 5)]
    ]
    with torch.no_grad():
        stats = completion_token_stats(model, PreferenceCollator.for_model(model)(pairs), outputs=TOKEN_STATS)
        for i, pair in enumerate(pairs):
            for j, key in enumerate(("chosen_ids", "rejected_ids")):
                ids = pair["prompt_ids"] + pair[key]
                p, n = len(pair["prompt_ids"]), len(pair[key])
                z = model(input_ids=torch.tensor([ids])).logits[0, p - 1 : p - 1 + n].float()
                logp, target = z.log_softmax(-1), torch.tensor(pair[key])
                row = stats["mask"][2 * i + j]
                assert row.sum() == n
                want = {"log_probs": logp.gather(1, target[:, None])[:, 0], "entropy": -(logp.exp() * logp).sum(-1),
                        "log_sum_sq_probs": torch.logsumexp(2 * logp, -1), "mean_logits": z.mean(-1)}  # fmt: skip
                for name, value in want.items():
                    torch.testing.assert_close(stats[name][2 * i + j, :n], value, atol=1e-5, rtol=1e-5)
                assert torch.equal(stats["is_top1"][2 * i + j, :n], z.argmax(-1) == target)


def test_a_batch_built_for_another_backend_is_refused():
    groups = _groups()
    tree_for_padless = RolloutCollator.for_model(_model("padless"), share_prompt=True)(groups)
    with pytest.raises(
        ValueError, match="tree_cu_seqlens for padless attention, which attn_implementation='sdpa' ignores"
    ):
        rollout_token_logprobs(_model("sdpa"), tree_for_padless)


def test_bad_arguments_are_named():
    model, groups = _model("sdpa"), _groups()
    batch = RolloutCollator.for_model(model)(groups)
    with pytest.raises(ValueError, match="temperature must be > 0, got 0"):
        rollout_token_logprobs(model, batch, temperature=0)
    with pytest.raises(ValueError, match=r"unknown outputs \['logits'\]; choose among log_probs, entropy"):
        completion_token_stats(model, batch, outputs=("logits",))
    with pytest.raises(ValueError, match="batch has no placements; pass the batch RolloutCollator"):
        rollout_token_logprobs(model, dict(batch))
