"""Sources of tokenized examples for ``padless pack``, streamed with bounded memory and re-openable.

- :class:`SyntheticTokens`: ``N`` random sequences with lengths from a named distribution, generated on
  the fly (a sequence: item ``i`` is the same on every read), for measuring at scale.
- :class:`JsonlTokens`: pre-tokenized JSON lines, one line at a time; its state is a byte offset.
- :class:`ParquetTokens`: a pre-tokenized Parquet file, in batches; its state is a row number.
- anything else (text or chat files, ``datasets`` folders, built-in corpora) is tokenized in memory by
  :func:`padless.data.load_corpus` and packed from there.

Pre-tokenized inputs are packed as they are: nothing is appended (``padless.data`` adds EOS to text and
chats; add it yourself to pre-tokenized ids if rows should be EOS-separated).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from padless._optional import require
_BLOCK = 4096  # synthetic sequences drawn per random block
SYNTHETIC = {"lognormal": ("median", "sigma"), "uniform": ("low", "high")}
"""Synthetic length distributions and their parameters (``--synthetic lognormal:N:median:sigma``)."""
_SYNTHETIC_DEFAULTS = {"lognormal": (48.0, 0.8), "uniform": (10.0, 500.0)}


class SyntheticTokens:
    """``n`` sequences of random token ids, lengths from a named distribution: a sequence whose items are
    the same on every read (block ``b`` of 4096 is drawn from the seed ``(seed, b)``), generated on the fly.

    ``lognormal:N[:median[:sigma]]`` (default 48 and 0.8: short fine-tuning examples, mean ~66 tokens)
    or ``uniform:N[:low:high]`` (default 10..500). Lengths are at least 1.
    """

    def __init__(self, spec: str, vocab_size: int = 50257, seed: int = 0) -> None:
        name, _, rest = spec.partition(":")
        parts = rest.split(":") if rest else []
        if name not in SYNTHETIC or not parts or len(parts) > 3:
            raise ValueError(f"--synthetic {spec!r}: expected DIST:N[:P1:P2] with DIST one of {', '.join(SYNTHETIC)}")
        try:
            self.n = int(parts[0])
            params = [float(p) for p in parts[1:]]
        except ValueError:
            raise ValueError(f"--synthetic {spec!r}: N and the parameters must be numbers") from None
        self.params = (*params, *_SYNTHETIC_DEFAULTS[name][len(params) :])
        low, high = self.params
        if self.n < 1 or low <= 0 or high <= 0 or (name == "uniform" and high < low):
            raise ValueError(f"--synthetic {spec!r}: N and the parameters must be positive (and low <= high)")
        if vocab_size < 1:
            raise ValueError(f"--vocab-size must be >= 1, got {vocab_size}")
        self.name, self.vocab_size, self.seed = name, vocab_size, seed
        self._block = (-1, np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int32))

    def __len__(self) -> int:
        return self.n

    def _draw(self, b: int) -> tuple[int, np.ndarray, np.ndarray]:
        rng = np.random.default_rng([self.seed, b])
        count = min(_BLOCK, self.n - b * _BLOCK)
        p, q = self.params
        raw = rng.lognormal(np.log(p), q, count) if self.name == "lognormal" else rng.uniform(p, q + 1, count)
        lengths = np.maximum(1, np.floor(raw) if self.name == "uniform" else np.round(raw)).astype(np.int64)
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
        import pyarrow.parquet as pq

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


def _first_record(path: Path) -> Any:
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                try:
                    return json.loads(line)
                except json.JSONDecodeError:
                    return None
    return None


def open_input(args: Any) -> tuple[Any, int | None, dict[str, Any]]:
    """``(source, number of sequences if known, what identifies the input for a resume)`` for the CLI flags."""
    if (args.input is None) == (args.synthetic is None):
        raise ValueError("give exactly one of INPUT and --synthetic")
    if args.synthetic is not None:
        src = SyntheticTokens(args.synthetic, vocab_size=args.vocab_size, seed=args.seed)
        return src, len(src), {"synthetic": args.synthetic, "vocab_size": args.vocab_size, "seed": args.seed}
    path = Path(args.input).expanduser()
    if path.is_file():
        key = {"input": str(path.resolve()), "bytes": path.stat().st_size, "mtime_ns": path.stat().st_mtime_ns}
        if path.suffix == ".jsonl" and isinstance(rec := _first_record(path), dict) and "input_ids" in rec:
            return JsonlTokens(path), None, key
        if path.suffix == ".parquet":
            pq = require("pyarrow.parquet", "reading Parquet")

            try:
                meta = pq.ParquetFile(path).metadata
            except Exception as err:  # pyarrow raises its own error types for a broken file
                raise ValueError(f"INPUT {path} is not a readable Parquet file ({err})") from None
            if "input_ids" in meta.schema.to_arrow_schema().names:
                return ParquetTokens(path), meta.num_rows, key
    else:
        from padless.data.corpora import CORPORA, split_corpus_name

        if not path.is_dir() and split_corpus_name(args.input) is None:
            raise ValueError(f"INPUT {args.input!r} is neither an existing file or folder nor a built-in corpus "
                             f"({', '.join(CORPORA)})")  # fmt: skip
        key = {"input": args.input if not path.is_dir() else str(path.resolve())}
    from padless.data import load_corpus

    key.update(tokenizer=args.tokenizer, train_on=args.train_on)
    corpus = load_corpus(args.input, args.tokenizer, train_on=args.train_on, progress=args.progress)
    return _Corpus(corpus), len(corpus), key
