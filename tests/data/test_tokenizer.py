"""The offline tokenizers: exact GPT-2 ids, SmolLM2's tokenizer and template, fingerprints."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from padless.data.tokenizer import load_tokenizer, tokenizer_fingerprint


@cache
def tok(name: str) -> Any:
    return load_tokenizer(name)


@pytest.mark.parametrize(
    ("text", "ids"),
    [  # ids as OpenAI's GPT-2 encoder gives them
        ("Hello world", [15496, 995]),
        (" Hello", [18435]),
        ("<|endoftext|>", [50256]),
        ("don't", [9099, 470]),
    ],
)
def test_gpt2_ids_are_exact(text: str, ids: list[int]) -> None:
    assert tok("gpt2")(text)["input_ids"] == ids


def test_gpt2_special_tokens() -> None:
    t = tok("gpt2")
    assert len(t) == 50257
    assert t.eos_token_id == 50256 and t.pad_token_id == 50256
    assert t.chat_template is None  # rendering falls back to padless's default template


@given(st.text(max_size=60))
@settings(max_examples=60, deadline=None)
def test_gpt2_roundtrips_any_text(text: str) -> None:
    t = tok("gpt2")
    ids = t(text, add_special_tokens=False)["input_ids"]
    assert t.decode(ids) == text or "<|endoftext|>" in text


def test_smollm2_tokenizer() -> None:
    t = tok("smollm2")
    assert len(t) == 49152
    assert t.eos_token == "<|im_end|>" and t.eos_token_id == 2 and t.pad_token_id == 2
    text = t.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert t("<|im_start|>user")["input_ids"][0] == 1  # a special token, not characters


def test_fingerprints_tell_tokenizers_apart_and_are_stable() -> None:
    a, b = tokenizer_fingerprint(tok("gpt2")), tokenizer_fingerprint(tok("smollm2"))
    assert a != b
    assert tokenizer_fingerprint(load_tokenizer("gpt2")) == a
    changed = load_tokenizer("gpt2")
    changed.chat_template = "{{ messages }}"
    assert tokenizer_fingerprint(changed) != a


def test_unknown_tokenizer_name_fails_loudly() -> None:
    with pytest.raises(ValueError, match="no such folder.*built-in names \\(gpt2, smollm2"):
        load_tokenizer("/nonexistent/tokenizer/folder")
