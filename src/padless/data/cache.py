"""On-disk cache of tokenized corpora, so that a second run starts at once.

An entry is one ``.npz`` file under ``<cache root>/tokens/``: the ids and labels of all examples
concatenated (int32), the example offsets (int64) and a JSON header (the report and the key's parts).
Its name is ``<corpus>-<key>.npz`` where the key hashes everything that changes the tokens: the source
(a built-in recipe's version and asset versions, or a hash of a file's bytes), the
tokenizer's fingerprint, and every encoding option. Entries are written atomically
(:mod:`padless.atomic`), so a crash never leaves a half-written entry. ``datasets``' own cache is not used here: it
keys on a pickled function and stores one Arrow table per ``map`` call, which is slower to check and
reload than one flat array pair for lists of token ids.
"""

from __future__ import annotations

import hashlib
import json
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from padless.atomic import atomic_write
from padless.data.assets import cache_root

CACHE_FORMAT = 4
"""Bump when the entry layout or the meaning of a key part changes (2: files keyed by content; 4: the record number of each example)."""


def cache_key(parts: dict[str, Any]) -> str:
    """A short stable hash of the key parts (JSON with sorted keys)."""
    blob = json.dumps({"format": CACHE_FORMAT, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def entry_path(name: str, key: str, root: Path | None = None) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", name)[-60:].strip("_") or "corpus"
    return (root or cache_root()) / "tokens" / f"{slug}-{key}.npz"


def save_entry(
    path: Path, input_ids: list[list[int]], labels: list[list[int]], meta: dict[str, Any], numbers: Any = None
) -> None:
    """Write one entry atomically; ``numbers``: the record number of each example (int64), if known."""
    lengths = np.fromiter((len(x) for x in input_ids), dtype=np.int64, count=len(input_ids))
    offsets = np.zeros(len(input_ids) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat_ids = np.fromiter((t for x in input_ids for t in x), dtype=np.int32, count=int(offsets[-1]))
    flat_labels = np.fromiter((t for x in labels for t in x), dtype=np.int32, count=int(offsets[-1]))
    header = np.frombuffer(json.dumps(meta, default=str).encode(), dtype=np.uint8)
    extra = {} if numbers is None else {"numbers": np.asarray(numbers, dtype=np.int64)}
    atomic_write(
        path, lambda f: np.savez(f, input_ids=flat_ids, labels=flat_labels, offsets=offsets, meta=header, **extra)
    )


def load_entry(path: Path) -> tuple[list[list[int]], list[list[int]], dict[str, Any]] | None:
    """``(input_ids, labels, meta)`` of an entry (``meta["numbers"]``: the record numbers, if saved), or
    None if it is missing or unreadable."""
    if not path.is_file():
        return None
    try:
        with np.load(path) as z:
            offsets = z["offsets"]
            ids, labels = z["input_ids"].tolist(), z["labels"].tolist()
            meta = json.loads(z["meta"].tobytes().decode())
            if "numbers" in z.files:
                meta["numbers"] = z["numbers"]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return None  # a damaged entry is rebuilt, not trusted
    bounds = offsets.tolist()
    return ([ids[a:b] for a, b in zip(bounds, bounds[1:])], [labels[a:b] for a, b in zip(bounds, bounds[1:])], meta)
