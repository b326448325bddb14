"""Collators: a list of features -> one dict that a Hugging Face causal LM's ``forward()`` accepts.

- :class:`PaddingCollator` pads every sequence to the longest of the batch (the baseline).
- :class:`PackingCollator` packs the sequences of the batch into rows with a planner
  (:func:`padless.plan_packs`) and describes the documents of each row so that attention stays
  inside a document, positions restart at 0, and no token is trained to predict the next document.

A feature is a dict with ``input_ids`` (a 1-D list, array or tensor of token ids) and optionally
``labels`` of the same length (``IGNORE_INDEX`` where a token is not trained, e.g. prompts). Without
labels every token is trained. Labels are *unshifted*, as transformers expects: the model predicts
``labels[t + 1]`` from position ``t``.

A packed row of documents ``a b c | d e`` (``|`` a document start) and one pad token ``_``::

    input_ids      a  b  c  d  e  _
    position_ids   0  1  2  0  1  0       restart per document; the pad is its own document
    labels       -100 b  c -100 e -100    each document's first label is masked: ``c`` must never be
                                           trained to predict ``d``; the pad is never a target
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from padless.batching import vision
from padless.batching.batch import NOT_FORWARD, PackedBatch, Placements, batch_to, device_of, forward_inputs  # noqa: F401 (re-exported)
from padless.batching.rowformat import FeatureSpec, RowFormat, Sequences, round_up  # noqa: F401 (re-exported)
from padless.layout import (
    IGNORE_INDEX,
    ROW_PADDING,
    build_row,
    cu_seqlens_from_lengths,
    mask_document_starts,
    position_ids_from_lengths,
)


@dataclass
class PaddingCollator:
    """Pads to the longest sequence of the batch (right padding): ``input_ids``, ``attention_mask``
    (1 on real tokens), ``labels`` (``IGNORE_INDEX`` on padding), each ``[B, T]``; a vision-language
    model's image inputs travel with their rows (:func:`padless.batching.vision.padded_vision`)."""

    pad_token_id: int = 0
    """Id written into padding positions (never attended to, never trained)."""
    pad_to_multiple_of: int | None = None
    """Round the padded length up to a multiple of this (tensor-core friendly shapes)."""
    features: FeatureSpec = field(default_factory=FeatureSpec)
    """Validation and separator handling, shared with :class:`PackingCollator`."""

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        seqs = self.features.prepare(features, vision.carried_keys(features))
        width = round_up(int(seqs.lengths.max()), self.pad_to_multiple_of)
        input_ids = np.full((len(seqs.input_ids), width), self.pad_token_id, dtype=np.int64)
        labels = np.full_like(input_ids, IGNORE_INDEX)
        attention_mask = np.zeros_like(input_ids)
        for b, (ids, lab) in enumerate(zip(seqs.input_ids, seqs.labels)):
            input_ids[b, : ids.size] = ids
            labels[b, : ids.size] = lab
            attention_mask[b, : ids.size] = 1
        batch = {
            "input_ids": torch.from_numpy(input_ids),
            "attention_mask": torch.from_numpy(attention_mask),
            "labels": torch.from_numpy(labels),
            **vision.padded_vision(features, seqs.lengths, width),  # images travel with their rows
        }
        weights = self.features.weights(features)
        if weights is not None:
            from padless.batching.weights import padded_weights

            batch["loss_weights"] = torch.from_numpy(padded_weights(weights, width))
        return batch


@dataclass(frozen=True, kw_only=True)
class PackingCollator(RowFormat):
    """Packs the batch's sequences into rows and emits what keeps documents isolated.

    Keys: ``input_ids``, ``labels``, ``position_ids`` (``[R, L]``), ``use_cache=False`` (a cache
    silently turns off transformers' packed-row handling, so a plain ``model(**batch)`` stays exact),
    and by ``attention``: ``attention_mask`` ``[R, 1, L, L]`` (mask4d) or ``cu_seq_lens_q/k``,
    ``max_length_q/k`` (varlen). The keywords are :class:`padless.batching.rowformat.RowFormat`'s
    fields; use :meth:`for_model` to pick ``attention``, the mask dtype and the sliding windows from
    a model's attention implementation and config. One built without the model collates only once
    fitted (``collator = padless.check_collator(model, collator)``) or made with ``model_free=True``.

    Totals of what the planner truncated or dropped accumulate in :attr:`totals` (in the process that
    calls the collator), so nothing is lost silently.
    """

    totals: dict[str, int] = field(
        default_factory=lambda: {
            "sequences": 0,
            "tokens": 0,
            "truncated_sequences": 0,
            "truncated_tokens": 0,
            "dropped_sequences": 0,
            "dropped_tokens": 0,
            "split_sequences": 0,
            "images": 0,
            "dropped_images": 0,
        }
    )
    """Running counts over every batch collated so far (``images``: images carried; ``dropped_images``:
    images of documents the overlong policy dropped, which leave with them)."""

    def pack(self, features: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, np.ndarray, list[list[int]], Placements]:
        """Plan and place tokens: ``input_ids`` and ``labels`` ``[R, L]``, each row's document lengths
        (the trailing pad, if any, is the last document of its row) and the :class:`Placements`.
        Refuses once the features are validated if this collator holds no
        :attr:`~padless.batching.rowformat.RowFormat.verdict` its settings fit (nor ``model_free=True``).

        Features that carry ``seq_lengths`` are rows packed beforehand (:class:`padless.PackedRows`,
        ``padless pack``): each becomes one row with those documents, without re-planning.
        """
        return self._pack(features)[:4]

    def _carried(self, features: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
        """The image inputs this collator carries itself (:mod:`padless.batching.vision`):
        ``token_type_ids`` only for a family that reads them or a batch with images (elsewhere they
        must be zeros)."""
        scheme = self.verdict.vision if self.verdict is not None else None
        return vision.carried_keys(
            features, reads_token_types=scheme is not None and "token_type_ids" in scheme.token_keys
        )

    def _pack(self, features: Sequence[Mapping[str, Any]]) -> tuple[Any, ...]:
        prepacked = ["seq_lengths" in f for f in features]
        if any(prepacked) and not all(prepacked):
            raise ValueError("the batch mixes pre-packed rows (with 'seq_lengths') and single sequences")
        packed_before = bool(prepacked) and all(prepacked)
        plan = None
        carried = self._carried(features)
        if packed_before:
            seqs = FeatureSpec(vocab_size=self.features.vocab_size).prepare(features, carried)
            placements = self._prepacked(features, seqs.lengths)
        else:
            seqs = self.features.prepare(features, carried)
            if self.max_length is not None:
                from padless.planning.plan import plan_packs

                costs = None
                if self.max_image_patches is not None:  # a second limit: vision-encoder patches per row
                    costs = [vision.image_patches(f) for f in features]
                plan = plan_packs(
                    seqs.lengths,
                    self.max_length,
                    strategy=self.strategy,
                    overlong=self.overlong,
                    costs=costs,
                    max_cost=self.max_image_patches,
                )
        self._check_verdict()  # checked once: after the input's own errors, before anything is counted
        if plan is not None:
            self._count(plan.stats, seqs.lengths)
            if plan.num_rows == 0:
                raise ValueError("every sequence of the batch was dropped by the overlong policy; nothing to train on")
            placements = Placements.from_plan(
                index=plan.index,
                start=plan.start,
                length=plan.length,
                row_offsets=plan.row_offsets,
                num_features=plan.num_sequences,
            )
        elif not packed_before:  # no max_length: one row of every sequence, in order
            lengths = seqs.lengths
            self._count(None, lengths)
            placements = Placements.from_plan(
                index=np.arange(lengths.size),
                start=np.zeros(lengths.size, dtype=np.int64),
                length=lengths,
                row_offsets=[0, lengths.size],
                num_features=lengths.size,
            )
        return (*self._place(seqs, placements), seqs)

    def _prepacked(self, features: Sequence[Mapping[str, Any]], totals: np.ndarray) -> Placements:
        """One row per pre-packed feature, its documents as pieces."""
        docs = []
        for i, (f, total) in enumerate(zip(features, totals)):
            d = f["seq_lengths"]
            d = np.asarray(d.detach().cpu().numpy() if hasattr(d, "detach") else d, dtype=np.int64)
            if d.ndim != 1 or d.size == 0 or d.min() < 1 or int(d.sum()) != total:
                raise ValueError(
                    f"feature {i}: seq_lengths {d.tolist()} must be positive and sum to its {total} tokens"
                )
            if self.max_length is not None and total > self.max_length:
                raise ValueError(
                    f"feature {i}: a pre-packed row of {total} tokens exceeds max_length={self.max_length}"
                )
            docs.append(d)
        counts = np.array([d.size for d in docs], dtype=np.int64)
        return Placements.from_plan(
            index=np.repeat(np.arange(counts.size), counts),
            start=np.concatenate([cu_seqlens_from_lengths(d)[:-1] for d in docs]),
            length=np.concatenate(docs),
            row_offsets=cu_seqlens_from_lengths(counts),
            num_features=len(features),
        )

    def _place(
        self, seqs: Sequences, placements: Placements
    ) -> tuple[np.ndarray, np.ndarray, list[list[int]], Placements]:
        """Build each row from its pieces (:func:`padless.layout.build_row`) into a padded
        ``[R, width]`` batch; mask each document's first label."""
        rows = [placements.row_pieces(r).tolist() for r in range(placements.num_rows)]
        width = self.row_width(max(sum(n for _, _, n in p) for p in rows))
        input_ids = np.full((len(rows), width), self.pad_token_id, dtype=np.int64)
        labels = np.full_like(input_ids, IGNORE_INDEX)
        row_docs: list[list[int]] = []
        lookup = lambda i: (seqs.input_ids[i], seqs.labels[i])  # noqa: E731
        for r, pieces in enumerate(rows):
            ids, lab, docs = build_row(pieces, lookup)
            input_ids[r, : ids.size] = ids
            labels[r, : ids.size] = mask_document_starts(lab, docs)
            row_docs.append([*docs.tolist(), *([width - ids.size] if ids.size < width else [])])
        return input_ids, labels, row_docs, placements

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> PackedBatch:
        input_ids, labels, row_docs, placements, seqs = self._pack(features)
        position_ids = np.stack([position_ids_from_lengths(docs) for docs in row_docs])
        images, blocks, positions = self._images(features, seqs, placements, input_ids, row_docs)
        batch = self.row_inputs(input_ids, labels, position_ids, row_docs, blocks=blocks)
        if self.verdict is not None and self.verdict.boundaries:  # token mixers skip each row's trailing pad
            real = np.bincount(placements.row, weights=placements.length, minlength=input_ids.shape[0])
            batch[ROW_PADDING] = torch.from_numpy(input_ids.shape[1] - real.astype(np.int64))
        if positions is not None:  # Qwen-VL's 3-D rope index per document, the text positions first
            batch["position_ids"] = torch.from_numpy(positions)
        batch.update(images)
        weights = self.features.weights(features)
        if weights is not None:
            from padless.batching.weights import placed_weights

            batch["loss_weights"] = torch.from_numpy(placed_weights(weights, placements, labels.shape))
        return PackedBatch(batch, placements)

    def _images(self, features, seqs, placements, input_ids, row_docs) -> tuple[dict, Any, Any]:
        """The batch's image inputs (:mod:`padless.batching.vision`), the bidirectional blocks of its 4D
        mask and its 3-D positions (``{}, None, None`` for a batch without images)."""
        verdict = self.verdict
        scheme = verdict.vision if verdict is not None else None
        if verdict is None:
            refusal = "a collator built without the model cannot place images; build it with PackingCollator.for_model(model, ...)"
        else:
            refusal = verdict.images_reason
        carried = self._carried(features)
        docs = {}
        for i, f in enumerate(features):
            d = vision.read_images(f, seqs.input_ids[i], scheme, refusal, f"feature {i}", carried)
            if d is not None:
                docs[i] = d
        if not docs:
            return {}, None, None
        if "seq_lengths" not in features[0]:  # a row packed beforehand is whole; a sequence must be placed whole
            placed = vision.require_whole(docs, placements, seqs.lengths)
            self.totals["dropped_images"] += sum(d.images for i, d in docs.items() if i not in placed)
            docs = {i: docs[i] for i in placed}
        self.totals["images"] += sum(d.images for d in docs.values())
        if not docs:
            return {}, None, None
        images, positions = vision.packed_vision(docs, placements, input_ids.shape, scheme, input_ids, row_docs)
        blocks = None
        if scheme.blocks is not None:
            blocks = vision.block_ids(images["token_type_ids"].numpy(), scheme, row_docs)
        return images, blocks, positions

    def _count(self, stats: Any, lengths: np.ndarray) -> None:
        """Add a batch's sequences and what its plan (``stats``; ``None``: no plan, nothing cut) cost."""
        t = self.totals
        t["sequences"] += int(lengths.size)
        t["tokens"] += int(lengths.sum())
        if stats is None:
            return
        t["truncated_sequences"] += stats.truncated_sequences
        t["truncated_tokens"] += stats.truncated_tokens
        t["dropped_sequences"] += stats.dropped_sequences
        t["dropped_tokens"] += stats.dropped_tokens
        t["split_sequences"] += stats.split_sequences
