"""The user's own data through ``load_corpus``: formats, pre-tokenized ids, bad input, the token cache."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from padless.data import load as load_module
from padless.data.cache import entry_path
from padless.data.load import load_corpus
from padless.data.records import RecordError
from padless.data.tokenizer import load_tokenizer
from padless.layout import IGNORE_INDEX

EOS = 50256


@cache
def gpt2() -> Any:
    return load_tokenizer("gpt2")


@pytest.fixture(autouse=True)
def private_token_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setattr(load_module, "entry_path", lambda name, key: entry_path(name, key, root))
    return root


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def ids_of(text: str) -> list[int]:
    return gpt2()(text)["input_ids"]


def test_jsonl_text(tmp_path: Path) -> None:
    c = load_corpus(write_jsonl(tmp_path / "d.jsonl", [{"text": "Hello world"}, {"text": "hi"}]), gpt2())
    assert c.input_ids == [[15496, 995, EOS], [*ids_of("hi"), EOS]]
    assert c.labels == c.input_ids
    assert c.lengths.tolist() == [3, 2] and c.lengths.dtype.name == "int64"
    assert c.features()[0] == {"input_ids": [15496, 995, EOS], "labels": [15496, 995, EOS]}
    assert len(c) == 2 and c.report.read == 2 and c.report.kept == 2 and c.report.skipped == {}


def test_add_eos_false_and_no_double_eos(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "Hello world"}, {"input_ids": [1, 2, EOS]}])
    assert load_corpus(path, gpt2(), add_eos=False).input_ids == [[15496, 995], [1, 2, EOS]]
    assert load_corpus(path, gpt2()).input_ids == [[15496, 995, EOS], [1, 2, EOS]]


def test_messages_with_assistant_labels(tmp_path: Path) -> None:
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
    c = load_corpus(write_jsonl(tmp_path / "d.jsonl", [{"messages": chat}]), gpt2(), train_on="assistant")
    prompt = ids_of("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    reply = ids_of("Yo<|im_end|>\n")
    assert c.input_ids == [[*prompt, *reply, EOS]]
    assert c.labels == [[IGNORE_INDEX] * len(prompt) + [*reply, EOS]]
    assert c.report.trained_tokens == len(reply) + 1


def test_pretokenized_ids_and_labels(tmp_path: Path) -> None:
    rows = [{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [8, 9]}]
    c = load_corpus(write_jsonl(tmp_path / "d.jsonl", rows), gpt2())
    assert c.input_ids == [[5, 6, 7], [8, 9]]  # pre-tokenized ids are taken as given: no EOS appended
    assert c.labels == [[-100, 6, 7], [8, 9]]


def test_csv_with_text_and_json_messages(tmp_path: Path) -> None:
    chat = json.dumps([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]).replace('"', '""')
    (tmp_path / "d.csv").write_text(f'text,messages\nHello world,\n,"{chat}"\n')
    c = load_corpus(tmp_path / "d.csv", gpt2())
    assert c.input_ids[0] == [15496, 995, EOS]
    assert c.input_ids[1][-1] == EOS and len(c.input_ids[1]) > 10


def test_parquet_and_json_array_and_saved_dataset(tmp_path: Path) -> None:
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    chat = [
        {"role": "user", "content": "Hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}],
        },
    ]
    rows = [{"messages": chat}, {"messages": [{"role": "user", "content": "A"}, {"role": "assistant", "content": "B"}]}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    (tmp_path / "d.json").write_text(json.dumps(rows))
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    from_json = load_corpus(tmp_path / "d.json", gpt2(), train_on="assistant")
    for other in ("d.parquet", "saved"):
        c = load_corpus(tmp_path / other, gpt2(), train_on="assistant")
        assert c.input_ids == from_json.input_ids and c.labels == from_json.labels


def test_field_chooses_between_present_fields(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "Hello world", "input_ids": [1, 2]}])
    assert load_corpus(path, gpt2()).input_ids == [[1, 2]]
    assert load_corpus(path, gpt2(), field="text").input_ids == [[15496, 995, EOS]]


@pytest.mark.parametrize(
    ("rows", "reason", "match"),
    [
        (
            [{"text": "ok"}, {"body": "x"}],
            "missing_field",
            r"line 2: no 'text', 'messages' or 'input_ids' field \(fields: 'body'\)",
        ),
        ([{"text": "ok"}, {"text": "   "}], "empty", "line 2: 'text' is empty"),
        ([{"text": "ok"}, {"text": 3}], "bad_type", "line 2: 'text' is a int"),
        (
            [{"text": "ok"}, {"messages": [{"role": "bot", "content": "x"}]}],
            "unknown_role",
            "line 2: message 0: unknown role 'bot'",
        ),
        (
            [{"text": "ok"}, {"input_ids": [1, 2], "labels": [1]}],
            "length_mismatch",
            "line 2: labels has 1 tokens but input_ids has 2",
        ),
        (
            [{"text": "ok"}, {"input_ids": [1, 99999]}],
            "bad_token",
            r"line 2: token id 99999 is outside the vocabulary \[0, \d+\) \(input_ids\[1\]\)",
        ),
        ([{"text": "ok"}, {"input_ids": []}], "empty", "line 2 is an empty sequence"),
        ([{"text": "ok"}, {"input_ids": [1.5]}], "bad_type", "must be integer token ids"),
        ([{"text": "ok"}, [1, 2]], "not_a_record", "line 2 is a list"),
    ],
)
def test_bad_records_raise_or_are_counted(tmp_path: Path, rows: list[Any], reason: str, match: str) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(RecordError, match=match):
        load_corpus(path, gpt2())
    c = load_corpus(path, gpt2(), on_error="skip")
    assert c.report.skipped == {reason: 1}
    assert (c.report.read, c.report.kept) == (2, 1)
    assert c.input_ids == [[*ids_of("ok"), EOS]]


def test_bad_json_line_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "ok"}\n\n{"text": oops}\n')
    with pytest.raises(RecordError, match=r"d\.jsonl, line 3: not valid JSON"):
        load_corpus(path, gpt2())
    c = load_corpus(path, gpt2(), on_error="skip")
    assert c.report.skipped == {"bad_json": 1} and c.report.read == 2 and c.report.kept == 1


def test_csv_cell_that_is_not_json(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("messages\n[not json\n")
    with pytest.raises(RecordError, match="line 2: field 'messages' is a string that is not JSON"):
        load_corpus(tmp_path / "d.csv", gpt2())


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("d.parquet", b"text,not parquet\n", "is not a readable Parquet file"),
        ("d.csv", b"\xff\xfe\x00binary\x00\x81\n\xc3\x28\n", "is not a readable CSV file"),
        ("d.jsonl", b"\xff\xfe\x00\x81", "is not a UTF-8 text file"),
        ("d.json", b"[1, 2", "is not valid JSON"),
        ("d.txt", b"hello", "unsupported file type '.txt'"),
        ("d.jsonl", b"\n\n", "holds no records"),
    ],
)
def test_file_that_is_not_what_its_extension_says(tmp_path: Path, name: str, content: bytes, match: str) -> None:
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ValueError, match=match):
        load_corpus(tmp_path / name, gpt2(), on_error="skip")


def test_missing_file_is_not_sent_to_the_hub(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        load_corpus(tmp_path / "absent.jsonl", gpt2())


def test_overlong_policies(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"input_ids": [1, 2, 3, 4, 5, 6]}, {"input_ids": [7, 8]}])
    with pytest.raises(
        ValueError,
        match=r"line 1 has length 6, longer than max_length 4; "
        r"choose overlong='truncate', 'split' or 'drop'",
    ):
        load_corpus(path, gpt2(), max_length=4)
    dropped = load_corpus(path, gpt2(), max_length=4, overlong="drop")
    assert dropped.input_ids == [[7, 8]] and dropped.report.skipped == {"overlong": 1}
    split = load_corpus(path, gpt2(), max_length=4, overlong="split")
    assert split.input_ids == [[1, 2, 3, 4], [5, 6], [7, 8]]  # consecutive pieces
    assert split.labels == split.input_ids and split.report.split_examples == 1 and split.report.kept == 3
    cut = load_corpus(path, gpt2(), max_length=4, overlong="truncate")
    assert cut.input_ids == [[1, 2, 3, 4], [7, 8]]  # the first tokens
    assert (cut.report.truncated_examples, cut.report.truncated_tokens) == (1, 2)
    text = write_jsonl(tmp_path / "t.jsonl", [{"text": "one two three four five six"}])
    ends = load_corpus(text, gpt2(), max_length=4, overlong="truncate").input_ids
    assert len(ends[0]) == 4 and ends[0][-1] == EOS  # text: the first tokens, then EOS again


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"train_on": "prompt"}, "train_on='prompt' is not one of"),
        ({"overlong": "skip"}, "unknown overlong policy 'skip'; choose one of error, truncate, split, drop"),
        ({"on_error": "ignore"}, "on_error='ignore' is not one of raise, skip"),
        ({"max_length": 1}, "max_length must be an integer >= 2, got 1"),
        ({"limit": 0}, "limit must be an integer >= 1, got 0"),
        ({"tool_schema": "half"}, "tool_schema='half' applies to the built-in corpora only"),
        ({"field": "body"}, "field='body' is not one of"),
        ({"train_on": "assistant"}, "line 1 is plain text; train_on='assistant' needs chats"),
    ],
)
def test_bad_options_are_named(tmp_path: Path, kwargs: dict[str, Any], match: str) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "hi"}])
    with pytest.raises(ValueError, match=match):
        load_corpus(path, gpt2(), on_error=kwargs.pop("on_error", "skip"), **kwargs)


def test_limit_is_a_seeded_subset_in_source_order(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"input_ids": [i + 1]} for i in range(50)])
    a = load_corpus(path, gpt2(), limit=10, seed=1)
    firsts = [x[0] for x in a.input_ids]
    assert len(firsts) == 10 and firsts == sorted(firsts) and a.report.selected == 10 and a.report.read == 50
    assert load_corpus(path, gpt2(), limit=10, seed=1).input_ids == a.input_ids
    assert load_corpus(path, gpt2(), limit=10, seed=2).input_ids != a.input_ids
    assert len(load_corpus(path, gpt2(), limit=500)) == 50


def test_second_load_comes_from_the_cache_until_the_file_changes(tmp_path: Path, private_token_cache: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "Hello world"}])
    first = load_corpus(path, gpt2())
    second = load_corpus(path, gpt2())
    assert not first.from_cache and second.from_cache
    assert second.input_ids == first.input_ids and second.report == first.report
    assert len(list(private_token_cache.glob("tokens/*.npz"))) == 1
    assert not load_corpus(path, gpt2(), train_on="all", max_length=10).from_cache  # other options, other entry
    write_jsonl(path, [{"text": "Goodbye"}])
    third = load_corpus(path, gpt2())
    assert not third.from_cache and third.input_ids == [[*ids_of("Goodbye"), EOS]]
    assert not load_corpus(path, gpt2(), cache=False).from_cache


def test_cache_is_keyed_by_content_not_by_size_and_time(tmp_path: Path) -> None:
    """A file rewritten with the same size and modification time but other bytes is another file."""
    import os

    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "Hello world"}])
    stat = path.stat()
    assert load_corpus(path, gpt2()).input_ids == [[*ids_of("Hello world"), EOS]]
    write_jsonl(path, [{"text": "Hello there"}])  # same length in bytes
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    again = load_corpus(path, gpt2())
    assert not again.from_cache and again.input_ids == [[*ids_of("Hello there"), EOS]]
    moved = tmp_path / "sub"
    moved.mkdir()
    copy = moved / "d.jsonl"
    copy.write_bytes(path.read_bytes())
    assert load_corpus(copy, gpt2()).from_cache  # the same bytes elsewhere: the same tokens


def test_damaged_cache_entry_is_rebuilt(tmp_path: Path, private_token_cache: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "Hello world"}])
    load_corpus(path, gpt2())
    (entry,) = private_token_cache.glob("tokens/*.npz")
    entry.write_bytes(b"garbage")
    again = load_corpus(path, gpt2())
    assert not again.from_cache and again.input_ids == [[15496, 995, EOS]]


def test_pretokenized_ids_are_taken_as_given_in_every_format(tmp_path: Path) -> None:
    """One rule with `padless pack`: pre-tokenized ids get no EOS, whatever the file type."""
    import padless

    tok = padless.load_tokenizer("gpt2")
    rows = [{"input_ids": [10, 11, 12]}, {"input_ids": [5, 6], "labels": [-100, 6]}]
    paths = {"jsonl": tmp_path / "d.jsonl", "json": tmp_path / "d.json"}
    paths["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in rows))
    paths["json"].write_text(json.dumps(rows))
    for path in paths.values():
        corpus = padless.load_corpus(str(path), tok, cache=False)
        feats = corpus.features()
        assert [list(f["input_ids"]) for f in feats] == [[10, 11, 12], [5, 6]]
        assert list(feats[1]["labels"]) == [-100, 6]
    text = padless.load_corpus(str(_write_text(tmp_path)), tok, cache=False).features()
    assert all(list(f["input_ids"])[-1] == tok.eos_token_id for f in text)  # text still ends with EOS


def _write_text(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"text": "hello there"}) + "\n")
    return path
