"""Synthetic inputs of ``padless pack`` (``--synthetic DIST:N``): random token ids with lengths from a
named distribution, generated on the fly, item ``i`` the same on every read.

:class:`SyntheticTokens` is the sequence itself (block ``b`` of 4096 sequences is drawn from the seed
``(seed, b)``, so any item is found by drawing one block); :class:`SyntheticInput` is it as an input
of ``padless pack``, cut in whole blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from padless.data.shards import InputShard, PackInput, ShardTokens, cut_records
from padless.planning.lengths import LENGTH_PARAMETERS, draw_lengths

BLOCK = 4096
"""Synthetic sequences drawn per random block."""
DEFAULT_VOCAB = 50257
"""Ids are drawn below GPT-2's vocabulary unless another ``vocab_size`` is given."""


class SyntheticTokens:
    """``n`` sequences of random token ids, lengths from a named distribution: a sequence whose items are
    the same on every read (block ``b`` of 4096 is drawn from the seed ``(seed, b)``), generated on the fly.

    ``DIST:N[:P1[:P2...]]``: the lengths come from padless' generator of synthetic lengths
    (:func:`padless.planning.lengths.draw_lengths`), ``P1, P2...`` replacing its defaults in order:
    ``lognormal:N[:median[:sigma[:cap]]]`` (default 60, 1 and 2048: short texts, mean ~99 tokens) or
    ``uniform:N[:low[:high]]`` (default 10..500).
    """

    def __init__(self, spec: str, vocab_size: int = DEFAULT_VOCAB, seed: int = 0) -> None:
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
        count = min(BLOCK, self.n - b * BLOCK)
        lengths = draw_lengths(self.name, count, rng, self.params)
        offsets = np.concatenate(([0], np.cumsum(lengths)))
        return b, offsets, rng.integers(0, self.vocab_size, int(offsets[-1]), dtype=np.int32)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        if not 0 <= i < self.n:
            raise IndexError(f"synthetic sequence {i} out of range [0, {self.n})")
        b, j = divmod(i, BLOCK)
        if self._block[0] != b:
            self._block = self._draw(b)
        _, offsets, tokens = self._block
        return {"input_ids": tokens[offsets[j] : offsets[j + 1]]}

    def lengths(self) -> np.ndarray:
        """``[n]`` int64: every sequence's length (for comparisons; draws every block)."""
        return np.concatenate([np.diff(self._draw(b)[1]) for b in range(-(-self.n // BLOCK))])

    def blocks(self, begin: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, offsets)`` of sequences ``begin .. end - 1`` (``begin`` a multiple of 4096), whole
        blocks at a time."""
        ids, offsets = [], [np.zeros(1, dtype=np.int64)]
        at = 0
        for b in range(begin // BLOCK, -(-end // BLOCK)):
            _, off, tok = self._draw(b)
            ids.append(tok)
            offsets.append(off[1:] + at)
            at += int(off[-1])
        return np.concatenate(ids), np.concatenate(offsets)


@dataclass(frozen=True, kw_only=True)
class SyntheticInput(PackInput):
    """``--synthetic DIST:N`` as an input: :class:`SyntheticTokens` of ``seed``, cut in whole blocks of 4096."""

    kind: str = "input_ids"
    total: int
    """Sequences in the input (``N``)."""
    seed: int = 0
    """Seed of the blocks."""

    @classmethod
    def open(cls, spec: str, vocab_size: int | None = None, seed: int = 0) -> SyntheticInput:
        """The input of ``spec`` (checked), ids below ``vocab_size`` (default 50,257, GPT-2's vocabulary)."""
        vocab = DEFAULT_VOCAB if vocab_size is None else vocab_size
        src = SyntheticTokens(spec, vocab_size=vocab, seed=seed)
        key = {"synthetic": spec, "vocab_size": vocab, "seed": seed}
        return cls(name=spec, key=key, vocab_size=vocab, total=len(src), seed=seed)

    def shards(self, rows: int) -> list[InputShard]:
        """Every ``rows`` sequences, rounded up to whole blocks of 4096."""
        return cut_records(self.total, -(-rows // BLOCK) * BLOCK)

    def read(self, shard: InputShard) -> ShardTokens:
        src = SyntheticTokens(self.name, vocab_size=self.vocab_size or DEFAULT_VOCAB, seed=self.seed)
        ids, offsets = src.blocks(shard.begin, shard.end)
        first = shard.begin % BLOCK  # blocks start on a multiple of 4096
        offsets = offsets[first : first + shard.end - shard.begin + 1]
        ids = ids[offsets[0] : offsets[-1]]
        rows = np.arange(shard.begin + 1, shard.end + 1, dtype=np.int64)
        return ShardTokens(ids, None, offsets - offsets[0], rows)
