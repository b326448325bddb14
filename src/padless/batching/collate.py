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
from typing import TYPE_CHECKING, Any

import numpy as np

from padless.attention.rules import MaskWindows
from padless.batching.batch import NOT_FORWARD, PackedBatch, Placements, batch_to, device_of, forward_inputs  # noqa: F401 (re-exported)
from padless.attention.select import ATTENTION_INPUTS, AttentionInputs
from padless.layout import (
    IGNORE_INDEX, Piece, append_separator, build_row, check_tokens, cu_seqlens_from_lengths, mask_document_starts,
    position_ids_from_lengths,
)  # fmt: skip
from padless.planning.checks import check_int

if TYPE_CHECKING:
    import torch



@dataclass(frozen=True)
class Sequences:
    """Validated token ids and labels of a batch, as int64 numpy arrays."""

    input_ids: list[np.ndarray]
    labels: list[np.ndarray]

    @property
    def lengths(self) -> np.ndarray:
        return np.fromiter((ids.size for ids in self.input_ids), dtype=np.int64, count=len(self.input_ids))


@dataclass(frozen=True)
class FeatureSpec:
    """How raw features become validated sequences; shared by both collators so that padded and
    packed batches of the same features hold exactly the same tokens."""

    vocab_size: int | None = None
    """If set, every token id and every trained label must lie in ``[0, vocab_size)``; checked here
    (:func:`padless.layout.check_tokens`) because an id past the embedding table fails deep inside
    the model with an unhelpful index error (on a GPU, a device assert)."""
    separator_id: int | None = None
    """If set, appended to every sequence that does not already end with it (e.g. EOS)."""
    train_on_separator: bool = True
    """Whether an appended separator may be a training target: it is one exactly when the token
    before it is (:func:`padless.layout.append_separator`); ``False``: never."""
    loss_weights: str | None = None
    """If set, the feature key holding one loss weight per token; the batch then carries them as
    ``loss_weights`` (:mod:`padless.batching.weights`) for ``model_loss(..., weighting="weights")``."""

    def weights(self, features: Sequence[Mapping[str, Any]]) -> list[np.ndarray] | None:
        """Each feature's validated per-token loss weights (``None`` unless :attr:`loss_weights` is set)."""
        if self.loss_weights is None:
            return None
        from padless.batching.weights import feature_weights

        return [feature_weights(f, self.loss_weights, self.separator_id, f"feature {i}") for i, f in enumerate(features)]

    def prepare(self, features: Sequence[Mapping[str, Any]]) -> Sequences:
        if len(features) == 0:
            raise ValueError("the batch is empty: a collator needs at least one feature")
        all_ids: list[np.ndarray] = []
        all_labels: list[np.ndarray] = []
        for i, feature in enumerate(features):
            if not isinstance(feature, Mapping) or "input_ids" not in feature:
                keys = sorted(feature) if isinstance(feature, Mapping) else type(feature).__name__
                raise ValueError(f"feature {i} has no 'input_ids' ({keys})")
            ids, labels = check_tokens(feature["input_ids"], feature.get("labels"), vocab_size=self.vocab_size,
                                       where=f"feature {i}")  # fmt: skip
            if self.separator_id is not None:
                ids, labels = append_separator(ids, labels, self.separator_id, trainable=self.train_on_separator)
                check_tokens(ids[-1:], vocab_size=self.vocab_size, where=f"feature {i}'s separator")
            all_ids.append(ids)
            all_labels.append(labels)
        return Sequences(all_ids, all_labels)


def _round_up(n: int, multiple: int | None) -> int:
    return n if not multiple else -(-n // multiple) * multiple


@dataclass
class PaddingCollator:
    """Pads to the longest sequence of the batch (right padding): ``input_ids``, ``attention_mask``
    (1 on real tokens), ``labels`` (``IGNORE_INDEX`` on padding), each ``[B, T]``."""

    pad_token_id: int = 0
    """Id written into padding positions (never attended to, never trained)."""
    pad_to_multiple_of: int | None = None
    """Round the padded length up to a multiple of this (tensor-core friendly shapes)."""
    features: FeatureSpec = field(default_factory=FeatureSpec)
    """Validation and separator handling, shared with :class:`PackingCollator`."""

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        import torch

        seqs = self.features.prepare(features)
        width = _round_up(int(seqs.lengths.max()), self.pad_to_multiple_of)
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
        }
        weights = self.features.weights(features)
        if weights is not None:
            from padless.batching.weights import padded_weights

            batch["loss_weights"] = torch.from_numpy(padded_weights(weights, width))
        return batch


@dataclass
class PackingCollator:
    """Packs the batch's sequences into rows and emits what keeps documents isolated.

    Keys: ``input_ids``, ``labels``, ``position_ids`` (``[R, L]``), ``use_cache=False`` (a cache
    silently turns off transformers' packed-row handling, so a plain ``model(**batch)`` stays exact),
    and by ``attention``: ``attention_mask`` ``[R, 1, L, L]`` (mask4d) or ``cu_seq_lens_q/k``,
    ``max_length_q/k`` (varlen). Use :meth:`for_model` to pick ``attention``, the mask dtype and the
    sliding windows from a model's attention implementation and config.

    Totals of what the planner truncated or dropped accumulate in :attr:`totals` (in the process that
    calls the collator), so nothing is lost silently.
    """

    max_length: int | None = None
    """Tokens per packed row. ``None``: the whole batch becomes one row (padding-free)."""
    attention: AttentionInputs = "mask4d"
    """What the batch carries for the attention backend (see :data:`AttentionInputs`)."""
    strategy: str = "best_fit_decreasing"
    """Planner strategy (:data:`padless.STRATEGIES`) used when ``max_length`` is set."""
    overlong: str = "error"
    """Policy for a sequence longer than ``max_length`` (:data:`padless.OVERLONG_POLICIES`)."""
    pad_token_id: int = 0
    """Id written into padding at the end of a row."""
    pad_to_max_length: bool = False
    """Pad every row to ``max_length`` (static shapes) instead of the longest row of the batch."""
    pad_to_multiple_of: int | None = None
    """Round the row length up to a multiple of this."""
    mask_dtype: torch.dtype | None = None
    """Dtype of the 4D additive mask; must equal the model's compute dtype (default float32)."""
    windows: MaskWindows = None
    """The model's sliding windows, kept inside each document by the 4D mask: ``None`` none, ``w``
    one window for every layer, or layer type -> window (``attention_mask`` is then a dict of masks
    by layer type, which transformers models with ``layer_types`` take as they are). A 4D mask
    replaces the model's own mask, window included: :meth:`for_model` sets this from the model."""
    features: FeatureSpec = field(default_factory=FeatureSpec)
    """Validation and separator handling, shared with :class:`PaddingCollator`."""
    totals: dict[str, int] = field(default_factory=lambda: {
        "sequences": 0, "tokens": 0, "truncated_sequences": 0, "truncated_tokens": 0,
        "dropped_sequences": 0, "dropped_tokens": 0, "split_sequences": 0,
    })  # fmt: skip
    """Running counts over every batch collated so far."""

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_INPUTS:
            raise ValueError(f"unknown attention inputs {self.attention!r}; choose one of {', '.join(ATTENTION_INPUTS)}")
        if self.max_length is not None:
            check_int(self.max_length, "max_length")
        values = list(self.windows.values()) if isinstance(self.windows, dict) else [self.windows]
        if any(w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1) for w in values):
            raise ValueError(
                f"windows must be None, a positive int or a dict of them by layer type, got {self.windows!r}"
            )
        if self.windows is not None and self.attention != "mask4d":
            raise ValueError(
                f"windows apply to the 4D mask only; attention={self.attention!r} takes the model's own windows"
            )

    @classmethod
    def for_model(cls, model: Any, **kwargs: Any) -> PackingCollator:
        """A collator whose attention inputs, mask dtype and sliding windows fit ``model``'s attention
        backend (``model.config._attn_implementation``) for documents of at most ``max_length``.

        Raises ``ValueError`` naming a backend that is exact when this one is not
        (:func:`padless.attention.select.check_exact`, the rule every path asks).
        """
        from padless.attention.select import check_exact, mask_windows, model_inputs

        backend = model.config._attn_implementation
        max_length = kwargs.get("max_length")
        check_exact(model, backend, device=device_of(model), dtype=model.dtype, max_length=max_length)
        needed = model_inputs(model, backend)  # chunked attention: position_ids alone (transformers' own masks)
        if kwargs.setdefault("attention", needed) != needed:
            raise ValueError(f"attention={kwargs['attention']!r} does not isolate documents on backend {backend!r}, "
                             f"which needs attention={needed!r}")  # fmt: skip
        kwargs.setdefault("mask_dtype", model.dtype)
        if needed == "mask4d":
            kwargs.setdefault("windows", mask_windows(model, max_length))
        if getattr(model.config, "vocab_size", None):
            kwargs.setdefault("features", FeatureSpec(vocab_size=model.config.vocab_size))
        return cls(**kwargs)

    def pack(self, features: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, np.ndarray, list[list[int]], Placements]:
        """Plan and place tokens: ``input_ids`` and ``labels`` ``[R, L]``, each row's document lengths
        (the trailing pad, if any, is the last document of its row) and the :class:`Placements`.

        Features that carry ``seq_lengths`` are rows packed beforehand (:class:`padless.PackedRows`,
        ``padless pack``): each becomes one row with those documents, without re-planning.
        """
        prepacked = ["seq_lengths" in f for f in features]
        if any(prepacked) and not all(prepacked):
            raise ValueError("the batch mixes pre-packed rows (with 'seq_lengths') and single sequences")
        if prepacked and all(prepacked):
            seqs = FeatureSpec(vocab_size=self.features.vocab_size).prepare(features)
            pieces_per_row = [self._prepacked_row(i, f["seq_lengths"], n) for i, (f, n) in enumerate(zip(features, seqs.lengths))]
            return self._place(seqs, pieces_per_row)
        seqs = self.features.prepare(features)
        lengths = seqs.lengths
        if self.max_length is None:
            return self._place(seqs, [[(i, 0, int(n)) for i, n in enumerate(lengths)]])
        from padless.planning.plan import plan_packs

        plan = plan_packs(lengths, self.max_length, strategy=self.strategy, overlong=self.overlong)
        self._count(plan.stats, lengths)
        rows = [list(zip(*(a.tolist() for a in plan.row(r)))) for r in range(plan.num_rows)]
        if not rows:
            raise ValueError("every sequence of the batch was dropped by the overlong policy; nothing to train on")
        return self._place(seqs, rows)

    def _prepacked_row(self, i: int, seq_lengths: Any, total: int) -> list[Piece]:
        docs = np.asarray(seq_lengths, dtype=np.int64) if not hasattr(seq_lengths, "detach") else seq_lengths.cpu().numpy()
        if docs.ndim != 1 or docs.size == 0 or docs.min() < 1 or int(docs.sum()) != total:
            raise ValueError(f"feature {i}: seq_lengths {docs.tolist()} must be positive and sum to its {total} tokens")
        if self.max_length is not None and total > self.max_length:
            raise ValueError(f"feature {i}: a pre-packed row of {total} tokens exceeds max_length={self.max_length}")
        starts = cu_seqlens_from_lengths(docs)[:-1]
        return [(i, int(s), int(n)) for s, n in zip(starts, docs)]

    def _place(
        self, seqs: Sequences, pieces_per_row: list[list[Piece]]
    ) -> tuple[np.ndarray, np.ndarray, list[list[int]], Placements]:
        """Build each row from its pieces (:func:`padless.layout.build_row`) into a padded
        ``[R, width]`` batch; mask each document's first label."""
        used = max(sum(n for _, _, n in row) for row in pieces_per_row)
        width = self.max_length if self.pad_to_max_length and self.max_length else used
        width = _round_up(width, self.pad_to_multiple_of)
        input_ids = np.full((len(pieces_per_row), width), self.pad_token_id, dtype=np.int64)
        labels = np.full_like(input_ids, IGNORE_INDEX)
        row_docs: list[list[int]] = []
        lookup = lambda i: (seqs.input_ids[i], seqs.labels[i])  # noqa: E731
        for r, row in enumerate(pieces_per_row):
            ids, lab, docs = build_row(row, lookup)
            input_ids[r, : ids.size] = ids
            labels[r, : ids.size] = mask_document_starts(lab, docs)
            row_docs.append([*docs.tolist(), *([width - ids.size] if ids.size < width else [])])
        pieces = np.array([(i, s, r, 0, n) for r, row in enumerate(pieces_per_row) for i, s, n in row], dtype=np.int64)
        offsets = np.concatenate([cu_seqlens_from_lengths([n for _, _, n in row])[:-1] for row in pieces_per_row])
        placements = Placements(feature=pieces[:, 0], start=pieces[:, 1], row=pieces[:, 2], offset=offsets,
                                length=pieces[:, 4], num_features=len(seqs.input_ids))  # fmt: skip
        return input_ids, labels, row_docs, placements

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> PackedBatch:
        import torch

        from padless.attention.masks import additive_block_causal_mask

        input_ids, labels, row_docs, placements = self.pack(features)
        position_ids = np.stack([position_ids_from_lengths(docs) for docs in row_docs])
        batch: dict[str, Any] = {
            "input_ids": torch.from_numpy(input_ids),
            "labels": torch.from_numpy(labels),
            "position_ids": torch.from_numpy(position_ids),
            "use_cache": False,
        }
        if self.attention == "mask4d":
            mask = lambda w: additive_block_causal_mask(row_docs, dtype=self.mask_dtype, window=w)  # noqa: E731
            if isinstance(self.windows, dict):  # one mask per distinct window, shared by its layer types
                made = {w: mask(w) for w in set(self.windows.values())}
                batch["attention_mask"] = {t: made[w] for t, w in self.windows.items()}
            else:
                batch["attention_mask"] = mask(self.windows)
        elif self.attention == "varlen":
            all_docs = np.concatenate([np.asarray(d, dtype=np.int64) for d in row_docs])
            cu = torch.from_numpy(cu_seqlens_from_lengths(all_docs)).to(torch.int32)
            batch.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=int(all_docs.max()),
                         max_length_k=int(all_docs.max()))  # fmt: skip
        weights = self.features.weights(features)
        if weights is not None:
            from padless.batching.weights import placed_weights

            batch["loss_weights"] = torch.from_numpy(placed_weights(weights, placements, labels.shape))
        return PackedBatch(batch, placements)

    def _count(self, stats: Any, lengths: np.ndarray) -> None:
        t = self.totals
        t["sequences"] += int(lengths.size)
        t["tokens"] += int(lengths.sum())
        t["truncated_sequences"] += stats.truncated_sequences
        t["truncated_tokens"] += stats.truncated_tokens
        t["dropped_sequences"] += stats.dropped_sequences
        t["dropped_tokens"] += stats.dropped_tokens
        t["split_sequences"] += stats.split_sequences
