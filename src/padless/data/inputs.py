"""Inputs of ``padless pack``, cut into logical shards by the data and read one shard at a time.

An input is opened once on the driver (:func:`open_input`: what it is, its content fingerprint, the
kind of its records) and cut into shards of ``rows`` records each (:meth:`PackInput.shards`): the cut
depends on the data only, never on how many workers read it. Any process then reads any shard
(:meth:`PackInput.read`) into :class:`ShardTokens`, tokenizing text and chats itself, so tokenizing
runs where the shard is read.

- ``--synthetic DIST:N``: :class:`SyntheticTokens`, random ids with lengths from a named
  distribution, item ``i`` the same on every read (drawn in blocks of 4096 from the seed ``(seed, b)``).
- ``.jsonl``: cut at line starts; the driver finds them while it hashes the file (one pass), so every
  shard knows its first line number and errors name the file's line.
- ``.parquet``: cut by row number; token columns are read as Arrow arrays, text columns as records.
- ``.json``, ``.csv``, ``.tsv`` and ``datasets`` folders: read whole on the driver
  (:func:`padless.data.files.read_records`), cut by record number.
- a built-in corpus: tokenized on the driver by :func:`padless.data.load_corpus` (cached).

Every input holds one kind of record (``input_ids``, ``messages`` or ``text``, the first field of
those present in its first record): a record of another kind is an error naming its row. Pre-tokenized
ids are taken as given (nothing appended) and checked against ``vocab_size`` by
:func:`padless.layout.check_tokens`; text and chats end with one end-of-document token (:mod:`padless.data.encode`).
An empty sequence is an error naming its row: ``line N`` in JSON lines and CSV files, ``record N``
elsewhere, from 1 (:func:`padless.data.records.where`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from padless._optional import require
from padless.data.chat import SYSTEM_PROMPT
from padless.data.records import RECORD_FIELDS, Unit, fields_hint, where
from padless.layout import IGNORE_INDEX, TokenError, check_tokens
from padless.planning.lengths import LENGTH_PARAMETERS, draw_lengths

_BLOCK = 4096  # synthetic sequences drawn per random block
KIND_FIELDS = RECORD_FIELDS
"""The field that makes a record of each kind, in the order they are looked for."""


class SyntheticTokens:
    """``n`` sequences of random token ids, lengths from a named distribution: a sequence whose items are
    the same on every read (block ``b`` of 4096 is drawn from the seed ``(seed, b)``), generated on the fly.

    ``DIST:N[:P1[:P2...]]``: the lengths come from the one generator of synthetic lengths
    (:func:`padless.planning.lengths.draw_lengths`), ``P1, P2...`` replacing its defaults in order:
    ``lognormal:N[:median[:sigma[:cap]]]`` (default 60, 1 and 2048: short texts, mean ~99 tokens) or
    ``uniform:N[:low[:high]]`` (default 10..500).
    """

    def __init__(self, spec: str, vocab_size: int = 50257, seed: int = 0) -> None:
        name, _, rest = spec.partition(":")
        parts = rest.split(":") if rest else []
        if name not in LENGTH_PARAMETERS or not parts or len(parts) > 1 + len(LENGTH_PARAMETERS[name]):
            dists = "; ".join(f"{d} ({', '.join(p)})" for d, p in LENGTH_PARAMETERS.items())
            raise ValueError(f"synthetic={spec!r}: expected DIST:N[:P1[:P2...]] with DIST one of {dists}")
        try:
            self.n = int(parts[0])
            self.params = tuple(float(p) for p in parts[1:])
        except ValueError:
            raise ValueError(f"synthetic={spec!r}: N and the parameters must be numbers") from None
        if self.n < 1:
            raise ValueError(f"synthetic={spec!r}: N must be positive")
        try:
            draw_lengths(name, 1, np.random.default_rng(0), self.params)  # checks the parameters
        except ValueError as err:
            raise ValueError(f"synthetic={spec!r}: {err}") from None
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        self.name, self.vocab_size, self.seed = name, vocab_size, seed
        self._block = (-1, np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int32))

    def __len__(self) -> int:
        return self.n

    def _draw(self, b: int) -> tuple[int, np.ndarray, np.ndarray]:
        rng = np.random.default_rng([self.seed, b])
        count = min(_BLOCK, self.n - b * _BLOCK)
        lengths = draw_lengths(self.name, count, rng, self.params)
        offsets = np.concatenate(([0], np.cumsum(lengths)))
        return b, offsets, rng.integers(0, self.vocab_size, int(offsets[-1]), dtype=np.int32)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        if not 0 <= i < self.n:
            raise IndexError(f"synthetic sequence {i} out of range [0, {self.n})")
        b, j = divmod(i, _BLOCK)
        if self._block[0] != b:
            self._block = self._draw(b)
        _, offsets, tokens = self._block
        return {"input_ids": tokens[offsets[j] : offsets[j + 1]]}

    def lengths(self) -> np.ndarray:
        """``[n]`` int64: every sequence's length (for comparisons; draws every block)."""
        return np.concatenate([np.diff(self._draw(b)[1]) for b in range(-(-self.n // _BLOCK))])

    def blocks(self, begin: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, offsets)`` of sequences ``begin .. end - 1`` (``begin`` a multiple of 4096), whole
        blocks at a time."""
        ids, offsets = [], [np.zeros(1, dtype=np.int64)]
        at = 0
        for b in range(begin // _BLOCK, -(-end // _BLOCK)):
            _, off, tok = self._draw(b)
            ids.append(tok)
            offsets.append(off[1:] + at)
            at += int(off[-1])
        return np.concatenate(ids), np.concatenate(offsets)


@dataclass(frozen=True)
class InputShard:
    """One logical shard of an input: a range of records (or, for JSON lines, of bytes)."""

    index: int
    """The shard's number, from 0."""
    begin: int
    """First record (JSON lines: byte offset of the first line)."""
    end: int
    """One past the last record (JSON lines: byte offset after the last line)."""
    first_row: int
    """The number naming the shard's first record, from 1 (JSON lines and CSV: its line)."""


@dataclass(frozen=True)
class ShardTokens:
    """The sequences of one shard, flat: sequence ``i`` is ``ids[offsets[i]:offsets[i + 1]]``."""

    ids: np.ndarray
    """int32 token ids of every sequence, one after another."""
    labels: np.ndarray | None
    """int32 labels aligned with ``ids``, or None when every label is its id (nothing masked)."""
    offsets: np.ndarray
    """``[n + 1]`` int64 token offsets."""
    rows: np.ndarray
    """``[n]`` int64: the number naming each sequence's record (:meth:`PackInput.where`)."""
    system_prompt_added: int = 0
    """Chats of the shard that carry a system prompt their chat template added (see
    :class:`padless.data.encode.EncodeCounts`)."""

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


@dataclass(frozen=True)
class PackInput:
    """An opened input of ``padless pack``: what to read, what identifies it, how to cut it."""

    form: Literal["synthetic", "jsonl", "parquet", "records"]
    """How shards are read."""
    name: str
    """The input as named by the user (a path, a corpus, a synthetic spec), for messages."""
    key: dict[str, Any]
    """What identifies the input's content (a hash of a file's bytes, a spec): a resume must see the same."""
    kind: str
    """The field that makes its records (``input_ids``, ``messages`` or ``text``)."""
    vocab_size: int | None
    """Ids and labels are checked against ``[0, vocab_size)`` (None: tokenized here)."""
    tokenizer: str = "gpt2"
    """Tokenizer of text and chats."""
    train_on: str = "auto"
    """Labels of chats: ``all`` | ``assistant`` | ``completion``."""
    system_prompt: str = "template"
    """A system prompt the chat template adds: ``template`` keeps it, ``none`` leaves it out."""
    total: int | None = None
    """Records in the input if known."""
    seed: int = 0
    """Seed of a synthetic input."""
    records: list[Any] | None = field(default=None, repr=False)
    """The records of an input read whole on the driver."""
    numbers: list[int] | None = field(default=None, repr=False)
    """The number naming each of :attr:`records` (CSV: its line); None: 1, 2, ..."""
    unit: Unit = "record"
    """How records are named in messages: ``line`` (JSON lines, CSV) or ``record``."""
    line_starts: tuple[int, ...] = ()
    """JSON lines: byte offset of every ``rows_hint``-th line start, and the file size."""
    rows_hint: int = 0
    """JSON lines: the number of lines between two entries of ``line_starts``."""

    @property
    def pretokenized(self) -> bool:
        return self.kind == "input_ids"

    def shards(self, rows: int) -> list[InputShard]:
        """The input cut every ``rows`` records (JSON lines: lines; synthetic: rounded up to 4096)."""
        if self.form == "jsonl":
            if rows != self.rows_hint:
                raise ValueError(f"this JSON lines input was opened for shards of {self.rows_hint} lines, not {rows}")
            s = self.line_starts
            return [InputShard(i, s[i], s[i + 1], i * rows + 1) for i in range(len(s) - 1)]
        if self.form == "synthetic":
            rows = -(-rows // _BLOCK) * _BLOCK
        n = int(self.total or 0)
        starts = range(0, n, rows)
        return [InputShard(i, b, min(b + rows, n), self._numbers(b, b + 1)[0]) for i, b in enumerate(starts)]

    def _numbers(self, begin: int, end: int) -> list[int]:
        """The numbers naming records ``begin .. end - 1`` (positions from 0) of a non-JSON-lines input."""
        return self.numbers[begin:end] if self.numbers is not None else list(range(begin + 1, end + 1))

    def read(self, shard: InputShard) -> ShardTokens:
        """The shard's sequences, tokenized and checked (a bad record raises ``ValueError`` naming its row)."""
        if self.form == "synthetic":
            src = SyntheticTokens(self.name, vocab_size=self.vocab_size or 50257, seed=self.seed)
            ids, offsets = src.blocks(shard.begin, shard.end)
            first = shard.begin % _BLOCK  # blocks start on a multiple of 4096
            offsets = offsets[first : first + shard.end - shard.begin + 1]
            ids = ids[offsets[0] : offsets[-1]]
            rows = np.arange(shard.begin + 1, shard.end + 1, dtype=np.int64)
            return ShardTokens(ids, None, offsets - offsets[0], rows)
        if self.form == "parquet" and self.kind == "input_ids":
            return self._parquet_tokens(shard)
        if self.form == "jsonl":
            rows, records = _jsonl_records(Path(self.name), shard)
        elif self.form == "parquet":
            pq = require("pyarrow.parquet", "reading Parquet")
            table = pq.ParquetFile(self.name).read().slice(shard.begin, shard.end - shard.begin)
            rows, records = self._numbers(shard.begin, shard.end), table.to_pylist()
        else:
            assert self.records is not None
            rows, records = self._numbers(shard.begin, shard.end), self.records[shard.begin : shard.end]
        return self._encode(rows, records)

    def where(self, row: int) -> str:
        """``"d.jsonl, line 3"``: how the record numbered ``row`` (:attr:`ShardTokens.rows`) is named."""
        return f"{self.name}, {where(row, self.unit)}"

    def _check_kind(self, rows: list[int], records: list[Any]) -> None:
        for row, record in zip(rows, records):
            kind = _first_kind(record, self.where(row))
            if kind != self.kind:
                raise ValueError(f"{self.where(row)} has {kind!r}, but the input's first record has {self.kind!r}: an "
                                 "input holds one kind of record (write each kind to its own file)")  # fmt: skip

    def _encode(self, rows: list[int], records: list[Any]) -> ShardTokens:
        self._check_kind(rows, records)
        ids: list[np.ndarray] = []
        labels: list[np.ndarray] = []
        out_rows: list[int] = []
        added = 0
        if self.kind == "input_ids":
            for row, record in zip(rows, records):
                try:
                    x, y = check_tokens(record["input_ids"], record.get("labels"), vocab_size=self.vocab_size,
                                        where=self.where(row))  # fmt: skip
                except TokenError as err:
                    raise ValueError(str(err)) from None
                ids.append(x)
                labels.append(y)
                out_rows.append(row)
        else:
            from padless.data.encode import EncodeOptions, encode_records
            from padless.data.records import RecordError

            tok = _tokenizer(self.tokenizer)
            opts = EncodeOptions(train_on=self.train_on, system_prompt=self.system_prompt)  # type: ignore[arg-type]
            try:
                x_all, y_all, counts = encode_records(records, tok, opts, numbers=rows, unit=self.unit, progress=False)
            except RecordError as err:
                raise ValueError(f"{self.name}, {err}") from None
            ids = [np.asarray(x, dtype=np.int64) for x in x_all]
            labels = [np.asarray(y, dtype=np.int64) for y in y_all]
            out_rows = list(rows)  # one example per record (no max_length here: the packer cuts)
            added = counts.system_prompt_added
        lengths = np.fromiter((x.size for x in ids), dtype=np.int64, count=len(ids))
        offsets = np.concatenate(([0], np.cumsum(lengths)))
        flat = np.concatenate(ids).astype(np.int32) if ids else np.zeros(0, dtype=np.int32)
        flat_labels = np.concatenate(labels).astype(np.int32) if labels else np.zeros(0, dtype=np.int32)
        same = np.array_equal(flat, flat_labels)
        return ShardTokens(flat, None if same else flat_labels, offsets, np.asarray(out_rows, dtype=np.int64), added)

    def _parquet_tokens(self, shard: InputShard) -> ShardTokens:
        pq = require("pyarrow.parquet", "reading Parquet")
        f = pq.ParquetFile(self.name)
        names = f.schema_arrow.names
        columns = [c for c in ("input_ids", "labels") if c in names]
        table = f.read(columns=columns).slice(shard.begin, shard.end - shard.begin)
        rows = np.arange(shard.begin + 1, shard.end + 1, dtype=np.int64)
        cols = {}
        for name in columns:
            arr = table.column(name).combine_chunks()
            if arr.null_count:
                bad = int(rows[np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0]])
                raise ValueError(f"{self.where(bad)}: column {name!r} holds a null list, not token ids")
            offsets = np.asarray(arr.offsets, dtype=np.int64)
            values = arr.values.to_numpy(zero_copy_only=False).astype(np.int64)[offsets[0] : offsets[-1]]
            cols[name] = (values, offsets - offsets[0])
        ids, offsets = cols["input_ids"]
        lengths = np.diff(offsets)
        if lengths.size and int(lengths.min()) == 0:
            row = int(rows[np.flatnonzero(lengths == 0)[0]])
            raise ValueError(f"{self.where(row)} is an empty sequence; every sequence needs at least one token")
        _check_range(ids, offsets, rows, self.vocab_size, "token id", self.where, labels=False)
        labels = None
        if "labels" in cols:
            labels, lab_offsets = cols["labels"]
            if not np.array_equal(lab_offsets, offsets):
                row = int(rows[np.flatnonzero(np.diff(lab_offsets) != lengths)[0]])
                raise ValueError(f"{self.where(row)}: labels and input_ids differ in length; they must match")
            _check_range(labels, offsets, rows, self.vocab_size, "label", self.where, labels=True)
        return ShardTokens(ids.astype(np.int32), None if labels is None else labels.astype(np.int32), offsets, rows)


def _check_range(values: np.ndarray, offsets: np.ndarray, rows: np.ndarray, vocab: int | None, what: str,
                 where: Any, *, labels: bool) -> None:  # fmt: skip
    """The vectorised form of :func:`padless.layout.check_tokens`' range check, for Arrow columns."""
    high = vocab if vocab is not None else 2**31
    bad = (values < 0) | (values >= high)
    if labels:
        bad &= values != IGNORE_INDEX
    if bad.any():
        at = int(np.flatnonzero(bad)[0])
        seq = int(np.searchsorted(offsets, at, side="right")) - 1
        hint = f"neither {IGNORE_INDEX} nor an id in" if labels else "outside the vocabulary"
        raise ValueError(f"{where(int(rows[seq]))}: {what} {int(values[at])} is {hint} [0, {vocab})")


def _jsonl_records(path: Path, shard: InputShard) -> tuple[list[int], list[Any]]:
    rows, records = [], []
    line_no = shard.first_row - 1
    with open(path, "rb") as f:
        f.seek(shard.begin)
        for line in f.read(shard.end - shard.begin).split(b"\n"):
            line_no += 1
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}, {where(line_no, 'line')} is not valid JSON ({err.msg})") from None
            rows.append(line_no)
    return rows, records


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


def _first_kind(record: Any, at: str) -> str:
    """The field that makes ``record`` (named ``at``), the first of :data:`KIND_FIELDS` present."""
    if not isinstance(record, dict):
        raise ValueError(f"{at} is a {type(record).__name__}, not an object with fields")
    kind = next((k for k in KIND_FIELDS if k in record), None)
    if kind is None:
        raise ValueError(f"{at}: no 'text', 'messages' or 'input_ids' field ({fields_hint(record, KIND_FIELDS)})")
    return kind


def _first_jsonl_record(path: Path) -> tuple[int, Any]:
    with open(path, "rb") as f:
        for line_no, line in enumerate(f, start=1):
            if line.strip():
                try:
                    return line_no, json.loads(line)
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}, {where(line_no, 'line')} is not valid JSON ({err.msg})") from None
    raise ValueError(f"{path} holds no records")


@functools.lru_cache(maxsize=4)
def _tokenizer(name: str) -> Any:
    """One tokenizer per process and name (a worker reading many shards loads it once)."""
    from padless.data.tokenizer import load_tokenizer

    return load_tokenizer(name)


def _tokenizer_vocab(tokenizer: str) -> int:
    return len(_tokenizer(tokenizer))


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
) -> PackInput:
    """Open ``input`` (a file, a ``datasets`` folder or a built-in corpus) or a ``synthetic`` spec.

    Pre-tokenized records (``input_ids``) are packed as given in every format: nothing is appended
    (the ids come from the user's tokenizer, whose EOS padless cannot know), and every id and label is
    checked against ``vocab_size``, by default the vocabulary of ``tokenizer``. Text and chat records
    are tokenized by :mod:`padless.data.encode` (each ends with one end-of-document token; ``train_on``
    and ``system_prompt`` as in :func:`padless.data.load_corpus`). ``synthetic`` draws ids below
    ``vocab_size`` (default 50,257, GPT-2's vocabulary). ``shard_rows``: records per logical shard
    (JSON lines are cut while the file is hashed).
    """
    if (input is None) == (synthetic is None):
        raise ValueError("give exactly one of input and synthetic")
    if vocab_size is not None and vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    if synthetic is not None:
        vocab = vocab_size or 50257
        src = SyntheticTokens(synthetic, vocab_size=vocab, seed=seed)
        key = {"synthetic": synthetic, "vocab_size": vocab, "seed": seed}
        return PackInput("synthetic", synthetic, key, "input_ids", vocab, total=len(src), seed=seed)
    if not input.strip():
        raise ValueError("input is empty: name a file, a folder or a built-in corpus")
    path = Path(input).expanduser()
    if system_prompt not in SYSTEM_PROMPT:
        raise ValueError(f"system_prompt={system_prompt!r} is not one of {', '.join(SYSTEM_PROMPT)}")
    text_key = {"tokenizer": tokenizer, "train_on": train_on, "system_prompt": system_prompt}
    if path.is_file() and path.suffix == ".jsonl":
        first_line, first = _first_jsonl_record(path)
        kind = _first_kind(first, f"{path}, line {first_line}")
        key, starts = scan_lines(path, shard_rows)
        vocab = (vocab_size or _tokenizer_vocab(tokenizer)) if kind == "input_ids" else None
        key.update({"vocab_size": vocab} if vocab else text_key)
        return PackInput("jsonl", str(path), key, kind, vocab, tokenizer, train_on, system_prompt,
                         line_starts=starts, rows_hint=shard_rows, unit="line")  # fmt: skip
    if path.is_file() and path.suffix == ".parquet":
        pq = require("pyarrow.parquet", "reading Parquet")
        from padless.data.files import file_fingerprint

        try:
            meta = pq.ParquetFile(path).metadata
        except Exception as err:  # pyarrow raises its own error types for a broken file
            raise ValueError(f"input {path} is not a readable Parquet file ({err})") from None
        names = meta.schema.to_arrow_schema().names
        kind = next((k for k in KIND_FIELDS if k in names), None)
        if kind is None:
            raise ValueError(f"{path} has none of the columns {', '.join(KIND_FIELDS)} (its columns: {', '.join(names)})")
        key = file_fingerprint(path)
        vocab = (vocab_size or _tokenizer_vocab(tokenizer)) if kind == "input_ids" else None
        key.update({"vocab_size": vocab} if vocab else text_key)
        return PackInput("parquet", str(path), key, kind, vocab, tokenizer, train_on, system_prompt,
                         total=meta.num_rows)
    if path.is_file() or path.is_dir():
        from padless.data.files import read_records

        rows, unit, _, fingerprint = read_records(str(path))
        records = [r for _, r in rows]
        numbers = [n for n, _ in rows]
        if not records:
            raise ValueError(f"{path} holds no records")
        kind = _first_kind(records[0], f"{path}, {where(numbers[0], unit)}")
        vocab = (vocab_size or _tokenizer_vocab(tokenizer)) if kind == "input_ids" else None
        key = dict(fingerprint) if path.is_file() else {"input": str(path.resolve())}
        key.update({"vocab_size": vocab} if vocab else text_key)
        return PackInput("records", str(path), key, kind, vocab, tokenizer, train_on, system_prompt,
                         total=len(records), records=records, numbers=numbers, unit=unit)  # fmt: skip
    from padless.data.corpora import CORPORA, split_corpus_name

    if split_corpus_name(input) is None:
        raise ValueError(f"input {input!r} is neither an existing file or folder nor a built-in corpus "
                         f"({', '.join(CORPORA)})")  # fmt: skip
    from padless.data.load import load_corpus

    corpus = load_corpus(input, tokenizer, train_on=train_on, system_prompt=system_prompt,  # type: ignore[arg-type]
                         progress=progress)
    records = [{"input_ids": x, "labels": y} for x, y in zip(corpus.input_ids, corpus.labels)]
    return PackInput("records", input, {"input": input, **text_key}, "input_ids", None, tokenizer, train_on,
                     system_prompt, total=len(records), records=records)  # fmt: skip


def iter_shards(source: PackInput, rows: int) -> Iterator[tuple[InputShard, ShardTokens]]:
    """Every shard of ``source`` and its tokens, in order (the serial reading, for tests and tools)."""
    for shard in source.shards(rows):
        yield shard, source.read(shard)
