"""The input readers of ``padless pack`` (padless.data.inputs): shards cut by the data, one kind of
record per input, every row named in errors."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from padless.data.inputs import SyntheticTokens, iter_shards, open_input, scan_lines


def lines_file(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.mark.parametrize("every", [1, 2, 3, 7, 50])
def test_line_starts_are_found_while_hashing(tmp_path, every):
    path = lines_file(tmp_path / "d.jsonl", [json.dumps({"input_ids": [i] * (i % 4 + 1)}) for i in range(23)])
    data = path.read_bytes()
    fingerprint, starts = scan_lines(path, every, chunk=16)  # small chunks: boundaries inside and across them
    ends = [i + 1 for i, b in enumerate(data) if b == 10]
    expected = [0, *ends[every - 1 :: every]]
    if expected[-1] == len(data):
        expected.pop()
    assert list(starts) == [*expected, len(data)]
    from padless.data.files import file_fingerprint

    assert fingerprint == file_fingerprint(path)


@pytest.mark.parametrize("rows", [1, 4, 100])
def test_jsonl_shards_read_every_record_once_with_its_line(tmp_path, rows):
    recs = [json.dumps({"input_ids": [i, i + 1][: i % 2 + 1]}) for i in range(10)]
    path = lines_file(tmp_path / "d.jsonl", recs[:3] + [""] + recs[3:])  # a blank line 4 is skipped
    src = open_input(str(path), vocab_size=100, shard_rows=rows)
    got = [
        (int(r), t.ids[a:b].tolist())
        for _, t in iter_shards(src, rows)
        for r, a, b in zip(t.rows, t.offsets[:-1], t.offsets[1:])
    ]
    lines = [1, 2, 3, 5, 6, 7, 8, 9, 10, 11]
    assert got == [(line, [i, i + 1][: i % 2 + 1]) for i, line in enumerate(lines)]


@pytest.mark.parametrize(
    ("first", "other", "fmt"),
    [({"text": "a b"}, {"input_ids": [1, 2]}, "jsonl"), ({"input_ids": [1]}, {"text": "x"}, "jsonl"),
     ({"messages": [{"role": "user", "content": "hi"}]}, {"text": "x"}, "jsonl"),
     ({"text": "a b"}, {"input_ids": [1, 2]}, "json")],
)  # fmt: skip
def test_an_input_mixing_kinds_of_record_names_the_first_row_of_the_other_kind(tmp_path, first, other, fmt):
    from padless.export.parquet import pack_to_parquet

    recs = [first] * 5 + [other] + [first, other]
    if fmt == "jsonl":
        path = lines_file(tmp_path / "d.jsonl", [json.dumps(r) for r in recs])
        where = "line 6"
    else:
        path = tmp_path / "d.json"
        path.write_text(json.dumps(recs))
        where = "record 6"
    kind = next(iter(other))
    src = open_input(str(path), shard_rows=3, train_on="all")  # the chat has no assistant turn
    with pytest.raises(
        ValueError, match=f"{where} has '{kind}', but the input's first record has '{next(iter(first))}'"
    ):
        pack_to_parquet(src, tmp_path / "out", 64, shard_rows=3, progress=False)
    assert not (tmp_path / "out").exists()  # a failed fresh run leaves nothing


def test_an_empty_sequence_is_refused_naming_its_row(tmp_path):
    from padless.export.parquet import pack_to_parquet

    path = lines_file(tmp_path / "d.jsonl", [json.dumps({"input_ids": [1, 2]}), json.dumps({"input_ids": []})])
    with pytest.raises(ValueError, match="line 2 is an empty sequence"):
        pack_to_parquet(open_input(str(path), vocab_size=10), tmp_path / "o", 8, progress=False)
    pq.write_table(pa.table({"input_ids": [[1], [2, 3], []]}), tmp_path / "d.parquet")
    with pytest.raises(ValueError, match="record 3 is an empty sequence"):
        pack_to_parquet(open_input(str(tmp_path / "d.parquet"), vocab_size=10), tmp_path / "o", 8, progress=False)


def test_parquet_token_columns_are_checked_like_the_token_validator(tmp_path):
    pq.write_table(pa.table({"input_ids": [[1, 2], [3, 4]], "labels": [[-100, 2], [3, -7]]}), tmp_path / "d.parquet")
    src = open_input(str(tmp_path / "d.parquet"), vocab_size=10)
    with pytest.raises(ValueError, match=r"record 2: label -7 \(labels\[1\]\) is neither -100"):  # the validator's
        src.read(src.shards(10)[0])
    pq.write_table(pa.table({"input_ids": [[1, 2], [3, 40]]}), tmp_path / "e.parquet")
    src = open_input(str(tmp_path / "e.parquet"), vocab_size=10)
    with pytest.raises(ValueError, match="record 2: token id 40 is outside the vocabulary"):
        src.read(src.shards(1)[1])


def test_synthetic_shards_are_the_sequence_cut(tmp_path):
    src = open_input(None, synthetic="uniform:10000:3:30", vocab_size=50, seed=2)
    ref = SyntheticTokens("uniform:10000:3:30", vocab_size=50, seed=2)
    shards = src.shards(5000)  # rounded up to whole blocks of 4096
    assert [(s.begin, s.end) for s in shards] == [(0, 8192), (8192, 10000)]
    tokens = src.read(shards[1])
    assert np.array_equal(tokens.lengths, ref.lengths()[8192:])
    assert tokens.ids[tokens.offsets[5] : tokens.offsets[6]].tolist() == ref[8197]["input_ids"].tolist()


def test_parquet_token_columns_are_refused_not_cast_when_they_are_not_integer_lists(tmp_path):
    pq.write_table(pa.table({"input_ids": [[1, 2], [3, None]]}), tmp_path / "n.parquet")  # a null inside a list
    src = open_input(str(tmp_path / "n.parquet"), vocab_size=10)
    with pytest.raises(ValueError, match=r"n.parquet, record 2: input_ids must be integer token ids, got dtype float"):
        src.read(src.shards(10)[0])
    pq.write_table(pa.table({"input_ids": [[1.0, 2.0], [3.0], [4.5]]}), tmp_path / "f.parquet")
    src = open_input(str(tmp_path / "f.parquet"), vocab_size=10)
    assert src.read(src.shards(2)[0]).ids.tolist() == [1, 2, 3]  # whole floats are the integers they hold
    with pytest.raises(ValueError, match=r"f.parquet, record 3: input_ids must be integer token ids"):
        src.read(src.shards(2)[1])
    pq.write_table(pa.table({"input_ids": ["[1, 2]"]}), tmp_path / "s.parquet")
    src = open_input(str(tmp_path / "s.parquet"), vocab_size=10)
    with pytest.raises(ValueError, match=r"s.parquet: column 'input_ids' is string, not a list of token ids"):
        src.read(src.shards(1)[0])
    pq.write_table(pa.table({"input_ids": [[1, 2], [3]], "labels": [[1, 2], [3, 3]]}), tmp_path / "l.parquet")
    src = open_input(str(tmp_path / "l.parquet"), vocab_size=10)
    with pytest.raises(ValueError, match=r"l.parquet, record 2: labels has 2 tokens but input_ids has 1"):
        src.read(src.shards(10)[0])


def test_an_input_of_one_form_is_read_by_one_reader(tmp_path):
    from padless.data.inputs import JsonlInput, ParquetInput, RecordsInput, SyntheticInput

    lines_file(tmp_path / "d.jsonl", [json.dumps({"input_ids": [1]})])
    (tmp_path / "d.json").write_text(json.dumps([{"input_ids": [1]}]))
    pq.write_table(pa.table({"input_ids": [[1]]}), tmp_path / "d.parquet")
    opened = [open_input(str(tmp_path / n), vocab_size=5) for n in ("d.jsonl", "d.parquet", "d.json")]
    opened.append(open_input(None, synthetic="uniform:3", vocab_size=5))
    assert [type(s) for s in opened] == [JsonlInput, ParquetInput, RecordsInput, SyntheticInput]
    assert [s.unit for s in opened] == ["line", "record", "record", "record"]
    with pytest.raises(ValueError, match="opened for shards of 65536 lines, not 10"):
        opened[0].shards(10)


def test_the_kind_of_an_input_follows_the_one_record_rule(tmp_path):
    """A field whose value is null does not make a record (padless.data.records.record_field): the
    first record below is text, as load_corpus and the command line read it."""
    from padless.data.records import record_field

    first = {"input_ids": None, "text": "a b"}
    path = lines_file(tmp_path / "d.jsonl", [json.dumps(first), json.dumps({"text": "c"})])
    src = open_input(str(path), train_on="all")
    assert src.kind == record_field(first, "here") == "text"
    (tmp_path / "d.json").write_text(json.dumps([first]))
    assert open_input(str(tmp_path / "d.json"), train_on="all").kind == "text"
