"""with_lora: a LoRA model as users build it; only the adapter trains, and padless packs it exactly."""

from __future__ import annotations

import pytest
import torch

from conftest import make_features
from padless.batching.batch import forward_inputs
from padless.batching.collate import PackingCollator
from padless.models.factory import build_model
from padless.models.lora import with_lora

pytest.importorskip("peft")
pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_with_lora_trains_only_the_adapter_and_packs_exactly(family):
    model = with_lora(build_model(f"tiny-{family}", seed=0), 4)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    model.eval()
    feats = make_features((5, 9, 3, 12), seed=5)
    batch = PackingCollator.for_model(model, max_length=16)(feats)
    with torch.no_grad():
        logits = model(**forward_inputs(batch)).logits
        pl = batch.placements
        for j in range(pl.feature.size):
            r, o, n = int(pl.row[j]), int(pl.offset[j]), int(pl.length[j])
            alone = model(input_ids=torch.tensor([feats[int(pl.feature[j])]["input_ids"]])).logits[0]
            torch.testing.assert_close(logits[r, o : o + n], alone, atol=1e-5, rtol=1e-5)


def test_with_lora_rejects_a_bad_rank():
    with pytest.raises(ValueError, match="rank must be a positive int"):
        with_lora(build_model("tiny-gpt2", seed=0), 0)


def test_the_bench_takes_a_lora_rank():
    """``padless bench --lora R``: every strategy's model goes through with_lora (bench/train.py)."""
    from padless.bench.config import RunConfig

    assert RunConfig(lora=8).lora == 8 and RunConfig().lora is None
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="must be a LoRA rank"):
            RunConfig(lora=bad)
