"""Sources of tokenized examples for ``padless pack``, streamed with bounded memory and re-openable.

- :class:`SyntheticTokens`: ``N`` random sequences with lengths from a named distribution, generated on
  the fly (a sequence: item ``i`` is the same on every read), for measuring at scale.
- :class:`JsonlTokens`: pre-tokenized JSON lines, one line at a time; its state is a byte offset.
- :class:`ParquetTokens`: a pre-tokenized Parquet file, in batches; its state is a row number.
- anything else (text or chat files, ``datasets`` folders, built-in corpora) is tokenized in memory by
  :func:`padless.data.load_corpus` and packed from there.

Pre-tokenized inputs, in every file format (``.jsonl``, ``.json``, ``.csv``, ``.tsv``, ``.parquet``), are
packed as they are: nothing is appended (``padless.data`` adds EOS to text and chats; add it yourself to
pre-tokenized ids if rows should be EOS-separated), and every id and label is checked against the
vocabulary (:func:`open_input`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from padless._optional import require
from padless.planning.lengths import LENGTH_PARAMETERS, draw_lengths

_BLOCK = 4096  # synthetic sequences drawn per random block


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
        lengths = draw_lengths(self.name, min(_BLOCK, self.n - b * _BLOCK), rng, self.params)
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


class JsonlTokens:
    """Pre-tokenized JSON lines (``input_ids`` and optional ``labels`` per line), read one line at a time.

    Its ``state_dict`` is the byte offset after the last record yielded, so a resume seeks there.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._at = (0, 0)  # (byte offset, line number) after the last record yielded
        self._start = (0, 0)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        (offset, line_no), self._start = self._start, (0, 0)  # a loaded state applies to one pass
        with open(self.path, "rb") as f:
            f.seek(offset)
            for line in iter(f.readline, b""):
                line_no += 1
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    raise ValueError(f"{self.path}: line {line_no} is not valid JSON ({err.msg})") from None
                self._at = (f.tell(), line_no)
                yield record

    def state_dict(self) -> dict[str, int]:
        return {"offset": self._at[0], "line": self._at[1]}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._start = (int(state["offset"]), int(state["line"]))


class ParquetTokens:
    """A pre-tokenized Parquet file (``input_ids`` and optional ``labels`` list columns), read in batches.

    Its ``state_dict`` is the number of rows yielded; a resume starts at that row's row group.
    """

    def __init__(self, path: Path) -> None:
        pq = require("pyarrow.parquet", "reading Parquet")

        self.path = path
        meta = pq.ParquetFile(path).metadata
        names = meta.schema.to_arrow_schema().names
        self.columns = [c for c in ("input_ids", "labels") if c in names]
        self.group_rows = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        self._row, self._start = 0, 0

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        pq = require("pyarrow.parquet", "reading Parquet")

        start, self._start = self._start, 0
        first = np.cumsum([0, *self.group_rows])
        g = int(np.searchsorted(first, start, side="right")) - 1
        row = int(first[g]) if self.group_rows else 0
        groups = list(range(g, len(self.group_rows)))
        for batch in pq.ParquetFile(self.path).iter_batches(batch_size=1024, columns=self.columns, row_groups=groups):
            cols = {}
            for name in self.columns:
                arr = batch.column(name)
                if arr.null_count:
                    raise ValueError(f"{self.path}: column {name!r} has a null list near row {row}")
                offsets = arr.offsets.to_numpy()
                cols[name] = (arr.flatten().to_numpy(zero_copy_only=False), offsets - offsets[0])
            for i in range(batch.num_rows):
                if row >= start:
                    self._row = row + 1
                    yield {name: v[o[i] : o[i + 1]] for name, (v, o) in cols.items()}
                row += 1

    def state_dict(self) -> dict[str, int]:
        return {"row": self._row}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._start = int(state["row"])


class _Corpus:
    """A :class:`padless.data.TokenizedCorpus` as a sequence of features."""

    def __init__(self, corpus: Any) -> None:
        self.corpus = corpus

    def __len__(self) -> int:
        return len(self.corpus)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        return {"input_ids": self.corpus.input_ids[i], "labels": self.corpus.labels[i]}


class _Records:
    """Pre-tokenized records read whole (``.json``, ``.csv``, ``.tsv``) as a sequence of features."""

    def __init__(self, records: list[Any]) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> Any:
        r = self.records[i]
        return {k: r[k] for k in ("input_ids", "labels") if r.get(k) is not None} if isinstance(r, dict) else r


@dataclass(frozen=True)
class PackInput:
    """An opened input of :func:`padless.export.parquet.pack_to_parquet`."""

    source: Any
    """Tokenized examples: a sequence or a re-iterable of ``{"input_ids", "labels"?}``."""
    total: int | None
    """Number of examples if known (for the progress bar)."""
    key: dict[str, Any]
    """What identifies the input (a hash of a file's bytes): a resume must see the same."""
    vocab_size: int | None
    """Ids and labels are checked against ``[0, vocab_size)`` (None: tokenized here, checked then)."""
    pretokenized: bool
    """The input held token ids (packed as given: no EOS appended)."""


def _first_record(path: Path) -> Any:
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                try:
                    return json.loads(line)
                except json.JSONDecodeError:
                    return None
    return None


def _tokenizer_vocab(tokenizer: str) -> int:
    from padless.data.tokenizer import load_tokenizer

    return len(load_tokenizer(tokenizer))


def open_input(
    input: str | None,
    *,
    synthetic: str | None = None,
    vocab_size: int | None = None,
    seed: int = 0,
    tokenizer: str = "gpt2",
    train_on: str = "all",
    progress: bool = True,
) -> PackInput:
    """Open ``input`` (a file, a ``datasets`` folder or a built-in corpus) or a ``synthetic`` spec.

    Pre-tokenized files (records with ``input_ids``) are packed as given in every format: nothing is
    appended (the ids come from the user's tokenizer, whose EOS padless cannot know), and every id and
    label is checked against ``vocab_size``, by default the vocabulary of ``tokenizer``. Text and chat
    records are tokenized by :func:`padless.data.load_corpus` (which ends each with EOS). ``synthetic``
    draws ids below ``vocab_size`` (default 50,257, GPT-2's vocabulary).
    """
    if (input is None) == (synthetic is None):
        raise ValueError("give exactly one of input and synthetic")
    if vocab_size is not None and vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    if synthetic is not None:
        vocab = vocab_size or 50257
        src = SyntheticTokens(synthetic, vocab_size=vocab, seed=seed)
        return PackInput(src, len(src), {"synthetic": synthetic, "vocab_size": vocab, "seed": seed}, vocab, True)
    if not input.strip():
        raise ValueError("input is empty: name a file, a folder or a built-in corpus")
    path = Path(input).expanduser()
    if path.is_file():
        from padless.data.files import file_fingerprint

        key: dict[str, Any] = file_fingerprint(path)
        source: Any = None
        total = None
        if path.suffix == ".jsonl" and isinstance(rec := _first_record(path), dict) and "input_ids" in rec:
            source = JsonlTokens(path)
        elif path.suffix == ".parquet":
            pq = require("pyarrow.parquet", "reading Parquet")

            try:
                meta = pq.ParquetFile(path).metadata
            except Exception as err:  # pyarrow raises its own error types for a broken file
                raise ValueError(f"input {path} is not a readable Parquet file ({err})") from None
            if "input_ids" in meta.schema.to_arrow_schema().names:
                source, total = ParquetTokens(path), meta.num_rows
        elif path.suffix in (".json", ".csv", ".tsv"):
            from padless.data.files import read_records

            rows = [r for _, r in read_records(str(path))[0]]
            if rows and isinstance(rows[0], dict) and rows[0].get("input_ids") is not None:
                source, total = _Records(rows), len(rows)
        if source is not None:
            vocab = vocab_size or _tokenizer_vocab(tokenizer)
            key["vocab_size"] = vocab
            return PackInput(source, total, key, vocab, True)
    else:
        from padless.data.corpora import CORPORA, split_corpus_name

        if not path.is_dir() and split_corpus_name(input) is None:
            raise ValueError(f"input {input!r} is neither an existing file or folder nor a built-in corpus "
                             f"({', '.join(CORPORA)})")  # fmt: skip
        key = {"input": input if not path.is_dir() else str(path.resolve())}
    from padless.data import load_corpus

    key.update(tokenizer=tokenizer, train_on=train_on)
    corpus = load_corpus(input, tokenizer, train_on=train_on, progress=progress)
    return PackInput(_Corpus(corpus), len(corpus), key, None, False)  # ids checked when tokenized
