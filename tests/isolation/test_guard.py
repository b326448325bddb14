"""IsolationGuard: passes on exact packed batches (given or re-run logits, every backend), catches a
contaminated row, checks on the right steps, and refuses what it cannot compare."""

import re

import numpy as np
import pytest
import torch

import padless
from conftest import make_features
from padless.attention.backend import register_padless_attention
from padless.batching.batch import PackedBatch, forward_inputs
from padless.batching.collate import PackingCollator
from padless.isolation.guard import IsolationError, IsolationGuard, IsolationWarning
from padless.isolation.verify import TOLERANCES
from padless.models.factory import build_model

LENGTHS = [5, 1, 17, 9, 3, 12, 2, 8]


def _model(family="llama", backend="sdpa"):
    if backend == "padless":
        register_padless_attention()
    return build_model(f"tiny-{family}", attn_implementation=backend)


def _leaky(batch):
    """The same rows with positions running on and no document mask: plain causal over each row."""
    plain = {
        k: v
        for k, v in batch.items()
        if k not in ("attention_mask", "position_ids") and not k.startswith(("cu_", "max_length"))
    }
    return PackedBatch(plain, batch.placements)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("backend", ["sdpa", "eager", "padless"])
def test_exact_batches_pass_with_given_and_rerun_logits(family, backend):
    model = _model(family, backend).eval()
    batch = PackingCollator.for_model(model, max_length=24)(make_features(LENGTHS, seed=1))
    guard = IsolationGuard(every=1, documents=3)
    logits = model(**forward_inputs(batch)).logits
    for given in (logits, None):
        check = guard(model, batch, given)
        assert check.passed and check.max_logit_diff < 1e-5 and len(check.pieces) == 3
        assert all(offset > 0 for _, _, offset, _ in check.pieces)  # documents with others before them first


def test_contamination_raises_or_warns():
    model = _model("gpt2").eval()
    batch = _leaky(PackingCollator.for_model(model, max_length=24)(make_features(LENGTHS, seed=2)))
    with pytest.raises(IsolationError, match="are not isolated"):
        IsolationGuard(every=1)(model, batch)
    with pytest.warns(IsolationWarning, match="are not isolated"):
        check = IsolationGuard(every=1, on_failure="warn")(model, batch)
    assert not check.passed and check.max_logit_diff > 1e-3


def test_contamination_names_documents_with_padding_noise_beside_them():
    model = _model("llama").eval()
    batch = _leaky(PackingCollator.for_model(model, max_length=24)(make_features(LENGTHS, seed=2)))
    check = IsolationGuard(every=1, documents=4, on_failure="warn")
    with pytest.warns(IsolationWarning, match=r"document \d+ \(row \d+\), tokens packed vs padded"):
        result = check(model, batch)
    assert result.evidence and result.noise is not None
    for e in result.evidence:  # a leaked document is far above padding's noise at the same tokens
        assert min(e.packed) > 10 * max(e.padded)


@pytest.mark.parametrize("given", [True, False])
def test_bf16_autocast_over_fp32_weights_is_no_false_alarm(given):
    """Trainer(bf16=True): fp32 weights, bf16 logits. The floor and the re-runs follow the logits' dtype."""
    model = _model("llama").eval()
    batch = PackingCollator.for_model(model, max_length=24)(make_features(LENGTHS, seed=6))
    fp32_floor = TOLERANCES["float32"].logit_floor(10.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(**forward_inputs(batch)).logits if given else None
        inside = IsolationGuard(every=1, documents=len(LENGTHS))(model, batch, logits)
    assert inside.passed and inside.dtype == "bfloat16"
    assert inside.max_logit_diff > fp32_floor  # bf16 noise: judged with model.dtype's floor, a false alarm
    if given:  # the same bf16 logits, guard called after the autocast block: re-runs under bf16 autocast
        assert logits.dtype == torch.bfloat16
        after = IsolationGuard(every=1, documents=len(LENGTHS))(model, batch, logits)
        assert after.passed and after.dtype == "bfloat16" and after.max_logit_diff > fp32_floor
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(IsolationError):
        IsolationGuard(every=1, documents=4)(model, _leaky(batch))


def test_checks_on_the_first_call_and_every_n():
    model = _model("gpt2").eval()
    batch = PackingCollator.for_model(model, max_length=24)(make_features(LENGTHS, seed=3))
    guard = IsolationGuard(every=3)
    checked = [guard(model, batch) is not None for _ in range(7)]
    assert checked == [True, False, False, True, False, False, True]
    assert guard.last.step == 7


def test_training_mode_is_restored_and_dropout_needs_a_rerun():
    model = build_model("tiny-gpt2")
    model.config.attn_pdrop = 0.1  # an active dropout setting
    model.train()
    batch = PackingCollator.for_model(model, max_length=24)(make_features(LENGTHS, seed=4))
    logits = model(**forward_inputs(batch)).logits
    with pytest.raises(ValueError, match="dropout is active"):
        IsolationGuard(every=1)(model, batch, logits)
    assert IsolationGuard(every=1)(model, batch).passed and model.training


def test_bad_input():
    model = _model("gpt2").eval()
    batch = PackingCollator.for_model(model, max_length=24)(make_features(LENGTHS, seed=5))
    with pytest.raises(ValueError, match="needs the PackedBatch"):
        IsolationGuard(every=1)(model, dict(batch))
    with pytest.raises(ValueError, match="do not cover input_ids"):
        IsolationGuard(every=1)(model, batch, torch.zeros(2, 3, 4))
    for kwargs, match in (
        ({"every": 0}, "every must be"),
        ({"documents": 0}, "documents must be"),
        ({"on_failure": "log"}, "on_failure must be"),
    ):
        with pytest.raises(ValueError, match=match):
            IsolationGuard(**kwargs)


def test_exported():
    assert padless.IsolationGuard is IsolationGuard and padless.IsolationError is IsolationError


def test_every_none_checks_the_first_call_only():
    model = _model("gpt2").eval()
    batch = PackingCollator.for_model(model, max_length=24)(make_features(LENGTHS, seed=3))
    guard = IsolationGuard(every=None)
    assert [guard.due() and guard(model, batch) is not None for _ in range(4)] == [True, False, False, False]
    with pytest.raises(ValueError, match="every must be >= 1 or None"):
        IsolationGuard(every=True)
    with pytest.raises(ValueError, match="budget must be"):
        IsolationGuard(budget=0)


def test_a_budget_cuts_the_documents_and_still_catches_a_leak(monkeypatch):
    """budget=0.05 of 2 rows x 64: each document keeps MIN_TOKENS (its logits there depend on them only);
    the padded reference is MIN_TOKENS wider than the longest, not the row width."""
    import padless.isolation.compare as compare
    from padless.isolation.guard import MIN_TOKENS

    widths, real = [], compare.padded_logits

    def spy(model, docs, width=None):
        widths.append(width)
        return real(model, docs, width)

    monkeypatch.setattr(compare, "padded_logits", spy)  # the guard imports it where used
    model = _model("llama").eval()
    batch = PackingCollator.for_model(model, max_length=64)(make_features([30, 25, 40, 20, 9], seed=7))
    check = IsolationGuard(every=1, budget=0.05)(model, batch)
    assert check.passed and all(n <= MIN_TOKENS for *_, n in check.pieces) and check.tokens > MIN_TOKENS
    assert widths == [2 * MIN_TOKENS]
    with pytest.raises(IsolationError, match="are not isolated"):
        IsolationGuard(every=1, budget=0.05)(model, _leaky(batch))


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("backend", ["sdpa", "padless"])
def test_rollout_completions_run_alone_with_their_prompt(share, backend):
    """A completion placed after its prompt (prev_offset >= 0) is checked as prompt + completion, reading
    the prompt's columns first; a row that lets completions see each other is caught."""
    from padless.batching.preference import RolloutCollator

    model = _model("llama", backend).eval()
    rng = np.random.default_rng(0)
    ids = lambda n: rng.integers(1, 200, n).tolist()  # noqa: E731
    groups = [{"prompt_ids": ids(p), "completion_ids": [ids(c) for c in cs]} for p, cs in ((5, (3, 4)), (4, (6, 2, 5)))]
    batch = RolloutCollator.for_model(model, share_prompt=share)(groups)
    check = IsolationGuard(every=1, documents=5)(model, batch)
    assert check.passed and check.max_logit_diff < 1e-5 and len(check.pieces) == 5
    prompt = {0: 5, 1: 5, 2: 4, 3: 4, 4: 4}  # feature -> its group's prompt length
    completion = {0: 3, 1: 4, 2: 6, 3: 2, 4: 5}
    assert sorted((f, n) for f, _, _, n in check.pieces) == [(f, prompt[f] + completion[f]) for f in range(5)]
    if backend == "sdpa":
        forward = model.forward

        def mixing(**kwargs):  # the batch keeps its boundaries; the forward drops them: plain causal rows
            if kwargs.get("attention_mask") is not None and kwargs["attention_mask"].dim() == 4:
                kwargs = {k: v for k, v in kwargs.items() if k not in ("attention_mask", "position_ids")}
            return forward(**kwargs)

        model.forward = mixing
        with pytest.raises(IsolationError, match="are not isolated"):
            IsolationGuard(every=1, documents=5)(model, batch)


def test_describe_names_the_documents_and_the_noise():
    model = _model("gpt2").eval()
    batch = PackingCollator.for_model(model, max_length=24)(make_features(LENGTHS, seed=1))
    check = IsolationGuard(every=1, documents=2)(model, batch)
    assert re.fullmatch(
        r"step 1: packed documents \d+ \(row \d+, column \d+, \d+ tokens\), \d+ \(row \d+, column \d+, \d+ tokens\) "
        r"against the same documents run alone: max \|diff\| \S+, padding's own noise \S+, limit \S+ \(float32\): "
        r"isolated",
        check.describe(),
    )
    assert check.tokens == sum(n for *_, n in check.pieces)


@pytest.mark.parametrize("backend", ["sdpa", "padless"])
def test_a_budgeted_rerun_runs_windows_of_its_documents(monkeypatch, backend):
    """Without the step's logits (TRL's trainers) a budgeted check runs each checked document in a window
    of its row (MIN_TOKENS of its neighbour before it) instead of the whole batch: an isolated document's
    logits there are the whole batch's, and a leak is still caught."""
    from padless.isolation import guard as guard_module

    model = _model("llama", backend).eval()
    batch = PackingCollator.for_model(model, max_length=64)(make_features([30, 25, 40, 20, 9, 33, 12], seed=8))
    whole = model(**forward_inputs(batch)).logits
    pl = batch.placements
    starts = {(int(r), int(o)) for r, o in zip(pl.row, pl.offset, strict=True)}
    widths, real = [], guard_module._window

    def spy(b, row, start, end):
        cut = real(b, row, start, end)
        widths.append(end - start)
        first = min(o for r, o in starts if r == row and start < o < end)  # the checked document's start
        got = model(**cut).logits[0, first - start :]
        torch.testing.assert_close(got, whole[row, first:end], atol=1e-5, rtol=1e-5)
        return cut

    monkeypatch.setattr(guard_module, "_window", spy)
    check = IsolationGuard(every=1, budget=0.05, documents=2)(model, batch)
    assert check.passed and len(widths) == 2 and max(widths) < batch["input_ids"].shape[1]
    monkeypatch.undo()  # the leaky rows' logits are not the exact batch's
    with pytest.raises(IsolationError, match="are not isolated"):
        IsolationGuard(every=1, budget=0.05)(model, _leaky(batch))
