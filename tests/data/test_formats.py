"""The forms people's data comes in (padless.data.formats): each read by load_corpus from a JSON array and
from JSON lines, named in the report, rendered as the chat it stands for, with what is trained said; a
typo in each named by file, record or line, field and fix; --columns-style mapping for other names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from formats_support import FORMS, TYPOS, with_typo, write
from padless.data.encode import EncodeOptions, encode_records
from padless.data.formats import FORMATS, parse_columns, read_document
from padless.data.load import load_corpus
from padless.data.records import RecordError
from padless.data.tokenizer import load_tokenizer
from padless.layout import IGNORE_INDEX


@pytest.fixture(scope="module")
def smol():
    return load_tokenizer("smollm2-135m")


def trained(tok, ids, labels) -> str:
    return tok.decode([t for t, y in zip(ids, labels) if y != IGNORE_INDEX])


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
@pytest.mark.parametrize("form", list(FORMS))
def test_each_form_loads_from_an_array_and_from_lines_and_is_named(tmp_path: Path, smol, form, suffix) -> None:
    path = write(tmp_path / f"d{suffix}", FORMS[form])
    corpus = load_corpus(path, smol, cache=False)
    assert corpus.report.formats == {form: 3} and corpus.report.kept == 3
    assert FORMATS[form] in str(corpus.report)
    assert all(ids[-1] == smol.eos_token_id for ids in corpus.input_ids)
    assert corpus.unit == ("record" if suffix == ".json" else "line")
    assert corpus.where(1) == f"{path}, {corpus.unit} 2"


EQUIVALENT = [  # a record of each form, and the chat record it stands for (same ids, same labels)
    ({"instruction": "Add the numbers.", "input": "2 and 3", "output": "5", "system": "Be brief."},
     {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Add the numbers.\n\n2 and 3"}],
      "completion": [{"role": "assistant", "content": "5"}]}),
    (FORMS["sharegpt"][0],
     {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Oslo?"},
                   {"role": "assistant", "content": "", "tool_calls": [{"function": FORMS["messages"][0]["messages"][1][
                       "tool_calls"][0]["function"]}]},
                   {"role": "tool", "content": "4 C, rain"}, {"role": "assistant", "content": "4 degrees and raining."}]}),
]  # fmt: skip


@pytest.mark.parametrize(("record", "chat"), EQUIVALENT, ids=["alpaca", "sharegpt"])
def test_a_form_renders_as_the_chat_it_stands_for(smol, record, chat) -> None:
    got = encode_records([record], smol, EncodeOptions())
    want = encode_records([chat], smol, EncodeOptions())
    assert got[:2] == want[:2]


def test_what_is_trained_in_each_form(smol) -> None:
    """Alpaca and prompt / completion train their completion (the prompt is context); ShareGPT and chats
    their assistant turns, tool calls included; train_on='all' trains every token."""
    said = {}
    for form, records in FORMS.items():
        ids, labels, _ = encode_records(records[:1], smol, EncodeOptions())
        said[form] = trained(smol, ids[0], labels[0])
        everything, all_labels, _ = encode_records(records[:1], smol, EncodeOptions(train_on="all"))
        assert all_labels[0] == everything[0]
    assert said["alpaca"] == "5<|im_end|>"
    assert said["prompt_completion"] == " blue.<|im_end|>"
    assert said["conversational_prompt_completion"] == "4<|im_end|>"
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>'
    assert said["sharegpt"] == said["messages"] == f"{call}\n4 degrees and raining.<|im_end|>"


def test_a_conversational_completion_trains_only_after_its_prompt(smol) -> None:
    """An assistant turn inside the prompt is context; train_on='assistant' trains it too."""
    record = {"prompt": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
                         {"role": "user", "content": "Bye"}],
              "completion": [{"role": "assistant", "content": "Goodbye."}]}  # fmt: skip
    auto = encode_records([record], smol, EncodeOptions())
    every = encode_records([record], smol, EncodeOptions(train_on="assistant"))
    assert trained(smol, auto[0][0], auto[1][0]) == "Goodbye.<|im_end|>"
    assert trained(smol, every[0][0], every[1][0]) == "Hello.<|im_end|>\nGoodbye.<|im_end|>"


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
@pytest.mark.parametrize("form", list(TYPOS))
def test_a_typo_in_each_form_names_file_record_field_and_fix(tmp_path: Path, form, suffix) -> None:
    path = write(tmp_path / f"d{suffix}", with_typo(form))
    gpt2 = load_tokenizer("gpt2")
    with pytest.raises(RecordError) as err:
        load_corpus(path, gpt2, cache=False)
    message = str(err.value)
    where = "record 2" if suffix == ".json" else "line 2"
    assert message.startswith(f"{path}, {where}: "), message
    assert all(part in message for part in TYPOS[form][1]), message
    skipped = load_corpus(path, gpt2, cache=False, on_error="skip")
    assert skipped.report.kept == 3 and sum(skipped.report.skipped.values()) == 1
    assert skipped.report.first_skipped == [message]


def test_columns_map_other_field_names(tmp_path: Path, smol) -> None:
    rows = [{"question": "Add the numbers.", "context": "2 and 3", "answer": "5"}]
    path = write(tmp_path / "qa.jsonl", rows)
    with pytest.raises(RecordError, match=re.escape("--columns text=NAME")):
        load_corpus(path, smol, cache=False)
    mapped = load_corpus(path, smol, cache=False, columns="instruction=question,input=context,output=answer")
    alpaca = load_corpus(write(tmp_path / "a.jsonl", [FORMS["alpaca"][0]]), smol, cache=False)
    assert mapped.report.formats == {"alpaca": 1} and mapped.input_ids == alpaca.input_ids
    assert load_corpus(path, smol, cache=False, columns={"instruction": "question", "output": "answer"}).report.kept
    with pytest.raises(RecordError, match=r"line 1: no 'answr' field, which the columns mapping reads as 'output'"):
        load_corpus(path, smol, cache=False, columns={"instruction": "question", "output": "answr"})


@pytest.mark.parametrize(("spec", "said"), [
    ("instrution=q", "'instrution' is not a field padless reads"),
    ("instruction", "'instruction' is not NAME=FIELD"),
    (["output=a", "output=b"], "'output' is mapped twice"),
])  # fmt: skip
def test_a_bad_columns_mapping_is_refused(spec, said) -> None:
    with pytest.raises(ValueError, match=re.escape(said)):
        parse_columns(spec)


@pytest.mark.parametrize(("record", "said"), [
    ({"conversations": [{"from": "function_call", "value": "get_weather(Oslo)"}]}, "function_call 'value' is a JSON call"),
    ({"conversations": [{"from": "human"}]}, "conversations turn 0 has no 'value'"),
    ({"prompt": "Hi", "completion": [{"role": "assistant", "content": "x"}]}, "'prompt' is a str and 'completion' a list"),
    ({"prompt": "Hi", "completion": "  "}, "'completion' is empty"),
    ({"instruction": "Hi", "output": "x", "history": [["only a question"]]}, "history 0 is not a [question, answer] pair"),
])  # fmt: skip
def test_malformed_records_of_each_form_are_named(record, said) -> None:
    with pytest.raises(RecordError, match=re.escape(said)):
        encode_records([record], load_tokenizer("gpt2"), EncodeOptions(), numbers=[4], unit="line")


def test_sharegpt_tools_and_system_fields_open_the_chat() -> None:
    record = {
        "system": "Be brief.",
        "tools": '[{"name": "get_weather"}]',
        "conversations": FORMS["sharegpt"][1]["conversations"],
    }
    messages = read_document(record, "record 1").value
    assert messages[0]["role"] == "system" and "get_weather" in messages[0]["content"]
    assert messages[0]["content"].endswith("Be brief.") and [m["role"] for m in messages[1:]] == ["user", "assistant"]
