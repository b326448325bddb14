"""Shared test fixtures: tiny models, deterministic features."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import settings

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# No per-example deadline (a loaded 2-core machine is slow, not wrong); in CI the examples are
# derandomized so a run is reproducible.
settings.register_profile("padless", deadline=None)
settings.register_profile("ci", deadline=None, derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "padless")


@pytest.fixture(scope="session", autouse=True)
def _torch_threads():
    import torch

    torch.set_num_threads(min(2, torch.get_num_threads()))
    torch.use_deterministic_algorithms(False)


def make_features(lengths, vocab_size=512, seed=0, with_labels=False):
    """Random token-id features; with labels, a prompt-like prefix of each is masked with -100."""
    rng = np.random.default_rng(seed)
    feats = []
    for n in lengths:
        ids = rng.integers(0, vocab_size, int(n)).tolist()
        feature = {"input_ids": ids}
        if with_labels:
            cut = int(rng.integers(0, n))
            feature["labels"] = [-100] * cut + ids[cut:]
        feats.append(feature)
    return feats


def row_documents(rows):
    """The documents of packed rows (dicts with ``input_ids`` and ``seq_lengths``), in row order."""
    docs = []
    for row in rows:
        at = 0
        for n in row["seq_lengths"]:
            docs.append(row["input_ids"][at : at + n])
            at += n
    return docs
