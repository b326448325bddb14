"""What RolloutCollator takes from an RL trainer and carries: TRL's per-completion fields
(completion_mask, tool_mask, advantages, old/ref per-token log-probs) through planning, truncation and
dropping into the ``(B, T)`` completion layout; tool results packed as context, never trained (a tiny
Llama against a TRL-style padded batch); rollout_features on TRL's padded tensors; empty rollouts
counted; every bad input refused by name."""

import numpy as np
import pytest
import torch

import padless
from padless.attention.backend import register_padless_attention
from padless.batching.preference import RolloutCollator, rollout_features
from padless.batching.rowformat import FeatureSpec
from padless.layout import IGNORE_INDEX
from padless.models.factory import build_model

VOCAB = 512
PAD = -9  # an odd pad value: a (B, T) cell or a packed token that reads it is visibly wrong
FLOAT_FIELDS = ("advantages", "old_per_token_logps", "ref_per_token_logps")


def _collator(shared, **kw):
    return RolloutCollator(
        share_prompt=shared, attention="mask4d" if shared else "position_ids", pad_token_id=PAD, **kw
    )


def _groups(sizes, seed=0, tools=True, length=(1, 9), prompt=(2, 8)):
    """Random groups (one per entry of ``sizes``, that many completions) with every rollout field,
    completions right-padded by 0 to 2 tokens of value 0 (masked out), tool results in some."""
    rng = np.random.default_rng(seed)
    groups = []
    for k in sizes:
        n = rng.integers(*length, size=k)
        pad = rng.integers(0, 3, size=k)
        g = {"prompt_ids": rng.integers(0, VOCAB, int(rng.integers(*prompt))).tolist(), "completion_ids": [],
             "completion_mask": [], "tool_mask": [], "advantages": [], "old_per_token_logps": [], "ref_per_token_logps": []}  # fmt: skip
        for j in range(k):
            total = int(n[j] + pad[j])
            g["completion_ids"].append(rng.integers(0, VOCAB, int(n[j])).tolist() + [0] * int(pad[j]))
            g["completion_mask"].append([1] * int(n[j]) + [0] * int(pad[j]))
            tool = np.ones(total, dtype=int)
            if tools and n[j] >= 4:  # a tool result inside the completion: tokens 1..2
                tool[1:3] = 0
            g["tool_mask"].append(tool.tolist())
            per_token = rng.random() < 0.5
            g["advantages"].append(rng.normal(size=total).tolist() if per_token else float(rng.normal()))
            g["old_per_token_logps"].append((-rng.random(total) * 5).tolist())
            g["ref_per_token_logps"].append((-rng.random(total) * 5).tolist())
        groups.append(g)
    return groups


def _check_carried(batch, groups, truncated=False):
    """Every (B, T) row is its input completion's first ``completion_lengths[b]`` tokens and values
    (all of them unless ``truncated``), zero-filled after; the packed tokens at the placements are the
    same tokens, labels -100 on tool results. Returns how many completions were cut."""
    ro, pl = batch.rollouts, batch.placements
    flat = [(groups[i], j) for i in batch.kept for j in range(len(groups[i]["completion_ids"]))]  # B, in order
    assert ro["completion_ids"].shape[0] == pl.num_features == len(flat)
    assert ro["completion_ids"].shape[1] == int(ro["completion_lengths"].max())
    per_token_adv = ro["advantages"].dim() == 2
    cut = 0
    for b, (g, j) in enumerate(flat):
        n = sum(g["completion_mask"][j])
        length = int(ro["completion_lengths"][b])
        assert length == n or (truncated and 1 <= length < n)
        cut += length < n
        ids, tool = g["completion_ids"][j][:length], g["tool_mask"][j][:length]
        assert ro["completion_ids"][b].tolist() == ids + [PAD] * (ro["completion_ids"].shape[1] - length)
        assert ro["completion_mask"][b, :length].tolist() == tool and not ro["completion_mask"][b, length:].any()
        assert ro["tool_mask"][b, :length].tolist() == tool and not ro["tool_mask"][b, length:].any()
        for name in FLOAT_FIELDS:
            given = np.asarray(g[name][j], dtype=np.float32)
            if name == "advantages" and not per_token_adv:
                assert ro[name][b].item() == given
                continue
            want = given[:length] if given.ndim else np.full(length, given)  # a scalar advantage spans its tokens
            np.testing.assert_array_equal(ro[name][b, :length].numpy(), want)
            assert not ro[name][b, length:].any()
        ((_, r, o, size),) = pl.of_feature(b)
        assert size == length and batch["input_ids"][r, o : o + size].tolist() == ids
        assert batch["labels"][r, o : o + size].tolist() == [t if m else IGNORE_INDEX for t, m in zip(ids, tool)]
    return cut


# ------------------------------------------------------------------------------ literal case


def test_literal_rollout_fields_in_the_completion_layout():
    groups = [
        {"prompt_ids": [5, 6], "completion_ids": [[1, 2, 3], [4, 0, 0], [9, 9, 9]],
         "completion_mask": [[1, 1, 1], [1, 0, 0], [0, 0, 0]], "tool_mask": [[1, 0, 1], [1, 1, 1], [1, 1, 1]],
         "advantages": [0.5, -1.0, 2.0], "old_per_token_logps": [[-1, -2, -3], [-4, 8, 8], [8, 8, 8]]},
        {"prompt_ids": [7], "completion_ids": [[8]], "advantages": [1.5], "old_per_token_logps": [[-0.5]]},
    ]  # fmt: skip
    shared, independent = _collator(True), _collator(False)
    batch = shared(groups)
    #                                     p  p  c0 tool c0  c1 empty  p  c3
    assert batch["input_ids"][0].tolist() == [5, 6, 1, 2, 3, 4, PAD, 7, 8]
    assert batch["labels"][0].tolist() == [-100, -100, 1, -100, 3, 4, -100, -100, 8]
    assert batch["position_ids"][0].tolist() == [0, 1, 2, 3, 4, 2, 2, 0, 1]
    ind = independent(groups)
    assert ind["input_ids"][0].tolist() == [5, 6, 1, 2, 3, 5, 6, 4, 5, 6, PAD, 7, 8]
    assert ind["labels"][0].tolist() == [-100, -100, 1, -100, 3, -100, -100, 4, -100, -100, -100, -100, 8]
    for b in (batch, ind):
        ro = b.rollouts
        assert set(ro) == {
            "completion_ids",
            "completion_mask",
            "completion_lengths",
            "tool_mask",
            "advantages",
            "old_per_token_logps",
        }
        assert ro["completion_ids"].tolist() == [[1, 2, 3], [4, PAD, PAD], [PAD, PAD, PAD], [8, PAD, PAD]]
        assert ro["completion_mask"].tolist() == [[1, 0, 1], [1, 0, 0], [0, 0, 0], [1, 0, 0]]
        assert ro["tool_mask"].tolist() == [[1, 0, 1], [1, 0, 0], [0, 0, 0], [1, 0, 0]]  # groups without: all 1
        assert ro["completion_lengths"].tolist() == [3, 1, 0, 1]
        assert ro["advantages"].tolist() == [0.5, -1.0, 2.0, 1.5] and ro["advantages"].dtype == torch.float32
        assert ro["old_per_token_logps"].tolist() == [[-1, -2, -3], [-4, 0, 0], [0, 0, 0], [-0.5, 0, 0]]
        assert ro["completion_mask"].dtype == torch.long
    assert shared.totals["empty_completions"] == 1 and shared.totals["empty_groups"] == 0
    assert shared.totals["tokens"] == 2 + 3 + 1 + 1 + 1  # as given: the placeholder is no given token


def test_without_fields_the_layout_still_comes_out():
    batch = _collator(True)([{"prompt_ids": [1, 2], "completion_ids": [[3], [4, 5]]}])
    assert set(batch.rollouts) == {"completion_ids", "completion_mask", "completion_lengths"}
    assert batch.rollouts["completion_ids"].tolist() == [[3, PAD], [4, 5]]
    assert batch.rollouts["completion_mask"].tolist() == [[1, 0], [1, 1]]


def test_a_separator_is_a_completion_token_of_the_layout():
    c = _collator(True, features=FeatureSpec(separator_id=2))
    batch = c(
        [
            {
                "prompt_ids": [1],
                "completion_ids": [[3, 0], [4, 2]],
                "completion_mask": [[1, 0], [1, 1]],
                "advantages": [1.0, -1.0],
            }
        ]
    )
    assert batch.rollouts["completion_ids"].tolist() == [[3, 2], [4, 2]]  # 2 appended after 3, already after 4
    assert batch.rollouts["completion_mask"].tolist() == [[1, 1], [1, 1]]


# ------------------------------------------------------------ through planning, truncate, drop


@pytest.mark.parametrize("shared", [True, False])
def test_fields_travel_through_planning(shared):
    groups = _groups([4, 1, 3, 2, 4, 2], seed=1)
    batch = _collator(shared, max_length=64)(groups)
    assert batch["input_ids"].shape[0] > 1  # several rows: the planner reorders groups, B stays in feature order
    assert batch.kept.tolist() == list(range(len(groups)))
    assert _check_carried(batch, groups) == 0
    assert batch.rollouts["advantages"].dim() == 2  # some completions gave per-token advantages


@pytest.mark.parametrize("shared", [True, False])
def test_fields_are_cut_with_the_tokens(shared):
    groups = _groups([4, 2, 3], seed=2, length=(6, 12))
    collator = _collator(shared, max_length=30 if shared else 40, overlong="truncate")
    batch = collator(groups)
    assert collator.totals["truncated_groups"] >= 1 and batch["input_ids"].shape[1] <= collator.max_length
    assert _check_carried(batch, groups, truncated=True) > 0


@pytest.mark.parametrize("shared", [True, False])
def test_dropped_groups_take_their_fields_along(shared):
    groups = _groups([2, 3, 2], seed=3, length=(2, 5))
    groups[1]["completion_ids"][0] += [1] * 40  # group 1 longer than any row
    for name in ("completion_mask", "tool_mask"):
        groups[1][name][0] = [1] * len(groups[1]["completion_ids"][0])
    for name in ("old_per_token_logps", "ref_per_token_logps"):
        groups[1][name][0] = [-1.0] * len(groups[1]["completion_ids"][0])
    groups[1]["advantages"][0] = 0.25
    collator = _collator(shared, max_length=32, overlong="drop")
    batch = collator(groups)
    assert batch.kept.tolist() == [0, 2] and collator.totals["dropped_groups"] == 1
    assert _check_carried(batch, groups) == 0


# -------------------------------------------------- tool results: context, not targets (tiny Llama)


def _trl_padded(groups):
    """TRL's tensors of these groups: prompts left-padded, completions right-padded, per row."""
    rows = [
        (g["prompt_ids"], c, m, t)
        for g in groups
        for c, m, t in zip(*(g[k] for k in ("completion_ids", "completion_mask", "tool_mask")))
    ]  # noqa: E501
    p, t = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
    prompt_ids = torch.tensor([[0] * (p - len(r[0])) + r[0] for r in rows])
    prompt_mask = torch.tensor([[0] * (p - len(r[0])) + [1] * len(r[0]) for r in rows])
    completion_ids = torch.tensor([r[1] + [0] * (t - len(r[1])) for r in rows])
    completion_mask = torch.tensor([r[2] + [0] * (t - len(r[2])) for r in rows])
    tool_mask = torch.tensor([r[3] + [1] * (t - len(r[3])) for r in rows])  # TRL pads tool_mask with 1
    return prompt_ids, prompt_mask, completion_ids, completion_mask, tool_mask


def _padded_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask):
    """``[B, T]`` log-prob of every completion token, the whole padded batch run at once (the oracle)."""
    ids = torch.cat([prompt_ids, completion_ids], 1)
    mask = torch.cat([prompt_mask, completion_mask], 1)
    positions = (mask.cumsum(1) - 1).clamp(min=0)  # left padding: every prompt starts at position 0
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits.float()
    p = prompt_ids.shape[1]
    logp = logits[:, p - 1 : -1].log_softmax(-1)  # [B, T, V]: position p - 1 + t predicts completion token t
    return logp.gather(2, completion_ids[..., None])[..., 0]


# The shared prompt runs on padless attention (tree kwargs), because sequence_logprobs' mask check
# (padless.attention.accept) refuses the sdpa tree mask as if it held block-causal documents.
@pytest.mark.parametrize("shared, backend", [(True, "padless"), (False, "sdpa")])
def test_tool_results_are_context_not_targets(shared, backend):
    if backend == "padless":
        register_padless_attention()
    llama = build_model("tiny-llama", attn_implementation=backend).eval()
    groups = _groups([3, 2, 3], seed=4, length=(4, 9))
    groups[1]["completion_mask"][1] = [0] * len(groups[1]["completion_mask"][1])  # an empty rollout
    batch = RolloutCollator.for_model(llama, max_length=48, share_prompt=shared)(groups)
    # the control: the same rollouts without their tool results (so nothing after them sees them)
    no_tools = [
        dict(
            g,
            tool_mask=None,
            old_per_token_logps=None,
            ref_per_token_logps=None,
            advantages=None,
            **{
                k: [[x for x, m in zip(c, t) if m] for c, t in zip(g[k], g["tool_mask"])]
                for k in ("completion_ids", "completion_mask")
            },
        )
        for g in groups
    ]
    with torch.no_grad():
        sums, per_token = padless.sequence_logprobs(llama, batch, per_token=True)
        _, without = padless.sequence_logprobs(
            llama, RolloutCollator.for_model(llama, share_prompt=shared)(no_tools), per_token=True
        )
        llama.set_attn_implementation("sdpa")  # the padded oracle has left padding, which padless attention refuses
        want = _padded_logps(llama, *_trl_padded(groups)[:4])
    trained = batch.rollouts["completion_mask"].bool()
    assert [t.numel() for t in per_token] == trained.sum(1).tolist()  # one log-prob per trained token
    got = torch.zeros(trained.shape).masked_scatter(trained, torch.cat(per_token))
    diff = (got - want[:, : trained.shape[1]]).abs()[trained].max().item()
    print(f"shared={shared}: max |packed - padded| over {int(trained.sum())} trained tokens = {diff:.2e}")
    assert diff < 1e-5
    assert not torch.isnan(sums).any() and sums[4].item() == 0.0  # the empty rollout: 0, not NaN
    torch.testing.assert_close(sums, (got * trained).sum(1))
    worst = max((a - b).abs().max().item() for a, b in zip(per_token, without) if a.numel())
    print(f"shared={shared}: without the tool results as context, max |difference| = {worst:.2e}")
    assert worst > 1e-3


# --------------------------------------------------------------------- rollout_features on TRL


def test_rollout_features_round_trips_trl_tensors():
    groups = _groups([3, 3, 3], seed=5)
    groups[2]["prompt_ids"] = list(groups[1]["prompt_ids"])  # two groups in a row with the same prompt
    groups[0]["completion_mask"][2] = [0] * len(groups[0]["completion_mask"][2])  # TRL's masked truncation
    prompt_ids, prompt_mask, completion_ids, completion_mask, tool_mask = _trl_padded(groups)
    completion_ids = torch.cat([completion_ids, torch.full((9, 3), 0)], 1)  # pad_to_multiple_of: extra columns
    completion_mask, tool_mask = (
        torch.cat([m, torch.full((9, 3), v)], 1) for m, v in ((completion_mask, 0), (tool_mask, 1))
    )
    real = completion_mask.bool()

    def table(name):
        return torch.tensor(
            [[x for x in c] + [0.0] * (completion_ids.shape[1] - len(c)) for g in groups for c in g[name]]
        )

    old, ref = (torch.where(real, table(n), torch.tensor(-8.0)) for n in ("old_per_token_logps", "ref_per_token_logps"))
    advantages = torch.tensor([float(np.mean(a)) for g in groups for a in g["advantages"]])  # [B]
    kw = dict(tool_mask=tool_mask, advantages=advantages, old_per_token_logps=old, ref_per_token_logps=ref)
    feats = rollout_features(prompt_ids, prompt_mask, completion_ids, completion_mask, num_generations=3, **kw)
    assert [f["prompt_ids"].tolist() for f in feats] == [g["prompt_ids"] for g in groups]
    assert [[c.tolist() for c in f["completion_ids"]] for f in feats] == [
        [c[: sum(m)] for c, m in zip(g["completion_ids"], g["completion_mask"])] for g in groups
    ]
    merged = rollout_features(prompt_ids, prompt_mask, completion_ids, completion_mask, **kw)
    assert [len(f["completion_ids"]) for f in merged] == [3, 6]  # without num_generations: by prompt
    for shared in (True, False):
        batch = _collator(shared)(feats)
        ro = batch.rollouts
        t = ro["completion_ids"].shape[1]
        assert not completion_mask[:, t:].any()  # T is the longest completion, the padding cut off
        assert ro["completion_ids"].tolist() == torch.where(real, completion_ids, PAD)[:, :t].tolist()
        assert ro["completion_mask"].tolist() == (completion_mask * tool_mask)[:, :t].tolist()
        for name, given in (("old_per_token_logps", old), ("ref_per_token_logps", ref)):
            assert ro[name].tolist() == torch.where(real, given, 0.0)[:, :t].tolist()  # -8 padding never read
        assert ro["advantages"].tolist() == advantages.tolist()
        assert _collator(shared)(merged).rollouts["completion_mask"].tolist() == ro["completion_mask"].tolist()


# --------------------------------------------------------------------------- empty rollouts


def test_empty_rollouts_are_packed_and_counted():
    groups = [
        {"prompt_ids": [1, 2], "completion_ids": [[3, 4], [], [5, 6, 7]], "tool_mask": [[1, 1], [], [0, 0, 0]]},
        {"prompt_ids": [8], "completion_ids": [[9, 9], [4]], "completion_mask": [[0, 0], [0]]},  # all empty
        {"prompt_ids": [3], "completion_ids": [[5] * 8 + [6]], "tool_mask": [[0] * 8 + [1]]},  # empty once cut
    ]  # fmt: skip
    collator = _collator(True, max_length=8, overlong="truncate")
    batch = collator(groups)
    assert collator.totals["empty_completions"] == 2 + 2 + 1 and collator.totals["empty_groups"] == 2
    assert batch.placements.num_features == 6 and sorted(batch.placements.feature.tolist()) == list(range(6))
    assert batch.rollouts["completion_mask"].sum(1).tolist() == [2, 0, 0, 0, 0, 0]  # their rows all zero
    assert batch.rollouts["completion_lengths"].tolist() == [2, 0, 3, 0, 0, 7]  # 10 tokens cut to the row's 8
    again = _collator(True)(groups)  # no max_length: nothing cut, the last rollout trains its last token
    assert again.rollouts["completion_mask"].sum(1).tolist() == [2, 0, 0, 0, 0, 1]


# ------------------------------------------------------------------------------- bad input


def _one(**fields):
    g = {"prompt_ids": [1, 2], "completion_ids": [[3, 4, 5], [6, 7, 8]]}
    g.update(fields)
    return [g]


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "features, kwargs, message",
    [
        (_one(advantages=[1.0, 2.0, 3.0]), {}, r"feature 0 advantages has 3 values for 2 completions"),
        (_one(advantages=1.0), {}, r"feature 0 advantages has no list of values for 2 completions"),
        (_one(advantages=[1.0, [1.0, 2.0]]), {}, r"feature 0 advantages\[1\] has 2 values for the 3 tokens of completion_ids\[1\]"),
        (_one(advantages=[[[1.0]], 1.0]), {}, r"feature 0 advantages\[0\] must be a 1-D list"),
        (_one(advantages=[1.0, NAN]), {}, r"feature 0 advantages\[1\] is nan; advantages must be finite"),
        (_one(advantages=[[1.0, INF, 0.0], 1.0]), {}, r"feature 0 advantages\[0\] is inf at token 1; advantages must be finite"),
        (_one(completion_mask=[[1, 1], [1, 1, 1]]), {}, r"feature 0 completion_mask\[0\] has 2 values for the 3 tokens of completion_ids\[0\]"),
        (_one(completion_mask=[[1, 1, 1]]), {}, r"feature 0 completion_mask has 1 entries for 2 completions"),
        (_one(completion_mask=[[1, 1, 1], [1, 0, 1]]), {}, r"feature 0 completion_mask\[1\] has a 0 at token 1 before a 1 at token 2"),
        (_one(completion_mask=[[1, 2, 1], [1, 1, 1]]), {}, r"feature 0 completion_mask\[0\] holds 2; a mask holds 0 and 1 only"),
        (_one(tool_mask=[[1, 0, 1], [1, 0]]), {}, r"feature 0 tool_mask\[1\] has 2 values for the 3 tokens of completion_ids\[1\]"),
        (_one(old_per_token_logps=[[-1.0] * 3, [-1.0] * 4]), {}, r"feature 0 old_per_token_logps\[1\] has 4 values for the 3 tokens of completion_ids\[1\]: from another batch\?"),
        (_one(ref_per_token_logps=[[-1.0] * 2, [-1.0] * 3]), {}, r"feature 0 ref_per_token_logps\[0\] has 2 values for the 3 tokens of completion_ids\[0\]: from another batch\?"),
        (_one(old_per_token_logps=[[-1.0, NAN, -1.0], [-1.0] * 3]), {}, r"feature 0 old_per_token_logps\[0\] is nan at token 1; log-probs must be finite"),
        (_one(ref_per_token_logps=[[-1.0] * 3, [-1.0, -1.0, -INF]]), {}, r"feature 0 ref_per_token_logps\[1\] is -inf at token 2; log-probs must be finite"),
        (_one(advantages=[1.0, 2.0]) + _one(), {}, r"feature 1 has no advantages, but feature 0 has: give advantages for every group"),
        (_one() + _one(old_per_token_logps=[[-1.0] * 3] * 2), {}, r"feature 0 has no old_per_token_logps, but feature 1 has"),
        (_one(tool_mask=[[1, 0, 1], [1, 1, 1]]), {"features": FeatureSpec(separator_id=3)},
         r"feature 0 tool_mask gives one value per completion token, but features.separator_id=3 appends a token"),
        (_one(completion_ids=[[1, 2], [3, 4, 5, 6, 7, 8, 9]]), {"max_length": 8},
         r"group 0 needs 11 tokens in a row \(share_prompt=True\), more than the collator's max_length=8, and overlong='error' refuses it: raise max_length, or choose overlong='truncate' or 'drop'"),
        (_one(completion_ids=[]), {}, r"feature 0 completion_ids must be a non-empty list"),
        (_one(completion_ids=[[3, 4, 5], [6, 7, VOCAB]]), {"features": FeatureSpec(vocab_size=VOCAB)},
         r"feature 0 completion_ids\[1\]: token id 512 is outside the vocabulary"),
    ],
)  # fmt: skip
def test_bad_group_fields(features, kwargs, message):
    with pytest.raises(ValueError, match=message):
        _collator(True, **kwargs)(features)


def _trl(**override):
    t = dict(
        prompt_ids=torch.tensor([[0, 1, 2], [0, 1, 2]]),
        prompt_mask=torch.tensor([[0, 1, 1], [0, 1, 1]]),
        completion_ids=torch.tensor([[3, 4, 0], [5, 0, 0]]),
        completion_mask=torch.tensor([[1, 1, 0], [1, 0, 0]]),
    )
    t.update(override)
    return t


@pytest.mark.parametrize(
    "override, message",
    [
        ({"completion_mask": torch.ones(2, 2, dtype=torch.long)}, r"completion_mask has shape \(2, 2\), but completion_ids has \(2, 3\)"),
        ({"prompt_mask": torch.ones(2, 2, dtype=torch.long)}, r"prompt_mask has shape \(2, 2\), but prompt_ids has \(2, 3\)"),
        ({"prompt_ids": torch.tensor([[1, 2]])}, r"prompt_ids has 1 rows, completion_ids 2"),
        ({"advantages": torch.ones(3)}, r"advantages has shape \(3,\), but completion_ids has \(2, 3\); it must be \(2, 3\) or \(2,\)"),
        ({"old_per_token_logps": torch.ones(2, 4)}, r"old_per_token_logps has shape \(2, 4\), but completion_ids has \(2, 3\)"),
        ({"tool_mask": torch.ones(3)}, r"tool_mask must be a \[B, T\] table, got shape \(3,\)"),
        ({"prompt_mask": torch.tensor([[1, 0, 1], [0, 1, 1]])}, r"prompt_mask row 0 is not 0...0 1...1"),
        ({"prompt_mask": torch.tensor([[0, 1, 1], [0, 0, 0]])}, r"prompt_mask row 1 is all zero"),
        ({"completion_mask": torch.tensor([[1, 1, 0], [0, 1, 0]])}, r"completion_mask row 1 has a 0 at token 0 before a 1"),
        ({"num_generations": 3}, r"num_generations=3 does not divide the 2 rows of completion_ids"),
        ({"num_generations": 0}, r"num_generations must be an integer >= 1"),
        ({"num_generations": 2, "prompt_ids": torch.tensor([[0, 1, 2], [0, 1, 3]])},
         r"rows 0..1 are group 0 \(num_generations=2\), but row 1's prompt differs from row 0's"),
    ],
)  # fmt: skip
def test_bad_trl_tensors(override, message):
    with pytest.raises(ValueError, match=message):
        rollout_features(**_trl(**override))


def test_logps_of_other_rows_are_refused_by_length():
    """Per-token log-probs swapped between completions of different lengths: once rollout_features
    has stripped the padding, the collator refuses them by their length."""
    feats = rollout_features(**_trl(old_per_token_logps=torch.zeros(2, 3)))
    feats[0]["old_per_token_logps"] = feats[0]["old_per_token_logps"][::-1]  # the other row's values
    with pytest.raises(
        ValueError, match=r"old_per_token_logps\[0\] has 1 values for the 2 tokens .* from another batch\?"
    ):
        _collator(True)(feats)


def test_rollout_features_take_bfloat16_logps():
    t = _trl(
        old_per_token_logps=torch.tensor([[-1.5, -0.25, 0.0], [-2.0, 0.0, 0.0]], dtype=torch.bfloat16),
        advantages=torch.tensor([0.5, -0.5], dtype=torch.bfloat16),
    )
    ro = _collator(False)(rollout_features(**t)).rollouts
    assert ro["old_per_token_logps"].tolist() == [[-1.5, -0.25], [-2.0, 0.0]] and ro["advantages"].tolist() == [
        0.5,
        -0.5,
    ]
