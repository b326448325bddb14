"""The float64 oracle: packed rows (plain and shared-prompt) equal the documents alone to <= 1e-12 on
tiny GPT-2 and Llama, so any systematic difference would show far above float noise.

One float32 step remains inside transformers' Llama: ``LlamaRMSNorm`` casts its input to float32
whatever the model's dtype. Plain rows are still exact (each position's gradient comes from one
document), but a shared prompt's positions sum their completions' gradients before that cast, so
shared-prompt gradients differ from the runs alone at float32 resolution (~4e-8). The test shows it is
that step and nothing of padless: with the norm computing in its input dtype they are exact too.
"""

import pytest
import torch

from padless.isolation.verify import verify_isolation
from padless.models.factory import build_model

EXACT = 1e-12
BACKENDS = ["sdpa", "padless"]  # eager: transformers' eager attention takes its softmax in float32


def _by_name(family):
    report = verify_isolation(build_model(f"tiny-{family}", dtype=torch.float64), backends=BACKENDS, check="thorough")
    assert report.passed and report.dtype == "float64"
    return {r.backend: r for r in report.results}


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_plain_and_shared_prompt_logits_are_exact_in_float64(family):
    for r in _by_name(family).values():
        assert r.status == "pass" and r.max_logit_diff <= EXACT, r
    for backend in BACKENDS:
        assert _by_name(family)[backend].grad_rel_diff <= EXACT


def test_gpt2_shared_prompt_gradients_are_exact_in_float64():
    for backend in BACKENDS:
        assert _by_name("gpt2")[f"{backend}+shared_prompt"].grad_rel_diff <= EXACT


def _norm_in_input_dtype(self, hidden_states):
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def test_llama_shared_prompt_gradients_differ_only_by_the_rmsnorm_float32_cast(monkeypatch):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    as_is = _by_name("llama")
    for backend in BACKENDS:  # the float32 cast: float32 resolution, far below any real difference
        assert 1e-10 < as_is[f"{backend}+shared_prompt"].grad_rel_diff < 1e-6
    monkeypatch.setattr(LlamaRMSNorm, "forward", _norm_in_input_dtype)
    fixed = _by_name("llama")
    for backend in BACKENDS:
        assert fixed[f"{backend}+shared_prompt"].grad_rel_diff <= EXACT
