"""``padless verify`` / ``verify_isolation``: passes on every backend padless packs with, refuses what
cannot isolate, and fails (non-zero exit) when packed rows are contaminated."""

import json

import pytest

from padless.models.factory import TINY_FAMILIES, build_model
from padless.isolation.verify import verify_isolation


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_every_backend_that_runs_is_isolated(family):
    report = verify_isolation(build_model(f"tiny-{family}"))
    by_name = {r.backend: r for r in report.results}
    assert report.passed
    for backend in ("sdpa", "eager", "padless"):
        assert by_name[backend].status == "pass", by_name[backend]
        assert by_name[backend].max_logit_diff < 1e-5
        assert by_name[backend].grad_rel_diff < 1e-5
    assert by_name["flex_attention"].status == "refused"
    assert "use backend 'padless'" in by_name["flex_attention"].detail


def test_restores_the_models_attention_and_mode():
    model = build_model("tiny-llama", attn_implementation="eager")
    model.train()
    verify_isolation(model, backends=["sdpa", "padless"])
    assert model.config._attn_implementation == "eager" and model.training


def test_contamination_is_detected(monkeypatch):
    """A collator that lets documents see each other (a plain causal row) must fail the check."""
    from padless.batching.collate import PackingCollator
    from padless.batching.batch import PackedBatch

    original = PackingCollator.__call__

    def leaky(self, features):
        batch = original(self, features)
        batch.pop("attention_mask", None)
        batch["position_ids"] = None  # positions run on, and no mask: plain causal over the row
        return PackedBatch({k: v for k, v in batch.items() if v is not None}, batch.placements)

    monkeypatch.setattr(PackingCollator, "__call__", leaky)
    report = verify_isolation(build_model("tiny-gpt2"), backends=["sdpa"])
    assert not report.passed
    assert report.results[0].status == "fail" and report.results[0].max_logit_diff > 1e-3


def test_cli_json_and_exit_status(capsys):
    from padless.cli import main

    assert main(["verify", "--model", "tiny-qwen2", "--backends", "sdpa,padless,flex_attention", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["passed"] is True
    assert [r["status"] for r in out["results"]] == ["pass", "pass", "refused"] * 2  # plain, then shared-prompt rows


def test_cli_human_output_and_custom_lengths(capsys):
    from padless.cli import main

    assert main(["verify", "--model", "tiny-gpt2", "--backends", "eager", "--lengths", "1,30,2", "--max-length", "0"]) == 0
    text = capsys.readouterr().out
    assert "eager" in text and "PASS" in text and "[1, 30, 2]" in text


def test_unknown_backend_is_refused():
    report = verify_isolation(build_model("tiny-gpt2"), backends=["sdpa", "magic"])
    assert report.results[1].status == "refused" and "unknown attention backend" in report.results[1].detail
