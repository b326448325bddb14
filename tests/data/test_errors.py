"""Every bad record names where it is (``line N`` in JSON lines and CSV files, ``record N`` elsewhere,
from 1), the field at fault and the fields it has; each row of :data:`BAD` is a record, the skip
reason it counts under and fragments of its message."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from padless.data import load as load_module
from padless.data.cache import entry_path
from padless.data.encode import EncodeOptions, encode_records
from padless.data.load import load_corpus
from padless.data.records import RecordError
from padless.data.tokenizer import load_tokenizer


@cache
def gpt2() -> Any:
    return load_tokenizer("gpt2")


@pytest.fixture(autouse=True)
def private_token_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(load_module, "entry_path", lambda name, key: entry_path(name, key, tmp_path / "cache"))


def user(**fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", **fields}]}


def reply(*calls: Any, content: Any = "") -> dict[str, Any]:
    return {
        "messages": [
            {"role": "user", "content": "Q"},
            {"role": "assistant", "content": content, "tool_calls": list(calls)},
        ]
    }


BAD = [
    # the record itself
    (
        "no-kind",
        {"mesages": []},
        "missing_field",
        ["no 'text', 'messages' or 'input_ids' field (fields: 'mesages'; did you mean 'messages'?)"],
    ),
    ("no-fields", {}, "missing_field", ["no 'text', 'messages' or 'input_ids' field (fields: none)"]),
    ("not-an-object", [1, 2], "not_a_record", ["is a list, not an object with fields"]),
    ("text-type", {"text": 3}, "bad_type", ["'text' is a int, not a string"]),
    ("text-empty", {"text": "  "}, "empty", ["'text' is empty"]),
    # messages
    (
        "messages-dict",
        {"messages": {"role": "user", "content": "x"}},
        "bad_messages",
        ["'messages' is a dict, not a list of messages"],
    ),
    ("messages-empty", {"messages": []}, "bad_messages", ["'messages' is an empty list"]),
    ("message-str", {"messages": ["hi"]}, "bad_messages", ["message 0 is a str, not an object with 'role'"]),
    (
        "content-misspelt",
        user(contnt="x"),
        "missing_field",
        ["message 0 has no 'content' (fields: 'role', 'contnt'; did you mean 'content'?)"],
    ),
    (
        "role-misspelt",
        {"messages": [{"rol": "user", "content": "x"}]},
        "missing_field",
        ["message 0 has no 'role' (fields: 'rol', 'content'; did you mean 'role'?)"],
    ),
    (
        "role-unknown",
        {"messages": [{"role": "bot", "content": "x"}]},
        "unknown_role",
        ["message 0: unknown role 'bot'; the roles are system, user, assistant, tool"],
    ),
    ("content-empty", {"messages": [{"role": "system", "content": " "}]}, "empty", ["message 0: empty system message"]),
    ("content-int", user(content=5), "bad_content", ["message 0: content is a int, not a string"]),
    ("content-image", user(content=[{"type": "image"}]), "bad_content", ["content parts of type ['image']"]),
    ("content-part-str", user(content=["a"]), "bad_content", ["content part 0 is a str, not an object"]),
    (
        "content-part-no-text",
        user(content=[{"type": "text", "txt": "a"}]),
        "bad_content",
        ["content part 0 has no 'text' string (fields: 'type', 'txt'; did you mean 'text'?)"],
    ),
    # tool calls
    ("calls-str", reply(), "bad_tool_call", None),  # replaced below: tool_calls is a string
    (
        "calls-on-user",
        user(content="x", tool_calls=[{"name": "f"}]),
        "bad_tool_call",
        ["message 0: only assistant messages carry tool_calls, not 'user'"],
    ),
    ("call-str", reply("f"), "bad_tool_call", ["message 1, tool call 0 is a str, not an object"]),
    (
        "call-no-name",
        reply({"arguments": {}}),
        "bad_tool_call",
        ["message 1, tool call 0 has no function 'name' (fields: 'arguments')"],
    ),
    ("call-name-empty", reply({"name": ""}), "bad_tool_call", ["tool call 0: the function name is '', not"]),
    (
        "call-function-str",
        reply({"type": "function", "function": "f"}),
        "bad_tool_call",
        ["tool call 0: 'function' is a str, not an object with 'name' and 'arguments'"],
    ),
    (
        "call-arguments-misspelt",
        reply({"name": "f", "argument": {}}),
        "bad_tool_call",
        ["tool call 0 ('f') has no 'arguments' (fields: 'name', 'argument'; did you mean 'arguments'?)"],
    ),
    (
        "call-arguments-json",
        reply({"type": "function", "function": {"name": "f", "arguments": "{oops"}}),
        "bad_tool_call",
        ["tool call 0 ('f'): arguments are not valid JSON", "'{oops'"],
    ),
    (
        "call-arguments-list",
        reply({"name": "f", "arguments": [1]}),
        "bad_tool_call",
        ["tool call 0 ('f'): arguments are a list, not an object"],
    ),
    # pre-tokenized ids
    (
        "labels-length",
        {"input_ids": [1, 2], "labels": [1]},
        "length_mismatch",
        ["labels has 1 tokens but input_ids has 2"],
    ),
    ("ids-vocab", {"input_ids": [1, 99999]}, "bad_token", ["token id 99999 is outside the vocabulary"]),
    ("ids-empty", {"input_ids": []}, "empty", ["is an empty sequence"]),
]
BAD[[b[0] for b in BAD].index("calls-str")] = (
    "calls-str", {"messages": [{"role": "assistant", "content": "x", "tool_calls": "f()"}]}, "bad_tool_call",
    ["message 0: 'tool_calls' is a str, not a list of calls"])  # fmt: skip


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(("record", "reason", "fragments"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_line_names_itself_and_its_fields(tmp_path: Path, record: Any, reason: str, fragments: list[str]) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"text": "ok"}) + "\n\n" + json.dumps(record) + "\n")  # line 2 is blank
    with pytest.raises(RecordError) as err:
        load_corpus(path, gpt2())
    message = str(err.value)
    assert message.startswith(f"{path}, line 3") and err.value.reason == reason, message
    assert all(f in message for f in fragments), message
    skipped = load_corpus(path, gpt2(), on_error="skip")
    assert skipped.report.skipped == {reason: 1} and skipped.report.kept == 1


@pytest.mark.parametrize(("record", "reason", "fragments"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_record_in_memory_is_named_by_its_position(record: Any, reason: str, fragments: list[str]) -> None:
    with pytest.raises(RecordError) as err:
        encode_records([{"text": "ok"}, record], gpt2(), EncodeOptions())
    assert str(err.value).startswith("record 2") and err.value.reason == reason, str(err.value)


def test_a_forced_field_that_is_missing_names_the_fields() -> None:
    with pytest.raises(RecordError, match=r"record 1: no 'text' field, which field='text' asks for \(fields: 'txt'"):
        encode_records([{"txt": "a"}], gpt2(), EncodeOptions(field="text"))


def test_a_chat_with_nothing_to_train_names_its_record() -> None:
    with pytest.raises(RecordError, match="record 1: train_on='assistant' needs an assistant turn") as err:
        encode_records([user(content="x")], gpt2(), EncodeOptions(train_on="assistant"))
    assert err.value.reason == "no_assistant_turn"


BAD_CHAT = {"messages": [{"role": "user", "contnt": "x"}]}
MESSAGE = "message 0 has no 'content' (fields: 'role', 'contnt'"


def test_every_format_counts_its_records_from_1(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    good = {"messages": [{"role": "user", "content": "a"}]}
    (tmp_path / "d.json").write_text(json.dumps([good, BAD_CHAT]))
    cells = [json.dumps(r["messages"]) for r in (good, BAD_CHAT)]
    # a quoted cell spanning two lines: the bad row starts on line 4
    quoted = ['"' + c.replace('"', '""') + '"\n' for c in cells]
    csv = "messages\n" + quoted[0].replace(", ", ",\n", 1) + quoted[1]
    (tmp_path / "d.csv").write_text(csv)
    pq.write_table(pa.table({"messages": cells}), tmp_path / "d.parquet")
    for name, where in [("d.json", "record 2"), ("d.csv", "line 4"), ("d.parquet", "record 2")]:
        with pytest.raises(RecordError, match=re.escape(f"{where}: {MESSAGE}")):
            load_corpus(tmp_path / name, gpt2(), train_on="all")  # the good chat has no assistant turn


def test_pack_inputs_name_the_file_and_line(tmp_path: Path) -> None:
    from padless.data.inputs import iter_shards, open_input

    good = {"messages": [{"role": "user", "content": "a"}]}
    write_jsonl(tmp_path / "d.jsonl", [good, good, BAD_CHAT])
    (tmp_path / "d.csv").write_text(
        "messages\n" + "".join('"' + json.dumps(r["messages"]).replace('"', '""') + '"\n' for r in (good, BAD_CHAT))
    )
    for name, where in [("d.jsonl", "line 3"), ("d.csv", "line 3")]:
        src = open_input(str(tmp_path / name), shard_rows=1, train_on="all")  # the good chats have no assistant turn
        with pytest.raises(ValueError, match=re.escape(f"{name}, {where}: {MESSAGE}")):
            list(iter_shards(src, 1))
    write_jsonl(tmp_path / "e.jsonl", [{"mesages": []}])
    with pytest.raises(
        ValueError,
        match=re.escape(
            "e.jsonl, line 1: no 'text', 'messages' or 'input_ids' field (fields: 'mesages'; did you mean 'messages'?)"
        ),
    ):
        open_input(str(tmp_path / "e.jsonl"))
