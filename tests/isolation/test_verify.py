"""``padless verify`` / ``verify_isolation``: passes on every backend padless packs with, refuses what
cannot isolate, and fails (non-zero exit) when packed rows are contaminated."""

import json

import numpy as np
import pytest
import torch

from padless.isolation.verify import random_sequences, sample_lengths, sampled_parameters, verify_isolation
from padless.models.factory import TINY_FAMILIES, build_model

DTYPES = {"float32": (torch.float32, None), "bfloat16": (torch.bfloat16, None), "float16": (torch.float16, None),
          "autocast-bf16": (torch.float32, torch.bfloat16)}  # fmt: skip


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_every_backend_that_runs_is_isolated(family):
    report = verify_isolation(build_model(f"tiny-{family}"))
    by_name = {r.backend: r for r in report.results}
    assert report.passed
    for backend in ("sdpa", "eager", "padless"):
        assert by_name[backend].status == "pass", by_name[backend]
        assert by_name[backend].max_logit_diff < 1e-5
        assert by_name[backend].grad_rel_diff < 1e-5
        assert by_name[backend].evidence == []
    assert by_name["flex_attention"].status == "refused"
    assert "use backend 'padless'" in by_name["flex_attention"].detail


def test_restores_the_models_attention_and_mode():
    model = build_model("tiny-llama", attn_implementation="eager")
    model.train()
    verify_isolation(model, backends=["sdpa", "padless"])
    assert model.config._attn_implementation == "eager" and model.training


@pytest.fixture
def leaky_collator(monkeypatch):
    """A collator that lets documents see each other: a plain causal row (positions run on, no mask)."""
    from padless.batching.batch import PackedBatch
    from padless.batching.collate import PackingCollator

    original = PackingCollator.__call__

    def leaky(self, features):
        batch = original(self, features)
        kept = {
            k: v
            for k, v in batch.items()
            if k not in ("attention_mask", "position_ids") and not k.startswith(("cu_seq_lens", "max_length"))
        }
        return PackedBatch(kept, batch.placements)

    monkeypatch.setattr(PackingCollator, "__call__", leaky)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_passes_and_judges_against_padding_noise(dtype):
    weights, autocast = DTYPES[dtype]
    report = verify_isolation(build_model("tiny-llama", dtype=weights), backends=["sdpa", "padless"], autocast=autocast)
    assert report.passed and report.dtype == dtype.replace("-bf16", "-bfloat16")
    for r in report.results:
        assert r.status == "pass" and r.logit_noise is not None and r.grad_noise is not None
        assert r.logit_tolerance >= report.factor * r.logit_noise and r.grad_tolerance >= report.factor * r.grad_noise


@pytest.mark.parametrize("check", ["sampled", "thorough"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_leaky_rows_fail_in_every_dtype_by_a_wide_margin(leaky_collator, dtype, check):
    """The sampled default (one row, one padded document, the last block's gradients) is not blind."""
    weights, autocast = DTYPES[dtype]
    report = verify_isolation(
        build_model("tiny-gpt2", dtype=weights), backends=["sdpa"], autocast=autocast, check=check
    )
    plain = report.results[0]
    assert not report.passed and plain.status == "fail"
    assert plain.max_logit_diff > 5 * plain.logit_tolerance and plain.grad_rel_diff > 5 * plain.grad_tolerance
    assert any(line.startswith("document ") and "packed vs padded" in line for line in plain.evidence)
    assert any(line.startswith("gradients: packed") for line in plain.evidence)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "autocast-bf16"])
def test_cli_leaky_rows_exit_1_with_the_evidence(leaky_collator, capsys, dtype):
    from padless.cli import main

    assert main(["verify", "--model", "tiny-llama", "--backends", "sdpa", "--dtype", dtype]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "tokens packed vs padded" in out and "gradients: packed" in out


def test_cli_json_and_exit_status(capsys):
    from padless.cli import main

    assert main(["verify", "--model", "tiny-qwen2", "--backends", "sdpa,padless,flex_attention", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["passed"] is True
    assert [r["status"] for r in out["results"]] == ["pass", "pass", "refused"] * 2  # plain, then shared-prompt rows


def test_cli_human_output_and_custom_lengths(capsys):
    from padless.cli import main

    assert (
        main(["verify", "--model", "tiny-gpt2", "--backends", "eager", "--lengths", "1,30,2", "--max-length", "0"]) == 0
    )
    text = capsys.readouterr().out
    assert "eager" in text and "PASS" in text and "[1, 30, 2]" in text


def test_cli_oracle_runs_float64_too(capsys):
    from padless.cli import main

    assert main(["verify", "--model", "tiny-gpt2", "--backends", "sdpa", "--oracle", "float64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["passed"] is True and out["oracle"]["dtype"] == "float64"
    assert max(r["max_logit_diff"] for r in out["oracle"]["results"]) < 1e-12


def test_cli_bad_factor(capsys):
    from padless.cli import main

    assert main(["verify", "--model", "tiny-gpt2", "--factor", "0.5"]) == 2
    assert "--factor must be >= 1" in capsys.readouterr().err


# ------------------------------------------------------------------ rows, progress, sampled vs thorough


@pytest.mark.parametrize("max_length", [1, 2, 7, 32, 512, 2048])
@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("seed", [0, 1])
def test_sample_lengths_fill_rows_at_their_boundaries(max_length, rows, seed):
    lengths = sample_lengths(max_length, rows, seed=seed)
    filled, fill = [], 0  # next-fit, as the verifier packs them
    for n in lengths:
        assert 1 <= n <= max_length
        if fill + n > max_length:
            filled, fill = [*filled, fill], 0
        fill += n
    filled.append(fill)
    assert len(filled) == rows and lengths[0] == 1
    assert all(f == max_length for f in filled[:-1])  # rows before the last end exactly at the row's end
    if max_length >= 16:
        assert filled[-1] < max_length and len(set(lengths)) >= 3  # a padded tail; varied lengths
    assert sample_lengths(max_length, rows, seed=seed) == lengths


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("window", [200, 400, 509, 510, 511])
def test_sample_lengths_exceed_a_sliding_window(rows, window):
    lengths = sample_lengths(512, rows, seed=0, window=window)
    assert max(lengths) > window and sum(lengths) <= 512 * rows
    assert lengths[0] == 1 or window + 1 >= 512


@pytest.fixture
def row_shapes(monkeypatch):
    """The [rows, width] of every packed batch the verifier builds."""
    from padless.batching.collate import PackingCollator

    shapes, original = [], PackingCollator.__call__

    def spy(self, features):
        batch = original(self, features)
        shapes.append(tuple(batch["input_ids"].shape))
        return batch

    monkeypatch.setattr(PackingCollator, "__call__", spy)
    return shapes


def test_rows_have_the_length_asked_for(row_shapes):
    report = verify_isolation(build_model("tiny-gpt2"), backends=["sdpa"], max_length=96)
    assert row_shapes == [(1, 96)] and report.max_length == 96 and report.coverage.row_length == 96
    assert sum(report.lengths) <= 96 and len(report.lengths) == 6


def test_rows_are_capped_at_the_models_positions(row_shapes, capsys):
    from padless.cli import main

    model = build_model("tiny-llama")  # 512 positions
    report = verify_isolation(model, backends=["sdpa"])  # the default max_length, 2048
    assert report.facts.context == 512 and report.max_length == 512 and row_shapes == [(1, 512)]
    assert (
        report.coverage.requested_length == 2048 and "capped at the model's positions" in report.coverage.describe()[0]
    )
    assert main(["verify", "--model", "tiny-llama", "--backends", "sdpa", "--max-length", "4096", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["max_length"] == 512 and out["coverage"]["requested_length"] == 4096 and row_shapes[-1] == (1, 512)


def test_cli_shows_progress_as_it_goes(capsys):
    from padless.cli import main

    assert main(["verify", "--model", "tiny-llama", "--backends", "sdpa,flex_attention", "--max-length", "64"]) == 0
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    starts = [i for i, line in enumerate(err) if line.startswith("[")]
    assert err[0].startswith("model LlamaForCausalLM, ") and "512 positions" in err[0] and "float32 on cpu" in err[0]
    assert "; loaded in " in err[0]
    assert err[1].startswith(
        "rule (padless.check_exact), documents layout, rows of 64: exact on sdpa (mask4d); refuses flex_attention"
    )
    assert err[2].startswith("rule (padless.check_exact), shared prompt layout")
    assert err[3].startswith("sampled check: 6 documents") and "in 1 row of 64" in err[3]
    assert err[4].startswith("sampled: logits of every document; padding's noise from document ")
    assert err[5].startswith("columns: alone = each document run by itself") and "limit = max(4 x padded" in err[5]
    assert [err[i] for i in starts] == [
        "[1/4] sdpa: packed vs alone vs padded, 6 documents in 1 row of 64 ...",
        err[starts[1]],
        "[2/4] flex_attention: refused by the rule (reason in the table)",
        "[3/4] sdpa+shared_prompt: packed vs alone vs padded, 3 prompts, 7 completions in one row ...",
        err[starts[4]],
        "[4/4] flex_attention+shared_prompt: refused by the rule (reason in the table)",
    ]
    assert err[starts[1]].startswith("[1/4] sdpa: pass in ") and err[starts[4]].startswith(
        "[3/4] sdpa+shared_prompt: pass in "
    )
    assert "columns: alone = " in captured.out and "sampled: " in captured.out  # the report explains itself too


def test_library_progress_goes_to_the_callable():
    lines = []
    verify_isolation(build_model("tiny-gpt2"), backends=["eager"], max_length=32, progress=lines.append)
    assert lines[0].startswith("model GPT2LMHeadModel, ") and lines[-1].startswith(
        "[2/2] eager+shared_prompt: pass in "
    )


def test_the_default_is_sampled_and_says_what_it_sampled():
    model = build_model("tiny-gpt2")
    report = verify_isolation(model, backends=["sdpa", "eager"], max_length=128)
    cov = report.coverage
    params, scope = sampled_parameters(model)
    assert cov.check == "sampled" and cov.rows == 1 and cov.padded == [int(np.argmax(report.lengths))]
    assert scope == "transformer.h.1, transformer.ln_f" and cov.grad_scope == scope
    assert cov.grad_parameters == sum(p.numel() for p in params) < report.facts.trainable
    assert cov.alone_on == "sdpa"  # the documents ran alone once, for both backends
    first, second = cov.describe()
    assert first.startswith("sampled check: 6 documents") and second.startswith("sampled: logits of every document")
    assert f"gradients of {cov.grad_parameters:,} parameters (transformer.h.1, transformer.ln_f)" in second
    assert all(p.requires_grad for p in model.parameters())  # the frozen ones are trainable again


def test_thorough_runs_the_full_check(row_shapes, capsys):
    from padless.cli import main

    model = build_model("tiny-llama")
    report = verify_isolation(model, backends=["sdpa", "padless"], max_length=64, check="thorough")
    cov = report.coverage
    assert report.passed and cov.check == "thorough" and cov.rows == 2 and row_shapes == [(2, 64), (2, 64)]
    assert cov.padded == list(range(len(report.lengths))) and cov.alone_on is None
    assert cov.grad_parameters == report.facts.trainable and cov.grad_scope == "every trainable parameter"
    assert (
        main(["verify", "--model", "tiny-llama", "--backends", "sdpa", "--max-length", "64", "--thorough", "--json"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["coverage"]["check"] == "thorough" and out["passed"]
    with pytest.raises(ValueError, match="check='fast' must be one of sampled, thorough"):
        verify_isolation(model, check="fast")


@pytest.mark.parametrize("check", ["sampled", "thorough"])
def test_a_leak_of_labels_alone_fails_on_gradients(monkeypatch, check):
    """Document starts trained (the previous document's last token learns to predict them): the
    logits are untouched, so only the gradients can see it, and the sampled parameters do."""
    import padless.batching.collate as collate

    monkeypatch.setattr(collate, "mask_document_starts", lambda labels, docs: labels)
    report = verify_isolation(build_model("tiny-llama"), backends=["sdpa"], max_length=64, check=check)
    plain = report.results[0]
    assert plain.status == "fail" and plain.max_logit_diff <= plain.logit_tolerance
    assert plain.grad_rel_diff > 5 * plain.grad_tolerance and plain.evidence[-1].startswith("gradients: packed")


def test_unknown_backend_is_refused():
    report = verify_isolation(build_model("tiny-gpt2"), backends=["sdpa", "magic"])
    assert report.results[1].status == "refused" and "unknown attention backend" in report.results[1].detail


SMOLLM2_VOCAB = 4096


@pytest.fixture(scope="module")
def smollm2_trimmed():
    """The packaged pretrained smollm2-135m (real weights, logits up to ~30) cut to its first 2 decoder
    layers and its first SMOLLM2_VOCAB tokens, embeddings frozen (the 49k x 576 table dominates a CPU
    backward, in bf16 most of all): the real model's scale of logits and bf16 noise, at a test's cost.
    The full model is in docs/verify.md."""
    model = build_model("smollm2-135m")
    model.resize_token_embeddings(SMOLLM2_VOCAB)  # keeps the first rows; the head stays tied to them
    model.model.layers = model.model.layers[:2]
    model.config.num_hidden_layers = 2
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:2]
    model.get_input_embeddings().weight.requires_grad_(False)
    return model


SMOLLM2_SEQUENCES = [f["input_ids"] for f in random_sequences([1, 6, 11, 4, 9], SMOLLM2_VOCAB, seed=0)]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "autocast-bf16"])
def test_packaged_smollm2_passes_in_fp32_bf16_and_autocast(smollm2_trimmed, dtype):
    """The false alarm of a fixed tolerance (bf16: 3.06 against 0.755 on the full model) cannot come back."""
    weights, autocast = DTYPES[dtype]
    model = smollm2_trimmed if weights == torch.float32 else _copy_to(smollm2_trimmed, weights)
    report = verify_isolation(model, SMOLLM2_SEQUENCES, backends=["sdpa", "padless"], max_length=16, autocast=autocast)
    assert [r.status for r in report.results] == ["pass"] * 4, report.results


@pytest.mark.slow
def test_packaged_smollm2_leaky_rows_fail_in_bf16(smollm2_trimmed, leaky_collator):
    model = _copy_to(smollm2_trimmed, torch.bfloat16)
    report = verify_isolation(model, SMOLLM2_SEQUENCES, backends=["sdpa"], max_length=16)
    plain = report.results[0]
    assert plain.status == "fail" and plain.max_logit_diff > 3 * plain.logit_tolerance, plain
    assert plain.evidence


def _copy_to(model, dtype):
    import copy

    return copy.deepcopy(model).to(dtype)


@pytest.mark.parametrize(("flags", "backends"), [
    ([], ["sdpa", "padless"]),
    (["--thorough"], ["sdpa", "eager", "padless", "flash_attention_2", "flex_attention"]),
    (["--backends", "eager"], ["eager"]),
])  # fmt: skip
def test_cli_default_backends_follow_the_check(monkeypatch, flags, backends):
    """The sampled default checks transformers' default and padless' own backend; --thorough every one."""
    import padless.cli.verify as cli_verify
    from padless.cli import main
    from padless.isolation.verify import VerifyReport

    asked = []

    def fake(model, sequences, **kw):
        asked.append((kw["backends"], kw["check"]))
        return VerifyReport("m", "float32", "cpu", [3], 32, [])

    monkeypatch.setattr(cli_verify, "verify_isolation", fake)
    main(["verify", "--model", "tiny-gpt2", *flags])
    assert asked == [(backends, "thorough" if "--thorough" in flags else "sampled")]
