"""The one comparison and the one judgment: limits spelled out literally, the compute dtype under
autocast, and a leaky row caught with its evidence beside padding's noise."""

import pytest
import torch

from conftest import make_features
from padless.batching.batch import forward_inputs
from padless.batching.collate import PackingCollator
from padless.isolation import verify
from padless.isolation.compare import (
    NOISE_FACTOR,
    TOLERANCES,
    Document,
    Evidence,
    Tolerance,
    compare_documents,
    compute_dtype,
    computing_in,
    judge,
    relative_difference,
    tolerance_for,
)
from padless.models.factory import build_model

LENGTHS = [6, 1, 11, 4, 9]


def test_judgment_is_the_larger_of_factor_times_noise_and_the_floor():
    assert judge(0.3, 0.1, 0.05, factor=4).limit == pytest.approx(0.4)
    assert judge(0.3, 0.1, 0.05, factor=4).passed
    assert not judge(0.41, 0.1, 0.05, factor=4).passed
    assert judge(0.05, 0.0, 0.05).limit == 0.05 and judge(0.05, 0.0, 0.05).passed  # no noise: the floor
    assert not judge(0.06, None, 0.05).passed  # noise not measured: the floor alone
    assert judge(1.0, 1.0, 0.0).factor == NOISE_FACTOR


def test_tolerances_floor_and_lookup():
    tol = Tolerance(logits_atol=0.5, logits_rtol=0.25, grad_rtol=0.1)
    assert tol.logit_floor(4.0) == 1.5
    assert tolerance_for(torch.bfloat16) is TOLERANCES["bfloat16"] is verify.TOLERANCES["bfloat16"]
    assert tolerance_for("float32", tol) is tol
    with pytest.raises(ValueError, match="no tolerance for dtype int8"):
        tolerance_for("int8")


def test_relative_difference():
    assert relative_difference(torch.tensor([3.0, 4.0]), torch.tensor([3.0, 0.0])) == pytest.approx(4 / 3)
    assert relative_difference(torch.zeros(2), torch.zeros(2)) == 0.0


def test_compute_dtype_follows_autocast_then_logits_then_weights():
    model = build_model("tiny-llama")
    assert compute_dtype(model) == torch.float32
    assert compute_dtype(model, torch.zeros(1, dtype=torch.bfloat16)) == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert compute_dtype(model) == torch.bfloat16
        assert isinstance(computing_in(model, torch.bfloat16), type(computing_in(model, torch.float32)))  # already on
    with computing_in(model, torch.bfloat16):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    with computing_in(model, torch.float32):
        assert not torch.is_autocast_enabled("cpu")


def _documents(batch, feats):
    docs = []
    for i, f in enumerate(feats):
        ((_, row, offset, n),) = batch.placements.of_feature(i)
        docs.append(Document(i, tuple(f["input_ids"]), row, tuple(range(offset, offset + n))))
    return docs


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_packed_rows_pass_and_leaky_rows_fail_with_evidence(family):
    model = build_model(f"tiny-{family}").eval()
    feats = make_features(LENGTHS, seed=3)
    batch = PackingCollator.for_model(model)(feats)  # one row: every document but the first has others before it
    docs = _documents(batch, feats)
    with torch.no_grad():
        exact = compare_documents(model, model(**forward_inputs(batch)).logits, docs)
        leaky = compare_documents(model, model(input_ids=batch["input_ids"], use_cache=False).logits, docs)
    assert exact.passed and exact.evidence == [] and len(exact.documents) == len(LENGTHS)
    assert exact.judgment.noise is not None and exact.judgment.measured < 1e-5
    assert not leaky.passed and leaky.judgment.measured > 100 * leaky.judgment.limit
    first = [d.index for d in docs if d.columns[0] == 0]
    assert sorted(e.document for e in leaky.evidence) == sorted(d.index for d in docs if d.index not in first)
    for e in leaky.evidence:
        assert len(e.positions) == len(e.packed) == len(e.padded)
        assert min(e.packed) > leaky.judgment.limit >= max(e.padded)


def test_evidence_line_names_document_tokens_and_both_differences():
    line = Evidence(3, 1, (0, 2), (1.5, 2.25), (1e-6, 0.0)).describe()
    assert line == "document 3 (row 1), tokens packed vs padded: 0: 1.5 vs 1e-06, 2: 2.25 vs 0"
    assert "tokens checked: 0: 1.5" in Evidence(3, 1, (0,), (1.5,), None).describe()
    many = Evidence(0, 0, tuple(range(10)), (1.0,) * 10, (0.0,) * 10).describe()
    assert many.endswith("(+2 more)")


def test_no_document_is_refused():
    model = build_model("tiny-gpt2")
    with pytest.raises(ValueError, match="no document to compare"):
        compare_documents(model, torch.zeros(1, 2, 3), [])
