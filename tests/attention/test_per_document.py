"""Documents of a packed row grouped, right-padded, run through a layer and scattered back
(padless.attention.per_document): every token placed exactly once, the same outputs as a loop over
the documents, for any grouping."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from padless.attention.per_document import group_documents, run_per_document, run_with_boundaries


@given(st.lists(st.integers(1, 40), min_size=1, max_size=30), st.sampled_from([0.0, 0.1, 0.25, 1.0, 10.0]))
def test_group_documents_places_every_document_once(lengths, max_padding):
    groups = group_documents(lengths, max_padding)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for g in groups:
        width, tokens = max(lengths[i] for i in g), sum(lengths[i] for i in g)
        assert lengths[g[0]] == width  # the first is the longest: the padded width
        assert width * len(g) <= (1 + max_padding) * tokens + 1e-9
        if max_padding == 0:
            assert {lengths[i] for i in g} == {width}


def test_group_documents_batches_similar_lengths():
    assert group_documents([7, 13, 5, 11], 0.25) == [[1, 3], [0, 2]]
    assert group_documents([4, 4, 4], 0.0) == [[0, 1, 2]]


def causal_layer(hidden_states, scale=None, cache=None, attention_mask=None, **kwargs):
    """A causal token mixer with a decaying running sum (what trailing padding must not reach) and a
    per-token input beside the hidden states."""
    assert cache is None and attention_mask is None and "cu_seq_lens_q" not in kwargs
    decay = 0.5 ** torch.arange(hidden_states.shape[1], dtype=hidden_states.dtype)  # [P]
    weights = torch.tril(decay[:, None] / decay[None, :])  # [P, P]: 0.5 ** (t - s) for s <= t
    return weights @ hidden_states * scale[..., None], hidden_states.sum()


def loop_reference(hidden, scale, lengths_per_row):
    rows = []
    for b, lengths in enumerate(lengths_per_row):
        at, parts = 0, []
        for n in lengths:
            parts.append(causal_layer(hidden[b : b + 1, at : at + n], scale[b : b + 1, at : at + n])[0][0])
            at += n
        rows.append(torch.cat(parts))
    return torch.stack(rows)


@given(st.sampled_from([0.0, 0.25, 1000.0]), st.integers(0, 3))
def test_run_per_document_equals_a_loop_over_documents(max_padding, seed):
    rows = [[5, 1, 9, 3], [2, 8, 8]]  # both rows of 18 tokens
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(2, 18, 3, generator=generator, dtype=torch.float64)
    scale = torch.rand(2, 18, generator=generator, dtype=torch.float64)
    cu = torch.tensor([0, 5, 6, 15, 18, 20, 28, 36], dtype=torch.int32)
    arguments = {"hidden_states": hidden, "scale": scale, "cache": object(), "attention_mask": torch.ones(2, 18),
                 "cu_seq_lens_q": cu, "cu_seq_lens_k": cu}  # fmt: skip
    out, state = run_per_document(causal_layer, arguments, "hidden_states", cu, max_padding)
    assert state is None  # a non-token output is not assembled
    torch.testing.assert_close(out, loop_reference(hidden, scale, rows), atol=1e-12, rtol=0)


def test_run_per_document_gradients_reach_every_token():
    hidden = torch.randn(1, 10, 2, dtype=torch.float64, requires_grad=True)
    scale = torch.ones(1, 10, dtype=torch.float64)
    cu = torch.tensor([0, 4, 10])
    out, _ = run_per_document(causal_layer, {"hidden_states": hidden, "scale": scale}, "hidden_states", cu, 0.25)
    out.sum().backward()
    ref = hidden.detach().clone().requires_grad_()
    loop_reference(ref, scale, [[4, 6]]).sum().backward()
    torch.testing.assert_close(hidden.grad, ref.grad)
    assert bool((hidden.grad != 0).all())  # every token reached


@pytest.mark.parametrize("cu_kwargs", [True, False])
def test_run_with_boundaries_flattens_the_row_and_passes_boundaries(cu_kwargs):
    """The CUDA path cannot run here (no kernels): its plumbing is checked with a stand-in layer that
    records what the kernels would be given."""
    seen = {}

    def layer(hidden_states, cache=None, attention_mask=None, **kwargs):
        seen.update(kwargs, shape=tuple(hidden_states.shape), mask=attention_mask)
        return hidden_states * 2

    hidden = torch.randn(2, 6, 4)
    cu = torch.tensor([0, 2, 6, 9, 12], dtype=torch.int32)
    arguments = {"hidden_states": hidden, "attention_mask": torch.ones(2, 6), "cu_seq_lens_q": cu, "cu_seq_lens_k": cu}
    out = run_with_boundaries(layer, arguments, "hidden_states", cu, cu_kwargs=cu_kwargs)
    assert torch.equal(out, hidden * 2)
    assert seen["shape"] == (1, 12, 4) and seen["mask"] is None
    assert seen["seq_idx"].tolist() == [[0, 0, 1, 1, 1, 1, 2, 2, 2, 3, 3, 3]]
    assert ("cu_seq_lens_q" in seen) == cu_kwargs
