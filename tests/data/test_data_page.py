"""docs/data.md: its example records load as it says, and its example errors are what padless says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from padless.data.encode import EncodeOptions, encode_records
from padless.data.load import load_corpus
from padless.data.records import RecordError
from padless.data.tokenizer import load_tokenizer
from padless.layout import IGNORE_INDEX

DOC = (Path(__file__).resolve().parents[2] / "docs" / "data.md").read_text(encoding="utf-8")


def test_the_example_records_load(tmp_path: Path) -> None:
    block = re.search(r"```jsonl\n(.*?)```", DOC, re.S)
    assert block is not None
    path = tmp_path / "d.jsonl"
    path.write_text(block.group(1))
    tok = load_tokenizer("gpt2")
    corpus = load_corpus(path, tok, cache=False)
    assert corpus.report.kept == 3 and corpus.report.skipped == {}
    text, chat, tokens = corpus.input_ids
    assert tokens == [15496, 995, 50256] and corpus.labels[2] == [-100, 995, 50256]  # as given
    assert text[-1] == chat[-1] == tok.eos_token_id
    chats = tmp_path / "chats.jsonl"
    chats.write_text(block.group(1).splitlines()[1] + "\n")
    smol = load_tokenizer("smollm2-135m")
    one = load_corpus(chats, smol, train_on="assistant", cache=False)
    trained = smol.decode([i for i, lab in zip(one.input_ids[0], one.labels[0]) if lab != IGNORE_INDEX])
    assert trained == (
        '<tool_call>\n{"name": "search", "arguments": {"query": "VADER sentiment author"}}\n'
        "</tool_call><|im_end|>\nC.J. Hutto and Eric Gilbert.<|im_end|>"
    )


@pytest.mark.parametrize(
    ("record", "position"),
    [
        ({"messages": [{"role": "user", "contnt": "x"}]}, 3),
        ({"mesages": []}, 2),
        ({"messages": [{"role": "user", "content": "a"}, {"role": "bot", "content": "x"}]}, 4),
        ({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}, {"role": "assistant",
          "content": None, "tool_calls": [{"name": "search", "arguments": [1]}]}]}, 7),
        ({"conversations": [{"from": "humna", "value": "Hi"}]}, 5),
        ({"instruction": "Hi", "ouput": "x"}, 6),
    ],
)  # fmt: skip
def test_the_example_errors_are_padless_messages(record: dict, position: int) -> None:
    examples = re.findall(r"^    ((?:line|record) \d+: .*)$", DOC, re.M)
    unit = "line" if any(e.startswith(f"line {position}:") for e in examples) else "record"
    with pytest.raises(RecordError) as err:
        encode_records([record], load_tokenizer("gpt2"), EncodeOptions(), numbers=[position], unit=unit)
    assert str(err.value) in examples


def test_the_example_forms_load_as_the_page_says(tmp_path: Path) -> None:
    """The second ``jsonl`` block: one record of each form, each read as the form the page names, the
    prompt / completion and Alpaca records trained on their completion only."""
    blocks = re.findall(r"```jsonl\n(.*?)```", DOC, re.S)
    path = tmp_path / "forms.jsonl"
    path.write_text(blocks[1])
    tok = load_tokenizer("smollm2-135m")
    corpus = load_corpus(path, tok, cache=False)
    assert list(corpus.report.formats) == [
        "sharegpt",
        "conversational_prompt_completion",
        "prompt_completion",
        "alpaca",
    ]
    trained = [
        tok.decode([t for t, y in zip(x, ys) if y != IGNORE_INDEX]) for x, ys in zip(corpus.input_ids, corpus.labels)
    ]
    assert trained[1:] == ["4<|im_end|>", " blue.<|im_end|>", "5<|im_end|>"]
    assert trained[0].startswith('<tool_call>\n{"name": "get_weather"')
