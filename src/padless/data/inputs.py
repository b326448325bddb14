"""Inputs of ``padless pack``: one reader per form of input, chosen once by :func:`open_input`.

An input is opened once on the driver (what it is, its content fingerprint, the kind of its records)
and cut into shards of ``rows`` records each (:meth:`~padless.data.shards.PackInput.shards`): the cut
depends on the data only, never on how many workers read it. Any process then reads any shard
(:meth:`~padless.data.shards.PackInput.read`) into :class:`~padless.data.shards.ShardTokens`,
tokenizing text and chats itself, so tokenizing runs where the shard is read.

- ``.jsonl``: :class:`JsonlInput`, cut at line starts; the driver finds them while it hashes the file
  (one pass), so every shard knows its first line number and errors name the file's line.
- ``.parquet``: :class:`ParquetInput`, cut by row number; token columns are read as Arrow arrays and
  checked whole (:func:`padless.data.shards.check_flat`), text columns as records.
- ``.json``, ``.csv``, ``.tsv``, ``datasets`` folders and the built-in corpora: :class:`RecordsInput`,
  read whole on the driver (:func:`padless.data.files.read_records`; a corpus tokenized by
  :func:`padless.data.load_corpus`, cached), cut by record number.
- ``--synthetic DIST:N``: :class:`padless.data.synthetic.SyntheticInput`.

Every input holds one form of record (``input_ids``, ``messages``, ``alpaca``, ``sharegpt``, TRL's prompt /
completion, ``text``: its first record's :func:`padless.data.formats.record_format`, after the
``columns`` mapping); a record of another form is an error naming its row.
Pre-tokenized ids are taken as given (nothing appended) and checked against ``vocab_size`` by
:func:`padless.layout.check_tokens`; text and chats end with one end-of-document token
(:mod:`padless.data.encode`). Rows are named ``line N`` in JSON lines and CSV files, ``record N``
elsewhere, from 1 (:func:`padless.data.records.where`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from padless._optional import require
from padless.data.chat import SYSTEM_PROMPT
from padless.data.formats import map_columns, record_format
from padless.data.records import RecordError, Unit, where
from padless.data.shards import (
    InputShard,
    PackInput,
    ShardTokens,
    cached_tokenizer,
    check_flat,
    cut_records,
    encode_shard,
)
from padless.data.synthetic import SyntheticInput, SyntheticTokens

__all__ = [
    "InputShard", "JsonlInput", "PackInput", "ParquetInput", "RecordsInput", "ShardTokens", "SyntheticInput",
    "SyntheticTokens", "iter_shards", "open_input", "scan_lines",
]  # fmt: skip
TextOptions = dict[str, Any]
"""``{"tokenizer", "train_on", "system_prompt", "processor", "columns", "on_error"}``: how records are read
and text and chats tokenized (fields of
:class:`~padless.data.shards.PackInput`, and part of an input's key when its records are not tokens)."""


def _vocab_and_key(
    kind: str, key: dict[str, Any], vocab_size: int | None, text: TextOptions
) -> tuple[int | None, dict[str, Any]]:
    """Pre-tokenized ids are checked against ``vocab_size`` (default: the tokenizer's vocabulary),
    which joins the key; text and chats are tokenized here, so the text options join it instead."""
    if text.get("processor") is not None and kind != "messages":
        raise ValueError(
            f"processor={text['processor']!r} renders chats ('messages' records) with their images; "
            f"this input's records are {kind!r}"
        )
    if kind == "input_ids":
        vocab = len(cached_tokenizer(text["tokenizer"])) if vocab_size is None else vocab_size
        return vocab, {**key, "vocab_size": vocab, **({"columns": text["columns"]} if text.get("columns") else {})}
    return None, {**key, **text}


def _first_form(record: Any, at: str, text: TextOptions) -> str:
    """The form of an input's first record (named ``at``), after the ``columns`` mapping."""
    try:
        return record_format(map_columns(record, text.get("columns", ()), at), at)
    except RecordError as err:
        raise ValueError(str(err)) from None


# ------------------------------------------------------------------------ JSON lines


def scan_lines(path: Path, every: int, chunk: int = 1 << 20) -> tuple[dict[str, Any], tuple[int, ...]]:
    """``(fingerprint, line starts)`` of a file in one pass: the fingerprint of
    :func:`padless.data.files.file_fingerprint` (BLAKE2b of the bytes, size), and the byte offset of
    lines ``0, every, 2 * every, ...`` followed by the file size."""
    import hashlib

    h = hashlib.blake2b(digest_size=20)
    starts = [0]
    lines, at = 0, 0
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
            n = block.count(b"\n")
            need = len(starts) * every - lines  # the need-th newline of this block ends a shard
            if need <= n:
                ends = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
                starts.extend((at + ends[need - 1 :: every] + 1).tolist())
            lines += n
            at += len(block)
    if starts[-1] == at and len(starts) > 1:
        starts.pop()  # the last boundary fell at the end of the file
    starts.append(at)
    return {"blake2b": h.hexdigest(), "size": at, "suffix": path.suffix.lower()}, tuple(starts)


def _json_line(path: Path, line_no: int, line: bytes) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}, {where(line_no, 'line')} is not valid JSON ({err.msg})") from None


@dataclass(frozen=True, kw_only=True)
class JsonlInput(PackInput):
    """A JSON lines file, cut every ``shard_lines`` lines (blank lines count, and are skipped)."""

    unit: Unit = "line"
    line_starts: tuple[int, ...]
    """Byte offset of every ``shard_lines``-th line start, and the file size."""
    shard_lines: int
    """Lines between two entries of :attr:`line_starts`: the only cut this input was opened for."""

    @classmethod
    def open(cls, path: Path, shard_rows: int, vocab_size: int | None, text: TextOptions) -> JsonlInput:
        """The file's first record decides its kind; its line starts are found while it is hashed."""
        with open(path, "rb") as f:
            first = next(((n, line) for n, line in enumerate(f, start=1) if line.strip()), None)
        if first is None:
            raise ValueError(f"{path} holds no records")
        kind = _first_form(_json_line(path, *first), f"{path}, {where(first[0], 'line')}", text)
        key, starts = scan_lines(path, shard_rows)
        vocab, key = _vocab_and_key(kind, key, vocab_size, text)
        return cls(
            name=str(path), key=key, kind=kind, vocab_size=vocab, line_starts=starts, shard_lines=shard_rows, **text
        )

    def shards(self, rows: int) -> list[InputShard]:
        if rows != self.shard_lines:
            raise ValueError(f"this JSON lines input was opened for shards of {self.shard_lines} lines, not {rows}")
        s = self.line_starts
        return [InputShard(i, s[i], s[i + 1], i * rows + 1) for i in range(len(s) - 1)]

    def read(self, shard: InputShard) -> ShardTokens:
        path = Path(self.name)
        rows, records, bad = [], [], []
        with open(path, "rb") as f:
            f.seek(shard.begin)
            for line_no, line in enumerate(f.read(shard.end - shard.begin).split(b"\n"), start=shard.first_row):
                if line.strip():
                    try:
                        records.append(_json_line(path, line_no, line))
                    except ValueError as err:
                        if self.on_error != "skip" or self.pretokenized:
                            raise
                        bad.append(str(err))
                        continue
                    rows.append(line_no)
        toks = encode_shard(self, rows, records)
        if not bad:
            return toks
        import dataclasses

        skipped = {**toks.skipped, "bad_json": toks.skipped.get("bad_json", 0) + len(bad)}
        return dataclasses.replace(toks, skipped=skipped, first_skipped=(bad + toks.first_skipped)[:5])


# ------------------------------------------------------------------------ Parquet


@dataclass(frozen=True, kw_only=True)
class ParquetInput(PackInput):
    """A Parquet file, cut by row number: token columns read as Arrow arrays, text columns as records."""

    total: int
    """Rows in the file."""

    @classmethod
    def open(cls, path: Path, vocab_size: int | None, text: TextOptions) -> ParquetInput:
        """``input_ids`` among its columns (after the ``columns`` mapping) makes it pre-tokenized; else its
        first row decides its form."""
        pq = require("pyarrow.parquet", "reading Parquet")
        from padless.data.files import file_fingerprint

        try:
            meta = pq.ParquetFile(path).metadata
        except Exception as err:  # pyarrow raises its own error types for a broken file
            raise ValueError(f"input {path} is not a readable Parquet file ({err})") from None
        names = meta.schema.to_arrow_schema().names
        renamed = {field: name for name, field in text.get("columns", ())}
        if "input_ids" in [renamed.get(n, n) for n in names]:
            kind = "input_ids"
        elif not meta.num_rows:
            raise ValueError(f"{path} holds no records")
        else:
            first = pq.ParquetFile(path).read_row_group(0).slice(0, 1).to_pylist()[0]
            kind = _first_form(first, f"{path}, {where(1, 'record')}", text)
        vocab, key = _vocab_and_key(kind, file_fingerprint(path), vocab_size, text)
        return cls(name=str(path), key=key, kind=kind, vocab_size=vocab, total=meta.num_rows, **text)

    def shards(self, rows: int) -> list[InputShard]:
        return cut_records(self.total, rows)

    def read(self, shard: InputShard) -> ShardTokens:
        pq = require("pyarrow.parquet", "reading Parquet")
        f = pq.ParquetFile(self.name)
        if self.kind != "input_ids":
            table = f.read().slice(shard.begin, shard.end - shard.begin)
            return encode_shard(self, range(shard.begin + 1, shard.end + 1), table.to_pylist())
        if self.columns:
            table = f.read().slice(shard.begin, shard.end - shard.begin)
            return encode_shard(self, range(shard.begin + 1, shard.end + 1), table.to_pylist())
        columns = [c for c in ("input_ids", "labels") if c in f.schema_arrow.names]
        table = f.read(columns=columns).slice(shard.begin, shard.end - shard.begin)
        rows = np.arange(shard.begin + 1, shard.end + 1, dtype=np.int64)
        ids, offsets = self._column(table, "input_ids", rows)
        labels, label_offsets = self._column(table, "labels", rows) if "labels" in columns else (None, None)
        ids, labels = check_flat(
            ids, offsets, labels, label_offsets, vocab_size=self.vocab_size, name=lambda i: self.where(int(rows[i]))
        )
        return ShardTokens(ids.astype(np.int32), None if labels is None else labels.astype(np.int32), offsets, rows)

    def _column(self, table: Any, name: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(values, offsets from 0)`` of a list column, as Arrow holds it (the values unconverted:
        :func:`~padless.data.shards.check_flat` judges their type)."""
        pa = require("pyarrow", "reading Parquet")
        arr = table.column(name).combine_chunks()
        if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
            raise ValueError(f"{self.name}: column {name!r} is {arr.type}, not a list of token ids")
        if arr.null_count:
            bad = int(rows[np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0]])
            raise ValueError(f"{self.where(bad)}: column {name!r} holds a null list, not token ids")
        offsets = np.asarray(arr.offsets, dtype=np.int64)
        values = arr.values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]]
        return values, offsets - offsets[0]


# ------------------------------------------------------------------------ records held whole


@dataclass(frozen=True, kw_only=True)
class RecordsInput(PackInput):
    """Records read whole on the driver (JSON, CSV, ``datasets``, a built-in corpus, a list in memory),
    cut by record number."""

    records: list[Any] = field(repr=False)
    """The records, in order."""
    numbers: list[int] | None = field(default=None, repr=False)
    """The number naming each record (CSV: its line); None: 1, 2, ..."""
    read_skipped: tuple[dict[str, int], list[str]] = field(default=({}, []), repr=False)
    """Rows skipped while reading the file (``on_error="skip"``), by reason, and the first few named:
    counted with the first shard's."""

    @classmethod
    def open(cls, path: Path, vocab_size: int | None, text: TextOptions) -> RecordsInput:
        """A file (its bytes fingerprint it) or a ``datasets`` folder (its resolved path does)."""
        from padless.data.files import read_records

        found = read_records(str(path), on_error=text.get("on_error", "raise"))
        rows, unit, fingerprint = found.rows, found.unit, found.fingerprint
        if not rows:
            raise ValueError(f"{path} holds no records")
        numbers, records = [n for n, _ in rows], [r for _, r in rows]
        kind = _first_form(records[0], f"{path}, {where(numbers[0], unit)}", text)
        key = dict(fingerprint) if path.is_file() else {"input": str(path.resolve())}
        vocab, key = _vocab_and_key(kind, key, vocab_size, text)
        return cls(
            name=str(path), key=key, kind=kind, vocab_size=vocab, unit=unit, records=records, numbers=numbers,
            read_skipped=(dict(found.skipped), list(found.first_skipped)), **text,
        )  # fmt: skip

    @classmethod
    def corpus(cls, name: str, text: TextOptions, progress: bool) -> RecordsInput:
        """A built-in corpus, tokenized by :func:`padless.data.load_corpus` (cached)."""
        from padless.data.corpora import CORPORA, split_corpus_name

        if split_corpus_name(name) is None:
            raise ValueError(
                f"input {name!r} is neither an existing file or folder nor a built-in corpus ({', '.join(CORPORA)})"
            )
        from padless.data.load import load_corpus

        corpus = load_corpus(
            name,
            text["tokenizer"],
            train_on=text["train_on"],  # type: ignore[arg-type]
            system_prompt=text["system_prompt"],
            progress=progress,
        )  # type: ignore[arg-type]
        records = [{"input_ids": x, "labels": y} for x, y in zip(corpus.input_ids, corpus.labels)]
        return cls(name=name, key={"input": name, **text}, kind="input_ids", records=records, **text)

    def shards(self, rows: int) -> list[InputShard]:
        return cut_records(len(self.records), rows, self.numbers)

    def read(self, shard: InputShard) -> ShardTokens:
        b, e = shard.begin, shard.end
        rows = self.numbers[b:e] if self.numbers is not None else range(b + 1, e + 1)
        toks = encode_shard(self, rows, self.records[b:e])
        counted, named = self.read_skipped
        if shard.index or not counted:
            return toks
        import dataclasses

        merged = {k: toks.skipped.get(k, 0) + counted.get(k, 0) for k in {**toks.skipped, **counted}}
        return dataclasses.replace(toks, skipped=merged, first_skipped=(named + toks.first_skipped)[:5])


# ------------------------------------------------------------------------ the factory


def open_input(
    input: str | None,
    *,
    synthetic: str | None = None,
    vocab_size: int | None = None,
    seed: int = 0,
    tokenizer: str = "gpt2",
    train_on: str = "auto",
    system_prompt: str = "template",
    shard_rows: int = 65536,
    progress: bool = True,
    processor: str | None = None,
    columns: Any = None,
    on_error: str = "raise",
) -> PackInput:
    """Open ``input`` (a file, a ``datasets`` folder or a built-in corpus) or a ``synthetic`` spec: the
    reader of its form, chosen here once.

    Pre-tokenized records (``input_ids``) are packed as given in every format: nothing is appended
    (the ids come from the user's tokenizer, whose EOS padless cannot know), and every id and label is
    checked against ``vocab_size``, by default the vocabulary of ``tokenizer``. Text and chat records
    are tokenized by :mod:`padless.data.encode` (each ends with one end-of-document token; ``train_on``
    and ``system_prompt`` as in :func:`padless.data.load_corpus`). ``synthetic`` draws ids below
    ``vocab_size`` (default 50,257, GPT-2's vocabulary). ``shard_rows``: records per logical shard
    (JSON lines are cut while the file is hashed). ``processor``: chats are rendered through this
    vision-language processor (``offline`` or a hub name / folder), their images carried into the rows
    (:func:`padless.data.images.render_image_chat`: images by path relative to the input's folder,
    bytes, data URIs, or the record's ``images`` column as TRL's vision datasets hold them).
    ``columns``: a record's own fields renamed to padless' (:func:`padless.data.formats.parse_columns`);
    ``on_error="skip"``: a bad record of text or chats is left out, counted (pre-tokenized ids are checked
    strictly).
    """
    from padless.data.encode import ON_ERROR
    from padless.data.formats import parse_columns

    if on_error not in ON_ERROR:
        raise ValueError(f"on_error={on_error!r} is not one of {', '.join(ON_ERROR)}")
    if (input is None) == (synthetic is None):
        raise ValueError("give exactly one of input and synthetic")
    if vocab_size is not None and vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    if synthetic is not None:
        return SyntheticInput.open(synthetic, vocab_size, seed)
    assert input is not None
    if not input.strip():
        raise ValueError("input is empty: name a file, a folder or a built-in corpus")
    if system_prompt not in SYSTEM_PROMPT:
        raise ValueError(f"system_prompt={system_prompt!r} is not one of {', '.join(SYSTEM_PROMPT)}")
    text: TextOptions = {"tokenizer": tokenizer, "train_on": train_on, "system_prompt": system_prompt}
    if processor is not None:
        text["processor"] = processor
    if parsed := parse_columns(columns):
        text["columns"] = [list(pair) for pair in parsed]  # lists: the key is stored as JSON and compared on resume
    if on_error != "raise":
        text["on_error"] = on_error
    path = Path(input).expanduser()
    if processor is not None and not (path.is_file() or path.is_dir()):
        raise ValueError(
            f"processor={processor!r} renders chat files and datasets; {input!r} is a built-in corpus of text"
        )
    if path.is_file() and path.suffix == ".jsonl":
        return JsonlInput.open(path, shard_rows, vocab_size, text)
    if path.is_file() and path.suffix == ".parquet":
        return ParquetInput.open(path, vocab_size, text)
    if path.is_file() or path.is_dir():
        return RecordsInput.open(path, vocab_size, text)
    return RecordsInput.corpus(input, text, progress)


def iter_shards(source: PackInput, rows: int) -> Iterator[tuple[InputShard, ShardTokens]]:
    """Every shard of ``source`` and its tokens, in order (the serial reading, for tests and tools)."""
    for shard in source.shards(rows):
        yield shard, source.read(shard)
