"""Chat rendering and label masks, spelled out on small literal chats."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from padless.data.chat import DEFAULT_CHAT_TEMPLATE, chat_pieces, check_messages, tool_call_text
from padless.data.encode import EncodeOptions, encode_records
from padless.data.records import RecordError
from padless.data.tokenizer import load_tokenizer
from padless.layout import IGNORE_INDEX


@cache
def tok(name: str = "gpt2") -> Any:
    return load_tokenizer(name)


CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Weather?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": '{"q": "sun"}'}}],
    },
    {"role": "tool", "content": "sunny"},
    {"role": "assistant", "content": "Sunny."},
]
CALL = '<tool_call>\n{"name": "search", "arguments": {"q": "sun"}}\n</tool_call>'


def trained_text(name: str, train_on: str, messages: list[dict[str, Any]] = CHAT) -> list[str]:
    """The decoded stretches of consecutive target tokens."""
    t = tok(name)
    ids, labels, _ = encode_records([{"messages": messages}], t, EncodeOptions(train_on=train_on))
    runs, current = [], []
    for i, lab in zip(ids[0], labels[0]):
        if lab == IGNORE_INDEX:
            if current:
                runs.append(t.decode(current))
            current = []
        else:
            assert lab == i
            current.append(i)
    return runs + ([t.decode(current)] if current else [])


def test_default_template_pieces_for_assistant_labels() -> None:
    pieces = chat_pieces(check_messages(CHAT, "record 1"), tok(), "assistant")
    assert pieces == [
        ("<|im_start|>system\nBe brief.<|im_end|>\n", False),
        ("<|im_start|>user\nHi<|im_end|>\n", False),
        ("<|im_start|>assistant\n", False),
        ("Hello!<|im_end|>\n", True),
        ("<|im_start|>user\nWeather?<|im_end|>\n", False),
        ("<|im_start|>assistant\n", False),
        (f"{CALL}<|im_end|>\n", True),
        ("<|im_start|>tool\nsunny<|im_end|>\n", False),
        ("<|im_start|>assistant\n", False),
        ("Sunny.<|im_end|>\n", True),
    ]


# How a chat ends: GPT-2's DEFAULT_CHAT_TEMPLATE writes <|im_end|> as plain text, so EOS follows its
# newline; SmolLM2's <|im_end|> is its EOS, so the chat ends there (the newline after it is left out).
END = {"gpt2": "<|im_end|>\n<|endoftext|>", "smollm2": "<|im_end|>"}


@pytest.mark.parametrize("name", ["gpt2", "smollm2"])
@pytest.mark.parametrize(
    ("train_on", "expected"),
    [
        # every assistant body (text, tool call, end marker) and the one end of the document; nothing else
        ("assistant", ["Hello!<|im_end|>\n", f"{CALL}<|im_end|>\n", "Sunny.<END>"]),
        # only the reply to the last user turn: its tool call and its answer, not the tool result
        ("completion", [f"{CALL}<|im_end|>\n", "Sunny.<END>"]),
    ],
)
def test_label_masks(name: str, train_on: str, expected: list[str]) -> None:
    assert trained_text(name, train_on) == [e.replace("<END>", END[name]) for e in expected]


def test_smollm2_template_adds_its_default_system_turn_masked() -> None:
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
    pieces = chat_pieces(check_messages(chat, "record 1"), tok("smollm2"), "assistant")
    assert pieces[0] == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
        False,
    )
    assert pieces[1:] == [("<|im_start|>assistant\n", False), ("Yo<|im_end|>\n", True)]


def test_exact_labels_of_a_two_turn_chat() -> None:
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
    t = tok()
    ids, labels, _ = encode_records([{"messages": chat}], t, EncodeOptions(train_on="assistant"))
    full = t("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nYo<|im_end|>\n")["input_ids"] + [50256]
    assert ids[0] == full
    n_prompt = len(t("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")["input_ids"])
    assert labels[0] == [IGNORE_INDEX] * n_prompt + full[n_prompt:]
    _, labels_all, _ = encode_records([{"messages": chat}], t, EncodeOptions(train_on="all"))
    assert labels_all[0] == full


def test_eos_is_masked_after_a_masked_turn() -> None:
    chat = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}, {"role": "user", "content": "B"}]
    _, labels, _ = encode_records([{"messages": chat}], tok(), EncodeOptions(train_on="assistant"))
    assert labels[0][-1] == IGNORE_INDEX
    with pytest.raises(RecordError, match="record 1: train_on='completion' needs an assistant turn after"):
        encode_records([{"messages": chat}], tok(), EncodeOptions(train_on="completion"))


def test_tool_calls_in_openai_and_flat_forms() -> None:
    flat = [{"name": "f", "arguments": {"x": 1}}]
    wire = [{"type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]
    a = check_messages([{"role": "assistant", "content": "", "tool_calls": flat}], "record 1")
    b = check_messages([{"role": "assistant", "content": "", "tool_calls": wire}], "record 1")
    assert a == b
    assert tool_call_text(a[0]["tool_calls"][0]) == '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'


def test_text_beside_tool_calls_comes_first() -> None:
    chat = [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [{"name": "f", "arguments": {}}]},
    ]
    pieces = chat_pieces(check_messages(chat, "record 1"), tok(), "assistant")
    assert pieces[-1] == ('Let me look.\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call><|im_end|>\n', True)


def test_template_that_renders_tool_calls_gets_them_structured() -> None:
    template = (
        "{% for m in messages %}[{{ m.role }}]{{ m.content }}"
        "{% for c in m.tool_calls or [] %}CALL {{ c.function.name }}({{ c.function.arguments.x }})"
        "{% endfor %}\n{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    chat = [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "", "tool_calls": [{"name": "f", "arguments": {"x": 7}}]},
    ]
    pieces = chat_pieces(check_messages(chat, "record 1"), tok(), "assistant", chat_template=template)
    # (HF's Jinja environment trims the newline after a block tag)
    assert pieces == [("[user]Q", False), ("[assistant]", False), ("CALL f(7)", True)]


def test_content_parts_are_joined() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    msgs = check_messages([{"role": "user", "content": parts}], "record 1")
    assert msgs[0]["content"] == "ab"


def test_chat_without_assistant_turn_has_nothing_to_train() -> None:
    msgs = check_messages([{"role": "user", "content": "x"}], "record 1")
    with pytest.raises(RecordError, match="needs an assistant turn") as err:
        chat_pieces(msgs, tok(), "assistant")
    assert err.value.reason == "no_assistant_turn"
    assert chat_pieces(msgs, tok(), "all") == [("<|im_start|>user\nx<|im_end|>\n", True)]


def test_assistant_first_chat_cannot_be_masked() -> None:
    msgs = check_messages([{"role": "assistant", "content": "x"}], "record 1")
    with pytest.raises(RecordError, match="opens with an assistant turn") as err:
        chat_pieces(msgs, tok(), "assistant")
    assert err.value.reason == "assistant_first"


def test_template_that_is_not_prefix_stable_is_refused() -> None:
    # the message count up front changes every earlier rendering: prefixes do not extend each other
    template = "{{ messages | length }}{% for m in messages %}|{{ m.content }}{% endfor %}"
    msgs = check_messages([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "record 1")
    with pytest.raises(ValueError, match="not prefix-stable at message 1"):
        chat_pieces(msgs, tok(), "assistant", chat_template=template)


def test_bad_train_on_is_named() -> None:
    with pytest.raises(ValueError, match="train_on='prompt' is not one of all, assistant, completion"):
        chat_pieces(check_messages([{"role": "user", "content": "x"}], "record 1"), tok(), "prompt")


def test_default_template_is_chatml() -> None:
    t = tok()
    text = t.apply_chat_template(
        [{"role": "user", "content": "x"}], tokenize=False, chat_template=DEFAULT_CHAT_TEMPLATE
    )
    assert text == "<|im_start|>user\nx<|im_end|>\n"


WORDS = st.text(alphabet=st.characters(codec="ascii", categories=["L", "N", "P"]), min_size=1, max_size=12)
CONTENT = st.lists(WORDS, min_size=1, max_size=6).map(" ".join)
ROLE = st.sampled_from(["user", "assistant", "tool", "system"])


@given(st.lists(st.tuples(ROLE, CONTENT), min_size=1, max_size=7), st.sampled_from(["gpt2", "smollm2"]))
@settings(max_examples=40, deadline=None)
def test_targets_are_exactly_the_assistant_bodies(turns: list[tuple[str, str]], name: str) -> None:
    messages = [{"role": "user", "content": "start"}] + [{"role": r, "content": c} for r, c in turns]
    t = tok(name)
    pieces = (
        chat_pieces(check_messages(messages, "record 1"), t, "assistant")
        if any(r == "assistant" for r, _ in turns)
        else None
    )
    if pieces is None:
        return
    full = t.apply_chat_template(messages, tokenize=False, chat_template=t.chat_template or DEFAULT_CHAT_TEMPLATE)
    assert "".join(p for p, _ in pieces) == full
    bodies = [p for p, trained in pieces if trained]
    assert bodies == [f"{c}<|im_end|>\n" for r, c in turns if r == "assistant"]
    ids, labels, counts = encode_records([{"messages": messages}], t, EncodeOptions(train_on="assistant"))
    # ChatML boundaries sit at newlines and markers: piece-wise tokens equal whole-text tokens
    assert counts.boundary_mismatches == 0
    whole = t(full, add_special_tokens=False)["input_ids"]
    # GPT-2: EOS appended after ChatML's last "\n"; SmolLM2: the chat ends at its <|im_end|> (= EOS)
    assert ids[0] == (whole + [t.eos_token_id] if name == "gpt2" else whole[:-1])
    ending = 1 if name == "gpt2" else -1  # the EOS added, or the "\n" left out
    assert sum(lab != IGNORE_INDEX for lab in labels[0]) == sum(
        len(t(b, add_special_tokens=False)["input_ids"]) for b in bodies
    ) + ending * (turns[-1][0] == "assistant")
