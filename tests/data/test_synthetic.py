"""Synthetic inputs (padless.data.synthetic): read shard by shard, they are the sequence read item by item."""

from __future__ import annotations

import numpy as np
import pytest

from padless.data.synthetic import BLOCK, SyntheticInput, SyntheticTokens


@pytest.mark.parametrize(("n", "rows"), [(1, 1), (4096, 4096), (9000, 1), (9000, 5000), (9000, 10**6)])
def test_every_shard_reads_the_items_of_its_range(n, rows):
    spec = f"uniform:{n}:1:9"
    src, ref = SyntheticInput.open(spec, vocab_size=7, seed=4), SyntheticTokens(spec, vocab_size=7, seed=4)
    shards = src.shards(rows)
    assert all(s.begin % BLOCK == 0 for s in shards) and shards[-1].end == n  # whole blocks, the last one short
    got = []
    for s in shards:
        toks = src.read(s)
        assert toks.labels is None and toks.rows.tolist() == list(range(s.begin + 1, s.end + 1))
        got += [toks.ids[a:b].tolist() for a, b in zip(toks.offsets[:-1], toks.offsets[1:])]
    assert got == [ref[i]["input_ids"].tolist() for i in range(n)]
    assert src.key == {"synthetic": spec, "vocab_size": 7, "seed": 4} and src.kind == "input_ids"


def test_the_seed_and_the_vocabulary_are_the_input():
    a, b = (SyntheticInput.open("lognormal:100", seed=s) for s in (0, 1))
    assert a.vocab_size == 50257 and a.key != b.key
    assert not np.array_equal(a.read(a.shards(100)[0]).ids, b.read(b.shards(100)[0]).ids)
    with pytest.raises(ValueError, match="vocab_size must be >= 1, got 0"):
        SyntheticTokens("uniform:3", vocab_size=0)
    with pytest.raises(ValueError, match=r"synthetic='uniform:0': N must be positive"):
        SyntheticInput.open("uniform:0")
    with pytest.raises(ValueError, match="vocab_size must be >= 1, got 0"):
        SyntheticInput.open("uniform:3", vocab_size=0)  # refused, not replaced by the default
