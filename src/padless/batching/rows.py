"""Packed rows as dataset items: a row is read by the ``(sequence, start, length)`` pieces it holds.

- :class:`PackedRowView`: a view of a dataset of sequences whose items are keyed by a planned row
  (:data:`padless.planning.schedule.RowKey`); what :class:`padless.DistributedPackedBatchSampler`
  yields.
- :class:`PackedRows`: a dataset whose items are whole packed rows, planned once over the whole
  dataset (a fixed token budget per row).

Each item is a pre-packed feature ``{"input_ids", "labels", "seq_lengths"}`` that
:class:`padless.PackingCollator` places as it is, without re-planning; a vision-language dataset's
image inputs travel with their documents (:func:`padless.batching.vision.row_vision`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from padless.batching.vision import row_vision
from padless.layout import IGNORE_INDEX, build_row, check_tokens, untokenized
from padless.planning.checks import OVERLONG_DEFAULT
from padless.planning.schedule import RowKey


class PackedRowView:
    """A map-style dataset of sequences seen as packed rows: item ``key`` (a :data:`RowKey`) is the
    pre-packed row ``{"input_ids", "labels", "seq_lengths"}`` (int64 numpy) made of those pieces.

    ``dataset[i]`` must give a mapping with ``input_ids`` and optionally ``labels`` (every token is
    trained without them), e.g. a list of dicts, :meth:`padless.data.load.TokenizedCorpus.features` or a
    ``datasets.Dataset``. The empty row ``()`` is one ``pad_token_id`` token with no trained label.
    """

    def __init__(self, dataset: Sequence[Mapping[str, Any]] | Any, *, pad_token_id: int = 0) -> None:
        self.dataset = dataset
        self.pad_token_id = pad_token_id

    def __len__(self) -> int:
        """Sequences in the underlying dataset."""
        return len(self.dataset)

    def __getitem__(self, key: RowKey) -> dict[str, np.ndarray]:
        if not isinstance(key, tuple):
            raise ValueError(f"a packed row is read by a row key (a tuple of (sequence, start, length)), got {key!r}")
        if not key:
            return {
                "input_ids": np.array([self.pad_token_id], dtype=np.int64),
                "labels": np.array([IGNORE_INDEX], dtype=np.int64),
                "seq_lengths": np.array([1], dtype=np.int64),
            }

        features: dict[int, Mapping[str, Any]] = {}

        def lookup(i: int) -> tuple[np.ndarray, np.ndarray]:
            feature = features[i] = self.dataset[i]
            if not isinstance(feature, Mapping) or "input_ids" not in feature:
                raise ValueError(untokenized(feature, f"sequence {i} of the dataset"))
            return check_tokens(feature["input_ids"], feature.get("labels"), where=f"sequence {i}")

        ids, labels, seq_lengths = build_row(key, lookup)
        return {"input_ids": ids, "labels": labels, "seq_lengths": seq_lengths, **row_vision(key, features)}


class PackedRows:
    """A map-style dataset of packed rows planned once over ``features``.

    Item ``r`` is ``{"input_ids", "labels", "seq_lengths"}``: the documents of row ``r``
    concatenated, and their lengths, plus a vision-language dataset's image inputs in document order
    (:mod:`padless.batching.image_rows`; a document with images is placed whole, and
    ``max_image_patches`` bounds the vision-encoder patches of a row). :attr:`plan` keeps the
    statistics (truncated/dropped counts); :attr:`dropped_images` the dropped documents that held images.
    """

    def __init__(
        self,
        features: Sequence[Mapping[str, Any]],
        max_length: int,
        *,
        strategy: str = "best_fit_decreasing",
        overlong: str = OVERLONG_DEFAULT,
        seed: int = 0,
        max_image_patches: int | None = None,
    ) -> None:
        from padless.batching import vision
        from padless.batching.image_rows import require_whole
        from padless.batching.rowformat import FeatureSpec
        from padless.planning.plan import plan_packs

        carried = vision.carried_keys(features)
        self.sequences = FeatureSpec().prepare(features, carried)
        costs = [vision.image_patches(f) for f in features] if max_image_patches is not None else None
        self.plan = plan_packs(
            self.sequences.lengths,
            max_length,
            strategy=strategy,
            overlong=overlong,
            seed=seed,
            costs=costs,
            max_cost=max_image_patches,
        )
        held = np.array([bool(vision.image_inputs(f)) for f in features], dtype=bool)
        p = self.plan
        require_whole(p.index, p.start, p.length, self.sequences.lengths, held, lambda i: f"feature {i}")
        self.dropped_images = int(held[p.dropped].sum())
        validated = [
            {"input_ids": i, "labels": lab, **({k: f[k] for k in carried if f.get(k) is not None} if h else {})}
            for i, lab, f, h in zip(self.sequences.input_ids, self.sequences.labels, features, held)
        ]
        self._rows = PackedRowView(validated)  # assembles a row from its (sequence, start, length) pieces

    def __len__(self) -> int:
        return self.plan.num_rows

    def __getitem__(self, r: int) -> dict[str, Any]:
        if not 0 <= r < len(self):
            raise IndexError(f"row {r} out of range [0, {len(self)})")
        index, start, length = self.plan.row(r)
        return self._rows[tuple(zip(index.tolist(), start.tolist(), length.tolist()))]
