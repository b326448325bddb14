"""The context-parallel loss: the ranks' shares, each normalised by the WHOLE rows' trained-token
count, add up to the single-process loss; normalising per rank does not."""

from __future__ import annotations

import pytest
import torch

from padless.batching.context_shards import split_row
from padless.layout import IGNORE_INDEX
from padless.objectives.context_loss import context_parallel_forward, context_parallel_loss
from padless.objectives.loss import causal_lm_loss, trained_tokens


@pytest.mark.parametrize("cp", [2, 3, 4])
def test_shares_add_up_to_the_whole_rows_loss(cp: int) -> None:
    gen = torch.Generator().manual_seed(0)
    length = 24
    logits = torch.randn(2, length, 11, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 11, (2, length), generator=gen)
    labels[:, [0, 5, 17]] = IGNORE_INDEX  # document starts
    labels[1, 20:] = IGNORE_INDEX  # an untrained tail
    pos = torch.cat([torch.arange(5), torch.arange(12), torch.arange(7)]).expand(2, -1)
    whole = causal_lm_loss(logits, labels, int(trained_tokens(labels)))
    shares, per_rank = 0.0, 0.0
    for rank in range(cp):
        shard = split_row(torch.zeros_like(labels), labels, pos, cp=cp, rank=rank)
        local = logits[:, shard.index]
        shares += context_parallel_loss(local, shard.targets, shard.num_items)
        per_rank += context_parallel_loss(local, shard.targets, int((shard.targets != IGNORE_INDEX).sum()))
    assert torch.allclose(shares, whole, rtol=1e-12, atol=0)
    assert not torch.allclose(per_rank, whole, rtol=1e-3)


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="num_items"):
        context_parallel_loss(torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.long), 0)
    with pytest.raises(ValueError, match="do not match"):
        context_parallel_loss(torch.zeros(1, 2, 3), torch.zeros(1, 3, dtype=torch.long), 1)


def test_the_forward_needs_the_cp_backend() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2)
    model = LlamaForCausalLM(config)
    shard = split_row(torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.long), torch.arange(4), cp=1, rank=0)
    with pytest.raises(ValueError, match="padless_cp"):
        context_parallel_forward(model, shard)


def test_the_forward_refuses_a_model_it_cannot_make_exact() -> None:
    from transformers import MambaConfig, MambaForCausalLM

    from padless.attention.context_parallel import register_context_parallel_attention

    model = MambaForCausalLM(MambaConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1, state_size=4))
    model.config._attn_implementation = register_context_parallel_attention()  # as if set: the rule still refuses
    shard = split_row(torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.long), torch.arange(4), cp=1, rank=0)
    with pytest.raises(ValueError, match="context_parallel refused.*mamba"):
        context_parallel_forward(model, shard)
