"""The trainers' boundary (padless.integrations.trainer_boundary): the start line reaches a user who set up
no logging, and padless' messages are said in the trainer's own words."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("torch")


def test_the_start_line_is_shown_where_the_application_set_up_no_logging(monkeypatch, capsys):
    """No handler up to the root (no logging.basicConfig; pytest's own are removed here): the line reaches
    stderr at INFO, where Python's default (WARNING, no handler) and transformers' verbosity would hide it."""
    from padless.integrations.trainer_boundary import shown

    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    log = logging.getLogger("padless.test_shown")
    monkeypatch.setattr(log, "handlers", [])
    monkeypatch.setattr(log, "level", logging.NOTSET)
    shown(log).info("padless: the start line")
    assert capsys.readouterr().err == "padless: the start line\n"
    shown(log).info("again")  # one handler, not one per call
    assert capsys.readouterr().err == "again\n"
    configured = logging.getLogger("padless.test_configured")  # the application's own level is left alone
    monkeypatch.setattr(logging.getLogger("padless"), "level", logging.WARNING)
    shown(configured).info("hidden")
    assert not configured.handlers and capsys.readouterr().err == ""


def test_library_messages_in_trainer_words():
    from padless.integrations.trainer_boundary import in_trainer_words
    from padless.integrations.transformers import PACKED_TRAINER_WORDS

    words = {**PACKED_TRAINER_WORDS, "seq_length": "SFTConfig.max_length", "strategy": "SFTConfig.packing_strategy"}
    for message, said in [
        (
            "sequence 4 has length 40, longer than max_length 32 (and 2 more); choose overlong='truncate', 'split' or "
            "'drop'",
            "sequence 4 has length 40, longer than PackedTrainer(max_length=32) (and 2 more); choose "
            "PackedTrainer(overlong='truncate'), 'split' or 'drop'",
        ),
        ("sequences longer than seq_length=16: 1", "sequences longer than SFTConfig(max_length=16): 1"),
        ("unknown overlong policy 'x'; choose one of", "unknown PackedTrainer(overlong='x'); choose one of"),
        (
            "strategy='wrapped' splits; use strategy='bfd'",
            "SFTConfig(packing_strategy='wrapped') splits; use SFTConfig(packing_strategy='bfd')",
        ),
        ("every sequence was dropped by overlong", "every sequence was dropped by PackedTrainer(overlong=...)"),
        ("rows_per_batch must be an integer >= 1", "PackedTrainer(rows_per_batch=...) must be an integer >= 1"),
        ("max_length_q and a packing_strategy='bfd' stay", "max_length_q and a packing_strategy='bfd' stay"),
        (
            "...; use backend 'padless'",
            "...; use backend 'padless' (attn_implementation='padless' when loading the model)",
        ),
    ]:
        assert in_trainer_words(message, words) == said


def test_the_start_line_says_how_a_hybrids_documents_reach_its_mixers():
    """Boundaries sent (and by which path each kind of mixer keeps documents apart), or, for a collator
    padless did not fit, that the mixers read restarted position ids."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "attention"))
    from test_mixers import build

    import padless
    from padless.integrations.trainer_boundary import start_line

    model = build("qwen3_5_text", "sdpa")
    fitted = padless.PackingCollator.for_model(model, max_length=32)
    said = start_line(model, fitted, rows="32-token rows", documents="2 documents per row")
    assert "boundaries sent to the token mixers (1 gated_deltanet layer: one chunked scan" in said
    free = padless.PackingCollator(model_free=True, max_length=32)
    said = start_line(model, free, rows="32-token rows", documents="2 documents per row")
    assert "no document boundaries sent: the token mixers read restarted position_ids" in said
