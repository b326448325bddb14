"""A batch (or a collator) built without the model is checked where it meets the model: exact batches
pass, those some model would run contaminated are refused with the reason and the fix."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch

from conftest import make_features, max_diff_to_alone
from padless.attention.accept import carried_inputs, check_batch, row_documents
from padless.attention.backend import register_padless_attention
from padless.batching.collate import PackingCollator, PaddingCollator
from padless.batching.rowformat import check_collator

VOCAB, WINDOW, ROW = 64, 8, 32
LENGTHS = (20, 3, 13, 1, 17, 9)
TINY = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)


def _model(kind: str, backend: str = "sdpa"):
    import transformers as tf

    if backend == "padless":
        register_padless_attention()
    torch.manual_seed(0)
    config = {
        "llama": lambda: tf.LlamaConfig(**TINY),
        "mistral": lambda: tf.MistralConfig(**TINY, sliding_window=WINDOW),
        "gemma3": lambda: tf.Gemma3TextConfig(
            **TINY, head_dim=8, sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"]
        ),
        "roberta": lambda: tf.RobertaConfig(**{**TINY, "num_key_value_heads": None}, is_decoder=True),
    }[kind]()
    return tf.AutoModelForCausalLM.from_config(config, attn_implementation=backend).eval()


def _feats():
    return make_features(LENGTHS, vocab_size=VOCAB, seed=4)


def test_a_model_free_batch_that_is_exact_passes():
    model, feats = _model("llama"), _feats()
    batch = PackingCollator(model_free=True, max_length=ROW)(feats)
    check_batch(model, batch)
    assert max_diff_to_alone(model, feats, batch) < 1e-5


def test_a_model_free_batch_without_the_models_window_is_refused():
    model, feats = _model("mistral"), _feats()
    plain = PackingCollator(model_free=True, max_length=ROW)(feats)
    assert max_diff_to_alone(model, feats, plain) > 1e-2  # what the check prevents: the mask lost the window
    with pytest.raises(ValueError, match="sliding window of 8 tokens.*PackingCollator.for_model"):
        check_batch(model, plain)
    fitted = PackingCollator.for_model(model, max_length=ROW)(feats)
    check_batch(model, fitted)
    assert max_diff_to_alone(model, feats, fitted) < 1e-5


def test_per_layer_type_masks_are_checked_by_layer_type():
    model, feats = _model("gemma3"), _feats()
    with pytest.raises(ValueError, match="layer types need masks with sliding windows"):
        check_batch(model, PackingCollator(model_free=True, max_length=ROW)(feats))
    batch = PackingCollator.for_model(model, max_length=ROW)(feats)
    assert isinstance(batch["attention_mask"], dict)
    check_batch(model, batch)
    batch["attention_mask"]["sliding_attention"] = batch["attention_mask"]["full_attention"]  # window dropped
    with pytest.raises(ValueError, match="sliding window of 8 tokens"):
        check_batch(model, batch)


def test_the_batch_form_must_be_the_backends():
    model, feats = _model("llama", "padless"), _feats()
    with pytest.raises(ValueError, match="carries 'mask4d' attention inputs.*only with 'varlen'"):
        check_batch(model, PackingCollator(model_free=True, max_length=ROW)(feats))
    check_batch(model, PackingCollator.for_model(model, max_length=ROW)(feats))
    half = PackingCollator(model_free=True, max_length=ROW, mask_dtype=torch.bfloat16)(feats)
    with pytest.raises(ValueError, match="mask is torch.bfloat16, the model computes in torch.float32"):
        check_batch(_model("llama"), half)


def test_models_padless_refuses_are_refused_for_any_batch():
    with pytest.raises(ValueError, match="padding_idx \\+ 1"):
        check_batch(_model("roberta"), PackingCollator(model_free=True, max_length=ROW)(_feats()))


def test_padded_batches_pass_and_inputs_are_read_from_the_batch():
    model, feats = _model("mistral"), _feats()
    padded = PaddingCollator()(feats)
    assert carried_inputs(padded) == "padding"
    check_batch(model, padded)
    assert carried_inputs(PackingCollator(model_free=True, max_length=ROW)(feats)) == "mask4d"
    assert carried_inputs(PackingCollator(model_free=True, max_length=ROW, attention="varlen")(feats)) == "varlen"
    assert (
        carried_inputs(PackingCollator(model_free=True, max_length=ROW, attention="position_ids")(feats))
        == "position_ids"
    )


def test_row_documents_are_the_placed_documents():
    batch = PackingCollator(model_free=True, max_length=ROW)(_feats())
    docs = row_documents(batch)
    starts = {
        (r, int(o)) for r, row in enumerate(docs) for o in ([0, *list(__import__("itertools").accumulate(row))[:-1]])
    }
    pl = batch.placements
    for j in range(pl.feature.size):
        r, o, n = int(pl.row[j]), int(pl.offset[j]), int(pl.length[j])
        assert (r, o) in starts and n in docs[r]
    assert all(sum(row) == batch["input_ids"].shape[1] for row in docs)


def test_check_collator_reads_the_collators_settings():
    mistral = _model("mistral")
    with pytest.raises(ValueError, match="windows None, the model needs 8"):
        check_collator(mistral, PackingCollator(max_length=ROW))
    check_collator(mistral, PackingCollator.for_model(mistral, max_length=ROW))
    check_collator(_model("llama"), PackingCollator(max_length=ROW))
    with pytest.raises(ValueError, match="attention='mask4d'.*only with 'varlen'"):
        check_collator(_model("llama", "padless"), PackingCollator(max_length=ROW))


def test_a_collator_built_without_the_model_refuses_to_collate_until_fitted():
    from padless.batching.preference import PreferenceCollator, RolloutCollator
    from padless.objectives.logprobs import sequence_logprobs

    feats = _feats()
    plain = PackingCollator(max_length=ROW)
    with pytest.raises(ValueError, match="this PackingCollator was built without a model.*for_model.*check_collator"):
        plain(feats)
    with pytest.raises(ValueError, match="empty"):  # bad input is still named first
        plain([{"input_ids": []}])
    assert dataclasses.replace(plain, model_free=True)(feats)["input_ids"].numel() > 0
    # preference / rollout batches go to sequence_logprobs, which checks every (model, batch) pair
    pair = {"prompt_ids": [1, 2, 3], "chosen_ids": list(range(4, 16)), "rejected_ids": list(range(20, 31))}
    group = {"prompt_ids": [1, 2, 3], "completion_ids": [list(range(4, 16)), list(range(20, 31))]}
    mistral = _model("mistral")
    for collator, features in (
        (PreferenceCollator(max_length=ROW, share_prompt=False), [pair]),
        (RolloutCollator(max_length=ROW, share_prompt=False), [group]),
    ):
        batch = collator(features)
        with pytest.raises(ValueError, match="sliding window of 8 tokens"):
            sequence_logprobs(mistral, batch)
        fitted = type(collator).for_model(mistral, max_length=ROW, share_prompt=False)
        sequence_logprobs(mistral, fitted(features))
        with pytest.raises(ValueError, match="settings changed"):
            dataclasses.replace(fitted, windows=None)(features)
    llama = _model("llama")
    fitted = check_collator(llama, plain)
    assert fitted.verdict.model == "LlamaForCausalLM (sdpa)" and plain.verdict is None
    assert fitted.totals is plain.totals  # a copy that keeps counting into the same totals
    before = plain.totals["sequences"]
    batch = fitted(feats)
    check_batch(llama, batch)
    assert max_diff_to_alone(llama, feats, batch) < 1e-5
    assert plain.totals["sequences"] == before + len(feats)
    with pytest.raises(ValueError, match="built without a model"):
        plain(feats)  # the original stays unfitted
    for kept in (dataclasses.replace(fitted, pad_to_multiple_of=8), pickle.loads(pickle.dumps(fitted))):
        assert kept.verdict == fitted.verdict
        kept(feats)
    assert PackingCollator.for_model(llama, max_length=ROW).verdict.model == "LlamaForCausalLM (sdpa)"


def test_a_fitted_collator_whose_settings_changed_must_be_fitted_again():
    mistral, feats = _model("mistral"), _feats()
    short = PackingCollator.for_model(mistral, max_length=WINDOW)  # no document outgrows the window: no window sent
    assert short.windows is None
    longer = dataclasses.replace(short, max_length=ROW)  # now documents do, and the mask still has no window
    with pytest.raises(ValueError, match=f"fitted to MistralForCausalLM \\(sdpa\\).*max_length {WINDOW} -> {ROW}"):
        longer(feats)
    assert (
        max_diff_to_alone(mistral, feats, dataclasses.replace(longer, model_free=True)(feats)) > 1e-2
    )  # what it prevents
    with pytest.raises(ValueError, match="sliding windows None, the model needs 8"):
        check_collator(mistral, longer)
    dataclasses.replace(short, pad_to_multiple_of=4)(make_features([3, 5], vocab_size=VOCAB))  # padding: still fitted


def test_fitting_refuses_where_the_batches_would_be_contaminated_and_keeps_what_is_exact():
    mistral, feats = _model("mistral"), _feats()
    with pytest.raises(ValueError, match="sliding windows None, the model needs 8"):
        check_collator(mistral, PackingCollator(max_length=ROW))
    # position ids alone: transformers builds Mistral's per-document masks, window included
    fitted = check_collator(mistral, PackingCollator(max_length=ROW, attention="position_ids"))
    batch = fitted(feats)
    assert "attention_mask" not in batch
    assert max_diff_to_alone(mistral, feats, batch) < 1e-5
    with pytest.raises(ValueError, match="padding_idx \\+ 1"):
        check_collator(_model("roberta"), PackingCollator(max_length=ROW, attention="position_ids"))


def test_sequence_logprobs_refuses_a_batch_the_model_would_run_contaminated():
    from padless.objectives.logprobs import sequence_logprobs

    model, feats = _model("mistral"), _feats()
    with pytest.raises(ValueError, match="sliding window of 8 tokens"):
        sequence_logprobs(model, PackingCollator(model_free=True, max_length=ROW)(feats))
    sequence_logprobs(model, PackingCollator.for_model(model, max_length=ROW)(feats))


def test_packed_trainer_fits_a_model_free_collator_or_refuses_it(tmp_path):
    pytest.importorskip("accelerate")
    from transformers import TrainingArguments

    from padless.integrations.transformers import PackedTrainer

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], per_device_train_batch_size=2)
    with pytest.raises(ValueError, match="sliding windows None, the model needs 8"):
        PackedTrainer(_model("mistral"), args, data_collator=PackingCollator(max_length=ROW), max_length=ROW)
    llama = _model("llama")
    trainer = PackedTrainer(llama, args, data_collator=PackingCollator(max_length=ROW), max_length=ROW)
    assert trainer.data_collator.verdict.model == "LlamaForCausalLM (sdpa)"  # the fitted copy collates
    assert max_diff_to_alone(llama, _feats(), trainer.data_collator(_feats())) < 1e-5


def test_a_mask_is_compared_once_per_window():
    from padless.attention import accept

    model, feats = _model("mistral"), _feats()
    batch = PackingCollator.for_model(model, max_length=ROW)(feats)
    check_batch(model, batch)
    assert accept._checked(batch["attention_mask"], WINDOW) and not accept._checked(batch["attention_mask"], None)
    check_batch(model, batch)  # the second call skips the comparison, and still passes
    wrong = PackingCollator(model_free=True, max_length=ROW)(feats)  # another tensor: compared, refused
    with pytest.raises(ValueError, match="sliding window"):
        check_batch(model, wrong)
    assert not accept._checked(wrong["attention_mask"], WINDOW)


def test_three_axis_position_ids_are_read_like_text_positions():
    """Multimodal RoPE (Qwen2-VL family) takes position ids ``[3, R, L]``; for text every axis restarts alike."""
    batch = PackingCollator(model_free=True, max_length=ROW, attention="position_ids")(_feats())
    flat = row_documents(batch)
    stacked = dict(batch, position_ids=batch["position_ids"][None].expand(3, -1, -1))
    assert row_documents(stacked) == flat


def _ones_mask(batch):
    """The batch with the all-ones 2D ``attention_mask`` many pipelines add (a PackedBatch keeps its placements)."""
    from padless.batching.batch import PackedBatch

    return PackedBatch({**batch, "attention_mask": torch.ones_like(batch["input_ids"])}, batch.placements)


def test_a_2d_mask_on_packed_rows_is_refused_everywhere_and_the_batch_without_it_is_exact():
    from padless.objectives.logprobs import sequence_logprobs
    from padless.objectives.loss import model_loss, step_num_items

    model, feats = _model("llama"), make_features(LENGTHS, vocab_size=VOCAB, seed=4, with_labels=True)
    batch = PackingCollator(model_free=True, max_length=ROW, attention="position_ids")(feats)
    assert "attention_mask" not in batch
    check_batch(model, batch)
    assert max_diff_to_alone(model, feats, batch) < 1e-5
    masked = _ones_mask(batch)
    assert masked.placements is batch.placements
    assert max_diff_to_alone(model, feats, masked) > 1e-2  # what the refusal prevents
    n = step_num_items([batch])
    for call in (
        lambda: check_batch(model, masked),
        lambda: model_loss(model, masked, n),
        lambda: sequence_logprobs(model, masked),
    ):
        with pytest.raises(ValueError, match="packed .*2D attention_mask.*drop the 'attention_mask' key.*for_model"):
            call()
    # the same loss, exact: padded rows (one document each) against the packed batch without the mask
    padded = PaddingCollator()(feats)
    check_batch(model, padded)  # a padded batch with its 2D mask stays accepted
    with torch.no_grad():
        packed_loss = model_loss(model, batch, n)
        padded_loss = model_loss(model, padded, step_num_items([padded]))
    assert abs(packed_loss.item() - padded_loss.item()) < 1e-5
    alone = torch.stack([sequence_logprobs(model, PaddingCollator()([f]))[0] for f in feats])
    with torch.no_grad():
        assert (sequence_logprobs(model, batch) - alone).abs().max().item() < 1e-4


def test_masks_that_cannot_isolate_the_documents_are_refused_by_shape_and_block():
    model, feats = _model("llama"), _feats()
    batch = PackingCollator(model_free=True, max_length=ROW)(feats)  # a 4D block-causal mask
    R, L = batch["input_ids"].shape
    for bad, what in (
        (batch["attention_mask"][:, :, :-1, :-1], "4D attention_mask has shape"),
        (batch["attention_mask"][:, 0], "attention_mask has shape"),
        (torch.ones(R, L + 1, dtype=torch.long), "attention_mask has shape"),
    ):
        with pytest.raises(ValueError, match=f"{what}.*drop the 'attention_mask' key"):
            check_batch(model, dict(batch, attention_mask=bad))
    causal = torch.full((L, L), torch.finfo(torch.float32).min).triu(1).expand(R, 1, L, L)  # no document blocks
    from padless.objectives.loss import model_loss

    for call in (check_batch, lambda m, b: model_loss(m, b, 1)):
        with pytest.raises(ValueError, match="4D attention_mask lets query .* see key .*not block-causal"):
            call(model, dict(batch, attention_mask=causal.clone()))
    # varlen kwargs beside a 2D mask: packed too
    varlen = PackingCollator(model_free=True, max_length=ROW, attention="varlen")(feats)
    with pytest.raises(ValueError, match="cu_seq_lens_q holds .*2D attention_mask"):
        check_batch(model, dict(varlen, attention_mask=torch.ones_like(varlen["input_ids"])))
    # a row holding one document (plus nothing else) is a padded row: accepted with a 2D mask
    whole = make_features([ROW, ROW], vocab_size=VOCAB)
    one = PackingCollator(model_free=True, max_length=ROW, attention="position_ids")(whole)
    check_batch(model, _ones_mask(one))
