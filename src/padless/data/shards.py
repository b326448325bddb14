"""An input of ``padless pack`` as logical shards: the shard, its tokens, and what every reader shares.

Each form of input is a :class:`PackInput` with two methods (:mod:`padless.data.inputs`: JSON lines,
Parquet, records read whole; :mod:`padless.data.synthetic`): :meth:`~PackInput.shards` cuts it every
``rows`` records by the data alone, never by the number of workers, and :meth:`~PackInput.read` turns
one shard into :class:`ShardTokens` in any process. Readers of records hand them to
:func:`encode_shard` (one kind of record per input; pre-tokenized ids checked, text and chats
tokenized); readers of flat token columns use :func:`check_flat`. Both validate with
:func:`padless.layout.check_tokens`, which every reader shares, so a bad token gets the same message
from every form, prefixed with where it is (``d.jsonl, line 3``, ``d.parquet, record 3``).
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from padless._optional import require
from padless.data.formats import FORMATS, map_columns, record_format
from padless.data.records import RecordError, Unit, where
from padless.layout import TokenError, check_tokens

INT32_IDS = 2**31
"""Shards store ids as int32: ids given without a vocabulary are checked against ``[0, 2**31)``."""


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
    images: Any = None
    """Chats rendered through a processor: a ``pyarrow.Table`` with one row per sequence, its image
    columns (:data:`padless.layout.IMAGE_COLUMNS`: ``pixel_values``, ``image_grid_thw``...,
    null for a sequence without images); None otherwise."""
    token_columns: dict[str, np.ndarray] = field(default_factory=dict)
    """Per-token vision columns (``mm_token_type_ids``...), int32, flat and aligned with ``ids``."""
    skipped: dict[str, int] = field(default_factory=dict)
    """Bad records left out, by reason (``on_error="skip"``)."""
    first_skipped: list[str] = field(default_factory=list)
    """The messages of the first few of them, naming each."""

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


@dataclass(frozen=True, kw_only=True)
class PackInput(ABC):
    """An opened input of ``padless pack``: what identifies it, what its records are, how it is cut and
    read (:meth:`shards`, :meth:`read`: one subclass per form of input)."""

    name: str
    """The input as named by the user (a path, a corpus, a synthetic spec), for messages."""
    key: dict[str, Any]
    """What identifies the input's content (a hash of a file's bytes, a spec): a resume must see the same."""
    kind: str
    """The form of its records (:data:`padless.data.formats.FORMATS`: ``input_ids``, ``messages``,
    ``alpaca``...), its first record's."""
    vocab_size: int | None = None
    """Ids and labels are checked against ``[0, vocab_size)`` (None: ``[0, 2**31)``, or tokenized here)."""
    unit: Unit = "record"
    """How records are named in messages: ``line`` (JSON lines, CSV) or ``record``."""
    tokenizer: str = "gpt2"
    """Tokenizer of text and chats."""
    train_on: str = "auto"
    """Labels of chats: ``auto`` | ``all`` | ``assistant`` | ``completion``."""
    system_prompt: str = "template"
    """A system prompt the chat template adds: ``template`` keeps it, ``none`` leaves it out."""
    processor: str | None = None
    """Chats are rendered through this vision-language processor (a hub name or folder, or ``offline``:
    :func:`padless.data.images.offline_processor`), images and all; None: through the tokenizer."""
    columns: tuple[tuple[str, str], ...] = ()
    """``(padless name, record's field)``: fields renamed before reading (:func:`padless.data.formats.parse_columns`)."""
    on_error: str = "raise"
    """What a bad record of text or chats does: ``raise`` or ``skip`` (counted in :attr:`ShardTokens.skipped`)."""

    @property
    def pretokenized(self) -> bool:
        return self.kind == "input_ids"

    @abstractmethod
    def shards(self, rows: int) -> list[InputShard]:
        """The input cut every ``rows`` records, by the data alone."""

    @abstractmethod
    def read(self, shard: InputShard) -> ShardTokens:
        """The shard's sequences, tokenized and checked (a bad record raises ``ValueError`` naming its row)."""

    def where(self, row: int) -> str:
        """``"d.jsonl, line 3"``: how the record numbered ``row`` (:attr:`ShardTokens.rows`) is named."""
        return f"{self.name}, {where(row, self.unit)}"


def cut_records(total: int, rows: int, numbers: Sequence[int] | None = None) -> list[InputShard]:
    """``total`` records cut every ``rows``: shard ``i`` holds records ``i * rows ...`` (positions from
    0), its first named ``numbers[i * rows]`` (default: its position from 1)."""
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    return [
        InputShard(i, b, min(b + rows, total), numbers[b] if numbers is not None else b + 1)
        for i, b in enumerate(range(0, total, rows))
    ]


@functools.lru_cache(maxsize=4)
def cached_tokenizer(name: str) -> Any:
    """One tokenizer per process and name (a worker reading many shards loads it once)."""
    from padless.data.tokenizer import load_tokenizer

    return load_tokenizer(name)


@functools.lru_cache(maxsize=2)
def cached_processor(name: str) -> Any:
    """One processor per process and name: ``offline`` is :func:`padless.data.images.offline_processor`,
    anything else goes to ``transformers.AutoProcessor.from_pretrained``."""
    if name == "offline":
        from padless.data.images import offline_processor

        return offline_processor()
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(name)


def _image_chats(source: PackInput, rows: Sequence[int], records: Sequence[Any]) -> ShardTokens:
    """Chats rendered through ``source.processor`` (:func:`padless.data.images.render_image_chat`):
    assistant turns trained, images expanded into their tokens, image paths read relative to the
    input's folder; the image columns as an Arrow table, the per-token ones flat."""
    from pathlib import Path

    from padless.data.images import arrow_column, render_image_chat
    from padless.layout import IMAGE_COLUMNS, PER_TOKEN_COLUMNS

    pa = require("pyarrow", "packing images")
    processor = cached_processor(str(source.processor))
    here = Path(source.name)
    base_dir = here.parent if here.is_file() else here
    features = []
    for row, record in zip(rows, records):
        at = source.where(row)
        messages = record.get("messages") if isinstance(record, Mapping) else None
        if not isinstance(messages, list):
            raise ValueError(f"{at}: a chat record needs a 'messages' list")
        features.append(
            render_image_chat(messages, processor, where=at, base_dir=base_dir, images=record.get("images"))
        )
    keys = list(dict.fromkeys(k for f in features for k in f))
    unknown = [k for k in keys if k not in ("input_ids", "labels", *IMAGE_COLUMNS, *PER_TOKEN_COLUMNS)]
    if unknown:
        raise ValueError(
            f"{source.name}: the processor {source.processor!r} returns {unknown}, which padless pack does not "
            f"know how to place; it carries {', '.join((*IMAGE_COLUMNS, *PER_TOKEN_COLUMNS))}"
        )
    ids = [f["input_ids"] for f in features]
    labels = [f["labels"] for f in features]
    tokens = {
        k: np.concatenate([np.asarray(f.get(k) or [0] * len(f["input_ids"]), dtype=np.int32) for f in features])
        for k in keys
        if k in PER_TOKEN_COLUMNS
    }
    table = pa.table({k: arrow_column([f.get(k) for f in features]) for k in keys if k in IMAGE_COLUMNS})
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    flat = np.concatenate(ids).astype(np.int32) if ids else np.zeros(0, dtype=np.int32)
    flat_labels = np.concatenate(labels).astype(np.int32) if ids else flat
    return ShardTokens(
        flat,
        flat_labels,
        np.concatenate(([0], np.cumsum(lengths))),
        np.asarray(rows, dtype=np.int64),
        images=table if table.num_columns else None,
        token_columns=tokens,
    )


def encode_shard(source: PackInput, rows: Sequence[int], records: Sequence[Any]) -> ShardTokens:
    """The tokens of ``records`` of ``source`` (named ``rows``), one sequence per record.

    Every record must be of the input's form (its first record's): another form is an error naming
    its row (or, with ``on_error="skip"``, a skipped record of reason ``mixed_forms``). Pre-tokenized ids are taken as given (nothing appended) and checked by
    :func:`padless.layout.check_tokens`; text and chats are tokenized by :mod:`padless.data.encode`
    (each ends with one end-of-document token; no ``max_length`` here: the packer applies the
    overlong policy)."""
    skipped: dict[str, int] = {}
    notes: list[str] = []
    kept_rows, kept = [], []
    for row, record in zip(rows, records):
        try:
            record = map_columns(record, source.columns, source.where(row))
            form = record_format(record, source.where(row))
            if form != source.kind:
                raise RecordError(
                    "mixed_forms",
                    f"{source.where(row)} has {form!r}, but the input's first record has {source.kind!r}: an input "
                    f"holds one kind of record (write each kind to its own file; this one is {FORMATS[form]})",
                )
        except RecordError as err:
            if source.on_error != "skip" or source.pretokenized:
                raise ValueError(str(err)) from None
            skipped[err.reason] = skipped.get(err.reason, 0) + 1
            if len(notes) < 5:
                notes.append(str(err))
            continue
        kept_rows.append(row)
        kept.append(record)
    rows, records = kept_rows, kept
    if source.processor is not None:
        return _image_chats(source, rows, records)
    added = 0
    if source.kind == "input_ids":
        vocab = source.vocab_size if source.vocab_size is not None else INT32_IDS
        pairs = [
            check_tokens(r["input_ids"], r.get("labels"), vocab_size=vocab, where=source.where(row))
            for row, r in zip(rows, records)
        ]
        ids: Sequence[Any] = [x for x, _ in pairs]
        labels: Sequence[Any] = [y for _, y in pairs]
    else:
        from padless.data.encode import EncodeOptions, encode_records

        opts = EncodeOptions(train_on=source.train_on, system_prompt=source.system_prompt, on_error=source.on_error)  # type: ignore[arg-type]
        tok = cached_tokenizer(source.tokenizer)
        try:
            ids, labels, counts = encode_records(
                records, tok, opts, numbers=rows, unit=source.unit, progress=False, source=source.name
            )
        except RecordError as err:
            raise ValueError(str(err)) from None
        added = counts.system_prompt_added
        rows = counts.numbers
        for reason, n in counts.skipped.items():
            skipped[reason] = skipped.get(reason, 0) + n
        notes = (notes + counts.first_skipped)[:5]
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    flat = np.concatenate(ids).astype(np.int32) if len(ids) else np.zeros(0, dtype=np.int32)
    flat_labels = np.concatenate(labels).astype(np.int32) if len(labels) else np.zeros(0, dtype=np.int32)
    same = np.array_equal(flat, flat_labels)
    return ShardTokens(
        flat, None if same else flat_labels, offsets, np.asarray(rows, dtype=np.int64), added,
        skipped=skipped, first_skipped=notes,
    )  # fmt: skip


def check_flat(
    ids: np.ndarray,
    offsets: np.ndarray,
    labels: np.ndarray | None = None,
    label_offsets: np.ndarray | None = None,
    *,
    vocab_size: int | None,
    name: Callable[[int], str],
) -> tuple[np.ndarray, np.ndarray | None]:
    """int64 ``(ids, labels or None)`` of sequences held flat (sequence ``i`` is
    ``ids[offsets[i]:offsets[i + 1]]``, its labels ``labels[label_offsets[i]:label_offsets[i + 1]]``,
    by default at the same offsets), checked by :func:`padless.layout.check_tokens` as if one sequence
    at a time: the first it refuses raises its message, named ``name(i)``.

    Every rule of the validator holds token by token (a dtype is the whole array's, which the
    sequences share), so the flat arrays pass exactly when every sequence does: one vectorised call
    checks a whole shard. Only a refused shard (or an empty sequence, or labels of other lengths) is
    checked sequence by sequence, to name the first bad one."""
    vocab = vocab_size if vocab_size is not None else INT32_IDS
    lab_offsets = offsets if label_offsets is None else label_offsets
    n = offsets.size - 1
    if n == 0:
        return np.zeros(0, dtype=np.int64), (None if labels is None else np.zeros(0, dtype=np.int64))
    if int(np.diff(offsets).min()) > 0 and np.array_equal(lab_offsets, offsets):
        try:
            flat_ids, flat_labels = check_tokens(ids, labels, vocab_size=vocab, where="shard")
            return flat_ids, (None if labels is None else flat_labels)
        except TokenError:
            pass  # name the first bad sequence below
    for i in range(n):
        seq_labels = None if labels is None else labels[lab_offsets[i] : lab_offsets[i + 1]]
        check_tokens(ids[offsets[i] : offsets[i + 1]], seq_labels, vocab_size=vocab, where=name(i))
    raise AssertionError("the flat token check refused sequences that each pass it")
