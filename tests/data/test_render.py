"""How a document ends (one end-of-document token, never two) and the system prompt a chat template
adds, on three templates: SmolLM2's ChatML (its ``<|im_end|>`` is EOS), a Llama-3-style template
(``<|eot_id|>`` ends a turn, EOS is another token) and GPT-2 with padless' DEFAULT_CHAT_TEMPLATE
(``<|im_end|>`` is plain text there)."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest

from padless.data.chat import render_chat
from padless.data.encode import EncodeOptions, encode_records
from padless.data.tokenizer import load_tokenizer
from padless.layout import IGNORE_INDEX

SMOL_SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
LLAMA3 = (  # Llama 3's own template
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim"
    " + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
# the same, adding a default system turn after the BOS to a chat without one (as Llama 3.1's adds dates)
LLAMA3_DEFAULT_SYSTEM = LLAMA3.replace(
    "{% set content = bos_token + content %}",
    "{% set content = bos_token + ('' if message['role'] == 'system' else '<|start_header_id|>system"
    "<|end_header_id|>\n\nDefault prompt.<|eot_id|>') + content %}",
)
CHAT = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "hello there"}]


@cache
def tok(name: str) -> Any:
    if name != "llama3":
        return load_tokenizer(name)
    t = load_tokenizer("gpt2")  # a fresh instance: the other tests' GPT-2 stays as it is
    t.add_special_tokens(
        {
            "bos_token": "<|begin_of_text|>",
            "additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        }
    )
    t.chat_template = LLAMA3
    return t


def encode(name: str, records: list[Any], **options: Any) -> tuple[list[list[int]], list[list[int]], Any]:
    return encode_records(records, tok(name), EncodeOptions(**options))


def trained(name: str, ids: list[int], labels: list[int]) -> str:
    assert all(lab in (IGNORE_INDEX, i) for i, lab in zip(ids, labels))
    return tok(name).decode([i for i, lab in zip(ids, labels) if lab != IGNORE_INDEX])


@pytest.mark.parametrize(
    ("name", "ending"),
    [
        ("smollm2", "hello there<|im_end|>"),  # the template's end of turn is EOS: nothing appended, "\n" left out
        ("llama3", "hello there<|eot_id|>"),  # the end of turn ends the document: no <|endoftext|> after it
        ("gpt2", "hello there<|im_end|>\n<|endoftext|>"),  # <|im_end|> is text: EOS appended, once
    ],
)
@pytest.mark.parametrize("train_on", ["assistant", "all"])
def test_a_chat_ends_with_exactly_one_trained_end_token(name: str, ending: str, train_on: str) -> None:
    (ids,), (labels,), _ = encode(name, [{"messages": CHAT}], train_on=train_on)
    t = tok(name)
    text = t.decode(ids)
    assert text.endswith(ending)
    ends = {t.eos_token_id, t.convert_tokens_to_ids("<|eot_id|>") if name == "llama3" else t.eos_token_id}
    assert ids[-1] in ends and ids[-2] not in ends  # one end token, the last one
    assert labels[-1] == ids[-1]  # trained, as the reply it closes
    if train_on == "assistant":
        assert trained(name, ids, labels) == ending


@pytest.mark.parametrize("name", ["smollm2", "llama3", "gpt2"])
def test_the_end_token_of_a_masked_last_turn_is_masked(name: str) -> None:
    chat = [*CHAT, {"role": "user", "content": "Thanks"}]
    (ids,), (labels,), _ = encode(name, [{"messages": chat}], train_on="assistant")
    assert labels[-1] == IGNORE_INDEX and ids[-1] in {
        tok(name).eos_token_id,
        tok(name).convert_tokens_to_ids("<|eot_id|>"),
    }
    assert (
        tok(name)
        .decode(ids)
        .endswith(
            "Thanks" + {"smollm2": "<|im_end|>", "llama3": "<|eot_id|>", "gpt2": "<|im_end|>\n<|endoftext|>"}[name]
        )
    )


def test_smollm2_chat_ids_and_labels_literally() -> None:
    t = tok("smollm2")
    (ids,), (labels,), _ = encode("smollm2", [{"messages": CHAT}], train_on="assistant", system_prompt="none")
    prompt = t("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    reply = t("hello there<|im_end|>", add_special_tokens=False)["input_ids"]
    assert ids == prompt + reply and reply[-1] == t.eos_token_id == 2
    assert labels == [IGNORE_INDEX] * len(prompt) + reply


@pytest.mark.parametrize(("name", "text"), [("gpt2", "hello<|endoftext|>"), ("gpt2", "hello<|endoftext|>\n"),
                                            ("smollm2", "hello<|im_end|>")])  # fmt: skip
def test_text_ending_with_eos_is_not_doubled(name: str, text: str) -> None:
    (ids,), (labels,), _ = encode(name, [{"text": text}])
    t = tok(name)
    assert ids == t("hello", add_special_tokens=False)["input_ids"] + [t.eos_token_id] and labels == ids


def test_text_ending_with_whitespace_gets_eos_after_it() -> None:
    (ids,), _, _ = encode("gpt2", [{"text": "hello\n"}])
    assert tok("gpt2").decode(ids) == "hello\n<|endoftext|>"


def test_pretokenized_ids_are_taken_as_given() -> None:
    """No end token is appended to or removed from ``input_ids``: padless cannot know which tokenizer's
    conventions made them. Ids ending with EOS stay as they are; ids without one get none."""
    records = [{"input_ids": [1, 2, 50256]}, {"input_ids": [1, 2]}, {"input_ids": [1, 50256, 50256]}]
    ids, labels, _ = encode("gpt2", records)
    assert ids == [[1, 2, 50256], [1, 2], [1, 50256, 50256]] and labels == ids


@pytest.mark.parametrize(("name", "end"), [("smollm2", "<|im_end|>"), ("llama3", "<|eot_id|>"),
                                           ("gpt2", "<|endoftext|>")])  # fmt: skip
def test_a_truncated_chat_ends_once_again(name: str, end: str) -> None:
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "one two three four five six seven"}]
    (full,), _, _ = encode(name, [{"messages": chat}], train_on="assistant")
    (ids,), (labels,), counts = encode(
        name, [{"messages": chat}], train_on="assistant", max_length=len(full) - 2, overlong="truncate"
    )
    assert len(ids) == len(full) - 2 and counts.truncated_examples == 1
    assert ids[:-1] == full[: len(ids) - 1] and ids[-1] == tok(name).eos_token_id and labels[-1] == ids[-1]
    assert tok(name).decode(full).endswith(end)


# -- the system prompt a template adds ---------------------------------------------------------------


@pytest.mark.parametrize("train_on", ["assistant", "all"])
def test_smollm2_default_system_prompt_kept_and_counted_or_left_out(train_on: str) -> None:
    t = tok("smollm2")
    records = [{"messages": CHAT}, {"messages": [{"role": "system", "content": "Be brief."}, *CHAT]}]
    kept_ids, kept_labels, kept = encode("smollm2", records, train_on=train_on)
    none_ids, none_labels, none = encode("smollm2", records, train_on=train_on, system_prompt="none")
    assert kept.system_prompt_added == 1 and none.system_prompt_added == 0  # the chat with a system turn has none
    system = t(SMOL_SYSTEM, add_special_tokens=False)["input_ids"]
    assert kept_ids[0] == system + none_ids[0]
    assert kept_labels[0] == (system if train_on == "all" else [IGNORE_INDEX] * len(system)) + none_labels[0]
    assert t.decode(none_ids[0]) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nhello there<|im_end|>"
    assert kept_ids[1] == none_ids[1] and kept_labels[1] == none_labels[1]
    assert "SmolLM" not in t.decode(none_ids[1])


def test_a_default_system_prompt_after_the_bos_is_left_out_and_the_bos_kept() -> None:
    t = tok("llama3")
    kept, added = render_chat(CHAT, t, "all", LLAMA3_DEFAULT_SYSTEM)
    none, _ = render_chat(CHAT, t, "all", LLAMA3_DEFAULT_SYSTEM, system_prompt="none")
    assert added and kept[0][0].startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nDefault")
    assert none[0][0] == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nhello there<|eot_id|>"
    )
    assert render_chat(CHAT, t, "all")[1] is False  # Llama 3's BOS alone is no system prompt


@pytest.mark.parametrize("name", ["gpt2", "llama3"])
def test_templates_without_a_default_system_prompt_count_none(name: str) -> None:
    _, _, counts = encode(name, [{"messages": CHAT}], train_on="assistant")
    assert counts.system_prompt_added == 0
    same = encode(name, [{"messages": CHAT}], train_on="assistant", system_prompt="none")
    assert same[:2] == encode(name, [{"messages": CHAT}], train_on="assistant")[:2]


def test_a_system_prompt_that_cannot_be_told_from_the_opening_is_refused_for_none() -> None:
    # a first system message renders unlike a later one, so what precedes every chat cannot be found
    template = (
        "{% if messages[0].role != 'system' %}DEFAULT\n{% endif %}{% for m in messages %}"
        "{% if loop.first and m.role == 'system' %}SYS:{{ m.content }}\n{% else %}[{{ m.role }}]"
        "{{ m.content }}\n{% endif %}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    assert render_chat(CHAT, tok("gpt2"), "assistant", template)[1] is True
    with pytest.raises(ValueError, match=r"record 1: the chat template writes 'DEFAULT\\n' before the first message"):
        render_chat(CHAT, tok("gpt2"), "assistant", template, "record 1", "none")


def test_system_prompt_is_checked_and_reported(tmp_path: Any) -> None:
    import json

    from padless.data.load import load_corpus

    with pytest.raises(ValueError, match="system_prompt='off' is not one of template, none"):
        EncodeOptions(system_prompt="off")  # type: ignore[arg-type]
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"messages": CHAT}) + "\n")
    kept = load_corpus(path, tok("smollm2"), train_on="assistant", cache=False)
    assert kept.report.system_prompt_added == 1 and "added a system prompt to 1 chats" in str(kept.report)
    none = load_corpus(path, tok("smollm2"), train_on="assistant", system_prompt="none", cache=False)
    assert none.report.system_prompt_added == 0 and len(none.input_ids[0]) < len(kept.input_ids[0])


def test_the_default_trains_assistant_turns_of_chats_and_every_token_of_text(tmp_path):
    """``train_on="auto"``, the loaders' default: a chat as with ``assistant``, a text as with ``all``."""
    import json

    from padless import load_corpus

    chat = tmp_path / "chat.jsonl"
    chat.write_text(
        json.dumps({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"}]})
        + "\n"
    )
    text = tmp_path / "text.jsonl"
    text.write_text(json.dumps({"text": "Hello there"}) + "\n")
    auto, assistant = (
        load_corpus(chat, "gpt2", cache=False),
        load_corpus(chat, "gpt2", train_on="assistant", cache=False),
    )
    assert auto.input_ids == assistant.input_ids and auto.labels == assistant.labels
    assert any(label == -100 for label in auto.labels[0])
    plain = load_corpus(text, "gpt2", cache=False)
    assert plain.labels == load_corpus(text, "gpt2", train_on="all", cache=False).labels
    assert -100 not in plain.labels[0]
