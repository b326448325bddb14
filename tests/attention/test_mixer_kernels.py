"""Where the CUDA kernels of a hybrid's token mixers are installed (flash-linear-attention for gated
DeltaNet, causal_conv1d for short convolutions, mamba_ssm + causal_conv1d for Mamba2) and a GPU is
there: the kernels handed the packed row's boundaries (``enable_per_document_mixers(model,
kernels=True)``: fla's ``cu_seqlens``, ``seq_idx`` for the others) give the logits padless' torch scans
give, and each document's logits alone. Skipped elsewhere (this machine has neither); benchmarks/gpu.sh's
``mixers`` step runs the same comparison on a lent GPU."""

from __future__ import annotations

import pytest
import torch
from test_mixers import LENGTHS, VOCAB, build

import padless
from conftest import make_features
from padless.attention.mixers import KERNEL, SCAN, enable_per_document_mixers, kernels_available, mixer_layers
from padless.batching.batch import batch_to, forward_inputs

KINDS = {"qwen3_5_text": "gated_deltanet", "bamba": "mamba2", "lfm2": "short_conv"}


@pytest.mark.gpu
@pytest.mark.parametrize("family", sorted(KINDS))
def test_kernels_given_the_boundaries_equal_the_scans(family):
    if not torch.cuda.is_available() or not kernels_available(KINDS[family]):
        pytest.skip(f"needs a CUDA device and the {KINDS[family]} kernels installed")
    model = build(family, "sdpa").cuda()
    batch = batch_to(
        padless.PackingCollator.for_model(model, max_length=64)(make_features(LENGTHS, vocab_size=VOCAB)), "cuda"
    )
    assert {m.how for m in mixer_layers(model)} == {SCAN}
    with torch.no_grad():
        scanned = model(**forward_inputs(batch)).logits
        enable_per_document_mixers(model, kernels=True)
        assert {m.how for m in mixer_layers(model)} == {KERNEL}
        kernels = model(**forward_inputs(batch)).logits
    torch.testing.assert_close(kernels, scanned, atol=1e-4, rtol=1e-4)
